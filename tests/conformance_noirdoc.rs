//! Noirdoc (`shared/seeds/noirdoc-providers-and-routing.txt`) end to end:
//! the shipped `policies/noirdoc.policy` served by the real proxy on
//! loopback, in front of simulated providers, with the proxy's time on a
//! manual clock. Each test names the CONFORMANCE.md rows it proves.
//!
//! The plans these tests rely on (weighted price = 3 × input + output):
//! - `qwen3.8-27b`: aki-io (1.20, prio 10), scaleway (1.20, prio 8, listed
//!   2024-01-10), ionos (1.20, prio 8, listed 2024-06-15), together
//!   (unpriced, prio 5); aki-io is the only starter provider and the only
//!   one with a capacity limit (4 at a time, 120 a minute).
//! - `gpt-oss-120b`: together (0.60, prio 5) first; then failover takes
//!   scaleway (1.20, prio 8), ionos (1.50, prio 8), openai (0.90, prio 6),
//!   and aki-io (no complete price, prio 10) last: never after a priced one.
//! - `gpt-5`: managed openai, and acme's own `acme-openai` (named
//!   `openai-acme`); the tenants `starter-byok` and `managed-off-byok`
//!   have their own too (`starter-byok-openai`, `managed-off-byok-openai`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{
    HEALTHY, Reply, Stack, advance_until, asked_since, chat, chat_body, finished,
    headers_come_after, messages, messages_body, model_list, names, replay, settle, spawn_chat,
    spawn_open_chat, spawn_post, streamed, tried_by, until, until_sleeping,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;
use switchyard::state::{Clock, ManualClock};
use tokio::task::JoinHandle;

// The test keys of policies/noirdoc/tenants.yaml.
const ACME: &str = "sk-noirdoc-acme";
const ACME_AKI_ONLY: &str = "sk-noirdoc-acme-aki";
const ACME_S203: &str = "sk-noirdoc-acme-s203";
const ACME_EU: &str = "sk-noirdoc-acme-eu";
const ACME_MANAGED_OPENAI: &str = "sk-noirdoc-acme-openai";
const ACME_DE: &str = "sk-noirdoc-acme-de";
const ACME_NO_CLOUD_ACT: &str = "sk-noirdoc-acme-no-cloud-act";
const KANZLEI: &str = "sk-noirdoc-kanzlei";
const STARTUP: &str = "sk-noirdoc-startup";
const MANAGED_OFF: &str = "sk-noirdoc-managed-off";
// Keys for which two neighbouring conditions both refuse some models.
const KANZLEI_QWEN_ONLY: &str = "sk-noirdoc-kanzlei-qwen";
const KANZLEI_FR: &str = "sk-noirdoc-kanzlei-fr";
const STARTUP_IONOS_ONLY: &str = "sk-noirdoc-startup-ionos";
const STARTER_MANAGED_OFF: &str = "sk-noirdoc-starter-managed-off";
// Organisations with their own OpenAI account (BYOK) for gpt-5: one on
// starter credit, one with managed models turned off.
const STARTER_BYOK: &str = "sk-noirdoc-starter-byok";
const MANAGED_OFF_BYOK: &str = "sk-noirdoc-managed-off-byok";

const QWEN: &str = "qwen3.8-27b";
const GPT_OSS: &str = "gpt-oss-120b";
const GPT_5: &str = "gpt-5";
const CLAUDE: &str = "claude-sonnet-4-5";
const EMBED: &str = "mistral-embed";

/// Every provider of the catalog; a provider the scenario did not name
/// would answer 404, which the policy treats as the provider's answer.
const PROVIDERS: [&str; 9] = [
    "aki-io",
    "ionos",
    "scaleway",
    "together",
    "openai",
    "anthropic",
    "acme-openai",
    "starter-byok-openai",
    "managed-off-byok-openai",
];

// The policy's error messages: the Anthropic error object has no `code`,
// so there the message says which error answered.
const WRONG_ENDPOINT: &str =
    "the model belongs to a different endpoint family or API format than the endpoint called";
const MODEL_NOT_ALLOWED: &str = "the model is not one of this key's allowed models";
const NOT_ALLOWED_FOR_TENANT: &str = "the organisation counts as bound by professional secrecy (§ 203 StGB); this excludes every provider that offers this model";
const NOT_ALLOWED_FOR_KEY: &str = "the key's restrictions (providers, data residency, CLOUD Act, § 203) exclude every provider of this model";
const STARTER: &str = "the organisation is still using only its starter credit, and the model or its managed provider is not included in starter credit";
const NOT_AVAILABLE: &str = "the model ID is not available to the organisation";
const OVERLOADED: &str = "the provider is overloaded";
const PROVIDER_ERROR: &str = "the provider returned an error";

/// A scenario in which every provider answers 200 but those given a
/// sequence of steps.
fn scenario(sequences: &[(&str, &[&str])]) -> String {
    common::scenario(&PROVIDERS, sequences)
}

/// A POST to another OpenAI endpoint and the providers it asked.
async fn openai_post(stack: &Stack, path: &str, key: &str, body: Value) -> (Reply, Vec<String>) {
    tried_by(stack, stack.post(path, Some(key), &[], &body)).await
}

/// `X-Noirdoc-Provider`.
fn provider_header(reply: &Reply) -> Option<&str> {
    reply.header("x-noirdoc-provider")
}

/// A successful chat completion (a whole one) from `provider`, which the
/// header names as `name`.
fn assert_chat_served(reply: &Reply, provider: &str, name: &str) {
    reply.assert_served(provider);
    assert_eq!(
        reply.chat_text(),
        format!("hello from {provider}"),
        "{}",
        reply.text
    );
    assert_eq!(provider_header(reply), Some(name));
}

/// A refusal by an eligibility condition on an OpenAI endpoint: the
/// condition's code with its status, type and message; `what` says which
/// request it was.
fn assert_refused(reply: &Reply, code: &str, what: &str) {
    assert_eq!(reply.json["error"]["code"], code, "{what}: {}", reply.text);
    let (status, error_type, expected) = match code {
        "model_not_allowed_for_key" => (403, "permission_error", MODEL_NOT_ALLOWED),
        "provider_not_allowed_for_tenant" => (403, "permission_error", NOT_ALLOWED_FOR_TENANT),
        "provider_not_allowed_for_key" => (403, "permission_error", NOT_ALLOWED_FOR_KEY),
        "starter_model_not_allowed" => (403, "permission_error", STARTER),
        "model_not_available" => (404, "not_found_error", NOT_AVAILABLE),
        other => panic!("{other} is not an eligibility error"),
    };
    let message = reply.openai_error(status, code, error_type);
    assert_eq!(message, expected, "{what}");
}

/// The upstream model of the latest request the sim received.
fn last_upstream_model(stack: &Stack) -> Option<String> {
    stack.sim.requests().last().and_then(|r| r.model.clone())
}

/// How many requests the sim received for `provider`.
fn asked(stack: &Stack, provider: &str) -> usize {
    stack
        .providers_tried()
        .iter()
        .filter(|p| *p == provider)
        .count()
}

/// How many requests started waiting for capacity (the proxy's metric).
fn capacity_waits(stack: &Stack) -> u64 {
    stack
        .proxy
        .metrics
        .render()
        .lines()
        .find_map(|line| line.strip_prefix("switchyard_capacity_waits_total "))
        .map_or(0, |value| value.trim().parse::<f64>().unwrap() as u64)
}

/// Four requests hanging at aki-io (it never answers them): its
/// concurrency limit is reached.
async fn fill_aki_io(stack: &Stack) -> Vec<JoinHandle<Reply>> {
    let hung: Vec<JoinHandle<Reply>> = (0..4)
        .map(|_| spawn_chat(stack, ACME, chat_body(QWEN)))
        .collect();
    until("four requests in flight at aki-io", || {
        asked(stack, "aki-io") == 4
    })
    .await;
    hung
}

fn ids(entries: &[Value]) -> Vec<&str> {
    entries.iter().map(|e| e["id"].as_str().unwrap()).collect()
}

fn owned_by<'a>(entries: &'a [Value], id: &str) -> &'a Value {
    &entries.iter().find(|e| e["id"] == id).unwrap()["owned_by"]
}

// ---------------------------------------------------------------------
// Eligibility

