//! The answers in the providers' wire formats: OpenAI chat completions,
//! completions, embeddings and responses, and Anthropic messages, each as
//! one JSON body or as server-sent events. Pure functions of the request;
//! the server decides when each piece is sent.

use super::scenario::Usage;
use crate::data::{Endpoint, WireFormat};
use serde_json::{Value as Json, json};

/// One server-sent event: an optional `event:` name and its JSON data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    name: Option<&'static str>,
    data: String,
}

impl Event {
    fn data(data: &Json) -> Event {
        Event {
            name: None,
            data: data.to_string(),
        }
    }

    fn named(name: &'static str, data: &Json) -> Event {
        Event {
            name: Some(name),
            data: data.to_string(),
        }
    }

    /// The event as written on the wire.
    pub fn to_text(&self) -> String {
        match self.name {
            Some(name) => format!("event: {name}\ndata: {}\n\n", self.data),
            None => format!("data: {}\n\n", self.data),
        }
    }

    /// The event with its data cut in half, so it is not valid JSON.
    pub fn to_malformed_text(&self) -> String {
        let broken = Event {
            name: self.name,
            data: first_half(&self.data).to_string(),
        };
        broken.to_text()
    }
}

/// The first half of a text, cut at a character boundary; a JSON object cut
/// this way is never valid JSON.
pub fn first_half(text: &str) -> &str {
    let middle = text
        .char_indices()
        .map(|(at, _)| at)
        .find(|at| *at >= text.len() / 2)
        .unwrap_or(text.len());
    text.get(..middle).unwrap_or(text)
}

/// A stream in the order it is sent: events before the first content
/// chunk, one event per content chunk, events after the last, and the event
/// that says the stream is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEvents {
    pub preamble: Vec<Event>,
    pub chunks: Vec<Event>,
    pub closing: Vec<Event>,
    pub terminator: Event,
}

/// Everything an answer to one request is made of.
#[derive(Debug, Clone)]
pub struct Answer<'a> {
    pub provider: &'a str,
    /// The request's `model`, echoed as the model that answered.
    pub model: &'a str,
    /// Makes the answer's ids unique within the sim.
    pub serial: u64,
    /// Unix seconds.
    pub created: u64,
    pub usage: Usage,
    pub chunks: u32,
    pub request: &'a Json,
}

/// Length of every simulated embedding vector.
const EMBEDDING_LENGTH: usize = 8;

