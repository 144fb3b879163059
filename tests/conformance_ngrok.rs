//! The ngrok AI Gateway's failover rules (shared/seeds/ngrok-ai-gateway-failover.txt)
//! end to end: the shipped `policies/ngrok.policy` and its data, served by the
//! real proxy on loopback in front of simulated providers, with the proxy's
//! time on a clock each test moves. The comment above each test's `fn` names
//! the rows of CONFORMANCE.md it proves.
//!
//! The shipped accounts: tunnelco (`sk-ngrok-tunnelco`) has a 20 s total
//! timeout, an 8 s per-request timeout and the fallback model
//! claude-sonnet-4-5; its scoped key may use only openai and anthropic;
//! brokeco has no credits. Every credential's secret is `secret-of-VARIABLE`
//! (tests/common's `AllBut`), so the `authorization` or `x-api-key` header a
//! provider received names the key the proxy chose.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{
    Reply, Stack, advance_until, chat_body, closed_port, data_file, finished, finished_attempts,
    messages_body, model_list, recompile, reconfigure, replay, settle, sha256_hex, spawn_open_chat,
    streamed,
};
use serde_json::{Value, json};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchyard::evaluate::health::Healthy;
use switchyard::evaluate::{Caller, Endpoint, RequestContext, evaluate};
use switchyard::sim::RecordedRequest;
use switchyard::state::{Clock, ManualClock};

const TUNNELCO: &str = "sk-ngrok-tunnelco";
const TUNNELCO_SCOPED: &str = "sk-ngrok-tunnelco-scoped";
const BROKECO: &str = "sk-ngrok-brokeco";

/// The credentials of the catalog: the variable holding each secret, and
/// the credential's id.
const CREDENTIALS: &[(&str, &str)] = &[
    ("NGROK_OPENAI_KEY_1", "openai-primary"),
    ("NGROK_OPENAI_KEY_2", "openai-secondary"),
    ("NGROK_ANTHROPIC_KEY_1", "anthropic-primary"),
    ("NGROK_ANTHROPIC_KEY_2", "anthropic-secondary"),
    ("NGROK_OPENROUTER_KEY", "openrouter-primary"),
];

// ---------------------------------------------------------------------------
// Requests and scenarios

/// `body` with `field` set to `value`.
fn with(mut body: Value, field: &str, value: Value) -> Value {
    body[field] = value;
    body
}

/// The providers of the catalog, by their sim paths.
const PROVIDERS: [&str; 4] = ["openai", "anthropic", "openrouter", "groq"];

/// A scenario with every provider of the catalog: the ones named with the
/// settings given (YAML flow style), the others answering 200 to everything.
fn fleet(overrides: &[(&str, &str)]) -> String {
    common::fleet(&PROVIDERS, overrides)
}

/// Every provider fails every request with 500.
const ALL_FAIL: &[(&str, &str)] = &[
    ("openai", "{sequence: [\"500\"]}"),
    ("anthropic", "{sequence: [\"500\"]}"),
    ("openrouter", "{sequence: [\"500\"]}"),
];

/// POSTs `body` as raw text (it need not be JSON) with `key` to the chat
/// completions endpoint or, as an Anthropic client, to /v1/messages.
async fn post_text(stack: &Stack, wire: Wire, key: &str, body: &str) -> Reply {
    let (path, headers): (&str, &[(&str, &str)]) = match wire {
        Wire::OpenAi => ("/v1/chat/completions", &[]),
        Wire::Anthropic => ("/v1/messages", &[("anthropic-version", "2023-06-01")]),
    };
    let mut request = stack
        .client
        .post(stack.url(path))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Reply::of(request).await
}

/// Runs a request that must not wait on the proxy's clock (which nobody
/// moves here): a wait would hang, so it fails after a generous real time.
async fn at_once<T>(request: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), request)
        .await
        .expect("the request waited on the clock")
}

// ---------------------------------------------------------------------------
// What the providers received

/// The credential a recorded request carried.
fn credential(request: &RecordedRequest) -> &'static str {
    let secret = request
        .header("authorization")
        .and_then(|value| value.strip_prefix("Bearer "))
        .or_else(|| request.header("x-api-key"))
        .unwrap_or_default();
    CREDENTIALS
        .iter()
        .find(|(variable, _)| secret.strip_prefix("secret-of-") == Some(*variable))
        .map_or("?", |(_, id)| id)
}

