//! The simulated providers over real loopback HTTP: every scenario step, the
//! wire formats, sequences, the record and the `/_sim` endpoints, the
//! shipped scenarios, and shutdown.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{Value as Json, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use switchyard::sim::{Scenario, SimHandle, start};

const PACKAGE_ROOT: &str = env!("CARGO_MANIFEST_DIR");

async fn sim(yaml: &str) -> SimHandle {
    let scenario = Scenario::parse(yaml, "test.yaml").unwrap();
    start("127.0.0.1:0".parse().unwrap(), scenario)
        .await
        .unwrap()
}

/// A plain-HTTP client; reqwest still wants a TLS crypto provider installed.
fn client() -> reqwest::Client {
    client_builder().build().unwrap()
}

fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy()
}

async fn post(sim: &SimHandle, provider: &str, endpoint: &str, body: Json) -> reqwest::Response {
    try_post(&client(), sim, provider, endpoint, body)
        .await
        .unwrap()
}

async fn try_post(
    client: &reqwest::Client,
    sim: &SimHandle,
    provider: &str,
    endpoint: &str,
    body: Json,
) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{}/{endpoint}", sim.base_url(provider)))
        .json_body(&body)
        .send()
        .await
}

async fn json_of(response: reqwest::Response) -> Json {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

/// `RequestBuilder::json` without reqwest's `json` feature.
trait JsonBody {
    fn json_body(self, body: &Json) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, body: &Json) -> Self {
        self.header("content-type", "application/json")
            .body(body.to_string())
    }
}

fn content_type(response: &reqwest::Response) -> &str {
    response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
}

/// One server-sent event: its `event:` name and its `data:`.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    name: Option<String>,
    data: String,
}

impl Event {
    fn json(&self) -> Json {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|error| panic!("`{}` is not JSON: {error}", self.data))
    }
}

/// A stream read to its end: the complete events, and whether the body
/// ended cleanly (else the connection broke).
struct Stream {
    events: Vec<Event>,
    clean_end: bool,
}

fn parse_events(text: &str) -> Vec<Event> {
    text.split("\n\n")
        .filter(|block| !block.is_empty())
        .map(|block| {
            let mut event = Event {
                name: None,
                data: String::new(),
            };
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event.name = Some(name.to_string());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    event.data = data.to_string();
                }
            }
            event
        })
        .collect()
}

