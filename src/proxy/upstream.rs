//! Calls to providers: pooled clients, the request each attempt sends, and
//! what a failed answer says about itself.

use super::client_body::ClientBody;
use super::header_names;
use crate::compile::Snapshot;
use crate::data::WireFormat;
use crate::data::schema::MAX_DURATION_MS;
use crate::evaluate::OutcomeFacts;
use crate::evaluate::{Candidate, Endpoint};
use crate::sync::lock;
use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::{self, HeaderName, HeaderValue};
use serde_json::Value as Json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many prompts a completion's `prompt` holds: a list of texts or of
/// token lists is one per item; a text or one token list (a list of
/// numbers) is one. `None` when it is none of these, or an empty list.
fn prompt_count(prompt: &str) -> Option<u64> {
    if prompt.starts_with('"') {
        return Some(1);
    }
    // The items as written: checked, not copied.
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(prompt).ok()?;
    let is_number = |item: &&serde_json::value::RawValue| {
        item.get()
            .starts_with(|c: char| c == '-' || c.is_ascii_digit())
    };
    match (
        items.len(),
        items.iter().filter(|item| !is_number(item)).count(),
    ) {
        (0, _) => None,
        (_, 0) => Some(1),
        (_, others) => u64::try_from(others).ok(),
    }
}

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
        let mut clients = lock(&self.by_connect_ms);
        if let Some(client) = clients.get(&connect_ms) {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            // Each attempt in flight gets a connection of its own. Over
            // HTTP/2 the client puts every request to a provider on one
            // connection and queues those past the provider's stream limit
            // (often 100 to 256) until a stream ends, and an LLM stream can
            // last minutes (tests/upstream_tls.rs).
            .http1_only()
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
        let mut urls = lock(&self.urls);
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
const FORWARDED_HEADERS: [HeaderName; 6] = [
    header::ACCEPT,
    header::USER_AGENT,
    header_names::ANTHROPIC_VERSION,
    header_names::ANTHROPIC_BETA,
    header_names::OPENAI_BETA,
    header_names::REQUEST_ID,
];

/// Those of them whose value is a list, which a client may give over
/// several lines (`anthropic-beta` once per feature).
const LIST_HEADERS: [HeaderName; 3] = [
    header::ACCEPT,
    header_names::ANTHROPIC_BETA,
    header_names::OPENAI_BETA,
];

/// The Anthropic API version sent when the client names none.
const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// What every attempt of one request shares: the body without the routing
/// inputs, and the client headers to forward.
pub struct Outgoing {
    /// The body's members but `model` (each attempt names its own) and the
    /// routing inputs, as the client wrote them: the text between the
    /// object's braces. Every attempt's body shares it.
    members: Bytes,
    headers: HeaderMap,
    /// How many choices the body asks for (its `n`, for each of a
    /// completion's prompts): a streamed chat or completion is complete
    /// only once each of them finished.
    choices: u64,
    /// Whether the body asks for the usage at a stream's end
    /// (`stream_options.include_usage`), which comes after the last choice
    /// finished.
    wants_usage: bool,
}

impl Outgoing {
    /// `body` is the client's body to `endpoint` when it is a JSON object;
    /// `unsent_fields` the body fields not sent (the policy's inputs, and
    /// what the endpoint cannot take) and `input_headers` the headers the
    /// policy reads as inputs.
    pub fn new(
        endpoint: Endpoint,
        body: Option<&ClientBody<'_>>,
        client_headers: &HeaderMap,
        unsent_fields: &[&str],
        input_headers: &[&str],
        request_id: &str,
    ) -> Outgoing {
        let dropped = |key: &str| key == "model" || unsent_fields.contains(&key);
        let members = body.map_or_else(Bytes::new, |body| Bytes::from(body.members_but(dropped)));
        // A routing input is not sent: the provider then gives its default,
        // one choice. So does a `n` the provider would refuse.
        let choices = body
            .filter(|_| !dropped("n"))
            .and_then(|body| body.member("n"))
            .and_then(|n| serde_json::from_str::<u64>(n.get()).ok())
            .filter(|n| *n >= 1)
            .unwrap_or(1);
        // A completion answers each of a list of prompts with its own `n`
        // choices, numbered on.
        let prompts = body
            .filter(|_| endpoint == Endpoint::Completions && !dropped("prompt"))
            .and_then(|body| body.member("prompt"))
            .and_then(|prompt| prompt_count(prompt.get()))
            .unwrap_or(1);
        let choices = choices.saturating_mul(prompts);
        let wants_usage = body
            .filter(|_| !dropped("stream_options"))
            .and_then(|body| body.member("stream_options"))
            .and_then(|options| serde_json::from_str::<Json>(options.get()).ok())
            .is_some_and(|options| options.get("include_usage") == Some(&Json::Bool(true)));
        let mut headers = HeaderMap::new();
        for name in FORWARDED_HEADERS {
            if input_headers.contains(&name.as_str()) {
                continue;
            }
            // A list given over several lines goes on as one line, its
            // items in the client's order (RFC 9110, section 5.3); a value
            // that is not a list goes on from its first line. However many
            // lines a client sends, the provider gets one of each, so none
            // can make it refuse the request for its headers.
            // Empty lines add no item (RFC 9110, section 5.6.1).
            let mut lines = client_headers.get_all(&name).iter();
            let value = if LIST_HEADERS.contains(&name) {
                let items: Vec<&[u8]> = lines
                    .map(|line| line.as_bytes().trim_ascii())
                    .filter(|item| !item.is_empty())
                    .collect();
                HeaderValue::from_bytes(&items.join(&b", "[..])).ok()
            } else {
                lines.next().cloned()
            };
            if let Some(value) = value.filter(|value| !value.is_empty()) {
                headers.insert(name.clone(), value);
            }
        }
        if let Ok(value) = HeaderValue::from_str(request_id) {
            headers.insert(header_names::REQUEST_ID, value);
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Outgoing {
            members,
            headers,
            choices,
            wants_usage,
        }
    }

    /// How many choices the answer has, when the endpoint gives choices.
    pub fn choices(&self) -> u64 {
        self.choices
    }

    /// Whether a stream's usage comes after its last choice finished.
    pub fn wants_usage(&self) -> bool {
        self.wants_usage
    }

    /// Frees the body and headers once no further attempt can follow: a
    /// committed stream would otherwise hold a copy of the client's whole
    /// body (the conversation) for as long as the answer streams.
    pub fn release(&mut self) {
        self.members = Bytes::new();
        self.headers = HeaderMap::new();
    }

    /// The URL, headers and bytes of an attempt at `candidate`: the same
    /// for every attempt at the same route, whatever happened before.
    pub fn request_for(
        &self,
        snapshot: &Snapshot,
        candidate: &Candidate,
        endpoint: Endpoint,
    ) -> Option<(String, HeaderMap, reqwest::Body)> {
        let provider = snapshot.provider(candidate.provider)?;
        let secret = snapshot.secret(candidate.provider, candidate.credential)?;
        let url = format!(
            "{}{}",
            provider.base_url.trim_end_matches('/'),
            endpoint.path()
        );
        let mut opening = Vec::with_capacity(64);
        opening.extend_from_slice(b"{\"model\":");
        serde_json::to_writer(&mut opening, candidate.upstream_model(snapshot).as_ref()).ok()?;
        let body = if self.members.is_empty() {
            opening.push(b'}');
            reqwest::Body::from(opening)
        } else {
            opening.push(b',');
            reqwest::Body::wrap(AttemptBody::new([
                Bytes::from(opening),
                self.members.clone(),
                Bytes::from_static(b"}"),
            ]))
        };
        let mut headers = self.headers.clone();
        // The body goes on in the caller's format, so where the provider
        // serves the endpoint its credential goes as that format expects.
        let spoken = if provider.serves(endpoint) {
            endpoint.wire()
        } else {
            provider.format
        };
        match spoken {
            WireFormat::OpenAi => {
                let value = HeaderValue::from_str(&format!("Bearer {}", secret.expose())).ok()?;
                headers.insert(header::AUTHORIZATION, value);
            }
            WireFormat::Anthropic => {
                headers.insert(
                    header_names::API_KEY,
                    HeaderValue::from_str(secret.expose()).ok()?,
                );
                headers
                    .entry(header_names::ANTHROPIC_VERSION)
                    .or_insert(HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION));
            }
        }
        Some((url, headers, body))
    }
}

/// An attempt's body as parts sent in turn: its own opening (the upstream
/// model), the request's members, shared by every attempt rather than
/// copied into each, and the closing brace. Its exact length is known, so
/// it goes with a `Content-Length` as a single buffer would.
struct AttemptBody {
    parts: std::collections::VecDeque<Bytes>,
    remaining: u64,
}

impl AttemptBody {
    fn new(parts: [Bytes; 3]) -> AttemptBody {
        let remaining = parts.iter().map(|part| part.len() as u64).sum();
        AttemptBody {
            parts: parts.into(),
            remaining,
        }
    }
}

impl hyper::body::Body for AttemptBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let part = self.parts.pop_front();
        if let Some(part) = &part {
            self.remaining = self.remaining.saturating_sub(part.len() as u64);
        }
        std::task::Poll::Ready(part.map(|part| Ok(hyper::body::Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.remaining)
    }
}

/// Secrets shorter than any real key are left alone, not to mangle
/// ordinary words.
const SHORTEST_KEY: usize = 12;

/// A provider's error body without the credential the attempt used: some
/// OpenAI-compatible servers echo the key they were sent, and the body may
/// reach the client (`error passthrough`) or an error's message. The key is
/// found as written and inside JSON strings whose escapes spell it (`\/`
/// for `/`, `\u002d` for `-`, as some JSON encoders write them), which a
/// client's JSON parser would read back as the key.
pub fn without_secret(body: Bytes, secret: &str) -> Bytes {
    if secret.len() < SHORTEST_KEY {
        return body;
    }
    if memchr::memchr(b'\\', &body).is_none() {
        return without_verbatim_secret(body, secret);
    }
    without_escaped_secret(body, secret)
}

/// `body` with each occurrence of `secret` as written replaced.
fn without_verbatim_secret(body: Bytes, secret: &str) -> Bytes {
    let secret = secret.as_bytes();
    // A body cut short (error bodies are read up to a limit) may end in
    // the key's first part.
    let cut_in_key = (SHORTEST_KEY / 2..secret.len()).rev().find(|length| {
        secret
            .get(..*length)
            .is_some_and(|start| body.ends_with(start))
    });
    if memchr::memmem::find(&body, secret).is_none() && cut_in_key.is_none() {
        return body;
    }
    let mut cleaned = Vec::with_capacity(body.len());
    let mut rest: &[u8] = &body;
    while let Some(at) = memchr::memmem::find(rest, secret) {
        let (before, after) = rest.split_at(at);
        cleaned.extend_from_slice(before);
        cleaned.extend_from_slice(b"[redacted]");
        rest = after.get(secret.len()..).unwrap_or_default();
    }
    match cut_in_key {
        Some(length) if rest.ends_with(secret.get(..length).unwrap_or_default()) => {
            cleaned.extend_from_slice(rest.get(..rest.len() - length).unwrap_or_default());
            cleaned.extend_from_slice(b"[redacted]");
        }
        _ => cleaned.extend_from_slice(rest),
    }
    Bytes::from(cleaned)
}

/// A unit of a body read with JSON's escapes undone: a byte, or the
/// character an escape stands for, with the bytes it was written as.
#[derive(Clone, Copy)]
struct Unit {
    value: u32,
    start: u32,
    end: u32,
}

/// `body` with every run of bytes that reads as `secret` once JSON's
/// escapes are undone (once, or twice for an error object a gateway sent on
/// as a JSON string) replaced by `[redacted]`, as is a run at the body's end
/// that reads as the secret's first part (a body read up to its limit).
/// Escapes are undone wherever they are, inside strings or not, and one
/// that is not JSON's is kept as written: the body may be JSON a client
/// reads, or text that holds some.
fn without_escaped_secret(body: Bytes, secret: &str) -> Bytes {
    let Ok(length) = u32::try_from(body.len()) else {
        return body;
    };
    let secret: Vec<u32> = secret.bytes().map(u32::from).collect();
    let raw: Vec<Unit> = body
        .iter()
        .zip(0..length)
        .map(|(byte, at)| Unit {
            value: u32::from(*byte),
            start: at,
            end: at + 1,
        })
        .collect();
    let once = unescaped(&raw);
    // As written too: an escape may take the key's first characters as its
    // own (`\u0123` before a key `0123…`).
    let mut found = secret_runs(&raw, &secret, length);
    found.extend(secret_runs(&once, &secret, length));
    if once.iter().any(|unit| unit.value == u32::from(b'\\')) {
        found.extend(secret_runs(&unescaped(&once), &secret, length));
    }
    if found.is_empty() {
        return body;
    }
    found.sort_unstable();
    let mut cleaned = Vec::with_capacity(body.len());
    let mut copied_to = 0;
    for (start, end) in found {
        let (start, end) = (start as usize, end as usize);
        if end <= copied_to {
            continue;
        }
        if start >= copied_to {
            cleaned.extend_from_slice(body.get(copied_to..start).unwrap_or_default());
            cleaned.extend_from_slice(b"[redacted]");
        }
        copied_to = end;
    }
    cleaned.extend_from_slice(body.get(copied_to..).unwrap_or_default());
    Bytes::from(cleaned)
}

/// `units` with JSON's escapes undone once: `\/` is `/`, `\u002d` is `-`.
/// A backslash that begins no escape JSON has is kept as it is.
fn unescaped(units: &[Unit]) -> Vec<Unit> {
    let value = |unit: Option<&Unit>| unit.and_then(|unit| char::from_u32(unit.value));
    let mut out = Vec::with_capacity(units.len());
    let mut at = 0;
    while let Some(unit) = units.get(at) {
        let escaped = if value(Some(unit)) == Some('\\') {
            match value(units.get(at + 1)) {
                Some(c @ ('"' | '\\' | '/')) => Some((u32::from(c), 2)),
                Some('b') => Some((8, 2)),
                Some('f') => Some((12, 2)),
                Some('n') => Some((10, 2)),
                Some('r') => Some((13, 2)),
                Some('t') => Some((9, 2)),
                Some('u') => units
                    .get(at + 2..at + 6)
                    .and_then(|hex| {
                        hex.iter().try_fold(0, |code, digit| {
                            Some(code * 16 + value(Some(digit))?.to_digit(16)?)
                        })
                    })
                    .map(|code| (code, 6)),
                _ => None,
            }
        } else {
            None
        };
        match escaped {
            Some((code, width)) => {
                let last = units.get(at + width - 1).map_or(unit.end, |last| last.end);
                out.push(Unit {
                    value: code,
                    start: unit.start,
                    end: last,
                });
                at += width;
            }
            None => {
                out.push(*unit);
                at += 1;
            }
        }
    }
    out
}

/// Where `units` read as `secret`, as byte ranges of the body, and a run at
/// the end that reads as its first part (before an escape cut short there).
fn secret_runs(units: &[Unit], secret: &[u32], body_length: u32) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = units
        .windows(secret.len())
        .filter(|window| {
            window
                .iter()
                .map(|unit| unit.value)
                .eq(secret.iter().copied())
        })
        .filter_map(|window| Some((window.first()?.start, window.last()?.end)))
        .collect();
    // An escape cut short by the body's end: `\`, `\u`, up to `\uXXX`.
    let cut_escape = (1..=5.min(units.len()))
        .find(|&length| {
            let tail = units.get(units.len() - length..).unwrap_or_default();
            tail.first()
                .is_some_and(|unit| unit.value == u32::from(b'\\'))
                && (length == 1
                    || tail
                        .get(1)
                        .is_some_and(|unit| unit.value == u32::from(b'u')))
        })
        .unwrap_or(0);
    let before_cut = units.get(..units.len() - cut_escape).unwrap_or_default();
    let cut_in_key = (SHORTEST_KEY / 2..secret.len()).rev().find(|&length| {
        before_cut.len() >= length
            && before_cut
                .get(before_cut.len() - length..)
                .is_some_and(|tail| {
                    tail.iter()
                        .map(|unit| unit.value)
                        .eq(secret.iter().take(length).copied())
                })
    });
    if let Some(length) = cut_in_key
        && let Some(first) = before_cut.get(before_cut.len() - length)
    {
        runs.push((first.start, body_length));
    }
    runs
}

