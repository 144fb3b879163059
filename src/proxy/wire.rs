//! The two wire formats as the proxy speaks them: error objects, error
//! events in streams, and reading server-sent events from providers.

use super::event_data::{EventData, NameIn, UsageFigures};
use crate::data::WireFormat;
use crate::evaluate::{Endpoint, ErrorResponse};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Value as Json, json};

/// The error object a client of this wire format expects. Anthropic's
/// names its request, as its API's do.
pub fn error_body(wire: WireFormat, request_id: &str, error: &ErrorResponse) -> Json {
    match wire {
        WireFormat::OpenAi => json!({
            "error": {
                "message": error.message,
                "type": error.error_type,
                "code": error.code,
                "param": null,
            }
        }),
        // Anthropic's object has no `code`; the error's name goes with it
        // all the same, so that a policy's codes can be told apart on every
        // endpoint (clients read what they know and pass over the rest).
        WireFormat::Anthropic => json!({
            "type": "error",
            "error": {
                "type": error.error_type,
                "message": error.message,
                "code": error.code,
            },
            "request_id": request_id,
        }),
    }
}

/// The event that ends a stream that broke after it started: an error in
/// the stream's own format and no completion sentinel after it. The
/// Responses API's streams are typed events: its error event names itself
/// (`event: error`, `"type": "error"` with `code` and `message`), and it
/// also carries the error object, which the official SDKs raise on.
pub fn error_event(endpoint: Endpoint, request_id: &str, error: &ErrorResponse) -> Bytes {
    let body = error_body(endpoint.wire(), request_id, error);
    Bytes::from(match (endpoint, endpoint.wire()) {
        (Endpoint::Responses, _) => {
            let typed = json!({
                "type": "error",
                "code": error.code,
                "message": error.message,
                "param": null,
                "error": body.get("error"),
            });
            format!("event: error\ndata: {typed}\n\n")
        }
        (_, WireFormat::OpenAi) => format!("data: {body}\n\n"),
        (_, WireFormat::Anthropic) => format!("event: error\ndata: {body}\n\n"),
    })
}

/// What ends a stream correctly.
pub fn sentinel(endpoint: Endpoint) -> Option<Bytes> {
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Completions => {
            Some(Bytes::from_static(b"data: [DONE]\n\n"))
        }
        Endpoint::Messages => Some(Bytes::from_static(
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        )),
        Endpoint::Responses | Endpoint::Embeddings => None,
    }
}

/// One server-sent event from a provider, as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The bytes of the event, its blank line included.
    pub raw: Bytes,
    pub name: Option<String>,
    pub data: String,
}

/// What an event says: its kind, the usage figures it reports, if any
/// ((input, output) tokens), and the choices it brings output for (chat
/// and completions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub kind: EventKind,
    pub usage: Option<(u64, u64)>,
    pub output: ChoiceSet,
}

impl Reading {
    fn of(kind: EventKind) -> Reading {
        Reading {
            kind,
            usage: None,
            output: ChoiceSet::default(),
        }
    }
}

/// What an event means for the stream it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Content or metadata.
    Content,
    /// Announces the answer before any of it: Anthropic's `message_start`
    /// and `content_block_start`, the Responses API's
    /// `response.created`, `response.queued`, `response.in_progress`,
    /// `response.output_item.added` and `response.content_part.added`.
    /// Providers send these at once, before generating anything, so they
    /// say nothing of whether the answer will come.
    Opening,
    /// Choices of the answer are complete (finish reasons; a stop reason,
    /// which ends Anthropic's one choice). Once every choice the request
    /// asked for is, only the sentinel or usage may follow.
    Finished(ChoiceSet),
    /// The completion sentinel itself.
    Sentinel,
    /// A comment or a keep-alive: an SSE comment, or Anthropic's `ping`.
    Comment,
    /// The provider reports an error in the stream.
    Error,
    /// Not valid for the wire format.
    Malformed,
}

/// A set of an answer's choices (those that finished, those with output),
/// by their `index`, without allocating: OpenAI allows at most 128
/// choices (`n`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceSet {
    /// Bit `i` set: choice `i` is in the set.
    indexes: u128,
    /// A choice is whose index is none of those: past 127, or not a whole
    /// number.
    untracked: bool,
}

impl ChoiceSet {
    /// The only choice, as in an Anthropic message.
    pub const FIRST: ChoiceSet = ChoiceSet {
        indexes: 1,
        untracked: false,
    };

    /// Adds choice `index` (`None`: not a whole number).
    pub fn add(&mut self, index: Option<u64>) {
        match index
            .and_then(|index| u32::try_from(index).ok())
            .and_then(|index| 1u128.checked_shl(index))
        {
            Some(bit) => self.indexes |= bit,
            None => self.untracked = true,
        }
    }

    /// Those here or in `other`.
    pub fn and(self, other: ChoiceSet) -> ChoiceSet {
        ChoiceSet {
            indexes: self.indexes | other.indexes,
            untracked: self.untracked || other.untracked,
        }
    }

    pub fn is_empty(self) -> bool {
        self.indexes == 0 && !self.untracked
    }

    /// Whether a choice is in both.
    pub fn overlaps(self, other: ChoiceSet) -> bool {
        self.indexes & other.indexes != 0
    }

    /// Whether exactly choices `0..expected` finished. A choice outside
    /// them means the provider answers otherwise than asked: the answer is
    /// then never taken as complete before its end, rather than ended early
    /// with a choice missing.
    pub fn are_all_of(self, expected: u64) -> bool {
        let all = match expected {
            1..=127 => (1u128 << expected) - 1,
            128 => u128::MAX,
            _ => return false,
        };
        !self.untracked && self.indexes == all
    }
}

