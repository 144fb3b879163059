//! noeta (`shared/seeds/noeta-providers-and-model-routing.txt`) end to end:
//! the shipped `policies/noeta.policy` served by the real proxy on loopback,
//! in front of simulated providers, with the proxy's time on a manual clock.
//! Each test names the CONFORMANCE.md rows it proves.
//!
//! The shipped data: `claude` (anthropic family and format, the default
//! provider, listing claude-haiku-4-5) serves the Claude models and their
//! aliases; `deepseek` (openai_compat) has the rows deepseek-chat and
//! deepseek-reasoner and lists deepseek-coder too; `openrouter`
//! (openai_compat) has no rows and lists deepseek-coder, mistral-large and
//! llama-4-maverick; `openai-responses` (openai_responses) has gpt-5-codex.
//! Every call goes to the one provider its model resolves to; transient
//! failures are retried there, nine attempts in all.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{
    AllBut, HEALTHY, Reply, Stack, advance_until, assert_nothing_sent, closed_port, edit,
    event_text, events, finished, get, headers_come_after, healthz, names, reconfigure, replay,
    settle, until, until_asked, until_sleeping,
};
use serde_json::{Value as Json, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::reload::{Outcome, Reloader};
use switchyard::state::{Clock, ManualClock};
use tokio::task::JoinHandle;

/// The key of policies/noeta/tenants.yaml.
const TEAM: &str = "sk-noeta-team";

/// The catalog's providers, by their sim paths.
const PROVIDERS: [&str; 4] = ["claude", "deepseek", "openrouter", "openai-responses"];

// The policy's error messages.
const WRONG_ENDPOINT: &str = "this model's provider is not reached through this endpoint";
const NOT_CONFIGURED: &str = "no provider configured here serves this model";
const PROVIDER_FAILED: &str = "the provider failed and the retries are exhausted";

// The policy's timeouts, ms.
const HEADERS_MS: u64 = 600_000;
const ONE_PIECE_MS: u64 = 300_000;
const ANTHROPIC_SILENCE_MS: u64 = 60_000;
const OPENAI_SILENCE_MS: u64 = 300_000;

/// The full backoff step before each of the eight retries: 1, 2, 4 … at
/// most 30 s. Half of each is fixed, half random.
const BACKOFF_STEPS_MS: [u64; 8] = [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000];

// ---------------------------------------------------------------------
// Endpoints, scenarios and requests

/// The three wire families' endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    /// openai_compat: `/chat/completions`.
    Chat,
    /// anthropic: `/v1/messages`.
    Messages,
    /// openai_responses: `/v1/responses`.
    Responses,
}

const APIS: [Api; 3] = [Api::Chat, Api::Messages, Api::Responses];

impl Api {
    fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }

    fn body(self, model: &str) -> Json {
        match self {
            Api::Chat => json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]}),
            Api::Messages => json!({
                "model": model,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "Hi"}],
            }),
            Api::Responses => json!({"model": model, "input": "Hi"}),
        }
    }

    fn stream_body(self, model: &str) -> Json {
        let mut body = self.body(model);
        body["stream"] = json!(true);
        body
    }

    /// The body, streamed or not.
    fn body_as(self, model: &str, stream: bool) -> Json {
        if stream {
            self.stream_body(model)
        } else {
            self.body(model)
        }
    }

    /// Client headers: an Anthropic client sends `anthropic-version`.
    fn headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Api::Messages => &[("anthropic-version", "2023-06-01")],
            _ => &[],
        }
    }
}

/// A scenario in which every provider answers 200 but those given a
/// sequence of steps (the last repeating).
fn scenario(sequences: &[(&str, &[&str])]) -> String {
    common::scenario(&PROVIDERS, sequences)
}

/// A call on `api` with `body`.
async fn call(stack: &Stack, api: Api, body: Json) -> Reply {
    stack
        .post(api.path(), Some(TEAM), api.headers(), &body)
        .await
}

/// A call and the (provider, upstream model) pairs the sim was asked while
/// it ran, in order.
async fn call_tried(stack: &Stack, api: Api, body: Json) -> (Reply, Vec<(String, Option<String>)>) {
    let before = stack.sim.requests().len();
    let reply = call(stack, api, body).await;
    (reply, stack.tried().split_off(before))
}

/// The request of `call`, not yet sent.
fn request(stack: &Stack, api: Api, body: &Json) -> reqwest::RequestBuilder {
    let mut request = stack
        .client
        .post(stack.url(api.path()))
        .bearer_auth(TEAM)
        .json(body);
    for (name, value) in api.headers() {
        request = request.header(*name, *value);
    }
    request
}

/// Sends a call from a task of its own and reads the whole answer.
fn spawn_call(stack: &Stack, api: Api, body: Json) -> JoinHandle<Reply> {
    tokio::spawn(Reply::of(request(stack, api, &body)))
}