/// What a provider's non-success answer says: `Retry-After` (seconds or an
/// HTTP date, counted from `now`; or OpenAI's `retry-after-ms`) and the
/// error object in either wire format.
pub fn outcome_facts(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: std::time::SystemTime,
) -> OutcomeFacts {
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let seconds = |text: &str| {
        text.trim()
            .parse::<f64>()
            .ok()
            .filter(|secs| secs.is_finite() && *secs >= 0.0)
            .map(|secs| (secs * 1000.0) as u64)
    };
    // A date already past asks for no wait.
    let date = |text: &str| {
        httpdate::parse_http_date(text.trim()).ok().map(|date| {
            date.duration_since(now).map_or(0, |wait| {
                u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
            })
        })
    };
    // Held to the longest duration a policy can write: one answer asking
    // for millions of years would otherwise pause a provider until a reload.
    let retry_after_ms = header_text("retry-after-ms")
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| ms as u64)
        .or_else(|| {
            header_text("retry-after").and_then(|text| seconds(text).or_else(|| date(text)))
        })
        .map(|ms| ms.min(MAX_DURATION_MS));
    let json: Option<Json> = serde_json::from_slice(body).ok();
    // OpenAI's and Anthropic's `error`; in a Responses stream, a failed
    // response's `response.error`, or an `error` event's own fields; vLLM's
    // and SGLang's error object, `"object": "error"` with its fields beside.
    let error = json.as_ref().and_then(|j| {
        j.get("error")
            .filter(|e| !e.is_null())
            .or_else(|| j.pointer("/response/error").filter(|e| !e.is_null()))
            .or_else(|| (j.get("type").and_then(Json::as_str) == Some("error")).then_some(j))
            .or_else(|| (j.get("object").and_then(Json::as_str) == Some("error")).then_some(j))
    });
    // FastAPI's `{"detail": "…"}`, which servers built on it answer with.
    let detail = json
        .as_ref()
        .and_then(|j| j.get("detail"))
        .and_then(Json::as_str);
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
            .or_else(|| error.and_then(Json::as_str).map(Arc::from))
            .or_else(|| detail.filter(|_| error.is_none()).map(Arc::from)),
    }
}