impl Event {
    /// What the event means for `endpoint`'s stream, and the usage
    /// figures it reports, if any: (input, output) tokens. Its data is
    /// read once for both, and only the members that tell them.
    pub fn meaning(&self, endpoint: Endpoint) -> (EventKind, Option<(u64, u64)>) {
        let reading = self.read(endpoint);
        (reading.kind, reading.usage)
    }

    /// What the event says for `endpoint`'s stream (see [`Reading`]), its
    /// data read once.
    pub fn read(&self, endpoint: Endpoint) -> Reading {
        if let Some(kind) = self.without_json(endpoint) {
            return Reading::of(kind);
        }
        let Some(data) = EventData::read(&self.data) else {
            return Reading::of(EventKind::Malformed);
        };
        let facts = Facts {
            event_type: data.event_type.as_deref().or(self.name.as_deref()),
            error: data.error,
            finished_choices: data.finished_choices,
            delta_stopped: data.delta_stopped,
        };
        Reading {
            kind: facts.kind(endpoint),
            usage: data
                .usage
                .or(data.message_usage)
                .or(data.response_usage)
                .or(data.groq_usage),
            output: data.output_choices,
        }
    }

    /// `read` as from the data's whole JSON tree: slower, plainly right,
    /// and the reference the tests and the `sse` fuzz target hold `read` to
    /// wherever it speaks (`tree_readable`).
    pub fn read_by_tree(&self, endpoint: Endpoint) -> Reading {
        if let Some(kind) = self.without_json(endpoint) {
            return Reading::of(kind);
        }
        let Ok(data) = serde_json::from_str::<Json>(&self.data) else {
            return Reading::of(EventKind::Malformed);
        };
        if !data.is_object() {
            return Reading::of(EventKind::Malformed);
        }
        let facts = Facts {
            event_type: data
                .get("type")
                .and_then(Json::as_str)
                .or(self.name.as_deref()),
            error: data.get("error").is_some_and(|e| !e.is_null()),
            finished_choices: choices_in_tree(&data, |choice| {
                choice.get("finish_reason").is_some_and(reason_given)
            }),
            delta_stopped: data.pointer("/delta/stop_reason").is_some_and(reason_given),
        };
        Reading {
            kind: facts.kind(endpoint),
            usage: usage_in_event(&data),
            output: choices_in_tree(&data, |choice| {
                let delta_output =
                    choice
                        .get("delta")
                        .and_then(Json::as_object)
                        .is_some_and(|delta| {
                            delta
                                .iter()
                                .any(|(name, value)| name != "role" && has_output(value))
                        });
                delta_output || choice.get("text").is_some_and(has_output)
            }),
        }
    }

    /// Whether `read_by_tree` speaks for this event: its data is not
    /// JSON, or serde_json builds its tree. Valid JSON that it builds no tree
    /// of (a number beyond the range of `f64`, nesting deeper than 128)
    /// `meaning` still reads, as a whole answer is read: only the members
    /// that classify an event are built, and such values are none of them.
    pub fn tree_readable(&self) -> bool {
        serde_json::from_str::<Json>(&self.data).is_ok()
            || serde_json::from_str::<IgnoredAny>(&self.data).is_err()
    }

    /// Whether the event is OpenAI's `[DONE]` sentinel, on whatever stream.
    pub fn is_done_marker(&self) -> bool {
        self.data.trim() == "[DONE]"
    }

    /// The kind of an event that carries no JSON: a comment, or the
    /// `[DONE]` sentinel.
    fn without_json(&self, endpoint: Endpoint) -> Option<EventKind> {
        if self.data.is_empty() && self.name.is_none() {
            return Some(EventKind::Comment);
        }
        if self.data.trim() == "[DONE]" {
            return Some(match endpoint {
                Endpoint::ChatCompletions | Endpoint::Completions => EventKind::Sentinel,
                _ => EventKind::Malformed,
            });
        }
        None
    }

    /// What the event means for `endpoint`'s stream.
    pub fn kind(&self, endpoint: Endpoint) -> EventKind {
        self.meaning(endpoint).0
    }

    /// Usage figures the event reports, if any: (input, output) tokens.
    pub fn usage(&self) -> Option<(u64, u64)> {
        let data: Json = serde_json::from_str(&self.data).ok()?;
        usage_in_event(&data)
    }
}

/// What classifies an event whose data is a JSON object.
struct Facts<'a> {
    /// The data's `type`, or else the event's name.
    event_type: Option<&'a str>,
    /// `error` is there and not null.
    error: bool,
    /// The choices with a finish reason.
    finished_choices: ChoiceSet,
    /// `delta.stop_reason` is given (`reason_given`).
    delta_stopped: bool,
}

impl Facts<'_> {
    fn kind(&self, endpoint: Endpoint) -> EventKind {
        let event_type = self.event_type;
        if self.error || event_type == Some("error") {
            return EventKind::Error;
        }
        match endpoint {
            Endpoint::ChatCompletions | Endpoint::Completions => {
                if self.finished_choices.is_empty() {
                    EventKind::Content
                } else {
                    EventKind::Finished(self.finished_choices)
                }
            }
            Endpoint::Messages => match event_type {
                Some("message_stop") => EventKind::Sentinel,
                Some("message_delta") if self.delta_stopped => {
                    EventKind::Finished(ChoiceSet::FIRST)
                }
                Some("message_start" | "content_block_start") => EventKind::Opening,
                Some("ping") => EventKind::Comment,
                Some(_) => EventKind::Content,
                None => EventKind::Malformed,
            },
            Endpoint::Responses => match event_type {
                // An incomplete response is a normal end too (the output
                // limit, a content filter), which its final event reports.
                Some("response.completed") | Some("response.incomplete") => EventKind::Sentinel,
                Some("response.failed") => EventKind::Error,
                Some(
                    "response.created"
                    | "response.queued"
                    | "response.in_progress"
                    | "response.output_item.added"
                    | "response.content_part.added",
                ) => EventKind::Opening,
                Some(_) => EventKind::Content,
                None => EventKind::Malformed,
            },
            Endpoint::Embeddings => EventKind::Malformed,
        }
    }
}