/// Reads a streamed answer until `count` events with answer text reached
/// the client; returns what was read.
async fn read_until_content(response: &mut reqwest::Response, count: usize) -> String {
    let mut text = String::new();
    while content_events(&text) < count {
        let chunk = response.chunk().await.unwrap().expect("the stream ended");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    text
}

fn content_events(text: &str) -> usize {
    events(text)
        .iter()
        .filter(|(_, data)| event_text(data).is_some())
        .count()
}

/// The type an error of this status has by default.
fn default_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The policy's error `code` in the caller's wire format (on
/// `/v1/messages` the Anthropic object, which has no code); returns the
/// message.
fn policy_error(reply: &Reply, api: Api, status: u16, code: &str) -> String {
    match api {
        Api::Messages => reply.anthropic_error(status, default_type(status)),
        _ => reply.openai_error(status, code, default_type(status)),
    }
}

/// A stream that began and then ended with the policy's `provider_failed`
/// as an error event in its wire format, never with a sentinel.
fn assert_stream_failed(reply: &Reply, api: Api) {
    let (name, error) = reply.broken_stream();
    match api {
        Api::Messages => {
            assert_eq!(name.as_deref(), Some("error"), "{}", reply.text);
            assert_eq!(error["type"], "error");
            assert_eq!(error["error"]["type"], "api_error");
            assert_eq!(error["error"]["message"], PROVIDER_FAILED);
        }
        _ => {
            assert_eq!(error["error"]["code"], "provider_failed", "{}", reply.text);
            assert_eq!(error["error"]["message"], PROVIDER_FAILED);
        }
    }
}

/// `count` requests to `provider`.
fn times(provider: &str, count: usize) -> Vec<String> {
    vec![provider.to_string(); count]
}

/// Once the sim has received `asked` requests and the last one failed,
/// checks that the next request (the retry) comes no earlier than
/// `earliest` ms and no later than `latest` ms after the failure, on the
/// proxy's clock. Moves the clock by `latest` in all.
async fn expect_retry_within(
    stack: &Stack,
    clock: &ManualClock,
    asked: usize,
    earliest: u64,
    latest: u64,
) {
    until_asked(stack, asked).await;
    let failed_ms = clock.now_ms();
    until_sleeping(clock, "the proxy waits to retry", |at| {
        (failed_ms + earliest..=failed_ms + latest).contains(&at)
    })
    .await;
    clock.advance(earliest - 1);
    settle().await;
    assert_eq!(
        stack.sim.requests().len(),
        asked,
        "retry {asked} came before {earliest} ms"
    );
    clock.advance(latest - earliest + 1);
    until_asked(stack, asked + 1).await;
}

/// Once the sim has received `asked` requests, the last of them silent,
/// checks that the proxy gives up on it after exactly `timeout_ms` on its
/// clock, as `outcome`, and then (after the first backoff, at most 1 s)
/// asks again.
async fn expect_timeout_after(
    stack: &Stack,
    clock: &ManualClock,
    asked: usize,
    timeout_ms: u64,
    outcome: &str,
) {
    until_asked(stack, asked).await;
    let provider = stack.providers_tried().pop().unwrap();
    let ended = attempts_ended(stack, &provider, None).await;
    settle().await;
    clock.advance(timeout_ms - 1);
    settle().await;
    assert_eq!(
        attempts_ended(stack, &provider, None).await,
        ended,
        "{provider}: given up before {timeout_ms} ms"
    );
    let timed_out = attempts_ended(stack, &provider, Some(outcome)).await;
    clock.advance(1);
    let began = Instant::now();
    while attempts_ended(stack, &provider, Some(outcome)).await == timed_out {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{provider}: not given up after {timeout_ms} ms as {outcome}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        attempts_ended(stack, &provider, Some(outcome)).await,
        timed_out + 1,
        "{provider}: given up more than once"
    );
    clock.advance(1_000);
    until_asked(stack, asked + 1).await;
}

/// Edits the catalog and reloads it the way `switchyard serve` does at
/// run time: only a policy that checks goes live.
fn reload_catalog(stack: &Stack, edits: &[(&str, &str)]) -> Outcome {
    edit(stack, "catalog.yaml", edits);
    let reloader = Reloader::new(
        stack.proxy.clone(),
        stack.policy.clone(),
        &stack.sources,
        Arc::new(AllBut(Vec::new())),
    );
    reloader.reload()
}

/// How many attempts at `provider` ended, with `outcome` if given (the
/// proxy's `switchyard_upstream_seconds` histogram, from `GET /metrics`).
async fn attempts_ended(stack: &Stack, provider: &str, outcome: Option<&str>) -> u64 {
    let text = get(stack, "/metrics").await.text;
    text.lines()
        .filter(|line| line.starts_with("switchyard_upstream_seconds_count{"))
        .filter(|line| {
            line.contains(&format!("provider=\"{provider}\""))
                && outcome.is_none_or(|outcome| line.contains(&format!("outcome=\"{outcome}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next())
        .map(|count| count.trim().parse::<f64>().unwrap() as u64)
        .sum()
}

// ---------------------------------------------------------------------
// Families, endpoints and provider tables

/// [E6] [E7] each provider speaks its one wire family and is reached
/// through that family's endpoint (anthropic `/v1/messages`, openai_compat
/// `/chat/completions`, openai_responses `/v1/responses`), streamed or
/// not; a model called on any other endpoint gets 400 wrong_endpoint in
/// the caller's format, and nothing goes upstream
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e6_e7_each_family_is_reached_through_its_own_endpoint_only() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (api, model, provider, path) in [
        (
            Api::Messages,
            "claude-opus-5-5",
            "claude",
            "/claude/v1/messages",
        ),
        (
            Api::Chat,
            "deepseek-chat",
            "deepseek",
            "/deepseek/v1/chat/completions",
        ),
        (
            Api::Chat,
            "mistral-large",
            "openrouter",
            "/openrouter/v1/chat/completions",
        ),
        (
            Api::Responses,
            "gpt-5-codex",
            "openai-responses",
            "/openai-responses/v1/responses",
        ),
    ] {
        for stream in [false, true] {
            stack.sim.clear();
            let reply = call(&stack, api, api.body_as(model, stream)).await;
            reply.assert_served(provider);
            assert_eq!(reply.is_stream(), stream, "{}", reply.text);
            let sent = stack.sim.requests();
            assert_eq!(sent.len(), 1, "{model}");
            assert_eq!(sent[0].path, path);
            assert_eq!(sent[0].stream, stream);
        }
        for other in APIS.into_iter().filter(|other| *other != api) {
            stack.sim.clear();
            for stream in [false, true] {
                let reply = call(&stack, other, other.body_as(model, stream)).await;
                let message = policy_error(&reply, other, 400, "wrong_endpoint");
                assert_eq!(message, WRONG_ENDPOINT, "{model} on {other:?}");
            }
            assert_nothing_sent(&stack);
        }
    }

    // No family is reached through the legacy completions or embeddings.
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": "deepseek-chat", "prompt": "Hi"}),
        ),
        (
            "/v1/embeddings",
            json!({"model": "deepseek-chat", "input": "Hi"}),
        ),
    ] {
        let reply = stack.post(path, Some(TEAM), &[], &body).await;
        let message = reply.openai_error(400, "wrong_endpoint", "invalid_request_error");
        assert_eq!(message, WRONG_ENDPOINT);
    }
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [E15] a provider is a table with its base URL and its key from the
/// environment: each call goes to the provider's `base_url` with the
/// secret of its `${ENV}` reference (`x-api-key` for anthropic, a bearer
/// token for the OpenAI shapes), never the client's key; a key written
/// into the catalog instead is a configuration error that never goes live
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e15_providers_are_tables_with_a_base_url_and_a_key_from_the_environment() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (api, model, provider, variable) in [
        (Api::Messages, "sonnet", "claude", "ANTHROPIC_API_KEY"),
        (Api::Chat, "deepseek-chat", "deepseek", "DEEPSEEK_API_KEY"),
        (
            Api::Chat,
            "llama-4-maverick",
            "openrouter",
            "OPENROUTER_API_KEY",
        ),
        (
            Api::Responses,
            "gpt-5-codex",
            "openai-responses",
            "OPENAI_API_KEY",
        ),
    ] {
        stack.sim.clear();
        let reply = call(&stack, api, api.body(model)).await;
        reply.assert_served(provider);
        let sent = &stack.sim.requests()[0];
        assert!(
            sent.path.starts_with(&format!("/{provider}/v1/")),
            "{}",
            sent.path
        );
        let secret = format!("secret-of-{variable}");
        if api == Api::Messages {
            assert_eq!(sent.header("x-api-key"), Some(secret.as_str()));
            assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
            assert_eq!(sent.header("authorization"), None);
        } else {
            let bearer = format!("Bearer {secret}");
            assert_eq!(sent.header("authorization"), Some(bearer.as_str()));
            assert_eq!(sent.header("x-api-key"), None);
        }
        assert!(
            !sent.headers.values().any(|value| value.contains(TEAM)),
            "the client's key went upstream: {:?}",
            sent.headers
        );
    }

    // A literal key instead of an environment reference does not check.
    let outcome = reload_catalog(
        &stack,
        &[(
            "key: \"${DEEPSEEK_API_KEY}\"",
            "key: \"sk-deepseek-literal\"",
        )],
    );
    assert_eq!(outcome, Outcome::Failed);
    let health = healthz(&stack).await;
    let failure = &health["reload"]["last_failure"];
    assert_eq!(failure["diagnostics"][0]["code"], "E0203", "{health}");
    // The previous configuration keeps serving.
    stack.sim.clear();
    let reply = call(&stack, Api::Chat, Api::Chat.body("deepseek-chat")).await;
    reply.assert_served("deepseek");
    assert_eq!(
        stack.sim.requests()[0].header("authorization"),
        Some("Bearer secret-of-DEEPSEEK_API_KEY")
    );
    stack.stop().await;
}

// ---------------------------------------------------------------------
// The catalog and model resolution

/// [E12] the aliases opus, sonnet, haiku and fable resolve to Claude
/// models on claude (decided: fable is Haiku), streamed or not
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e12_the_aliases_resolve_to_claude_models() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (alias, model) in [
        ("opus", "claude-opus-5-5"),
        ("sonnet", "claude-sonnet-4-5"),
        ("haiku", "claude-haiku-4-5"),
        ("fable", "claude-haiku-4-5"),
    ] {
        for stream in [false, true] {
            let (reply, tried) =
                call_tried(&stack, Api::Messages, Api::Messages.body_as(alias, stream)).await;
            reply.assert_served("claude");
            assert_eq!(
                tried,
                vec![(String::from("claude"), Some(String::from(model)))],
                "{alias}"
            );
        }
    }
    stack.stop().await;
}

/// [E14] [E16] a model the catalog has a row for goes to the provider its
/// row names, before any listing; rows and listing entries added at run
/// time route as soon as the catalog reloads; one model named for two
/// providers is a configuration error that never goes live
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e14_e16_a_catalog_row_names_the_provider_and_rows_are_added_at_run_time() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (api, model, provider) in [
        (Api::Messages, "claude-opus-5-5", "claude"),
        (Api::Messages, "claude-sonnet-4-5", "claude"),
        (Api::Chat, "deepseek-chat", "deepseek"),
        // Also in deepseek's listing: resolved by its row, once.
        (Api::Chat, "deepseek-reasoner", "deepseek"),
        (Api::Responses, "gpt-5-codex", "openai-responses"),
    ] {
        let (reply, tried) = call_tried(&stack, api, api.body(model)).await;
        reply.assert_served(provider);
        assert_eq!(tried, vec![(provider.to_string(), Some(model.to_string()))]);
    }

    // Before: mistral-large is openrouter's by its listing; deepseek-v4 is
    // unknown, so the default (anthropic) provider's, not for this endpoint.
    let (reply, tried) = call_tried(&stack, Api::Chat, Api::Chat.body("mistral-large")).await;
    reply.assert_served("openrouter");
    assert_eq!(tried[0].0, "openrouter");
    let reply = call(&stack, Api::Chat, Api::Chat.body("deepseek-v4")).await;
    reply.openai_error(400, "wrong_endpoint", "invalid_request_error");

    // Rows for both, naming deepseek, and a listing entry for openrouter,
    // added while the proxy runs.
    let outcome = reload_catalog(
        &stack,
        &[
            (
                "\nmodels:\n",
                "\nmodels:\n  - id: mistral-large\n    kind: chat\n    routes:\n      - provider: deepseek\n  - id: deepseek-v4\n    kind: chat\n    routes:\n      - provider: deepseek\n",
            ),
            (
                "listing: [deepseek-coder, ",
                "listing: [qwen-3-coder, deepseek-coder, ",
            ),
        ],
    );
    assert!(matches!(outcome, Outcome::Reloaded(_)), "{outcome:?}");
    for (model, provider) in [
        // The row beats openrouter's listing.
        ("mistral-large", "deepseek"),
        ("deepseek-v4", "deepseek"),
        ("qwen-3-coder", "openrouter"),
    ] {
        let (reply, tried) = call_tried(&stack, Api::Chat, Api::Chat.body(model)).await;
        reply.assert_served(provider);
        assert_eq!(tried, vec![(provider.to_string(), Some(model.to_string()))]);
    }

    // deepseek-chat named for deepseek and openrouter: refused, and the
    // catalog that checked keeps serving.
    let outcome = reload_catalog(
        &stack,
        &[(
            "  - id: deepseek-chat\n    kind: chat\n    routes:\n",
            "  - id: deepseek-chat\n    kind: chat\n    routes:\n      - provider: openrouter\n",
        )],
    );
    assert_eq!(outcome, Outcome::Failed);
    let health = healthz(&stack).await;
    let failure = &health["reload"]["last_failure"];
    assert_eq!(failure["diagnostics"][0]["code"], "E0506", "{health}");
    for (model, provider) in [("deepseek-chat", "deepseek"), ("deepseek-v4", "deepseek")] {
        let (reply, tried) = call_tried(&stack, Api::Chat, Api::Chat.body(model)).await;
        reply.assert_served(provider);
        assert_eq!(tried.len(), 1);
    }
    stack.stop().await;
}

/// [E17] an id the catalog has no row for goes to the first provider
/// whose /models listing has it, as that upstream model: the default
/// provider first, then catalog order
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e17_a_listed_id_goes_to_the_first_provider_listing_it_the_default_first() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (model, provider) in [
        ("mistral-large", "openrouter"),
        // Listed by openrouter, not by claude, the default.
        ("llama-4-maverick", "openrouter"),
        // Listed by deepseek and openrouter, neither the default: the
        // first in the catalog.
        ("deepseek-coder", "deepseek"),
    ] {
        for stream in [false, true] {
            let (reply, tried) =
                call_tried(&stack, Api::Chat, Api::Chat.body_as(model, stream)).await;
            reply.assert_served(provider);
            assert_eq!(tried, vec![(provider.to_string(), Some(model.to_string()))]);
        }
    }

    // With openrouter the default provider, it is asked first.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[
            ("default: true, ", ""),
            (
                "{family: openai_compat, listing: [deepseek-coder",
                "{family: openai_compat, default: true, listing: [deepseek-coder",
            ),
        ],
        &[],
    );
    let (reply, tried) = call_tried(&stack, Api::Chat, Api::Chat.body("deepseek-coder")).await;
    reply.assert_served("openrouter");
    assert_eq!(
        tried,
        vec![(
            String::from("openrouter"),
            Some(String::from("deepseek-coder"))
        )]
    );
    // A row still beats the default's listing.
    let (reply, _) = call_tried(&stack, Api::Chat, Api::Chat.body("deepseek-chat")).await;
    reply.assert_served("deepseek");
    stack.stop().await;
}

