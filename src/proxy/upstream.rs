//! Calls to providers: pooled clients, the request each attempt sends, and
//! what a failed answer says about itself.

use crate::compile::Snapshot;
use crate::data::WireFormat;
use crate::evaluate::OutcomeFacts;
use crate::evaluate::{Candidate, Endpoint};
use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::{self, HeaderName, HeaderValue};
use serde_json::{Map, Value as Json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Clients by connect timeout: reqwest sets that per client, the policy per
/// candidate. Each keeps its own pool of keep-alive connections.
/// Keyed by the catalog's values, never by what a client sends: a fast
/// hash is enough.
#[derive(Default)]
pub struct Clients {
    by_connect_ms: Mutex<foldhash::HashMap<u64, reqwest::Client>>,
    /// Upstream URLs as parsed: parsing one costs more than building the
    /// rest of a request.
    urls: Mutex<foldhash::HashMap<String, reqwest::Url>>,
}

/// Parsed URLs kept at most; a catalog has a handful (providers times
/// endpoints), so only reloads that keep changing them reach this.
const MAX_URLS: usize = 1024;

impl Clients {
    pub fn get(&self, connect_ms: u64) -> Result<reqwest::Client, reqwest::Error> {
        let mut clients = self
            .by_connect_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(client) = clients.get(&connect_ms) {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(connect_ms.max(1)))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            // Upstream calls go only where the catalog says, never through
            // a proxy picked up from the environment.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        clients.insert(connect_ms, client.clone());
        Ok(client)
    }

    /// `text` parsed, or `None` when it is not a URL.
    pub fn url(&self, text: &str) -> Option<reqwest::Url> {
        let mut urls = self
            .urls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(url) = urls.get(text) {
            return Some(url.clone());
        }
        let url = reqwest::Url::parse(text).ok()?;
        if urls.len() >= MAX_URLS {
            urls.clear();
        }
        urls.insert(text.to_string(), url.clone());
        Some(url)
    }
}

/// Client headers passed on to providers. Everything else — the client's
/// own credentials, hop-by-hop headers, routing inputs — stays here.
const FORWARDED_HEADERS: &[&str] = &[
    "accept",
    "user-agent",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "x-request-id",
];

/// The Anthropic API version sent when the client names none.
const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// What every attempt of one request shares: the body without the routing
/// inputs, and the client headers to forward.
pub struct Outgoing {
    /// The body's members but `model` (each attempt names its own),
    /// serialised once: the text between the object's braces. `None` if
    /// the body could not be serialised.
    members: Option<Vec<u8>>,
    headers: HeaderMap,
}

impl Outgoing {
    /// `raw` is the client's body as sent and `body` the JSON object read
    /// from it; `input_fields` the body fields and headers the policy reads
    /// as inputs.
    pub fn new(
        raw: &[u8],
        body: Option<Map<String, Json>>,
        client_headers: &HeaderMap,
        input_fields: &[&str],
        input_headers: &[&str],
        request_id: &str,
    ) -> Outgoing {
        let kept =
            |key: &[u8]| key != b"model" && !input_fields.iter().any(|f| f.as_bytes() == key);
        let members = match body {
            // Copied as the client wrote them when possible: no second
            // serialisation.
            Some(mut body) => raw_members(raw, body.len(), &kept).or_else(|| {
                body.retain(|key, _| kept(key.as_bytes()));
                serde_json::to_vec(&Json::Object(body))
                    .ok()
                    .and_then(|object| {
                        object
                            .strip_prefix(b"{")
                            .and_then(|inside| inside.strip_suffix(b"}"))
                            .map(<[u8]>::to_vec)
                    })
            }),
            None => Some(Vec::new()),
        };
        let mut headers = HeaderMap::new();
        for name in FORWARDED_HEADERS {
            if input_headers.contains(name) {
                continue;
            }
            if let Some(value) = client_headers.get(*name) {
                headers.insert(HeaderName::from_static(name), value.clone());
            }
        }
        if let Ok(value) = HeaderValue::from_str(request_id) {
            headers.insert(HeaderName::from_static("x-request-id"), value);
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Outgoing { members, headers }
    }

    /// The URL, headers and bytes of an attempt at `candidate`: the same
    /// for every attempt at the same route, whatever happened before.
    pub fn request_for(
        &self,
        snapshot: &Snapshot,
        candidate: &Candidate,
        endpoint: Endpoint,
    ) -> Option<(String, HeaderMap, Bytes)> {
        let provider = snapshot.provider(candidate.provider)?;
        let secret = snapshot.secret(candidate.provider, candidate.credential)?;
        let url = format!(
            "{}{}",
            provider.base_url.trim_end_matches('/'),
            endpoint.path()
        );
        let members = self.members.as_deref()?;
        let mut bytes = Vec::with_capacity(members.len() + 64);
        bytes.extend_from_slice(b"{\"model\":");
        serde_json::to_writer(&mut bytes, candidate.upstream_model.as_ref()).ok()?;
        if !members.is_empty() {
            bytes.push(b',');
            bytes.extend_from_slice(members);
        }
        bytes.push(b'}');
        let mut headers = self.headers.clone();
        match provider.format {
            WireFormat::OpenAi => {
                let value = HeaderValue::from_str(&format!("Bearer {}", secret.expose())).ok()?;
                headers.insert(header::AUTHORIZATION, value);
            }
            WireFormat::Anthropic => {
                headers.insert(
                    HeaderName::from_static("x-api-key"),
                    HeaderValue::from_str(secret.expose()).ok()?,
                );
                headers
                    .entry(HeaderName::from_static("anthropic-version"))
                    .or_insert(HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION));
            }
        }
        Some((url, headers, Bytes::from(bytes)))
    }
}

/// The members of the JSON object `body` whose keys `kept` accepts, as the
/// client wrote them, joined by commas: the text between an object's
/// braces. `body` must be valid JSON, read as a tree first into
/// `members_read` members. `None` when it is not an object or a key is
/// escaped or repeated: the tree's reading (the last of repeated keys) is
/// serialised then, so that the provider reads the body as the policy did.
/// Unescaped keys are repeated exactly when the text holds more members
/// than the tree, which costs a count, not a search per key.
fn raw_members(body: &[u8], members_read: usize, kept: &dyn Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let mut at = skip_space(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    let mut members_written = 0usize;
    let mut members = Vec::with_capacity(body.len());
    loop {
        at = skip_space(body, at);
        match body.get(at)? {
            b'}' => return (members_written == members_read).then_some(members),
            b',' => {
                at += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let key_start = at;
        let key_end = string_end(body, key_start)?;
        let key = body.get(key_start + 1..key_end - 1)?;
        if key.contains(&b'\\') {
            return None;
        }
        members_written += 1;
        at = skip_space(body, key_end);
        if body.get(at) != Some(&b':') {
            return None;
        }
        let value_start = skip_space(body, at + 1);
        let value_end = value_end(body, value_start)?;
        if kept(key) {
            if !members.is_empty() {
                members.push(b',');
            }
            members.extend_from_slice(body.get(key_start..key_end)?);
            members.push(b':');
            members.extend_from_slice(body.get(value_start..value_end)?);
        }
        at = value_end;
    }
}

fn skip_space(body: &[u8], from: usize) -> usize {
    body.get(from..).map_or(from, |rest| {
        from + rest
            .iter()
            .take_while(|byte| byte.is_ascii_whitespace())
            .count()
    })
}

/// Just past the end of the string that starts (with its quote) at `start`.
fn string_end(body: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    loop {
        match body.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => at += 2,
            _ => at += 1,
        }
    }
}

/// Just past the end of the value that starts at `start`.
fn value_end(body: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = start;
    loop {
        match body.get(at)? {
            b'"' => {
                at = string_end(body, at)?;
                if depth == 0 {
                    return Some(at);
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            // The end of a number, `true`, `false` or `null`.
            byte if depth == 0 && (byte.is_ascii_whitespace() || b",}]".contains(byte)) => {
                return Some(at);
            }
            _ => {}
        }
        at += 1;
    }
}

/// What a provider's non-success answer says: `Retry-After` (seconds, or
/// OpenAI's `retry-after-ms`) and the error object in either wire format.
pub fn outcome_facts(status: u16, headers: &HeaderMap, body: &[u8]) -> OutcomeFacts {
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let retry_after_ms = header_text("retry-after-ms")
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| ms as u64)
        .or_else(|| {
            header_text("retry-after")
                .and_then(|text| text.trim().parse::<f64>().ok())
                .filter(|secs| secs.is_finite() && *secs >= 0.0)
                .map(|secs| (secs * 1000.0) as u64)
        });
    let json: Option<Json> = serde_json::from_slice(body).ok();
    let error = json.as_ref().and_then(|j| j.get("error"));
    let text = |value: Option<&Json>| -> Option<Arc<str>> {
        match value? {
            Json::String(s) => Some(Arc::from(s.as_str())),
            Json::Number(n) => Some(Arc::from(n.to_string().as_str())),
            _ => None,
        }
    };
    OutcomeFacts {
        status: Some(status),
        retry_after_ms,
        error_code: text(error.and_then(|e| e.get("code"))),
        error_type: text(error.and_then(|e| e.get("type"))),
        error_message: text(error.and_then(|e| e.get("message")))
            .or_else(|| error.and_then(Json::as_str).map(Arc::from)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn facts_from_either_wire_format() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("7"));
        let openai = outcome_facts(
            429,
            &headers,
            br#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        );
        assert_eq!(openai.retry_after_ms, Some(7_000));
        assert_eq!(openai.error_code.as_deref(), Some("insufficient_quota"));
        assert_eq!(openai.error_message.as_deref(), Some("quota"));

        headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
        let anthropic = outcome_facts(
            529,
            &headers,
            br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
        );
        assert_eq!(anthropic.retry_after_ms, Some(1_500));
        assert_eq!(anthropic.error_type.as_deref(), Some("overloaded_error"));
        assert_eq!(anthropic.error_code, None);

        let garbage = outcome_facts(502, &HeaderMap::new(), b"<html>bad gateway</html>");
        assert_eq!(garbage.status, Some(502));
        assert_eq!(garbage.error_message, None);
        assert_eq!(garbage.retry_after_ms, None);
    }

    /// The members `Outgoing` keeps of `body`, read back as a JSON object.
    fn sent(body: &str, inputs: &[&str]) -> Map<String, Json> {
        let tree: Map<String, Json> = serde_json::from_str(body).unwrap();
        let outgoing = Outgoing::new(
            body.as_bytes(),
            Some(tree),
            &HeaderMap::new(),
            inputs,
            &[],
            "req-1",
        );
        let members = outgoing.members.unwrap();
        serde_json::from_slice(&[&b"{"[..], &members, b"}"].concat()).unwrap()
    }

    #[test]
    fn the_body_goes_on_as_the_policy_read_it() {
        let bodies = [
            r#"{}"#,
            r#" { "model" : "m" } "#,
            r#"{"model":"m","stream":true,"n":-1.5e3,"x":null,"y":false}"#,
            "{\n  \"messages\": [ {\"role\": \"user\", \"content\": \"a } ] \\\" , {\"} ],\n  \"model\": \"m\",\t\"temperature\":0.2 ,\"provider\":{\"only\":[\"x\",{}]}}",
            // Repeated and escaped keys: the tree's reading is serialised.
            r#"{"stream":false,"model":"m","stream":true}"#,
            r#"{"str\u0065am":true,"model":"m","provider":1}"#,
            r#"{"model":"m","pr\u006fvider":{"only":[]},"top_p":1}"#,
        ];
        for body in bodies {
            let mut expected: Map<String, Json> = serde_json::from_str(body).unwrap();
            expected.remove("model");
            expected.remove("provider");
            assert_eq!(sent(body, &["provider"]), expected, "{body}");
        }
    }

    #[test]
    fn members_are_copied_as_written() {
        let body = br#"{"stream": false, "model":"m", "messages": [{"role": "user"}] }"#;
        let members = raw_members(body, 3, &|key| key != b"model").unwrap();
        assert_eq!(
            members,
            br#""stream":false,"messages":[{"role": "user"}]"#.to_vec()
        );
        assert_eq!(raw_members(b"[1]", 1, &|_| true), None);
        assert_eq!(raw_members(br#"{"a":1,"a":2}"#, 1, &|_| true), None);
        assert_eq!(raw_members(br#"{"\u0061":1}"#, 1, &|_| true), None);
    }

    #[test]
    fn a_key_repeated_late_in_a_large_body_is_still_noticed() {
        // Up to the body limit a client can send millions of members: the
        // scan counts them instead of comparing each key with the others.
        let mut body = String::from("{");
        for index in 0..200_000 {
            body.push_str(&format!("\"k{index}\":{index},"));
        }
        body.push_str("\"model\":\"m\"}");
        let members = raw_members(body.as_bytes(), 200_001, &|key| key != b"model").unwrap();
        assert_eq!(members.len(), body.len() - 2 - ",\"model\":\"m\"".len());
        let repeated = body.replacen("\"model\"", "\"k0\"", 1);
        assert_eq!(raw_members(repeated.as_bytes(), 200_000, &|_| true), None);
    }

    #[test]
    fn routing_inputs_and_client_credentials_stay_behind() {
        let raw = r#"{"model":"m","provider":{"only":["x"]},"messages":[]}"#;
        let body: Map<String, Json> = serde_json::from_str(raw).unwrap();
        let mut client = HeaderMap::new();
        client.insert(
            "authorization",
            HeaderValue::from_static("Bearer client-key"),
        );
        client.insert("x-api-key", HeaderValue::from_static("client-key"));
        client.insert("connection", HeaderValue::from_static("keep-alive"));
        client.insert("x-route-hint", HeaderValue::from_static("eu"));
        client.insert("anthropic-version", HeaderValue::from_static("2024-01-01"));
        let outgoing = Outgoing::new(
            raw.as_bytes(),
            Some(body),
            &client,
            &["provider"],
            &["x-route-hint"],
            "req-1",
        );
        let members = outgoing.members.clone().unwrap();
        let sent: Map<String, Json> =
            serde_json::from_slice(&[&b"{"[..], &members, b"}"].concat()).unwrap();
        assert!(!sent.contains_key("provider"));
        assert!(!sent.contains_key("model"));
        assert!(sent.contains_key("messages"));
        assert!(outgoing.headers.get("authorization").is_none());
        assert!(outgoing.headers.get("x-api-key").is_none());
        assert!(outgoing.headers.get("connection").is_none());
        assert!(outgoing.headers.get("x-route-hint").is_none());
        assert_eq!(outgoing.headers["anthropic-version"], "2024-01-01");
        assert_eq!(outgoing.headers["x-request-id"], "req-1");
    }
}