/// The attempts the providers received, in order, as
/// `provider/credential@upstream model`.
fn upstream(stack: &Stack) -> Vec<String> {
    stack
        .sim
        .requests()
        .iter()
        .map(|request| {
            format!(
                "{}/{}@{}",
                request.provider,
                credential(request),
                request.model.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The policy's errors, and what a client sees

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    OpenAi,
    Anthropic,
}

/// An error of ngrok.policy's `errors` section.
struct PolicyError {
    status: u16,
    code: &'static str,
    /// The `type` its status gives by default.
    kind: &'static str,
    message: &'static str,
}

const ERR_3801: PolicyError = PolicyError {
    status: 400,
    code: "ERR_NGROK_3801",
    kind: "invalid_request_error",
    message: "the request body could not be parsed",
};
const ERR_3802: PolicyError = PolicyError {
    status: 404,
    code: "ERR_NGROK_3802",
    kind: "not_found_error",
    message: "the model is unknown, or the model address is malformed",
};
const ERR_3804: PolicyError = PolicyError {
    status: 403,
    code: "ERR_NGROK_3804",
    kind: "permission_error",
    message: "the requested provider or model is blocked by the access key configuration's access scope",
};
const ERR_3805: PolicyError = PolicyError {
    status: 424,
    code: "ERR_NGROK_3805",
    kind: "invalid_request_error",
    message: "no provider key is available for the requested provider",
};
const ERR_3807: PolicyError = PolicyError {
    status: 402,
    code: "ERR_NGROK_3807",
    kind: "billing_error",
    message: "the account has no credits",
};
const ERR_3808: PolicyError = PolicyError {
    status: 504,
    code: "ERR_NGROK_3808",
    kind: "api_error",
    message: "the provider did not answer within the per-request timeout",
};
const ERR_3809: PolicyError = PolicyError {
    status: 502,
    code: "ERR_NGROK_3809",
    kind: "api_error",
    message: "the provider could not be reached",
};
const ERR_3806: PolicyError = PolicyError {
    status: 400,
    code: "ERR_NGROK_3806",
    kind: "invalid_request_error",
    message: "no provider with a key serves the model through the endpoint called",
};
const ERR_3810: PolicyError = PolicyError {
    status: 504,
    code: "ERR_NGROK_3810",
    kind: "api_error",
    message: "the total timeout was reached before any candidate succeeded",
};
const ERR_3811: PolicyError = PolicyError {
    status: 502,
    code: "ERR_NGROK_3811",
    kind: "api_error",
    message: "the provider's answer could not be used",
};

/// The error object's body in `wire`'s format.
fn assert_error_object(body: &Value, wire: Wire, error: &PolicyError, context: &str) {
    match wire {
        Wire::OpenAi => {
            assert_eq!(body["error"]["code"], error.code, "{context}");
            assert_eq!(body["error"]["type"], error.kind, "{context}");
            assert_eq!(body["error"]["message"], error.message, "{context}");
        }
        Wire::Anthropic => {
            assert_eq!(body["type"], "error", "{context}");
            assert_eq!(body["error"]["type"], error.kind, "{context}");
            assert_eq!(body["error"]["message"], error.message, "{context}");
        }
    }
}

/// A whole answer that is `error`, in `wire`'s format.
fn assert_error(reply: &Reply, wire: Wire, error: &PolicyError) {
    assert_eq!(reply.status, error.status, "{}", reply.text);
    assert_eq!(
        reply.header("content-type"),
        Some("application/json"),
        "{}",
        reply.text
    );
    assert_error_object(&reply.json, wire, error, &reply.text);
}

/// A refusal before any attempt: the error, no `ngrok-aig-attempts`, and
/// no provider asked.
fn assert_refused(stack: &Stack, reply: &Reply, wire: Wire, error: &PolicyError) {
    assert_error(reply, wire, error);
    assert_eq!(reply.header("ngrok-aig-attempts"), None, "{}", reply.text);
    assert_eq!(upstream(stack), Vec::<String>::new(), "{}", reply.text);
}

/// A provider's own error answer, passed through as it sent it: its status,
/// and its error object (the sim's default message names provider and
/// status).
fn assert_passthrough(reply: &Reply, wire: Wire, status: u16, provider: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    let message = format!("{provider} answered {status} (simulated)");
    match wire {
        Wire::OpenAi => assert_eq!(reply.json["error"]["message"], message, "{}", reply.text),
        Wire::Anthropic => {
            assert_eq!(reply.json["type"], "error", "{}", reply.text);
            assert_eq!(reply.json["error"]["message"], message, "{}", reply.text);
        }
    }
}

/// A successful whole answer (not a stream) from `provider`, whose
/// content the sim writes.
fn assert_served_by(reply: &Reply, provider: &str) {
    assert!(!reply.is_stream(), "a whole answer: {}", reply.text);
    reply.assert_served(provider);
}

// ---------------------------------------------------------------------------
// Changing the stack's copy of the data (never the shipped files)

/// Points `provider` at `base_url` instead of the sim.
fn repoint(stack: &Stack, missing: &[&str], provider: &str, base_url: &str) {
    let path = data_file(stack, "catalog.yaml");
    let catalog = std::fs::read_to_string(&path).unwrap();
    let current = catalog
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("base_url:") && line.ends_with(&format!("/{provider}/v1")))
        .unwrap()
        .to_string();
    std::fs::write(
        &path,
        catalog.replace(&current, &format!("base_url: {base_url}")),
    )
    .unwrap();
    recompile(stack, missing);
}

/// Adds an account (YAML of one `tenants:` item) to the stack's tenants.
fn add_tenant(stack: &Stack, missing: &[&str], tenant: &str) {
    let path = data_file(stack, "tenants.yaml");
    let mut tenants = std::fs::read_to_string(&path).unwrap();
    tenants.push('\n');
    tenants.push_str(tenant);
    std::fs::write(&path, tenants).unwrap();
    recompile(stack, missing);
}

/// Base URLs for `provider` that no connection reaches: a port where
/// nothing listens, a host no DNS knows, and TLS to the sim's plain HTTP.
fn unreachable(stack: &Stack, provider: &str) -> [(&'static str, String); 3] {
    let closed = closed_port();
    [
        (
            "refused",
            format!("http://127.0.0.1:{closed}/{provider}/v1"),
        ),
        ("dns", format!("http://no-such-host.invalid/{provider}/v1")),
        ("tls", format!("https://{}/{provider}/v1", stack.sim.addr())),
    ]
}

// ---------------------------------------------------------------------------
// A request in flight while the test moves the clock

/// Watches one request while the test moves the proxy's clock: what the
/// providers received and the attempts the proxy finished since it began.
struct Timeline<'a> {
    stack: &'a Stack,
    clock: &'a ManualClock,
    start_ms: u64,
    requests_before: usize,
    finished_before: u64,
    answered: AtomicBool,
}

impl<'a> Timeline<'a> {
    fn new(stack: &'a Stack, clock: &'a ManualClock) -> Timeline<'a> {
        Timeline {
            stack,
            clock,
            start_ms: clock.now_ms(),
            requests_before: stack.sim.requests().len(),
            finished_before: finished_attempts(stack),
            answered: AtomicBool::new(false),
        }
    }

    /// Runs `request` while `script` moves the clock; returns the reply.
    async fn run(
        &self,
        request: impl Future<Output = Reply>,
        script: impl Future<Output = ()>,
    ) -> Reply {
        let request = async {
            let reply = request.await;
            self.answered.store(true, Ordering::SeqCst);
            reply
        };
        let (reply, ()) = tokio::join!(request, script);
        reply
    }

    /// (requests the providers received, attempts the proxy finished).
    fn counts(&self) -> (usize, u64) {
        (
            self.stack.sim.requests().len() - self.requests_before,
            finished_attempts(self.stack) - self.finished_before,
        )
    }

    /// Waits (real time) until the providers received `requests` requests
    /// and the proxy finished `finished` attempts: it then waits on the
    /// clock (for an attempt's timeout or a retry's wait).
    async fn reached(&self, requests: usize, finished: u64) {
        let began = Instant::now();
        loop {
            let counts = self.counts();
            if counts == (requests, finished) {
                return;
            }
            assert!(
                counts.0 <= requests && counts.1 <= finished,
                "went past ({requests}, {finished}): {counts:?}, {:?}",
                upstream(self.stack)
            );
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "never reached ({requests}, {finished}): {counts:?}, {:?}",
                upstream(self.stack)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Moves the clock to `at_ms` after the request began.
    fn advance_to(&self, at_ms: u64) {
        let now = self.clock.now_ms() - self.start_ms;
        assert!(at_ms >= now, "the clock is at {now} ms already");
        self.clock.advance(at_ms - now);
    }

    /// Moves the clock to `at_ms` and checks, after a moment of real time,
    /// that nothing happened: no new upstream request, no finished
    /// attempt, no reply.
    async fn quiet_until(&self, at_ms: u64) {
        let before = self.counts();
        self.advance_to(at_ms);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(self.counts(), before, "something happened by {at_ms} ms");
        assert!(!self.answered(), "answered by {at_ms} ms");
    }

    fn answered(&self) -> bool {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits (real time) for the reply, the clock standing still.
    async fn until_answered(&self) {
        let began = Instant::now();
        while !self.answered() {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "no answer at {} ms: {:?}",
                self.clock.now_ms() - self.start_ms,
                upstream(self.stack)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

// ---------------------------------------------------------------------------
// Failures that never reach failover

/// [G24] [G25] a body that could not be parsed is ERR_NGROK_3801 at once,
/// without an attempt or the attempts header
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparseable_body_is_err_ngrok_3801_before_any_attempt() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    let unparseable = [
        (Wire::OpenAi, r#"{"model": "gpt-4o", "messages": ["#),
        (Wire::Anthropic, "not json at all"),
        // JSON, but not an object.
        (Wire::OpenAi, r#"["gpt-4o"]"#),
        (Wire::Anthropic, r#""gpt-4o""#),
    ];
    for (wire, body) in unparseable {
        let reply = at_once(post_text(&stack, wire, TUNNELCO, body)).await;
        assert_refused(&stack, &reply, wire, &ERR_3801);
    }

    // A `models` field that is not a list of strings could not be parsed
    // either.
    let reply = at_once(stack.chat(
        TUNNELCO,
        with(chat_body("gpt-4o"), "models", json!("gpt-4o-mini")),
    ))
    .await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3801);
    let reply = at_once(stack.messages(
        TUNNELCO,
        with(messages_body("gpt-4o"), "models", json!([1])),
    ))
    .await;
    assert_refused(&stack, &reply, Wire::Anthropic, &ERR_3801);
}

/// [G24] [G26] an unknown model or a malformed model address is
/// ERR_NGROK_3802 at once, even with fallback models set up
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_or_malformed_address_is_err_ngrok_3802() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-9"))).await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3802);
    let reply = at_once(stack.messages(TUNNELCO, messages_body("gpt-9"))).await;
    assert_refused(&stack, &reply, Wire::Anthropic, &ERR_3802);
    // No model at all, or one that is no text: the account's fallback model
    // does not stand in for it.
    for model in [json!(null), json!(5), json!("")] {
        let reply = at_once(stack.chat(TUNNELCO, with(chat_body("gpt-4o"), "model", model))).await;
        assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3802);
    }
    // In the models array.
    let reply = at_once(stack.chat(
        TUNNELCO,
        with(chat_body("gpt-4o"), "models", json!(["gpt-9"])),
    ))
    .await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3802);
    // No such provider, and a provider that does not serve the model.
    for address in ["nosuch:gpt-4o", "anthropic:gpt-4o"] {
        let reply = at_once(stack.chat(TUNNELCO, chat_body(address))).await;
        assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3802);
    }
}

/// [G24] [G27] the access key's scope: blocked providers and models are
/// never tried, and a request for a blocked provider or model is
/// ERR_NGROK_3804 before any attempt, though the account's fallback model
/// is in scope and has a key
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_scope_blocks_providers_and_models() {
    let clock = Arc::new(ManualClock::default());
    let missing: [&str; 0] = [];
    let stack = Stack::shipped("ngrok", &fleet(&[]), &missing, clock.clone()).await;

    // A blocked provider (the pin), and a model only blocked providers
    // serve (llama-3.3-70b: groq and openrouter).
    for model in ["openrouter:gpt-4o", "llama-3.3-70b"] {
        let reply = at_once(stack.chat(TUNNELCO_SCOPED, chat_body(model))).await;
        assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3804);
        let reply = at_once(stack.messages(TUNNELCO_SCOPED, messages_body(model))).await;
        assert_refused(&stack, &reply, Wire::Anthropic, &ERR_3804);
    }
    // The unscoped key of the same account is served.
    let reply = at_once(stack.chat(TUNNELCO, chat_body("openrouter:gpt-4o"))).await;
    assert_served_by(&reply, "openrouter");
    // A blocked model later in the models array is skipped, not refused.
    stack.sim.clear();
    let reply = at_once(stack.chat(
        TUNNELCO_SCOPED,
        with(
            chat_body("gpt-4o"),
            "models",
            json!(["openrouter:gpt-4o-mini"]),
        ),
    ))
    .await;
    assert_served_by(&reply, "openai");

    // A key whose scope allows one model (a copy of the data with one more
    // access key): its other models, the fallback one included, are blocked.
    add_tenant(
        &stack,
        &missing,
        &format!(
            "  - id: minico\n    attributes: {{credits: 10}}\n    settings: {{fallback_models: [claude-sonnet-4-5]}}\n    keys:\n      - id: minico-mini\n        sha256: {}\n        attributes: {{allowed_models: [gpt-4o-mini]}}\n",
            sha256_hex("sk-ngrok-minico-mini")
        ),
    );
    stack.sim.clear();
    let reply = at_once(stack.chat("sk-ngrok-minico-mini", chat_body("gpt-4o"))).await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3804);
    replay(&stack, &fleet(ALL_FAIL));
    let reply = at_once(stack.chat("sk-ngrok-minico-mini", chat_body("gpt-4o-mini"))).await;
    assert_passthrough(&reply, Wire::OpenAi, 500, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
        ],
        "the fallback model is out of scope"
    );

    // With every key set, the scoped key's plan for gpt-4o skips the
    // reseller, for the fallback model too (in OpenAI's format only the
    // reseller serves it): openai's two keys.
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(ALL_FAIL), &[], clock.clone()).await;
    let reply = at_once(stack.chat(TUNNELCO_SCOPED, chat_body("gpt-4o"))).await;
    assert_passthrough(&reply, Wire::OpenAi, 500, "openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
        ]
    );
    // Through /v1/messages, the scope lets anthropic serve it.
    stack.sim.clear();
    let reply = at_once(stack.messages(TUNNELCO_SCOPED, messages_body("claude-sonnet-4-5"))).await;
    assert_passthrough(&reply, Wire::Anthropic, 500, "anthropic");
    assert_eq!(
        upstream(&stack),
        [
            "anthropic/anthropic-primary@claude-sonnet-4-5",
            "anthropic/anthropic-secondary@claude-sonnet-4-5",
        ]
    );
}