/// [E18] an id nobody has a row for or lists goes to the default provider
/// (claude) as that upstream model, so only through its family's endpoint;
/// with no default provider it is 502 provider_not_configured
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e18_an_unknown_id_goes_to_the_default_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for stream in [false, true] {
        let (reply, tried) = call_tried(
            &stack,
            Api::Messages,
            Api::Messages.body_as("claude-next-preview", stream),
        )
        .await;
        reply.assert_served("claude");
        assert_eq!(
            tried,
            vec![(
                String::from("claude"),
                Some(String::from("claude-next-preview"))
            )]
        );
    }
    // Decided: an id over 256 bytes, which no `unknown serve` tier passes
    // on, goes nowhere, and says so.
    let overlong = format!("claude-{}", "x".repeat(251));
    for api in APIS {
        let reply = call(&stack, api, api.body(&overlong)).await;
        assert_eq!(
            policy_error(&reply, api, 502, "provider_not_configured"),
            NOT_CONFIGURED
        );
        assert_eq!(reply.header("x-should-retry"), Some("false"));
    }
    // The longest id a tier passes on is still served.
    let longest = format!("claude-{}", "x".repeat(249));
    call(&stack, Api::Messages, Api::Messages.body(&longest))
        .await
        .assert_served("claude");

    // The default is an anthropic provider: not on the OpenAI endpoints.
    stack.sim.clear();
    for api in [Api::Chat, Api::Responses] {
        let reply = call(&stack, api, api.body("some-unknown-model")).await;
        assert_eq!(
            policy_error(&reply, api, 400, "wrong_endpoint"),
            WRONG_ENDPOINT
        );
    }
    assert_nothing_sent(&stack);

    // Decided: with no default provider, an unknown id has nowhere to go.
    reconfigure(&stack, "catalog.yaml", &[("default: true, ", "")], &[]);
    for api in APIS {
        for stream in [false, true] {
            let reply = call(&stack, api, api.body_as("claude-next-preview", stream)).await;
            let message = policy_error(&reply, api, 502, "provider_not_configured");
            assert_eq!(message, NOT_CONFIGURED);
        }
    }
    assert_nothing_sent(&stack);
    // Rows and listings are unaffected.
    let reply = call(&stack, Api::Messages, Api::Messages.body("haiku")).await;
    reply.assert_served("claude");
    let reply = call(&stack, Api::Chat, Api::Chat.body("mistral-large")).await;
    reply.assert_served("openrouter");
    stack.stop().await;
}