/// [N1] the request names the model only: no pins, and a provider named
/// in the body does not choose the provider
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_the_caller_chooses_the_model_never_the_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let mut body = chat_body(QWEN);
    body["provider"] = json!("ionos");
    let (reply, tried) = chat(&stack, ACME, body).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(tried, names(&["aki-io"]));

    for pinned in [
        "ionos/qwen3.8-27b",
        "ionos:qwen3.8-27b",
        "@ionos-platform/qwen3.8-27b",
    ] {
        let (reply, tried) = chat(&stack, ACME, chat_body(pinned)).await;
        reply.openai_error(404, "model_not_available", "not_found_error");
        assert!(tried.is_empty(), "{pinned} reached {tried:?}");
    }
    stack.stop().await;
}

/// [N2] a model has several providers: qwen3.8-27b is served by each of
/// its four, under their own upstream model names
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_a_model_is_available_from_several_providers() {
    let clock = Arc::new(ManualClock::default());
    let busy: &[&str] = &["429 retry_after=60s"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", busy), ("scaleway", busy), ("ionos", busy)]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    // The three priced providers are paused now; the fourth serves.
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "together", "together");
    let tried: Vec<(String, String)> = stack
        .tried()
        .into_iter()
        .map(|(provider, model)| (provider, model.unwrap()))
        .collect();
    let expected = [
        ("aki-io", "qwen/qwen3.8-27b"),
        ("scaleway", "qwen3.8-27b-instruct"),
        ("ionos", "Qwen3.8-27B-Instruct"),
        ("together", "Qwen/Qwen3.8-27B"),
    ];
    assert_eq!(
        tried,
        expected
            .iter()
            .map(|(p, m)| (p.to_string(), m.to_string()))
            .collect::<Vec<_>>()
    );
    stack.stop().await;
}

/// [N3] an unknown model id is 404 model_not_available, in either wire format
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n3_an_unknown_model_is_404_model_not_available() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let (reply, tried) = chat(&stack, ACME, chat_body("gpt-9-ultra")).await;
    let message = reply.openai_error(404, "model_not_available", "not_found_error");
    assert_eq!(message, NOT_AVAILABLE);
    assert!(tried.is_empty());
    assert_eq!(provider_header(&reply), None);

    let (reply, tried) = messages(&stack, ACME, messages_body("claude-unknown")).await;
    assert_eq!(reply.anthropic_error(404, "not_found_error"), NOT_AVAILABLE);
    // The seed's code, on /v1/messages too.
    assert_eq!(reply.json["error"]["code"], "model_not_available");
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [N3] decided: a model whose only route uses another organisation's key
/// (gpt-5 without the platform's openai key: only acme's own) does not
/// exist for the others: 404 model_not_available; acme itself is served
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n3_a_model_only_another_organisations_key_serves_is_404() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(HEALTHY),
        &["NOIRDOC_OPENAI_KEY"],
        clock.clone(),
    )
    .await;

    for key in [KANZLEI, STARTUP, MANAGED_OFF] {
        let (reply, tried) = chat(&stack, key, chat_body(GPT_5)).await;
        let message = reply.openai_error(404, "model_not_available", "not_found_error");
        assert_eq!(message, NOT_AVAILABLE);
        assert!(tried.is_empty());
    }
    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "acme-openai", "openai-acme");
    assert_eq!(tried, names(&["acme-openai"]));
    stack.stop().await;
}

/// [N4] the conditions are checked in the error table's order: the first
/// condition that leaves no provider answers, whatever later ones say
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n4_the_first_condition_that_leaves_no_provider_answers() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    // The endpoint before the key's allowed models (startup may not call gpt-5).
    let (reply, _) = messages(&stack, STARTUP, messages_body(GPT_5)).await;
    assert_eq!(
        reply.anthropic_error(400, "invalid_request_error"),
        WRONG_ENDPOINT
    );
    // The endpoint before § 203 (kanzlei has no approved Claude provider).
    let (reply, _) = chat(&stack, KANZLEI, chat_body(CLAUDE)).await;
    reply.openai_error(400, "wrong_endpoint_for_model", "invalid_request_error");
    // The endpoint before the key's restrictions (anthropic is in the US).
    let (reply, _) = chat(&stack, ACME_EU, chat_body(CLAUDE)).await;
    reply.openai_error(400, "wrong_endpoint_for_model", "invalid_request_error");
    // The endpoint before starter credit.
    let (reply, _) = chat(&stack, STARTUP, chat_body(CLAUDE)).await;
    reply.openai_error(400, "wrong_endpoint_for_model", "invalid_request_error");
    // The key's allowed models before starter credit (gpt-5's openai is not
    // a starter provider either).
    let (reply, _) = chat(&stack, STARTUP, chat_body(GPT_5)).await;
    reply.openai_error(403, "model_not_allowed_for_key", "permission_error");
    // § 203 (kanzlei) before managed models and the rest.
    let (reply, _) = chat(&stack, KANZLEI, chat_body(GPT_5)).await;
    reply.openai_error(403, "provider_not_allowed_for_tenant", "permission_error");
    // Managed models last: an organisation that turned them off.
    let (reply, _) = chat(&stack, MANAGED_OFF, chat_body(QWEN)).await;
    reply.openai_error(404, "model_not_available", "not_found_error");
    assert!(stack.sim.requests().is_empty());
    stack.stop().await;
}

/// [N4] when two neighbouring conditions would both leave no provider,
/// the earlier one answers: the key's allowed models before § 203, § 203
/// before the key's restrictions, the key's restrictions before starter
/// credit, starter credit before managed models. When each of the two
/// leaves providers but none passes both, the later one answers
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n4_of_two_conditions_that_refuse_the_earlier_one_answers() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    // (key, model, the error that answers)
    let cases = [
        // kanzlei-qwen-only may not call gpt-5, and openai is not § 203-approved.
        (KANZLEI_QWEN_ONLY, GPT_5, "model_not_allowed_for_key"),
        // openai is neither § 203-approved nor in France.
        (KANZLEI_FR, GPT_5, "provider_not_allowed_for_tenant"),
        // § 203 leaves aki-io and ionos (de); the key's residency [fr]
        // removes them (scaleway, in France, went at § 203).
        (KANZLEI_FR, QWEN, "provider_not_allowed_for_key"),
        // startup-ionos-only may not use openai, nor may starter credit.
        (STARTUP_IONOS_ONLY, GPT_5, "provider_not_allowed_for_key"),
        // The key leaves ionos, which is not a starter provider (aki-io,
        // the starter one, went at the key's restrictions).
        (STARTUP_IONOS_ONLY, QWEN, "starter_model_not_allowed"),
        // openai is neither a starter provider nor an own one.
        (STARTER_MANAGED_OFF, GPT_5, "starter_model_not_allowed"),
        // aki-io passes starter credit; managed models are off.
        (STARTER_MANAGED_OFF, QWEN, "model_not_available"),
    ];
    for (key, model, code) in cases {
        let (reply, tried) = chat(&stack, key, chat_body(model)).await;
        let what = format!("{key} asking for {model}");
        assert_refused(&reply, code, &what);
        assert!(tried.is_empty(), "{what} reached {tried:?}");
        assert_eq!(provider_header(&reply), None);
    }
    stack.stop().await;
}

