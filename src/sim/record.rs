//! The record of every request the sim received, for tests to read.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::{BTreeMap, VecDeque};

/// Requests kept; older ones are dropped first, so a sim left running for a
/// long demo does not grow without bound.
const RECORD_LIMIT: usize = 10_000;

/// Bodies kept, in bytes as received: a body may be up to 8 MiB, and ten
/// thousand of those would not fit in memory. The newest request is kept
/// whatever its size. Bodies are kept as received and read as JSON when
/// the record is read, so the bytes counted are the bytes held (a tree of
/// an array of small numbers takes many times its text).
const RECORD_BODY_BYTES: usize = 32 * 1024 * 1024;

/// A body as the record shows it: parsed JSON, else its text, else null
/// when there is none or it is empty.
pub fn body_json(body: Option<&Bytes>) -> Json {
    match body {
        Some(bytes) if !bytes.is_empty() => serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Json::String(String::from_utf8_lossy(bytes).into_owned())),
        _ => Json::Null,
    }
}

/// One request as the sim received it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The first path segment, whether or not the scenario knows it.
    pub provider: String,
    /// The body's `model`, when the body is JSON with a string `model`.
    pub model: Option<String>,
    pub method: String,
    /// The full path, `/aki-io/v1/chat/completions`.
    pub path: String,
    /// Milliseconds from the sim's start to the request's arrival.
    pub at_ms: u64,
    /// Whether the request asked for a stream.
    pub stream: bool,
    /// The body: parsed JSON, or the text when it is not JSON, or null when empty.
    pub body: Json,
    /// Every request header, names in lowercase; repeated headers joined with `, `.
    pub headers: BTreeMap<String, String>,
    /// The scenario step that answered, as written (`503 retry_after=2s`);
    /// null when the sim refused the request itself (unknown provider or
    /// endpoint, a body that is not JSON, a model list).
    pub step: Option<String>,
}

impl RecordedRequest {
    /// A header's value by name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// The most recent requests, oldest first, each with its body as received
/// (the request's own `body` is filled in when the record is read).
#[derive(Debug, Default)]
pub struct Record {
    requests: VecDeque<(Option<Bytes>, RecordedRequest)>,
    body_bytes: usize,
}

impl Record {
    /// Adds a request and its body, dropping the oldest while the record
    /// holds too many requests or bytes.
    pub fn push(&mut self, mut request: RecordedRequest, body: Option<Bytes>) {
        let size = body.as_ref().map_or(0, Bytes::len);
        while !self.requests.is_empty()
            && (self.requests.len() >= RECORD_LIMIT
                || self.body_bytes.saturating_add(size) > RECORD_BODY_BYTES)
        {
            if let Some((dropped, _)) = self.requests.pop_front() {
                self.body_bytes -= dropped.as_ref().map_or(0, Bytes::len);
            }
        }
        request.body = Json::Null;
        self.body_bytes += size;
        self.requests.push_back((body, request));
    }

    pub fn to_vec(&self) -> Vec<RecordedRequest> {
        self.requests
            .iter()
            .map(|(body, request)| RecordedRequest {
                body: body_json(body.as_ref()),
                ..request.clone()
            })
            .collect()
    }

    pub fn clear(&mut self) {
        self.requests.clear();
        self.body_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(n: usize) -> RecordedRequest {
        RecordedRequest {
            provider: format!("p{n}"),
            model: None,
            method: String::from("POST"),
            path: String::new(),
            at_ms: 0,
            stream: false,
            body: Json::Null,
            headers: BTreeMap::new(),
            step: None,
        }
    }

    fn providers(record: &Record) -> Vec<String> {
        record.to_vec().into_iter().map(|r| r.provider).collect()
    }

    fn body(bytes: usize) -> Option<Bytes> {
        Some(Bytes::from(vec![b' '; bytes]))
    }

    #[test]
    fn the_record_keeps_the_latest_within_its_count_and_bytes() {
        let mut record = Record::default();
        for n in 0..RECORD_LIMIT + 5 {
            record.push(request(n), body(1));
        }
        let kept = providers(&record);
        assert_eq!(kept.len(), RECORD_LIMIT);
        assert_eq!(kept.first().map(String::as_str), Some("p5"));

        let mut record = Record::default();
        let big = RECORD_BODY_BYTES / 3;
        for n in 0..5 {
            record.push(request(n), body(big));
        }
        assert_eq!(providers(&record), ["p2", "p3", "p4"]);
        // One body over the whole budget is still recorded, alone.
        record.push(request(5), body(RECORD_BODY_BYTES * 2));
        assert_eq!(providers(&record), ["p5"]);
        record.push(request(6), body(1));
        assert_eq!(providers(&record), ["p6"]);
        record.clear();
        record.push(request(7), body(RECORD_BODY_BYTES));
        assert_eq!(providers(&record), ["p7"]);
    }

    #[test]
    fn bodies_are_read_when_the_record_is() {
        let mut record = Record::default();
        record.push(request(0), Some(Bytes::from_static(b"{\"model\": \"m\"}")));
        record.push(request(1), Some(Bytes::from_static(b"not json")));
        record.push(request(2), Some(Bytes::new()));
        record.push(request(3), None);
        let bodies: Vec<Json> = record.to_vec().into_iter().map(|r| r.body).collect();
        assert_eq!(
            bodies,
            [
                serde_json::json!({"model": "m"}),
                Json::from("not json"),
                Json::Null,
                Json::Null
            ]
        );
    }
}