/// [E22] [E23] the provider a model goes to is decided from the catalog
/// alone, so two replicas decide alike: their providers' live /models
/// listings may differ and are never read
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e22_e23_every_replica_routes_a_model_alike_whatever_the_live_listings_say() {
    // The live listings differ between the two machines and from the
    // catalog's: on one, deepseek lists mistral-large and the default
    // lists llama-4-maverick; on the other, openrouter lists nothing.
    let first_listings = "providers:\n  claude:\n    models: {llama-4-maverick: {}, claude-haiku-4-5: {}}\n  deepseek:\n    models: {mistral-large: {}, deepseek-coder: {}}\n  openrouter: {}\n  openai-responses: {}\n";
    let second_listings = "providers:\n  claude: {}\n  deepseek:\n    models: {deepseek-chat: {}}\n  openrouter:\n    models: {other-model: {}}\n  openai-responses:\n    models: {deepseek-coder: {}}\n";
    let clock = Arc::new(ManualClock::default());
    let first = Stack::shipped("noeta", first_listings, &[], clock.clone()).await;
    let second = Stack::shipped("noeta", second_listings, &[], clock.clone()).await;

    let calls = [
        (Api::Chat, "mistral-large", "openrouter"),
        (Api::Chat, "llama-4-maverick", "openrouter"),
        (Api::Chat, "deepseek-coder", "deepseek"),
        (Api::Chat, "deepseek-chat", "deepseek"),
        (Api::Messages, "claude-next-preview", "claude"),
        (Api::Messages, "fable", "claude"),
        (Api::Responses, "gpt-5-codex", "openai-responses"),
    ];
    for _ in 0..2 {
        for (api, model, provider) in calls {
            let (one, one_tried) = call_tried(&first, api, api.body(model)).await;
            let (other, other_tried) = call_tried(&second, api, api.body(model)).await;
            one.assert_served(provider);
            other.assert_served(provider);
            assert_eq!(one_tried, other_tried, "{model}");
            assert_eq!(one_tried[0].0, provider, "{model}");
        }
    }
    for stack in [&first, &second] {
        assert!(
            stack
                .sim
                .requests()
                .iter()
                .all(|r| r.method == "POST" && !r.path.ends_with("/models")),
            "a listing was read live"
        );
    }
    first.stop().await;
    second.stop().await;
}

/// [E25] a call goes to the one provider its model resolves to and stays
/// there: retries go to it again, never to another provider that lists
/// the model, and the next call goes to it as before
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e25_a_model_stays_on_its_provider_through_failures() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noeta",
        &scenario(&[("deepseek", &["503", "503", "200"])]),
        &[],
        clock.clone(),
    )
    .await;

    // deepseek-coder is also in openrouter's listing.
    let reply = advance_until(
        &clock,
        100,
        10_000,
        call(&stack, Api::Chat, Api::Chat.body("deepseek-coder")),
    )
    .await;
    reply.assert_served("deepseek");
    assert_eq!(stack.providers_tried(), times("deepseek", 3));

    replay(&stack, &scenario(&[("deepseek", &["503"])]));
    for stream in [false, true] {
        stack.sim.clear();
        let reply = advance_until(
            &clock,
            1_000,
            200_000,
            call(
                &stack,
                Api::Chat,
                Api::Chat.body_as("deepseek-coder", stream),
            ),
        )
        .await;
        let message = reply.openai_error(502, "provider_failed", "api_error");
        assert_eq!(message, PROVIDER_FAILED);
        // Nine attempts were the retries: the SDKs are told not to add theirs.
        assert_eq!(reply.header("x-should-retry"), Some("false"));
        assert_eq!(stack.providers_tried(), times("deepseek", 9));
    }

    // Nothing moved it: the next call goes to deepseek again.
    replay(&stack, &scenario(HEALTHY));
    let (reply, tried) = call_tried(&stack, Api::Chat, Api::Chat.body("deepseek-coder")).await;
    reply.assert_served("deepseek");
    assert_eq!(tried[0].0, "deepseek");
    stack.stop().await;
}