/// [G27] the model list of a scoped key leaves out a model its scope
/// blocks, though the account's fallback model is in scope
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_keys_model_list_leaves_out_what_only_a_fallback_serves() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;
    let listed = |entries: Vec<Value>| -> Vec<String> {
        entries
            .iter()
            .filter_map(|entry| entry["id"].as_str().map(String::from))
            .collect()
    };
    let scoped = listed(model_list(&stack, TUNNELCO_SCOPED, false).await);
    let unscoped = listed(model_list(&stack, TUNNELCO, false).await);
    // llama runs only on providers outside the scope (groq, openrouter).
    assert!(
        unscoped.iter().any(|id| id == "llama-3.3-70b"),
        "{unscoped:?}"
    );
    assert!(!scoped.iter().any(|id| id == "llama-3.3-70b"), "{scoped:?}");
    assert!(
        scoped.iter().any(|id| id == "claude-sonnet-4-5"),
        "{scoped:?}"
    );
    stack.stop().await;
}

/// [G24] [G28] no provider key for the requested provider is
/// ERR_NGROK_3805 before any attempt, though the account's fallback model
/// has a key; a provider without a key is no candidate
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_provider_key_is_err_ngrok_3805() {
    // groq has no key at all; every other key is set.
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;
    let reply = at_once(stack.chat(TUNNELCO, chat_body("groq:llama-3.3-70b"))).await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3805);
    let reply = at_once(stack.messages(TUNNELCO, messages_body("groq:llama-3.3-70b"))).await;
    assert_refused(&stack, &reply, Wire::Anthropic, &ERR_3805);
    // Later in the models array, it is skipped, not refused.
    let reply = at_once(stack.chat(
        TUNNELCO,
        with(
            chat_body("gpt-4o-mini"),
            "models",
            json!(["groq:llama-3.3-70b"]),
        ),
    ))
    .await;
    assert_served_by(&reply, "openai");

    // Every key unset.
    let clock = Arc::new(ManualClock::default());
    let missing = [
        "NGROK_OPENAI_KEY_1",
        "NGROK_OPENAI_KEY_2",
        "NGROK_ANTHROPIC_KEY_1",
        "NGROK_ANTHROPIC_KEY_2",
        "NGROK_OPENROUTER_KEY",
    ];
    let stack = Stack::shipped("ngrok", &fleet(&[]), &missing, clock.clone()).await;
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o-mini"))).await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3805);

    // With keys, llama-3.3-70b skips keyless groq for the reseller.
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;
    let reply = at_once(stack.chat(TUNNELCO, chat_body("llama-3.3-70b"))).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        ["openrouter/openrouter-primary@meta-llama/llama-3.3-70b-instruct"]
    );
}

/// [G24] [G29] an account without credits is ERR_NGROK_3807, even with
/// every provider key available, and even with a provider key of its own
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_credits_is_err_ngrok_3807() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    let reply = at_once(stack.chat(BROKECO, chat_body("gpt-4o"))).await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3807);
    let reply = at_once(stack.messages(BROKECO, messages_body("openai:gpt-4o"))).await;
    assert_refused(&stack, &reply, Wire::Anthropic, &ERR_3807);
    let reply = at_once(stack.chat(BROKECO, streamed(chat_body("claude-sonnet-4-5")))).await;
    assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3807);

    // "even if you use your own provider keys": with an OpenAI key of its
    // own, the account is still refused, whichever key would serve.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[(
            "      - {id: openai-primary, key: \"${NGROK_OPENAI_KEY_1}\"}\n",
            "      - {id: openai-primary, key: \"${NGROK_OPENAI_KEY_1}\"}\n      - {id: brokeco-openai, key: \"${NGROK_OPENAI_KEY_1}\", tenant: brokeco}\n",
        )],
        &[],
    );
    for model in ["gpt-4o", "openai:gpt-4o"] {
        let reply = at_once(stack.chat(BROKECO, chat_body(model))).await;
        assert_refused(&stack, &reply, Wire::OpenAi, &ERR_3807);
    }
}