async fn read_stream(mut response: reqwest::Response) -> Stream {
    assert_eq!(content_type(&response), "text/event-stream");
    let mut text = Vec::new();
    let clean_end = loop {
        match response.chunk().await {
            Ok(Some(bytes)) => text.extend_from_slice(&bytes),
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    Stream {
        events: parse_events(&String::from_utf8(text).unwrap()),
        clean_end,
    }
}

fn chat_contents(events: &[Event]) -> String {
    events
        .iter()
        .filter(|event| event.data != "[DONE]")
        .filter_map(|event| {
            event.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

fn names(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event.name.as_deref().unwrap_or("-"))
        .collect()
}

const CHAT: &str = "chat/completions";

// ------------------------------------------------------------ wire formats

#[tokio::test]
async fn chat_completions_answer_in_the_openai_shape() {
    let sim = sim("providers: {aki-io: {usage: {input: 3, output: 4}}}").await;
    let response = post(
        &sim,
        "aki-io",
        CHAT,
        json!({"model": "qwen/q", "messages": []}),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(content_type(&response), "application/json");
    let body = json_of(response).await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "qwen/q");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(body["created"].as_u64().unwrap() > 0);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "hello from aki-io"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
    );
}

#[tokio::test]
async fn chat_streams_chunk_by_chunk_and_end_with_done() {
    let sim = sim("defaults: {chunks: 4}\nproviders: {scaleway: {}}").await;
    let request = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}});
    let stream = read_stream(post(&sim, "scaleway", CHAT, request).await).await;
    assert!(stream.clean_end);
    let events = &stream.events;
    // 4 content chunks, the finish chunk, the usage chunk, [DONE].
    assert_eq!(events.len(), 7, "{events:?}");
    assert_eq!(events[0].json()["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[0].json()["object"], "chat.completion.chunk");
    assert_eq!(chat_contents(events), "hello from scaleway");
    assert_eq!(events[4].json()["choices"][0]["finish_reason"], "stop");
    assert_eq!(events[5].json()["choices"], json!([]));
    assert_eq!(events[5].json()["usage"]["total_tokens"], 46);
    assert_eq!(events[6].data, "[DONE]");

    let plain = read_stream(
        post(
            &sim,
            "scaleway",
            CHAT,
            json!({"model": "m", "stream": true}),
        )
        .await,
    )
    .await;
    assert_eq!(plain.events.len(), 6, "no usage chunk unless asked for");
    assert!(plain.events[4].json().get("usage").is_none());
}

#[tokio::test]
async fn anthropic_messages_answer_and_stream_in_their_shape() {
    let sim =
        sim("defaults: {chunks: 2, usage: {input: 5, output: 6}}\nproviders: {anthropic: {}}")
            .await;
    let response = post(
        &sim,
        "anthropic",
        "messages",
        json!({"model": "claude-x", "max_tokens": 9}),
    )
    .await;
    assert_eq!(content_type(&response), "application/json");
    let body = json_of(response).await;
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["model"], "claude-x");
    assert_eq!(
        body["content"],
        json!([{"type": "text", "text": "hello from anthropic"}])
    );
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(
        body["usage"],
        json!({"input_tokens": 5, "output_tokens": 6})
    );

    let request = json!({"model": "claude-x", "max_tokens": 9, "stream": true});
    let stream = read_stream(post(&sim, "anthropic", "messages", request).await).await;
    assert!(stream.clean_end);
    assert_eq!(
        names(&stream.events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for event in &stream.events {
        assert_eq!(event.json()["type"], event.name.as_deref().unwrap());
    }
    let text: String = stream.events[2..4]
        .iter()
        .map(|event| {
            let delta = &event.json()["delta"];
            assert_eq!(delta["type"], "text_delta");
            delta["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, "hello from anthropic");
    assert_eq!(stream.events[0].json()["message"]["model"], "claude-x");
    assert_eq!(stream.events[5].json()["usage"]["output_tokens"], 6);
}

#[tokio::test]
async fn responses_answer_and_stream_in_their_shape() {
    let sim = sim("defaults: {chunks: 3}\nproviders: {openai-responses: {}}").await;
    let body = json_of(
        post(
            &sim,
            "openai-responses",
            "responses",
            json!({"model": "gpt-5-codex", "input": "hi"}),
        )
        .await,
    )
    .await;
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "gpt-5-codex");
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(
        body["output"][0]["content"][0]["text"],
        "hello from openai-responses"
    );
    assert_eq!(body["usage"]["total_tokens"], 46);

    let request = json!({"model": "gpt-5-codex", "input": "hi", "stream": true});
    let stream = read_stream(post(&sim, "openai-responses", "responses", request).await).await;
    assert!(stream.clean_end);
    let names = names(&stream.events);
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.completed"));
    let deltas: String = stream
        .events
        .iter()
        .filter(|event| event.name.as_deref() == Some("response.output_text.delta"))
        .map(|event| event.json()["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, "hello from openai-responses");
    let completed = stream.events.last().unwrap().json();
    assert_eq!(completed["response"]["status"], "completed");
    assert!(stream.events.iter().all(|event| event.data != "[DONE]"));
}

#[tokio::test]
async fn completions_and_embeddings_answer_in_the_openai_shape() {
    let sim = sim("providers: {ionos: {}}").await;
    let body = json_of(
        post(
            &sim,
            "ionos",
            "completions",
            json!({"model": "m", "prompt": "x"}),
        )
        .await,
    )
    .await;
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], "hello from ionos");

    let stream = read_stream(
        post(
            &sim,
            "ionos",
            "completions",
            json!({"model": "m", "prompt": "x", "stream": true}),
        )
        .await,
    )
    .await;
    assert_eq!(stream.events.last().unwrap().data, "[DONE]");

    let body = json_of(
        post(
            &sim,
            "ionos",
            "embeddings",
            json!({"model": "mistral-embed", "input": ["a", "b"]}),
        )
        .await,
    )
    .await;
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "mistral-embed");
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["data"][1]["index"], 1);
    let floats = body["data"][0]["embedding"].as_array().unwrap().clone();
    assert_eq!(floats.len(), 8);

    // The OpenAI SDKs ask for base64 of little-endian f32s by default.
    let body = json_of(
        post(
            &sim,
            "ionos",
            "embeddings",
            json!({"model": "mistral-embed", "input": "a", "encoding_format": "base64"}),
        )
        .await,
    )
    .await;
    let encoded = body["data"][0]["embedding"].as_str().unwrap();
    assert_eq!(
        encoded.len(),
        44,
        "8 floats are 32 bytes, 44 base64 characters"
    );

    // Embeddings never stream, even when asked to.
    let response = post(
        &sim,
        "ionos",
        "embeddings",
        json!({"model": "m", "input": "a", "stream": true}),
    )
    .await;
    assert_eq!(content_type(&response), "application/json");
}

// --------------------------------------------------------------- the steps

#[tokio::test]
async fn error_statuses_carry_retry_after_and_the_wire_formats_error_object() {
    let sim = sim(
        "providers:\n  \
           groq: {sequence: [\"429 retry_after=1500ms code=rate_limited message=\\\"slow down\\\"\", 503]}\n  \
           claude: {sequence: [\"529 retry_after=2s\", \"400 code=invalid_request_error\"]}\n",
    )
    .await;
    let response = post(&sim, "groq", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers()["retry-after"],
        "2",
        "rounded up to whole seconds"
    );
    assert_eq!(content_type(&response), "application/json");
    assert_eq!(
        json_of(response).await,
        json!({"error": {"message": "slow down", "type": "rate_limit_error", "param": null, "code": "rate_limited"}})
    );
    let response = post(&sim, "groq", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(
        json_of(response).await,
        json!({"error": {"message": "groq answered 503 (simulated)", "type": "server_error", "param": null, "code": null}})
    );

    let request = json!({"model": "claude-x", "max_tokens": 5, "stream": true});
    let response = post(&sim, "claude", "messages", request.clone()).await;
    assert_eq!(response.status(), 529);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(
        content_type(&response),
        "application/json",
        "errors never stream"
    );
    assert_eq!(
        json_of(response).await,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "claude answered 529 (simulated)"}})
    );
    let response = post(&sim, "claude", "messages", request).await;
    assert_eq!(
        json_of(response).await["error"]["type"],
        "invalid_request_error"
    );
}

#[tokio::test]
async fn reset_closes_the_connection_without_an_answer() {
    let sim = sim("providers: {a: {sequence: [reset, 200]}}").await;
    let client = client();
    let error = try_post(&client, &sim, "a", CHAT, json!({"model": "m"}))
        .await
        .unwrap_err();
    assert!(!error.is_timeout(), "{error:?}");
    assert!(error.status().is_none());
    let response = try_post(&client, &sim, "a", CHAT, json!({"model": "m"}))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(sim.requests()[0].step.as_deref(), Some("reset"));
}

#[tokio::test]
async fn no_answer_leaves_the_client_waiting() {
    let sim = sim("providers: {a: {sequence: [no_answer]}}").await;
    let client = client_builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let error = try_post(&client, &sim, "a", CHAT, json!({"model": "m"}))
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    let recorded = sim.requests();
    assert_eq!(recorded.len(), 1, "the request was read and recorded");
    assert_eq!(recorded[0].step.as_deref(), Some("no_answer"));
}

#[tokio::test]
async fn slow_headers_and_first_token_delay_the_answer() {
    let sim =
        sim("providers: {a: {sequence: [slow_headers=150ms, \"200 first_token=150ms\"]}}").await;
    let started = Instant::now();
    let response = post(&sim, "a", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(150));

    let started = Instant::now();
    let response = post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await;
    let stream = read_stream(response).await;
    assert!(stream.clean_end);
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn cut_after_ends_the_stream_without_done() {
    let sim =
        sim("providers: {a: {sequence: [\"cut_after=2\"]}, b: {sequence: [cut_after=1]}}").await;
    let stream =
        read_stream(post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await).await;
    assert!(!stream.clean_end, "the connection broke mid-stream");
    assert_eq!(stream.events.len(), 2, "{:?}", stream.events);
    assert!(stream.events.iter().all(|event| event.data != "[DONE]"));

    let request = json!({"model": "claude-x", "max_tokens": 5, "stream": true});
    let stream = read_stream(post(&sim, "b", "messages", request).await).await;
    assert!(!stream.clean_end);
    assert_eq!(
        names(&stream.events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta"
        ]
    );

    // Without a stream, half the body arrives before the connection breaks.
    let response = post(&sim, "a", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 200);
    assert!(response.bytes().await.is_err());
}

#[tokio::test]
async fn stall_after_sends_chunks_then_nothing() {
    let sim = sim("providers: {a: {sequence: [stall_after=1]}}").await;
    let mut response = post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await;
    let first = response.chunk().await.unwrap().unwrap();
    let events = parse_events(std::str::from_utf8(&first).unwrap());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].json()["choices"][0]["delta"]["content"], "hel");
    let next = tokio::time::timeout(Duration::from_millis(300), response.chunk()).await;
    assert!(next.is_err(), "nothing arrives after the stall: {next:?}");
}