/// Whether a `finish_reason` or `stop_reason` says the answer stopped:
/// not null and not blank. Some OpenAI-compatible servers send `""` on
/// every chunk before the last; read as a finish, it ended healthy streams
/// after their first chunk and passed a later cut off as complete.
pub fn reason_given(reason: &Json) -> bool {
    !reason.is_null() && !reason.as_str().is_some_and(|text| text.trim().is_empty())
}

/// The choices in `data`'s `choices` list that are objects for which
/// `holds` holds, by their `index`; a choice without one is the one at its
/// place in the list.
fn choices_in_tree(data: &Json, holds: impl Fn(&Json) -> bool) -> ChoiceSet {
    let mut set = ChoiceSet::default();
    let choices = data.get("choices").and_then(Json::as_array);
    for (place, choice) in choices.into_iter().flatten().enumerate() {
        if choice.is_object() && holds(choice) {
            set.add(match choice.get("index") {
                Some(index) => index.as_u64(),
                None => u64::try_from(place).ok(),
            });
        }
    }
    set
}

/// Whether a value holds output: a text that is not empty, or a list or
/// object holding one. A delta of a role and empty content holds none, nor
/// do numbers (a tool call's `index`, a token id); a provider that sends
/// finish reasons with every chunk is told by output after a finish.
fn has_output(value: &Json) -> bool {
    match value {
        Json::Null | Json::Bool(_) | Json::Number(_) => false,
        Json::String(text) => !text.is_empty(),
        Json::Array(items) => items.iter().any(has_output),
        Json::Object(members) => members.values().any(has_output),
    }
}

/// An event's usage: at its top level, or in the message (Anthropic) or
/// response (Responses) it reports on, or in Groq's `x_groq`.
fn usage_in_event(data: &Json) -> Option<(u64, u64)> {
    usage_of(data)
        .or_else(|| data.get("message").and_then(usage_of))
        .or_else(|| data.get("response").and_then(usage_of))
        .or_else(|| data.get("x_groq").and_then(usage_of))
}

/// Usage in either format: OpenAI's `prompt_tokens`/`completion_tokens` or
/// `input_tokens`/`output_tokens` (Anthropic, Responses).
pub fn usage_of(body: &Json) -> Option<(u64, u64)> {
    usage_figures(body.get("usage")?)
}

/// A stream's usage so far after an event that `reported` some: the larger
/// of each figure. Both formats count cumulatively, but an event may give
/// only one figure: Anthropic's `message_start` gives the input tokens and
/// `message_delta` the output so far, which must not zero the input.
pub fn accumulated_usage(
    so_far: Option<(u64, u64)>,
    reported: Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    match (so_far, reported) {
        (Some((input, output)), Some((more_input, more_output))) => {
            Some((input.max(more_input), output.max(more_output)))
        }
        (so_far, reported) => reported.or(so_far),
    }
}

/// The figures of a `usage` value.
fn usage_figures(usage: &Json) -> Option<(u64, u64)> {
    let field = |names: [&str; 2]| {
        names
            .iter()
            .find_map(|name| usage.get(*name).and_then(Json::as_u64))
    };
    let input = field(["prompt_tokens", "input_tokens"]);
    let output = field(["completion_tokens", "output_tokens"]);
    (input.is_some() || output.is_some()).then(|| (input.unwrap_or(0), output.unwrap_or(0)))
}