// ---------------------------------------------------------------------------
// Response headers

/// [G34] every response carries Ngrok-AIG-Request-Id, the id the proxy
/// logs and forwards: answers, streams, errors after failover and every
/// kind of refusal, the proxy's own before the policy decides included
/// (no key, an unknown key, a wrong method or path, the model list, a
/// body too large or compressed)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_the_request_id() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("anthropic", "{sequence: [\"500\"]}")]),
        &["NGROK_OPENROUTER_KEY"],
        clock.clone(),
    )
    .await;

    let replies = [
        (
            "an answer",
            at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await,
        ),
        (
            "a stream",
            at_once(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o")))).await,
        ),
        (
            "an error after failover",
            at_once(stack.messages(TUNNELCO, messages_body("anthropic:claude-sonnet-4-5"))).await,
        ),
        (
            "no credits",
            at_once(stack.chat(BROKECO, chat_body("gpt-4o"))).await,
        ),
        (
            "an unknown model",
            at_once(stack.chat(TUNNELCO, chat_body("gpt-9"))).await,
        ),
        (
            "a malformed models field",
            at_once(stack.chat(TUNNELCO, with(chat_body("gpt-4o"), "models", json!(7)))).await,
        ),
        (
            "a body that is not JSON",
            at_once(post_text(&stack, Wire::Anthropic, TUNNELCO, "{")).await,
        ),
        (
            "no key",
            at_once(stack.post("/v1/chat/completions", None, &[], &chat_body("gpt-4o"))).await,
        ),
        (
            "an unknown key",
            at_once(stack.chat("sk-nobody", chat_body("gpt-4o"))).await,
        ),
        (
            "a wrong method",
            at_once(Reply::of(
                stack
                    .client
                    .get(stack.url("/v1/chat/completions"))
                    .bearer_auth(TUNNELCO),
            ))
            .await,
        ),
        (
            "an unknown path",
            at_once(Reply::of(
                stack
                    .client
                    .post(stack.url("/v1/nothing"))
                    .bearer_auth(TUNNELCO),
            ))
            .await,
        ),
        (
            "the model list",
            at_once(Reply::of(
                stack
                    .client
                    .get(stack.url("/v1/models"))
                    .bearer_auth(TUNNELCO),
            ))
            .await,
        ),
        (
            "a body too large",
            at_once(Reply::of(
                stack
                    .client
                    .post(stack.url("/v1/chat/completions"))
                    .bearer_auth(TUNNELCO)
                    .body(vec![b' '; 16 * 1024 * 1024 + 1]),
            ))
            .await,
        ),
        (
            "a compressed body",
            at_once(Reply::of(
                stack
                    .client
                    .post(stack.url("/v1/chat/completions"))
                    .bearer_auth(TUNNELCO)
                    .header("content-encoding", "gzip")
                    .body(chat_body("gpt-4o").to_string()),
            ))
            .await,
        ),
    ];
    assert_eq!(replies[replies.len() - 2].1.status, 413);
    assert_eq!(replies[replies.len() - 1].1.status, 415);
    let wrong: Vec<String> = replies
        .iter()
        .filter(|(_, reply)| {
            let id = reply.header("ngrok-aig-request-id").unwrap_or_default();
            id.is_empty() || reply.header("x-request-id") != Some(id)
        })
        .map(|(what, reply)| format!("{what}: {:?}", reply.headers))
        .collect();
    assert!(wrong.is_empty(), "without the request id: {wrong:#?}");
    // The providers were asked with the same id, so a failure can be looked
    // up on both sides.
    let sent: Vec<String> = stack
        .sim
        .requests()
        .iter()
        .map(|request| {
            request
                .header("x-request-id")
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let ids: Vec<String> = replies[..3]
        .iter()
        .map(|(_, reply)| reply.header("ngrok-aig-request-id").unwrap().to_string())
        .collect();
    // The error after failover asked both of anthropic's keys.
    assert_eq!(sent, [&ids[..], &ids[2..]].concat());

    // A client's own sensible id is kept.
    let reply = at_once(stack.post(
        "/v1/chat/completions",
        Some(TUNNELCO),
        &[("x-request-id", "trace-42")],
        &chat_body("gpt-9"),
    ))
    .await;
    assert_eq!(reply.header("ngrok-aig-request-id"), Some("trace-42"));
}

/// [G24] [G35] a response after attempts carries Ngrok-AIG-Attempts, the
/// number of candidates tried; a refusal carries none
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_after_attempts_carry_the_attempt_count() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_served_by(&reply, "openai");
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("1"));
    let reply = at_once(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o")))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("1"));

    // Served by the third candidate.
    replay(&stack, &fleet(&[("openai", "{sequence: [\"500\"]}")]));
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("3"));

    // Failed after five, the attempt cap (of seven candidates: gpt-4o's
    // three, gpt-4o-mini's three, the fallback model's reseller).
    replay(&stack, &fleet(ALL_FAIL));
    let body = with(chat_body("gpt-4o"), "models", json!(["gpt-4o-mini"]));
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_passthrough(&reply, Wire::OpenAi, 500, "openai");
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("5"));

    // A stream served by the second candidate.
    replay(
        &stack,
        &fleet(&[("openai", "{sequence: [\"500\", \"200\"]}")]),
    );
    let reply = at_once(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o")))).await;
    assert_eq!(reply.streamed_text(), "hello from openai");
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("2"));

    // A same-backend retry is no further candidate.
    replay(
        &stack,
        &fleet(&[("openai", "{sequence: [\"429 retry_after=1s\", \"200\"]}")]),
    );
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 1).await;
            t.advance_to(1_000);
        })
        .await;
    assert_served_by(&reply, "openai");
    assert_eq!(upstream(&stack).len(), 2);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("1"));

    // Refused before any attempt: no header.
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-9"))).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.header("ngrok-aig-attempts"), None);
}

// ---------------------------------------------------------------------------
// What triggers failover

/// [G2] [G31] a 401 or 403 because the provider rejected the key fails over
/// to the provider's next key, or the next provider
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_key_fails_over_to_the_next_key() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    for rejection in [
        "401 code=invalid_api_key",
        "403 code=permission_denied",
        "401 code=authentication_error",
        // No reason but the status itself, as OpenRouter writes it: a
        // number (the sim writes a code in digits as one).
        "401 code=401",
    ] {
        replay(
            &stack,
            &fleet(&[(
                "openai",
                &format!("{{sequence: [\"{rejection}\", \"200\"]}}"),
            )]),
        );
        let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
        assert_served_by(&reply, "openai");
        assert_eq!(
            upstream(&stack),
            [
                "openai/openai-primary@gpt-4o",
                "openai/openai-secondary@gpt-4o"
            ],
            "{rejection}"
        );
    }

    // Anthropic says why in the error's type: authentication_error.
    replay(
        &stack,
        &fleet(&[("anthropic", "{sequence: [\"401\", \"200\"]}")]),
    );
    let reply = at_once(stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5"))).await;
    assert_served_by(&reply, "anthropic");
    assert_eq!(
        upstream(&stack),
        [
            "anthropic/anthropic-primary@claude-sonnet-4-5",
            "anthropic/anthropic-secondary@claude-sonnet-4-5"
        ]
    );

    // An exhausted credential fails over instead of failing the request.
    replay(
        &stack,
        &fleet(&[(
            "openai",
            "{sequence: [\"429 code=insufficient_quota\", \"200\"]}",
        )]),
    );
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o-mini"))).await;
    assert_served_by(&reply, "openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini"
        ]
    );
}