#[tokio::test]
async fn error_after_sends_chunks_then_an_error_event_in_the_wire_format() {
    let sim = sim(
        "providers: {a: {sequence: [\"error_after=2 code=max_tokens_exceeded\"]}, \
         b: {sequence: [error_after=0]}}",
    )
    .await;
    let stream =
        read_stream(post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await).await;
    assert!(stream.clean_end, "the connection closes normally");
    assert_eq!(stream.events.len(), 3, "{:?}", stream.events);
    assert_eq!(chat_contents(&stream.events[..2]), "hello ");
    let error = stream.events[2].json();
    assert_eq!(error["error"]["code"], "max_tokens_exceeded");
    assert_eq!(error["error"]["type"], "server_error");
    assert_eq!(error["error"]["message"], "a failed mid-answer (simulated)");
    assert!(stream.events.iter().all(|event| event.data != "[DONE]"));

    let request = json!({"model": "claude-x", "max_tokens": 5, "stream": true});
    let stream = read_stream(post(&sim, "a", "messages", request).await).await;
    assert!(stream.clean_end);
    assert_eq!(
        names(&stream.events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "error"
        ]
    );
    let error = stream.events[4].json();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "max_tokens_exceeded");

    // The Responses error event is numbered after the events before it.
    let request = json!({"model": "gpt-5-codex", "input": "hi", "stream": true});
    let stream = read_stream(post(&sim, "a", "responses", request).await).await;
    let error = stream.events.last().unwrap();
    assert_eq!(error.name.as_deref(), Some("error"));
    assert_eq!(
        (error.json()["type"].as_str(), error.json()["code"].as_str()),
        (Some("error"), Some("max_tokens_exceeded"))
    );
    assert_eq!(error.json()["sequence_number"], stream.events.len() - 1);

    // After no chunk, the error comes in place of the answer.
    let stream =
        read_stream(post(&sim, "b", CHAT, json!({"model": "m", "stream": true})).await).await;
    assert_eq!(stream.events.len(), 1, "{:?}", stream.events);
    assert_eq!(stream.events[0].json()["error"]["code"], Json::Null);

    // Without a stream, the error object alone, under the step's status.
    let response = post(&sim, "a", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        json_of(response).await["error"]["code"],
        "max_tokens_exceeded"
    );
}