/// [N5] the model must fit the endpoint family and the provider's API
/// format, else 400 wrong_endpoint_for_model; fitting calls are routed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n5_the_model_must_fit_the_endpoint_and_the_providers_format() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    // An OpenAI-format model through /v1/messages.
    let (reply, _) = messages(&stack, ACME, messages_body(QWEN)).await;
    assert_eq!(
        reply.anthropic_error(400, "invalid_request_error"),
        WRONG_ENDPOINT
    );
    // An Anthropic-format model through the OpenAI-compatible endpoints, a
    // chat model through embeddings and completions, an embedding model
    // through chat.
    for (path, model) in [
        ("/v1/chat/completions", CLAUDE),
        ("/v1/responses", CLAUDE),
        ("/v1/embeddings", QWEN),
        ("/v1/completions", QWEN),
        ("/v1/chat/completions", EMBED),
    ] {
        let body = json!({"model": model, "input": "Hello", "prompt": "Hello", "messages": []});
        let (reply, _) = openai_post(&stack, path, ACME, body).await;
        let message = reply.openai_error(400, "wrong_endpoint_for_model", "invalid_request_error");
        assert_eq!(message, WRONG_ENDPOINT, "{model} on {path}");
    }
    assert!(stack.sim.requests().is_empty());

    let (reply, tried) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json["content"][0]["text"], "hello from anthropic");
    assert_eq!(tried, names(&["anthropic"]));
    assert_eq!(
        stack.sim.requests().last().unwrap().path,
        "/anthropic/v1/messages"
    );

    let body = json!({"model": QWEN, "input": "Hello"});
    let (reply, tried) = openai_post(&stack, "/v1/responses", ACME, body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(tried, names(&["aki-io"]));
    assert_eq!(
        stack.sim.requests().last().unwrap().path,
        "/aki-io/v1/responses"
    );

    let body = json!({"model": EMBED, "input": "Hello"});
    let (reply, tried) = openai_post(&stack, "/v1/embeddings", ACME, body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(tried, names(&["scaleway"]));
    stack.stop().await;
}

/// [N6] a key with allowed models calls only those: 403
/// model_not_allowed_for_key; a key without the list calls any model
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_a_key_calls_only_its_allowed_models() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let (reply, tried) = chat(&stack, STARTUP, chat_body(GPT_5)).await;
    let message = reply.openai_error(403, "model_not_allowed_for_key", "permission_error");
    assert_eq!(message, "the model is not one of this key's allowed models");
    assert!(tried.is_empty());
    let body = json!({"model": EMBED, "input": "Hello"});
    let (reply, _) = openai_post(&stack, "/v1/embeddings", STARTUP, body.clone()).await;
    reply.openai_error(403, "model_not_allowed_for_key", "permission_error");

    let (reply, _) = chat(&stack, STARTUP, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    let (reply, tried) = openai_post(&stack, "/v1/embeddings", ACME, body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(tried, names(&["scaleway"]));
    stack.stop().await;
}

/// [N7] a § 203 organisation uses only approved providers (aki-io, ionos
/// for qwen3.8-27b); with none left, 403 provider_not_allowed_for_tenant
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n7_a_secrecy_bound_organisation_uses_only_approved_providers() {
    let clock = Arc::new(ManualClock::default());
    let failing: &[&str] = &["500"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", failing),
            ("scaleway", failing),
            ("ionos", failing),
            ("together", failing),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, KANZLEI, chat_body(QWEN)).await;
    reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(tried, names(&["aki-io", "ionos"]));

    let (reply, tried) = chat(&stack, KANZLEI, chat_body(GPT_5)).await;
    let message = reply.openai_error(403, "provider_not_allowed_for_tenant", "permission_error");
    assert_eq!(message, NOT_ALLOWED_FOR_TENANT);
    assert!(tried.is_empty());
    let (reply, _) = messages(&stack, KANZLEI, messages_body(CLAUDE)).await;
    assert_eq!(
        reply.anthropic_error(403, "permission_error"),
        NOT_ALLOWED_FOR_TENANT
    );
    assert_eq!(
        reply.json["error"]["code"],
        "provider_not_allowed_for_tenant"
    );

    // The embedding model: scaleway (not approved) drops, ionos serves.
    replay(&stack, &scenario(HEALTHY));
    let body = json!({"model": EMBED, "input": "Hello"});
    let (reply, tried) = openai_post(&stack, "/v1/embeddings", KANZLEI, body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(tried, names(&["ionos"]));
    stack.stop().await;
}

/// [N8] the key's restrictions — allowed providers, residency, CLOUD Act,
/// § 203 — drop providers; with none left, 403 provider_not_allowed_for_key
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n8_the_keys_restrictions_exclude_providers() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let (reply, _) = messages(&stack, ACME_EU, messages_body(CLAUDE)).await;
    assert_eq!(
        reply.anthropic_error(403, "permission_error"),
        NOT_ALLOWED_FOR_KEY
    );
    // The CLOUD Act alone excludes acme's own openai-acme (us).
    for key in [ACME_EU, ACME_NO_CLOUD_ACT] {
        let (reply, _) = chat(&stack, key, chat_body(GPT_5)).await;
        let message = reply.openai_error(403, "provider_not_allowed_for_key", "permission_error");
        assert_eq!(message, NOT_ALLOWED_FOR_KEY);
    }
    assert!(stack.sim.requests().is_empty());

    let failing: &[&str] = &["500"];
    replay(
        &stack,
        &scenario(&[
            ("aki-io", failing),
            ("scaleway", failing),
            ("ionos", failing),
            ("together", failing),
        ]),
    );
    // Allowed providers [aki-io].
    let (reply, tried) = chat(&stack, ACME_AKI_ONLY, chat_body(QWEN)).await;
    reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(tried, names(&["aki-io"]));
    // § 203 required, and residency [de]: aki-io and ionos.
    for key in [ACME_S203, ACME_DE] {
        let (reply, tried) = chat(&stack, key, chat_body(QWEN)).await;
        reply.openai_error(502, "provider_error", "api_error");
        assert_eq!(tried, names(&["aki-io", "ionos"]));
    }
    // Without the CLOUD Act scaleway (fr) stays.
    let (_, tried) = chat(&stack, ACME_NO_CLOUD_ACT, chat_body(QWEN)).await;
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));

    // Residency in de/fr without the CLOUD Act drops together (us): with
    // the three others paused, nothing is left to try.
    let busy: &[&str] = &["429 retry_after=60s"];
    replay(
        &stack,
        &scenario(&[("aki-io", busy), ("scaleway", busy), ("ionos", busy)]),
    );
    let (reply, tried) = chat(&stack, ACME_EU, chat_body(QWEN)).await;
    reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    // Each waits its 10 s (from when it began to wait, so the clock moves
    // only then), well within the 60 s pauses.
    for (waited, key) in [ACME_EU, ACME_NO_CLOUD_ACT, ACME_DE]
        .into_iter()
        .enumerate()
    {
        let waiting = spawn_chat(&stack, key, chat_body(QWEN));
        until("the request waits", || {
            capacity_waits(&stack) == waited as u64 + 1
        })
        .await;
        clock.advance(10_000);
        let reply = finished(waiting).await;
        reply.openai_error(503, "capacity_exhausted", "api_error");
    }
    assert_eq!(asked(&stack, "together"), 0);
    // The same request with an unrestricted key goes to together.
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "together", "together");
    assert_eq!(tried, names(&["together"]));
    stack.stop().await;
}

/// [N9] [N10] on starter credit only starter providers remain: the others
/// are skipped, and 403 starter_model_not_allowed answers only when none
/// is left
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n9_n10_starter_credit_skips_non_starter_providers() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["200", "500"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, STARTUP, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(tried, names(&["aki-io"]));
    // aki-io fails: the non-starter providers are not failed over to.
    let (reply, tried) = chat(&stack, STARTUP, chat_body(QWEN)).await;
    reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(tried, names(&["aki-io"]));

    let (reply, tried) = messages(&stack, STARTUP, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(403, "permission_error"), STARTER);
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [N9] [N10] without its one starter provider (aki-io's key unset),
/// startup has no eligible provider for qwen3.8-27b: 403 starter_model_not_allowed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n9_n10_no_starter_provider_left_is_403_starter_model_not_allowed() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(HEALTHY),
        &["NOIRDOC_AKI_IO_KEY"],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, STARTUP, chat_body(QWEN)).await;
    let message = reply.openai_error(403, "starter_model_not_allowed", "permission_error");
    assert_eq!(message, STARTER);
    assert!(tried.is_empty());
    // Without starter credit the other providers serve.
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "scaleway", "scaleway");
    stack.stop().await;
}

/// [N9] decided: starter credit does not apply to the organisation's own
/// providers. starter-byok, on starter credit, gets gpt-5 from its own
/// starter-byok-openai (not a starter route) with its own key and lists
/// it; a model only managed non-starter providers offer is 403
/// starter_model_not_allowed, and the managed starter provider serves
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n9_starter_credit_does_not_apply_to_an_own_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let (reply, tried) = chat(&stack, STARTER_BYOK, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "starter-byok-openai", "openai-starter-byok");
    assert_eq!(tried, names(&["starter-byok-openai"]));
    assert_eq!(
        stack.sim.requests().last().unwrap().header("authorization"),
        Some("Bearer secret-of-STARTER_BYOK_OPENAI_KEY")
    );

    let (reply, tried) = messages(&stack, STARTER_BYOK, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(403, "permission_error"), STARTER);
    assert!(tried.is_empty());
    let (reply, tried) = chat(&stack, STARTER_BYOK, chat_body(GPT_OSS)).await;
    assert_refused(&reply, "starter_model_not_allowed", GPT_OSS);
    assert!(tried.is_empty());

    let (reply, tried) = chat(&stack, STARTER_BYOK, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(tried, names(&["aki-io"]));

    let listed = model_list(&stack, STARTER_BYOK, false).await;
    assert_eq!(ids(&listed), [QWEN, GPT_5]);
    assert_eq!(owned_by(&listed, GPT_5), "personal");
    assert_eq!(asked(&stack, "openai"), 0);
    stack.stop().await;
}