/// [G3] a 401 or 403 for any other reason stops the request with the
/// provider's answer
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_or_403_for_another_reason_stops() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    for (status, step) in [
        (401, "401 code=ip_not_authorized"),
        (403, "403 code=unsupported_country_region_territory"),
    ] {
        replay(
            &stack,
            &fleet(&[("openai", &format!("{{sequence: [\"{step}\"]}}"))]),
        );
        let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
        assert_passthrough(&reply, Wire::OpenAi, status, "openai");
        assert_eq!(upstream(&stack), ["openai/openai-primary@gpt-4o"], "{step}");
        assert_eq!(reply.header("ngrok-aig-attempts"), Some("1"));
    }

    // Anthropic's 403 permission_error.
    replay(&stack, &fleet(&[("anthropic", "{sequence: [\"403\"]}")]));
    let reply = at_once(stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5"))).await;
    assert_passthrough(&reply, Wire::Anthropic, 403, "anthropic");
    assert_eq!(reply.json["error"]["type"], "permission_error");
    assert_eq!(
        upstream(&stack),
        ["anthropic/anthropic-primary@claude-sonnet-4-5"]
    );
}

/// [G4] [G5] [G6] rate limits (429), server errors (500 and above) and
/// request timeouts (408) fail over; when the last candidate fails too, its
/// answer is the error
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_server_errors_and_408_fail_over() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[
            ("openai", "{sequence: [\"429\", \"503\"]}"),
            (
                "openrouter",
                "{models: {\"openai/gpt-4o\": {sequence: [\"408\"]}}}",
            ),
            ("anthropic", "{sequence: [\"529\", \"200\"]}"),
        ]),
        &[],
        clock.clone(),
    )
    .await;
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );
    // Anthropic's 529 (overloaded) is above 500 too: its next key.
    stack.sim.clear();
    let reply = at_once(stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5"))).await;
    assert_served_by(&reply, "anthropic");
    assert_eq!(
        upstream(&stack),
        [
            "anthropic/anthropic-primary@claude-sonnet-4-5",
            "anthropic/anthropic-secondary@claude-sonnet-4-5",
        ]
    );

    // Every one fails: the last provider's own answer, as it sent it.
    replay(
        &stack,
        &fleet(&[
            ("openai", "{sequence: [\"500\", \"502\"]}"),
            (
                "openrouter",
                "{models: {\"openai/gpt-4o\": {sequence: [\"504\"]}, \"anthropic/claude-sonnet-4.5\": {sequence: [\"503\"]}}}",
            ),
            ("anthropic", "{sequence: [\"599\"]}"),
        ]),
    );
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_passthrough(&reply, Wire::OpenAi, 503, "openrouter");
    assert_eq!(upstream(&stack).len(), 4);
    // In Anthropic's format on /v1/messages.
    stack.sim.clear();
    let reply = at_once(stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5"))).await;
    assert_passthrough(&reply, Wire::Anthropic, 599, "anthropic");
    assert_eq!(
        upstream(&stack),
        [
            "anthropic/anthropic-primary@claude-sonnet-4-5",
            "anthropic/anthropic-secondary@claude-sonnet-4-5",
        ]
    );
}

/// [G1] [G9] any other 4xx stops the request at once with the provider's
/// answer
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_other_4xx_stops_at_once() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(&[]), &[], clock.clone()).await;

    for (status, step) in [
        (400, "400 code=unsupported_parameter"),
        (404, "404"),
        (409, "409"),
        (413, "413"),
        (422, "422"),
    ] {
        replay(
            &stack,
            &fleet(&[("openai", &format!("{{sequence: [\"{step}\"]}}"))]),
        );
        let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
        assert_passthrough(&reply, Wire::OpenAi, status, "openai");
        assert_eq!(upstream(&stack), ["openai/openai-primary@gpt-4o"], "{step}");
    }
    replay(&stack, &fleet(&[("anthropic", "{sequence: [\"400\"]}")]));
    let reply = at_once(stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5"))).await;
    assert_passthrough(&reply, Wire::Anthropic, 400, "anthropic");
    assert_eq!(reply.json["error"]["type"], "invalid_request_error");
    assert_eq!(
        upstream(&stack),
        ["anthropic/anthropic-primary@claude-sonnet-4-5"]
    );
}

/// [G7] [G19] an account's per-request timeout is the only limit on an
/// attempt's wait, however long it is set: with 120 s, no headers, a
/// stalled body or no first event fails over at 120 s, not at a built-in
/// 60 s
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_per_request_timeout_is_not_cut_short() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("openai", "{sequence: [no_answer, \"200\"]}")]),
        &[],
        clock.clone(),
    )
    .await;
    add_tenant(
        &stack,
        &[],
        &format!(
            "  - id: slowco\n    attributes: {{credits: 10}}\n    settings: {{request_timeout: 120s, total_timeout: 300s}}\n    keys:\n      - id: slowco-default\n        sha256: {}\n",
            sha256_hex("sk-ngrok-slowco")
        ),
    );
    // No headers; a whole answer whose body stalls; a stream with no first
    // event.
    for (step, request) in [
        ("no_answer", chat_body("gpt-4o")),
        ("no_answer", streamed(chat_body("gpt-4o"))),
        ("\"stall_after=0\"", chat_body("gpt-4o")),
        ("\"first_token=30m\"", streamed(chat_body("gpt-4o"))),
    ] {
        replay(
            &stack,
            &fleet(&[("openai", &format!("{{sequence: [{step}, \"200\"]}}"))]),
        );
        let t = Timeline::new(&stack, &clock);
        let reply = t
            .run(stack.chat("sk-ngrok-slowco", request), async {
                t.reached(1, 0).await;
                t.quiet_until(119_999).await;
                t.advance_to(120_000);
                t.reached(2, 2).await;
            })
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        assert_eq!(
            upstream(&stack),
            [
                "openai/openai-primary@gpt-4o",
                "openai/openai-secondary@gpt-4o"
            ]
        );
    }

    // Nor is connecting cut short: the connect limit lies past the
    // per-request timeout, which ends a connection that hangs as a
    // timeout like the waits above. (The HTTP client connects on real
    // time, so this reads the limits the plan gives the attempt.)
    let snapshot = stack.proxy.snapshot();
    let (index, key) = snapshot
        .data
        .tenants
        .keys
        .iter()
        .enumerate()
        .find(|(_, key)| key.id == "slowco-default")
        .unwrap();
    let body = chat_body("gpt-4o");
    let context = RequestContext {
        id: Arc::from("connect"),
        endpoint: Endpoint::ChatCompletions,
        body: Ok(&body),
        body_bytes: 0,
        headers: &[],
        caller: Caller {
            tenant: key.tenant,
            workspace: key.workspace,
            key: Some(index),
        },
        seed: 0,
        rotation: &0,
    };
    let plan = evaluate(&snapshot, &context, &Healthy).result.unwrap();
    let limits = plan.timeouts(&snapshot, &Healthy, 0);
    assert_eq!(limits.attempt_ms, Some(120_000), "{limits:?}");
    assert!(limits.connect_ms > 120_000, "{limits:?}");
}