#[tokio::test]
async fn malformed_answers_are_not_json() {
    let sim = sim("providers: {a: {sequence: [malformed]}}").await;
    let response = post(&sim, "a", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(content_type(&response), "application/json");
    let text = response.text().await.unwrap();
    assert!(text.starts_with('{'));
    assert!(serde_json::from_str::<Json>(&text).is_err(), "{text}");

    let stream =
        read_stream(post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await).await;
    assert_eq!(stream.events.len(), 1);
    assert!(serde_json::from_str::<Json>(&stream.events[0].data).is_err());

    let request = json!({"model": "claude-x", "max_tokens": 5, "stream": true});
    let stream = read_stream(post(&sim, "a", "messages", request).await).await;
    assert_eq!(names(&stream.events), ["message_start"]);
    assert!(serde_json::from_str::<Json>(&stream.events[0].data).is_err());
}

#[tokio::test]
async fn malformed_chunk_breaks_one_chunk_of_a_complete_stream() {
    let sim = sim("defaults: {chunks: 3}\nproviders: {a: {sequence: [malformed_chunk=2]}}").await;
    let stream =
        read_stream(post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await).await;
    assert!(stream.clean_end);
    let broken: Vec<usize> = stream
        .events
        .iter()
        .enumerate()
        .filter(|(_, event)| {
            event.data != "[DONE]" && serde_json::from_str::<Json>(&event.data).is_err()
        })
        .map(|(index, _)| index)
        .collect();
    assert_eq!(broken, [1]);
    assert_eq!(stream.events.last().unwrap().data, "[DONE]");
}

#[tokio::test]
async fn no_done_completes_the_stream_without_its_terminator() {
    let sim = sim("defaults: {chunks: 2}\nproviders: {a: {sequence: [no_done]}}").await;
    let stream =
        read_stream(post(&sim, "a", CHAT, json!({"model": "m", "stream": true})).await).await;
    assert!(stream.clean_end, "the connection closes normally");
    assert_eq!(chat_contents(&stream.events), "hello from a");
    assert_eq!(stream.events.len(), 3, "two chunks and the finish chunk");
    assert_eq!(
        stream.events[2].json()["choices"][0]["finish_reason"],
        "stop"
    );

    let request = json!({"model": "claude-x", "max_tokens": 5, "stream": true});
    let stream = read_stream(post(&sim, "a", "messages", request).await).await;
    assert!(stream.clean_end);
    assert_eq!(names(&stream.events).last(), Some(&"message_delta"));
}

// -------------------------------------------------------------- sequences

#[tokio::test]
async fn sequences_advance_per_model_and_repeat_their_last_step() {
    let sim = sim("providers:\n  \
           aki-io:\n    \
             models:\n      \
               m1: {sequence: [\"503\", \"429\", \"200\"]}\n      \
               m2: {sequence: [\"502\", \"200\"], repeat: true}\n")
    .await;
    let mut statuses = Vec::new();
    for model in ["m1", "m2", "m1", "m2", "m1", "m2", "m1", "other"] {
        let response = post(&sim, "aki-io", CHAT, json!({"model": model})).await;
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [503, 502, 429, 200, 200, 502, 200, 200]);
}

#[tokio::test]
async fn a_provider_wide_sequence_advances_across_models() {
    let sim = sim("providers:\n  \
           scaleway:\n    \
             sequence: [reset, \"500\", \"200\"]\n    \
             models:\n      \
               own: {sequence: [\"404\"]}\n")
    .await;
    let client = client();
    let mut outcomes = Vec::new();
    for model in ["x", "y", "own", "x", "y"] {
        let outcome = try_post(&client, &sim, "scaleway", CHAT, json!({"model": model})).await;
        outcomes.push(outcome.map_or(0, |response| response.status().as_u16()));
    }
    assert_eq!(outcomes, [0, 500, 404, 200, 200]);
}

#[tokio::test]
async fn set_scenario_and_clear_start_sequences_over() {
    let sim = sim("providers: {a: {sequence: [\"503\", \"200\"]}}").await;
    let status = |response: reqwest::Response| response.status().as_u16();
    assert_eq!(
        status(post(&sim, "a", CHAT, json!({"model": "m"})).await),
        503
    );
    assert_eq!(
        status(post(&sim, "a", CHAT, json!({"model": "m"})).await),
        200
    );
    sim.clear();
    assert!(sim.requests().is_empty());
    assert_eq!(
        status(post(&sim, "a", CHAT, json!({"model": "m"})).await),
        503
    );

    sim.set_scenario(
        Scenario::parse("providers: {a: {sequence: [\"418\"]}, b: {}}", "new").unwrap(),
    );
    assert_eq!(
        status(post(&sim, "a", CHAT, json!({"model": "m"})).await),
        418
    );
    assert_eq!(
        status(post(&sim, "b", CHAT, json!({"model": "m"})).await),
        200
    );
    assert_eq!(sim.requests().len(), 3, "set_scenario keeps the record");
}

// ------------------------------------------------------ routing and record

#[tokio::test]
async fn unknown_providers_and_endpoints_get_openai_style_404s() {
    let sim = sim("providers: {a: {models: {m1: {}, \"org/m2\": {}}}}").await;
    let response = post(&sim, "nope", CHAT, json!({"model": "m"})).await;
    assert_eq!(response.status(), 404);
    let body = json_of(response).await;
    assert_eq!(body["error"]["code"], "unknown_provider");
    assert_eq!(body["error"]["message"], "the sim has no provider `nope`");

    let response = post(&sim, "a", "audio/speech", json!({"model": "m"})).await;
    assert_eq!(response.status(), 404);
    assert_eq!(json_of(response).await["error"]["code"], "unknown_endpoint");

    let response = client()
        .post(format!("{}/chat/completions", sim.base_url("a")))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    let response = client()
        .get(format!("{}/models", sim.base_url("a")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = json_of(response).await;
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1", "org/m2"]);
    assert_eq!(body["object"], "list");

    let recorded = sim.requests();
    assert_eq!(recorded.len(), 4, "refused requests are recorded too");
    assert_eq!(recorded[0].provider, "nope");
    assert_eq!(recorded[0].step, None);
    assert_eq!(recorded[2].body, json!("not json"));
    assert_eq!(recorded[3].method, "GET");
    assert_eq!(recorded[3].model, None);

    // A wrong method gets 405 and the `Allow` header names the right one.
    let response = client()
        .get(format!("{}/chat/completions", sim.base_url("a")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    let response = client()
        .post(format!("{}/models", sim.base_url("a")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "GET");
}

#[tokio::test]
async fn the_record_keeps_requests_in_order_with_their_headers() {
    let sim = sim("providers: {aki-io: {sequence: [\"503\", 200]}, anthropic: {}}").await;
    let client = client();
    client
        .post(format!("{}/chat/completions", sim.base_url("aki-io")))
        .bearer_auth("provider-key")
        .header("x-request-id", "req-1")
        .json_body(&json!({"model": "qwen/q", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    client
        .post(format!("{}/messages", sim.base_url("anthropic")))
        .header("x-api-key", "anthropic-key")
        .header("anthropic-version", "2023-06-01")
        .json_body(&json!({"model": "claude-x", "max_tokens": 5, "stream": true}))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let recorded = sim.requests();
    assert_eq!(recorded.len(), 2);
    let first = &recorded[0];
    assert_eq!(first.provider, "aki-io");
    assert_eq!(first.model.as_deref(), Some("qwen/q"));
    assert_eq!(first.path, "/aki-io/v1/chat/completions");
    assert_eq!(first.method, "POST");
    assert!(!first.stream);
    assert_eq!(first.body["messages"][0]["content"], "hi");
    assert_eq!(first.header("Authorization"), Some("Bearer provider-key"));
    assert_eq!(first.header("x-request-id"), Some("req-1"));
    assert_eq!(first.header("x-api-key"), None);
    assert_eq!(first.step.as_deref(), Some("503"));
    let second = &recorded[1];
    assert!(second.stream);
    assert_eq!(second.header("x-api-key"), Some("anthropic-key"));
    assert_eq!(second.header("authorization"), None);
    assert_eq!(second.step.as_deref(), Some("200"));
    assert!(second.at_ms >= first.at_ms);
}

#[tokio::test]
async fn the_sim_endpoints_read_clear_and_replace() {
    let sim = sim("providers: {a: {sequence: [\"503\", \"200\"]}}").await;
    let client = client();
    let base = format!("http://{}", sim.addr());
    post(&sim, "a", CHAT, json!({"model": "m"})).await;

    let record = json_of(
        client
            .get(format!("{base}/_sim/requests"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let record = record.as_array().unwrap();
    assert_eq!(record.len(), 1);
    assert_eq!(record[0]["provider"], "a");
    assert_eq!(record[0]["model"], "m");
    assert_eq!(record[0]["step"], "503");
    assert_eq!(record[0]["stream"], false);
    assert!(record[0]["at_ms"].is_u64());
    assert!(record[0]["headers"].is_object());

    // Paths that name no provider are not recorded.
    for path in ["/", "/_sim", "//x", "/_foo/v1/chat/completions", "/_simx"] {
        let answer = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(answer.status(), 404, "{path}");
    }
    assert_eq!(sim.requests().len(), 1);

    let cleared = client
        .delete(format!("{base}/_sim/requests"))
        .send()
        .await
        .unwrap();
    assert_eq!(cleared.status(), 204);
    assert!(
        sim.requests().is_empty(),
        "the control endpoints are not recorded"
    );
    assert_eq!(
        post(&sim, "a", CHAT, json!({"model": "m"})).await.status(),
        503,
        "sequences start over"
    );

    let replaced = client
        .post(format!("{base}/_sim/scenario"))
        .body("providers:\n  b: {sequence: [\"429\"]}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(replaced.status(), 204);
    assert_eq!(
        post(&sim, "b", CHAT, json!({"model": "m"})).await.status(),
        429
    );
    assert_eq!(
        post(&sim, "a", CHAT, json!({"model": "m"})).await.status(),
        404
    );

    let refused = client
        .post(format!("{base}/_sim/scenario"))
        .body("providers:\n  b: {sequence: [\"429 retry_after=soon\"]}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(
        json_of(refused).await["error"]["message"],
        "scenario:2:35: `soon` is not a duration; write it like `250ms`, `2s`, `5m`, `1h` or `1d`"
    );
    assert_eq!(
        post(&sim, "b", CHAT, json!({"model": "m"})).await.status(),
        429,
        "a bad scenario changes nothing"
    );
    let not_text = client
        .post(format!("{base}/_sim/scenario"))
        .body(b"\xff\xfeproviders: {}".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(not_text.status(), 400);
    assert_eq!(
        json_of(not_text).await["error"]["message"],
        "scenario: it is not UTF-8 text"
    );

    let wrong = client
        .get(format!("{base}/_sim/scenario"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 405);
    assert_eq!(wrong.headers()["allow"], "POST");
}

// ----------------------------------------------------------- the scenarios

#[test]
fn scenario_errors_name_file_line_and_column() {
    let error = |text: &str| Scenario::parse(text, "bad.yaml").unwrap_err().to_string();
    assert_eq!(
        error("providers:\n  a:\n    sequence: [\"503 retry_after=2s\", \"reste\"]\n"),
        "bad.yaml:3:39: `reste` is not a step word; did you mean `reset`?"
    );
    assert_eq!(
        error("providers:\n  a:\n    models:\n      m: {sequense: [200]}\n"),
        "bad.yaml:4:11: `sequense` is not a field here; did you mean `sequence`?"
    );
    assert_eq!(
        error("provider:\n  a: {}\n"),
        "bad.yaml:1:1: `provider` is not a field here; did you mean `providers`?"
    );
    assert_eq!(
        error("providers:\n  a: {sequence: []}\n"),
        "bad.yaml:2:17: a `sequence` needs at least one step; leave it out to answer `200` every time"
    );
    assert!(error("providers:\n  a: {chunks: many}\n").starts_with("bad.yaml:2:"));
    assert!(error("providers: [a, b]\n").starts_with("bad.yaml:1:"));
}

#[test]
fn the_shipped_scenarios_parse_and_cover_the_catalogs() {
    let read = |name: &str| {
        let path = format!("{PACKAGE_ROOT}/scenarios/{name}");
        let text = std::fs::read_to_string(&path).unwrap();
        Scenario::parse(&text, &path).unwrap_or_else(|error| panic!("{error}"))
    };
    let healthy = read("healthy.yaml");
    let demo = read("demo.yaml");

    // Every provider of every shipped catalog, by its base_url path segment.
    let mut segments = BTreeSet::new();
    let mut noirdoc = BTreeSet::new();
    for entry in std::fs::read_dir(format!("{PACKAGE_ROOT}/policies")).unwrap() {
        let directory = entry.unwrap().path();
        let is_noirdoc = directory.file_name() == Some(std::ffi::OsStr::new("noirdoc"));
        let Ok(text) = std::fs::read_to_string(directory.join("catalog.yaml")) else {
            continue;
        };
        for line in text.lines() {
            if let Some(url) = line.trim().strip_prefix("base_url: http://127.0.0.1:9100/") {
                let segment = url.split('/').next().unwrap().to_string();
                if is_noirdoc {
                    noirdoc.insert(segment.clone());
                }
                segments.insert(segment);
            }
        }
    }
    assert!(segments.len() >= 20, "{segments:?}");
    let healthy_providers: BTreeSet<String> = healthy.providers().map(str::to_string).collect();
    assert_eq!(healthy_providers, segments);
    let demo_providers: BTreeSet<String> = demo.providers().map(str::to_string).collect();
    assert_eq!(demo_providers, noirdoc);
}

#[test]
fn the_scenarios_in_the_docs_parse() {
    let docs = std::fs::read_to_string(format!("{PACKAGE_ROOT}/docs/sim.md")).unwrap();
    let blocks: Vec<&str> = docs
        .split("```yaml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect();
    assert!(!blocks.is_empty());
    for block in blocks {
        Scenario::parse(block, "docs/sim.md").unwrap_or_else(|error| panic!("{error}"));
    }
}

#[tokio::test]
async fn the_demo_scenario_makes_aki_io_fail_every_other_request() {
    let text = std::fs::read_to_string(format!("{PACKAGE_ROOT}/scenarios/demo.yaml")).unwrap();
    let scenario = Scenario::parse(&text, "demo.yaml").unwrap();
    let sim = start("127.0.0.1:0".parse().unwrap(), scenario)
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = post(&sim, "aki-io", CHAT, json!({"model": "qwen/qwen3.8-27b"})).await;
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [503, 200, 503, 200]);
    let other = post(
        &sim,
        "ionos",
        CHAT,
        json!({"model": "Qwen3.8-27B-Instruct"}),
    )
    .await;
    assert_eq!(
        json_of(other).await["choices"][0]["message"]["content"],
        "hello from ionos"
    );
}

// ---------------------------------------------------------------- shutdown

#[tokio::test]
async fn shutdown_ends_hanging_requests_and_stops_listening() {
    let sim = sim("providers: {a: {sequence: [no_answer]}, b: {sequence: [stall_after=1]}}").await;
    let client = client();
    let url = sim.base_url("a");
    let hanging = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .post(format!("{url}/chat/completions"))
                .json_body(&json!({"model": "m"}))
                .send()
                .await
        }
    });
    let mut stalled = post(&sim, "b", CHAT, json!({"model": "m", "stream": true})).await;
    stalled.chunk().await.unwrap().unwrap();
    while sim.requests().len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let addr = sim.addr();
    sim.shutdown().await;
    assert!(
        hanging.await.unwrap().is_err(),
        "the unanswered request ends with an error"
    );
    let rest = stalled.chunk().await;
    assert!(
        rest.is_err(),
        "the stalled stream breaks instead of ending cleanly: {rest:?}"
    );
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn dropping_the_handle_stops_the_sim() {
    let sim = sim("providers: {a: {}}").await;
    let addr = sim.addr();
    drop(sim);
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        refused,
        "the listener closes soon after the handle is dropped"
    );
}