/// [N4] [N11] [N14] [N32] an organisation's own provider for a model
/// (acme's openai-acme for gpt-5) comes first and alone, with acme's own
/// key, and is never left for the managed one; for other organisations
/// the managed one is the candidate. Decided: this condition comes first,
/// so a key that excludes the own provider gets its error, not the managed
/// provider
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n11_n14_n32_an_own_provider_is_used_exclusively() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("acme-openai", &["200", "500", "503"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "acme-openai", "openai-acme");
    assert_eq!(tried, names(&["acme-openai"]));
    let sent = stack.sim.requests().last().unwrap().clone();
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer secret-of-ACME_OPENAI_KEY")
    );
    assert_eq!(sent.model.as_deref(), Some("gpt-5"));

    // It fails: the managed openai is not tried.
    for code in ["provider_error", "provider_overloaded"] {
        let (reply, tried) = chat(&stack, ACME, chat_body(GPT_5)).await;
        assert_eq!(reply.json["error"]["code"], code, "{}", reply.text);
        assert_eq!(tried, names(&["acme-openai"]));
        assert_eq!(provider_header(&reply), Some("openai-acme"));
    }
    assert_eq!(asked(&stack, "openai"), 0);

    // A key that allows only the managed openai: acme's own provider is
    // the only candidate, and the key excludes it.
    let (reply, tried) = chat(&stack, ACME_MANAGED_OPENAI, chat_body(GPT_5)).await;
    let message = reply.openai_error(403, "provider_not_allowed_for_key", "permission_error");
    assert_eq!(message, NOT_ALLOWED_FOR_KEY);
    assert!(tried.is_empty());
    assert_eq!(asked(&stack, "openai"), 0);

    // For another organisation the managed openai is gpt-5's candidate
    // (refused by § 203 here, not 404).
    let (reply, _) = chat(&stack, KANZLEI, chat_body(GPT_5)).await;
    reply.openai_error(403, "provider_not_allowed_for_tenant", "permission_error");
    stack.stop().await;
}

/// [N11] [N12] without its own key configured, acme falls back to the
/// managed openai for gpt-5 (its managed models are enabled)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n11_n12_without_an_own_provider_the_managed_one_serves() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(HEALTHY),
        &["ACME_OPENAI_KEY"],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "openai", "openai");
    assert_eq!(tried, names(&["openai"]));
    assert_eq!(
        stack.sim.requests()[0].header("authorization"),
        Some("Bearer secret-of-NOIRDOC_OPENAI_KEY")
    );
    stack.stop().await;
}

/// [N12] an organisation that turned managed models off gets none: 404
/// model_not_available
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n12_managed_models_turned_off_is_404_model_not_available() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for model in [QWEN, GPT_5, GPT_OSS] {
        let (reply, _) = chat(&stack, MANAGED_OFF, chat_body(model)).await;
        let message = reply.openai_error(404, "model_not_available", "not_found_error");
        assert_eq!(message, NOT_AVAILABLE, "{model}");
    }
    let (reply, _) = messages(&stack, MANAGED_OFF, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(404, "not_found_error"), NOT_AVAILABLE);
    assert!(stack.sim.requests().is_empty());
    // The same models with managed models enabled.
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(reply.status, 200);
    stack.stop().await;
}

/// [N12] turning managed models off leaves the organisation's own
/// providers: managed-off-byok gets gpt-5 from its own
/// managed-off-byok-openai with its own key and lists it; the models only
/// managed providers offer are 404 model_not_available
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n12_managed_models_off_leaves_the_own_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let (reply, tried) = chat(&stack, MANAGED_OFF_BYOK, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "managed-off-byok-openai", "openai-managed-off-byok");
    assert_eq!(tried, names(&["managed-off-byok-openai"]));
    assert_eq!(
        stack.sim.requests().last().unwrap().header("authorization"),
        Some("Bearer secret-of-MANAGED_OFF_BYOK_OPENAI_KEY")
    );

    for model in [QWEN, GPT_OSS] {
        let (reply, tried) = chat(&stack, MANAGED_OFF_BYOK, chat_body(model)).await;
        assert_refused(&reply, "model_not_available", model);
        assert!(tried.is_empty(), "{model} reached {tried:?}");
    }
    let (reply, tried) = messages(&stack, MANAGED_OFF_BYOK, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(404, "not_found_error"), NOT_AVAILABLE);
    assert!(tried.is_empty());

    let listed = model_list(&stack, MANAGED_OFF_BYOK, false).await;
    assert_eq!(ids(&listed), [GPT_5]);
    assert_eq!(owned_by(&listed, GPT_5), "personal");
    assert_eq!(asked(&stack, "openai"), 0);
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Provider order

/// [N13] [N15] [N16] the cheaper provider leads whatever its priority
/// (gpt-oss-120b: together, 0.60, prio 5); one without a complete price
/// (aki-io, prio 10) never leads; the weighting is 3 × input + output
/// without cache prices (qwen3.8-27b: aki-io 1.20 = ionos 1.20, so the
/// priority decides for aki-io; input + output would make ionos cheaper,
/// a cache price aki-io dearer)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n13_n15_n16_the_cheapest_priced_provider_leads() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_OSS)).await;
    assert_chat_served(&reply, "together", "together");
    assert_eq!(tried, names(&["together"]));
    assert_eq!(
        last_upstream_model(&stack).as_deref(),
        Some("openai/gpt-oss-120b")
    );
    // kanzlei may use only aki-io (unpriced) and ionos (1.50) for it.
    let (reply, tried) = chat(&stack, KANZLEI, chat_body(GPT_OSS)).await;
    assert_chat_served(&reply, "ionos", "ionos");
    assert_eq!(tried, names(&["ionos"]));

    let (reply, tried) = chat(&stack, KANZLEI, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(tried, names(&["aki-io"]));
    // mistral-embed: scaleway (3 × 0.10) before ionos (3 × 0.12).
    let body = json!({"model": EMBED, "input": "Hello"});
    let (_, tried) = openai_post(&stack, "/v1/embeddings", ACME, body).await;
    assert_eq!(tried, names(&["scaleway"]));
    stack.stop().await;
}

/// [N13] [N17] at the same weighted price the higher priority leads:
/// aki-io (10) before scaleway and ionos (8)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n13_n17_at_the_same_price_the_higher_priority_leads() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["200", "500"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(tried, names(&["aki-io"]));
    // kanzlei: aki-io (10) before ionos (8), both 1.20.
    let (reply, tried) = chat(&stack, KANZLEI, chat_body(QWEN)).await;
    assert_chat_served(&reply, "ionos", "ionos");
    assert_eq!(tried, names(&["aki-io", "ionos"]));
    stack.stop().await;
}

/// [N13] [N18] at the same price and priority, the provider longer in
/// the catalogue leads: scaleway (2024-01-10) before ionos (2024-06-15),
/// though the model lists ionos first
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n13_n18_at_the_same_priority_the_older_provider_leads() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["500"])]),
        &[],
        clock.clone(),
    )
    .await;

    for key in [ACME, ACME_EU] {
        let (reply, tried) = chat(&stack, key, chat_body(QWEN)).await;
        assert_chat_served(&reply, "scaleway", "scaleway");
        assert_eq!(tried, names(&["aki-io", "scaleway"]));
    }
    stack.stop().await;
}

/// [N19] the order does not depend on chance: the same request always
/// goes to the same provider
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n19_the_same_request_always_goes_to_the_same_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for _ in 0..20 {
        let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_eq!(provider_header(&reply), Some("aki-io"));
        let (reply, _) = chat(&stack, ACME, chat_body(GPT_OSS)).await;
        assert_eq!(provider_header(&reply), Some("together"));
    }
    assert_eq!(asked(&stack, "aki-io"), 20);
    assert_eq!(asked(&stack, "together"), 20);
    stack.stop().await;
}