/// What a whole (non-streamed) answer reports: `None` when it is not a JSON
/// object, else its usage figures, if any, and whether it is an error
/// object rather than an answer (a non-null `error` member, or Anthropic's
/// `"type": "error"`), as some providers send with a success status. Only
/// the `type` member becomes a JSON tree, and of `usage` only its figures
/// are read; the rest of the answer (its content) is checked but not kept.
pub fn whole_answer(body: &[u8]) -> Option<WholeAnswerFacts> {
    serde_json::from_slice::<WholeAnswer>(body)
        .ok()
        .map(|answer| WholeAnswerFacts {
            usage: answer.usage,
            is_error: answer.error || answer.kind.as_ref().and_then(Json::as_str) == Some("error"),
        })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeAnswerFacts {
    pub usage: Option<(u64, u64)>,
    pub is_error: bool,
}

/// A whole answer's usage figures, its `type` member and whether its `error`
/// one is there and not null (the last of each, as in a JSON tree).
struct WholeAnswer {
    usage: Option<(u64, u64)>,
    kind: Option<Json>,
    error: bool,
}

impl<'de> Deserialize<'de> for WholeAnswer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = WholeAnswer;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<WholeAnswer, A::Error> {
                let mut answer = WholeAnswer {
                    usage: None,
                    kind: None,
                    error: false,
                };
                while let Some(member) =
                    members.next_key_seed(NameIn(&["usage", "type", "error"]))?
                {
                    match member {
                        Some(0) => answer.usage = members.next_value_seed(UsageFigures::Here)?,
                        Some(1) => answer.kind = Some(members.next_value::<Json>()?),
                        Some(_) => {
                            answer.error = members.next_value::<Option<IgnoredAny>>()?.is_some()
                        }
                        None => {
                            members.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(answer)
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// Splits a byte stream into events as they complete.
#[derive(Default)]
pub struct EventReader {
    buffer: Vec<u8>,
    /// Where the search for the end of the pending event resumes: no blank
    /// line ends before it, so bytes already searched are not searched again
    /// when an event arrives in many chunks.
    searched: usize,
    /// Whether the stream's first bytes were looked at for a byte order
    /// mark, which the SSE format lets a stream begin with.
    past_bom: bool,
}

/// UTF-8's byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Longest event kept while waiting for its end; a provider sending more
/// without a blank line is not speaking SSE. As much as a whole answer
/// may hold: one event may carry a whole image (OpenRouter's image models
/// send them base64 in a `delta`), and the Responses API's
/// `response.completed` repeats every output item.
const MAX_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// The most room a reader keeps between events.
const KEPT_ROOM: usize = 64 * 1024;

/// An event grew past [`MAX_EVENT_BYTES`] without ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTooLong;

impl EventReader {
    /// Adds received bytes; returns the events they complete.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Event>, EventTooLong> {
        self.buffer.extend_from_slice(chunk);
        if !self.past_bom {
            // Stripped, or its first line would not read as a field, and
            // the first event would be lost.
            if self.buffer.len() < BOM.len() && BOM.starts_with(&self.buffer) {
                return Ok(Vec::new());
            }
            if self.buffer.starts_with(BOM) {
                self.buffer.drain(..BOM.len());
            }
            self.past_bom = true;
        }
        let mut events = Vec::new();
        // Events are cut from `start` on and the buffer is drained once at
        // the end: draining each event would move the rest of the buffer
        // once per event.
        let mut start = 0;
        let mut from = self.searched;
        while let Some(end) = event_end(&self.buffer, from) {
            let raw = self.buffer.get(start..end).unwrap_or_default();
            events.push(parse_event(Bytes::copy_from_slice(raw)));
            start = end;
            from = end;
        }
        self.buffer.drain(..start);
        // A large event's room is given back once it is out: a stream would
        // otherwise keep it for the rest of its life.
        if self.buffer.capacity() > KEPT_ROOM && self.buffer.len() <= KEPT_ROOM {
            self.buffer.shrink_to(KEPT_ROOM);
        }
        // A blank line is at most 4 bytes: one may begin in the last 3.
        self.searched = self.buffer.len().saturating_sub(3);
        if self.buffer.len() > MAX_EVENT_BYTES {
            return Err(EventTooLong);
        }
        Ok(events)
    }

    /// Bytes received after the last complete event.
    pub fn pending(&self) -> &[u8] {
        &self.buffer
    }
}

/// The end (exclusive) of the first complete event whose blank line starts
/// at `from` or later: after a blank line, with `\n` or `\r\n` line ends.
/// Every blank line has a `\n` followed by `\n` or `\r\n` (`\r\n\r\n`
/// by its second half), so only line ends are looked at, found with
/// `memchr`: looking at every byte was most of the reading of an event.
fn event_end(buffer: &[u8], from: usize) -> Option<usize> {
    let rest = buffer.get(from..)?;
    memchr::memchr_iter(b'\n', rest).find_map(|offset| {
        let at = from + offset;
        let after = buffer.get(at + 1..).unwrap_or_default();
        if after.starts_with(b"\n") {
            Some(at + 2)
        } else if after.starts_with(b"\r\n") {
            Some(at + 3)
        } else {
            None
        }
    })
}

fn parse_event(raw: Bytes) -> Event {
    let text = String::from_utf8_lossy(&raw);
    let mut name = None;
    let mut data = String::new();
    let mut data_lines = 0;
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("data:") {
            if data_lines > 0 {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
            data_lines += 1;
        } else if let Some(value) = line.strip_prefix("event:") {
            name = Some(value.trim().to_string());
        }
    }
    Event { raw, name, data }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn events_complete_across_chunks_and_line_endings() {
        let mut reader = EventReader::default();
        assert!(reader.push(b"data: {\"a\"").unwrap().is_empty());
        let events = reader
            .push(b":1}\n\nevent: ping\r\ndata: {}\r\n\r\ndata: x")
            .unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].data, "{\"a\":1}");
        assert_eq!(events[0].raw.as_ref(), b"data: {\"a\":1}\n\n");
        assert_eq!(events[1].name.as_deref(), Some("ping"));
        assert_eq!(reader.pending(), b"data: x");
    }

    #[test]
    fn a_large_events_room_is_given_back_once_it_is_out() {
        let mut reader = EventReader::default();
        let large = format!("data: {}\n\n", "x".repeat(1 << 20));
        assert_eq!(reader.push(large.as_bytes()).unwrap().len(), 1);
        assert!(reader.buffer.capacity() <= KEPT_ROOM);
    }

    #[test]
    fn a_byte_order_mark_that_begins_the_stream_is_dropped() {
        let mut reader = EventReader::default();
        // Split across chunks, too.
        assert!(reader.push(b"\xEF\xBB").unwrap().is_empty());
        let events = reader
            .push(b"\xBFdata: {\"a\":1}\n\ndata: \xEF\xBB\xBFx\n\n")
            .unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].data, "{\"a\":1}");
        // Only at the start.
        assert_eq!(events[1].data, "\u{feff}x");
    }

    proptest::proptest! {
        #[test]
        fn events_end_where_a_plain_search_finds_a_blank_line(
            buffer in proptest::collection::vec(
                proptest::sample::select(vec![b'\n', b'\r', b'a']),
                0..48,
            ),
            from in 0usize..48,
        ) {
            let plain = (from..buffer.len()).find_map(|at| {
                [&b"\n\n"[..], b"\r\n\r\n", b"\n\r\n"]
                    .into_iter()
                    .find(|blank| buffer[at..].starts_with(blank))
                    .map(|blank| at + blank.len())
            });
            proptest::prop_assert_eq!(event_end(&buffer, from), plain);
        }
    }

    #[test]
    fn a_stream_keeps_each_usage_figure_an_event_gave() {
        let messages = Endpoint::Messages;
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":",
            "{\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",",
            "\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",",
            "\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":22}}\n\n",
        );
        let mut reader = EventReader::default();
        let usage = reader
            .push(stream.as_bytes())
            .unwrap()
            .iter()
            .fold(None, |so_far, event| {
                accumulated_usage(so_far, event.meaning(messages).1)
            });
        assert_eq!(usage, Some((11, 22)));
    }

    /// The kind of an event finishing the choices of these indexes.
    fn finished(indexes: &[Option<u64>]) -> EventKind {
        let mut choices = ChoiceSet::default();
        for index in indexes {
            choices.add(*index);
        }
        EventKind::Finished(choices)
    }

    #[test]
    fn an_answer_is_finished_when_every_choice_asked_for_is() {
        let of = |indexes: &[Option<u64>]| match finished(indexes) {
            EventKind::Finished(choices) => choices,
            _ => ChoiceSet::default(),
        };
        assert!(of(&[Some(0)]).are_all_of(1));
        assert!(!of(&[Some(0)]).are_all_of(2));
        assert!(of(&[Some(1), Some(0)]).are_all_of(2));
        // The same choice twice is one.
        assert!(!of(&[Some(0), Some(0)]).are_all_of(2));
        assert!(
            of(&[Some(0)])
                .and(of(&[Some(0)]))
                .and(of(&[Some(1)]))
                .are_all_of(2)
        );
        let all: Vec<Option<u64>> = (0..128).map(Some).collect();
        assert!(of(&all).are_all_of(128));
        assert!(!of(&all[1..]).are_all_of(128));
        // A choice outside those asked for, or one not told apart, never
        // completes the answer early.
        assert!(!of(&[Some(0), Some(1)]).are_all_of(1));
        assert!(!of(&[Some(0), Some(200)]).are_all_of(1));
        assert!(!of(&[Some(0), None]).are_all_of(1));
        assert!(!of(&all).and(of(&[Some(128)])).are_all_of(128));
        assert!(!of(&all).are_all_of(129));
        assert!(!ChoiceSet::default().are_all_of(0));
    }

    #[test]
    fn each_finished_choice_is_read_by_its_index() {
        let chat = Endpoint::ChatCompletions;
        for (choices, expected) in [
            (
                r#"[{"index":1,"finish_reason":"stop"},{"index":0,"finish_reason":null}]"#,
                finished(&[Some(1)]),
            ),
            (
                r#"[{"index":3,"finish_reason":"stop"},{"index":2,"finish_reason":"length"}]"#,
                finished(&[Some(2), Some(3)]),
            ),
            // Without an index, a choice is the one at its place.
            (
                r#"[{"finish_reason":null},{"finish_reason":"stop"}]"#,
                finished(&[Some(1)]),
            ),
            (
                r#"[{"index":200,"finish_reason":"stop"}]"#,
                finished(&[None]),
            ),
            (
                r#"[{"index":"0","finish_reason":"stop"}]"#,
                finished(&[None]),
            ),
            (
                r#"[{"index":-1,"finish_reason":"stop"}]"#,
                finished(&[None]),
            ),
            (
                r#"[{"index":null,"finish_reason":"stop"}]"#,
                finished(&[None]),
            ),
            // The last of two indexes counts.
            (
                r#"[{"index":0,"finish_reason":"stop","index":5}]"#,
                finished(&[Some(5)]),
            ),
            (r#"[{"index":1,"finish_reason":null}]"#, EventKind::Content),
            // An empty reason is none: some servers send `""` until the end.
            (r#"[{"index":0,"finish_reason":""}]"#, EventKind::Content),
            (r#"[{"index":0,"finish_reason":" "}]"#, EventKind::Content),
            (
                r#"[{"index":0,"finish_reason":""},{"index":1,"finish_reason":"stop"}]"#,
                finished(&[Some(1)]),
            ),
        ] {
            let event = parse_event(Bytes::from(format!("data: {{\"choices\":{choices}}}\n\n")));
            assert_eq!(event.kind(chat), expected, "{choices}");
            assert_eq!(event.read_by_tree(chat).kind, expected, "{choices}");
        }
    }

    #[test]
    fn the_choices_with_output_are_read_by_their_index() {
        let chat = Endpoint::ChatCompletions;
        let output = |choices: &str| {
            let event = parse_event(Bytes::from(format!("data: {{\"choices\":{choices}}}\n\n")));
            let reading = event.read(chat);
            assert_eq!(reading, event.read_by_tree(chat), "{choices}");
            reading.output
        };
        let of = |indexes: &[u64]| {
            let mut set = ChoiceSet::default();
            for index in indexes {
                set.add(Some(*index));
            }
            set
        };
        // A role and empty or null content is no output, nor are numbers;
        // text, tool calls and reasoning are.
        assert_eq!(
            output(r#"[{"index":0,"delta":{"token_id":2,"content":""}}]"#),
            of(&[])
        );
        assert_eq!(
            output(r#"[{"index":0,"delta":{"role":"assistant","content":""}}]"#),
            of(&[])
        );
        assert_eq!(output(r#"[{"index":0,"delta":{"content":null}}]"#), of(&[]));
        assert_eq!(output(r#"[{"index":0,"delta":{}}]"#), of(&[]));
        assert_eq!(
            output(r#"[{"index":1,"delta":{"content":"hi"}}]"#),
            of(&[1])
        );
        assert_eq!(
            output(
                r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]"#
            ),
            of(&[])
        );
        assert_eq!(
            output(
                r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]"#
            ),
            of(&[0])
        );
        assert_eq!(
            output(r#"[{"delta":{"reasoning_content":"so"}},{"delta":{"content":"x"}}]"#),
            of(&[0, 1])
        );
        // A completion's text.
        assert_eq!(
            output(r#"[{"index":2,"text":"x"},{"index":3,"text":""}]"#),
            of(&[2])
        );
        // The last of a member given twice counts, as in a tree, at any
        // depth.
        assert_eq!(
            output(r#"[{"index":0,"delta":{"content":"x"},"delta":{}}]"#),
            of(&[])
        );
        for (choices, expected) in [
            (
                r#"[{"index":0,"delta":{"content":"x","content":""}}]"#,
                of(&[]),
            ),
            (
                r#"[{"index":0,"delta":{"content":"","content":"x"}}]"#,
                of(&[0]),
            ),
            (r#"[{"index":0,"text":{"a":"x","a":null}}]"#, of(&[])),
            (
                r#"[{"index":0,"delta":{"r\u006fle":"assistant"}}]"#,
                of(&[]),
            ),
        ] {
            assert_eq!(output(choices), expected, "{choices}");
        }
    }

    #[test]
    fn events_are_classified_per_endpoint() {
        let event = |text: &str| parse_event(Bytes::from(text.to_string()));
        let chat = Endpoint::ChatCompletions;
        assert_eq!(event("data: [DONE]\n\n").kind(chat), EventKind::Sentinel);
        assert_eq!(
            event(
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n"
            )
            .meaning(chat)
            .0,
            EventKind::Content
        );
        assert_eq!(
            event("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
                .meaning(chat)
                .0,
            finished(&[Some(0)])
        );
        assert_eq!(
            event("data: {not json\n\n").kind(chat),
            EventKind::Malformed
        );
        assert_eq!(event(": keep-alive\n\n").kind(chat), EventKind::Comment);
        assert_eq!(
            event("data: {\"error\":{\"message\":\"x\"}}\n\n")
                .meaning(chat)
                .0,
            EventKind::Error
        );
        let messages = Endpoint::Messages;
        assert_eq!(
            event("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
                .meaning(messages)
                .0,
            EventKind::Sentinel
        );
        assert_eq!(
            event("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n")
                .kind(messages),
            EventKind::Finished(ChoiceSet::FIRST)
        );
        assert_eq!(
            event("data: [DONE]\n\n").kind(messages),
            EventKind::Malformed
        );
        // Usage comes from the same parse, wherever the format puts it.
        assert_eq!(
            event(
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n"
            )
            .meaning(chat),
            (EventKind::Content, Some((3, 5)))
        );
        assert_eq!(
            event("data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":2}}}\n\n")
                .meaning(Endpoint::Responses),
            (EventKind::Sentinel, Some((7, 2)))
        );
        assert_eq!(
            event("data: [DONE]\n\n").meaning(chat),
            (EventKind::Sentinel, None)
        );
    }

    #[test]
    fn events_that_only_announce_an_answer_are_openings() {
        let typed = |kind: &str| {
            parse_event(Bytes::from(format!(
                "event: {kind}\ndata: {{\"type\":\"{kind}\"}}\n\n"
            )))
        };
        let (messages, responses) = (Endpoint::Messages, Endpoint::Responses);
        for (endpoint, kind, expected) in [
            (messages, "message_start", EventKind::Opening),
            (messages, "content_block_start", EventKind::Opening),
            (messages, "ping", EventKind::Comment),
            (messages, "content_block_delta", EventKind::Content),
            (responses, "response.created", EventKind::Opening),
            (responses, "response.queued", EventKind::Opening),
            (responses, "response.in_progress", EventKind::Opening),
            (responses, "response.output_item.added", EventKind::Opening),
            (responses, "response.content_part.added", EventKind::Opening),
            (responses, "response.output_text.delta", EventKind::Content),
        ] {
            assert_eq!(typed(kind).kind(endpoint), expected, "{kind}");
        }
    }

    #[test]
    fn a_responses_stream_ends_completed_or_incomplete_and_fails_only_as_failed() {
        let responses = Endpoint::Responses;
        let event = |kind: &str, response: &str| {
            parse_event(Bytes::from(format!(
                "event: {kind}\ndata: {{\"type\":\"{kind}\",\"response\":{response}}}\n\n"
            )))
        };
        let usage = r#"{"usage":{"input_tokens":5,"output_tokens":16}}"#;
        // `incomplete` is a normal end (`max_output_tokens`, a content
        // filter), its usage counted as a completed response's.
        for kind in ["response.completed", "response.incomplete"] {
            let event = event(kind, usage);
            assert_eq!(
                event.meaning(responses),
                (EventKind::Sentinel, Some((5, 16)))
            );
            assert_eq!(event.read_by_tree(responses), event.read(responses));
        }
        assert_eq!(
            event("response.failed", r#"{"error":{"code":"server_error"}}"#).kind(responses),
            EventKind::Error
        );
    }

    /// Event data as JSON text, from the members `meaning` reads and the
    /// values that tell them apart, nested, and with members given twice
    /// (which a JSON tree cannot hold).
    fn any_event_data() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        // The members read inside a choice or a delta often, so that they
        // come twice.
        let names = prop_oneof![
            2 => prop::sample::select(vec!["finish_reason", "stop_reason"]),
            3 => prop::sample::select(vec![
                "type",
                "error",
                "choices",
                "delta",
                "usage",
                "message",
                "response",
                "x_groq",
                "prompt_tokens",
                "completion_tokens",
                "input_tokens",
                "output_tokens",
                "\\u0074ype",
                "content",
                "index",
                "text",
                "role",
            ]),
        ];
        // Null often: a member that is there but null is read as absent.
        let leaf = prop_oneof![
            2 => Just("null"),
            3 => prop::sample::select(vec![
                "true",
                "7",
                "-1",
                "2.5",
                "18446744073709551615",
                "\"error\"",
                "\"message_stop\"",
                "\"message_delta\"",
                "\"response.completed\"",
                "\"response.failed\"",
                "\"response.incomplete\"",
                "\"stop\"",
                "\"\"",
                "\" \"",
                "0",
                "1",
                "128",
                "\"h\\u00e9\\n\"",
            ]),
        ]
        .prop_map(str::to_string);
        let object = |names: BoxedStrategy<&'static str>, values: BoxedStrategy<String>| {
            prop::collection::vec((names, values), 0..6).prop_map(|members| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(name, value)| format!("\"{name}\":{value}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            })
        };
        let inner_names = names.clone().boxed();
        let value = leaf
            .prop_recursive(3, 24, 4, move |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4)
                        .prop_map(|items| format!("[{}]", items.join(","))),
                    object(inner_names.clone(), inner.boxed()),
                ]
            })
            .boxed();
        // The top level an object, of few names, so that the same member
        // comes twice often.
        let top_names = prop::sample::select(vec![
            "type", "error", "choices", "delta", "usage", "message", "response", "x_groq",
        ])
        .boxed();
        let top = object(top_names, value).boxed();
        prop_oneof![
            6 => top.clone(),
            // Damaged: cut short, or with something after the value.
            1 => top.clone().prop_map(|text| text[..text.len() / 2].to_string()),
            1 => top.prop_map(|text| format!("{text} x")),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        #[test]
        fn meaning_reads_as_the_json_tree_does(
            data in any_event_data(),
            name in proptest::option::of(proptest::sample::select(vec![
                "message_delta", "error", "ping",
            ])),
        ) {
            let mut text = String::new();
            if let Some(name) = name {
                text.push_str(&format!("event: {name}\n"));
            }
            text.push_str(&format!("data: {data}\n\n"));
            let event = parse_event(Bytes::from(text));
            proptest::prop_assume!(event.tree_readable());
            for endpoint in Endpoint::ALL {
                proptest::prop_assert_eq!(
                    event.read(endpoint),
                    event.read_by_tree(endpoint),
                    "{} for {:?}", data, endpoint
                );
            }
        }
    }

    #[test]
    fn meaning_reads_what_tells_events_apart() {
        let chat = Endpoint::ChatCompletions;
        let messages = Endpoint::Messages;
        for (data, endpoint, expected) in [
            // The last of two members counts.
            (
                r#"{"choices":[{"finish_reason":"stop","finish_reason":null}]}"#,
                chat,
                (EventKind::Content, None),
            ),
            (
                r#"{"choices":[{"finish_reason":null},{"finish_reason":"length"}]}"#,
                chat,
                (finished(&[Some(1)]), None),
            ),
            (
                r#"{"choices":{"finish_reason":"stop"}}"#,
                chat,
                (EventKind::Content, None),
            ),
            (
                r#"{"error":null,"choices":[]}"#,
                chat,
                (EventKind::Content, None),
            ),
            (
                r#"{"error":{"message":"x"},"error":null}"#,
                chat,
                (EventKind::Content, None),
            ),
            (
                r#"{"usage":{"prompt_tokens":1},"usage":null}"#,
                chat,
                (EventKind::Content, None),
            ),
            (
                r#"{"usage":"many","message":{"usage":{"input_tokens":4}}}"#,
                messages,
                (EventKind::Malformed, Some((4, 0))),
            ),
            // Usage figures: OpenAI's names first, whole numbers only, the
            // last of a name given twice; message, then response, after it.
            (
                r#"{"usage":{"input_tokens":2,"prompt_tokens":1.0,"completion_tokens":-3,"output_tokens":5}}"#,
                chat,
                (EventKind::Content, Some((2, 5))),
            ),
            (
                r#"{"usage":{"prompt_tokens":1,"prompt_tokens":"x","completion_tokens":[1],"output_tokens":{}}}"#,
                chat,
                (EventKind::Content, None),
            ),
            (
                r#"{"usage":[{"prompt_tokens":1}],"response":{"usage":{"output_tokens":6},"usage":{"input_tokens":8}}}"#,
                chat,
                (EventKind::Content, Some((8, 0))),
            ),
            (
                r#"{"message":{"usage":{"input_tokens":3}},"response":{"usage":{"output_tokens":6}}}"#,
                chat,
                (EventKind::Content, Some((3, 0))),
            ),
            (
                r#"{"message":[],"response":{"output":[{"usage":{"input_tokens":9}}],"usage":{"output_tokens":6}}}"#,
                chat,
                (EventKind::Content, Some((0, 6))),
            ),
            // Groq's last chunk, when the request did not ask for usage.
            (
                r#"{"choices":[],"x_groq":{"id":"req_1","usage":{"prompt_tokens":12,"completion_tokens":7}}}"#,
                chat,
                (EventKind::Content, Some((12, 7))),
            ),
            (
                r#"{"type":"message_delta","delta":[{"stop_reason":"end_turn"}]}"#,
                messages,
                (EventKind::Content, None),
            ),
            (
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
                messages,
                (EventKind::Finished(ChoiceSet::FIRST), None),
            ),
            (
                r#"{"type":"message_delta","delta":{"stop_reason":""}}"#,
                messages,
                (EventKind::Content, None),
            ),
            (r#"{"type":7}"#, messages, (EventKind::Malformed, None)),
            (
                r#"{"type":"message_stop","type":null}"#,
                messages,
                (EventKind::Malformed, None),
            ),
            (
                r#"{"type":"message_stop"}"#,
                messages,
                (EventKind::Sentinel, None),
            ),
            (
                r#"[{"type":"message_stop"}]"#,
                messages,
                (EventKind::Malformed, None),
            ),
            (
                r#"{"type":"message_stop"} {}"#,
                messages,
                (EventKind::Malformed, None),
            ),
        ] {
            let event = parse_event(Bytes::from(format!("data: {data}\n\n")));
            assert_eq!(event.meaning(endpoint), expected, "{data}");
            let by_tree = event.read_by_tree(endpoint);
            assert_eq!((by_tree.kind, by_tree.usage), expected, "{data}");
        }
    }

    #[test]
    fn valid_json_without_a_tree_is_read_all_the_same() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for data in [
            r#"{"created":1e800,"choices":[{"finish_reason":"stop"}]}"#.to_string(),
            format!(r#"{{"content":{deep},"choices":[{{"finish_reason":"stop"}}]}}"#),
        ] {
            let event = parse_event(Bytes::from(format!("data: {data}\n\n")));
            assert!(!event.tree_readable());
            assert_eq!(
                event.meaning(Endpoint::ChatCompletions),
                (finished(&[Some(0)]), None)
            );
        }
        // Not JSON at all: both readings say so.
        let event = parse_event(Bytes::from("data: {\"created\":1e\n\n"));
        assert!(event.tree_readable());
        assert_eq!(
            event.meaning(Endpoint::ChatCompletions).0,
            EventKind::Malformed
        );
    }

    #[test]
    fn usage_in_either_format() {
        assert_eq!(
            usage_of(&json!({"usage": {"prompt_tokens": 3, "completion_tokens": 5}})),
            Some((3, 5))
        );
        assert_eq!(
            usage_of(&json!({"usage": {"input_tokens": 7, "output_tokens": 2}})),
            Some((7, 2))
        );
        assert_eq!(usage_of(&json!({"usage": null})), None);
    }

    #[test]
    fn a_whole_answer_that_is_an_error_object_says_so() {
        let error = |body: &[u8]| whole_answer(body).map(|a| a.is_error);
        assert_eq!(error(br#"{"error":{"message":"overloaded"}}"#), Some(true));
        assert_eq!(
            error(br#"{"type":"error","error":{"type":"overloaded_error"}}"#),
            Some(true)
        );
        assert_eq!(error(br#"{"type":"message","content":[]}"#), Some(false));
        assert_eq!(error(br#"{"choices":[],"error":null}"#), Some(false));
        assert_eq!(error(br#"{"choices":[]}"#), Some(false));
    }

    #[test]
    fn whole_answers_are_objects_with_or_without_usage() {
        let answer = br#"{"id":"x","choices":[{"message":{"content":"hi \"there\""}}],
            "usage":{"prompt_tokens":3,"completion_tokens":5,"details":{"cached":1}}}"#;
        assert_eq!(whole_answer(answer).map(|a| a.usage), Some(Some((3, 5))));
        assert_eq!(
            whole_answer(br#"{"usage":{"input_tokens":7,"output_tokens":2}}"#).map(|a| a.usage),
            Some(Some((7, 2)))
        );
        // The last `usage` counts, as in a JSON tree; one that is not an
        // object reports nothing but leaves the answer valid.
        assert_eq!(
            whole_answer(br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}"#)
                .map(|a| a.usage),
            Some(Some((2, 0)))
        );
        assert_eq!(
            whole_answer(br#"{"usage":"many"}"#).map(|a| a.usage),
            Some(None)
        );
        assert_eq!(
            whole_answer(br#" {"\u0075sage":{"output_tokens":4}} "#).map(|a| a.usage),
            Some(Some((0, 4)))
        );
        assert_eq!(whole_answer(b"{}").map(|a| a.usage), Some(None));
        assert_eq!(
            whole_answer(br#"{"usage":{"prompt_tokens":1.5,"input_tokens":4,"output_tokens":2,"output_tokens":-1}}"#)
                .map(|a| a.usage),
            Some(Some((4, 0)))
        );
        assert_eq!(
            whole_answer(br#"{"usage":{"prompt_tokens":1},"usage":[]}"#).map(|a| a.usage),
            Some(None)
        );
        for not_an_object in [&b"[1]"[..], b"\"text\"", b"{\"a\":1", b"{} {}", b""] {
            assert_eq!(whole_answer(not_an_object), None);
        }
    }

    #[test]
    fn error_objects_follow_the_wire_format() {
        let error = ErrorResponse {
            status: 429,
            code: String::from("resource_exhausted"),
            message: String::from("slow down"),
            error_type: String::from("rate_limit_error"),
            retry_after_secs: Some(3),
            should_retry: None,
        };
        assert_eq!(
            error_body(WireFormat::OpenAi, "req-1", &error)["error"]["code"],
            "resource_exhausted"
        );
        let anthropic = error_body(WireFormat::Anthropic, "req-1", &error);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["request_id"], "req-1");
        assert_eq!(anthropic["error"]["type"], "rate_limit_error");
        assert!(
            error_event(Endpoint::Messages, "req-1", &error).starts_with(b"event: error\ndata: {")
        );
        assert!(
            error_event(Endpoint::ChatCompletions, "req-1", &error)
                .starts_with(b"data: {\"error\"")
        );
        let responses = error_event(Endpoint::Responses, "req-1", &error);
        let text = std::str::from_utf8(&responses).unwrap_or_default();
        let data = text
            .strip_prefix("event: error\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .and_then(|data| serde_json::from_str::<Json>(data).ok())
            .unwrap_or_default();
        assert_eq!(data["type"], "error", "{text}");
        assert_eq!(data["code"], "resource_exhausted", "{text}");
        assert_eq!(data["message"], "slow down", "{text}");
        assert_eq!(data["error"]["code"], "resource_exhausted", "{text}");
    }
}
