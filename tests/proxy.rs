//! The proxy over real loopback HTTP: the simulated providers
//! (`switchyard::sim`) and the proxy run in the test's runtime, each test
//! writes a small policy with its catalog and tenants into a temporary
//! directory, and reqwest plays the client. Every test states one rule of
//! docs/language.md (failover, health, capacity, timeouts, stream, headers,
//! errors) or of the proxy's HTTP surface, and checks what the client got
//! and what the providers saw.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{Files, Reply, Stack, closed_port, until};
use reqwest::RequestBuilder;
use serde_json::{Value as Json, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::proxy::{Limits, Options};
use switchyard::sim::RecordedRequest;
use switchyard::state::{Clock, ManualClock, SystemClock};

type TestResult = Result<(), Box<dyn std::error::Error>>;

// ------------------------------------------------------------------ harness

/// The caller's API key (its SHA-256 is in [`TENANTS`]).
const KEY: &str = "sk-test-acme";
/// A second key of the same tenant, limited to model `m` in
/// [`LIMITED_TENANTS`].
const LIMITED_KEY: &str = "sk-test-limited";

const TENANTS: &str = "\
tenants:
  - id: acme
    keys:
      - id: acme-dev
        # the key: sk-test-acme
        sha256: 24180b61f1fb779a0c8b55727cfac504753209445bfc449ebc08b2a18f51a2bb
";

const LIMITED_TENANTS: &str = "\
attributes:
  key:
    allowed_models: list<model>
tenants:
  - id: acme
    keys:
      - id: acme-dev
        # the key: sk-test-acme
        sha256: 24180b61f1fb779a0c8b55727cfac504753209445bfc449ebc08b2a18f51a2bb
      - id: acme-limited
        # the key: sk-test-limited
        sha256: 716d9331d7ad666bd3c016548a20f4af914f281255463802599abfd141e4609a
        attributes: {allowed_models: [m]}
";

/// A policy: the header, the models section and two errors every test
/// shares, then the test's own sections and errors.
fn policy(sections: &str, errors: &str) -> String {
    format!(
        r#"policy proxytest {{
  catalog "catalog.yaml"
  tenants "tenants.yaml"
}}

models {{
  credentials each else no_route
  unknown error unknown_model
}}
{sections}
errors {{
  no_route = 503, "no provider can serve this model"
  unknown_model = 404, "there is no such model"
{errors}
}}
"#
    )
}

/// The environment variable of a provider's credential.
fn key_variable(provider: &str) -> String {
    format!("{}_KEY", provider.to_uppercase().replace('-', "_"))
}

/// The secret the proxy sends to a provider (see [`secrets_for`]).
fn secret_of(provider: &str) -> String {
    format!("upstream-secret-{}", key_variable(provider))
}

/// A catalog provider at the sim (`{sim}` is replaced by its address) with
/// one credential; `extra` adds lines such as `capacity: {concurrent: 1}`.
fn provider(id: &str, format: &str, extra: &str) -> String {
    let variable = key_variable(id);
    let mut entry = format!(
        "  - id: {id}\n    format: {format}\n    base_url: http://{{sim}}/{id}/v1\n    \
         credentials:\n      - {{id: {id}-key, key: \"${{{variable}}}\"}}\n"
    );
    if !extra.is_empty() {
        entry.push_str(&format!("    {extra}\n"));
    }
    entry
}

/// A chat model routed to these providers, in this order.
fn model(id: &str, providers: &[&str]) -> String {
    let mut entry = format!("  - id: {id}\n    kind: chat\n    routes:\n");
    for provider in providers {
        entry.push_str(&format!("      - {{provider: {provider}}}\n"));
    }
    entry
}

/// A chat model routed to one provider under another name upstream.
fn model_upstream(id: &str, provider: &str, upstream: &str) -> String {
    format!(
        "  - id: {id}\n    kind: chat\n    routes:\n      \
         - {{provider: {provider}, upstream: \"{upstream}\"}}\n"
    )
}

fn catalog(providers: &[String], models: &[String]) -> String {
    format!(
        "providers:\n{}models:\n{}",
        providers.concat(),
        models.concat()
    )
}

/// Two OpenAI-format providers `a` and `b` serving model `m`, `a` first.
fn a_then_b() -> String {
    catalog(
        &[provider("a", "openai", ""), provider("b", "openai", "")],
        &[model("m", &["a", "b"])],
    )
}

/// A secret for every `${NAME}` in the catalog, except names starting with
/// `UNSET`, which stay unset (their credentials are not usable).
fn secrets_for(catalog: &str) -> Vec<(String, String)> {
    let mut secrets = Vec::new();
    for piece in catalog.split("${").skip(1) {
        if let Some((name, _)) = piece.split_once('}')
            && !name.starts_with("UNSET")
        {
            secrets.push((name.to_string(), format!("upstream-secret-{name}")));
        }
    }
    secrets
}

/// What a test's proxy is made of.
struct Setup {
    policy: String,
    catalog: String,
    tenants: String,
    options: Options,
    clock: Arc<dyn Clock>,
}

impl Setup {
    fn new(sections: &str, errors: &str, catalog: String) -> Setup {
        Setup {
            policy: policy(sections, errors),
            catalog,
            tenants: TENANTS.to_string(),
            options: Options::default(),
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// The proxy's time (pauses, waits, timeouts) on `clock`, for example a
    /// `ManualClock` the test moves.
    fn clock(mut self, clock: Arc<dyn Clock>) -> Setup {
        self.clock = clock;
        self
    }

    fn tenants(mut self, tenants: &str) -> Setup {
        self.tenants = tenants.to_string();
        self
    }

    fn max_body_bytes(mut self, bytes: usize) -> Setup {
        self.options.limits.max_body_bytes = bytes;
        self
    }

    fn body_idle_timeout(mut self, timeout: Duration) -> Setup {
        self.options.limits.body_idle_timeout = timeout;
        self
    }

    fn body_timeout(mut self, timeout: Duration) -> Setup {
        self.options.limits.body_timeout = timeout;
        self
    }

    /// Writes the files, checks and compiles the policy (the test fails
    /// with its diagnostics if it does not check) and serves it on a free
    /// port, in front of simulated providers that behave as `scenario`
    /// says.
    async fn start(self, scenario: &str) -> Gateway {
        let secrets = secrets_for(&self.catalog);
        let secrets: Vec<(&str, &str)> = secrets
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let files = Files {
            policy: &self.policy,
            catalog: &self.catalog,
            tenants: &self.tenants,
            scenario,
            secrets: &secrets,
        };
        let stack = Stack::start_with_clock("proxy", &files, self.options, self.clock).await;
        let api = Api {
            client: client(),
            url: stack.url(""),
        };
        Gateway { stack, api }
    }
}

/// A client that never goes through a proxy from the environment, with a
/// time limit so that a hanging proxy fails the test instead of blocking it.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// A running proxy in front of its simulated providers, and how to reach
/// it as the test's tenant.
struct Gateway {
    stack: Stack,
    api: Api,
}

impl std::ops::Deref for Gateway {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

impl Gateway {
    async fn stop(self) {
        self.stack.stop().await;
    }
}

/// How to reach a proxy (cheap to clone into spawned tasks).
#[derive(Clone)]
struct Api {
    client: reqwest::Client,
    url: String,
}

impl Api {
    fn post(&self, path: &str, body: &Json) -> RequestBuilder {
        self.post_text(path, body.to_string())
    }

    /// A POST of a body as written, JSON or not.
    fn post_text(&self, path: &str, text: String) -> RequestBuilder {
        self.client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(text)
    }

    /// `POST /v1/chat/completions` with the key as a bearer token.
    fn chat_request(&self, body: &Json) -> RequestBuilder {
        self.post("/v1/chat/completions", body).bearer_auth(KEY)
    }

    /// [`Api::chat_request`] with the body sent in chunks of `size` bytes,
    /// without a length.
    fn chat_in_chunks(&self, body: &Json, size: usize) -> RequestBuilder {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body
            .to_string()
            .as_bytes()
            .chunks(size)
            .map(|chunk| Ok(chunk.to_vec()))
            .collect();
        self.post("/v1/chat/completions", &Json::Null)
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                chunks,
            )))
            .bearer_auth(KEY)
    }

    /// [`Api::chat_request`] of a body as written.
    fn chat_text(&self, text: &str) -> RequestBuilder {
        self.post_text("/v1/chat/completions", text.to_string())
            .bearer_auth(KEY)
    }

    /// `POST /v1/messages` with the key in `x-api-key`, as Anthropic SDKs send it.
    fn messages_request(&self, body: &Json) -> RequestBuilder {
        self.post("/v1/messages", body)
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
    }

    async fn chat(&self, body: &Json) -> Reply {
        Reply::of(self.chat_request(body)).await
    }

    async fn messages(&self, body: &Json) -> Reply {
        Reply::of(self.messages_request(body)).await
    }

    async fn get(&self, path: &str) -> Reply {
        Reply::of(
            self.client
                .get(format!("{}{path}", self.url))
                .bearer_auth(KEY),
        )
        .await
    }
}

/// The simple policy over one OpenAI-format provider `a` serving model
/// `m`, which answers every request.
async fn simple_gateway() -> Gateway {
    simple_gateway_with("providers:\n  a: {}\n").await
}

/// The same, with the simulated provider as `scenario` says.
async fn simple_gateway_with(scenario: &str) -> Gateway {
    simple_setup().start(scenario).await
}

/// The simple gateway, taking bodies of at most 1 KiB.
async fn gateway_taking_1_kib() -> Gateway {
    simple_setup()
        .max_body_bytes(1024)
        .start("providers:\n  a: {}\n")
        .await
}

fn simple_setup() -> Setup {
    Setup::new(
        SIMPLE,
        SIMPLE_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
}

fn chat_body(stream: bool) -> Json {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    })
}

fn messages_body(stream: bool) -> Json {
    json!({
        "model": "claude",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    })
}

/// The server-sent events of `text`, each without its blank line.
fn sse_events(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .collect()
}

/// The deltas of an OpenAI chat stream, joined.
fn chat_deltas(text: &str) -> String {
    sse_events(text)
        .iter()
        .filter_map(|event| event_json(event))
        .filter_map(|data| {
            data.pointer("/choices/0/delta/content")
                .and_then(Json::as_str)
                .map(str::to_string)
        })
        .collect()
}

/// The `data:` of an event, parsed, when it is JSON.
fn event_json(event: &str) -> Option<Json> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    serde_json::from_str(&data.join("\n")).ok()
}

/// The `event:` name of an event.
fn event_name(event: &str) -> Option<&str> {
    event
        .lines()
        .find_map(|line| line.strip_prefix("event:"))
        .map(str::trim)
}

/// The providers the sim saw, in the order the requests arrived.
fn providers_seen(requests: &[RecordedRequest]) -> Vec<&str> {
    requests
        .iter()
        .map(|request| request.provider.as_str())
        .collect()
}

/// Milliseconds between the arrival of two recorded requests.
fn gap_ms(requests: &[RecordedRequest], earlier: usize, later: usize) -> u64 {
    requests[later].at_ms - requests[earlier].at_ms
}