/// [N21] [N22] GET /v1/models lists every model the key may call, once,
/// with owned_by `personal` when its first provider is the organisation's
/// own and `platform` when it is managed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n21_n22_the_model_list_shows_what_a_key_may_call() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let acme = model_list(&stack, ACME, false).await;
    assert_eq!(ids(&acme), [QWEN, GPT_5, CLAUDE, EMBED, GPT_OSS]);
    assert_eq!(owned_by(&acme, GPT_5), "personal");
    for model in [QWEN, CLAUDE, EMBED, GPT_OSS] {
        assert_eq!(owned_by(&acme, model), "platform", "{model}");
    }
    // The Anthropic list format carries the same.
    let anthropic = model_list(&stack, ACME, true).await;
    assert_eq!(ids(&anthropic), ids(&acme));
    assert_eq!(owned_by(&anthropic, GPT_5), "personal");

    assert_eq!(ids(&model_list(&stack, STARTUP, false).await), [QWEN]);
    assert_eq!(
        ids(&model_list(&stack, KANZLEI, false).await),
        [QWEN, EMBED, GPT_OSS]
    );
    assert_eq!(
        ids(&model_list(&stack, ACME_EU, false).await),
        [QWEN, EMBED, GPT_OSS]
    );
    assert!(model_list(&stack, MANAGED_OFF, false).await.is_empty());
    assert!(stack.sim.requests().is_empty());
    stack.stop().await;
}

/// [N22] without acme's own key, gpt-5's first provider is the managed
/// openai: owned_by `platform`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n22_owned_by_follows_the_first_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(HEALTHY),
        &["ACME_OPENAI_KEY"],
        clock.clone(),
    )
    .await;

    let acme = model_list(&stack, ACME, false).await;
    assert_eq!(ids(&acme), [QWEN, GPT_5, CLAUDE, EMBED, GPT_OSS]);
    assert_eq!(owned_by(&acme, GPT_5), "platform");
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Capacity

/// [N20] [N43] [N44] a provider at its concurrency limit (aki-io: 4 at a
/// time) is passed over for the next free one in the failover order, and
/// takes requests again once one of its own ends
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n20_n43_n44_a_provider_at_its_concurrency_limit_is_passed_over() {
    let clock = Arc::new(ManualClock::default());
    let hang: &[&str] = &["no_answer", "no_answer", "no_answer", "no_answer", "200"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", hang)]),
        &[],
        clock.clone(),
    )
    .await;

    let mut hung = fill_aki_io(&stack).await;
    assert_eq!(stack.proxy.state.in_flight_total(), 4);
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "scaleway", "scaleway");
    assert_eq!(tried, names(&["scaleway"]));

    // One of the four ends (its client leaves): aki-io has room again.
    hung.pop().unwrap().abort();
    until("aki-io has room", || {
        stack.proxy.state.in_flight_total() == 3
    })
    .await;
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(tried, names(&["aki-io"]));
    for task in hung {
        task.abort();
    }
    stack.stop().await;
}

/// [N20] [N33] with the cheapest provider paused, the request goes to the
/// next free provider in the failover order, and that is a priced one:
/// gpt-oss-120b's together (0.60) paused after a 429, scaleway serves, not
/// aki-io, whose priority (10) is the highest but which has no price
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n20_n33_with_the_cheapest_paused_the_next_priced_provider_serves() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("together", &["429 retry_after=60s", "200"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_OSS)).await;
    assert_eq!(provider_header(&reply), Some("scaleway"), "{}", reply.text);
    assert_eq!(tried, names(&["together", "scaleway"]));
    // together is paused now: passed over, for a priced provider.
    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_OSS)).await;
    assert_eq!(provider_header(&reply), Some("scaleway"), "{}", reply.text);
    assert_eq!(tried, names(&["scaleway"]));
    stack.stop().await;
}

/// [N43] [N44] [N45] [N47] aki-io takes at most 120 requests a minute; the
/// 121st goes to the next provider; a request only aki-io may serve waits
/// 10 s, then gets 503 capacity_exhausted with Retry-After the seconds
/// until the oldest request leaves the window
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n43_n44_n45_n47_a_provider_takes_120_requests_a_minute() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for _ in 0..120 {
        let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_eq!(provider_header(&reply), Some("aki-io"));
    }
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "scaleway", "scaleway");

    let waiting = spawn_chat(&stack, STARTUP, chat_body(QWEN));
    until("the request waits", || capacity_waits(&stack) == 1).await;
    clock.advance(9_999);
    settle().await;
    assert!(!waiting.is_finished(), "gave up before 10 s");
    clock.advance(1);
    let reply = finished(waiting).await;
    reply.openai_error(503, "capacity_exhausted", "api_error");
    assert_eq!(reply.header("retry-after"), Some("50"));
    assert_eq!(provider_header(&reply), None);
    assert_eq!(asked(&stack, "aki-io"), 120);

    // The window moves on at 60 s.
    clock.advance(49_999);
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(provider_header(&reply), Some("scaleway"));
    clock.advance(1);
    let (reply, _) = chat(&stack, STARTUP, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    stack.stop().await;
}

/// [N45] [N47] [N52] when every provider of the model is at its limit the
/// request waits 10 s, then gets 503 capacity_exhausted with Retry-After 5
/// (when room comes is not known) and no provider header (none was asked)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n45_n47_n52_when_all_are_full_the_request_waits_10s_then_503() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["no_answer"])]),
        &[],
        clock.clone(),
    )
    .await;

    let hung = fill_aki_io(&stack).await;
    let waiting = spawn_chat(&stack, STARTUP, chat_body(QWEN));
    until("the request waits", || capacity_waits(&stack) == 1).await;
    clock.advance(9_999);
    settle().await;
    assert!(!waiting.is_finished(), "gave up before 10 s");
    clock.advance(1);
    let reply = finished(waiting).await;
    let message = reply.openai_error(503, "capacity_exhausted", "api_error");
    assert_eq!(
        message,
        "all providers of the model were at their capacity limit or paused after a 429"
    );
    assert_eq!(reply.header("retry-after"), Some("5"));
    assert_eq!(provider_header(&reply), None);
    assert_eq!(stack.sim.requests().len(), 4);

    // The same on another OpenAI endpoint.
    let waiting = spawn_post(
        &stack,
        "/v1/responses",
        STARTUP,
        json!({"model": QWEN, "input": "Hello"}),
    );
    until("the request waits", || capacity_waits(&stack) == 2).await;
    clock.advance(10_000);
    let reply = finished(waiting).await;
    reply.openai_error(503, "capacity_exhausted", "api_error");
    for task in hung {
        task.abort();
    }
    stack.stop().await;
}

/// [N44] [N45] a waiting request takes the provider as soon as one of its
/// requests ends, within the 10 s
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n44_n45_a_waiting_request_takes_the_first_free_provider() {
    let clock = Arc::new(ManualClock::default());
    let hang: &[&str] = &["no_answer", "no_answer", "no_answer", "no_answer", "200"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", hang)]),
        &[],
        clock.clone(),
    )
    .await;

    let mut hung = fill_aki_io(&stack).await;
    let waiting = spawn_chat(&stack, STARTUP, chat_body(QWEN));
    until("the request waits", || capacity_waits(&stack) == 1).await;
    clock.advance(5_000);
    settle().await;
    assert!(!waiting.is_finished());
    hung.pop().unwrap().abort();
    let reply = finished(waiting).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    assert_eq!(asked(&stack, "aki-io"), 5);
    for task in hung {
        task.abort();
    }
    stack.stop().await;
}

/// [N28] [N35] [N45] [N46] [N47] a provider paused after a 429 counts as
/// full: a request only it may serve waits, gets 503 capacity_exhausted
/// with Retry-After the rest of the pause, and is served once it passes
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n28_n35_n45_n46_n47_a_paused_provider_counts_as_full() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["429 retry_after=30s", "200"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, STARTUP, chat_body(QWEN)).await;
    reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    assert_eq!(reply.header("retry-after"), Some("30"));
    assert_eq!(provider_header(&reply), Some("aki-io"));
    assert_eq!(tried, names(&["aki-io"]));

    let waiting = spawn_chat(&stack, STARTUP, chat_body(QWEN));
    until("the request waits", || capacity_waits(&stack) == 1).await;
    clock.advance(10_000);
    let reply = finished(waiting).await;
    reply.openai_error(503, "capacity_exhausted", "api_error");
    assert_eq!(reply.header("retry-after"), Some("20"));
    assert_eq!(provider_header(&reply), None);
    assert_eq!(stack.sim.requests().len(), 1);

    // 25 s after the 429: the request waits the last 5 s of the pause.
    clock.advance(15_000);
    let waiting = spawn_chat(&stack, STARTUP, chat_body(QWEN));
    until("the request waits", || capacity_waits(&stack) == 2).await;
    clock.advance(4_999);
    settle().await;
    assert!(!waiting.is_finished(), "served while paused");
    clock.advance(1);
    let reply = finished(waiting).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    stack.stop().await;
}