impl Answer<'_> {
    /// The content: it names the provider so tests and the demo can see who
    /// answered.
    pub fn text(&self) -> String {
        format!("hello from {}", self.provider)
    }

    /// The content split into `chunks` pieces of nearly equal length (some
    /// are empty when there are more chunks than characters).
    pub fn pieces(&self) -> Vec<String> {
        let text: Vec<char> = self.text().chars().collect();
        let count = self.chunks.max(1) as usize;
        let (size, longer) = (text.len() / count, text.len() % count);
        let mut pieces = Vec::with_capacity(count);
        let mut rest = text.as_slice();
        for index in 0..count {
            let take = size + usize::from(index < longer);
            let (piece, after) = rest.split_at(take.min(rest.len()));
            pieces.push(piece.iter().collect());
            rest = after;
        }
        pieces
    }

    fn total_tokens(&self) -> u64 {
        u64::from(self.usage.input) + u64::from(self.usage.output)
    }

    fn openai_usage(&self) -> Json {
        json!({
            "prompt_tokens": self.usage.input,
            "completion_tokens": self.usage.output,
            "total_tokens": self.total_tokens(),
        })
    }

    /// `stream_options.include_usage`, which asks for a last chunk with usage.
    fn include_usage(&self) -> bool {
        self.request
            .pointer("/stream_options/include_usage")
            .and_then(Json::as_bool)
            .unwrap_or(false)
    }

    /// The answer as one JSON body.
    pub fn body(&self, endpoint: Endpoint) -> Json {
        match endpoint {
            Endpoint::ChatCompletions => json!({
                "id": format!("chatcmpl-sim{}", self.serial),
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": null,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text(), "refusal": null},
                    "logprobs": null,
                    "finish_reason": "stop",
                }],
                "usage": self.openai_usage(),
            }),
            Endpoint::Completions => json!({
                "id": format!("cmpl-sim{}", self.serial),
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": null,
                "choices": [{"text": self.text(), "index": 0, "logprobs": null, "finish_reason": "stop"}],
                "usage": self.openai_usage(),
            }),
            Endpoint::Embeddings => self.embeddings(),
            Endpoint::Responses => self.response("completed", &[self.text()]),
            Endpoint::Messages => json!({
                "id": format!("msg_sim{}", self.serial),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [{"type": "text", "text": self.text()}],
                "stop_reason": "end_turn",
                "stop_sequence": null,
                "usage": {"input_tokens": self.usage.input, "output_tokens": self.usage.output},
            }),
        }
    }

    /// One embedding per input (a string or a token list counts as one
    /// input; a list of them as one each), as floats or, when asked with
    /// `encoding_format: base64` as the OpenAI SDKs do, as base64 of
    /// little-endian f32s.
    fn embeddings(&self) -> Json {
        let inputs = match self.request.get("input") {
            Some(Json::Array(items)) if items.iter().all(|item| !item.is_number()) => {
                items.len().max(1)
            }
            _ => 1,
        };
        let base64 = self.request.get("encoding_format").and_then(Json::as_str) == Some("base64");
        let vector: Vec<f32> = (1..=EMBEDDING_LENGTH)
            .map(|step| step as f32 / EMBEDDING_LENGTH as f32)
            .collect();
        let embedding = if base64 {
            let bytes: Vec<u8> = vector
                .iter()
                .flat_map(|value| value.to_le_bytes())
                .collect();
            json!(base64_encode(&bytes))
        } else {
            json!(vector)
        };
        let data: Vec<Json> = (0..inputs)
            .map(|index| json!({"object": "embedding", "index": index, "embedding": embedding}))
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": self.usage.input, "total_tokens": self.usage.input},
        })
    }

    fn message_item_id(&self) -> String {
        format!("msg_sim{}", self.serial)
    }

    fn output_text_part(text: &str) -> Json {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    /// The message item of a Responses answer with the given text parts.
    fn response_message(&self, status: &str, parts: &[String]) -> Json {
        let content: Vec<Json> = parts
            .iter()
            .map(|text| Answer::output_text_part(text))
            .collect();
        json!({
            "type": "message",
            "id": self.message_item_id(),
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// A Responses API object; `parts` empty while it is in progress.
    fn response(&self, status: &str, parts: &[String]) -> Json {
        let completed = status == "completed";
        let output = if completed {
            vec![self.response_message("completed", parts)]
        } else {
            Vec::new()
        };
        let usage = completed.then(|| {
            json!({
                "input_tokens": self.usage.input,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.usage.output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.total_tokens(),
            })
        });
        json!({
            "id": format!("resp_sim{}", self.serial),
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "instructions": null,
            "max_output_tokens": null,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null},
            "store": false,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": {},
        })
    }

    /// The answer as server-sent events; `None` for embeddings, which
    /// never stream.
    pub fn stream(&self, endpoint: Endpoint) -> Option<StreamEvents> {
        match endpoint {
            Endpoint::ChatCompletions => Some(self.chat_stream()),
            Endpoint::Completions => Some(self.completions_stream()),
            Endpoint::Responses => Some(self.responses_stream()),
            Endpoint::Messages => Some(self.messages_stream()),
            Endpoint::Embeddings => None,
        }
    }

    fn chat_chunk(&self, choices: Json) -> Json {
        let mut chunk = json!({
            "id": format!("chatcmpl-sim{}", self.serial),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if self.include_usage()
            && let Some(object) = chunk.as_object_mut()
        {
            object.insert(String::from("usage"), Json::Null);
        }
        chunk
    }

    /// The usage chunk OpenAI sends last when `include_usage` is asked for:
    /// no choices, only usage.
    fn usage_chunk(&self, mut chunk: Json) -> Option<Event> {
        if !self.include_usage() {
            return None;
        }
        if let Some(object) = chunk.as_object_mut() {
            object.insert(String::from("choices"), json!([]));
            object.insert(String::from("usage"), self.openai_usage());
        }
        Some(Event::data(&chunk))
    }

    fn chat_stream(&self) -> StreamEvents {
        let chunks = self
            .pieces()
            .iter()
            .enumerate()
            .map(|(index, piece)| {
                // The first chunk carries the role, as OpenAI's does.
                let delta = if index == 0 {
                    json!({"role": "assistant", "content": piece})
                } else {
                    json!({"content": piece})
                };
                Event::data(&self.chat_chunk(json!([{
                    "index": 0, "delta": delta, "logprobs": null, "finish_reason": null,
                }])))
            })
            .collect();
        let finish = self.chat_chunk(json!([{
            "index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop",
        }]));
        let mut closing = vec![Event::data(&finish)];
        closing.extend(self.usage_chunk(finish));
        StreamEvents {
            preamble: Vec::new(),
            chunks,
            closing,
            terminator: done(),
        }
    }

    fn completions_chunk(&self, text: &str, finish_reason: Option<&str>) -> Json {
        let mut chunk = json!({
            "id": format!("cmpl-sim{}", self.serial),
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason}],
        });
        if self.include_usage()
            && let Some(object) = chunk.as_object_mut()
        {
            object.insert(String::from("usage"), Json::Null);
        }
        chunk
    }

    fn completions_stream(&self) -> StreamEvents {
        let chunks = self
            .pieces()
            .iter()
            .map(|piece| Event::data(&self.completions_chunk(piece, None)))
            .collect();
        let finish = self.completions_chunk("", Some("stop"));
        let mut closing = vec![Event::data(&finish)];
        closing.extend(self.usage_chunk(finish));
        StreamEvents {
            preamble: Vec::new(),
            chunks,
            closing,
            terminator: done(),
        }
    }

    fn responses_stream(&self) -> StreamEvents {
        let mut sequence_number = 0u64;
        let mut event = |name: &'static str, mut data: Json| {
            if let Some(object) = data.as_object_mut() {
                object.insert(String::from("type"), json!(name));
                object.insert(String::from("sequence_number"), json!(sequence_number));
            }
            sequence_number += 1;
            Event::named(name, &data)
        };
        let item_id = self.message_item_id();
        let text = self.text();
        let preamble = vec![
            event(
                "response.created",
                json!({"response": self.response("in_progress", &[])}),
            ),
            event(
                "response.in_progress",
                json!({"response": self.response("in_progress", &[])}),
            ),
            event(
                "response.output_item.added",
                json!({"output_index": 0, "item": self.response_message("in_progress", &[])}),
            ),
            event(
                "response.content_part.added",
                json!({
                    "item_id": item_id, "output_index": 0, "content_index": 0,
                    "part": Answer::output_text_part(""),
                }),
            ),
        ];
        let chunks = self
            .pieces()
            .iter()
            .map(|piece| {
                event(
                    "response.output_text.delta",
                    json!({
                        "item_id": item_id, "output_index": 0, "content_index": 0,
                        "delta": piece, "logprobs": [],
                    }),
                )
            })
            .collect();
        let closing = vec![
            event(
                "response.output_text.done",
                json!({
                    "item_id": item_id, "output_index": 0, "content_index": 0,
                    "text": text, "logprobs": [],
                }),
            ),
            event(
                "response.content_part.done",
                json!({
                    "item_id": item_id, "output_index": 0, "content_index": 0,
                    "part": Answer::output_text_part(&text),
                }),
            ),
            event(
                "response.output_item.done",
                json!({"output_index": 0, "item": self.response_message("completed", std::slice::from_ref(&text))}),
            ),
        ];
        let terminator = event(
            "response.completed",
            json!({"response": self.response("completed", &[text])}),
        );
        StreamEvents {
            preamble,
            chunks,
            closing,
            terminator,
        }
    }

    fn messages_stream(&self) -> StreamEvents {
        let message_start = json!({
            "type": "message_start",
            "message": {
                "id": format!("msg_sim{}", self.serial),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": self.usage.input, "output_tokens": 1},
            },
        });
        let preamble = vec![
            Event::named("message_start", &message_start),
            Event::named(
                "content_block_start",
                &json!({
                    "type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }),
            ),
        ];
        let chunks = self
            .pieces()
            .iter()
            .map(|piece| {
                Event::named(
                    "content_block_delta",
                    &json!({
                        "type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": piece},
                    }),
                )
            })
            .collect();
        let closing = vec![
            Event::named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            Event::named(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": self.usage.output},
                }),
            ),
        ];
        StreamEvents {
            preamble,
            chunks,
            closing,
            terminator: Event::named("message_stop", &json!({"type": "message_stop"})),
        }
    }
}