/// [E18] [E26] a model whose provider is not configured here (its key is
/// not set) fails with 502 provider_not_configured in the caller's format
/// and is not sent elsewhere, not even to another provider listing it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e18_e26_a_provider_not_configured_fails_the_call_rather_than_send_it_elsewhere() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noeta",
        &scenario(HEALTHY),
        &["DEEPSEEK_API_KEY"],
        clock.clone(),
    )
    .await;

    for model in ["deepseek-chat", "deepseek-reasoner", "deepseek-coder"] {
        for stream in [false, true] {
            let reply = call(&stack, Api::Chat, Api::Chat.body_as(model, stream)).await;
            let message = reply.openai_error(502, "provider_not_configured", "api_error");
            assert_eq!(message, NOT_CONFIGURED, "{model}");
            // Fatal: the official SDKs are told not to send it again.
            assert_eq!(reply.header("x-should-retry"), Some("false"), "{model}");
        }
    }
    assert_nothing_sent(&stack);
    // Models of configured providers are unaffected.
    let reply = call(&stack, Api::Chat, Api::Chat.body("mistral-large")).await;
    reply.assert_served("openrouter");

    // The default provider unset: its models and unknown ids fail on
    // /v1/messages, in Anthropic's format.
    reconfigure(&stack, "catalog.yaml", &[], &["ANTHROPIC_API_KEY"]);
    stack.sim.clear();
    for model in ["opus", "claude-haiku-4-5", "claude-next-preview"] {
        let reply = call(&stack, Api::Messages, Api::Messages.body(model)).await;
        assert_eq!(reply.anthropic_error(502, "api_error"), NOT_CONFIGURED);
    }
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [E27] a client cannot choose the provider: a provider or route in the
/// body, a routing header, or a provider prefix on the model id changes
/// nothing (a prefixed id is just an unknown id, for the default provider)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e27_a_client_cannot_choose_the_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    let mut body = Api::Chat.body("deepseek-coder");
    body["provider"] = json!("openrouter");
    body["model_route"] = json!({"provider": "openrouter", "model": "deepseek-coder"});
    let reply = stack
        .post(
            Api::Chat.path(),
            Some(TEAM),
            &[
                ("x-provider", "openrouter"),
                ("x-model-route", "openrouter"),
            ],
            &body,
        )
        .await;
    reply.assert_served("deepseek");
    assert_eq!(stack.providers_tried(), names(&["deepseek"]));

    stack.sim.clear();
    for pinned in [
        "openrouter/deepseek-coder",
        "openrouter:deepseek-coder",
        "@openrouter-key/deepseek-coder",
    ] {
        let reply = call(&stack, Api::Chat, Api::Chat.body(pinned)).await;
        assert_eq!(
            reply.openai_error(400, "wrong_endpoint", "invalid_request_error"),
            WRONG_ENDPOINT
        );
        let (reply, tried) = call_tried(&stack, Api::Messages, Api::Messages.body(pinned)).await;
        reply.assert_served("claude");
        assert_eq!(
            tried,
            vec![(String::from("claude"), Some(pinned.to_string()))]
        );
    }
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Retries

/// [E3] [E33] [E51] one set of rules retries every call: the turn's own
/// and the calls beside it (a side model, a plugin's one-piece call), on
/// every provider and endpoint, streamed or not; the retry is the same
/// request to the same provider
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e3_e33_e51_every_call_is_retried_by_the_same_rules() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (api, model, provider) in [
        // The turn's call, and a title or classifier call on a side model.
        (Api::Messages, "opus", "claude"),
        (Api::Messages, "haiku", "claude"),
        (Api::Chat, "deepseek-chat", "deepseek"),
        (Api::Chat, "mistral-large", "openrouter"),
        (Api::Responses, "gpt-5-codex", "openai-responses"),
    ] {
        for stream in [false, true] {
            replay(&stack, &scenario(&[(provider, &["503", "200"])]));
            let mut body = api.body_as(model, stream);
            if !stream {
                body["metadata"] = json!({"purpose": "compaction"});
            }
            let reply = advance_until(&clock, 100, 10_000, call(&stack, api, body)).await;
            reply.assert_served(provider);
            let sent = stack.sim.requests();
            assert_eq!(sent.len(), 2, "{model}");
            assert!(sent.iter().all(|r| r.provider == provider));
            assert_eq!(sent[0].body, sent[1].body, "the same request again");
            assert_eq!(sent[0].path, sent[1].path);
        }
    }
    stack.stop().await;
}

/// [E4] each failure class gets its reaction: transient ones (a dropped
/// or refused connection, 5xx, overloaded as a 529 or as a stream's first
/// event), rate limits (429) and
/// timeouts are retried; a malformed answer is asked for once more; a
/// stream broken after it began ends the call; a fatal 4xx (auth, a bad
/// request, a refusal, a context overflow) goes back at once as it is
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_each_failure_class_gets_its_reaction() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;
    let chat = || call(&stack, Api::Chat, Api::Chat.body("deepseek-chat"));

    // Transient, rate-limited, timed out, malformed: asked again.
    for step in [
        "reset",
        "500",
        "502",
        "503",
        "504",
        "529",
        "429",
        "no_answer",
        "malformed",
    ] {
        replay(&stack, &scenario(&[("deepseek", &[step, "200"])]));
        let reply = advance_until(&clock, 1_000, 400_000, chat()).await;
        reply.assert_served("deepseek");
        assert_eq!(stack.providers_tried(), times("deepseek", 2), "{step}");
    }
    // Overloaded on /v1/messages too.
    replay(&stack, &scenario(&[("claude", &["529", "200"])]));
    let reply = advance_until(
        &clock,
        100,
        10_000,
        call(&stack, Api::Messages, Api::Messages.body("opus")),
    )
    .await;
    reply.assert_served("claude");
    assert_eq!(stack.providers_tried(), times("claude", 2));

    // Overloaded as a stream's first event (Anthropic's overloaded_error):
    // transient, retried after the 1 s step's backoff (0.5 to 1 s), and
    // again after the 2 s step's, unlike a malformed answer's one quick ask.
    replay(
        &stack,
        &scenario(&[(
            "claude",
            &[
                "error_after=0 code=overloaded_error",
                "error_after=0 code=overloaded_error",
                "200",
            ],
        )]),
    );
    let waiting = spawn_call(&stack, Api::Messages, Api::Messages.stream_body("opus"));
    expect_retry_within(&stack, &clock, 1, 500, 1_000).await;
    expect_retry_within(&stack, &clock, 2, 1_000, 2_000).await;
    finished(waiting).await.assert_served("claude");
    assert_eq!(stack.providers_tried(), times("claude", 3));

    // Fatal: the provider's answer, at once.
    for (step, status) in [
        ("400", 400),
        ("400 code=context_length_exceeded", 400),
        ("401", 401),
        ("403", 403),
    ] {
        replay(&stack, &scenario(&[("deepseek", &[step, "200"])]));
        let reply = chat().await;
        assert_eq!(reply.status, status, "{step}: {}", reply.text);
        assert_eq!(stack.providers_tried(), times("deepseek", 1), "{step}");
    }

    // A stream broken after it began: the call fails, nothing is retried.
    replay(&stack, &scenario(&[("deepseek", &["cut_after=2", "200"])]));
    let reply = call(&stack, Api::Chat, Api::Chat.stream_body("deepseek-chat")).await;
    assert_stream_failed(&reply, Api::Chat);
    assert_eq!(stack.providers_tried(), times("deepseek", 1));

    // A refused connection (network): retried until the attempts are
    // spent, then provider_failed.
    let sim = stack.sim.addr().to_string();
    let closed = format!("127.0.0.1:{}", closed_port());
    reconfigure(
        &stack,
        "catalog.yaml",
        &[(
            &format!("http://{sim}/deepseek/v1"),
            &format!("http://{closed}/deepseek/v1"),
        )],
        &[],
    );
    let reply = advance_until(&clock, 1_000, 200_000, chat()).await;
    assert_eq!(
        reply.openai_error(502, "provider_failed", "api_error"),
        PROVIDER_FAILED
    );
    assert_eq!(
        attempts_ended(&stack, "deepseek", Some("connect_error")).await,
        9
    );
    stack.stop().await;
}