/// What a provider's error event in a stream of status `status` says: its
/// error object, read as an error answer's body is; the event's whole data
/// is the message when the object gives none.
pub fn error_event_facts(status: u16, data: &str) -> OutcomeFacts {
    // An event has no headers of its own, so no `Retry-After` to date.
    let mut facts = outcome_facts(
        status,
        &HeaderMap::new(),
        data.as_bytes(),
        std::time::SystemTime::now(),
    );
    facts.error_message = facts.error_message.or_else(|| Some(Arc::from(data)));
    facts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use serde_json::Map;

    #[test]
    fn an_echoed_credential_is_cut_from_an_error_body() {
        let secret = "sk-upstream-0123456789";
        let body = Bytes::from(format!(
            r#"{{"error":{{"message":"bad key {secret}; header was x-api-key: {secret}"}}}}"#
        ));
        let cleaned = without_secret(body, secret);
        assert_eq!(
            cleaned,
            r#"{"error":{"message":"bad key [redacted]; header was x-api-key: [redacted]"}}"#
        );
        let short = Bytes::from_static(b"upload failed");
        assert_eq!(without_secret(short.clone(), "load"), short);
        // Cut off inside the key, as a body read up to its limit can be.
        let cut = Bytes::from(format!("x-api-key: {}", &secret[..10]));
        assert_eq!(without_secret(cut, secret), "x-api-key: [redacted]");
    }

    #[test]
    fn an_echoed_credential_is_cut_however_json_escapes_it() {
        let secret = "sk-aki/secret+KEY/0123456789abcdef";
        // PHP's `json_encode` escapes `/`; .NET's encoder writes `+` and
        // others as `\u` escapes.
        let php = r#"{"error":{"message":"Incorrect API key provided: sk-aki\/secret+KEY\/0123456789abcdef","code":"invalid_api_key"}}"#;
        assert_eq!(
            without_secret(Bytes::from_static(php.as_bytes()), secret),
            r#"{"error":{"message":"Incorrect API key provided: [redacted]","code":"invalid_api_key"}}"#
        );
        let dotnet =
            r#"{"error":{"message":"bad key sk\u002Daki\/secret\u002BKEY/0123456789abcdef."}}"#;
        assert_eq!(
            without_secret(Bytes::from_static(dotnet.as_bytes()), secret),
            r#"{"error":{"message":"bad key [redacted]."}}"#
        );
        // Every string holding it, keys too; everything else is kept as
        // the provider wrote it, escapes included.
        let both = r#"{"sk-aki\/secret+KEY\/0123456789abcdef":"x\ny","m":"a\u0020sk-aki\/secret+KEY\/0123456789abcdef"}"#;
        assert_eq!(
            without_secret(Bytes::from_static(both.as_bytes()), secret),
            r#"{"[redacted]":"x\ny","m":"a\u0020[redacted]"}"#
        );
        // Strings a strict JSON reader refuses (an escape JSON does not
        // have, a raw tab, a lone surrogate), a stray quote before them in
        // text that is not JSON, a body that is one string.
        for (written, cleaned) in [
            (
                r#"{"m":"it\'s sk-aki\/secret+KEY\/0123456789abcdef"}"#,
                r#"{"m":"it\'s [redacted]"}"#,
            ),
            (
                "{\"m\":\"a\tsk-aki\\/secret+KEY\\/0123456789abcdef \\ud83d\"}",
                "{\"m\":\"a\t[redacted] \\ud83d\"}",
            ),
            (
                r#"5" screen {"error":"bad key sk-aki\/secret+KEY\/0123456789abcdef"}"#,
                r#"5" screen {"error":"bad key [redacted]"}"#,
            ),
            (
                r#""bad key sk-aki\/secret+KEY\/0123456789abcdef""#,
                r#""bad key [redacted]""#,
            ),
            // A provider's error object sent on as a JSON string, which a
            // client may read twice.
            (
                r#"{"detail":"{\"error\":\"bad key sk-aki\\\/secret+KEY\\\/0123456789abcdef\"}"}"#,
                r#"{"detail":"{\"error\":\"bad key [redacted]\"}"}"#,
            ),
        ] {
            assert_eq!(
                without_secret(Bytes::from(written.to_string()), secret),
                cleaned,
                "{written}"
            );
        }
        // Cut off inside the key, even inside an escape.
        let cut = r#"{"error":{"message":"bad key sk-aki\/secret+KEY\u00"#;
        assert_eq!(
            without_secret(Bytes::from_static(cut.as_bytes()), secret),
            r#"{"error":{"message":"bad key [redacted]"#
        );
        // Written out right after an escape that reads its first characters.
        let hex_key = "0123456789abcdef";
        assert_eq!(
            without_secret(
                Bytes::from_static(br#"{"m":"\u0123456789abcdef"}"#),
                hex_key
            ),
            r#"{"m":"\u[redacted]"}"#
        );
        // Nothing to do: the same bytes back.
        let clean = r#"{"error":{"message":"a\/b \u002d quota"}}"#;
        assert_eq!(
            without_secret(Bytes::from_static(clean.as_bytes()), secret),
            clean
        );
    }

    #[test]
    fn facts_from_either_wire_format() {
        // 20 s before the date below.
        let now = httpdate::parse_http_date("Tue, 01 Dec 2026 23:32:02 GMT").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("7"));
        let openai = outcome_facts(
            429,
            &headers,
            br#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            now,
        );
        assert_eq!(openai.retry_after_ms, Some(7_000));
        assert_eq!(openai.error_code.as_deref(), Some("insufficient_quota"));
        assert_eq!(openai.error_message.as_deref(), Some("quota"));

        headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
        let anthropic = outcome_facts(
            529,
            &headers,
            br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
            now,
        );
        assert_eq!(anthropic.retry_after_ms, Some(1_500));
        assert_eq!(anthropic.error_type.as_deref(), Some("overloaded_error"));
        assert_eq!(anthropic.error_code, None);

        // What a Responses stream says in place of its answer: a failed
        // response's error, or an error event's own fields.
        let failed = outcome_facts(
            200,
            &HeaderMap::new(),
            br#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"down"}}}"#,
            now,
        );
        assert_eq!(failed.error_code.as_deref(), Some("server_error"));
        assert_eq!(failed.error_message.as_deref(), Some("down"));
        let event = outcome_facts(
            200,
            &HeaderMap::new(),
            br#"{"type":"error","code":"rate_limit_exceeded","message":"slow down"}"#,
            now,
        );
        assert_eq!(event.error_code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(event.error_message.as_deref(), Some("slow down"));

        // An error event: the same object, and its data when it has no message.
        let limit = error_event_facts(
            200,
            r#"{"error":{"message":"too long","type":"server_error","code":"max_tokens_exceeded"}}"#,
        );
        assert_eq!(
            (limit.status, limit.error_code.as_deref()),
            (Some(200), Some("max_tokens_exceeded"))
        );
        assert_eq!(limit.error_message.as_deref(), Some("too long"));
        let bare = error_event_facts(200, r#"{"type":"error"}"#);
        assert_eq!(bare.error_message.as_deref(), Some(r#"{"type":"error"}"#));

        // vLLM's and SGLang's error object; FastAPI's detail.
        let vllm = outcome_facts(
            400,
            &HeaderMap::new(),
            br#"{"object":"error","message":"maximum context length is 4096 tokens","type":"BadRequestError","param":null,"code":400}"#,
            now,
        );
        assert_eq!(vllm.error_code.as_deref(), Some("400"));
        assert_eq!(vllm.error_type.as_deref(), Some("BadRequestError"));
        assert_eq!(
            vllm.error_message.as_deref(),
            Some("maximum context length is 4096 tokens")
        );
        let detail = outcome_facts(404, &HeaderMap::new(), br#"{"detail":"Not Found"}"#, now);
        assert_eq!(detail.error_message.as_deref(), Some("Not Found"));
        let listed = outcome_facts(422, &HeaderMap::new(), br#"{"detail":[{"msg":"x"}]}"#, now);
        assert_eq!(listed.error_message, None);

        let garbage = outcome_facts(502, &HeaderMap::new(), b"<html>bad gateway</html>", now);
        assert_eq!(garbage.status, Some(502));
        assert_eq!(garbage.error_message, None);
        assert_eq!(garbage.retry_after_ms, None);

        // RFC 9110's other form: an HTTP date, counted from now.
        let mut dated = HeaderMap::new();
        dated.insert(
            "retry-after",
            HeaderValue::from_static("Tue, 01 Dec 2026 23:32:22 GMT"),
        );
        assert_eq!(
            outcome_facts(429, &dated, b"", now).retry_after_ms,
            Some(20_000)
        );
        let later = now + std::time::Duration::from_secs(60);
        assert_eq!(
            outcome_facts(429, &dated, b"", later).retry_after_ms,
            Some(0)
        );

        // Beyond a year, in either header, a year.
        for (name, value) in [
            ("retry-after", "1000000000000000"),
            ("retry-after-ms", "1e300"),
        ] {
            let mut far = HeaderMap::new();
            far.insert(name, HeaderValue::from_static(value));
            assert_eq!(
                outcome_facts(429, &far, b"", now).retry_after_ms,
                Some(MAX_DURATION_MS),
                "{name}: {value}"
            );
        }
    }

    #[test]
    fn routing_inputs_and_client_credentials_stay_behind() {
        let raw = r#"{"model":"m","provider":{"only":["x"]},"messages":[]}"#;
        let body = ClientBody::read(raw.as_bytes()).unwrap();
        let mut client = HeaderMap::new();
        client.insert(
            "authorization",
            HeaderValue::from_static("Bearer client-key"),
        );
        client.insert("x-api-key", HeaderValue::from_static("client-key"));
        client.insert("connection", HeaderValue::from_static("keep-alive"));
        client.insert("x-route-hint", HeaderValue::from_static("eu"));
        client.insert("anthropic-version", HeaderValue::from_static("2024-01-01"));
        // One feature per line, as clients send several.
        client.append("anthropic-beta", HeaderValue::from_static("prompt-caching"));
        client.append("anthropic-beta", HeaderValue::from_static("output-128k"));
        let outgoing = Outgoing::new(
            Endpoint::ChatCompletions,
            Some(&body),
            &client,
            &["provider"],
            &["x-route-hint"],
            "req-1",
        );
        let members = outgoing.members.clone();
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
        // A list over several lines goes on as one; a value that is not a
        // list, from its first line.
        let betas: Vec<_> = outgoing.headers.get_all("anthropic-beta").iter().collect();
        assert_eq!(betas, ["prompt-caching, output-128k"]);
        let mut repeated = HeaderMap::new();
        for agent in ["first/1.0", "second/2.0", "third/3.0"] {
            repeated.append("user-agent", HeaderValue::from_static(agent));
            repeated.append("accept", HeaderValue::from_static("text/event-stream"));
            repeated.append("anthropic-beta", HeaderValue::from_static(""));
        }
        let outgoing = Outgoing::new(
            Endpoint::ChatCompletions,
            Some(&body),
            &repeated,
            &[],
            &[],
            "req-1",
        );
        let agents: Vec<_> = outgoing.headers.get_all("user-agent").iter().collect();
        assert_eq!(agents, ["first/1.0"]);
        let accepted: Vec<_> = outgoing.headers.get_all("accept").iter().collect();
        assert_eq!(
            accepted,
            ["text/event-stream, text/event-stream, text/event-stream"]
        );
        // Lines with nothing on them add nothing.
        assert!(outgoing.headers.get("anthropic-beta").is_none());
    }

    #[test]
    fn the_choices_asked_for_are_the_n_the_provider_is_sent() {
        let choices_to = |endpoint, raw: &str, input_fields: &[&str]| {
            let body = ClientBody::read(raw.as_bytes()).unwrap();
            Outgoing::new(
                endpoint,
                Some(&body),
                &HeaderMap::new(),
                input_fields,
                &[],
                "r",
            )
            .choices()
        };
        let choices = |raw: &str, input_fields: &[&str]| {
            choices_to(Endpoint::ChatCompletions, raw, input_fields)
        };
        assert_eq!(choices(r#"{"model":"m","n":3}"#, &[]), 3);
        assert_eq!(choices(r#"{"model":"m","n":3,"n":2}"#, &[]), 2);
        for one in [
            r#"{"model":"m"}"#,
            r#"{"model":"m","n":null}"#,
            r#"{"model":"m","n":0}"#,
            r#"{"model":"m","n":-2}"#,
            r#"{"model":"m","n":"2"}"#,
        ] {
            assert_eq!(choices(one, &[]), 1, "{one}");
        }
        // A routing input stays behind: the provider gives one choice.
        assert_eq!(choices(r#"{"model":"m","n":3}"#, &["n"]), 1);
        let none = Outgoing::new(
            Endpoint::Completions,
            None,
            &HeaderMap::new(),
            &[],
            &[],
            "r",
        );
        assert_eq!(none.choices(), 1);

        // A completion's list of prompts: `n` choices for each.
        let completion = |raw: &str| choices_to(Endpoint::Completions, raw, &[]);
        assert_eq!(completion(r#"{"prompt":["a","b"]}"#), 2);
        assert_eq!(completion(r#"{"prompt":["a","b","c"],"n":2}"#), 6);
        assert_eq!(completion(r#"{"prompt":[[1,2],[3]]}"#), 2);
        for one in [
            r#"{"prompt":"a"}"#,
            r#"{"prompt":[1,2,3]}"#,
            r#"{"prompt":["a"]}"#,
            r#"{"prompt":null}"#,
            r#"{"prompt":{"text":"a"}}"#,
            r#"{"prompt":[]}"#,
        ] {
            assert_eq!(completion(one), 1, "{one}");
        }
        // A chat body's `prompt` says nothing of its choices.
        assert_eq!(choices(r#"{"prompt":["a","b"]}"#, &[]), 1);
    }

    #[test]
    fn an_attempt_body_sends_its_parts_in_order_with_their_length() {
        use hyper::body::Body as _;
        let mut body = AttemptBody::new([
            Bytes::from_static(b"{\"model\":\"m\","),
            Bytes::from_static(b"\"n\":1"),
            Bytes::from_static(b"}"),
        ]);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        let whole = b"{\"model\":\"m\",\"n\":1}";
        let mut sent = Vec::new();
        assert_eq!(body.size_hint().exact(), Some(whole.len() as u64));
        while let std::task::Poll::Ready(Some(frame)) =
            std::pin::Pin::new(&mut body).poll_frame(&mut context)
        {
            let data = frame.unwrap().into_data().unwrap();
            sent.extend_from_slice(&data);
            let left = whole.len() - sent.len();
            assert_eq!(body.size_hint().exact(), Some(left as u64));
        }
        assert!(body.is_end_stream());
        assert_eq!(sent, whole);
    }
}