/// What a provider sends to keep a stream open while it has nothing else to
/// send: Anthropic's `ping` event on `/v1/messages`, an SSE comment on the
/// OpenAI formats (as gateways such as OpenRouter send while they wait).
pub fn keep_alive(endpoint: Endpoint) -> String {
    match endpoint {
        Endpoint::Messages => Event::named("ping", &json!({"type": "ping"})).to_text(),
        _ => String::from(": keep-alive\n\n"),
    }
}

/// OpenAI's end of a chat or completions stream.
fn done() -> Event {
    Event {
        name: None,
        data: String::from("[DONE]"),
    }
}

/// An error object in the endpoint's wire format. For Anthropic, `code`
/// becomes the error's `type`.
pub fn error_body(endpoint: Endpoint, status: u16, code: Option<&str>, message: &str) -> Json {
    if endpoint.wire() == WireFormat::Anthropic {
        let kind = code.unwrap_or(match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        });
        json!({"type": "error", "error": {"type": kind, "message": message}})
    } else {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        json!({"error": {"message": message, "type": kind, "param": null, "code": code_value(code)}})
    }
}

/// An OpenAI-format error `code`: a number when written in digits, as
/// OpenRouter sends its codes (`"code": 401`), else the text.
fn code_value(code: Option<&str>) -> Json {
    match code {
        Some(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => digits
            .parse::<u64>()
            .map_or_else(|_| json!(digits), |number| json!(number)),
        other => json!(other),
    }
}

/// The error event that ends a stream failing mid-answer, in the
/// endpoint's format: OpenAI's error object as a plain `data:` event,
/// Anthropic's under `event: error`, and the Responses API's typed `error`
/// event, numbered after the `events_sent` before it. Without `code` the
/// error is typed as a server error's.
pub fn stream_error(
    endpoint: Endpoint,
    code: Option<&str>,
    message: &str,
    events_sent: usize,
) -> Event {
    match endpoint {
        Endpoint::Responses => Event::named(
            "error",
            &json!({
                "type": "error",
                "code": code_value(code),
                "message": message,
                "param": null,
                "sequence_number": events_sent,
            }),
        ),
        Endpoint::Messages => Event::named("error", &failed_answer_error(endpoint, code, message)),
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Embeddings => {
            Event::data(&failed_answer_error(endpoint, code, message))
        }
    }
}

/// The error object of an answer that failed midway, in the endpoint's
/// format: typed as a server error's unless `code` says (Anthropic's type).
pub fn failed_answer_error(endpoint: Endpoint, code: Option<&str>, message: &str) -> Json {
    // The failure is the provider's own, whatever status the answer began with.
    error_body(endpoint, 500, code, message)
}

/// `GET /v1/models`: the fields of OpenAI's and Anthropic's model lists
/// together, so both SDKs read it whichever wire format the provider speaks.
pub fn models_body(provider: &str, models: &[&str]) -> Json {
    let data: Vec<Json> = models
        .iter()
        .map(|model| {
            json!({
                "id": model,
                "object": "model",
                "type": "model",
                "created": 0,
                "created_at": "1970-01-01T00:00:00Z",
                "owned_by": provider,
                "display_name": model,
            })
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "has_more": false,
        "first_id": models.first(),
        "last_id": models.last(),
    })
}

/// Standard base64 with padding.
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let symbol = |index: u32| {
        ALPHABET
            .get((index & 63) as usize)
            .map_or('=', |byte| char::from(*byte))
    };
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let [a, b, c] = [0, 1, 2].map(|at| group.get(at).copied().map_or(0, u32::from));
        let triple = (a << 16) | (b << 8) | c;
        text.push(symbol(triple >> 18));
        text.push(symbol(triple >> 12));
        text.push(if group.len() > 1 {
            symbol(triple >> 6)
        } else {
            '='
        });
        text.push(if group.len() > 2 { symbol(triple) } else { '=' });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(request: &Json, chunks: u32) -> Answer<'_> {
        Answer {
            provider: "aki-io",
            model: "m",
            serial: 7,
            created: 1,
            usage: Usage {
                input: 3,
                output: 4,
            },
            chunks,
            request,
        }
    }

    #[test]
    fn pieces_split_the_text_evenly() {
        let request = json!({});
        assert_eq!(
            answer(&request, 5).pieces(),
            ["hell", "o fr", "om ", "aki", "-io"]
        );
        assert_eq!(answer(&request, 1).pieces(), ["hello from aki-io"]);
        let many = answer(&request, 20).pieces();
        assert_eq!(
            (many.len(), many.concat()),
            (20, String::from("hello from aki-io"))
        );
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn halves_are_not_json() {
        let event = Event::data(&json!({"a": "ü", "b": [1, 2, 3]}));
        let text = event.to_malformed_text();
        let data = text.trim().trim_start_matches("data: ");
        assert!(serde_json::from_str::<Json>(data).is_err(), "{data}");
    }

    #[test]
    fn include_usage_adds_a_last_chunk_without_choices() {
        let request = json!({"stream_options": {"include_usage": true}});
        let Some(stream) = answer(&request, 2).stream(Endpoint::ChatCompletions) else {
            panic!("chat completions stream")
        };
        let last = stream
            .closing
            .last()
            .map(Event::to_text)
            .unwrap_or_default();
        assert!(last.contains(r#""choices":[]"#), "{last}");
        assert!(last.contains(r#""total_tokens":7"#), "{last}");
        let plain = json!({});
        assert_eq!(
            answer(&plain, 2)
                .stream(Endpoint::ChatCompletions)
                .map(|stream| stream.closing.len()),
            Some(1)
        );
    }

    #[test]
    fn a_stream_error_takes_each_endpoints_error_event_shape() {
        let chat = stream_error(
            Endpoint::ChatCompletions,
            Some("max_tokens_exceeded"),
            "m",
            3,
        );
        assert_eq!(chat.name, None);
        let data: Json = serde_json::from_str(&chat.data).unwrap_or_default();
        assert_eq!(data["error"]["code"], "max_tokens_exceeded");
        assert_eq!(data["error"]["type"], "server_error");
        assert_eq!(data["error"]["message"], "m");

        let anthropic = stream_error(Endpoint::Messages, Some("overloaded_error"), "m", 3);
        assert_eq!(anthropic.name, Some("error"));
        let data: Json = serde_json::from_str(&anthropic.data).unwrap_or_default();
        assert_eq!(data["type"], "error");
        assert_eq!(data["error"]["type"], "overloaded_error");
        let untyped = stream_error(Endpoint::Messages, None, "m", 3);
        assert!(
            untyped.data.contains(r#""type":"api_error""#),
            "{untyped:?}"
        );

        let responses = stream_error(Endpoint::Responses, Some("server_error"), "m", 6);
        assert!(
            responses.to_text().starts_with("event: error\ndata: "),
            "{responses:?}"
        );
        let data: Json = serde_json::from_str(&responses.data).unwrap_or_default();
        assert_eq!(
            (&data["type"], &data["code"], &data["message"]),
            (&json!("error"), &json!("server_error"), &json!("m"))
        );
        assert_eq!(data["sequence_number"], 6);
    }

    #[test]
    fn a_code_in_digits_is_a_number_as_openrouter_sends_it() {
        let body = error_body(Endpoint::ChatCompletions, 401, Some("401"), "no");
        assert_eq!(body["error"]["code"], json!(401));
        let body = error_body(
            Endpoint::ChatCompletions,
            401,
            Some("invalid_api_key"),
            "no",
        );
        assert_eq!(body["error"]["code"], json!("invalid_api_key"));
        let body = error_body(Endpoint::ChatCompletions, 500, None, "no");
        assert_eq!(body["error"]["code"], Json::Null);
        let event = stream_error(Endpoint::Responses, Some("429"), "no", 0);
        assert!(
            event.to_text().contains("\"code\":429"),
            "{}",
            event.to_text()
        );
        // Anthropic's format has no code: it becomes the type, as text.
        let body = error_body(Endpoint::Messages, 401, Some("401"), "no");
        assert_eq!(body["error"]["type"], json!("401"));
    }

    #[test]
    fn responses_events_are_numbered_in_order() {
        let request = json!({});
        let Some(stream) = answer(&request, 2).stream(Endpoint::Responses) else {
            panic!("responses stream")
        };
        let all: Vec<String> = stream
            .preamble
            .iter()
            .chain(&stream.chunks)
            .chain(&stream.closing)
            .chain([&stream.terminator])
            .map(Event::to_text)
            .collect();
        for (index, event) in all.iter().enumerate() {
            assert!(
                event.contains(&format!(r#""sequence_number":{index}"#)),
                "{event}"
            );
        }
    }
}