/// Waits (polling `/metrics`) until the counter `name` reaches `value`.
async fn wait_for_metric(api: &Api, name: &str, value: usize) {
    let url = format!("{}/metrics", api.url);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = Reply::of(api.client.get(&url)).await;
        let reached = metrics.text.lines().any(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.trim().parse::<f64>().ok())
                .is_some_and(|count| count >= value as f64)
        });
        if reached {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {value}:\n{}",
            metrics.text
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The OpenAI error object of a reply: (code, type, message).
fn openai_error(reply: &Reply) -> (String, String, String) {
    let json = &reply.json;
    let field = |name: &str| {
        json.pointer(&format!("/error/{name}"))
            .and_then(Json::as_str)
            .unwrap_or_else(|| panic!("no error.{name} in {json}"))
            .to_string()
    };
    (field("code"), field("type"), field("message"))
}

/// The Anthropic error object of a reply: (type, message).
fn anthropic_error(reply: &Reply) -> (String, String) {
    let json = &reply.json;
    assert_eq!(
        json["type"], "error",
        "not an Anthropic error object: {json}"
    );
    let field = |name: &str| {
        json.pointer(&format!("/error/{name}"))
            .and_then(Json::as_str)
            .unwrap_or_else(|| panic!("no error.{name} in {json}"))
            .to_string()
    };
    (field("type"), field("message"))
}

// ---------------------------------------------------- 1. failover by outcome

/// A short timeout of this kind for provider `a`, the one under test, and a
/// long one for the others, so that a loaded machine cannot make them time
/// out.
fn short_timeout_for_a(kind: &str) -> String {
    format!("timeouts {{\n  {kind} if provider.id == \"a\" then 500ms else 10s\n}}\n")
}

/// A policy in which only `outcome` fails over; any other outcome stops with
/// `other_outcome`, so an attempt classified wrongly fails the test. A
/// timeout outcome gets its timeout, short; every other timeout keeps its
/// long default.
fn only_fails_over_on(outcome: &str) -> String {
    let timeouts = match outcome {
        "timeout" => short_timeout_for_a("headers"),
        "first_token_timeout" => short_timeout_for_a("first_token"),
        _ => String::new(),
    };
    format!(
        r#"{timeouts}
failover {{
  attempts 2
  on {outcome} => next, error upstream_failed
  on any => stop, error other_outcome
}}
"#
    )
}

const OUTCOME_ERRORS: &str = r#"
  upstream_failed = 502, "every provider failed"
  other_outcome = 500, "the attempt ended with another outcome"
"#;

/// Runs one request against providers `a` (answering `a_step`) and `b`
/// (answering 200) under `policy`, with the catalog changed by `edit`.
async fn failover_case(
    policy: &str,
    errors: &str,
    a_step: &str,
    stream: bool,
    edit: impl FnOnce(String) -> String,
) -> (Reply, Vec<RecordedRequest>) {
    let scenario = format!("providers:\n  a: {{sequence: [\"{a_step}\"]}}\n  b: {{}}\n");
    let gateway = Setup::new(policy, errors, edit(a_then_b()))
        .start(&scenario)
        .await;
    let reply = gateway.api.chat(&chat_body(stream)).await;
    let requests = gateway.sim.requests();
    gateway.stop().await;
    (reply, requests)
}

/// `a`'s attempt ends with `outcome`, the policy's rule for it fails over,
/// and `b` answers the client.
async fn outcome_case(
    outcome: &str,
    a_step: &str,
    stream: bool,
    edit: impl FnOnce(String) -> String,
) -> (Reply, Vec<RecordedRequest>) {
    let (reply, requests) = failover_case(
        &only_fails_over_on(outcome),
        OUTCOME_ERRORS,
        a_step,
        stream,
        edit,
    )
    .await;
    assert_b_answered(&reply, stream);
    (reply, requests)
}

/// `b` answered the client, and nothing of `a` reached it.
fn assert_b_answered(reply: &Reply, stream: bool) {
    assert_eq!(reply.status, 200, "{}", reply.text);
    if stream {
        assert_eq!(reply.streamed_text(), "hello from b", "{}", reply.text);
        assert_eq!(
            sse_events(&reply.text).last(),
            Some(&"data: [DONE]"),
            "{}",
            reply.text
        );
    } else {
        assert_eq!(reply.chat_text(), "hello from b");
    }
    assert!(!reply.text.contains("from a"), "{}", reply.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_5xx_status_tries_the_next_provider() -> TestResult {
    let (_, requests) = outcome_case("5xx", "503", false, |c| c).await;
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_connect_error_tries_the_next_provider() -> TestResult {
    let closed = format!("http://127.0.0.1:{}/a/v1", closed_port());
    let (_, requests) = outcome_case("connect_error", "200", false, |c| {
        c.replace("http://{sim}/a/v1", &closed)
    })
    .await;
    // `a` lives on a port nobody listens on: the sim only ever sees `b`.
    assert_eq!(providers_seen(&requests), ["b"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_reset_tries_the_next_provider() -> TestResult {
    let (_, requests) = outcome_case("reset", "reset", false, |c| c).await;
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_headers_timeout_tries_the_next_provider() -> TestResult {
    let (reply, requests) = outcome_case("timeout", "no_answer", false, |c| c).await;
    // On a machine loaded enough, the proxy gives up on `a` before the sim
    // has read its request; either way `b` answered after `a`'s timeout.
    let seen = providers_seen(&requests);
    assert!(seen == ["a", "b"] || seen == ["b"], "{seen:?}");
    // `timeouts { headers 500ms }` for `a`: it had that long.
    assert!(
        reply.elapsed >= Duration::from_millis(500),
        "{:?}",
        reply.elapsed
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_first_token_timeout_tries_the_next_provider() -> TestResult {
    // `a` sends its headers at once, its first event only after 5 s.
    let (reply, requests) =
        outcome_case("first_token_timeout", "first_token=5s", true, |c| c).await;
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    // `timeouts { first_token 500ms }` for `a`: it had that long for its
    // first event.
    assert!(
        reply.elapsed >= Duration::from_millis(500),
        "{:?}",
        reply.elapsed
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_malformed_answer_tries_the_next_provider() -> TestResult {
    // A 200 whose JSON body is cut in half.
    let (_, requests) = outcome_case("malformed", "malformed", false, |c| c).await;
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_http_does_not_define_is_malformed_and_fails_over() -> TestResult {
    // hyper reads any three digits as a status; no `on` rule names 600.
    let a = answering_provider(
        "HTTP/1.1 600 Beyond\r\ncontent-type: application/json\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n{}",
        &[],
        Then::Cut,
    )
    .await;
    let gateway = hand_written_a_then_b(&a, &only_fails_over_on("malformed"), OUTCOME_ERRORS).await;
    // Another outcome would meet `on any` and its 500.
    let reply = gateway.api.chat(&json!({"model": "m"})).await;
    assert_b_answered(&reply, false);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_on_a_malformed_first_stream_event_tries_the_next_provider() -> TestResult {
    let (_, requests) = outcome_case("malformed", "malformed_chunk=1", true, |c| c).await;
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    Ok(())
}

// --------------------------------------------------- 2. stop and passthrough

const STOP: &str = r#"
failover {
  attempts 2
  on 429 => stop, error slow_down
  on 503 => stop, error overloaded
  on 4xx => stop, error passthrough
  on any => stop, error upstream_failed
}
"#;

const STOP_ERRORS: &str = r#"
  slow_down = 429, "slow down, please", retry_after 7s
  overloaded = 503, "the provider is overloaded", type "overloaded_error", should_retry false
  upstream_failed = 502, "every provider failed"
"#;

/// OpenAI providers `a`, `b` for `m`; Anthropic providers `anth`, `anth2`
/// for `claude`. The first of each answers `steps` in turn.
async fn stop_case(steps: &str) -> Gateway {
    let catalog = catalog(
        &[
            provider("a", "openai", ""),
            provider("b", "openai", ""),
            provider("anth", "anthropic", ""),
            provider("anth2", "anthropic", ""),
        ],
        &[model("m", &["a", "b"]), model("claude", &["anth", "anth2"])],
    );
    let scenario = format!(
        "providers:\n  a: {{sequence: {steps}}}\n  b: {{}}\n  anth: {{sequence: {steps}}}\n  anth2: {{}}\n"
    );
    Setup::new(STOP, STOP_ERRORS, catalog)
        .start(&scenario)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_rule_answers_with_the_policy_error_in_the_openai_format() -> TestResult {
    let gateway = stop_case(r#"["429", "503"]"#).await;
    let sim = &gateway.sim;

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 429, "{}", reply.text);
    let (code, kind, message) = openai_error(&reply);
    assert_eq!(code, "slow_down");
    assert_eq!(kind, "rate_limit_error", "the default type of a 429");
    assert_eq!(message, "slow down, please");
    assert_eq!(reply.header("retry-after"), Some("7"));
    assert_eq!(
        reply.header("x-should-retry"),
        None,
        "the error leaves it to the client"
    );

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    let (code, kind, message) = openai_error(&reply);
    assert_eq!(
        (code.as_str(), kind.as_str(), message.as_str()),
        (
            "overloaded",
            "overloaded_error",
            "the provider is overloaded"
        )
    );
    assert_eq!(reply.header("retry-after"), None, "the error declares none");
    assert_eq!(reply.header("x-should-retry"), Some("false"));

    // `stop`: `b` is never asked.
    assert_eq!(providers_seen(&sim.requests()), ["a", "a"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_rule_answers_with_the_policy_error_in_the_anthropic_format() -> TestResult {
    let gateway = stop_case(r#"["429", "503"]"#).await;
    let sim = &gateway.sim;

    let reply = gateway.api.messages(&messages_body(false)).await;
    assert_eq!(reply.status, 429, "{}", reply.text);
    assert_eq!(
        anthropic_error(&reply),
        (
            String::from("rate_limit_error"),
            String::from("slow down, please")
        )
    );
    assert_eq!(reply.header("retry-after"), Some("7"));

    let reply = gateway.api.messages(&messages_body(false)).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(
        anthropic_error(&reply),
        (
            String::from("overloaded_error"),
            String::from("the provider is overloaded")
        )
    );
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(reply.header("x-should-retry"), Some("false"));

    assert_eq!(providers_seen(&sim.requests()), ["anth", "anth"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_passthrough_returns_the_providers_own_status_and_body() -> TestResult {
    let gateway = stop_case(
        r#"["400 code=bad_thing message=\"no such parameter\"", "409 retry_after=2s code=conflict message=\"try later\""]"#,
    )
    .await;
    let sim = &gateway.sim;

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(
        reply.json,
        json!({"error": {"message": "no such parameter", "type": "invalid_request_error", "param": null, "code": "bad_thing"}})
    );
    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(openai_error(&reply).0, "conflict");
    assert_eq!(reply.header("retry-after"), Some("2"), "the provider's own");

    // The Anthropic provider's own error object, as it sent it.
    let reply = gateway.api.messages(&messages_body(false)).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(
        reply.json,
        json!({"type": "error", "error": {"type": "bad_thing", "message": "no such parameter"}})
    );

    assert_eq!(providers_seen(&sim.requests()), ["a", "a", "anth"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_passthrough_keeps_the_providers_advice_on_retrying() -> TestResult {
    let a = answering_provider(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 2\r\nretry-after-ms: 1500\r\nx-should-retry: false\r\n\
         x-other: dropped\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
        &[],
        Then::Cut,
    )
    .await;
    let gateway = hand_written_a_then_b(
        &a,
        "failover {\n  attempts 1\n  on 5xx => stop, error passthrough\n  on any => stop, error upstream_failed\n}\n",
        SIMPLE_ERRORS,
    )
    .await;
    let reply = gateway.api.chat(&json!({"model": "m"})).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(reply.header("retry-after"), Some("2"));
    assert_eq!(reply.header("retry-after-ms"), Some("1500"));
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    assert_eq!(reply.header("x-other"), None);
    gateway.stop().await;
    Ok(())
}

/// `keep` reads what the previous attempt's failure said: after a
/// provider's context error the rest of that model's candidates are passed
/// over for the larger model (a context window fallback), while any other
/// failure goes on in plan order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_reads_the_previous_failure_to_pass_over_its_model() -> TestResult {
    let policy = r#"
failover {
  attempts 3
  keep coalesce(upstream.error.code, "") != "context_length_exceeded"
    or model.id != prev.model.id
  on 400 when coalesce(upstream.error.code, "") == "context_length_exceeded"
    => next, error too_long
  on 5xx => next, error upstream_failed
  on any => stop, error upstream_failed
}
"#;
    let errors = "  too_long = 400, \"the conversation is too long for every model\"\n  upstream_failed = 502, \"every provider failed\"";
    let catalog = format!(
        "{}aliases:\n  family: [m, big]\n",
        catalog(
            &[provider("a", "openai", ""), provider("b", "openai", "")],
            &[model("m", &["a", "b"]), model("big", &["b"])],
        )
    );
    let body = json!({"model": "family", "messages": [{"role": "user", "content": "hi"}]});
    let gateway = Setup::new(policy, errors, catalog)
        .start(
            "providers:\n  a:\n    models:\n      m: {sequence: [\"400 code=context_length_exceeded\", \"500\"]}\n  b: {}\n",
        )
        .await;
    let served_model = |requests: &[RecordedRequest]| -> Vec<String> {
        requests
            .iter()
            .map(|r| format!("{}@{}", r.provider, r.body["model"].as_str().unwrap_or("?")))
            .collect()
    };

    // The context error at a: b's route of the same model is passed over.
    let reply = gateway.api.chat(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(served_model(&gateway.sim.requests()), ["a@m", "b@big"]);

    // A 500 at a: on to b's route of the same model, as the plan orders.
    let reply = gateway.api.chat(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(served_model(&gateway.sim.requests()[2..]), ["a@m", "b@m"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_without_a_standard_name_still_has_a_reason_phrase() -> TestResult {
    use tokio::io::AsyncReadExt;
    let gateway = Setup::new(
        "failover {\n  attempts 1\n  on 5xx => stop, error passthrough\n  on any => stop, error upstream_failed\n}\n",
        SIMPLE_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [\"529\"]}\n")
    .await;
    let body = chat_body(false).to_string();
    let mut socket = send_raw_chat(
        &gateway.api,
        &format!(
            "Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer)).await??;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 529 Overloaded\r\n"),
        "{answer}"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_status_computed_outside_the_error_statuses_answers_500() -> TestResult {
    // `check` refuses such constants; computed at run time, 503 + 0.5 and
    // 503 + 100 are no error status either.
    for (status, expected) in [
        ("coalesce(upstream.status, 502)", 503),
        ("coalesce(upstream.status, 502) + 0.5", 500),
        ("coalesce(upstream.status, 502) + 100", 500),
    ] {
        let gateway = Setup::new(
            "failover {\n  attempts 1\n  on any => stop, error computed\n}\n",
            &format!("  computed = {status}, \"the provider failed\""),
            catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
        )
        .start("providers:\n  a: {sequence: [\"503\"]}\n")
        .await;
        let reply = gateway.api.chat(&chat_body(false)).await;
        assert_eq!(reply.status, expected, "{status}: {}", reply.text);
        assert_eq!(openai_error(&reply).0, "computed", "{}", reply.text);
        gateway.stop().await;
    }
    Ok(())
}

// ------------------------------------------------------------- 3. retries

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_and_bounded_by_the_policy() -> TestResult {
    let gateway = Setup::new(
        r#"
failover {
  attempts 1
  on 429 when retries < 1 => retry after clamp(coalesce(upstream.retry_after, 1s), 0s, 300ms), error upstream_failed
  on 5xx when retries < 1 => retry, error upstream_failed
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog(
            &[provider("a", "openai", "")],
            &[model("limited", &["a"]), model("flaky", &["a"])],
        ),
    )
    .start("providers:\n  a:\n    models:\n      \
         limited: {sequence: [\"429 retry_after=5s\", \"200\"]}\n      \
         flaky: {sequence: [\"503\", \"200\"]}\n",)
    .await;
    let sim = &gateway.sim;

    let reply = gateway
        .api
        .chat(&json!({"model": "limited", "messages": []}))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let requests = sim.requests();
    assert_eq!(providers_seen(&requests), ["a", "a"]);
    // The provider asked for 5 s; the policy clamps the wait to 300 ms.
    let waited = gap_ms(&requests, 0, 1);
    assert!(
        waited >= 300,
        "retried after {waited} ms, before the 300 ms the policy says"
    );
    assert!(
        waited < 2_500,
        "retried after {waited} ms: the upstream 5 s was not bounded"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_without_after_backs_off() -> TestResult {
    let gateway = Setup::new(
        r#"
failover {
  attempts 1
  on 5xx when retries < 1 => retry, error upstream_failed
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [\"503\", \"200\"]}\n")
    .await;
    let sim = &gateway.sim;

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let requests = sim.requests();
    assert_eq!(providers_seen(&requests), ["a", "a"]);
    // The default backoff starts at 250 ms with jitter: never a tight loop.
    let waited = gap_ms(&requests, 0, 1);
    assert!(waited >= 100, "retried after only {waited} ms");
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_pending_retry() -> TestResult {
    // On a manual clock: the retry's time comes only once the test moves
    // it, after the proxy has dropped the request, however slow the
    // machine is to notice the client leaving.
    let clock = Arc::new(ManualClock::default());
    let gateway = Setup::new(
        r#"
failover {
  attempts 1
  on 5xx when retries < 1 => retry after 600ms, error upstream_failed
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .clock(clock.clone())
    .start("providers:\n  a: {sequence: [\"503\", \"200\"]}\n")
    .await;
    let sim = &gateway.sim;

    // The client gives up while the proxy waits to retry.
    let api = gateway.api.clone();
    let client = tokio::spawn(async move { api.chat(&chat_body(false)).await });
    until("the proxy waits to retry", || {
        sim.requests().len() == 1 && clock.sleeping_until().contains(&600)
    })
    .await;
    client.abort();
    assert!(client.await.is_err_and(|error| error.is_cancelled()));
    let metrics_url = format!("{}/metrics", gateway.api.url);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Reply::of(gateway.api.client.get(&metrics_url))
        .await
        .text
        .lines()
        .any(|line| line == "switchyard_in_flight 0")
    {
        assert!(Instant::now() < deadline, "the request stayed in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    clock.advance(600);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        providers_seen(&sim.requests()),
        ["a"],
        "the retry went upstream for a client that had left"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_limit_ending_a_streams_wait_for_its_first_event_is_a_timeout() -> TestResult {
    // Headers at once, then nothing: the attempt's 10 s end the wait before
    // the first event's 60 s (counted from the headers) would.
    let clock = Arc::new(ManualClock::default());
    let gateway = Setup::new(
        r#"
timeouts {
  attempt 10s
}
failover {
  attempts 1
  on timeout => stop, error timed_out
  on any => stop, error other_outcome
}
"#,
        r#"
  timed_out = 504, "the attempt ran out of time"
  other_outcome = 500, "the attempt ended with another outcome"
"#,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .clock(clock.clone())
    .start("providers:\n  a: {sequence: [\"first_token=30m\"]}\n")
    .await;
    let api = gateway.api.clone();
    let client = tokio::spawn(async move { api.chat(&chat_body(true)).await });
    until("the proxy waits for the first event", || {
        clock.sleeping_until().contains(&10_000)
    })
    .await;
    clock.advance(10_000);
    let reply = client.await?;
    assert_eq!(reply.status, 504, "{}", reply.text);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_limit_past_the_default_idle_is_waited_in_full() -> TestResult {
    // No `idle` given: the silence before the first event is first_token's
    // alone, and idle's 60 s default does not cut the 90 s short.
    let clock = Arc::new(ManualClock::default());
    let gateway = Setup::new(
        "timeouts {\n  first_token 90s\n}\nfailover {\n  attempts 1\n  on any => stop, error upstream_failed\n}\n",
        SIMPLE_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .clock(clock.clone())
    .start("providers:\n  a: {sequence: [\"first_token=30m\"]}\n")
    .await;
    let api = gateway.api.clone();
    let client = tokio::spawn(async move { api.chat(&chat_body(true)).await });
    until("the proxy waits for the first event", || {
        clock.sleeping_until().contains(&90_000)
    })
    .await;
    clock.advance(89_999);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!client.is_finished(), "given up before 90 s");
    clock.advance(1);
    let reply = client.await?;
    assert_eq!(reply.status, 502, "{}", reply.text);
    gateway.stop().await;
    Ok(())
}

// --------------------------------------------------------------- 4. pauses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_provider_is_skipped_until_the_pause_expires() -> TestResult {
    let clock = Arc::new(ManualClock::default());
    let gateway = Setup::new(
        r#"
failover {
  attempts 2
  on 429 => next, pause provider for 1s, error upstream_failed
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        a_then_b(),
    )
    .clock(clock.clone())
    .start("providers:\n  a: {sequence: [\"429\", \"200\"]}\n  b: {}\n")
    .await;
    let sim = &gateway.sim;

    // The pause starts when `a` answers 429, at 0 ms on the proxy's clock.
    let first = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(first.chat_text(), "hello from b");
    assert_eq!(providers_seen(&sim.requests()), ["a", "b"]);

    clock.advance(999);
    let second = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(second.chat_text(), "hello from b");
    assert_eq!(
        providers_seen(&sim.requests()),
        ["a", "b", "b"],
        "a paused provider is skipped, not asked"
    );

    clock.advance(1);
    let third = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(
        third.chat_text(),
        "hello from a",
        "traffic returns after the pause"
    );
    assert_eq!(providers_seen(&sim.requests()), ["a", "b", "b", "a"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_finding_every_candidate_paused_waits_for_the_pause_to_end() -> TestResult {
    let gateway = Setup::new(
        r#"
capacity {
  wait 2s
  error busy
}
failover {
  attempts 1
  on 429 => stop, pause provider for 300ms, error upstream_failed
  on any => stop, error upstream_failed
}
"#,
        CAPACITY_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [\"429\", \"200\"]}\n")
    .await;
    let sim = &gateway.sim;

    let first = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(first.status, 502, "{}", first.text);
    // `a` is paused and the only candidate: wait (up to `capacity.wait`).
    let second = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(second.status, 200, "{}", second.text);
    let requests = sim.requests();
    assert_eq!(providers_seen(&requests), ["a", "a"]);
    let waited = gap_ms(&requests, 0, 1);
    assert!(
        waited >= 300,
        "`a` was asked again {waited} ms into its 300 ms pause"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_reads_health_as_it_is_now() -> TestResult {
    let gateway = pausing_a_on_its_first_429("listing {\n  \"paused\" = health.paused\n}\n").await;
    let paused = |reply: &Reply| reply.json.pointer("/data/0/paused").cloned();
    let before = gateway.api.get("/v1/models").await;
    assert_eq!(paused(&before), Some(json!(false)), "{}", before.text);
    let refused = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(refused.status, 502, "{}", refused.text);
    // `a` is paused now: still listed (the key may call it), and said so.
    let after = gateway.api.get("/v1/models").await;
    assert_eq!(paused(&after), Some(json!(true)), "{}", after.text);
    gateway.stop().await;
    Ok(())
}

/// A gateway whose only provider, `a`, answers its first request 429, which
/// pauses it for 60 s; `sections` go before the policy's `failover`.
async fn pausing_a_on_its_first_429(sections: &str) -> Gateway {
    Setup::new(
        &format!(
            "{sections}{}",
            r#"
failover {
  attempts 1
  on 429 => stop, pause provider for 60s, error upstream_failed
  on any => stop, error upstream_failed
}
"#
        ),
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [\"429\", \"200\"]}\n")
    .await
}

/// A policy without a `capacity` section answers a request whose every
/// candidate is paused with the built-in error, which says so and when a
/// candidate is expected back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_candidate_paused_without_a_capacity_section_says_when_one_is_back() -> TestResult {
    let gateway = pausing_a_on_its_first_429("").await;
    let refused = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(refused.status, 502, "{}", refused.text);
    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    let (code, _, message) = openai_error(&reply);
    assert_eq!(code, "capacity_exhausted");
    assert!(message.contains("paused"), "{message}");
    let retry_after: u64 = reply.header("retry-after").unwrap_or_default().parse()?;
    assert!((55..=60).contains(&retry_after), "{retry_after}");
    gateway.stop().await;
    Ok(())
}

/// Which provider answers each of `count` requests when `a` answers as
/// `a_steps` says and `b` answers 200, the order preferring routes whose
/// success rate (unmeasured: 1) is perfect, `a` first on a tie.
async fn served_by_measured_success(a_steps: &str, count: usize) -> Vec<String> {
    let gateway = Setup::new(
        r#"
order {
  by coalesce(stats.success_rate, 1) < 1
}
failover {
  attempts 2
  on 400 => stop, error passthrough
  on any => next, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        a_then_b(),
    )
    .start(&format!(
        "providers:\n  a: {{sequence: [{a_steps}]}}\n  b: {{}}\n"
    ))
    .await;
    for _ in 0..count {
        gateway.api.chat(&chat_body(false)).await;
    }
    let requests = gateway.sim.requests();
    let seen = providers_seen(&requests)
        .into_iter()
        .map(String::from)
        .collect();
    gateway.stop().await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_provider_calls_invalid_does_not_lower_its_success_rate() -> TestResult {
    // `a` answers the first request 400: the request was at fault, so `a`
    // stays first for the second.
    assert_eq!(
        served_by_measured_success("\"400\", \"200\"", 2).await,
        ["a", "a"]
    );
    // A 500 is the provider's failure: the first request fails over to `b`,
    // and `b`, measured perfect, goes first for the second.
    assert_eq!(
        served_by_measured_success("\"500\", \"200\"", 2).await,
        ["a", "b", "b"]
    );
    Ok(())
}

// ------------------------------------------------------------- 5. capacity

fn capacity_policy(wait: &str) -> String {
    format!(
        r#"
capacity {{
  wait {wait}
  error busy
}}
failover {{
  attempts 1
  on any => stop, error upstream_failed
}}
"#
    )
}

const CAPACITY_ERRORS: &str = r#"
  busy = 503, "no provider has room", retry_after 3s
  upstream_failed = 502, "every provider failed"
"#;

fn one_slot_catalog() -> String {
    catalog(
        &[provider("a", "openai", "capacity: {concurrent: 1}")],
        &[model("m", &["a"])],
    )
}

/// A gateway whose provider `a` has one slot (a capacity wait of `wait`),
/// and a first request holding that slot until its headers come, `hold`
/// later: the gateway, and that request once the sim has it.
async fn one_slot_taken(wait: &str, hold: &str) -> (Gateway, tokio::task::JoinHandle<Reply>) {
    let scenario =
        format!("providers:\n  a: {{sequence: [\"200 slow_headers={hold}\", \"200\"]}}\n");
    let gateway = Setup::new(&capacity_policy(wait), CAPACITY_ERRORS, one_slot_catalog())
        .start(&scenario)
        .await;
    let api = gateway.api.clone();
    let slow = tokio::spawn(async move { api.chat(&chat_body(false)).await });
    let sim = &gateway.sim;
    until("the sim sees the first request", || {
        sim.requests().len() == 1
    })
    .await;
    (gateway, slow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_provider_answers_the_capacity_error_after_the_wait() -> TestResult {
    let (gateway, slow) = one_slot_taken("150ms", "1500ms").await;
    let sim = &gateway.sim;

    let refused = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    let (code, _, message) = openai_error(&refused);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("busy", "no provider has room")
    );
    assert_eq!(refused.header("retry-after"), Some("3"));
    assert!(
        refused.elapsed >= Duration::from_millis(150),
        "{:?}",
        refused.elapsed
    );

    let slow = slow.await?;
    assert_eq!(slow.status, 200, "{}", slow.text);
    assert_eq!(
        sim.requests().len(),
        1,
        "the refused request never went upstream"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_wait_counts_from_the_end_of_the_body_not_its_start() -> TestResult {
    // The provider stays full for 3 s; the second request's body takes
    // 600 ms to arrive. Its 400 ms wait starts once the body is in: the
    // capacity error comes at 1 s, not as soon as the body is in.
    let (gateway, slow) = one_slot_taken("400ms", "3000ms").await;
    let body = chat_body(false).to_string().into_bytes();
    let (first, rest) = body.split_at(body.len() / 2);
    let pieces = vec![(0u64, first.to_vec()), (600, rest.to_vec())];
    let uploaded = futures_util::StreamExt::then(
        futures_util::stream::iter(pieces),
        |(wait, piece)| async move {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, std::io::Error>(piece)
        },
    );
    let refused = Reply::of(
        gateway
            .api
            .post("/v1/chat/completions", &Json::Null)
            .body(reqwest::Body::wrap_stream(uploaded))
            .bearer_auth(KEY),
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(
        refused.elapsed >= Duration::from_millis(1000),
        "refused {:?} after it began, its body 600 ms of that",
        refused.elapsed
    );
    assert_eq!(slow.await?.status, 200);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_capacity_is_served_once_room_frees() -> TestResult {
    let (gateway, slow) = one_slot_taken("3s", "600ms").await;
    let sim = &gateway.sim;

    let waiting = {
        let api = gateway.api.clone();
        tokio::spawn(async move { api.chat(&chat_body(false)).await })
    };
    // While it waits, `/healthz` counts both requests, and one attempt
    // holding the provider's room.
    let proxy = gateway.proxy.clone();
    until("the second request waits", || {
        proxy.metrics.render().contains("switchyard_in_flight 2")
    })
    .await;
    let health = gateway.api.get("/healthz").await;
    assert_eq!(health.json["in_flight"], 2, "{}", health.text);
    assert_eq!(health.json["upstream_in_flight"], 1, "{}", health.text);
    let waiting = waiting.await?;
    assert_eq!(waiting.status, 200, "{}", waiting.text);
    assert_eq!(slow.await?.status, 200);
    let requests = sim.requests();
    assert_eq!(providers_seen(&requests), ["a", "a"]);
    // It went upstream only after the first answer (600 ms) freed the slot.
    let waited = gap_ms(&requests, 0, 1);
    assert!(
        waited >= 600,
        "the second request went upstream after {waited} ms"
    );
    gateway.stop().await;
    Ok(())
}

/// `a` serving `m1` and `m2` (`limits` in its catalog entry) under a
/// policy that pauses a route on 429 and waits up to 30 s for room; the sim
/// answers `m1` with `m1_step`, `m2` with 200.
async fn two_models_pausing_routes(limits: &str, m1_step: &str) -> Gateway {
    let policy = r#"
capacity {
  wait 30s
  error busy
}
failover {
  attempts 1
  on 429 => stop, pause route for 60s, error busy
  on any => stop, error upstream_failed
}
"#;
    Setup::new(
        policy,
        CAPACITY_ERRORS,
        catalog(
            &[provider("a", "openai", limits)],
            &[model("m1", &["a"]), model("m2", &["a"])],
        ),
    )
    .start(&format!(
        "providers:\n  a:\n    models:\n      m1: {{sequence: [\"{m1_step}\"]}}\n      m2: {{}}\n"
    ))
    .await
}

/// A chat body for `model`.
fn chat_body_for(model: &str) -> Json {
    let mut body = chat_body(false);
    body["model"] = json!(model);
    body
}

/// A chat request for `model` in the background.
fn chat_in_background(api: &Api, model: &str) -> tokio::task::JoinHandle<Reply> {
    let api = api.clone();
    let body = chat_body_for(model);
    tokio::spawn(async move { api.chat(&body).await })
}

/// Once a request for `m1` waits for room: `m2` is served at once, not held
/// back behind it.
async fn m2_is_not_held_back(gateway: &Gateway, why: &'static str) -> TestResult {
    wait_for_metric(&gateway.api, "switchyard_capacity_waits_total", 1).await;
    let other = tokio::time::timeout(
        Duration::from_secs(10),
        gateway.api.chat(&chat_body_for("m2")),
    )
    .await
    .map_err(|_| why)?;
    assert_eq!(other.status, 200, "{}", other.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_out_a_route_pause_holds_back_no_other_model() -> TestResult {
    // `a` has no capacity limits. `m1`'s route is paused after its 429; a
    // request for `m1` then waits (up to 30 s) for the pause to end. `m2`
    // on the same provider must not wait behind it.
    let gateway = two_models_pausing_routes("", "429").await;
    assert_eq!(gateway.api.chat(&chat_body_for("m1")).await.status, 503);
    let waiting = chat_in_background(&gateway.api, "m1");
    m2_is_not_held_back(
        &gateway,
        "m2 waited behind the request waiting out m1's pause",
    )
    .await?;
    waiting.abort();
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_route_is_paused_while_it_waits_lets_its_provider_go() -> TestResult {
    // `a` has one slot. A first `m1` request holds it for 300 ms, then its
    // 429 pauses `m1`'s route; a second `m1` request waiting for the slot
    // meanwhile now waits out the pause, and must stop holding `a` back
    // from `m2`.
    let gateway =
        two_models_pausing_routes("capacity: {concurrent: 1}", "429 slow_headers=300ms").await;
    let first = chat_in_background(&gateway.api, "m1");
    until("the sim holds the first request", || {
        gateway.sim.requests().len() == 1
    })
    .await;
    let waiting = chat_in_background(&gateway.api, "m1");
    wait_for_metric(&gateway.api, "switchyard_capacity_waits_total", 1).await;
    assert_eq!(first.await?.status, 503, "the 429 ends the first request");
    m2_is_not_held_back(
        &gateway,
        "m2 waited behind a request whose own route was paused",
    )
    .await?;
    waiting.abort();
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_capacity() -> TestResult {
    // A stream of 200 chunks 100 ms apart holds the only slot for 20 s; the
    // next request may wait 5 s, time for a busy machine to notice the
    // disconnect, far short of the stream's end.
    let gateway = Setup::new(&capacity_policy("5s"), CAPACITY_ERRORS, one_slot_catalog())
        .start("providers:\n  a: {chunks: 200, chunk_interval: 100ms}\n")
        .await;
    let sim = &gateway.sim;

    let mut stream = gateway.api.chat_request(&chat_body(true)).send().await?;
    assert_eq!(stream.status(), 200);
    assert!(stream.chunk().await?.is_some(), "the stream started");
    drop(stream);

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(
        reply.status, 200,
        "the abandoned stream still holds the slot: {}",
        reply.text
    );
    assert_eq!(providers_seen(&sim.requests()), ["a", "a"]);
    // The abandoned stream is counted as cancelled, under the provider
    // that had begun to answer it.
    wait_for_metric(
        &gateway.api,
        r#"switchyard_requests_total{provider="a",model="m",outcome="cancelled",status="499"}"#,
        1,
    )
    .await;
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_for_capacity_are_served_in_arrival_order() -> TestResult {
    let gateway = Setup::new(&capacity_policy("5s"), CAPACITY_ERRORS, one_slot_catalog())
        .start("providers:\n  a: {latency: 200ms}\n")
        .await;
    let sim = &gateway.sim;

    let mut waiting = Vec::new();
    for (number, name) in ["r1", "r2", "r3", "r4"].into_iter().enumerate() {
        let api = gateway.api.clone();
        let body = json!({"model": "m", "messages": [{"role": "user", "content": name}]});
        waiting.push(tokio::spawn(async move { api.chat(&body).await }));
        // `r1` takes the slot; each of the others joins the queue (and is
        // counted as waiting) before the next one is sent.
        if number == 0 {
            until("r1 goes upstream", || sim.requests().len() == 1).await;
        } else {
            wait_for_metric(&gateway.api, "switchyard_capacity_waits_total", number).await;
        }
    }
    for reply in waiting {
        let reply = reply.await?;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    let order: Vec<String> = sim
        .requests()
        .iter()
        .map(|request| request.body["messages"][0]["content"].to_string())
        .collect();
    assert_eq!(order, ["\"r1\"", "\"r2\"", "\"r3\"", "\"r4\""]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_that_goes_away_leaves_the_queue() -> TestResult {
    let (gateway, slow) = one_slot_taken("3s", "600ms").await;
    let sim = &gateway.sim;
    let api = gateway.api.clone();
    let gone = tokio::spawn(async move { api.chat(&chat_body(false)).await });
    wait_for_metric(&gateway.api, "switchyard_capacity_waits_total", 1).await;
    gone.abort();
    assert!(gone.await.is_err_and(|error| error.is_cancelled()));

    // The next in line is served when the slot frees, not held behind a
    // waiter that left.
    let next = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(next.status, 200, "{}", next.text);
    assert_eq!(slow.await?.status, 200);
    assert_eq!(providers_seen(&sim.requests()), ["a", "a"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_error_can_say_when_a_window_frees() -> TestResult {
    let gateway = Setup::new(
        &capacity_policy("100ms"),
        r#"
  busy = 503, "no provider has room", retry_after coalesce(free_in, 99s)
  upstream_failed = 502, "every provider failed"
"#,
        catalog(
            &[provider(
                "a",
                "openai",
                "capacity: {requests: 1, window: 10s}",
            )],
            &[model("m", &["a"])],
        ),
    )
    .start("providers:\n  a: {}\n")
    .await;
    let sim = &gateway.sim;

    let first = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let second = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(second.status, 503, "{}", second.text);
    // The window's one admission leaves it within 10 s: `free_in`, in
    // whole seconds (not the 99 s fallback).
    let retry_after: u64 = second.header("retry-after").expect("Retry-After").parse()?;
    assert!(
        (1..=10).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
    assert_eq!(sim.requests().len(), 1);
    gateway.stop().await;
    Ok(())
}

// -------------------------------------------------------------- 6. streams

/// Every failure before the first event fails over; a stream that breaks
/// after it stops with `broken_stream`.
const STREAMS: &str = r#"
timeouts {
  idle if provider.id == "a" then 500ms else 10s
}
failover {
  attempts 2
  on stream_broken => stop, error broken_stream
  on 5xx, connect_error, reset, timeout, first_token_timeout, malformed => next, error upstream_failed
  on any => stop, error upstream_failed
}
"#;

const STREAM_ERRORS: &str = r#"
  broken_stream = 502, "the provider's stream broke"
  upstream_failed = 502, "every provider failed"
"#;

async fn stream_case(a_step: &str) -> (Reply, Vec<RecordedRequest>) {
    failover_case(STREAMS, STREAM_ERRORS, a_step, true, |c| c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_failing_before_its_first_event_fails_over_and_the_client_sees_only_the_next()
-> TestResult {
    // `a` sends its headers, then closes without a single event.
    let (reply, requests) = stream_case("cut_after=0").await;
    assert_b_answered(&reply, true);
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    Ok(())
}

/// The error event that ends a broken OpenAI stream: `broken_stream`, and
/// no `[DONE]` anywhere.
fn assert_ends_with_broken_stream_error(reply: &Reply) {
    assert_eq!(
        reply.status, 200,
        "the stream was committed: {}",
        reply.text
    );
    let events = sse_events(&reply.text);
    let last = events.last().copied().unwrap_or_default();
    let error = event_json(last).unwrap_or_else(|| panic!("the last event is not JSON: {last}"));
    assert_eq!(error["error"]["code"], "broken_stream", "{}", reply.text);
    assert_eq!(error["error"]["message"], "the provider's stream broke");
    assert!(!reply.text.contains("[DONE]"), "{}", reply.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_commit_ends_with_an_error_event_and_no_done() -> TestResult {
    let (reply, requests) = stream_case("cut_after=2").await;
    assert_ends_with_broken_stream_error(&reply);
    // Two chunks of "hello from a" reached the client before the cut.
    assert!(!reply.streamed_text().is_empty(), "{}", reply.text);
    assert!("hello from a".starts_with(&reply.streamed_text()));
    // Nothing fails over once bytes reached the client.
    assert_eq!(providers_seen(&requests), ["a"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_cut_after_commit_ends_with_the_responses_error_event() -> TestResult {
    // The Responses API's streams are typed events; its error event is one
    // of them, and carries the error object the official SDKs raise on.
    let scenario = "providers:\n  a: {sequence: [\"cut_after=2\"]}\n  b: {}\n";
    let gateway = Setup::new(STREAMS, STREAM_ERRORS, a_then_b())
        .start(scenario)
        .await;
    let body = json!({"model": "m", "input": "Hello", "stream": true});
    let reply = Reply::of(gateway.api.post("/v1/responses", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "committed: {}", reply.text);
    let events = sse_events(&reply.text);
    assert!(events.len() > 1, "{}", reply.text);
    let last = events.last().copied().unwrap_or_default();
    assert_eq!(event_name(last), Some("error"), "{}", reply.text);
    let error = event_json(last).unwrap_or_else(|| panic!("the last event is not JSON: {last}"));
    assert_eq!(error["type"], "error", "{}", reply.text);
    assert_eq!(error["code"], "broken_stream", "{}", reply.text);
    assert_eq!(error["message"], "the provider's stream broke");
    assert_eq!(error["error"]["code"], "broken_stream", "{}", reply.text);
    assert!(!reply.text.contains("response.completed"), "{}", reply.text);
    assert_eq!(providers_seen(&gateway.sim.requests()), ["a"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_ends_with_an_error_event_after_the_idle_timeout() -> TestResult {
    let (reply, requests) = stream_case("stall_after=2").await;
    assert_ends_with_broken_stream_error(&reply);
    assert_eq!(providers_seen(&requests), ["a"]);
    // `timeouts { idle 500ms }` for `a`.
    assert!(
        reply.elapsed >= Duration::from_millis(500),
        "{:?}",
        reply.elapsed
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_malformed_after_commit_ends_with_an_error_event_and_no_done() -> TestResult {
    let (reply, requests) = stream_case("malformed_chunk=3").await;
    assert_ends_with_broken_stream_error(&reply);
    assert_eq!(providers_seen(&requests), ["a"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_stream_outliving_the_attempt_timeout_ends_with_an_error_event() -> TestResult {
    // 20 chunks 100 ms apart: about 2 s, four times the attempt's limit.
    let gateway = Setup::new(
        r#"
timeouts {
  attempt 500ms
}
failover {
  attempts 1
  on stream_broken, timeout => stop, error broken_stream
  on any => stop, error upstream_failed
}
"#,
        STREAM_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {chunks: 20, chunk_interval: 100ms}\n")
    .await;

    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_ends_with_broken_stream_error(&reply);
    assert_ne!(
        reply.streamed_text(),
        "hello from a",
        "the whole answer was streamed"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_commit_limits_a_committed_stream_in_place_of_the_attempt_timeout() -> TestResult {
    // 20 chunks 100 ms apart: about 2 s.
    for (attempt, after_commit, whole) in [
        ("500ms", "10s", true),
        ("500ms", "null", true),
        ("10s", "300ms", false),
    ] {
        let gateway = Setup::new(
            &format!(
                r#"
timeouts {{
  attempt {attempt}
}}
stream {{
  after_commit {after_commit}
}}
failover {{
  attempts 1
  on stream_broken, timeout => stop, error broken_stream
  on any => stop, error upstream_failed
}}
"#
            ),
            STREAM_ERRORS,
            catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
        )
        .start("providers:\n  a: {chunks: 20, chunk_interval: 100ms}\n")
        .await;

        let reply = gateway.api.chat(&chat_body(true)).await;
        if whole {
            assert_eq!(reply.streamed_text(), "hello from a", "{}", reply.text);
            assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
        } else {
            assert_ends_with_broken_stream_error(&reply);
            assert_ne!(reply.streamed_text(), "hello from a", "{}", reply.text);
        }
        gateway.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_done_is_finished_promptly_with_done() -> TestResult {
    let gateway = Setup::new(
        r#"
timeouts {
  idle 30s
}
failover {
  attempts 1
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [no_done]}\n")
    .await;

    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from a");
    assert_eq!(
        sse_events(&reply.text).last(),
        Some(&"data: [DONE]"),
        "{}",
        reply.text
    );
    assert_eq!(reply.text.matches("[DONE]").count(), 1);
    // Not after the 30 s idle timeout.
    assert!(
        reply.elapsed < Duration::from_secs(10),
        "{:?}",
        reply.elapsed
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streams_end_with_message_stop_or_an_error_event() -> TestResult {
    let gateway = Setup::new(
        STREAMS,
        STREAM_ERRORS,
        catalog(
            &[provider("anth", "anthropic", "")],
            &[model("claude", &["anth"])],
        ),
    )
    .start("providers:\n  anth: {sequence: [\"200\", no_done, cut_after=2]}\n")
    .await;

    for case in ["complete", "without message_stop"] {
        let reply = gateway.api.messages(&messages_body(true)).await;
        assert_eq!(reply.status, 200, "{case}: {}", reply.text);
        assert_eq!(reply.streamed_text(), "hello from anth", "{case}");
        let events = sse_events(&reply.text);
        let last = events.last().copied().unwrap_or_default();
        assert_eq!(
            event_name(last),
            Some("message_stop"),
            "{case}: {}",
            reply.text
        );
        assert_eq!(event_json(last), Some(json!({"type": "message_stop"})));
        assert_eq!(
            reply.text.matches("message_stop").count(),
            2,
            "{case}: once, as name and type"
        );
    }

    let reply = gateway.api.messages(&messages_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let events = sse_events(&reply.text);
    let last = events.last().copied().unwrap_or_default();
    assert_eq!(event_name(last), Some("error"), "{}", reply.text);
    // It names its request, as an Anthropic error object does.
    let request_id = reply.header("x-request-id").unwrap_or_default();
    assert_eq!(
        event_json(last),
        Some(
            json!({"type": "error", "error": {"type": "api_error", "message": "the provider's stream broke", "code": "broken_stream"}, "request_id": request_id})
        )
    );
    assert!(!reply.text.contains("message_stop"), "{}", reply.text);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_headers_go_out_after_hold_headers_and_the_late_comment_precedes_the_events()
-> TestResult {
    // `a` sends headers at once but its first event only after 10 s.
    // Wide margins: a busy machine must not make the held headers look
    // as if they waited for an event.
    let gateway = Setup::new(
        r#"
timeouts {
  first_token if provider.id == "a" then 3s else 10s
}
stream {
  hold_headers 100ms
  late_comment "provider=" + served.provider.name
}
failover {
  attempts 2
  on first_token_timeout => next, error upstream_failed
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        a_then_b(),
    )
    .start("providers:\n  a: {sequence: [\"first_token=10s\"]}\n  b: {}\n")
    .await;
    let sim = &gateway.sim;

    let started = Instant::now();
    let response = gateway.api.chat_request(&chat_body(true)).send().await?;
    let headers_after = started.elapsed();
    assert_eq!(response.status(), 200);
    let text = response.text().await?;

    assert!(
        headers_after >= Duration::from_millis(100),
        "the headers were held only {headers_after:?}"
    );
    // No event can exist before `a`'s first-token timeout (3 s): the
    // headers did not wait for one.
    assert!(
        headers_after < Duration::from_secs(3),
        "the headers waited {headers_after:?}, for the first event"
    );
    let events = sse_events(&text);
    assert_eq!(events.first(), Some(&": provider=b"), "{text}");
    assert_eq!(text.matches(": provider=").count(), 1, "{text}");
    assert_eq!(chat_deltas(&text), "hello from b");
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    assert_eq!(providers_seen(&sim.requests()), ["a", "b"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_headers_go_out_after_hold_headers_even_before_the_provider_answers() -> TestResult {
    // `a` sends nothing, not even headers, for 3 s.
    let gateway = Setup::new(
        r#"
timeouts {
  headers 5s
}
stream {
  hold_headers 100ms
  late_comment "provider=" + served.provider.name
}
failover {
  attempts 1
  on any => stop, error upstream_failed
}
"#,
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [\"slow_headers=3s\"]}\n")
    .await;

    let started = Instant::now();
    let response = gateway.api.chat_request(&chat_body(true)).send().await?;
    let headers_after = started.elapsed();
    let text = response.text().await?;
    assert!(
        headers_after < Duration::from_secs(3),
        "the headers waited {headers_after:?}, for the provider's headers"
    );
    assert_eq!(sse_events(&text).first(), Some(&": provider=a"), "{text}");
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_faster_than_its_client_arrives_whole_and_in_order() -> TestResult {
    // 2,000 events with no pause between them: far more than the proxy
    // queues for its client, so the exchange must wait for the client and
    // be taken up again each time the client has read.
    let gateway = simple_gateway_with("providers:\n  a: {chunks: 2000}\n").await;
    let mut response = gateway.api.chat_request(&chat_body(true)).send().await?;
    assert_eq!(response.status(), 200);
    // A slow reader: a pause after each of the first chunks it reads.
    let mut text = Vec::new();
    let mut reads = 0;
    while let Some(chunk) = response.chunk().await? {
        text.extend_from_slice(&chunk);
        reads += 1;
        if reads < 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let text = String::from_utf8(text)?;
    let deltas = sse_events(&text)
        .iter()
        .filter_map(|event| event_json(event))
        .filter(|data| data.pointer("/choices/0/delta/content").is_some())
        .count();
    assert_eq!(deltas, 2000);
    assert_eq!(chat_deltas(&text), "hello from a");
    assert_eq!(sse_events(&text).last(), Some(&"data: [DONE]"));
    gateway.stop().await;
    Ok(())
}

// ------------------------------------------------------------- 7. headers

const HEADERS: &str = r#"
headers {
  "x-served-by" = served.provider.name
  "x-attempts" = attempts
}
failover {
  attempts 2
  on 503 when retries < 1 and provider.id == "c" => retry after 10ms, error upstream_failed
  on 5xx => next, error upstream_failed
  on any => stop, error upstream_failed
}
"#;

async fn headers_case(scenario: &str) -> Gateway {
    let catalog = catalog(
        &[
            provider("a", "openai", ""),
            provider("b", "openai", ""),
            provider("c", "openai", ""),
        ],
        &[model("m", &["a", "b"]), model("solo", &["c"])],
    );
    Setup::new(
        HEADERS,
        r#"  upstream_failed = 502, "every provider failed""#,
        catalog,
    )
    .start(scenario)
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_own_key_sent_as_a_model_is_not_logged() -> TestResult {
    // The test key is too short to look like a key: only knowing it is the
    // caller's own keeps it out of the log.
    let sent = [KEY.to_string(), format!("my key is {KEY}")];
    let logged = ["***", "***"];
    let errors = r#"  upstream_failed = 502, "every provider failed""#;

    // Refused: an id the catalog does not know.
    let refusing = Setup::new(HEADERS, errors, a_then_b())
        .start("providers:\n  a: {}\n  b: {}\n")
        .await;
    for model in &sent {
        let reply = refusing
            .api
            .chat(&json!({"model": model, "messages": []}))
            .await;
        assert_eq!(reply.status, 404, "{}", reply.text);
    }
    let log = refusing.log.clone();
    until("both refusals are logged", || log.lines().len() == 2).await;
    let models: Vec<String> = log.lines().into_iter().map(|line| line.model).collect();
    assert_eq!(models, logged);

    // Served: the id goes upstream as sent, and the line names it twice.
    let mut serving = Setup::new(HEADERS, errors, a_then_b());
    serving.policy = serving.policy.replace(
        "unknown error unknown_model",
        "unknown serve where true\n  unknown error unknown_model",
    );
    let serving = serving.start("providers:\n  a: {}\n  b: {}\n").await;
    for model in &sent {
        let reply = serving
            .api
            .chat(&json!({"model": model, "messages": []}))
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    let log = serving.log.clone();
    until("both requests are logged", || log.lines().len() == 2).await;
    for (line, logged) in log.lines().iter().zip(logged) {
        assert_eq!(line.model, logged);
        let exchange = line.exchange.as_ref().expect("an exchange ran");
        assert_eq!(exchange.served_model(), logged);
    }

    // The key in another source of ids (a `models` list), with a model the
    // catalog names in `model`: the id served is still masked.
    let sections = format!(
        "input models from body \"models\" : list<string> malformed error upstream_failed\norder {{\n  by requested.index desc\n}}\n{HEADERS}"
    );
    let mut listing = Setup::new(&sections, errors, a_then_b());
    listing.policy = listing.policy.replace(
        "unknown error unknown_model",
        "from request.model, input.models\n  unknown serve where true\n  unknown error unknown_model",
    );
    let listing = listing.start("providers:\n  a: {}\n  b: {}\n").await;
    let reply = listing
        .api
        .chat(&json!({"model": "m", "models": [KEY], "messages": []}))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let log = listing.log.clone();
    until("the request is logged", || log.lines().len() == 1).await;
    let line = &log.lines()[0];
    assert_eq!(line.model, "m");
    let exchange = line.exchange.as_ref().expect("an exchange ran");
    assert_eq!(exchange.served_model(), "***");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_headers_name_the_served_provider_after_failover_and_on_errors() -> TestResult {
    let gateway = headers_case("providers:\n  a: {sequence: [\"503\", \"503\"]}\n  b: {sequence: [\"200\", \"503\"]}\n  c: {}\n")
            .await;
    let sim = &gateway.sim;

    let served = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(served.status, 200, "{}", served.text);
    assert_eq!(served.header("x-served-by"), Some("b"));
    assert_eq!(served.header("x-attempts"), Some("2"));

    let failed = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(openai_error(&failed).0, "upstream_failed");
    assert_eq!(
        failed.header("x-served-by"),
        Some("b"),
        "the provider that answered last"
    );
    assert_eq!(failed.header("x-attempts"), Some("2"));

    // The request's log line names the error it ended with.
    let log = gateway.log.clone();
    until("both lines are logged", || log.lines().len() == 2).await;
    let errors: Vec<String> = log
        .lines()
        .iter()
        .map(|line| line.error().to_string())
        .collect();
    assert_eq!(errors, ["", "upstream_failed"]);

    // Refused before any attempt: no provider to name.
    let refused = gateway
        .api
        .chat(&json!({"model": "no-such-model", "messages": []}))
        .await;
    assert_eq!(refused.status, 404, "{}", refused.text);
    assert_eq!(refused.header("x-served-by"), None);
    // Its line says so, as the metrics count it.
    until("the refusal is logged", || log.lines().len() == 3).await;
    let lines = log.lines();
    let outcomes: Vec<(&str, &str)> = lines
        .iter()
        .map(|line| (line.outcome, line.error()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("served", ""),
            ("error", "upstream_failed"),
            ("refused", "unknown_model")
        ]
    );

    assert_eq!(providers_seen(&sim.requests()), ["a", "b", "a", "b"]);

    // A body that is not JSON, refused with the proxy's own error, carries
    // the policy's headers as the policy's own errors do.
    let malformed = Reply::of(gateway.api.chat_text("{\"model\": ")).await;
    assert_eq!(malformed.status, 400, "{}", malformed.text);
    assert_eq!(openai_error(&malformed).0, "invalid_request_body");
    assert_eq!(malformed.header("x-attempts"), refused.header("x-attempts"));
    assert_eq!(malformed.header("x-attempts"), Some("0"));
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_headers_count_the_attempts_of_a_stream_after_failover() -> TestResult {
    let gateway = headers_case("providers:\n  a: {sequence: [\"503\"]}\n  b: {}\n  c: {}\n").await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b");
    assert_eq!(reply.header("x-served-by"), Some("b"));
    assert_eq!(
        reply.header("x-attempts"),
        Some("2"),
        "two candidates were tried"
    );
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_headers_do_not_count_retries_as_attempts() -> TestResult {
    let gateway =
        headers_case("providers:\n  a: {}\n  b: {}\n  c: {sequence: [\"503\", \"200\"]}\n").await;
    let sim = &gateway.sim;
    let reply = gateway
        .api
        .chat(&json!({"model": "solo", "messages": []}))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(
        providers_seen(&sim.requests()),
        ["c", "c"],
        "one retry of `c`"
    );
    // `attempts` counts candidates tried; retries of one do not count.
    assert_eq!(reply.header("x-attempts"), Some("1"));
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_headers_can_tell_a_successful_answer_from_an_error() -> TestResult {
    let gateway = Setup::new(
        &format!("headers {{\n  \"x-succeeded\" = succeeded\n}}\n{SIMPLE}"),
        SIMPLE_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {sequence: [\"200\", \"503\"]}\n")
    .await;

    let served = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(served.status, 200, "{}", served.text);
    let failed = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(failed.header("x-succeeded"), Some("false"));
    assert_eq!(served.header("x-succeeded"), Some("true"));
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_headers_read_the_time_elapsed() -> TestResult {
    let gateway = Setup::new(
        &format!("headers {{\n  \"x-elapsed-ms\" = seconds(elapsed) * 1000\n}}\n{SIMPLE}"),
        SIMPLE_ERRORS,
        catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]),
    )
    .start("providers:\n  a: {latency: 300ms}\n")
    .await;

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let elapsed: f64 = reply
        .header("x-elapsed-ms")
        .expect("the header is there")
        .parse()?;
    // The provider took 300 ms to answer.
    assert!(elapsed >= 300.0, "x-elapsed-ms: {elapsed}");
    gateway.stop().await;
    Ok(())
}

// ------------------------------------------------------- 8. authentication

const SIMPLE: &str = r#"
failover {
  attempts 2
  on 5xx => next, error upstream_failed
  on any => stop, error upstream_failed
}
"#;

const SIMPLE_ERRORS: &str = r#"  upstream_failed = 502, "every provider failed""#;

/// OpenAI provider `a` for `m`, Anthropic provider `anth` for `claude`.
fn openai_and_anthropic() -> String {
    catalog(
        &[
            provider("a", "openai", ""),
            provider("anth", "anthropic", ""),
        ],
        &[model("m", &["a"]), model("claude", &["anth"])],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_unknown_keys_get_401_in_the_callers_wire_format() -> TestResult {
    let gateway = Setup::new(SIMPLE, SIMPLE_ERRORS, openai_and_anthropic())
        .start("providers:\n  a: {}\n  anth: {}\n")
        .await;
    let sim = &gateway.sim;
    let api = &gateway.api;

    let missing = Reply::of(api.post("/v1/chat/completions", &chat_body(false))).await;
    assert_eq!(missing.status, 401, "{}", missing.text);
    assert_eq!(openai_error(&missing).1, "authentication_error");

    let unknown = Reply::of(
        api.post("/v1/chat/completions", &chat_body(false))
            .bearer_auth("sk-not-a-key"),
    )
    .await;
    assert_eq!(unknown.status, 401, "{}", unknown.text);
    assert_eq!(openai_error(&unknown).1, "authentication_error");
    assert_ne!(
        openai_error(&missing).0,
        openai_error(&unknown).0,
        "a missing key and a wrong one are told apart"
    );

    let missing = Reply::of(
        api.post("/v1/messages", &messages_body(false))
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(missing.status, 401, "{}", missing.text);
    assert_eq!(anthropic_error(&missing).0, "authentication_error");

    let unknown = Reply::of(
        api.post("/v1/messages", &messages_body(false))
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", "sk-not-a-key"),
    )
    .await;
    assert_eq!(unknown.status, 401, "{}", unknown.text);
    assert_eq!(anthropic_error(&unknown).0, "authentication_error");

    // Each log line names the code its client got.
    let log = gateway.log.clone();
    until("the four refusals are logged", || log.lines().len() == 4).await;
    let logged: Vec<(&str, String)> = log
        .lines()
        .iter()
        .map(|line| (line.outcome, line.error().to_string()))
        .collect();
    assert_eq!(
        logged,
        [
            ("unauthorized", String::from("missing_api_key")),
            ("unauthorized", String::from("invalid_api_key")),
            ("unauthorized", String::from("missing_api_key")),
            ("unauthorized", String::from("invalid_api_key")),
        ]
    );

    assert!(sim.requests().is_empty(), "nothing went upstream");
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_accepted_from_bearer_and_x_api_key() -> TestResult {
    let gateway = Setup::new(SIMPLE, SIMPLE_ERRORS, openai_and_anthropic())
        .start("providers:\n  a: {}\n  anth: {}\n")
        .await;
    let sim = &gateway.sim;
    let api = &gateway.api;

    let bearer = api.chat(&chat_body(false)).await;
    assert_eq!(bearer.status, 200, "{}", bearer.text);
    let x_api_key = Reply::of(
        api.post("/v1/chat/completions", &chat_body(false))
            .header("x-api-key", KEY),
    )
    .await;
    assert_eq!(x_api_key.status, 200, "{}", x_api_key.text);
    let anthropic = api.messages(&messages_body(false)).await;
    assert_eq!(anthropic.status, 200, "{}", anthropic.text);
    let anthropic_bearer = Reply::of(
        api.post("/v1/messages", &messages_body(false))
            .bearer_auth(KEY)
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(anthropic_bearer.status, 200, "{}", anthropic_bearer.text);
    assert_eq!(providers_seen(&sim.requests()), ["a", "a", "anth", "anth"]);
    gateway.stop().await;
    Ok(())
}

// ------------------------------------------------------ 9. what goes upstream

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_gets_the_provider_credential_and_model_without_routing_inputs() -> TestResult {
    let gateway = Setup::new(
        &format!(
            r#"
input route_hint from body "route_hint" : string malformed error bad_input
input region from header "x-route-region" : string malformed error bad_input
{SIMPLE}"#
        ),
        r#"
  bad_input = 400, "a routing input has the wrong shape"
  upstream_failed = 502, "every provider failed"
"#,
        catalog(
            &[
                provider("a", "openai", ""),
                provider("anth", "anthropic", ""),
            ],
            &[
                model_upstream("m", "a", "vendor/model-a"),
                model_upstream("claude", "anth", "claude-upstream-1"),
            ],
        ),
    )
    .start("providers:\n  a: {}\n  anth: {}\n")
    .await;
    let sim = &gateway.sim;

    let mut body = chat_body(false);
    body["route_hint"] = json!("eu");
    let reply = Reply::of(
        gateway
            .api
            .chat_request(&body)
            .header("x-route-region", "eu-west"),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);

    let mut body = messages_body(false);
    body["route_hint"] = json!("eu");
    let reply = Reply::of(
        gateway
            .api
            .post("/v1/messages", &body)
            .header("x-api-key", KEY)
            .header("anthropic-version", "2024-01-01")
            .header("x-route-region", "eu-west"),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    // Without `anthropic-version` the proxy sends the default one.
    let reply = Reply::of(
        gateway
            .api
            .post("/v1/messages", &messages_body(false))
            .bearer_auth(KEY),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);

    let requests = sim.requests();
    assert_eq!(providers_seen(&requests), ["a", "anth", "anth"]);
    let (openai, anthropic) = (&requests[0], &requests[1]);
    assert_eq!(requests[2].header("anthropic-version"), Some("2023-06-01"));

    let expected = format!("Bearer {}", secret_of("a"));
    assert_eq!(openai.header("authorization"), Some(expected.as_str()));
    assert_eq!(openai.header("x-api-key"), None);
    assert_eq!(openai.model.as_deref(), Some("vendor/model-a"));
    assert_eq!(
        openai.body["messages"],
        json!([{"role": "user", "content": "hi"}])
    );

    assert_eq!(
        anthropic.header("x-api-key"),
        Some(secret_of("anth").as_str())
    );
    assert_eq!(anthropic.header("authorization"), None);
    assert_eq!(anthropic.header("anthropic-version"), Some("2024-01-01"));
    assert_eq!(anthropic.model.as_deref(), Some("claude-upstream-1"));

    for request in &requests {
        assert!(
            request.body.get("route_hint").is_none(),
            "a routing input went upstream: {}",
            request.body
        );
        assert_eq!(request.header("x-route-region"), None);
        for (name, value) in &request.headers {
            assert!(
                !value.contains(KEY),
                "the client's key went upstream in {name}"
            );
        }
    }
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_serving_both_formats_gets_its_credential_as_the_request_format_expects()
-> TestResult {
    // `both` is an Anthropic provider whose base URL also serves OpenAI's
    // chat completions; `anth` serves only its own format.
    let gateway = Setup::new(
        SIMPLE,
        SIMPLE_ERRORS,
        catalog(
            &[
                provider(
                    "both",
                    "anthropic",
                    "endpoints: [chat_completions, messages]",
                ),
                provider("anth", "anthropic", ""),
            ],
            &[model("m", &["both"]), model("claude", &["anth"])],
        ),
    )
    .start("providers:\n  both: {}\n  anth: {}\n")
    .await;
    let sim = &gateway.sim;
    let api = &gateway.api;

    let reply = api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let mut body = messages_body(false);
    body["model"] = json!("m");
    let reply = api.messages(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let mut body = chat_body(false);
    body["model"] = json!("claude");
    let reply = api.chat(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);

    let requests = sim.requests();
    assert_eq!(providers_seen(&requests), ["both", "both", "anth"]);
    let bearer = format!("Bearer {}", secret_of("both"));
    assert_eq!(requests[0].header("authorization"), Some(bearer.as_str()));
    assert_eq!(requests[0].header("x-api-key"), None);
    assert_eq!(requests[0].header("anthropic-version"), None);
    assert_eq!(
        requests[1].header("x-api-key"),
        Some(secret_of("both").as_str())
    );
    assert_eq!(requests[1].header("authorization"), None);
    assert_eq!(requests[1].header("anthropic-version"), Some("2023-06-01"));
    // A provider that does not serve the request's endpoint still gets its
    // credential its own way; the policy decides whether to send it there.
    assert_eq!(
        requests[2].header("x-api-key"),
        Some(secret_of("anth").as_str())
    );
    assert_eq!(requests[2].header("authorization"), None);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_kept_or_generated_and_forwarded() -> TestResult {
    let gateway = simple_gateway().await;
    let sim = &gateway.sim;

    let given = Reply::of(
        gateway
            .api
            .chat_request(&chat_body(false))
            .header("x-request-id", "client-req-42"),
    )
    .await;
    assert_eq!(given.status, 200, "{}", given.text);
    assert_eq!(given.header("x-request-id"), Some("client-req-42"));

    let generated = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(generated.status, 200, "{}", generated.text);
    let id = generated
        .header("x-request-id")
        .expect("a request id is generated")
        .to_string();
    assert!(!id.is_empty());
    assert_ne!(id, "client-req-42");

    // Not a sensible id (spaces, quotes): replaced by a generated one.
    let odd = Reply::of(
        gateway
            .api
            .chat_request(&chat_body(false))
            .header("x-request-id", "no \"ids\" like this"),
    )
    .await;
    assert_eq!(odd.status, 200, "{}", odd.text);
    let replaced = odd.header("x-request-id").expect("an id").to_string();
    assert!(!replaced.contains(' '), "{replaced}");

    let requests = sim.requests();
    assert_eq!(requests[0].header("x-request-id"), Some("client-req-42"));
    assert_eq!(requests[1].header("x-request-id"), Some(id.as_str()));
    assert_eq!(requests[2].header("x-request-id"), Some(replaced.as_str()));
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_answers_carry_the_request_id_where_anthropic_clients_read_it() -> TestResult {
    let gateway = Setup::new(SIMPLE, SIMPLE_ERRORS, openai_and_anthropic())
        .start("providers:\n  a: {}\n  anth: {}\n")
        .await;
    let api = &gateway.api;
    let messages = |body: &Json| {
        api.messages_request(body)
            .header("x-request-id", "client-req-7")
    };

    for stream in [false, true] {
        let answer = Reply::of(messages(&messages_body(stream))).await;
        assert_eq!(answer.status, 200, "{}", answer.text);
        assert_eq!(answer.header("request-id"), Some("client-req-7"));
        assert_eq!(answer.header("x-request-id"), Some("client-req-7"));
    }
    // An error object names the request too, as Anthropic's do.
    let refused = Reply::of(messages(
        &json!({"model": "no-such-model", "max_tokens": 5, "messages": []}),
    ))
    .await;
    assert!(refused.status >= 400, "{}", refused.text);
    assert_eq!(refused.header("request-id"), Some("client-req-7"));
    let body: Json = serde_json::from_str(&refused.text)?;
    assert_eq!(body["type"], "error", "{}", refused.text);
    assert_eq!(body["request_id"], "client-req-7", "{}", refused.text);
    // The proxy's own answers on Anthropic's endpoint as well.
    let unauthorized = Reply::of(
        api.post("/v1/messages", &messages_body(false))
            .header("anthropic-version", "2023-06-01")
            .header("x-request-id", "client-req-8"),
    )
    .await;
    assert_eq!(unauthorized.status, 401, "{}", unauthorized.text);
    assert_eq!(unauthorized.header("request-id"), Some("client-req-8"));

    // OpenAI's answers keep to `x-request-id`.
    let openai = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(openai.status, 200, "{}", openai.text);
    assert_eq!(openai.header("request-id"), None);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_reads_the_body_the_policy_read() -> TestResult {
    let gateway = simple_gateway().await;
    // A repeated key (the last counts, for the policy and the provider), an
    // escaped one, and a conversation that goes on without being parsed.
    let text = r#"{"stream": true, "model": "m", "str\u0065am": false,
        "messages": [{"role": "user", "content": "a \"quoted\" }, {"}],
        "temperature": 0.5, "temperature": 0.25}"#;
    let reply = Reply::of(gateway.api.chat_text(text)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(
        !reply.text.starts_with("data:"),
        "the policy read stream: false: {}",
        reply.text
    );
    let requests = gateway.sim.requests();
    assert_eq!(
        requests[0].body,
        json!({
            "model": "m",
            "stream": false,
            "messages": [{"role": "user", "content": "a \"quoted\" }, {"}],
            "temperature": 0.25,
        })
    );
    // Sent in parts, but with its length, as a single buffer would be.
    assert!(
        requests[0]
            .header("content-length")
            .is_some_and(|length| length.parse::<usize>().is_ok_and(|n| n > 0)),
        "{:?}",
        requests[0].header("content-length")
    );
    assert_eq!(requests[0].header("transfer-encoding"), None);
    gateway.stop().await;
    Ok(())
}

// ------------------------------------------------ 10. limits and the surface

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_max_body_bytes_gets_413() -> TestResult {
    let gateway = gateway_taking_1_kib().await;
    let sim = &gateway.sim;

    let mut body = chat_body(false);
    body["messages"][0]["content"] = json!("x".repeat(2048));
    let reply = gateway.api.chat(&body).await;
    assert_eq!(reply.status, 413, "{}", reply.text);
    assert_eq!(openai_error(&reply).0, "request_too_large");

    // Sent in chunks, without a length: refused once it passes the limit.
    let reply = Reply::of(gateway.api.chat_in_chunks(&body, 256)).await;
    assert_eq!(reply.status, 413, "{}", reply.text);

    let small = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(small.status, 200, "{}", small.text);
    assert_eq!(
        sim.requests().len(),
        1,
        "the large body never went upstream"
    );
    gateway.stop().await;
    Ok(())
}

/// Embeddings never stream: a body asking for a stream gets the whole
/// answer, and the provider is not asked for a stream it could refuse or
/// send in events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embeddings_request_asking_for_a_stream_is_answered_whole() -> TestResult {
    let embedding = "  - id: e\n    kind: embedding\n    routes:\n      - {provider: a}\n";
    let gateway = Setup::new(
        SIMPLE,
        SIMPLE_ERRORS,
        catalog(&[provider("a", "openai", "")], &[embedding.to_string()]),
    )
    .start("providers:\n  a: {}\n")
    .await;
    let body = json!({
        "model": "e",
        "input": "hi",
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let reply = Reply::of(gateway.api.post("/v1/embeddings", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert!(reply.json["data"].is_array(), "{}", reply.text);
    let sent = &gateway.sim.requests()[0].body;
    assert_eq!(sent.get("stream"), None, "{sent}");
    assert_eq!(sent.get("stream_options"), None, "{sent}");
    assert_eq!(sent["input"], "hi");
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_body_gets_415_and_says_why() -> TestResult {
    use tokio::io::AsyncReadExt;
    let gateway = gateway_taking_1_kib().await;
    let body = chat_body(false);
    let encoded = |coding: &'static str| {
        Reply::of(
            gateway
                .api
                .chat_request(&body)
                .header("content-encoding", coding),
        )
    };
    let reply = encoded("gzip").await;
    assert_eq!(reply.status, 415, "{}", reply.text);
    let (code, _, message) = openai_error(&reply);
    assert_eq!(code, "unsupported_content_encoding");
    assert!(message.contains("`Content-Encoding: gzip`"), "{message}");

    let reply = Reply::of(
        gateway
            .api
            .messages_request(&json!({"model": "m", "max_tokens": 8, "messages": []}))
            .header("content-encoding", "br"),
    )
    .await;
    assert_eq!(reply.status, 415, "{}", reply.text);
    assert!(anthropic_error(&reply).1.contains("`Content-Encoding: br`"));

    // A list: only the codings that are not `identity` count.
    let reply = encoded("identity, gzip").await;
    assert_eq!(reply.status, 415, "{}", reply.text);
    assert!(openai_error(&reply).2.contains("`Content-Encoding: gzip`"));

    // `identity` is no coding at all, however it is listed.
    for identity in ["identity", "Identity, identity", "identity,"] {
        let reply = encoded(identity).await;
        assert_eq!(reply.status, 200, "{identity}: {}", reply.text);
    }
    assert_eq!(gateway.sim.requests().len(), 3, "only those went upstream");

    // Compressed as a transfer coding, under the chunked framing.
    let mut socket = send_raw_chat(
        &gateway.api,
        "Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
    )
    .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer)).await??;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 415 "), "{answer}");
    assert!(answer.contains("`Transfer-Encoding: gzip`"), "{answer}");
    assert_eq!(gateway.sim.requests().len(), 3);
    gateway.stop().await;
    Ok(())
}

/// A byte-order mark before the JSON is passed over (RFC 8259 lets a
/// reader), and the provider gets the members without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_a_byte_order_mark_is_read() -> TestResult {
    let gateway = gateway_taking_1_kib().await;
    let body = chat_body(false);
    let mut marked = b"\xEF\xBB\xBF".to_vec();
    marked.extend(serde_json::to_vec(&body)?);
    let reply = Reply::of(gateway.api.chat_request(&body).body(marked)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let sent = gateway.sim.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["messages"], body["messages"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_a_refused_body_reads_the_413() -> TestResult {
    // Refused at once, with megabytes still to send: a connection closed on
    // unread data is reset, and the reset loses the answer.
    let gateway = gateway_taking_1_kib().await;
    let mut body = chat_body(false);
    body["messages"][0]["content"] = json!("x".repeat(4 << 20));
    for round in 0..3 {
        let reply = gateway.api.chat(&body).await;
        assert_eq!(reply.status, 413, "round {round}: {}", reply.text);
    }
    // And in chunks, refused once past the limit.
    let reply = Reply::of(gateway.api.chat_in_chunks(&body, 64 << 10)).await;
    assert_eq!(reply.status, 413, "{}", reply.text);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_a_body_reads_a_refusal_given_before_reading_it() -> TestResult {
    // Refusals that need none of the body (a wrong key, a wrong path or
    // method) come with megabytes still unsent; the same reset as for a
    // 413 would lose them.
    let gateway = simple_gateway().await;
    let mut body = chat_body(false);
    body["messages"][0]["content"] = json!("x".repeat(4 << 20));
    for round in 0..2 {
        let wrong_key = gateway
            .api
            .post("/v1/chat/completions", &body)
            .bearer_auth("sk-nobody");
        let reply = Reply::of(wrong_key).await;
        assert_eq!(reply.status, 401, "round {round}: {}", reply.text);
        let reply = Reply::of(gateway.api.post("/v2/chat/completions", &body)).await;
        assert_eq!(reply.status, 404, "round {round}: {}", reply.text);
        let reply = Reply::of(gateway.api.post("/healthz", &body)).await;
        assert_eq!(reply.status, 405, "round {round}: {}", reply.text);
    }
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_its_body_ends_is_counted_as_cancelled() -> TestResult {
    use tokio::io::AsyncWriteExt;
    let gateway = simple_gateway().await;
    let mut socket =
        send_raw_chat(&gateway.api, "Content-Length: 500\r\n\r\n{\"model\": \"m\"").await?;
    socket.shutdown().await?;
    drop(socket);

    wait_for_unrouted_request(&gateway.api, "cancelled", 499).await;
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

/// A client that closes its sending side right after its request (a
/// half-close, taken for leaving) gets a log line and a count all the same,
/// however soon hyper lets the request go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_half_closes_at_once_is_still_logged() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gateway = simple_gateway_with("providers:\n  a: {latency: 200ms}\n").await;
    let body = serde_json::to_string(&chat_body(true))?;
    let count = 20;
    let mut sockets = Vec::new();
    for n in 0..count {
        let mut socket = send_raw_chat(
            &gateway.api,
            &format!(
                "X-Request-Id: half-{n}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
        .await?;
        socket.shutdown().await?;
        sockets.push(socket);
    }
    for mut socket in sockets {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut rest)).await;
    }
    let log = gateway.log.clone();
    until("every request is logged", || log.lines().len() == count).await;
    let mut ids: Vec<String> = log
        .lines()
        .iter()
        .map(|line| line.request_id.to_string())
        .collect();
    ids.sort();
    let mut expected: Vec<String> = (0..count).map(|n| format!("half-{n}")).collect();
    expected.sort();
    assert_eq!(ids, expected);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_the_limit_is_refused_before_the_body_is_sent() -> TestResult {
    use tokio::io::AsyncReadExt;
    let gateway = gateway_taking_1_kib().await;

    // A client that asks before it sends, as curl does for large bodies,
    // is answered at once, not told to go ahead.
    let mut socket = send_raw_chat(
        &gateway.api,
        "Content-Length: 4096\r\nExpect: 100-continue\r\n\r\n",
    )
    .await?;
    let mut answer = vec![0; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut answer)).await??;
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("request_too_large"), "{answer}");

    // Counted (and logged) as a refusal, like every other request.
    wait_for_unrouted_request(&gateway.api, "refused", 413).await;
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

/// Opens a connection to the gateway and sends the head of a chat request
/// with the test key, ending with `rest`: more header lines, the blank
/// line, any of the body.
async fn send_raw_chat(api: &Api, rest: &str) -> std::io::Result<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let address = api.url.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(address).await?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\n\
         Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n{rest}"
    );
    socket.write_all(head.as_bytes()).await?;
    Ok(socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_gets_408() -> TestResult {
    use tokio::io::AsyncReadExt;
    let gateway = simple_setup()
        .body_idle_timeout(Duration::from_millis(300))
        .start("providers:\n  a: {}\n")
        .await;
    // A valid key, a promised 100 bytes, one sent.
    let mut socket = send_raw_chat(&gateway.api, "Content-Length: 100\r\n\r\n{").await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer)).await??;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("\"request_timeout\""), "{answer}");
    assert!(answer.contains("stopped arriving"), "{answer}");
    wait_for_unrouted_request(&gateway.api, "refused", 408).await;
    // And it no longer counts in flight.
    let metrics_url = format!("{}/metrics", gateway.api.url);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Reply::of(gateway.api.client.get(&metrics_url))
        .await
        .text
        .lines()
        .any(|line| line == "switchyard_in_flight 0")
    {
        assert!(Instant::now() < deadline, "still in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_past_the_body_timeout_gets_408() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gateway = simple_setup()
        .body_idle_timeout(Duration::from_secs(5))
        .body_timeout(Duration::from_millis(500))
        .start("providers:\n  a: {}\n")
        .await;
    // A byte every 100 ms: never idle for long, 10 s for the whole body.
    let socket = send_raw_chat(&gateway.api, "Content-Length: 100\r\n\r\n").await?;
    let (mut reading, mut writing) = socket.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if writing.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Read until the refusal is in: the connection stays open a while
    // longer, reading what the client still sends.
    let mut answer = Vec::new();
    let read_refusal = async {
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&answer).contains("request_timeout") {
            let read = reading.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..read]);
        }
        std::io::Result::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(20), read_refusal).await??;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("took longer to arrive"), "{answer}");
    trickle.abort();
    gateway.stop().await;
    Ok(())
}

/// Waits until `switchyard_requests_total` counts a request that reached
/// no provider and named no model, with this outcome and status.
async fn wait_for_unrouted_request(api: &Api, outcome: &str, status: u16) {
    let series = format!(
        r#"switchyard_requests_total{{provider="",model="",outcome="{outcome}",status="{status}"}}"#
    );
    wait_for_metric(api, &series, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_gets_the_malformed_body_error() -> TestResult {
    let one = || catalog(&[provider("a", "openai", "")], &[model("m", &["a"])]);
    let with_rule = Setup::new(
        &format!("validate {{\n  malformed body error bad_body\n}}\n{SIMPLE}"),
        r#"
  bad_body = 422, "send a JSON object"
  upstream_failed = 502, "every provider failed"
"#,
        one(),
    )
    .start("providers:\n  a: {}\n")
    .await;
    let built_in = Setup::new(SIMPLE, SIMPLE_ERRORS, one())
        .start("providers:\n  a: {}\n")
        .await;

    let not_json = |api: &Api| api.chat_text("{\"model\": \"m\", ");
    let reply = Reply::of(not_json(&with_rule.api)).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    let (code, _, message) = openai_error(&reply);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("bad_body", "send a JSON object")
    );

    // The built-in error says where the JSON breaks.
    let reply = Reply::of(not_json(&built_in.api)).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    let (code, _, message) = openai_error(&reply);
    assert_eq!(
        (code.as_str(), message.as_str()),
        (
            "invalid_request_body",
            "the request body is not valid JSON: EOF while parsing a value at line 1 column 15"
        )
    );

    // A JSON array is not a request body either.
    let reply = Reply::of(built_in.api.chat_request(&json!(["m"]))).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(
        openai_error(&reply).2,
        "the request body is not a JSON object"
    );

    // Nor is an object whose `stream` no JSON tree holds.
    let reply = Reply::of(built_in.api.chat_text(r#"{"model": "m", "stream": 1e400}"#)).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert_eq!(
        openai_error(&reply).2,
        "the request body's `stream` is out of range or not valid text: \
         number out of range at line 1 column 5 of its value"
    );

    assert!(with_rule.sim.requests().is_empty());
    assert!(built_in.sim.requests().is_empty());
    with_rule.stop().await;
    built_in.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_get_404_and_other_methods_405() -> TestResult {
    let gateway = simple_gateway().await;
    let sim = &gateway.sim;
    let api = &gateway.api;

    let reply = Reply::of(
        api.post("/v1/nothing/here", &chat_body(false))
            .bearer_auth(KEY),
    )
    .await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert_eq!(openai_error(&reply).1, "not_found_error");

    let reply = api.get("/nothing").await;
    assert_eq!(reply.status, 404, "{}", reply.text);

    let reply = Reply::of(
        api.client
            .get(format!("{}/nothing", api.url))
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert_eq!(anthropic_error(&reply).0, "not_found_error");

    let reply = api.get("/v1/chat/completions").await;
    assert_eq!(reply.status, 405, "{}", reply.text);
    assert_eq!(reply.header("allow"), Some("POST"));
    let reply = Reply::of(
        api.client
            .put(format!("{}/v1/messages", api.url))
            .bearer_auth(KEY),
    )
    .await;
    assert_eq!(reply.status, 405, "{}", reply.text);
    assert_eq!(reply.header("allow"), Some("POST"));
    assert_eq!(anthropic_error(&reply).0, "invalid_request_error");

    // The proxy's own GET paths name their method too, rather than 404.
    for path in ["/healthz", "/metrics", "/v1/models"] {
        let reply = Reply::of(
            api.client
                .post(format!("{}{path}", api.url))
                .bearer_auth(KEY),
        )
        .await;
        assert_eq!(reply.status, 405, "{path}: {}", reply.text);
        assert_eq!(reply.header("allow"), Some("GET, HEAD"), "{path}");
        // HEAD answers as GET would, without the body.
        let get = Reply::of(
            api.client
                .get(format!("{}{path}", api.url))
                .bearer_auth(KEY),
        )
        .await;
        let head = Reply::of(
            api.client
                .head(format!("{}{path}", api.url))
                .bearer_auth(KEY),
        )
        .await;
        assert_eq!(get.status, 200, "{path}: {}", get.text);
        assert_eq!(head.status, 200, "{path}: {}", head.text);
        assert!(head.text.is_empty(), "{path}: {}", head.text);
        assert_eq!(
            head.header("content-type"),
            get.header("content-type"),
            "{path}"
        );
    }

    assert!(sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_reports_the_policy_and_its_version() -> TestResult {
    let gateway = simple_gateway().await;

    let reply = Reply::of(
        gateway
            .api
            .client
            .get(format!("{}/healthz", gateway.api.url)),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let health = reply.json;
    assert_eq!(health["policy"], "proxytest");
    let version = gateway.proxy.snapshot().version.clone();
    assert!(!version.is_empty());
    assert_eq!(health["version"], json!(version));
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests() -> TestResult {
    let gateway = simple_gateway().await;

    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    // Model ids the catalog does not know are counted together: a client
    // cannot add series by making ids up.
    let made_up = format!("made-up-{}", "x".repeat(1000));
    for id in [made_up.as_str(), "made-up-too"] {
        assert_ne!(gateway.api.chat(&chat_body_for(id)).await.status, 200);
    }

    // The count is taken when the request's task ends, just after the
    // answer went out.
    let metrics_url = format!("{}/metrics", gateway.api.url);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = Reply::of(gateway.api.client.get(&metrics_url)).await;
        assert_eq!(metrics.status, 200);
        let counted = |model: &str, count: &str| {
            metrics.text.lines().any(|line| {
                line.starts_with("switchyard_requests_total{")
                    && line.contains(&format!("model=\"{model}\""))
                    && line.ends_with(count)
            })
        };
        assert!(!metrics.text.contains("made-up"), "{}", metrics.text);
        let served = metrics.text.lines().any(|line| {
            line.starts_with("switchyard_requests_total{")
                && line.contains("provider=\"a\"")
                && line.contains("model=\"m\"")
                && line.contains("status=\"200\"")
                && line.ends_with(" 1")
        });
        if served && counted("(other)", " 2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no switchyard_requests_total for the request:\n{}",
            metrics.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_lists_what_the_key_may_call() -> TestResult {
    let providers = [
        provider("a", "openai", ""),
        provider("anth", "anthropic", ""),
        // Its secret (`${UNSET_KEY}`) is not set: its model is nobody's to call.
        provider("unset", "openai", ""),
    ];
    let gateway = Setup::new(
        &format!(
            "eligibility {{\n  require empty(key.allowed_models) or model.id in key.allowed_models \
             else not_allowed\n}}\n{SIMPLE}"
        ),
        r#"
  not_allowed = 403, "this key may not call this model"
  upstream_failed = 502, "every provider failed"
"#,
        catalog(
            &providers,
            &[
                model("m", &["a"]),
                model("claude", &["anth"]),
                model("orphan", &["unset"]),
            ],
        ),
    )
    .tenants(LIMITED_TENANTS)
    .start("providers:\n  a: {}\n  anth: {}\n")
    .await;

    let ids = |reply: &Reply| -> Vec<String> {
        assert_eq!(reply.status, 200, "{}", reply.text);
        reply.json["data"]
            .as_array()
            .unwrap_or_else(|| panic!("no data list in {}", reply.text))
            .iter()
            .map(|entry| entry["id"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let models_url = format!("{}/v1/models", gateway.api.url);
    let client = &gateway.api.client;

    let all = Reply::of(client.get(&models_url).bearer_auth(KEY)).await;
    assert_eq!(ids(&all), ["m", "claude"]);
    assert_eq!(all.json["object"], "list");

    let limited = Reply::of(client.get(&models_url).bearer_auth(LIMITED_KEY)).await;
    assert_eq!(ids(&limited), ["m"]);

    let anthropic = Reply::of(
        client
            .get(&models_url)
            .header("x-api-key", LIMITED_KEY)
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(ids(&anthropic), ["m"]);
    assert_eq!(anthropic.json["has_more"], false);

    // Anthropic's list comes a page at a time, as its API's does.
    let anthropic_page = |query: &'static str| {
        Reply::of(
            client
                .get(format!("{models_url}?{query}"))
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01"),
        )
    };
    let first = anthropic_page("limit=1").await;
    assert_eq!(ids(&first), ["m"]);
    assert_eq!(first.json["has_more"], true);
    assert_eq!(
        (&first.json["first_id"], &first.json["last_id"]),
        (&json!("m"), &json!("m"))
    );
    let next = anthropic_page("limit=1&after_id=m").await;
    assert_eq!(ids(&next), ["claude"]);
    assert_eq!(next.json["has_more"], false);
    let back = anthropic_page("before_id=claude").await;
    assert_eq!(ids(&back), ["m"]);
    assert_eq!(back.json["has_more"], false);
    for query in ["limit=0", "after_id=nope", "after_id=m&before_id=claude"] {
        let refused = anthropic_page(query).await;
        assert_eq!(refused.status, 400, "{query}: {}", refused.text);
        assert_eq!(
            refused.json["error"]["type"], "invalid_request_error",
            "{query}"
        );
    }
    // OpenAI's list is whole, whatever the query.
    let whole = Reply::of(client.get(format!("{models_url}?limit=1")).bearer_auth(KEY)).await;
    assert_eq!(ids(&whole), ["m", "claude"]);

    let anonymous = Reply::of(client.get(&models_url)).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.text);

    // One model, as the list shows it (the official SDKs' `retrieve`).
    let one = Reply::of(client.get(format!("{models_url}/m")).bearer_auth(KEY)).await;
    assert_eq!(one.status, 200, "{}", one.text);
    assert_eq!(one.json, all.json["data"][0], "{}", one.text);
    let one = Reply::of(
        client
            .get(format!("{models_url}/m"))
            .header("x-api-key", LIMITED_KEY)
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(one.json, anthropic.json["data"][0], "{}", one.text);
    // A model this key may not call, one the catalog lacks, and none at
    // all: 404 in the caller's wire format.
    for (key, id) in [(LIMITED_KEY, "claude"), (KEY, "no-such-model"), (KEY, "")] {
        let missing = Reply::of(client.get(format!("{models_url}/{id}")).bearer_auth(key)).await;
        assert_eq!(missing.status, 404, "{id}: {}", missing.text);
        assert_eq!(openai_error(&missing).0, "model_not_found", "{id}");
    }
    // An id is read with its `%XX` escapes decoded, and one shaped like a
    // key is not repeated.
    let escaped = Reply::of(client.get(format!("{models_url}/%6D")).bearer_auth(KEY)).await;
    assert_eq!(escaped.json, all.json["data"][0], "{}", escaped.text);
    let pasted = "sk-proj-ABCDEFGHIJ0123456789";
    let missing = Reply::of(
        client
            .get(format!("{models_url}/{pasted}"))
            .bearer_auth(KEY),
    )
    .await;
    assert_eq!(missing.status, 404, "{}", missing.text);
    assert!(!missing.text.contains(pasted), "{}", missing.text);
    let anonymous = Reply::of(client.get(format!("{models_url}/m"))).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.text);
    let posted = Reply::of(client.post(format!("{models_url}/m")).bearer_auth(KEY)).await;
    assert_eq!(posted.status, 405, "{}", posted.text);

    // The listing matches what the key may call.
    let refused = Reply::of(
        gateway
            .api
            .post("/v1/messages", &messages_body(false))
            .header("x-api-key", LIMITED_KEY)
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    gateway.stop().await;
    Ok(())
}

// ---------------------------------------------------- 11. graceful shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_still_running_when_the_drain_time_ends_get_a_shutdown_error() -> TestResult {
    // Both outlast the stack's 5 s drain: a whole answer after a minute,
    // and a stream of a chunk a second, committed at its first.
    let sections = format!(
        "{SIMPLE}headers {{\n  \"x-served-by\" = served.provider.name\n  \"x-gateway\" = \"switchyard\"\n}}\n"
    );
    let Gateway { stack, api } = Setup::new(
        &sections,
        SIMPLE_ERRORS,
        catalog(
            &[
                provider("a", "openai", ""),
                provider("b", "openai", ""),
                provider("c", "openai", ""),
            ],
            &[
                model("m", &["a"]),
                model("streamed", &["b"]),
                model("quick", &["c"]),
            ],
        ),
    )
    .start("providers:\n  a: {latency: 60s}\n  b: {chunks: 100, chunk_interval: 1s}\n  c: {}\n")
    .await;
    // A connection to `c` waits in the pool: a request handed to it is
    // written at once.
    let mut quick = chat_body(false);
    quick["model"] = json!("quick");
    assert_eq!(api.chat(&quick).await.status, 200);
    let whole = {
        let api = api.clone();
        tokio::spawn(async move { api.chat(&chat_body(false)).await })
    };
    let stream = {
        let api = api.clone();
        let mut body = chat_body(true);
        body["model"] = json!("streamed");
        tokio::spawn(async move { api.chat(&body).await })
    };
    // A third whose body is still arriving when the drain time ends.
    let (rest_of_body, body_pieces) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let late = {
        let body = quick.to_string().into_bytes();
        let (first_half, second_half) = body.split_at(body.len() / 2);
        rest_of_body.send(first_half.to_vec())?;
        let second_half = second_half.to_vec();
        let pieces = futures_util::stream::unfold(body_pieces, |mut pieces| async move {
            let piece = pieces.recv().await?;
            Some((Ok::<_, std::io::Error>(piece), pieces))
        });
        let request = api
            .post("/v1/chat/completions", &Json::Null)
            .body(reqwest::Body::wrap_stream(pieces))
            .bearer_auth(KEY);
        (tokio::spawn(Reply::of(request)), second_half)
    };
    // The third must have reached the proxy too: sent after the listener
    // closes, it would find no one to connect to, which is not this test.
    until(
        "the sim holds both requests and the proxy the third",
        || {
            stack.sim.requests().len() == 3
                && stack
                    .proxy
                    .metrics
                    .render()
                    .lines()
                    .any(|line| line == "switchyard_in_flight 3")
        },
    )
    .await;
    let proxy = stack.proxy.clone();
    let shutdown = tokio::spawn(stack.running.shutdown());
    until("the drain time ends", || proxy.drain_over()).await;
    rest_of_body.send(late.1)?;
    drop(rest_of_body);
    // Its exchange starts after the cut: refused before any provider is
    // called.
    let reply = late.0.await?;
    reply.openai_error(503, "shutting_down", "api_error");
    // The policy's headers, as on any error; no provider had been tried.
    assert_eq!(reply.header("x-gateway"), Some("switchyard"));
    assert_eq!(reply.header("x-served-by"), None);
    shutdown.await?;
    assert_eq!(stack.sim.requests().len(), 3);

    // Not a closed connection: the error, in the caller's wire format.
    let reply = whole.await?;
    reply.openai_error(503, "shutting_down", "api_error");
    assert_eq!(reply.header("x-gateway"), Some("switchyard"));
    assert_eq!(
        reply.header("x-served-by"),
        Some("a"),
        "the provider being tried"
    );
    // The stream's headers went out with its first chunk: it ends with an
    // error event, and no `[DONE]`.
    let reply = stream.await?;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let streamed = reply.streamed_text();
    assert!(!streamed.is_empty(), "{}", reply.text);
    assert!("hello from b".starts_with(&streamed), "{}", reply.text);
    let events = sse_events(&reply.text);
    let last = events.last().copied().unwrap_or_default();
    let error = event_json(last).unwrap_or_else(|| panic!("the last event is not JSON: {last}"));
    assert_eq!(error["error"]["code"], "shutting_down", "{}", reply.text);
    assert!(!reply.text.contains("[DONE]"), "{}", reply.text);

    // Counted under who had begun to answer: nobody for the whole answer;
    // the stream's headers had said 200.
    let metrics = stack.proxy.metrics.render();
    assert!(
        metrics.contains(
            r#"switchyard_requests_total{provider="",model="m",outcome="shutdown",status="503"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"switchyard_requests_total{provider="b",model="streamed",outcome="shutdown",status="200"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"switchyard_requests_total{provider="",model="quick",outcome="shutdown",status="503"} 1"#
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("outcome=\"cancelled\""), "{metrics}");
    stack.sim.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_stream_cut_at_the_end_of_the_drain_still_ends_as_an_answer() -> TestResult {
    // The provider sends the whole answer but never ends it; on the proxy's
    // manual clock the grace it gives such an end never runs out, so the
    // drain's end finds the answer finished and waiting.
    let Gateway { stack, api } = simple_setup()
        .clock(Arc::new(ManualClock::default()))
        .start("providers:\n  a: {sequence: [\"200 linger\"]}\n")
        .await;
    let stream = {
        let api = api.clone();
        tokio::spawn(async move { api.chat(&chat_body(true)).await })
    };
    until("the sim holds the stream", || {
        stack.sim.requests().len() == 1
    })
    .await;
    stack.running.shutdown().await;
    let reply = stream.await?;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from a");
    assert_eq!(
        sse_events(&reply.text).last(),
        Some(&"data: [DONE]"),
        "{}",
        reply.text
    );
    let metrics = stack.proxy.metrics.render();
    assert!(
        metrics.contains(
            r#"switchyard_requests_total{provider="a",model="m",outcome="served",status="200"} 1"#
        ),
        "{metrics}"
    );
    stack.sim.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_requests_in_flight_and_refuses_new_connections() -> TestResult {
    // A whole answer after 500 ms; a stream of 5 chunks 100 ms apart.
    let Gateway { stack, api } = Setup::new(
        SIMPLE,
        SIMPLE_ERRORS,
        catalog(
            &[provider("a", "openai", ""), provider("b", "openai", "")],
            &[model("m", &["a"]), model("streamed", &["b"])],
        ),
    )
    .start("providers:\n  a: {latency: 500ms}\n  b: {chunks: 5, chunk_interval: 100ms}\n")
    .await;

    let whole = {
        let api = api.clone();
        tokio::spawn(async move { api.chat(&chat_body(false)).await })
    };
    let stream = {
        let api = api.clone();
        let mut body = chat_body(true);
        body["model"] = json!("streamed");
        tokio::spawn(async move { api.chat(&body).await })
    };
    until("the sim sees both requests", || {
        stack.sim.requests().len() == 2
    })
    .await;

    // Only the proxy stops: the simulated providers keep answering.
    stack.running.shutdown().await;
    let reply = whole.await?;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.chat_text(), "hello from a");
    let reply = stream.await?;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b");
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));

    // A new client, so no pooled connection can be reused.
    let refused = client()
        .post(format!("{}/v1/chat/completions", api.url))
        .bearer_auth(KEY)
        .body(chat_body(false).to_string())
        .send()
        .await;
    match refused {
        Ok(response) => panic!("served after shutdown: {}", response.status()),
        Err(error) => assert!(error.is_connect(), "{error}"),
    }
    stack.sim.shutdown().await;
    Ok(())
}

// ------------------------------------------- streams the sim does not send

/// Every failure before the first event fails over; after it, a stream
/// that breaks stops with `broken_stream`. No stall is reached by chance:
/// the idle timeout is long.
const PATIENT_STREAMS: &str = r#"
timeouts {
  idle 10s
}
failover {
  attempts 2
  on stream_broken => stop, error broken_stream
  on 5xx, connect_error, reset, timeout, first_token_timeout, malformed => next, error upstream_failed
  on any => stop, error upstream_failed
}
"#;

/// How a hand-written provider's stream goes on after its last piece.
#[derive(Clone, Copy)]
enum Then {
    /// Waits this long, then ends the chunked body properly.
    EndAfter(Duration),
    /// Closes the connection without ending the chunked body.
    Cut,
}

/// A provider written by hand, for streams the sim does not send: every
/// request gets a `200` stream of `pieces`, each written as one chunk
/// after waiting its milliseconds, then what `then` says. Its base URL.
async fn scripted_provider(pieces: &[(u64, &str)], then: Then) -> String {
    typed_provider("text/event-stream", pieces, then).await
}

/// [`scripted_provider`] with its `200` answer sent as `content_type`.
async fn typed_provider(content_type: &str, pieces: &[(u64, &str)], then: Then) -> String {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    answering_provider(&head, pieces, then).await
}

/// A provider written by hand that answers every request with `head`
/// (the status line and headers, and a body the sim cannot send), then
/// `pieces` as chunks and what `then` says. Its base URL.
async fn answering_provider(answer_head: &str, pieces: &[(u64, &str)], then: Then) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answer_head: Arc<str> = Arc::from(answer_head);
    let pieces: Vec<(u64, String)> = pieces
        .iter()
        .map(|(wait, text)| (*wait, text.to_string()))
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (answer_head, pieces) = (answer_head.clone(), pieces.clone());
            tokio::spawn(async move {
                // The request: its head, then as many bytes as it says.
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                let head_end = loop {
                    let read = socket.read(&mut buffer).await?;
                    if read == 0 {
                        return Ok::<_, std::io::Error>(());
                    }
                    request.extend_from_slice(&buffer[..read]);
                    if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse().ok())
                    .unwrap_or(0);
                while request.len() < head_end + length {
                    let read = socket.read(&mut buffer).await?;
                    if read == 0 {
                        return Ok(());
                    }
                    request.extend_from_slice(&buffer[..read]);
                }
                socket.write_all(answer_head.as_bytes()).await?;
                for (wait, text) in pieces {
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    let chunk = format!("{:x}\r\n{text}\r\n", text.len());
                    socket.write_all(chunk.as_bytes()).await?;
                }
                if let Then::EndAfter(wait) = then {
                    tokio::time::sleep(wait).await;
                    socket.write_all(b"0\r\n\r\n").await?;
                }
                Ok(())
            });
        }
    });
    format!("http://{address}/v1")
}

/// A catalog provider at `base_url`, with one credential.
fn provider_at(id: &str, format: &str, base_url: &str) -> String {
    provider(id, format, "").replace(&format!("http://{{sim}}/{id}/v1"), base_url)
}

/// `a`, a hand-written provider playing `pieces` then `then`, and `b`, a
/// simulated one answering normally, both serving model `m`, `a` first.
async fn scripted_then_b(pieces: &[(u64, &str)], then: Then) -> Gateway {
    scripted_then_b_under(PATIENT_STREAMS, STREAM_ERRORS, pieces, then).await
}

/// The same under the policy's own `sections` and `errors`.
async fn scripted_then_b_under(
    sections: &str,
    errors: &str,
    pieces: &[(u64, &str)],
    then: Then,
) -> Gateway {
    let a = scripted_provider(pieces, then).await;
    hand_written_a_then_b(&a, sections, errors).await
}

/// [`a_then_b`] with `a` a hand-written provider at `a_url`, under the
/// policy's own `sections` and `errors`.
async fn hand_written_a_then_b(a_url: &str, sections: &str, errors: &str) -> Gateway {
    Setup::new(
        sections,
        errors,
        a_then_b().replace("http://{sim}/a/v1", a_url),
    )
    .start("providers:\n  b: {}\n")
    .await
}

/// A chat chunk of choice `index`: some `content`, or its finish reason.
fn choice_chunk(index: u32, content: Option<&str>) -> String {
    match content {
        Some(text) => chat_chunk(index, json!({"content": text}), Json::Null),
        None => chat_chunk(index, json!({}), json!("stop")),
    }
}

/// A chat chunk of choice `index` with this `delta` and `finish_reason`.
fn chat_chunk(index: u32, delta: Json, finish: Json) -> String {
    let chunk = json!({
        "object": "chat.completion.chunk",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {chunk}\n\n")
}

/// The content a chat stream gave choice `index`, joined.
fn choice_text(text: &str, index: u64) -> String {
    sse_events(text)
        .iter()
        .filter_map(|event| event_json(event))
        .filter_map(|data| {
            let choice = data["choices"].as_array()?.first()?.clone();
            (choice["index"].as_u64() == Some(index))
                .then(|| {
                    choice
                        .pointer("/delta/content")?
                        .as_str()
                        .map(str::to_string)
                })
                .flatten()
        })
        .collect()
}

/// Two choices: both begin, choice 0 finishes first.
fn two_choices_begun() -> Vec<String> {
    vec![
        choice_chunk(0, Some("zero")),
        choice_chunk(1, Some("one")),
        choice_chunk(0, None),
    ]
}

fn two_choices_body() -> Json {
    let mut body = chat_body(true);
    body["n"] = json!(2);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_two_choices_cut_after_the_first_finished_ends_with_an_error_event()
-> TestResult {
    let begun = two_choices_begun();
    let pieces: Vec<(u64, &str)> = begun.iter().map(|chunk| (0, chunk.as_str())).collect();
    let gateway = scripted_then_b(&pieces, Then::Cut).await;
    let reply = gateway.api.chat(&two_choices_body()).await;
    // Choice 1 never finished: the answer is not complete.
    assert_ends_with_broken_stream_error(&reply);
    assert_eq!(choice_text(&reply.text, 1), "one");
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_two_choices_waits_past_the_first_finish_for_the_second() -> TestResult {
    let begun = two_choices_begun();
    let (more, last) = (choice_chunk(1, Some(" more")), choice_chunk(1, None));
    let mut pieces: Vec<(u64, &str)> = begun.iter().map(|chunk| (0, chunk.as_str())).collect();
    // Longer than the grace a finished stream gets, shorter than the idle
    // timeout.
    pieces.push((1500, &more));
    pieces.push((0, &last));
    // Then the provider lingers without `[DONE]`.
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::from_secs(60))).await;
    let reply = gateway.api.chat(&two_choices_body()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(choice_text(&reply.text, 0), "zero", "{}", reply.text);
    assert_eq!(choice_text(&reply.text, 1), "one more", "{}", reply.text);
    // Both finished: the end is added promptly, not after the idle timeout.
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
    assert!(
        reply.elapsed < Duration::from_secs(8),
        "{:?}",
        reply.elapsed
    );
    gateway.stop().await;
    Ok(())
}

/// A legacy completion chunk of choice `index`: some `text`, or its finish.
fn completion_chunk(index: u32, text: Option<&str>) -> String {
    let chunk = json!({
        "object": "text_completion",
        "choices": [{
            "index": index,
            "text": text.unwrap_or(""),
            "finish_reason": if text.is_some() { Json::Null } else { json!("stop") },
        }],
    });
    format!("data: {chunk}\n\n")
}

/// A completion of a list of prompts has a choice for each (numbered on,
/// `n` each): it was held finished once choice 0 was, so the proxy ended
/// it with `[DONE]` half a second later, dropping the rest of choice 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_of_two_prompts_waits_for_both_choices() -> TestResult {
    let pieces = [
        completion_chunk(0, Some("A1")),
        completion_chunk(1, Some("B1 ")),
        completion_chunk(0, None),
        completion_chunk(1, Some("B2")),
        completion_chunk(1, None),
    ];
    // Choice 1 goes on after longer than the grace a finished stream gets.
    let waits = [0, 0, 0, 1500, 0];
    let pieces: Vec<(u64, &str)> = waits
        .into_iter()
        .zip(pieces.iter().map(String::as_str))
        .collect();
    let a = scripted_provider(&pieces, Then::EndAfter(Duration::from_secs(60))).await;
    let catalog = a_then_b()
        .replace("http://{sim}/a/v1", &a)
        .replace("kind: chat", "kind: completion");
    let gateway = Setup::new(PATIENT_STREAMS, STREAM_ERRORS, catalog)
        .start("providers:\n  b: {}\n")
        .await;
    let body = json!({"model": "m", "prompt": ["a", "b"], "stream": true});
    let reply = Reply::of(gateway.api.post("/v1/completions", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let text_of = |index: u64| -> String {
        sse_events(&reply.text)
            .iter()
            .filter_map(|event| event_json(event))
            .filter_map(|data| data["choices"].as_array().cloned())
            .flatten()
            .filter(|choice| choice["index"] == index)
            .filter_map(|choice| choice["text"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(text_of(0), "A1", "{}", reply.text);
    assert_eq!(text_of(1), "B1 B2", "{}", reply.text);
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
    gateway.stop().await;
    Ok(())
}

/// An empty `finish_reason` is no finish: read as one, the proxy ended a
/// healthy stream half a second after its first chunk with `[DONE]`, and
/// passed a stream cut after it off as complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_finish_reason_does_not_finish_a_stream() -> TestResult {
    // `""` on every chunk before the last, as some OpenAI-compatible
    // servers send.
    let empty_finish = |text: &str| chat_chunk(0, json!({"content": text}), json!(""));
    let (one, two) = (empty_finish("one "), empty_finish("two"));
    let last = choice_chunk(0, None);
    // Longer than the grace a finished stream gets.
    let pieces = [(0, one.as_str()), (1500, two.as_str()), (0, last.as_str())];
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::from_secs(60))).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(choice_text(&reply.text, 0), "one two", "{}", reply.text);
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
    gateway.stop().await;

    let gateway = scripted_then_b(&[(0, one.as_str()), (0, two.as_str())], Then::Cut).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_ends_with_broken_stream_error(&reply);
    assert_eq!(choice_text(&reply.text, 0), "one two", "{}", reply.text);
    gateway.stop().await;
    Ok(())
}

/// Some relays (Gemini behind OpenAI-compatible gateways) send a finish
/// reason with every chunk. Read as the answer's end, the proxy ended the
/// stream half a second after a pause with `[DONE]`, dropping the rest, and
/// passed a cut off as complete. Output after a finish shows the finishes
/// mean nothing: then only the stream's own end ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_after_a_finish_makes_the_stream_wait_for_its_own_end() -> TestResult {
    let chunks: Vec<String> = ["", "t0", "t1", "t2"]
        .into_iter()
        .map(|text| chat_chunk(0, json!({"content": text}), json!("stop")))
        .collect();
    // A pause longer than the grace a finished stream gets, after `t0`.
    let pieces = [
        (0, chunks[0].as_str()),
        (0, chunks[1].as_str()),
        (1500, chunks[2].as_str()),
        (0, chunks[3].as_str()),
        (0, "data: [DONE]\n\n"),
    ];
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::ZERO)).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(choice_text(&reply.text, 0), "t0t1t2", "{}", reply.text);
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
    assert_eq!(
        sse_events(&reply.text)
            .iter()
            .filter(|e| **e == "data: [DONE]")
            .count(),
        1
    );
    gateway.stop().await;

    // Cut after `t0`: not complete.
    let gateway = scripted_then_b(&pieces[..2], Then::Cut).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_ends_with_broken_stream_error(&reply);
    assert_eq!(choice_text(&reply.text, 0), "t0", "{}", reply.text);
    gateway.stop().await;

    // A finish on the first chunk of output, then a pause: no early end,
    // and a body that ends cleanly after the last finish ends the answer.
    let pieces = [
        (0, chunks[1].as_str()),
        (1500, chunks[2].as_str()),
        (0, chunks[3].as_str()),
    ];
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::ZERO)).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(choice_text(&reply.text, 0), "t0t1t2", "{}", reply.text);
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
    gateway.stop().await;

    // Numbers are no output: a tool call's index after its finish leaves
    // the answer finished, and a provider that lingers is ended promptly.
    let call = |delta: Json, finish: Json| chat_chunk(0, delta, finish);
    let started = call(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "f", "arguments": "{}"}}]}),
        Json::Null,
    );
    let finished = call(json!({}), json!("tool_calls"));
    let after = call(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}),
        Json::Null,
    );
    let pieces = [
        (0, started.as_str()),
        (0, finished.as_str()),
        (0, after.as_str()),
    ];
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::from_secs(60))).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(
        sse_events(&reply.text).last(),
        Some(&"data: [DONE]"),
        "{}",
        reply.text
    );
    assert!(
        reply.elapsed < Duration::from_secs(8),
        "{:?}",
        reply.elapsed
    );
    gateway.stop().await;
    Ok(())
}

/// A hand-written Anthropic stream's opening event.
const START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":\
     {\"id\":\"msg_from_a\",\"type\":\"message\",\"role\":\"assistant\",\
     \"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n";
/// And the rest of it: the answer `hello from a`, its stop and its end.
const ANSWER: [&str; 5] = [
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\
     \"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\
     \"delta\":{\"type\":\"text_delta\",\"text\":\"hello from a\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":\
     {\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
];

/// `a`, an Anthropic-format provider written by hand that plays `pieces`
/// then cuts the connection, and `b`, a simulated one, both serving `m`.
async fn anthropic_a_then_b(pieces: Vec<(u64, &str)>) -> Gateway {
    let a = scripted_provider(&pieces, Then::Cut).await;
    Setup::new(
        PATIENT_STREAMS,
        STREAM_ERRORS,
        catalog(
            &[
                provider_at("a", "anthropic", &a),
                provider("b", "anthropic", ""),
            ],
            &[model("m", &["a", "b"])],
        ),
    )
    .start("providers:\n  b: {}\n")
    .await
}

/// A streamed Anthropic request for `m`.
fn anthropic_stream_body() -> Json {
    json!({"model": "m", "max_tokens": 16, "stream": true, "messages": []})
}

/// Some Anthropic-format relays (GitHub Copilot's) end a finished stream
/// with OpenAI's `data: [DONE]`: it was malformed, and the whole answer
/// ended with an error event. A single event of several MiB (an image) is
/// an event like any other: over 4 MiB one broke the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_anthropic_stream_may_end_with_done_and_events_may_be_large() -> TestResult {
    let mut pieces: Vec<(u64, &str)> = vec![(0, START)];
    pieces.extend(ANSWER[..4].iter().map(|event| (0, *event)));
    pieces.push((0, "data: [DONE]\n\n"));
    let gateway = anthropic_a_then_b(pieces).await;
    let reply = gateway.api.messages(&anthropic_stream_body()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from a", "{}", reply.text);
    assert!(
        reply
            .text
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{}",
        reply.text
    );
    assert!(
        !reply.text.contains("[DONE]") && !reply.text.contains("event: error"),
        "{}",
        reply.text
    );
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;

    // Before the stop, `[DONE]` is no end: the answer is not whole.
    let mut pieces: Vec<(u64, &str)> = vec![(0, START)];
    pieces.extend(ANSWER[..2].iter().map(|event| (0, *event)));
    pieces.push((0, "data: [DONE]\n\n"));
    let gateway = anthropic_a_then_b(pieces).await;
    let reply = gateway.api.messages(&anthropic_stream_body()).await;
    assert!(reply.text.contains("event: error"), "{}", reply.text);
    gateway.stop().await;

    // One event of 5 MiB.
    let large = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\
         \"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n",
        "x".repeat(5 << 20)
    );
    let mut pieces: Vec<(u64, &str)> = vec![(0, START), (0, ANSWER[0]), (0, &large)];
    pieces.extend(ANSWER[2..].iter().map(|event| (0, *event)));
    let gateway = anthropic_a_then_b(pieces).await;
    let reply = gateway.api.messages(&anthropic_stream_body()).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.streamed_text().len(), 5 << 20);
    assert!(
        reply
            .text
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    );
    gateway.stop().await;
    Ok(())
}

/// Keep-alives before an answer begins (Anthropic's `ping`, SSE comments)
/// are not held for it: they reached the client all at once when the
/// answer came, and a provider sending them as fast as it could grew the
/// proxy's memory for as long as the first token's limit. What announces
/// the answer is held up to 64 MiB, as much as a whole answer may hold (a
/// Responses stream repeats large instructions in several announcements);
/// a stream that announces more before any of it is malformed and fails
/// over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_before_the_answer_are_not_held_and_announcements_are_bounded() -> TestResult {
    const PING: &str = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
    let start = anthropic_a_then_b;
    let body = anthropic_stream_body();

    // 200 pings and comments, then the answer: it comes with none of them.
    let mut pieces = vec![(0, START)];
    for _ in 0..100 {
        pieces.extend([(0, PING), (0, ": keep-alive\n\n")]);
    }
    pieces.extend(ANSWER.map(|event| (0, event)));
    let gateway = start(pieces).await;
    let reply = gateway.api.messages(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from a", "{}", reply.text);
    assert!(reply.text.contains("msg_from_a"), "{}", reply.text);
    assert!(!reply.text.contains("ping"), "{}", reply.text);
    assert!(!reply.text.contains("keep-alive"), "{}", reply.text);
    gateway.stop().await;

    // Announcements of 3 MiB each.
    let padded: &'static str = Box::leak(
        format!(
            "event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\
             \"content_block\":{{\"type\":\"text\",\"text\":\"{}\"}}}}\n\n",
            "x".repeat(3 << 20)
        )
        .into_boxed_str(),
    );
    let announced = |count: usize| {
        let mut pieces = vec![(0, START)];
        pieces.extend(std::iter::repeat_n((0, padded), count));
        pieces.extend(ANSWER.map(|event| (0, event)));
        pieces
    };

    // Two of them, 6 MiB in all: the answer is served.
    let gateway = start(announced(2)).await;
    let reply = gateway.api.messages(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from a", "{}", reply.text);
    gateway.stop().await;

    // 22 of them, more than 64 MiB, before the answer: b answers.
    let pieces = announced(22);
    let gateway = start(pieces).await;
    let reply = gateway.api.messages(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b", "{}", reply.text);
    assert!(!reply.text.contains("msg_from_a"), "{}", reply.text);
    assert_eq!(gateway.sim.requests().len(), 1);
    gateway.stop().await;
    Ok(())
}

/// Events that only announce an answer (Anthropic's `message_start`, the
/// Responses API's `response.created`) come at once, before the provider
/// generates anything: they are held with the answer's first event, so a
/// failure after them still fails over, and the first token's limit runs
/// until the answer itself begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_fails_after_its_opening_events_still_fails_over() -> TestResult {
    let opened = [
        (
            0,
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":\
             {\"id\":\"msg_from_a\",\"type\":\"message\",\"role\":\"assistant\",\
             \"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
        ),
        (0, "event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        (
            200,
            "event: error\ndata: {\"type\":\"error\",\"error\":\
             {\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        ),
    ];
    let sections = format!("{PATIENT_STREAMS}\ntimeouts {{\n  first_token 1s\n}}\n")
        .replace("timeouts {\n  idle 10s\n}\n", "");
    let start = |pieces: Vec<(u64, &'static str)>, then: Then, format: &'static str| {
        let sections = sections.clone();
        async move {
            let a = scripted_provider(&pieces, then).await;
            Setup::new(
                &sections,
                STREAM_ERRORS,
                catalog(
                    &[provider_at("a", format, &a), provider("b", format, "")],
                    &[model("m", &["a", "b"])],
                ),
            )
            .start("providers:\n  b: {}\n")
            .await
        }
    };

    // An error event after `message_start`: b answers, and nothing of a's
    // reached the client.
    let gateway = start(opened.to_vec(), Then::Cut, "anthropic").await;
    let body = json!({"model": "m", "max_tokens": 16, "stream": true, "messages": []});
    let reply = gateway.api.messages(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b", "{}", reply.text);
    assert!(!reply.text.contains("msg_from_a"), "{}", reply.text);
    assert_eq!(gateway.sim.requests().len(), 1);
    gateway.stop().await;

    // `message_start`, then nothing within the first token's limit.
    let silent = Then::EndAfter(Duration::from_secs(30));
    let gateway = start(opened[..2].to_vec(), silent, "anthropic").await;
    let began = Instant::now();
    let reply = gateway.api.messages(&body).await;
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b", "{}", reply.text);
    assert!(!reply.text.contains("msg_from_a"), "{}", reply.text);
    gateway.stop().await;

    // `response.created`, then `response.failed`.
    let created = [
        (
            0,
            "event: response.created\ndata: {\"type\":\"response.created\",\
             \"response\":{\"id\":\"resp_from_a\",\"status\":\"in_progress\"}}\n\n",
        ),
        (
            200,
            "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":\
             {\"id\":\"resp_from_a\",\"status\":\"failed\",\
             \"error\":{\"code\":\"server_error\",\"message\":\"down\"}}}\n\n",
        ),
    ];
    let gateway = start(created.to_vec(), Then::Cut, "openai").await;
    let body = json!({"model": "m", "input": "Hello", "stream": true});
    let reply = Reply::of(gateway.api.post("/v1/responses", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b", "{}", reply.text);
    assert!(!reply.text.contains("resp_from_a"), "{}", reply.text);
    gateway.stop().await;

    // Opened, then ended at once without output: the provider's own end,
    // passed on, not a failure.
    let ended = [
        created[0],
        (
            0,
            "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":\
             {\"id\":\"resp_from_a\",\"status\":\"incomplete\",\
             \"incomplete_details\":{\"reason\":\"content_filter\"}}}\n\n",
        ),
    ];
    let gateway = start(ended.to_vec(), Then::EndAfter(Duration::ZERO), "openai").await;
    let reply = Reply::of(gateway.api.post("/v1/responses", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let last = sse_events(&reply.text).last().copied().unwrap_or_default();
    assert_eq!(
        event_name(last),
        Some("response.incomplete"),
        "{}",
        reply.text
    );
    assert!(reply.text.contains("resp_from_a"), "{}", reply.text);
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_chunk_asked_for_is_waited_for_after_the_last_finish() -> TestResult {
    let usage = json!({
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    });
    let (content, finish) = (choice_chunk(0, Some("hi")), choice_chunk(0, None));
    let usage = format!("data: {usage}\n\n");
    // The usage comes later than the grace of an answer that finished.
    let pieces = [
        (0, content.as_str()),
        (0, finish.as_str()),
        (1500, usage.as_str()),
        (0, "data: [DONE]\n\n"),
    ];
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::ZERO)).await;
    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let reply = gateway.api.chat(&body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let events = sse_events(&reply.text);
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{}", reply.text);
    let reported = events
        .iter()
        .filter_map(|event| event_json(event))
        .find_map(|data| data["usage"]["completion_tokens"].as_u64());
    assert_eq!(reported, Some(7), "{}", reply.text);
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_ending_incomplete_is_passed_on_as_its_end() -> TestResult {
    let pieces = [
        (
            0,
            "event: response.created\ndata: {\"type\":\"response.created\",\
             \"response\":{\"id\":\"r\",\"status\":\"in_progress\"}}\n\n",
        ),
        (
            0,
            "event: response.output_text.delta\ndata: \
             {\"type\":\"response.output_text.delta\",\"delta\":\"cut short\"}\n\n",
        ),
        (
            0,
            "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\
             \"response\":{\"id\":\"r\",\"status\":\"incomplete\",\
             \"incomplete_details\":{\"reason\":\"max_output_tokens\"},\
             \"usage\":{\"input_tokens\":5,\"output_tokens\":16}}}\n\n",
        ),
    ];
    let gateway = scripted_then_b(&pieces, Then::EndAfter(Duration::ZERO)).await;
    let body = json!({"model": "m", "input": "Hello", "stream": true});
    let reply = Reply::of(gateway.api.post("/v1/responses", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "cut short", "{}", reply.text);
    // The provider's own end, a normal one, and no error after it.
    let last = sse_events(&reply.text).last().copied().unwrap_or_default();
    assert_eq!(
        event_name(last),
        Some("response.incomplete"),
        "{}",
        reply.text
    );
    let data = event_json(last).unwrap_or_default();
    assert_eq!(
        data["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    // Served, with the usage it reported.
    let log = gateway.log.clone();
    until("the request is logged", || log.lines().len() == 1).await;
    let line = &log.lines()[0];
    assert_eq!((line.outcome, line.error()), ("served", ""));
    let exchange = line.exchange.as_ref().unwrap();
    assert_eq!(exchange.tokens(), Some((5, 16)));
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

/// A stream cut after the commit is logged with the usage the provider
/// reported before the cut (an Anthropic stream reports its input tokens
/// first): those tokens were spent, and billing reads the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_commit_is_logged_with_the_usage_reported() -> TestResult {
    let first = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\
                 \"delta\":{\"content\":\"par\"},\"finish_reason\":null}],\
                 \"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\n";
    let gateway = scripted_then_b(&[(0, first)], Then::Cut).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "par", "{}", reply.text);
    let log = gateway.log.clone();
    until("the request is logged", || log.lines().len() == 1).await;
    let line = &log.lines()[0];
    assert_eq!(line.outcome, "error", "{line:?}");
    assert_eq!(line.exchange.as_ref().unwrap().tokens(), Some((7, 1)));
    assert!(gateway.sim.requests().is_empty(), "nothing fails over");
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_is_only_its_end_is_malformed_and_fails_over() -> TestResult {
    let gateway = scripted_then_b(&[(0, "data: [DONE]\n\n")], Then::EndAfter(Duration::ZERO)).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_b_answered(&reply, true);
    assert_eq!(providers_seen(&gateway.sim.requests()), ["b"]);
    gateway.stop().await;

    // The Responses API's end as its first event is no answer either.
    let completed = "event: response.completed\ndata: {\"type\":\"response.completed\",\
                     \"response\":{\"id\":\"r\",\"status\":\"completed\",\"output\":[]}}\n\n";
    let gateway = scripted_then_b(&[(0, completed)], Then::EndAfter(Duration::ZERO)).await;
    let body = json!({"model": "m", "input": "Hello", "stream": true});
    let reply = Reply::of(gateway.api.post("/v1/responses", &body).bearer_auth(KEY)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from b", "{}", reply.text);
    assert_eq!(providers_seen(&gateway.sim.requests()), ["b"]);
    gateway.stop().await;
    Ok(())
}

/// Asked for a stream, some servers send its events as `text/plain` or
/// NDJSON: the proxy waited for the whole body, took it for a whole answer
/// that was no JSON, and failed over to a second generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sent_under_another_type_is_read_as_a_stream() -> TestResult {
    let chunks = [
        choice_chunk(0, Some("plain ")),
        choice_chunk(0, Some("stream")),
        choice_chunk(0, None),
    ];
    let mut pieces: Vec<(u64, &str)> = chunks.iter().map(|chunk| (0, chunk.as_str())).collect();
    pieces.push((0, "data: [DONE]\n\n"));
    let a = typed_provider("text/plain", &pieces, Then::EndAfter(Duration::ZERO)).await;
    let gateway = hand_written_a_then_b(&a, PATIENT_STREAMS, STREAM_ERRORS).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(
        choice_text(&reply.text, 0),
        "plain stream",
        "{}",
        reply.text
    );
    assert!(gateway.sim.requests().is_empty(), "no second generation");
    gateway.stop().await;

    // A body that holds no event is malformed, not a dropped connection,
    // and fails over.
    let page = [(0, "<html><body>502 Bad Gateway</body></html>")];
    let a = typed_provider("text/plain", &page, Then::EndAfter(Duration::ZERO)).await;
    let gateway = hand_written_a_then_b(&a, PATIENT_STREAMS, STREAM_ERRORS).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_b_answered(&reply, true);
    let log = gateway.log.clone();
    until("the request is logged", || log.lines().len() == 1).await;
    let attempts = format!("{:?}", log.lines()[0]);
    assert!(attempts.contains("malformed"), "{attempts}");
    gateway.stop().await;
    Ok(())
}

/// A provider that ignores `"stream": true` and sends a whole answer:
/// passed on, every official SDK's stream iterator read it as no events
/// and ended silently empty. It is `malformed`, and fails over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_to_a_request_for_a_stream_is_malformed_and_fails_over() -> TestResult {
    let whole = json!({
        "id": "chatcmpl-a",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole from a"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    })
    .to_string();
    let a = typed_provider(
        "application/json",
        &[(0, &whole)],
        Then::EndAfter(Duration::ZERO),
    )
    .await;
    let gateway = hand_written_a_then_b(&a, PATIENT_STREAMS, STREAM_ERRORS).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_b_answered(&reply, true);
    assert_eq!(providers_seen(&gateway.sim.requests()), ["b"]);
    // Asked for a whole answer, the same is served.
    let reply = gateway.api.chat(&chat_body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(reply.text.contains("whole from a"), "{}", reply.text);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_stream_in_one_chunk_is_served() -> TestResult {
    let whole = [
        choice_chunk(0, Some("all at once")),
        choice_chunk(0, None),
        String::from("data: [DONE]\n\n"),
    ]
    .concat();
    let gateway = scripted_then_b(&[(0, &whole)], Then::EndAfter(Duration::ZERO)).await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "all at once", "{}", reply.text);
    assert_eq!(sse_events(&reply.text).last(), Some(&"data: [DONE]"));
    assert!(gateway.sim.requests().is_empty());
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_sending_only_comments_still_meets_the_first_token_deadline() -> TestResult {
    // A comment every 20 ms for 4 s: upstream chunks keep coming, but none
    // begins the answer before `a`'s 500 ms deadline.
    let pieces: Vec<(u64, &str)> = (0..200).map(|_| (20, ": keep-alive\n\n")).collect();
    let a = scripted_provider(&pieces, Then::EndAfter(Duration::ZERO)).await;
    let gateway = hand_written_a_then_b(
        &a,
        &only_fails_over_on("first_token_timeout"),
        OUTCOME_ERRORS,
    )
    .await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_b_answered(&reply, true);
    assert!(
        reply.elapsed < Duration::from_secs(3),
        "{:?}",
        reply.elapsed
    );
    gateway.stop().await;
    Ok(())
}

/// A client that stops reading a stream does not hold its attempt past the
/// attempt's time: the exchange runs only as the client takes events, so
/// its connection is closed (a second later), the request ends as
/// cancelled and the provider's stream is let go. The same with
/// `after_commit null`, which lifts the limit for a client that reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_stream_loses_it_when_the_attempt_time_is_up() -> TestResult {
    for after_commit in ["", "stream {\n  after_commit null\n}\n"] {
        let sections = PATIENT_STREAMS.replace("timeouts {\n", "timeouts {\n  attempt 1500ms\n")
            + after_commit;
        stop_reading_a_stream(&sections).await?;
    }
    Ok(())
}

/// Without an attempt time or a budget, a client that stops reading a
/// stream loses it once it has taken no event for the stream's `idle`
/// limit (at least the proxy's floor for it, five minutes unless lowered, as
/// here) and a second more: before, it held the stream and its provider's
/// room for as long as it kept the connection open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_stream_loses_it_after_the_idle_limit() -> TestResult {
    assert!(PATIENT_STREAMS.contains("  idle 10s\n"));
    let sections = PATIENT_STREAMS.replace("  idle 10s\n", "  idle 1s\n");
    stop_reading_a_stream_under(&sections, Duration::from_millis(500)).await
}

/// Opens a stream under `sections` whose provider sends far more than the
/// sockets hold, reads its first bytes only, and expects the request to end
/// as cancelled within 8 s.
async fn stop_reading_a_stream(sections: &str) -> TestResult {
    stop_reading_a_stream_under(sections, Limits::default().stream_client_stall).await
}

/// [`stop_reading_a_stream`], with the proxy's floor for a stream client's
/// stall at `stall`.
async fn stop_reading_a_stream_under(sections: &str, stall: Duration) -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Far more than the sockets between provider, proxy and client hold.
    let event = choice_chunk(0, Some(&"x".repeat(16 << 10)));
    let pieces: Vec<(u64, &str)> = (0..2_000).map(|_| (0, event.as_str())).collect();
    let a = scripted_provider(&pieces, Then::EndAfter(Duration::ZERO)).await;
    let mut setup = Setup::new(
        sections,
        STREAM_ERRORS,
        a_then_b().replace("http://{sim}/a/v1", &a),
    );
    setup.options.limits.stream_client_stall = stall;
    let gateway = setup.start("providers:\n  b: {}\n").await;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut stream = socket
        .connect(gateway.api.url.trim_start_matches("http://").parse()?)
        .await?;
    let body = serde_json::to_string(&chat_body(true))?;
    stream
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n\
                 Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await?;
    let mut first = [0; 100];
    let read = stream.read(&mut first).await?;
    assert!(first[..read].starts_with(b"HTTP/1.1 200"));
    // Reads no more, and keeps the connection open meanwhile.
    let started = Instant::now();
    let log = gateway.log.clone();
    until("the request ends", || log.lines().len() == 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let line = &log.lines()[0];
    assert_eq!((line.outcome, line.status), ("cancelled", 499), "{line:?}");
    drop(stream);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_place_of_a_streams_first_event_is_read_as_the_providers_error() -> TestResult {
    // `a` answers 200, then an Anthropic-style error event instead of the
    // answer: the rule on the error's type fails over; any other reading
    // of it stops with `other_outcome`.
    let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":\
                      {\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let gateway = scripted_then_b_under(
        r#"
failover {
  attempts 2
  on malformed when upstream.error.type == "overloaded_error" and upstream.error.message == "Overloaded"
    => next, error upstream_failed
  on any => stop, error other_outcome
}
"#,
        OUTCOME_ERRORS,
        &[(0, overloaded)],
        Then::EndAfter(Duration::ZERO),
    )
    .await;
    let reply = gateway.api.chat(&chat_body(true)).await;
    assert_b_answered(&reply, true);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_echoed_in_an_error_event_never_reaches_the_client() -> TestResult {
    // `a` echoes the key it was sent in its error event, after the commit;
    // the policy's error passes the provider's message on.
    let (reply, _) = failover_case(
        r#"
failover {
  attempts 1
  on any => stop, error echoed
}
"#,
        r#"
  echoed = 502, coalesce(upstream.error.message, "none")
"#,
        &format!("error_after=2 message={}", secret_of("a")),
        true,
        |c| c,
    )
    .await;
    assert!(!reply.text.contains(&secret_of("a")), "{}", reply.text);
    let events = sse_events(&reply.text);
    let last = events.last().copied().unwrap_or_default();
    let error = event_json(last).unwrap_or_else(|| panic!("the last event is not JSON: {last}"));
    assert_eq!(error["error"]["message"], "[redacted]", "{}", reply.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_that_is_an_error_object_is_malformed_not_served() -> TestResult {
    // `a` answers 200 with an error object (echoing its key) in place of a
    // completion: it fails over as malformed, read for its error, and the
    // client never sees it.
    let (reply, requests) = outcome_case(
        "malformed",
        &format!("error_after=0 code=overloaded message={}", secret_of("a")),
        false,
        |c| c,
    )
    .await;
    assert!(!reply.text.contains(&secret_of("a")), "{}", reply.text);
    assert_eq!(providers_seen(&requests), ["a", "b"]);
    let (reply, _) = failover_case(
        r#"
failover {
  attempts 1
  on malformed when upstream.error.code == "overloaded" => stop, error echoed
  on any => stop, error other_outcome
}
"#,
        r#"
  echoed = 502, coalesce(upstream.error.message, "none")
  other_outcome = 500, "the attempt ended with another outcome"
"#,
        &format!("error_after=0 code=overloaded message={}", secret_of("a")),
        false,
        |c| c,
    )
    .await;
    assert_eq!(reply.status, 502, "{}", reply.text);
    assert_eq!(
        reply.json["error"]["message"], "[redacted]",
        "{}",
        reply.text
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_error_event_after_the_commit_is_read_by_its_type() -> TestResult {
    // `anth` streams two chunks, then Anthropic's error event, which names
    // the error by its `type` and has no code.
    let gateway = Setup::new(
        r#"
failover {
  attempts 2
  on stream_broken when upstream.error.type == "max_tokens_exceeded" and not present(upstream.error.code)
    => stop, error upstream_failed
  on any => stop, error other_outcome
}
"#,
        OUTCOME_ERRORS,
        openai_and_anthropic(),
    )
    .start("providers:\n  a: {}\n  anth: {sequence: [\"error_after=2 code=max_tokens_exceeded\"]}\n")
    .await;
    let reply = gateway.api.messages(&messages_body(true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let events = sse_events(&reply.text);
    let last = events.last().copied().unwrap_or_default();
    assert_eq!(event_name(last), Some("error"), "{}", reply.text);
    let error = event_json(last).unwrap_or_else(|| panic!("the last event is not JSON: {last}"));
    assert_eq!(error["error"]["code"], "upstream_failed", "{}", reply.text);
    assert!(!reply.text.contains("message_stop"), "{}", reply.text);
    assert_eq!(providers_seen(&gateway.sim.requests()), ["anth"]);
    gateway.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_after_the_commit_is_read_as_the_providers_error() -> TestResult {
    // `a` streams two chunks, then an error event: the rule on its code and
    // type decides the error event the client gets; any other reading of it
    // stops with `other_outcome`. Nothing fails over after the commit.
    let (reply, requests) = failover_case(
        r#"
failover {
  attempts 2
  on stream_broken when upstream.error.code == "max_tokens_exceeded" and upstream.error.type == "server_error"
    => stop, error upstream_failed
  on any => stop, error other_outcome
}
"#,
        OUTCOME_ERRORS,
        "error_after=2 code=max_tokens_exceeded",
        true,
        |c| c,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(!reply.streamed_text().is_empty(), "{}", reply.text);
    let events = sse_events(&reply.text);
    let last = events.last().copied().unwrap_or_default();
    let error = event_json(last).unwrap_or_else(|| panic!("the last event is not JSON: {last}"));
    assert_eq!(error["error"]["code"], "upstream_failed", "{}", reply.text);
    assert!(!reply.text.contains("[DONE]"), "{}", reply.text);
    assert_eq!(providers_seen(&requests), ["a"]);
    Ok(())
}