/// [N48] [N52] once a provider was asked, no capacity error: when the rest
/// are paused the last provider's error answers, at once, naming it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n48_n52_after_an_attempt_the_last_providers_error_answers() {
    let clock = Arc::new(ManualClock::default());
    let busy: &[&str] = &["429 retry_after=60s"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", &["429 retry_after=5s", "500"]),
            ("scaleway", busy),
            ("ionos", busy),
            ("together", busy),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    // The priced providers are paused: together is tried, then none is left.
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(provider_header(&reply), Some("together"));
    assert_eq!(tried, names(&["together"]));
    // aki-io's pause is over, the others' is not: aki-io fails, and its
    // error answers without a wait (the clock does not move).
    clock.advance(5_000);
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    let message = reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(message, PROVIDER_ERROR);
    assert_eq!(provider_header(&reply), Some("aki-io"));
    assert_eq!(tried, names(&["aki-io"]));
    assert_eq!(capacity_waits(&stack), 0);
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Failover

/// [N23] [N24] [N33] failover takes at most three providers, re-sorted by
/// priority before price (gpt-oss-120b: together, then scaleway and ionos
/// before the cheaper openai), and never an unpriced one after a priced one
/// (aki-io, next by priority, is skipped)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n23_n24_n33_failover_re_sorts_by_priority_and_stops_at_three() {
    let clock = Arc::new(ManualClock::default());
    let failing: &[&str] = &["500"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", failing),
            ("scaleway", failing),
            ("ionos", failing),
            ("together", failing),
            ("openai", failing),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(GPT_OSS)).await;
    reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(provider_header(&reply), Some("ionos"));
    assert_eq!(tried, names(&["together", "scaleway", "ionos"]));

    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));

    // With scaleway paused, two priced providers fail and the unpriced
    // together is not tried in third place.
    replay(
        &stack,
        &scenario(&[
            ("aki-io", failing),
            ("scaleway", &["429 retry_after=60s"]),
            ("ionos", failing),
        ]),
    );
    let (_, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(502, "provider_error", "api_error");
    assert_eq!(tried, names(&["aki-io", "ionos"]));
    stack.stop().await;
}

/// [N26] the provider is switched on 401, 402, 429 and every 5xx
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n26_switches_on_401_402_429_and_5xx() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for status in [
        "401", "402", "429", "500", "501", "502", "503", "504", "529", "599",
    ] {
        replay(&stack, &scenario(&[("aki-io", &[status])]));
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_chat_served(&reply, "scaleway", "scaleway");
        assert_eq!(tried, names(&["aki-io", "scaleway"]), "after {status}");
        // Past any pause the 429 set.
        clock.advance(60_000);
    }
    stack.stop().await;
}

/// [N27] [N28] a managed provider's 429 pauses it for its Retry-After,
/// limited to 1–60 s, 10 s without the header, 60 s when the quota is
/// exhausted; meanwhile the next provider serves, afterwards it is back
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n27_n28_a_managed_429_pauses_the_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for (step, paused_ms) in [
        ("429 retry_after=30s", 30_000),
        ("429 retry_after=90s", 60_000),
        ("429 retry_after=0s", 1_000),
        ("429", 10_000),
        ("429 retry_after=5s code=insufficient_quota", 60_000),
        ("429 code=insufficient_quota", 60_000),
    ] {
        replay(&stack, &scenario(&[("aki-io", &[step, "200"])]));
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_chat_served(&reply, "scaleway", "scaleway");
        assert_eq!(tried, names(&["aki-io", "scaleway"]), "{step}");

        clock.advance(paused_ms - 1);
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_eq!(
            tried,
            names(&["scaleway"]),
            "{step}: not paused {paused_ms} ms"
        );
        assert_eq!(provider_header(&reply), Some("scaleway"));

        clock.advance(1);
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_eq!(
            tried,
            names(&["aki-io"]),
            "{step}: paused past {paused_ms} ms"
        );
        assert_chat_served(&reply, "aki-io", "aki-io");
    }

    // The second provider is paused the same way.
    replay(
        &stack,
        &scenario(&[("aki-io", &["500"]), ("scaleway", &["429 retry_after=20s"])]),
    );
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "ionos", "ionos");
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    clock.advance(19_999);
    let (_, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(tried, names(&["aki-io", "ionos"]));
    clock.advance(1);
    let (_, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    stack.stop().await;
}

/// [N29] [N32] [N39] an own provider (BYOK) is never paused, never left
/// for a managed one, and its 401, 402, 403 and 429 arrive as
/// provider_rejected_request with its status and message
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n29_n32_n39_own_providers_keep_their_status_and_are_never_paused() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for (status, error_type) in [
        (429, "rate_limit_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
    ] {
        // The 429 with a Retry-After a managed provider would be paused for.
        let retry_after = if status == 429 {
            " retry_after=30s"
        } else {
            ""
        };
        let step = format!("{status}{retry_after} message=\"your key answered {status}\"");
        replay(&stack, &scenario(&[("acme-openai", &[&step, "200"])]));
        let (reply, tried) = chat(&stack, ACME, chat_body(GPT_5)).await;
        let message = reply.openai_error(status, "provider_rejected_request", error_type);
        assert_eq!(message, format!("your key answered {status}"));
        assert_eq!(provider_header(&reply), Some("openai-acme"));
        assert_eq!(tried, names(&["acme-openai"]));
        // Not paused: the next request goes to it again at once.
        let (reply, tried) = chat(&stack, ACME, chat_body(GPT_5)).await;
        assert_chat_served(&reply, "acme-openai", "openai-acme");
        assert_eq!(tried, names(&["acme-openai"]));
    }
    // Quota exhausted on an own key: still no pause.
    replay(
        &stack,
        &scenario(&[("acme-openai", &["429 code=insufficient_quota", "200"])]),
    );
    let (reply, _) = chat(&stack, ACME, chat_body(GPT_5)).await;
    reply.openai_error(429, "provider_rejected_request", "rate_limit_error");
    let (reply, _) = chat(&stack, ACME, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "acme-openai", "openai-acme");
    assert_eq!(asked(&stack, "openai"), 0);
    stack.stop().await;
}

/// [N30] [N39] any other 4xx is the provider's answer to the request: it
/// arrives as provider_rejected_request with the provider's status and
/// message, and no further provider is tried
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n30_n39_another_4xx_is_passed_on_and_stops() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for (status, error_type) in [
        (400, "invalid_request_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
    ] {
        let step = format!("{status} message=\"context length exceeded ({status})\"");
        replay(&stack, &scenario(&[("aki-io", &[&step])]));
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        let message = reply.openai_error(status, "provider_rejected_request", error_type);
        assert_eq!(message, format!("context length exceeded ({status})"));
        assert_eq!(provider_header(&reply), Some("aki-io"));
        assert_eq!(tried, names(&["aki-io"]));
    }
    // An own provider's 404 too.
    replay(
        &stack,
        &scenario(&[("acme-openai", &["404 message=\"no such model\""])]),
    );
    let (reply, _) = chat(&stack, ACME, chat_body(GPT_5)).await;
    let message = reply.openai_error(404, "provider_rejected_request", "not_found_error");
    assert_eq!(message, "no such model");

    // On /v1/messages, in Anthropic's format.
    replay(
        &stack,
        &scenario(&[("anthropic", &["413 message=\"prompt is too long\""])]),
    );
    let (reply, tried) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(
        reply.anthropic_error(413, "request_too_large"),
        "prompt is too long"
    );
    assert_eq!(provider_header(&reply), Some("anthropic"));
    assert_eq!(tried, names(&["anthropic"]));
    stack.stop().await;
}

/// [N25] [N41] a provider that sends no headers within 120 s is left for
/// the next; when the last times out too, 504 provider_timeout with
/// Retry-After 10
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n25_n41_a_provider_silent_for_120s_is_left() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["no_answer", "200"])]),
        &[],
        clock.clone(),
    )
    .await;

    let waiting = spawn_chat(&stack, ACME, chat_body(QWEN));
    until("aki-io is asked", || asked(&stack, "aki-io") == 1).await;
    clock.advance(119_999);
    settle().await;
    assert!(!waiting.is_finished(), "left before 120 s");
    assert_eq!(stack.providers_tried(), names(&["aki-io"]));
    clock.advance(1);
    let reply = finished(waiting).await;
    assert_chat_served(&reply, "scaleway", "scaleway");
    assert_eq!(stack.providers_tried(), names(&["aki-io", "scaleway"]));

    let silent: &[&str] = &["no_answer"];
    replay(
        &stack,
        &scenario(&[("aki-io", silent), ("scaleway", silent), ("ionos", silent)]),
    );
    let waiting = spawn_chat(&stack, ACME, chat_body(QWEN));
    let reply = advance_until(&clock, 5_000, 600_000, finished(waiting)).await;
    let message = reply.openai_error(504, "provider_timeout", "api_error");
    assert_eq!(
        message,
        "the provider did not answer within the gateway's timeout"
    );
    assert_eq!(reply.header("retry-after"), Some("10"));
    assert_eq!(provider_header(&reply), Some("ionos"));
    assert_eq!(
        stack.providers_tried(),
        names(&["aki-io", "scaleway", "ionos"])
    );
    stack.stop().await;
}