/// [E34] [E4] transient errors and rate limits share one retry budget and
/// one backoff: nine attempts in all, the waits growing 1, 2, 4 … at most
/// 30 s, each at least half its step and at most the step (about two
/// minutes in all), whichever kind of failure each retry followed, an
/// in-stream 5xx of any wire format included; then 502 provider_failed,
/// in the caller's format
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e34_nine_attempts_with_exponential_backoff_then_provider_failed() {
    let clock = Arc::new(ManualClock::default());
    let failures: &[&str] = &[
        "503", "500", "reset", "529", "502", "504", "429", "503", "429",
    ];
    let stack = Stack::shipped(
        "noeta",
        &scenario(&[("deepseek", failures)]),
        &[],
        clock.clone(),
    )
    .await;

    let waiting = spawn_call(&stack, Api::Chat, Api::Chat.body("deepseek-chat"));
    for (retry, step) in BACKOFF_STEPS_MS.into_iter().enumerate() {
        expect_retry_within(&stack, &clock, retry + 1, step / 2, step).await;
    }
    // The ninth attempt failed (a 429): no tenth.
    let reply = finished(waiting).await;
    assert_eq!(
        reply.openai_error(502, "provider_failed", "api_error"),
        PROVIDER_FAILED
    );
    assert_eq!(stack.providers_tried(), times("deepseek", 9));
    assert_eq!(clock.now_ms(), BACKOFF_STEPS_MS.iter().sum::<u64>());

    // The same on /v1/messages, overloaded every time, streamed.
    replay(&stack, &scenario(&[("claude", &["529"])]));
    let reply = advance_until(
        &clock,
        1_000,
        200_000,
        call(&stack, Api::Messages, Api::Messages.stream_body("sonnet")),
    )
    .await;
    assert_eq!(reply.anthropic_error(502, "api_error"), PROVIDER_FAILED);
    assert_eq!(stack.providers_tried(), times("claude", 9));

    // Overloaded as a status and as a stream's first event, in turn: one
    // backoff for both, each wait a step longer than the one before
    // whichever rule retried, and still nine attempts in all.
    let overloaded_event = "error_after=0 code=overloaded_error";
    replay(
        &stack,
        &scenario(&[("claude", &["529", overloaded_event].repeat(6))]),
    );
    let waiting = spawn_call(&stack, Api::Messages, Api::Messages.stream_body("sonnet"));
    for (retry, step) in BACKOFF_STEPS_MS.into_iter().enumerate() {
        expect_retry_within(&stack, &clock, retry + 1, step / 2, step).await;
    }
    let reply = finished(waiting).await;
    assert_eq!(reply.status, 502, "{}", reply.text);
    assert_eq!(stack.providers_tried(), times("claude", 9));

    // The OpenAI formats' in-stream form of a 5xx, `server_error`, is as
    // transient as Anthropic's.
    for (api, model, provider) in [
        (Api::Chat, "deepseek-chat", "deepseek"),
        (Api::Responses, "gpt-5-codex", "openai-responses"),
    ] {
        replay(
            &stack,
            &scenario(&[(provider, &["error_after=0 code=server_error"])]),
        );
        let waiting = spawn_call(&stack, api, api.stream_body(model));
        for (retry, step) in BACKOFF_STEPS_MS.into_iter().enumerate() {
            expect_retry_within(&stack, &clock, retry + 1, step / 2, step).await;
        }
        let reply = finished(waiting).await;
        assert_eq!(reply.status, 502, "{model}: {}", reply.text);
        assert_eq!(stack.providers_tried(), times(provider, 9), "{model}");
    }
    stack.stop().await;
}

/// [E34] half of each wait is random, so two calls that fail alike do not
/// retry in lockstep: the first retry comes between 500 ms and 1 s, not
/// always at the same time, and in both halves of that range (a random
/// quarter would keep it above 750 ms)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e34_half_of_each_backoff_is_random() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    let mut waits = Vec::new();
    // Both halves within 40 calls, unless the random share is not half:
    // the odds of missing one by chance are 2 in 2^40.
    let in_both_halves =
        |waits: &[u64]| waits.iter().any(|w| *w < 750) && waits.iter().any(|w| *w >= 750);
    for _ in 0..40 {
        if waits.len() >= 6 && in_both_halves(&waits) {
            break;
        }
        replay(&stack, &scenario(&[("deepseek", &["503", "200"])]));
        let waiting = spawn_call(&stack, Api::Chat, Api::Chat.body("deepseek-chat"));
        until_asked(&stack, 1).await;
        let failed_ms = clock.now_ms();
        let window = failed_ms + 500..=failed_ms + 1_000;
        until_sleeping(&clock, "the proxy waits to retry", |at| {
            window.contains(&at)
        })
        .await;
        let wake = clock
            .sleeping_until()
            .into_iter()
            .find(|at| window.contains(at))
            .unwrap();
        clock.advance(wake - failed_ms - 1);
        settle().await;
        assert_eq!(stack.sim.requests().len(), 1, "retried before its wait");
        clock.advance(1);
        until_asked(&stack, 2).await;
        finished(waiting).await.assert_served("deepseek");
        waits.push(wake - failed_ms);
    }
    assert!(
        waits.iter().any(|wait| *wait != waits[0]),
        "every first retry waited the same: {waits:?}"
    );
    assert!(in_both_halves(&waits), "not half random: {waits:?}");
    stack.stop().await;
}

/// [E34] a provider's Retry-After is waited exactly, even beyond the 30 s
/// cap, on a 429 or a 5xx; it counts toward the nine attempts
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e34_retry_after_is_waited_exactly() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noeta",
        &scenario(&[(
            "deepseek",
            &[
                "429 retry_after=7s",
                "429 retry_after=45s",
                "503 retry_after=3s",
                "200",
            ],
        )]),
        &[],
        clock.clone(),
    )
    .await;

    let waiting = spawn_call(&stack, Api::Chat, Api::Chat.stream_body("deepseek-chat"));
    for (asked, exactly) in [(1, 7_000), (2, 45_000), (3, 3_000)] {
        expect_retry_within(&stack, &clock, asked, exactly, exactly).await;
    }
    finished(waiting).await.assert_served("deepseek");
    assert_eq!(stack.providers_tried(), times("deepseek", 4));

    // Retries after a Retry-After count: nine attempts in all.
    replay(&stack, &scenario(&[("claude", &["429 retry_after=2s"])]));
    let reply = advance_until(
        &clock,
        500,
        100_000,
        call(&stack, Api::Messages, Api::Messages.body("opus")),
    )
    .await;
    assert_eq!(reply.anthropic_error(502, "api_error"), PROVIDER_FAILED);
    assert_eq!(stack.providers_tried(), times("claude", 9));
    stack.stop().await;
}