/// [G7] an attempt exceeding the per-request timeout (8 s for tunnelco,
/// on the proxy's clock) fails over; the last one is ERR_NGROK_3808
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_over_the_per_request_timeout_fails_over() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("openai", "{sequence: [no_answer, \"200\"]}")]),
        &[],
        clock.clone(),
    )
    .await;

    // No response headers in time.
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 0).await;
            t.quiet_until(7_999).await;
            t.advance_to(8_000);
            t.reached(2, 2).await;
        })
        .await;
    assert_served_by(&reply, "openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o"
        ]
    );

    // A stream whose first event does not come in time.
    replay(
        &stack,
        &fleet(&[("openai", "{sequence: [\"stall_after=0\", \"200\"]}")]),
    );
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o"))), async {
            t.reached(1, 0).await;
            t.quiet_until(7_999).await;
            t.advance_to(8_000);
            t.reached(2, 2).await;
        })
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.streamed_text(), "hello from openai");
    assert_eq!(reply.events().last().unwrap().1, "[DONE]");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o"
        ]
    );

    // The only candidate times out: ERR_NGROK_3808 at 8 s.
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("anthropic", "{sequence: [no_answer]}")]),
        &["NGROK_OPENROUTER_KEY", "NGROK_ANTHROPIC_KEY_2"],
        clock.clone(),
    )
    .await;
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(
            stack.messages(TUNNELCO, messages_body("anthropic:claude-sonnet-4-5")),
            async {
                t.reached(1, 0).await;
                t.quiet_until(7_999).await;
                t.advance_to(8_000);
                t.until_answered().await;
            },
        )
        .await;
    assert_error(&reply, Wire::Anthropic, &ERR_3808);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("1"));
}

/// [G8] network failures (a dropped connection, a refused connection, a
/// DNS failure, a TLS failure) fail over; the last one is ERR_NGROK_3809
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_failures_fail_over() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("openai", "{sequence: [reset]}")]),
        &[],
        clock.clone(),
    )
    .await;

    // The connection drops before the response.
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
        ]
    );

    // No connection at all: openai's two keys fail without reaching it.
    for (what, base_url) in unreachable(&stack, "openai") {
        repoint(&stack, &[], "openai", &base_url);
        replay(&stack, &fleet(&[]));
        let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
        assert_served_by(&reply, "openrouter");
        assert_eq!(reply.header("ngrok-aig-attempts"), Some("3"), "{what}");
        assert_eq!(
            upstream(&stack),
            ["openrouter/openrouter-primary@openai/gpt-4o"],
            "{what}"
        );
    }

    // The last candidate cannot be reached: ERR_NGROK_3809, in either format.
    let clock = Arc::new(ManualClock::default());
    let missing = ["NGROK_OPENROUTER_KEY"];
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("anthropic", "{sequence: [reset]}")]),
        &missing,
        clock.clone(),
    )
    .await;
    let reply = at_once(stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5"))).await;
    assert_error(&reply, Wire::Anthropic, &ERR_3809);
    assert_eq!(upstream(&stack).len(), 2);
    // Without the reseller's key, gpt-4o-mini's last candidate is openai's
    // second key (the fallback model has no route in OpenAI's format).
    for (what, base_url) in unreachable(&stack, "openai") {
        repoint(&stack, &missing, "openai", &base_url);
        let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o-mini"))).await;
        assert_error(&reply, Wire::OpenAi, &ERR_3809);
        assert_eq!(reply.header("ngrok-aig-attempts"), Some("2"), "{what}");
    }
}

/// [G8] a connection that drops after the response headers, before any
/// byte reached the client, is a network failure too: it fails over
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_before_the_first_byte_fails_over() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("openai", "{sequence: [\"cut_after=0\", \"200\"]}")]),
        &[],
        clock.clone(),
    )
    .await;
    // A stream cut before its first event.
    let reply = at_once(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o")))).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.streamed_text(), "hello from openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o"
        ]
    );
    // A whole answer cut halfway.
    replay(
        &stack,
        &fleet(&[("openai", "{sequence: [\"cut_after=1\", \"200\"]}")]),
    );
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_served_by(&reply, "openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o"
        ]
    );
}

/// [G1] [G36] where the gateway goes next depends on how the attempt
/// failed: the same backend (429 with a short Retry-After), the next
/// candidate (500), or nowhere (400)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_gateway_goes_next_depends_on_the_failure() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[(
            "openai",
            "{sequence: [\"429 retry_after=1s\", \"500\", \"400 code=unsupported_parameter\"]}",
        )]),
        &[],
        clock.clone(),
    )
    .await;
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 1).await;
            t.quiet_until(999).await;
            t.advance_to(1_000);
        })
        .await;
    assert_passthrough(&reply, Wire::OpenAi, 400, "openai");
    assert_eq!(reply.json["error"]["code"], "unsupported_parameter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
        ]
    );
}

// ---------------------------------------------------------------------------
// Failover order

/// [G10] [G15] candidates come from the model field first, then the models
/// array in order; listing another model there fails over to it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_come_from_the_model_field_then_the_models_array() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(ALL_FAIL), &[], clock.clone()).await;

    let body = with(
        chat_body("gpt-4o-mini"),
        "models",
        json!(["llama-3.3-70b", "gpt-4o"]),
    );
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_passthrough(&reply, Wire::OpenAi, 500, "openai");
    // Five attempts at most (the plan has nine).
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
            "openrouter/openrouter-primary@meta-llama/llama-3.3-70b-instruct",
            "openai/openai-primary@gpt-4o",
        ]
    );
    // The models array is the gateway's; providers never see it.
    assert!(
        stack
            .sim
            .requests()
            .iter()
            .all(|request| request.body.get("models").is_none())
    );

    // The models array alone.
    stack.sim.clear();
    let body = json!({"models": ["claude-sonnet-4-5", "gpt-4o-mini"], "messages": []});
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_passthrough(&reply, Wire::OpenAi, 500, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
        ]
    );

    // gpt-4o-mini fails everywhere; the listed gpt-4o serves.
    replay(
        &stack,
        &fleet(&[
            ("openai", "{models: {gpt-4o-mini: {sequence: [\"500\"]}}}"),
            (
                "openrouter",
                "{models: {\"openai/gpt-4o-mini\": {sequence: [\"500\"]}}}",
            ),
        ]),
    );
    let body = with(chat_body("gpt-4o-mini"), "models", json!(["gpt-4o"]));
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_served_by(&reply, "openai");
    assert_eq!(reply.json["model"], "gpt-4o");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
            "openai/openai-primary@gpt-4o",
        ]
    );
}

/// [G16] the account's fallback models come after the request's own
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_models_come_after_the_requested_ones() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[
            ("openai", "{sequence: [\"503\"]}"),
            (
                "openrouter",
                "{models: {\"openai/gpt-4o-mini\": {sequence: [\"503\"]}, \"meta-llama/llama-3.3-70b-instruct\": {sequence: [\"503\"]}}}",
            ),
        ]),
        &[],
        clock.clone(),
    )
    .await;
    // The fallback model's route in OpenAI's format is the reseller's.
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o-mini"))).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(reply.json["model"], "anthropic/claude-sonnet-4.5");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );

    // After the models array too.
    stack.sim.clear();
    let body = with(chat_body("gpt-4o-mini"), "models", json!(["llama-3.3-70b"]));
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o-mini",
            "openai/openai-secondary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
            "openrouter/openrouter-primary@meta-llama/llama-3.3-70b-instruct",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );
}

/// [G13] a bare model id expands to every provider serving it, the model's
/// author first, then resellers (whatever the catalog's order); decided:
/// only providers that speak the format of the endpoint called serve it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_id_goes_to_the_author_first_then_resellers() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(ALL_FAIL), &[], clock.clone()).await;

    // The catalog lists openrouter first for gpt-4o. The fallback model's
    // author, anthropic, speaks only Anthropic's format.
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_eq!(reply.status, 500);
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );

    // Through /v1/messages only anthropic serves claude-sonnet-4-5; a model
    // of the array that no provider serves in that format is skipped.
    stack.sim.clear();
    let body = with(
        messages_body("claude-sonnet-4-5"),
        "models",
        json!(["gpt-4o-mini"]),
    );
    let reply = at_once(stack.messages(TUNNELCO, body)).await;
    assert_eq!(reply.status, 500);
    assert_eq!(
        upstream(&stack),
        [
            "anthropic/anthropic-primary@claude-sonnet-4-5",
            "anthropic/anthropic-secondary@claude-sonnet-4-5",
        ]
    );
    assert!(
        stack
            .sim
            .requests()
            .iter()
            .all(|r| r.path == "/anthropic/v1/messages")
    );

    // A requested model that none does is refused before any attempt.
    stack.sim.clear();
    let reply = at_once(stack.messages(TUNNELCO, messages_body("gpt-4o"))).await;
    assert_refused(&stack, &reply, Wire::Anthropic, &ERR_3806);
}

