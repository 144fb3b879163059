//! The record of every request the sim received, for tests to read.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::{BTreeMap, VecDeque};

/// Requests kept; older ones are dropped first, so a sim left running for a
/// long demo does not grow without bound.
const RECORD_LIMIT: usize = 10_000;

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

/// The most recent requests, oldest first.
#[derive(Debug, Default)]
pub struct Record(VecDeque<RecordedRequest>);

impl Record {
    pub fn push(&mut self, request: RecordedRequest) {
        if self.0.len() >= RECORD_LIMIT {
            self.0.pop_front();
        }
        self.0.push_back(request);
    }

    pub fn to_vec(&self) -> Vec<RecordedRequest> {
        self.0.iter().cloned().collect()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}