/// [E37] an answer that does not parse (malformed tool-call arguments are
/// almost always a stream cut mid-call) is asked for once more from the
/// same provider; a second one fails the call with 502 provider_failed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e37_a_malformed_answer_is_asked_for_once_more() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (api, model, provider) in [
        (Api::Chat, "deepseek-chat", "deepseek"),
        (Api::Messages, "opus", "claude"),
        (Api::Responses, "gpt-5-codex", "openai-responses"),
    ] {
        for stream in [false, true] {
            replay(&stack, &scenario(&[(provider, &["malformed", "200"])]));
            let reply = advance_until(
                &clock,
                50,
                5_000,
                call(&stack, api, api.body_as(model, stream)),
            )
            .await;
            reply.assert_served(provider);
            assert_eq!(stack.providers_tried(), times(provider, 2), "{model}");

            replay(
                &stack,
                &scenario(&[(provider, &["malformed", "malformed", "200"])]),
            );
            let reply = advance_until(
                &clock,
                50,
                5_000,
                call(&stack, api, api.body_as(model, stream)),
            )
            .await;
            assert_eq!(
                policy_error(&reply, api, 502, "provider_failed"),
                PROVIDER_FAILED
            );
            assert_eq!(stack.providers_tried(), times(provider, 2), "{model}");
        }
    }
    stack.stop().await;
}

/// [E40] a fatal answer (auth, a bad request, a refusal) fails the call
/// at once: no retry, and the provider's answer goes back as it is, with
/// its status, error object and Retry-After
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e40_a_fatal_answer_goes_back_as_it_is_without_retry() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (step, status, code, error_type) in [
        (
            "400 code=context_length_exceeded message=\"prompt is too long\"",
            400,
            "context_length_exceeded",
            "invalid_request_error",
        ),
        (
            "401 code=invalid_api_key message=\"bad key\"",
            401,
            "invalid_api_key",
            "authentication_error",
        ),
        (
            "403 code=refused message=\"refused\"",
            403,
            "refused",
            "permission_error",
        ),
        (
            "404 code=model_not_found message=\"no such model\"",
            404,
            "model_not_found",
            "not_found_error",
        ),
        (
            "413 retry_after=2s code=too_large message=\"too large\"",
            413,
            "too_large",
            "invalid_request_error",
        ),
    ] {
        for stream in [false, true] {
            replay(&stack, &scenario(&[("deepseek", &[step, "200"])]));
            let reply = call(
                &stack,
                Api::Chat,
                Api::Chat.body_as("deepseek-chat", stream),
            )
            .await;
            let message = reply.openai_error(status, code, error_type);
            assert!(step.contains(&format!("message=\"{message}\"")), "{step}");
            assert_eq!(stack.providers_tried(), times("deepseek", 1), "{step}");
            let retry_after = (status == 413).then_some("2");
            assert_eq!(reply.header("retry-after"), retry_after, "{step}");
        }
    }

    // On /v1/messages, Anthropic's error object as claude sent it.
    for (step, status, error_type) in [
        (
            "401 message=\"invalid x-api-key\"",
            401,
            "authentication_error",
        ),
        (
            "400 message=\"prompt is too long: 250000 tokens > 200000 maximum\"",
            400,
            "invalid_request_error",
        ),
    ] {
        replay(&stack, &scenario(&[("claude", &[step, "200"])]));
        let reply = call(&stack, Api::Messages, Api::Messages.stream_body("opus")).await;
        let message = reply.anthropic_error(status, error_type);
        assert!(step.contains(&format!("message=\"{message}\"")), "{step}");
        assert_eq!(stack.providers_tried(), times("claude", 1), "{step}");
    }
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Timeouts

/// [E44] [E46] a stream waits 600 s for its response headers, then the
/// call is retried; a call answered in one piece has 300 s in all
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e44_e46_600s_for_a_streams_headers_300s_for_a_one_piece_call() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noeta", &scenario(HEALTHY), &[], clock.clone()).await;

    for (api, model, provider) in [
        (Api::Chat, "deepseek-chat", "deepseek"),
        (Api::Messages, "opus", "claude"),
    ] {
        // One piece: no headers within 300 s, then asked again.
        replay(&stack, &scenario(&[(provider, &["no_answer", "200"])]));
        let waiting = spawn_call(&stack, api, api.body(model));
        expect_timeout_after(&stack, &clock, 1, ONE_PIECE_MS, "timeout").await;
        finished(waiting).await.assert_served(provider);

        // One piece whose body stops halfway: 300 s for the whole call.
        replay(&stack, &scenario(&[(provider, &["stall_after=0", "200"])]));
        let waiting = spawn_call(&stack, api, api.body(model));
        expect_timeout_after(&stack, &clock, 1, ONE_PIECE_MS, "timeout").await;
        finished(waiting).await.assert_served(provider);

        // Streamed: no headers within 600 s (the 300 s do not apply).
        replay(&stack, &scenario(&[(provider, &["no_answer", "200"])]));
        let waiting = spawn_call(&stack, api, api.stream_body(model));
        expect_timeout_after(&stack, &clock, 1, HEADERS_MS, "timeout").await;
        finished(waiting).await.assert_served(provider);
    }
    stack.stop().await;
}

/// Opens a stream from `provider`, which stalls after two pieces; checks
/// that it ends after `silence_ms` of silence on the clock, not before,
/// with an error event, and is not retried.
async fn expect_stall_ends_after(
    stack: &Stack,
    clock: &ManualClock,
    api: Api,
    model: &str,
    provider: &str,
    silence_ms: u64,
) {
    replay(stack, &scenario(&[(provider, &["stall_after=2", "200"])]));
    let started = Instant::now();
    let mut response = request(stack, api, &api.stream_body(model))
        .send()
        .await
        .unwrap();
    let text = read_until_content(&mut response, 2).await;
    let rest = tokio::spawn(Reply::rest(response, text, started));
    let silent_from = clock.now_ms();
    until_sleeping(clock, "the proxy waits for the next event", |at| {
        at == silent_from + silence_ms
    })
    .await;
    clock.advance(silence_ms - 1);
    settle().await;
    assert!(!rest.is_finished(), "{model}: ended before {silence_ms} ms");
    clock.advance(1);
    let reply = finished(rest).await;
    assert_stream_failed(&reply, api);
    assert_eq!(stack.providers_tried(), times(provider, 1), "{model}");
}