/// [G14] a provider:model id reaches only that provider
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_model_id_reaches_only_that_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(ALL_FAIL), &[], clock.clone()).await;
    // The fallback model's route in OpenAI's format.
    let fallback = ["openrouter/openrouter-primary@anthropic/claude-sonnet-4.5"];

    for (address, expected) in [
        (
            "openai:gpt-4o",
            vec![
                "openai/openai-primary@gpt-4o",
                "openai/openai-secondary@gpt-4o",
            ],
        ),
        (
            "openrouter:gpt-4o",
            vec!["openrouter/openrouter-primary@openai/gpt-4o"],
        ),
        (
            "OpenAI:gpt-4o-mini",
            vec![
                "openai/openai-primary@gpt-4o-mini",
                "openai/openai-secondary@gpt-4o-mini",
            ],
        ),
    ] {
        stack.sim.clear();
        let reply = at_once(stack.chat(TUNNELCO, chat_body(address))).await;
        assert_eq!(reply.status, 500, "{address}");
        // Then the account's fallback model.
        let expected: Vec<&str> = expected.into_iter().chain(fallback).collect();
        assert_eq!(upstream(&stack), expected, "{address}");
    }
}

/// [G11] [G12] each model and key combination is one candidate, tried
/// once, however often the request names it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_and_key_is_tried_once() {
    // With openai's second key unset the plans are short enough that a
    // repeated candidate would show within the five attempts.
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(ALL_FAIL),
        &["NGROK_OPENAI_KEY_2"],
        clock.clone(),
    )
    .await;

    let body = with(
        chat_body("gpt-4o"),
        "models",
        json!(["openai:gpt-4o", "gpt-4o"]),
    );
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_eq!(reply.status, 500);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("3"));
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );

    // The fallback model requested by the client keeps the client's place.
    stack.sim.clear();
    let body = with(
        chat_body("claude-sonnet-4-5"),
        "models",
        json!(["gpt-4o-mini"]),
    );
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_eq!(reply.status, 500);
    assert_eq!(
        upstream(&stack),
        [
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
            "openai/openai-primary@gpt-4o-mini",
            "openrouter/openrouter-primary@openai/gpt-4o-mini",
        ]
    );
}

// ---------------------------------------------------------------------------
// Retrying the same provider

/// [G17] a 429 or 503 with a Retry-After of 5 s or less is retried on the
/// same backend (provider, key and model) after exactly that wait
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_retry_after_retries_the_same_backend() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[(
            "openai",
            "{sequence: [\"429 retry_after=3s\", \"503 retry_after=5s\", \"200\"]}",
        )]),
        &[],
        clock.clone(),
    )
    .await;
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 1).await;
            t.quiet_until(2_999).await;
            t.advance_to(3_000);
            t.reached(2, 2).await;
            t.quiet_until(7_999).await;
            t.advance_to(8_000);
            t.reached(3, 3).await;
        })
        .await;
    assert_served_by(&reply, "openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
        ]
    );

    // The same on /v1/messages.
    replay(
        &stack,
        &fleet(&[("anthropic", "{sequence: [\"429 retry_after=2s\", \"200\"]}")]),
    );
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(
            stack.messages(TUNNELCO, messages_body("claude-sonnet-4-5")),
            async {
                t.reached(1, 1).await;
                t.quiet_until(1_999).await;
                t.advance_to(2_000);
            },
        )
        .await;
    assert_served_by(&reply, "anthropic");
    assert_eq!(
        upstream(&stack),
        [
            "anthropic/anthropic-primary@claude-sonnet-4-5",
            "anthropic/anthropic-primary@claude-sonnet-4-5",
        ]
    );
}

/// [G17] [G18] at most two same-backend retries per request, counted
/// across candidates; after them a 429 moves to the next candidate at once
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_backend_retries_at_most_twice_per_request() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[(
            "openai",
            "{sequence: [\"429 retry_after=1s\", \"429 retry_after=1s\", \"429 retry_after=1s\", \"200\"]}",
        )]),
        &[],
        clock.clone(),
    )
    .await;
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 1).await;
            t.advance_to(1_000);
            t.reached(2, 2).await;
            t.advance_to(2_000);
            // The third 429 moves on without a wait.
            t.until_answered().await;
        })
        .await;
    assert_served_by(&reply, "openai");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
        ]
    );

    // Two retries on the first key leave none for the second.
    replay(
        &stack,
        &fleet(&[(
            "openai",
            "{sequence: [\"429 retry_after=1s\", \"503 retry_after=1s\", \"500\", \"429 retry_after=1s\"]}",
        )]),
    );
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 1).await;
            t.advance_to(1_000);
            t.reached(2, 2).await;
            t.advance_to(2_000);
            t.until_answered().await;
        })
        .await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
        ]
    );
}

/// [G17] [G18] a Retry-After over 5 s, or on a status other than 429 and
/// 503, is a rate limit or server error: the next candidate, at once
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_retry_after_or_another_status_moves_on_at_once() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[
            (
                "openai",
                "{sequence: [\"429 retry_after=6s\", \"503 retry_after=6s\"]}",
            ),
            (
                "openrouter",
                "{sequence: [\"502 retry_after=2s\", \"200\"]}",
            ),
        ]),
        &[],
        clock.clone(),
    )
    .await;
    let reply = at_once(stack.chat(TUNNELCO, chat_body("gpt-4o"))).await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );
    assert_eq!(clock.now_ms(), 0);
}

/// [G17] [G18] a same-backend retry only when its wait still fits inside
/// the total timeout (tunnelco: 20 s); otherwise the next candidate
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_only_when_the_wait_fits_the_total_timeout() {
    let clock = Arc::new(ManualClock::default());
    // openai's two keys use 16 s of the 20 s; then a 4 s wait does not fit.
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[
            ("openai", "{sequence: [no_answer]}"),
            (
                "openrouter",
                "{sequence: [\"429 retry_after=4s\", \"200\"]}",
            ),
        ]),
        &[],
        clock.clone(),
    )
    .await;
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 0).await;
            t.advance_to(8_000);
            t.reached(2, 1).await;
            t.advance_to(16_000);
            t.until_answered().await;
        })
        .await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
            "openrouter/openrouter-primary@anthropic/claude-sonnet-4.5",
        ]
    );

    // A 3 s wait fits (16 s + 3 s < 20 s): the same backend at 19 s.
    replay(
        &stack,
        &fleet(&[
            ("openai", "{sequence: [no_answer]}"),
            (
                "openrouter",
                "{sequence: [\"429 retry_after=3s\", \"200\"]}",
            ),
        ]),
    );
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 0).await;
            t.advance_to(8_000);
            t.reached(2, 1).await;
            t.advance_to(16_000);
            t.reached(3, 3).await;
            t.quiet_until(18_999).await;
            t.advance_to(19_000);
        })
        .await;
    assert_served_by(&reply, "openrouter");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
        ]
    );
}

// ---------------------------------------------------------------------------
// What bounds the retrying