/// [N25] [N40] a provider whose connection drops before it answers is
/// left for the next; when the last drops too, 502 provider_unreachable
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n25_n40_a_dropped_connection_is_left_for_the_next_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["reset"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "scaleway", "scaleway");
    assert_eq!(tried, names(&["aki-io", "scaleway"]));

    let reset: &[&str] = &["reset"];
    replay(
        &stack,
        &scenario(&[("aki-io", reset), ("scaleway", reset), ("ionos", reset)]),
    );
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    let message = reply.openai_error(502, "provider_unreachable", "api_error");
    assert_eq!(
        message,
        "the gateway could not connect to the provider, or the connection dropped"
    );
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(provider_header(&reply), Some("ionos"));
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    stack.stop().await;
}

/// [N25] [N40] providers that refuse connections (the simulated fleet is
/// gone) are each tried, then 502 provider_unreachable
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n25_n40_an_unreachable_provider_is_502_provider_unreachable() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    let url = stack.url("/v1/chat/completions");
    stack.sim.shutdown().await;
    let reply = Reply::of(
        stack
            .client
            .post(url)
            .bearer_auth(ACME)
            .json(&chat_body(QWEN)),
    )
    .await;
    reply.openai_error(502, "provider_unreachable", "api_error");
    // The third provider (ionos) was the last one tried.
    assert_eq!(provider_header(&reply), Some("ionos"));
    stack.running.shutdown().await;
}

// ---------------------------------------------------------------------
// Errors after failover

/// [N34] [N38] when the last provider fails, the error comes in the
/// caller's wire format: OpenAI's error object on OpenAI endpoints,
/// Anthropic's on /v1/messages
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n34_n38_the_last_error_comes_in_the_callers_wire_format() {
    let clock = Arc::new(ManualClock::default());
    let failing: &[&str] = &["500"];
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", failing),
            ("scaleway", failing),
            ("ionos", failing),
            ("anthropic", failing),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(reply.status, 502);
    assert_eq!(
        reply.json,
        json!({"error": {
            "message": PROVIDER_ERROR,
            "type": "api_error",
            "code": "provider_error",
            "param": null,
        }})
    );
    assert_eq!(reply.header("content-type"), Some("application/json"));

    let (reply, _) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(reply.status, 502);
    // Anthropic's error object names its request, as the header does.
    let request_id = reply.header("request-id").unwrap_or_default();
    assert!(!request_id.is_empty(), "{}", reply.text);
    assert_eq!(
        reply.json,
        json!({
            "type": "error",
            "error": {"type": "api_error", "message": PROVIDER_ERROR, "code": "provider_error"},
            "request_id": request_id,
        })
    );
    assert_eq!(provider_header(&reply), Some("anthropic"));
    stack.stop().await;
}

/// [N35] a capacity problem (429 or 402) of the last provider becomes 429
/// resource_exhausted, with the provider's Retry-After when it sent one;
/// a managed 402 switches without a pause
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n35_a_capacity_problem_becomes_429_resource_exhausted() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", &["429 retry_after=30s"]),
            ("scaleway", &["402"]),
            ("ionos", &["429 retry_after=7s"]),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    let message = reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    assert_eq!(message, "the provider's capacity or quota is exhausted");
    assert_eq!(reply.header("retry-after"), Some("7"));
    assert_eq!(provider_header(&reply), Some("ionos"));
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));

    clock.advance(60_000);
    let payment: &[&str] = &["402"];
    replay(
        &stack,
        &scenario(&[
            ("aki-io", payment),
            ("scaleway", payment),
            ("ionos", payment),
        ]),
    );
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(429, "resource_exhausted", "rate_limit_error");
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    // No pause after a 402: the same three are asked again at once.
    let (_, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    stack.stop().await;
}

/// [N36] an overload (503 or 529) becomes provider_overloaded: 503 on
/// OpenAI endpoints, 529 on /v1/messages, with the provider's Retry-After
/// or 10 s
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n36_an_overload_is_503_on_openai_endpoints_and_529_on_messages() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", &["503"]),
            ("scaleway", &["529"]),
            ("ionos", &["529", "503 retry_after=20s"]),
            ("anthropic", &["529", "503 retry_after=20s"]),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    let message = reply.openai_error(503, "provider_overloaded", "api_error");
    assert_eq!(message, OVERLOADED);
    assert_eq!(reply.header("retry-after"), Some("10"));
    assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]));
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(503, "provider_overloaded", "api_error");
    assert_eq!(reply.header("retry-after"), Some("20"));

    let (reply, _) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(529, "overloaded_error"), OVERLOADED);
    assert_eq!(reply.header("retry-after"), Some("10"));
    let (reply, _) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(529, "overloaded_error"), OVERLOADED);
    assert_eq!(reply.header("retry-after"), Some("20"));
    stack.stop().await;
}

/// [N38] any other provider error becomes 502 provider_error: a managed
/// 401, other 5xx, a malformed answer, a redirect
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n38_other_provider_errors_become_502_provider_error() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for last in ["401", "500", "504", "malformed", "302"] {
        replay(
            &stack,
            &scenario(&[
                ("aki-io", &["503"]),
                ("scaleway", &["429"]),
                ("ionos", &[last]),
            ]),
        );
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        let message = reply.openai_error(502, "provider_error", "api_error");
        assert_eq!(message, PROVIDER_ERROR, "{last}");
        assert_eq!(reply.header("retry-after"), None, "{last}");
        assert_eq!(tried, names(&["aki-io", "scaleway", "ionos"]), "{last}");
        clock.advance(60_000);
    }
    replay(&stack, &scenario(&[("anthropic", &["504"])]));
    let (reply, _) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(reply.anthropic_error(502, "api_error"), PROVIDER_ERROR);
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Streams and the commit

/// [N31] [N38] decided: a malformed answer or a redirect before any
/// output is a provider failure like a 5xx: the next provider serves
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n31_n38_a_malformed_answer_or_redirect_switches() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("noirdoc", &scenario(HEALTHY), &[], clock.clone()).await;

    for step in ["malformed", "301", "302", "307"] {
        replay(&stack, &scenario(&[("aki-io", &[step])]));
        let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
        assert_chat_served(&reply, "scaleway", "scaleway");
        assert_eq!(tried, names(&["aki-io", "scaleway"]), "{step}");
    }
    // A stream whose first event is malformed has sent nothing yet.
    replay(&stack, &scenario(&[("aki-io", &["malformed"])]));
    let before = stack.sim.requests().len();
    let reply = stack.chat(ACME, streamed(chat_body(QWEN))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), Some("scaleway"));
    assert_eq!(asked_since(&stack, before), names(&["aki-io", "scaleway"]));
    assert_eq!(reply.streamed_text(), "hello from scaleway");
    stack.stop().await;
}

/// [N26] [N31] the provider's status arrives with its headers: a failed
/// status on a stream still switches, before anything reached the caller
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n26_n31_a_failed_status_on_a_stream_switches() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["503"])]),
        &[],
        clock.clone(),
    )
    .await;

    let reply = stack.chat(ACME, streamed(chat_body(QWEN))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), Some("scaleway"));
    let events = reply.events();
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert!(events.iter().all(|(name, _)| name.is_none()), "{events:?}");
    assert_eq!(reply.streamed_text(), "hello from scaleway");
    assert_eq!(stack.providers_tried(), names(&["aki-io", "scaleway"]));

    let reply = stack
        .messages(
            ACME,
            json!({"model": CLAUDE, "max_tokens": 32, "stream": true, "messages": []}),
        )
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), Some("anthropic"));
    assert!(reply.text.contains("message_stop"));
    stack.stop().await;
}