/// [E45] silence on a stream: an Anthropic stream may be silent 60 s, the
/// OpenAI shapes 300 s, from its headers on; silence before the first event
/// is retried, silence after it ends the call with an error event
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e45_a_stream_may_be_silent_60s_on_anthropic_300s_on_openai_shapes() {
    let clock = Arc::new(ManualClock::default());
    // The sim's pauses run on the test's clock too: the test decides when
    // headers come, so that the first event's wait, counted from them, is
    // told apart from every other wait by its wake time.
    let stack = Stack::shipped_on_one_clock("noeta", &scenario(HEALTHY), clock.clone()).await;

    for (api, model, provider, silence_ms) in [
        (Api::Messages, "opus", "claude", ANTHROPIC_SILENCE_MS),
        (Api::Chat, "deepseek-chat", "deepseek", OPENAI_SILENCE_MS),
        (Api::Chat, "mistral-large", "openrouter", OPENAI_SILENCE_MS),
        (
            Api::Responses,
            "gpt-5-codex",
            "openai-responses",
            OPENAI_SILENCE_MS,
        ),
    ] {
        // Headers a second after the request, then no first event: silence
        // from the headers on.
        replay(
            &stack,
            &scenario(&[(provider, &["slow_headers=1s first_token=30m", "200"])]),
        );
        let asked_at = clock.now_ms();
        let waiting = spawn_call(&stack, api, api.stream_body(model));
        headers_come_after(&clock, asked_at, 1_000, silence_ms).await;
        expect_timeout_after(&stack, &clock, 1, silence_ms, "first_token_timeout").await;
        finished(waiting).await.assert_served(provider);

        // Headers that come late, within the 600 s, then the first event at
        // once: served, the silence counted from the headers.
        let late_ms = silence_ms + 30_000;
        replay(
            &stack,
            &scenario(&[(provider, &[&format!("slow_headers={late_ms}ms"), "200"])]),
        );
        let asked_at = clock.now_ms();
        let waiting = spawn_call(&stack, api, api.stream_body(model));
        until_sleeping(&clock, "the sim holds the headers", |at| {
            at == asked_at + late_ms
        })
        .await;
        clock.advance(late_ms);
        finished(waiting).await.assert_served(provider);
        assert_eq!(stack.providers_tried(), times(provider, 1), "{model}");

        expect_stall_ends_after(&stack, &clock, api, model, provider, silence_ms).await;
    }
    stack.stop().await;
}

/// [E43] [E45] pings are not silence: an Anthropic stream that announces
/// its answer and then pings while the model works is waited for past the
/// 60 s of silence, each ping starting them again, until its first content
/// comes; the content itself may take 600 s, however many pings come first
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e43_e45_a_stream_that_pings_while_the_model_works_is_not_silent() {
    const PING_MS: u64 = 10_000;
    const FIRST_CONTENT_MS: u64 = 600_000;
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped_on_one_clock("noeta", &scenario(HEALTHY), clock.clone()).await;
    // Until the sim waits to send its next event and the proxy waits out
    // the silence that began with the last event it got (or the first
    // content's limit, if that comes sooner): both have acted on it.
    let both_wait = |sim_at: u64, proxy_at: u64| {
        let clock = clock.clone();
        async move {
            until("the sim and the proxy wait", || {
                let sleeping = clock.sleeping_until();
                sleeping.contains(&sim_at) && sleeping.contains(&proxy_at)
            })
            .await;
        }
    };

    // The first content 90 s after the headers, a ping every 10 s before it.
    replay(
        &stack,
        &scenario(&[("claude", &["ping_every=10s first_token=90s", "200"])]),
    );
    let headers_at = clock.now_ms();
    let waiting = spawn_call(&stack, Api::Messages, Api::Messages.stream_body("opus"));
    for ping in 1..=9 {
        let heard_at = headers_at + (ping - 1) * PING_MS;
        both_wait(headers_at + ping * PING_MS, heard_at + ANTHROPIC_SILENCE_MS).await;
        clock.advance(PING_MS);
    }
    finished(waiting).await.assert_served("claude");
    assert_eq!(stack.providers_tried(), times("claude", 1));

    // Pings for longer than the 600 s the answer has to begin: left then,
    // as a first-token timeout.
    replay(
        &stack,
        &scenario(&[("claude", &["ping_every=10s first_token=700s", "200"])]),
    );
    let headers_at = clock.now_ms();
    let first_content_by = headers_at + FIRST_CONTENT_MS;
    let waiting = spawn_call(&stack, Api::Messages, Api::Messages.stream_body("opus"));
    let ended = attempts_ended(&stack, "claude", Some("first_token_timeout")).await;
    for ping in 1..=FIRST_CONTENT_MS / PING_MS {
        let heard_at = headers_at + (ping - 1) * PING_MS;
        let proxy_at = (heard_at + ANTHROPIC_SILENCE_MS).min(first_content_by);
        both_wait(headers_at + ping * PING_MS, proxy_at).await;
        if ping * PING_MS == FIRST_CONTENT_MS {
            assert_eq!(
                attempts_ended(&stack, "claude", Some("first_token_timeout")).await,
                ended,
                "given up before 600 s"
            );
        }
        clock.advance(PING_MS);
    }
    let began = Instant::now();
    while attempts_ended(&stack, "claude", Some("first_token_timeout")).await == ended {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "not given up after 600 s of pings"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stack.stop().await;
    drop(waiting);
}

/// [E43] [E46] a timeout measures silence, not the length of the answer:
/// a stream that keeps sending completes however long it takes in all,
/// past the 600 s for headers and the 300 s of a one-piece call
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e43_e46_a_stream_that_keeps_sending_is_never_cut_for_its_length() {
    let clock = Arc::new(ManualClock::default());
    // The pieces come 150 ms apart on the test's clock, as the sim's pauses
    // run on it: the proxy gets the next only once the test, holding the
    // one before, moves the clock.
    let slow = "providers:\n  claude: {chunks: 14, chunk_interval: 150ms}\n  deepseek: {chunks: 4, chunk_interval: 150ms}\n  openrouter: {}\n  openai-responses: {chunks: 4, chunk_interval: 150ms}\n";
    let stack = Stack::shipped_on_one_clock("noeta", slow, clock.clone()).await;

    for (api, model, provider, silence_ms, chunks) in [
        (Api::Messages, "opus", "claude", ANTHROPIC_SILENCE_MS, 14),
        (Api::Chat, "deepseek-chat", "deepseek", OPENAI_SILENCE_MS, 4),
        (
            Api::Responses,
            "gpt-5-codex",
            "openai-responses",
            OPENAI_SILENCE_MS,
            4,
        ),
    ] {
        let sent = Instant::now();
        let mut response = request(&stack, api, &api.stream_body(model))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        // Each time a piece arrives, most of the silence limit passes.
        let step = silence_ms - 5_000;
        let started = clock.now_ms();
        let mut text = String::new();
        let mut pieces = 0;
        while let Some(chunk) = response.chunk().await.unwrap() {
            text.push_str(std::str::from_utf8(&chunk).unwrap());
            let now = content_events(&text);
            if now > pieces {
                pieces = now;
                // Moved only once the sim waits to send the next piece: a
                // move before would not reach that wait.
                if pieces < chunks {
                    let next_at = clock.now_ms() + 150;
                    until_sleeping(&clock, "the sim waits to send the next piece", |at| {
                        at == next_at
                    })
                    .await;
                }
                clock.advance(step);
            }
        }
        let moved = clock.now_ms() - started;
        let reply = Reply {
            status,
            headers,
            text,
            json: Json::Null,
            elapsed: sent.elapsed(),
        };
        reply.assert_served(provider);
        assert!(
            moved > HEADERS_MS + step,
            "{model}: only {moved} ms passed while it streamed"
        );
    }
    assert_eq!(stack.sim.requests().len(), 3, "no call was retried");
    stack.stop().await;
}