/// [G21] the account's own timeouts apply (tunnelco: 8 s per request);
/// an account that sets none gets 30 s per request and 60 s in total
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_timeouts_and_their_defaults() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("openai", "{sequence: [no_answer]}")]),
        &[],
        clock.clone(),
    )
    .await;
    // An account with credits and no timeouts of its own (a copy of the
    // data with one more account).
    add_tenant(
        &stack,
        &[],
        &format!(
            "  - id: plainco\n    attributes: {{credits: 10}}\n    keys:\n      - id: plainco-default\n        sha256: {}\n",
            sha256_hex("sk-ngrok-plainco")
        ),
    );

    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 0).await;
            t.quiet_until(7_999).await;
            t.advance_to(8_000);
            t.reached(2, 1).await;
            t.quiet_until(15_999).await;
            t.advance_to(16_000);
            t.until_answered().await;
        })
        .await;
    assert_served_by(&reply, "openrouter");

    stack.sim.clear();
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat("sk-ngrok-plainco", chat_body("gpt-4o")), async {
            t.reached(1, 0).await;
            t.quiet_until(29_999).await;
            t.advance_to(30_000);
            t.reached(2, 1).await;
            t.quiet_until(59_999).await;
            t.advance_to(60_000);
            t.until_answered().await;
        })
        .await;
    // At 60 s the total timeout ends the request, though openrouter remains.
    assert_error(&reply, Wire::OpenAi, &ERR_3810);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("2"));
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o"
        ]
    );
}

/// [G19] [G23] two timeouts and an attempt cap bound every request: five
/// attempts at most, 8 s each, and when the total timeout (20 s) is
/// reached failover stops, though candidates remain, with ERR_NGROK_3810
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_timeouts_and_an_attempt_cap_bound_every_request() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ngrok", &fleet(ALL_FAIL), &[], clock.clone()).await;

    // The cap: five of the seven candidates.
    let body = with(chat_body("gpt-4o-mini"), "models", json!(["gpt-4o"]));
    let reply = at_once(stack.chat(TUNNELCO, body)).await;
    assert_eq!(reply.status, 500);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("5"));
    assert_eq!(upstream(&stack).len(), 5);

    // The timeouts: each attempt ends at 8 s, the request at 20 s.
    replay(
        &stack,
        &fleet(&[
            ("openai", "{sequence: [no_answer]}"),
            ("openrouter", "{sequence: [no_answer]}"),
            ("anthropic", "{sequence: [no_answer]}"),
        ]),
    );
    let t = Timeline::new(&stack, &clock);
    let reply = t
        .run(stack.chat(TUNNELCO, chat_body("gpt-4o")), async {
            t.reached(1, 0).await;
            t.quiet_until(7_999).await;
            t.advance_to(8_000);
            t.reached(2, 1).await;
            t.quiet_until(15_999).await;
            t.advance_to(16_000);
            t.reached(3, 2).await;
            t.quiet_until(19_999).await;
            t.advance_to(20_000);
            t.until_answered().await;
        })
        .await;
    assert_error(&reply, Wire::OpenAi, &ERR_3810);
    assert_eq!(reply.header("ngrok-aig-attempts"), Some("3"));
    // The fallback model's candidate was never tried.
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@openai/gpt-4o",
        ]
    );
}

// ---------------------------------------------------------------------------
// Streams

/// [G20] after a stream's first byte nothing fails over: a broken stream
/// ends with an ERR_NGROK_3811 error event in the caller's format; a
/// malformed answer or a redirect stops with ERR_NGROK_3811 too, while a
/// stream that fails before its first byte still fails over
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_commit_at_the_first_byte() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[
            ("openai", "{sequence: [\"cut_after=2\"]}"),
            ("anthropic", "{sequence: [\"malformed_chunk=2\"]}"),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    // OpenAI: two content chunks, then the error event, no [DONE].
    let reply = at_once(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o")))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    let events = reply.events();
    let (name, last) = events.last().unwrap();
    assert_eq!(*name, None, "{}", reply.text);
    assert_error_object(
        &serde_json::from_str(last).unwrap(),
        Wire::OpenAi,
        &ERR_3811,
        &reply.text,
    );
    assert!(!reply.text.contains("[DONE]"));
    assert!(!reply.streamed_text().is_empty());
    assert_eq!(upstream(&stack), ["openai/openai-primary@gpt-4o"]);

    // Anthropic: a malformed event after the first one: `event: error`.
    stack.sim.clear();
    let reply =
        at_once(stack.messages(TUNNELCO, streamed(messages_body("claude-sonnet-4-5")))).await;
    assert_eq!(reply.status, 200);
    let events = reply.events();
    let (name, last) = events.last().unwrap();
    assert_eq!(name.as_deref(), Some("error"), "{}", reply.text);
    assert_error_object(
        &serde_json::from_str(last).unwrap(),
        Wire::Anthropic,
        &ERR_3811,
        &reply.text,
    );
    assert!(!reply.text.contains("message_stop"));
    assert_eq!(
        upstream(&stack),
        ["anthropic/anthropic-primary@claude-sonnet-4-5"]
    );

    // A malformed answer, a malformed first event, a redirect: stop.
    for (step, stream) in [("malformed", false), ("malformed", true), ("302", false)] {
        replay(
            &stack,
            &fleet(&[("openai", &format!("{{sequence: [\"{step}\"]}}"))]),
        );
        let body = if stream {
            streamed(chat_body("gpt-4o"))
        } else {
            chat_body("gpt-4o")
        };
        let reply = at_once(stack.chat(TUNNELCO, body)).await;
        assert_error(&reply, Wire::OpenAi, &ERR_3811);
        assert_eq!(upstream(&stack), ["openai/openai-primary@gpt-4o"], "{step}");
    }

    // Before the first byte a stream still fails over.
    replay(
        &stack,
        &fleet(&[("openai", "{sequence: [\"500\", \"200\"]}")]),
    );
    let reply = at_once(stack.chat(TUNNELCO, streamed(chat_body("gpt-4o")))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.streamed_text(), "hello from openai");
    assert_eq!(reply.events().last().unwrap().1, "[DONE]");
    assert_eq!(
        upstream(&stack),
        [
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
        ]
    );
}

/// [G20] after the first byte, silence as long as the per-request timeout
/// (8 s) does not fail over either: the stream ends with an ERR_NGROK_3811
/// error event
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_for_the_per_request_timeout_ends_a_committed_stream() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ngrok",
        &fleet(&[("openai", "{sequence: [\"stall_after=2\"]}")]),
        &[],
        clock.clone(),
    )
    .await;
    let opening = spawn_open_chat(&stack, TUNNELCO, streamed(chat_body("gpt-4o")));
    // The headers go out with the first event: the stream is committed
    // before the clock moves.
    let response = finished(opening).await;
    assert_eq!(response.status().as_u16(), 200);
    let reading = tokio::spawn(Reply::rest(response, String::new(), Instant::now()));
    clock.advance(7_999);
    settle().await;
    assert!(!reading.is_finished(), "ended before 8 s");
    clock.advance(1);
    let reply = finished(reading).await;
    let events = reply.events();
    let (_, last) = events.last().unwrap();
    assert_error_object(
        &serde_json::from_str(last).unwrap(),
        Wire::OpenAi,
        &ERR_3811,
        &reply.text,
    );
    assert!(!reply.text.contains("[DONE]"));
    assert_eq!(upstream(&stack), ["openai/openai-primary@gpt-4o"]);
}

/// [G20] "Streams work differently after the first byte": a committed
/// stream that keeps sending outlasts the per-request timeout (8 s) and the
/// total timeout (20 s) alike, and ends as the provider ends it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_stream_that_keeps_sending_outlasts_both_timeouts() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped_on_one_clock(
        "ngrok",
        &fleet(&[("openai", "{chunks: 30, chunk_interval: 1s}")]),
        clock.clone(),
    )
    .await;
    let reply = advance_until(
        &clock,
        1_000,
        60_000,
        stack.chat(TUNNELCO, streamed(chat_body("gpt-4o"))),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(!reply.text.contains("\"error\""), "{}", reply.text);
    assert_eq!(
        reply.events().last().map(|(_, data)| data.as_str()),
        Some("[DONE]"),
        "{}",
        reply.text
    );
    assert_eq!(upstream(&stack), ["openai/openai-primary@gpt-4o"]);
}