/// [N31] [N38] once the first event reached the caller nothing switches:
/// a stream cut off after it ends with an error event in the stream's
/// format and no end marker
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n31_n38_a_stream_broken_after_its_first_event_never_switches() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[
            ("aki-io", &["cut_after=2"]),
            ("anthropic", &["cut_after=1"]),
        ]),
        &[],
        clock.clone(),
    )
    .await;

    let reply = stack.chat(ACME, streamed(chat_body(QWEN))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), Some("aki-io"));
    let events = reply.events();
    let (last, content) = events.split_last().unwrap();
    assert_eq!(content.len(), 2, "{events:?}");
    assert!(
        content
            .iter()
            .all(|(_, data)| data.contains("chat.completion.chunk"))
    );
    let error: Value = serde_json::from_str(&last.1).unwrap();
    assert_eq!(error["error"]["code"], "provider_error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(!reply.text.contains("[DONE]"));
    assert_eq!(stack.providers_tried(), names(&["aki-io"]));

    let before = stack.sim.requests().len();
    let reply = stack
        .messages(
            ACME,
            json!({"model": CLAUDE, "max_tokens": 32, "stream": true, "messages": []}),
        )
        .await;
    assert_eq!(reply.status, 200);
    let events = reply.events();
    let (name, data) = events.last().unwrap();
    assert_eq!(name.as_deref(), Some("error"), "{events:?}");
    let error: Value = serde_json::from_str(data).unwrap();
    let request_id = reply.header("x-request-id").unwrap_or_default();
    assert_eq!(
        error,
        json!({"type": "error", "error": {"type": "api_error", "message": PROVIDER_ERROR, "code": "provider_error"}, "request_id": request_id})
    );
    assert!(!reply.text.contains("message_stop"));
    assert_eq!(asked_since(&stack, before), names(&["anthropic"]));
    stack.stop().await;
}

/// [N25] [N31] [N38] a stream silent for 120 s after its first event ends
/// with an error event; nothing switches
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n25_n31_n38_a_stream_stalled_for_120s_ends_with_an_error_event() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["stall_after=2"])]),
        &[],
        clock.clone(),
    )
    .await;

    let started = Instant::now();
    let mut response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .bearer_auth(ACME)
        .json(&streamed(chat_body(QWEN)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut text = String::new();
    while text.matches("data: ").count() < 2 {
        let chunk = response.chunk().await.unwrap().expect("the stream ended");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let rest = tokio::spawn(Reply::rest(response, text, started));
    let silent_from = clock.now_ms();
    until_sleeping(&clock, "the proxy waits for the next event", |at| {
        at == silent_from + 120_000
    })
    .await;
    clock.advance(119_999);
    settle().await;
    assert!(!rest.is_finished(), "ended before 120 s of silence");
    clock.advance(1);

    let reply = finished(rest).await;
    assert_eq!(provider_header(&reply), Some("aki-io"));
    let events = reply.events();
    assert_eq!(events.len(), 3, "{events:?}");
    let error: Value = serde_json::from_str(&events[2].1).unwrap();
    assert_eq!(error["error"]["code"], "provider_error");
    assert!(!reply.text.contains("[DONE]"));
    assert_eq!(stack.providers_tried(), names(&["aki-io"]));
    stack.stop().await;
}

// ---------------------------------------------------------------------
// The provider header

/// [N50] [N51] [N52] X-Noirdoc-Provider names the provider that answered
/// (by its short name), after a failover the last one, on errors when a
/// provider was involved, and is absent when none was
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n50_n51_n52_the_provider_header_names_who_answered() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "noirdoc",
        &scenario(&[("aki-io", &["200", "500", "500", "400"])]),
        &[],
        clock.clone(),
    )
    .await;

    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "aki-io", "aki-io");
    let (reply, _) = chat(&stack, ACME, chat_body(GPT_5)).await;
    assert_chat_served(&reply, "acme-openai", "openai-acme");
    let (reply, _) = messages(&stack, ACME, messages_body(CLAUDE)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), Some("anthropic"));
    let body = json!({"model": EMBED, "input": "Hello"});
    let (reply, _) = openai_post(&stack, "/v1/embeddings", ACME, body).await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), Some("scaleway"));

    // After a failover: the provider that answered last.
    let (reply, tried) = chat(&stack, ACME, chat_body(QWEN)).await;
    assert_chat_served(&reply, "scaleway", "scaleway");
    assert_eq!(tried, names(&["aki-io", "scaleway"]));
    // Streams carry it when the provider answers in time.
    let reply = stack.chat(ACME, streamed(chat_body(QWEN))).await;
    assert_eq!(provider_header(&reply), Some("scaleway"));
    assert!(!reply.text.contains("provider="));

    // An error after a provider was asked.
    let (reply, _) = chat(&stack, ACME, chat_body(QWEN)).await;
    reply.openai_error(400, "provider_rejected_request", "invalid_request_error");
    assert_eq!(provider_header(&reply), Some("aki-io"));
    // Refusals involve no provider.
    let (reply, _) = chat(&stack, ACME, chat_body("gpt-9-ultra")).await;
    assert_eq!(reply.status, 404);
    assert_eq!(provider_header(&reply), None);
    let (reply, _) = chat(&stack, KANZLEI, chat_body(GPT_5)).await;
    assert_eq!(reply.status, 403);
    assert_eq!(provider_header(&reply), None);
    stack.stop().await;
}

/// [N31] [N53] a stream whose provider answers only after 15 s gets its
/// headers without X-Noirdoc-Provider, and `: provider=<name>` (the short
/// name, `openai-acme` for acme's own `acme-openai`) before the first event
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n31_n53_a_stream_held_15s_names_its_provider_in_a_comment() {
    let clock = Arc::new(ManualClock::default());
    // The sim's pauses run on the test's clock too: the first event comes
    // 20 s after the headers, when the test says.
    let stack = Stack::shipped_on_one_clock(
        "noirdoc",
        &scenario(&[("acme-openai", &["200 first_token=20s"])]),
        clock.clone(),
    )
    .await;

    let started = Instant::now();
    let opening = spawn_open_chat(&stack, ACME, streamed(chat_body(GPT_5)));
    until_sleeping(&clock, "the sim holds the first event", |at| at == 20_000).await;
    clock.advance(15_000);
    let response = finished(opening).await;
    clock.advance(5_000);
    let reply = finished(tokio::spawn(Reply::rest(response, String::new(), started))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(provider_header(&reply), None);
    let events = reply.events();
    assert_eq!(
        events[0],
        (
            Some(String::from(":comment")),
            String::from("provider=openai-acme")
        ),
        "{events:?}"
    );
    assert_eq!(reply.streamed_text(), "hello from acme-openai");
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert_eq!(stack.providers_tried(), names(&["acme-openai"]));
    stack.stop().await;
}

/// [N25] [N31] [N51] [N53] a stream that sends no first event within 120 s
/// of its headers is left for the next provider even though the gateway's
/// own headers went out at 15 s (no part of a provider's answer reached the
/// caller yet); the comment names the provider that answered
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n25_n31_n51_n53_a_stream_without_a_first_event_switches() {
    let clock = Arc::new(ManualClock::default());
    // The sim's pauses run on the test's clock too: aki-io's headers come
    // when the test says, so the first event's wait has a deadline of its
    // own (121 s), apart from the headers' (120 s).
    let stack = Stack::shipped_on_one_clock(
        "noirdoc",
        &scenario(&[("aki-io", &["slow_headers=1s stall_after=0"])]),
        clock.clone(),
    )
    .await;

    let started = Instant::now();
    let opening = spawn_open_chat(&stack, ACME, streamed(chat_body(QWEN)));
    until("aki-io is asked", || asked(&stack, "aki-io") == 1).await;
    headers_come_after(&clock, 0, 1_000, 120_000).await;
    // The gateway's headers are held 15 s from the request, then go out
    // without the provider.
    clock.advance(13_999);
    settle().await;
    assert!(!opening.is_finished(), "headers sent before 15 s");
    clock.advance(1);
    let response = finished(opening).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers().get("x-noirdoc-provider"), None);
    let streaming = tokio::spawn(Reply::rest(response, String::new(), started));

    clock.advance(105_999);
    settle().await;
    assert_eq!(
        stack.providers_tried(),
        names(&["aki-io"]),
        "left before 120 s after the headers"
    );
    assert!(!streaming.is_finished());
    clock.advance(1);
    let reply = finished(streaming).await;
    let events = reply.events();
    assert_eq!(
        events[0],
        (
            Some(String::from(":comment")),
            String::from("provider=scaleway")
        ),
        "{events:?}"
    );
    assert_eq!(reply.streamed_text(), "hello from scaleway");
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert_eq!(stack.providers_tried(), names(&["aki-io", "scaleway"]));
    stack.stop().await;
}
