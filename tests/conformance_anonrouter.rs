//! AnonRouter (`shared/seeds/anonrouter-provider-routing.txt`) end to end:
//! the shipped `policies/anonrouter.policy` and its data, served by the real
//! proxy on loopback in front of simulated providers, with the proxy's time
//! on a manual clock. Each test names the CONFORMANCE.md rows it proves; the
//! tests follow the seed's sections.
//!
//! The plans these tests rely on (typical price = 2 × input + cache_read +
//! 0.5 × output, USD per million tokens):
//! - `deepseek/deepseek-v3.2`: venice private 1.50, tinfoil tee 1.87,
//!   deepinfra anonymous 1.21, near-ai-us (`near-ai`) tee 2.70, phala e2ee
//!   (E2EE requests only). The Default sort of lumen's default workspace
//!   gives tinfoil, venice, near-ai-us, deepinfra (near-ai-us costs more
//!   than 1.5 × venice, so it loses its TEE preference); a fallback never
//!   goes below the first attempt's tier there, so tinfoil fails over to
//!   near-ai-us only. research sorts by privacy (tinfoil, near-ai-us,
//!   venice, deepinfra) and lets fallback step down to private, so three
//!   failing attempts show its whole order.
//! - `qwen/qwen3-coder` (free): deepinfra anonymous and near-ai-eu tee, both
//!   free.
//! - `zai/glm-4.6`: venice only.
//!
//! Measurements (`stats`) come from real attempts: time to first token is
//! real time, so tests that need measured routes give the simulated
//! providers different latencies and warm them with twenty requests each.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{
    HEALTHY, Reply, Stack, advance_until, chat, closed_port, data_file, finished,
    finished_attempts, finished_within, headers_come_after, messages, model_list, names, recompile,
    reconfigure, replay, settle, spawn_chat, spawn_open_chat, streamed, tried_by, until,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::state::{CandidateKeys, Clock, ManualClock, ScopeKey};
use tokio::task::JoinHandle;

// The test keys of policies/anonrouter/tenants.yaml.
/// lumen's key without a workspace: the Default Workspace (Default sort).
const LUMEN: &str = "sk-anon-lumen";
/// Workspace `legal`: boundary Private, deepinfra disabled, two attempts.
const LEGAL: &str = "sk-anon-lumen-legal";
/// Workspace `vault`: boundary Maximum (TEE).
const VAULT: &str = "sk-anon-lumen-vault";
/// Workspace `research`: Privacy sort, fallback floor private, Auto may
/// not use qwen.
const RESEARCH: &str = "sk-anon-lumen-research";
/// orbit (no free-model opt-in): price ceilings 0.45 input, 1.50 output.
const ORBIT: &str = "sk-anon-orbit";

const DEEPSEEK: &str = "deepseek/deepseek-v3.2";
const QWEN: &str = "qwen/qwen3-coder";
const GLM: &str = "zai/glm-4.6";
const AUTO: &str = "/auto";

/// Every provider of the catalog, by its sim path (its catalog id).
const PROVIDERS: [&str; 6] = [
    "venice",
    "tinfoil",
    "deepinfra",
    "near-ai-us",
    "near-ai-eu",
    "phala",
];

// The response headers of the seed.
const PROVIDER: &str = "x-anonrouter-provider";
const ROUTING: &str = "x-anonrouter-routing";
const ATTEMPTS: &str = "x-anonrouter-provider-attempts";
const FALLBACK: &str = "x-anonrouter-provider-fallback";
const PRIVACY: &str = "x-anonrouter-privacy-class";

// The request headers the policy declares as inputs.
const E2EE: &str = "x-anonrouter-e2ee";
const TICKET: &str = "x-anonrouter-ticket-provider";

/// The default headers and first-token timeout (the policy sets no
/// `timeouts`).
const TIMEOUT_MS: u64 = 60_000;

/// How long a spawned request may take, in real time: up to twenty run at
/// once here.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------
// Scenarios

/// A scenario with every provider of the catalog: those named with the
/// settings given (YAML flow mappings), the others answering 200.
fn fleet(overrides: &[(&str, String)]) -> String {
    common::fleet(&PROVIDERS, overrides)
}

/// Every provider answers 200 but those given steps.
fn scenario(sequences: &[(&str, &[&str])]) -> String {
    common::scenario(&PROVIDERS, sequences)
}

/// Every provider answers `step`.
fn all(step: &str) -> String {
    common::all_answer(&PROVIDERS, step)
}

/// A stack serving the shipped policy in front of `yaml`.
async fn shipped(yaml: &str, clock: &Arc<ManualClock>) -> Stack {
    Stack::shipped("anonrouter", yaml, &[], clock.clone()).await
}

// ---------------------------------------------------------------------
// Bodies and requests

/// A chat completion for `model`.
fn body(model: &str) -> Value {
    json!({"model": model, "temperature": 0.2, "messages": [{"role": "user", "content": "Hi"}]})
}

/// A chat completion for `model` with the `provider` field.
fn routed(model: &str, provider: Value) -> Value {
    let mut body = body(model);
    body["provider"] = provider;
    body
}

/// An Anthropic message for `model`, with `provider` unless it is null.
fn message(model: &str, provider: Value) -> Value {
    let mut body =
        json!({"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]});
    if !provider.is_null() {
        body["provider"] = provider;
    }
    body
}

/// A chat completion with extra request headers, and the providers it asked.
async fn chat_with(
    stack: &Stack,
    key: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (Reply, Vec<String>) {
    let request = stack.post("/v1/chat/completions", Some(key), headers, &body);
    tried_by(stack, request).await
}

/// Sets the settings of lumen's Default Workspace (it has none shipped),
/// replacing any set before.
fn default_workspace(stack: &Stack, settings: &str) {
    let path = data_file(stack, "tenants.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let workspace = "      - id: default\n";
    let at = text.find(workspace).unwrap() + workspace.len();
    let (before, rest) = text.split_at(at);
    let rest = match rest.strip_prefix("        settings: ") {
        Some(old) => &old[old.find('\n').unwrap() + 1..],
        None => rest,
    };
    let text = format!("{before}        settings: {settings}\n{rest}");
    std::fs::write(&path, text).unwrap();
    recompile(stack, &[]);
}

/// A route's price line in the catalog, by its provider and old price.
fn reprice(stack: &Stack, old: &str, new: &str) {
    reconfigure(stack, "catalog.yaml", &[(old, new)], &[]);
}

/// near-ai-us's price for deepseek in the shipped catalog.
const NEAR_AI_PRICE: &str = "price: {input: 0.60, output: 1.80}";

// ---------------------------------------------------------------------
// What the client got

/// The public provider id of a catalog provider: both NEAR AI regions are
/// `near-ai`.
fn public(provider: &str) -> &str {
    if provider.starts_with("near-ai") {
        "near-ai"
    } else {
        provider
    }
}

/// A successful answer from `provider` (a catalog id), which the provider
/// header names by its public id.
fn assert_served(reply: &Reply, provider: &str) {
    reply.assert_served(provider);
    assert_eq!(reply.header(PROVIDER), Some(public(provider)));
}

/// An error of the policy whose `type` is its name (the seed's error table).
fn policy_error(reply: &Reply, status: u16, name: &str) -> String {
    // The errors a retry would only repeat, or repeat at more providers,
    // tell the official SDKs not to retry; the others leave it to them.
    let final_errors = [
        "ticket_provider_policy_mismatch",
        "provider_fallback_exhausted",
        "provider_fallback_not_supported_for_e2ee",
    ];
    let advice = final_errors.contains(&name).then_some("false");
    assert_eq!(reply.header("x-should-retry"), advice, "{name}");
    reply.openai_error(status, name, name)
}

/// The provider that served each of `count` requests.
async fn first_choices(stack: &Stack, key: &str, body: &Value, count: usize) -> Vec<String> {
    common::first_choices(stack, key, body, PROVIDER, count).await
}

fn distinct(served: &[String]) -> BTreeSet<&str> {
    served.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------
// Health: penalties and measurements through real attempts

/// One failed attempt at the provider `pin` names, for `model`: its route
/// (or, for a 401 or 402, the whole provider) is penalized. The sim is
/// healthy again afterwards.
async fn fail_pinned(stack: &Stack, model: &str, pin: &str, step: &str) {
    replay(stack, &all(step));
    let (reply, tried) = chat(stack, LUMEN, routed(model, json!(pin))).await;
    assert_ne!(reply.status, 200, "{}", reply.text);
    assert_eq!(tried.len(), 1, "{tried:?}");
    replay(stack, &scenario(HEALTHY));
}

/// The catalog provider a pin reaches for `model`: NEAR AI's region that
/// serves it.
fn route_of(model: &str, pin: &str) -> String {
    match pin {
        "near-ai" if model == QWEN => String::from("near-ai-eu"),
        "near-ai" => String::from("near-ai-us"),
        other => other.to_string(),
    }
}

/// The measurements the proxy holds for `provider`'s route of `model`.
/// Only for waiting: the tests observe measurements by the routing they
/// cause.
fn samples(stack: &Stack, model: &str, provider: &str) -> u32 {
    let keys = CandidateKeys {
        provider: ScopeKey::Provider(Arc::from(provider)),
        route: ScopeKey::Route(Arc::from(model), Arc::from(provider)),
        credential: ScopeKey::Credential(
            Arc::from(provider),
            Arc::from(format!("{provider}-platform").as_str()),
        ),
    };
    // No window, so that looking drops nothing.
    let health = stack.proxy.state.candidate_health(&keys, None, u64::MAX);
    health.stats.samples
}

/// Asserts that the proxy holds `count` measurements of `provider`'s route
/// of `model` by the time the client has its answers: a success is
/// recorded before the answer's last bytes go out, so the client's next
/// request is decided with it.
fn recorded(stack: &Stack, model: &str, provider: &str, count: u32) {
    let held = samples(stack, model, provider);
    assert!(
        held >= count,
        "{held} measurements of {provider} for {model} once answered, expected {count}"
    );
}

/// `count` successful requests pinned to `pin`, sent at once: measurements
/// for its route. Streams ask for usage, so they measure throughput.
async fn warm(stack: &Stack, model: &str, pin: &str, count: usize, stream: bool) {
    let mut body = routed(model, json!(pin));
    if stream {
        body = streamed(body);
        body["stream_options"] = json!({"include_usage": true});
    }
    let provider = route_of(model, pin);
    let before = samples(stack, model, &provider);
    let tasks: Vec<JoinHandle<Reply>> = (0..count)
        .map(|_| spawn_chat(stack, LUMEN, body.clone()))
        .collect();
    for task in tasks {
        let reply = finished_within(PATIENCE, task).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    let count = u32::try_from(count).unwrap();
    recorded(stack, model, &provider, before + count);
}

/// Ten minutes and a second: every penalty has ended and its count reset.
fn forget_failures(clock: &ManualClock) {
    clock.advance(601_000);
}

// ---------------------------------------------------------------------
// Models and provider routes

/// [A1] [A8] provider routing chooses who serves the model named: the
/// canonical id is served by its routes under their upstream names; there
/// are no provider-prefixed ids (the `provider` field chooses); `/auto` is
/// the separate model-routing step
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a1_a8_provider_routing_serves_the_named_model() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let (reply, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "tinfoil");
    assert_eq!(tried, names(&["tinfoil"]));
    assert_eq!(stack.tried()[0].1.as_deref(), Some("deepseek-v3p2"));

    for prefixed in [
        "venice/deepseek-v3.2",
        "venice:deepseek-v3.2",
        "venice/deepseek/deepseek-v3.2",
        "@venice-platform/deepseek/deepseek-v3.2",
        "deepseek-v3.2",
    ] {
        let (reply, tried) = chat(&stack, LUMEN, body(prefixed)).await;
        policy_error(&reply, 400, "no_provider_route");
        assert!(tried.is_empty(), "{prefixed} reached {tried:?}");
    }

    // The provider field chooses the provider; the model stays.
    let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("venice"))).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["venice"]));
    assert_eq!(
        stack.tried().last().unwrap().1.as_deref(),
        Some("deepseek-v3.2")
    );

    // /auto chooses the model (its first, deepseek), then provider routing
    // chooses who serves it.
    let (reply, tried) = chat(&stack, LUMEN, body(AUTO)).await;
    assert_served(&reply, "tinfoil");
    assert_eq!(tried, names(&["tinfoil"]));
    assert_eq!(reply.header(ROUTING), Some("auto"));
    assert_eq!(
        stack.tried().last().unwrap().1.as_deref(),
        Some("deepseek-v3p2")
    );
    stack.stop().await;
}

/// [A2] [A129] failover switches providers, never the model: for /auto the
/// model Auto chose stays (venice@deepseek fails; near-ai-eu, which serves
/// only qwen, is not tried), and each route is asked for the same model
/// under its own upstream name
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2_a129_failover_never_changes_the_model() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(&[("venice", &["500"])]), &clock).await;

    // Within the price ceiling: venice for deepseek (glm's venice costs
    // 1.90 output, near-ai-us 0.60 input), near-ai-eu for qwen.
    let policy = json!({"only": ["venice", "near-ai"], "max_price": {"input": 0.5, "output": 1.5}});
    let (reply, tried) = chat(&stack, LUMEN, routed(AUTO, policy.clone())).await;
    reply.openai_error(500, "provider_error", "api_error");
    assert_eq!(tried, names(&["venice"]));
    assert_eq!(reply.header(ATTEMPTS), Some("1"));
    // Healthy, venice serves deepseek, the model Auto chose first.
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, LUMEN, routed(AUTO, policy)).await;
    assert_served(&reply, "venice");
    assert_eq!(stack.tried()[0].1.as_deref(), Some("deepseek-v3.2"));

    // Failing over among deepseek's routes asks each for deepseek.
    replay(
        &stack,
        &scenario(&[("tinfoil", &["500"]), ("near-ai-us", &["500"])]),
    );
    let (reply, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    let models: Vec<String> = stack
        .tried()
        .into_iter()
        .map(|(_, model)| model.unwrap())
        .collect();
    assert_eq!(
        models,
        names(&[
            "deepseek-v3p2",
            "deepseek-ai/DeepSeek-V3.2",
            "deepseek-v3.2"
        ])
    );
    stack.stop().await;
}

/// [A129] a provider policy constrains /auto: the model is chosen only from
/// models with an eligible route under it, and provider selection then runs
/// for that model (the seed's example: only venice, private)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a129_a_provider_policy_constrains_auto() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let seed_example = json!({"only": ["venice"], "minimum_privacy": "private"});
    let (reply, tried) = chat(&stack, LUMEN, routed(AUTO, seed_example)).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["venice"]));
    assert_eq!(stack.tried()[0].1.as_deref(), Some("deepseek-v3.2"));

    // No deepseek route is within the ceiling under only [near-ai]: Auto
    // chooses qwen, served by near-ai-eu.
    let cheap_near_ai = json!({"only": ["near-ai"], "max_price": {"input": 0.5, "output": 1.5}});
    let (reply, tried) = chat(&stack, LUMEN, routed(AUTO, cheap_near_ai)).await;
    assert_served(&reply, "near-ai-eu");
    assert_eq!(tried, names(&["near-ai-eu"]));
    assert_eq!(
        stack.tried().last().unwrap().1.as_deref(),
        Some("Qwen/Qwen3-Coder")
    );

    // No model has an eligible route: no_provider_route, answered as /auto.
    let (reply, tried) = chat(&stack, LUMEN, routed(AUTO, json!({"only": ["deepinfra"]}))).await;
    policy_error(&reply, 400, "no_provider_route");
    assert_eq!(reply.header(ROUTING), Some("auto"));
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [A6] each provider route has its own privacy tier and price: venice's
/// route for deepseek is within a ceiling its route for glm is not; the
/// tier reported is the route's
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a6_each_route_has_its_own_tier_and_price() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (model, pin, tier) in [
        (DEEPSEEK, "venice", "private"),
        (DEEPSEEK, "tinfoil", "tee"),
        (DEEPSEEK, "deepinfra", "anonymous"),
        (DEEPSEEK, "near-ai", "tee"),
        (QWEN, "deepinfra", "anonymous"),
        (QWEN, "near-ai", "tee"),
        (GLM, "venice", "private"),
    ] {
        let (reply, _) = chat(&stack, LUMEN, routed(model, json!(pin))).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        assert_eq!(reply.header(PRIVACY), Some(tier), "{pin} for {model}");
    }

    // venice: 0.40 / 1.20 for deepseek, 0.45 / 1.90 for glm.
    let ceiling = json!({"only": ["venice"], "max_price": {"input": 0.42, "output": 1.5}});
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, ceiling.clone())).await;
    assert_served(&reply, "venice");
    let (reply, tried) = chat(&stack, LUMEN, routed(GLM, ceiling)).await;
    policy_error(&reply, 400, "no_provider_route_meets_price");
    assert!(tried.is_empty());
    stack.stop().await;
}

/// The `provider_routes` and `auto_provider` of each model in
/// `GET /v1/models` for `key`.
async fn listing(stack: &Stack, key: &str, anthropic: bool) -> Vec<(String, Value, Value)> {
    model_list(stack, key, anthropic)
        .await
        .iter()
        .map(|entry| {
            (
                entry["id"].as_str().unwrap().to_string(),
                entry["provider_routes"].clone(),
                entry["auto_provider"].clone(),
            )
        })
        .collect()
}

fn listed(model: &str, routes: &[&str], auto: &str) -> (String, Value, Value) {
    (model.to_string(), json!(routes), json!(auto))
}

/// [A22] GET /v1/models lists each canonical model with its provider
/// routes, each under its own provider's public id (NEAR AI as `near-ai`,
/// no catch-all), and the provider Auto would pick, as the workspace's
/// boundaries and sort decide
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a22_the_model_list_shows_routes_under_public_ids() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let lumen = listing(&stack, LUMEN, false).await;
    assert_eq!(
        lumen,
        [
            listed(
                DEEPSEEK,
                &["tinfoil", "venice", "near-ai", "deepinfra"],
                "tinfoil"
            ),
            listed(QWEN, &["near-ai", "deepinfra"], "near-ai"),
            listed(GLM, &["venice"], "venice"),
        ]
    );
    assert_eq!(listing(&stack, LUMEN, true).await, lumen);
    // The boundary Maximum leaves TEE routes only, and glm none.
    assert_eq!(
        listing(&stack, VAULT, false).await,
        [
            listed(DEEPSEEK, &["tinfoil", "near-ai"], "tinfoil"),
            listed(QWEN, &["near-ai"], "near-ai"),
        ]
    );
    // research sorts by privacy.
    assert_eq!(
        listing(&stack, RESEARCH, false).await[0],
        listed(
            DEEPSEEK,
            &["tinfoil", "near-ai", "venice", "deepinfra"],
            "tinfoil"
        )
    );
    // orbit's price ceilings.
    assert_eq!(
        listing(&stack, ORBIT, false).await[0],
        listed(DEEPSEEK, &["venice", "deepinfra"], "venice")
    );
    assert!(stack.sim.requests().is_empty());
    stack.stop().await;
}

/// [A7] [A82] GET /v1/models lists the routes under the canonical model in
/// `provider_routes`, and `auto_provider` names the provider Auto would
/// pick right now: with tinfoil recently failed, Auto picks venice, and
/// tinfoil goes after every healthy route, the Anonymous one included
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a7_the_model_list_names_the_provider_auto_picks_now() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let lumen = listing(&stack, LUMEN, false).await;
    assert_eq!(
        lumen[0],
        listed(
            DEEPSEEK,
            &["tinfoil", "venice", "near-ai", "deepinfra"],
            "tinfoil"
        )
    );
    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "venice");
    let lumen = listing(&stack, LUMEN, false).await;
    assert_eq!(lumen[0].2, json!("venice"), "{lumen:?}");
    // The routes are still all listed; the penalized one behind every
    // healthy one.
    assert_eq!(
        lumen[0].1,
        json!(["venice", "near-ai", "deepinfra", "tinfoil"])
    );
    stack.stop().await;
}

// ---------------------------------------------------------------------
// The `provider` request field

/// [A9] [A19] [A29] `provider` is a provider id (an exact pin) or a policy
/// object; the bare string "venice" is `{only: [venice], allow_fallbacks:
/// false}`: venice alone, no fallback; neither form reaches the provider,
/// and the rest of the body does, unchanged
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a9_a19_a29_a_pin_is_only_that_provider_without_fallback() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(&[("venice", &["200", "500"])]), &clock).await;

    let pin = json!("venice");
    let object = json!({"only": ["venice"], "allow_fallbacks": false});
    for provider in [&pin, &object] {
        replay(&stack, &scenario(&[("venice", &["200", "500"])]));
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, provider.clone())).await;
        assert_served(&reply, "venice");
        assert_eq!(tried, names(&["venice"]));
        let sent = stack.sim.requests()[0].body.clone();
        assert_eq!(
            sent,
            json!({"model": "deepseek-v3.2", "temperature": 0.2, "messages": [{"role": "user", "content": "Hi"}]}),
            "{provider}"
        );
        // venice fails: no other provider is tried. An SDK's own retry
        // would go to venice again, so it is left to the SDK.
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, provider.clone())).await;
        reply.openai_error(500, "provider_error", "api_error");
        assert_eq!(tried, names(&["venice"]), "{provider}");
        assert_eq!(reply.header(ATTEMPTS), Some("1"));
        assert_eq!(reply.header("x-should-retry"), None, "{provider}");
    }

    // Streamed.
    replay(&stack, &scenario(HEALTHY));
    let (reply, tried) = chat(&stack, LUMEN, streamed(routed(DEEPSEEK, pin))).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["venice"]));
    assert!(stack.sim.requests()[0].body.get("provider").is_none());
    stack.stop().await;
}

/// [A10] `order`: these providers first, in this order; the remaining
/// eligible routes fill in by the sort (the seed's example: deepinfra,
/// venice, then Auto)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a10_order_goes_first_and_the_sort_fills_in() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let seed_example = json!({"order": ["deepinfra", "venice"], "allow_fallbacks": true});
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, seed_example.clone())).await;
    assert_eq!(tried, names(&["deepinfra", "venice", "tinfoil"]));
    // After venice, the Default sort's order: tinfoil, then near-ai-us.
    forget_failures(&clock);
    let (_, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"order": ["venice"]})),
    )
    .await;
    assert_eq!(tried, names(&["venice", "tinfoil", "near-ai-us"]));
    assert!(
        stack
            .sim
            .requests()
            .iter()
            .all(|r| r.body.get("provider").is_none())
    );

    replay(&stack, &scenario(HEALTHY));
    let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, seed_example)).await;
    assert_served(&reply, "deepinfra");
    assert_eq!(tried, names(&["deepinfra"]));
    stack.stop().await;
}

/// [A11] `only`: only these providers, first choice and fallback
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a11_only_uses_only_these_providers() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let (_, tried) = chat(
        &stack,
        RESEARCH,
        routed(DEEPSEEK, json!({"only": ["venice", "near-ai"]})),
    )
    .await;
    assert_eq!(tried, names(&["near-ai-us", "venice"]));
    let (_, tried) = chat(
        &stack,
        LUMEN,
        routed(
            DEEPSEEK,
            json!({"only": ["venice", "deepinfra"], "order": ["deepinfra"]}),
        ),
    )
    .await;
    assert_eq!(tried, names(&["deepinfra", "venice"]));

    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"only": ["deepinfra"]})),
    )
    .await;
    assert_served(&reply, "deepinfra");
    stack.stop().await;
}

/// [A12] `ignore`: never these providers, first choice or fallback
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a12_ignore_never_uses_these_providers() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let ignore = json!({"ignore": ["tinfoil", "deepinfra"]});
    let (_, tried) = chat(&stack, RESEARCH, routed(DEEPSEEK, ignore.clone())).await;
    assert_eq!(tried, names(&["near-ai-us", "venice"]));
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, ignore.clone())).await;
    assert_eq!(tried, names(&["venice", "near-ai-us"]));

    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, ignore)).await;
    assert_served(&reply, "venice");
    stack.stop().await;
}

/// [A13] [A94] `allow_fallbacks` defaults to true; false makes one attempt
/// on the first eligible route
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a13_a94_allow_fallbacks_false_makes_a_single_attempt() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(&[("tinfoil", &["503"])]), &clock).await;

    for provider in [json!({}), json!({"allow_fallbacks": true})] {
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, provider)).await;
        assert_served(&reply, "near-ai-us");
        assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
        forget_failures(&clock);
    }
    let (reply, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"allow_fallbacks": false})),
    )
    .await;
    reply.openai_error(503, "provider_error", "api_error");
    assert_eq!(tried, names(&["tinfoil"]));
    assert_eq!(reply.header(ATTEMPTS), Some("1"));
    // An SDK's own retry would make a new plan, tinfoil penalized and last,
    // and reach the provider fallback was turned off for.
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    stack.stop().await;
}

/// [A18] [A94] `max_attempts` (1 to 3) limits the providers tried; it
/// defaults to 3, or to the workspace's limit (legal: 2)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a18_a94_max_attempts_limits_the_providers_tried() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    for (provider, expected) in [
        (json!({}), &["tinfoil", "near-ai-us", "venice"][..]),
        (
            json!({"max_attempts": 3}),
            &["tinfoil", "near-ai-us", "venice"][..],
        ),
        (json!({"max_attempts": 2}), &["tinfoil", "near-ai-us"][..]),
        (json!({"max_attempts": 1}), &["tinfoil"][..]),
    ] {
        let (reply, tried) = chat(&stack, RESEARCH, routed(DEEPSEEK, provider.clone())).await;
        assert_eq!(tried, names(expected), "{provider}");
        assert_eq!(
            reply.header(ATTEMPTS),
            Some(expected.len().to_string().as_str())
        );
        forget_failures(&clock);
    }
    // legal's limit: two attempts.
    let (_, tried) = chat(&stack, LEGAL, routed(DEEPSEEK, json!({"sort": "price"}))).await;
    assert_eq!(tried, names(&["venice", "tinfoil"]));
    stack.stop().await;
}

/// [A14] [A20] [A35] [A44] `sort` chooses the request's ordering (privacy, price,
/// latency, throughput); a request without one, or without `provider`,
/// gets its workspace's sort: Default for lumen, Privacy for research
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a14_a20_a44_the_request_sort_or_else_the_workspace_sort() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    const BY_PRIVACY: &[&str] = &["tinfoil", "near-ai-us", "venice"];
    const BY_PRICE: &[&str] = &["venice", "tinfoil", "near-ai-us"];
    for (request, expected) in [
        (body(DEEPSEEK), BY_PRIVACY),
        (routed(DEEPSEEK, json!({"max_attempts": 3})), BY_PRIVACY),
        (routed(DEEPSEEK, json!({"sort": "privacy"})), BY_PRIVACY),
        (routed(DEEPSEEK, json!({"sort": "price"})), BY_PRICE),
        // Unmeasured routes: latency and throughput fall back to price.
        (routed(DEEPSEEK, json!({"sort": "latency"})), BY_PRICE),
        (routed(DEEPSEEK, json!({"sort": "throughput"})), BY_PRICE),
    ] {
        let (_, tried) = chat(&stack, RESEARCH, request.clone()).await;
        assert_eq!(tried, names(expected), "{request}");
        forget_failures(&clock);
    }

    // With tinfoil recently failed, Default (lumen's workspace sort) puts
    // venice first, ahead of near-ai-us (TEE, but more than 1.5 times
    // venice's price); Privacy keeps the TEE tier first.
    for (request, expected) in [
        (body(DEEPSEEK), &["venice", "near-ai-us", "tinfoil"][..]),
        (
            routed(DEEPSEEK, json!({"only": ["venice", "tinfoil", "near-ai"]})),
            &["venice", "near-ai-us", "tinfoil"][..],
        ),
        (
            routed(DEEPSEEK, json!({"sort": "privacy"})),
            &["near-ai-us", "tinfoil"][..],
        ),
    ] {
        fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
        replay(&stack, &all("500"));
        let (_, tried) = chat(&stack, LUMEN, request.clone()).await;
        assert_eq!(tried, names(expected), "{request}");
        forget_failures(&clock);
    }
    stack.stop().await;
}

/// [A15] `minimum_privacy`: the lowest tier any attempt may use
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a15_minimum_privacy_is_the_lowest_tier_any_attempt_uses() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    for key in [LUMEN, RESEARCH] {
        let (_, tried) = chat(
            &stack,
            key,
            routed(DEEPSEEK, json!({"minimum_privacy": "tee"})),
        )
        .await;
        assert_eq!(tried, names(&["tinfoil", "near-ai-us"]), "{key}");
        forget_failures(&clock);
    }
    // An explicit order cannot bring a weaker tier back.
    let (_, tried) = chat(
        &stack,
        RESEARCH,
        routed(
            DEEPSEEK,
            json!({"minimum_privacy": "private", "order": ["deepinfra", "venice"]}),
        ),
    )
    .await;
    assert_eq!(tried, names(&["venice", "tinfoil", "near-ai-us"]));

    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(
            DEEPSEEK,
            json!({"minimum_privacy": "anonymous", "sort": "price"}),
        ),
    )
    .await;
    assert_served(&reply, "deepinfra");
    // Only E2EE routes are e2ee, and only E2EE requests use them.
    let e2ee = routed(DEEPSEEK, json!({"minimum_privacy": "e2ee"}));
    let (reply, tried) = chat(&stack, LUMEN, e2ee.clone()).await;
    policy_error(&reply, 403, "no_provider_route_meets_privacy");
    assert!(tried.is_empty());
    let (reply, _) = chat_with(&stack, LUMEN, &[(E2EE, "true")], e2ee).await;
    assert_served(&reply, "phala");
    stack.stop().await;
}

/// [A16] `max_price`: routes above the ceiling (input or output, USD per
/// million tokens) are skipped; decided: so is a route without a price
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a16_max_price_skips_routes_above_the_ceiling() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    // tinfoil (input 0.50) and near-ai-us (0.60) are above it.
    let ceiling = json!({"max_price": {"input": 0.45, "output": 1.5}, "order": ["deepinfra"]});
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, ceiling)).await;
    assert_eq!(tried, names(&["deepinfra", "venice"]));
    // An output price above it is enough (tinfoil's 1.50 > 1.4).
    let output = json!({"max_price": {"input": 0.5, "output": 1.4}, "order": ["deepinfra"]});
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, output)).await;
    assert_eq!(tried, names(&["deepinfra", "venice"]));

    // near-ai-us without a price: skipped under any ceiling, used without.
    reprice(&stack, &format!("        {NEAR_AI_PRICE}\n"), "");
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"only": ["near-ai"]})),
    )
    .await;
    assert_served(&reply, "near-ai-us");
    let generous = json!({"only": ["near-ai"], "max_price": {"input": 100, "output": 100}});
    let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, generous)).await;
    policy_error(&reply, 400, "no_provider_route_meets_price");
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [A17] `require_parameters`: only routes that support every parameter of
/// the request (tools, reasoning); without it nothing is filtered; the
/// parameters still go upstream
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a17_require_parameters_keeps_routes_supporting_every_parameter() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let mut reasoning = routed(
        DEEPSEEK,
        json!({"require_parameters": true, "order": ["deepinfra"]}),
    );
    reasoning["reasoning"] = json!({"effort": "high"});
    reasoning["tools"] = tools.clone();
    let (_, tried) = chat(&stack, LUMEN, reasoning.clone()).await;
    assert_eq!(tried, names(&["deepinfra", "tinfoil"]));
    let sent = &stack.sim.requests()[0].body;
    assert_eq!(sent["reasoning"], json!({"effort": "high"}));
    assert_eq!(sent["tools"], tools);
    forget_failures(&clock);

    // Without require_parameters the same body may use every route.
    reasoning["provider"] = json!({"order": ["deepinfra"]});
    let (_, tried) = chat(&stack, LUMEN, reasoning).await;
    assert_eq!(tried, names(&["deepinfra", "tinfoil", "venice"]));
    forget_failures(&clock);

    // A `thinking` field (Anthropic's name for it) asks for reasoning too.
    let mut thinking = routed(DEEPSEEK, json!({"require_parameters": true}));
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let (_, tried) = chat(&stack, RESEARCH, thinking).await;
    assert_eq!(tried, names(&["tinfoil"]));

    // glm's only route lists no tools.
    let mut glm = routed(GLM, json!({"require_parameters": true}));
    glm["tools"] = tools;
    let (reply, tried) = chat(&stack, LUMEN, glm).await;
    policy_error(&reply, 400, "no_provider_route");
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [A21] [A23] provider ids are the catalog's: `near-ai` matches both NEAR
/// AI regions, and the earlier id `other` is accepted in `order`, `only`,
/// `ignore` and pins; responses report `near-ai`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a21_a23_an_id_matches_its_regions_and_other_is_near_ai() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (model, provider, region) in [
        (QWEN, json!({"only": ["near-ai"]}), "near-ai-eu"),
        (DEEPSEEK, json!({"only": ["near-ai"]}), "near-ai-us"),
        (QWEN, json!({"only": ["other"]}), "near-ai-eu"),
        (DEEPSEEK, json!("other"), "near-ai-us"),
        (DEEPSEEK, json!("near-ai"), "near-ai-us"),
        (DEEPSEEK, json!({"order": ["other"]}), "near-ai-us"),
        (
            QWEN,
            json!({"order": ["other"], "sort": "price"}),
            "near-ai-eu",
        ),
    ] {
        let (reply, tried) = chat(&stack, LUMEN, routed(model, provider.clone())).await;
        assert_served(&reply, region);
        assert_eq!(reply.header(PROVIDER), Some("near-ai"), "{provider}");
        assert_eq!(tried, names(&[region]), "{provider}");
    }

    replay(&stack, &all("500"));
    let (_, tried) = chat(
        &stack,
        RESEARCH,
        routed(DEEPSEEK, json!({"ignore": ["other"]})),
    )
    .await;
    assert_eq!(tried, names(&["tinfoil", "venice"]));
    let (_, tried) = chat(&stack, LUMEN, routed(QWEN, json!({"ignore": ["other"]}))).await;
    assert_eq!(tried, names(&["deepinfra"]));
    stack.stop().await;
}

/// [A24] [A25] [A26] [A120] the policy is strict: a provider in both
/// `only` and `ignore`, or an `order` entry that `only` excludes or
/// `ignore` removes, is 400 provider_policy_conflict before any provider
/// sees the request
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a24_a25_a26_a120_contradictory_fields_are_a_provider_policy_conflict() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for conflict in [
        json!({"only": ["venice", "tinfoil"], "ignore": ["venice"]}),
        json!({"only": ["near-ai"], "ignore": ["other"]}),
        json!({"order": ["tinfoil"], "only": ["venice"]}),
        json!({"order": ["venice", "tinfoil"], "only": ["venice"]}),
        json!({"order": ["venice"], "ignore": ["venice"]}),
        json!({"order": ["near-ai"], "ignore": ["other"], "sort": "price"}),
    ] {
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, conflict.clone())).await;
        let message = policy_error(&reply, 400, "provider_policy_conflict");
        assert_eq!(
            message,
            "the provider policy contradicts itself, such as a provider in both only and ignore"
        );
        assert!(tried.is_empty(), "{conflict}");
        let (reply, _) = messages(&stack, LUMEN, message_body_with(conflict)).await;
        reply.anthropic_error(400, "provider_policy_conflict");
    }
    assert!(stack.sim.requests().is_empty());

    // Consistent: an order within only (the old id in order).
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(
            DEEPSEEK,
            json!({"order": ["other"], "only": ["near-ai", "venice"]}),
        ),
    )
    .await;
    assert_served(&reply, "near-ai-us");
    stack.stop().await;
}

fn message_body_with(provider: Value) -> Value {
    message(DEEPSEEK, provider)
}

/// [A27] [A45] [A28] an unknown key or an out-of-range value (`max_attempts`
/// 4 or 0, `"sort": "default"`, a tier that is none, a price ceiling below
/// zero) is 400
/// invalid_request; a `provider` value of the wrong shape is "malformed",
/// 400 invalid_provider_policy
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a27_a45_unknown_keys_and_out_of_range_values_are_invalid_request() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for invalid in [
        json!({"fallbacks": false}),
        json!({"max_attempts": 4}),
        json!({"max_attempts": 0}),
        json!({"max_attempts": 2.5}),
        json!({"sort": "default"}),
        json!({"sort": "cheapest"}),
        json!({"minimum_privacy": "standard"}),
        json!({"max_price": {"input": 1, "total": 2}}),
        json!({"max_price": {"input": -1}}),
        json!({"max_price": {"output": -0.5}}),
    ] {
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, invalid.clone())).await;
        let message = reply.openai_error(400, "invalid_request", "invalid_request_error");
        assert_eq!(
            message, "the request's routing fields are malformed or out of range",
            "{invalid}"
        );
        assert!(tried.is_empty(), "{invalid}");
    }
    for malformed in [
        json!({"allow_fallbacks": "no"}),
        json!({"only": "venice"}),
        json!(42),
        json!(["venice"]),
    ] {
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, malformed.clone())).await;
        policy_error(&reply, 400, "invalid_provider_policy");
        assert!(tried.is_empty(), "{malformed}");
    }
    let (reply, _) = messages(&stack, LUMEN, message_body_with(json!({"sort": "default"}))).await;
    reply.anthropic_error(400, "invalid_request_error");
    assert!(stack.sim.requests().is_empty());

    // The edges of the range are accepted.
    for valid in [json!({"max_attempts": 1}), json!({"max_attempts": 3})] {
        let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, valid)).await;
        assert_served(&reply, "tinfoil");
    }
    stack.stop().await;
}

/// [A28] [A119] a provider value naming no provider (an invalid provider
/// id, in a pin, `only`, `order` or `ignore`) is 400 invalid_provider_policy
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a28_a119_an_invalid_provider_id_is_invalid_provider_policy() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for invalid in [
        json!("fireworks"),
        json!({"only": ["openai"]}),
        json!({"order": ["venice", "not-a-provider"]}),
        json!({"ignore": ["near-ai-west"]}),
        // The catalog's ids of NEAR AI's regions are no public provider
        // ids: "NEAR AI routes ... appear as near-ai". Taken as near-ai,
        // one would silently widen to the other region.
        json!("near-ai-us"),
        json!({"only": ["near-ai-eu"]}),
        json!({"order": ["NEAR-AI-US"]}),
    ] {
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, invalid.clone())).await;
        let message = policy_error(&reply, 400, "invalid_provider_policy");
        assert_eq!(
            message,
            "the provider value is malformed, for example an invalid provider id"
        );
        assert!(tried.is_empty(), "{invalid}");
    }
    let (reply, _) = messages(&stack, LUMEN, message_body_with(json!("fireworks"))).await;
    reply.anthropic_error(400, "invalid_provider_policy");
    assert!(stack.sim.requests().is_empty());
    stack.stop().await;
}

/// [A30] [A32] [A125] the ticket flow binds the policy: a body whose
/// `provider` differs from the ticket's (decided: sent in
/// `x-anonrouter-ticket-provider`) is 409 ticket_provider_policy_mismatch
/// before any provider work; the same value is served; in compatibility
/// mode (no ticket) nothing is compared; the ticket never goes upstream
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a30_a32_a125_a_ticket_binds_the_provider_policy() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (ticket, provider) in [
        (r#"{"sort":"price"}"#, json!({"sort": "latency"})),
        (r#"{"sort":"price"}"#, Value::Null),
        (r#""venice""#, Value::Null),
        (r#""venice""#, json!("tinfoil")),
        (
            r#"{"only":["venice"]}"#,
            json!({"only": ["venice"], "max_attempts": 1}),
        ),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (reply, tried) = chat_with(&stack, LUMEN, &[(TICKET, ticket)], request).await;
        let message = policy_error(&reply, 409, "ticket_provider_policy_mismatch");
        assert_eq!(
            message,
            "the body's provider differs from the policy the ticket was issued for"
        );
        assert!(tried.is_empty(), "{ticket} vs {provider}");
    }
    let reply = stack
        .post(
            "/v1/messages",
            Some(LUMEN),
            &[("anthropic-version", "2023-06-01"), (TICKET, r#""venice""#)],
            &message_body_with(json!("tinfoil")),
        )
        .await;
    reply.anthropic_error(409, "ticket_provider_policy_mismatch");
    assert!(stack.sim.requests().is_empty());

    // The same value (key order aside) is served, and neither the ticket
    // nor the provider field reaches the provider.
    for (ticket, provider, served) in [
        (
            r#"{"max_attempts":2,"sort":"price"}"#,
            json!({"sort": "price", "max_attempts": 2}),
            "venice",
        ),
        (r#""venice""#, json!("venice"), "venice"),
        (r#""tinfoil""#, json!("tinfoil"), "tinfoil"),
    ] {
        let (reply, tried) = chat_with(
            &stack,
            LUMEN,
            &[(TICKET, ticket)],
            routed(DEEPSEEK, provider),
        )
        .await;
        assert_served(&reply, served);
        assert_eq!(tried, names(&[served]));
        let sent = stack.sim.requests().last().unwrap().clone();
        assert_eq!(sent.header(TICKET), None);
        assert!(sent.body.get("provider").is_none());
    }

    // Compatibility mode: the body alone.
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, json!({"sort": "latency"}))).await;
    assert_served(&reply, "venice");
    stack.stop().await;
}

// ---------------------------------------------------------------------
// How Auto picks a provider

/// [A33] selection first applies availability (a route whose credential is
/// not configured is gone), workspace boundaries, provider restrictions,
/// required capabilities and price ceilings, in that order: the step that
/// removes the last route names the error
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a33_eligibility_applies_its_filters_in_order() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let mut capability_then_price = routed(
        GLM,
        json!({"require_parameters": true, "max_price": {"input": 0.1, "output": 0.1}}),
    );
    capability_then_price["tools"] = tools;
    for (key, request, status, error) in [
        // The boundary (vault: TEE) before the request's restrictions.
        (
            VAULT,
            routed(GLM, json!({"only": ["venice"]})),
            403,
            "privacy_boundary_not_met",
        ),
        (VAULT, body(GLM), 403, "privacy_boundary_not_met"),
        // Restrictions before price ceilings.
        (
            LUMEN,
            routed(
                DEEPSEEK,
                json!({"ignore": ["venice", "tinfoil", "near-ai", "deepinfra"], "max_price": {"input": 0.1, "output": 0.1}}),
            ),
            400,
            "no_provider_route",
        ),
        (
            LUMEN,
            routed(
                DEEPSEEK,
                json!({"only": ["tinfoil"], "max_price": {"input": 0.1, "output": 0.1}}),
            ),
            400,
            "no_provider_route_meets_price",
        ),
        // Capabilities before price ceilings.
        (LUMEN, capability_then_price, 400, "no_provider_route"),
        // Price ceilings before the privacy floor: deepinfra passes the
        // ceiling, then the floor removes it.
        (
            LUMEN,
            routed(
                DEEPSEEK,
                json!({"max_price": {"input": 0.3, "output": 1.0}, "minimum_privacy": "private"}),
            ),
            403,
            "no_provider_route_meets_privacy",
        ),
    ] {
        let (reply, tried) = chat(&stack, key, request.clone()).await;
        policy_error(&reply, status, error);
        assert!(tried.is_empty(), "{request}");
    }
    stack.stop().await;

    // Without tinfoil's credential its route is not available.
    let stack = Stack::shipped(
        "anonrouter",
        &all("500"),
        &["ANONROUTER_TINFOIL_KEY"],
        clock.clone(),
    )
    .await;
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["near-ai-us", "venice"]));
    let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("tinfoil"))).await;
    policy_error(&reply, 400, "no_provider_route");
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [A34] E2EE routes serve only E2EE requests (decided: the request says so
/// in `x-anonrouter-e2ee`, which never goes upstream); a plaintext request
/// never selects one
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a34_e2ee_routes_serve_only_e2ee_requests() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for plaintext in [
        routed(DEEPSEEK, json!("phala")),
        routed(DEEPSEEK, json!({"only": ["phala"]})),
    ] {
        let (reply, tried) = chat(&stack, LUMEN, plaintext).await;
        policy_error(&reply, 400, "no_provider_route");
        assert!(tried.is_empty());
    }
    let (reply, _) = chat_with(&stack, LUMEN, &[(E2EE, "false")], body(DEEPSEEK)).await;
    assert_served(&reply, "tinfoil");

    for request in [body(DEEPSEEK), routed(DEEPSEEK, json!({"sort": "price"}))] {
        let (reply, tried) = chat_with(&stack, LUMEN, &[(E2EE, "true")], request).await;
        assert_served(&reply, "phala");
        assert_eq!(reply.header(PRIVACY), Some("e2ee"));
        assert_eq!(tried, names(&["phala"]));
        assert_eq!(stack.sim.requests().last().unwrap().header(E2EE), None);
    }

    // An E2EE request for a model without an E2EE route, or restricted
    // to plaintext providers.
    for (model, provider) in [
        (GLM, Value::Null),
        (DEEPSEEK, json!({"only": ["venice", "tinfoil"]})),
    ] {
        let request = if provider.is_null() {
            body(model)
        } else {
            routed(model, provider)
        };
        let (reply, tried) = chat_with(&stack, LUMEN, &[(E2EE, "true")], request).await;
        policy_error(&reply, 400, "no_provider_route");
        assert!(tried.is_empty());
    }
    let (reply, _) = chat_with(&stack, LUMEN, &[(E2EE, "yes please")], body(DEEPSEEK)).await;
    reply.openai_error(400, "invalid_request", "invalid_request_error");
    stack.stop().await;
}

/// [A37] `privacy` keeps the strongest eligible tier first, healthy routes
/// first within it, then lower prices
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a37_privacy_sorts_by_tier_then_health_then_price() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    forget_failures(&clock);

    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["near-ai-us", "tinfoil", "venice"]));
    forget_failures(&clock);

    // Requested explicitly: no implied floor, so Anonymous comes last.
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, LUMEN, routed(QWEN, json!({"sort": "privacy"}))).await;
    assert_served(&reply, "near-ai-eu");
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(
            DEEPSEEK,
            json!({"sort": "privacy", "only": ["deepinfra", "venice"]}),
        ),
    )
    .await;
    assert_served(&reply, "venice");
    stack.stop().await;
}

/// [A38] `price`: the lowest price within the privacy floor (the seed's
/// example: price, private floor, two attempts)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a38_price_sorts_by_lowest_price_within_the_floor() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    for (provider, expected) in [
        (
            json!({"sort": "price"}),
            &["venice", "tinfoil", "near-ai-us"][..],
        ),
        (
            json!({"sort": "price", "minimum_privacy": "anonymous"}),
            &["deepinfra", "venice", "tinfoil"][..],
        ),
        (
            json!({"sort": "price", "minimum_privacy": "tee"}),
            &["tinfoil", "near-ai-us"][..],
        ),
        (
            json!({"sort": "price", "minimum_privacy": "private", "max_attempts": 2}),
            &["venice", "tinfoil"][..],
        ),
    ] {
        let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, provider.clone())).await;
        assert_eq!(tried, names(expected), "{provider}");
        forget_failures(&clock);
    }
    stack.stop().await;
}

/// Every deepseek route of research's plan fails: the order they were
/// tried in (three at most).
async fn failing_order(stack: &Stack, provider: Value) -> Vec<String> {
    replay(stack, &all("500"));
    let (_, tried) = chat(stack, RESEARCH, routed(DEEPSEEK, provider)).await;
    tried
}

/// A sort by measurements (`provider` names it), over deepseek's routes
/// whose measured order is near-ai-us, tinfoil, venice and whose price
/// order is the reverse: with 19 measurements each, price decides (venice
/// serves); with twenty each (venice got its twentieth), the measurements
/// do; a day later they are gone and price decides again. `stream`: the
/// measurements come from streams that report usage.
async fn measured_sort(stack: &Stack, clock: &ManualClock, provider: Value, stream: bool) {
    for pin in ["near-ai", "tinfoil", "venice"] {
        warm(stack, DEEPSEEK, pin, 19, stream).await;
    }
    let mut request = routed(DEEPSEEK, provider.clone());
    if stream {
        request = streamed(request);
        request["stream_options"] = json!({"include_usage": true});
    }
    let (reply, _) = chat(stack, RESEARCH, request).await;
    assert_served(&reply, "venice");
    recorded(stack, DEEPSEEK, "venice", 20);
    warm(stack, DEEPSEEK, "near-ai", 1, stream).await;
    warm(stack, DEEPSEEK, "tinfoil", 1, stream).await;
    assert_eq!(
        failing_order(stack, provider.clone()).await,
        names(&["near-ai-us", "tinfoil", "venice"]),
        "measured: {provider}"
    );
    clock.advance(24 * 3_600_000 + 1_000);
    assert_eq!(
        failing_order(stack, provider.clone()).await,
        names(&["venice", "tinfoil", "near-ai-us"]),
        "a day later: {provider}"
    );
}

/// [A39] [A41] `latency`: the lowest measured time to first token over the
/// last 24 hours; with fewer than 20 measurements (decided: per route) a
/// route falls back to price
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a39_a41_latency_sorts_by_measured_time_to_first_token() {
    let clock = Arc::new(ManualClock::default());
    // Gaps wide enough for a busy machine's noise.
    let latencies = fleet(&[
        ("tinfoil", String::from("{latency: 150ms}")),
        ("venice", String::from("{latency: 400ms}")),
    ]);
    let stack = shipped(&latencies, &clock).await;
    let latency = json!({"sort": "latency"});

    measured_sort(&stack, &clock, latency, false).await;
    stack.stop().await;
}

/// [A40] [A41] `throughput`: the highest measured output tokens per second
/// over the last 24 hours; fewer than 20 measurements fall back to price
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a40_a41_throughput_sorts_by_measured_tokens_per_second() {
    let clock = Arc::new(ManualClock::default());
    // The same pace of chunks, different numbers of output tokens.
    let paced =
        |output: u32| format!("{{chunk_interval: 10ms, usage: {{input: 12, output: {output}}}}}");
    let rates = fleet(&[
        ("near-ai-us", paced(4000)),
        ("tinfoil", paced(1000)),
        ("venice", paced(250)),
    ]);
    let stack = shipped(&rates, &clock).await;
    let throughput = json!({"sort": "throughput"});

    measured_sort(&stack, &clock, throughput, true).await;
    stack.stop().await;
}

/// [A40] a non-streamed answer says nothing about output speed: one such
/// answer from the slowest route does not make it the fastest
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a40_a_non_streamed_answer_is_no_throughput_measurement() {
    let clock = Arc::new(ManualClock::default());
    let paced =
        |output: u32| format!("{{chunk_interval: 10ms, usage: {{input: 12, output: {output}}}}}");
    let rates = fleet(&[
        ("near-ai-us", paced(4000)),
        ("tinfoil", paced(1000)),
        ("venice", paced(250)),
    ]);
    let stack = shipped(&rates, &clock).await;

    for pin in ["near-ai", "tinfoil", "venice"] {
        warm(&stack, DEEPSEEK, pin, 20, true).await;
    }
    let throughput = json!({"sort": "throughput"});
    let (reply, _) = chat(&stack, RESEARCH, routed(DEEPSEEK, json!("venice"))).await;
    assert_served(&reply, "venice");
    assert_eq!(
        failing_order(&stack, throughput).await,
        names(&["near-ai-us", "tinfoil", "venice"])
    );
    stack.stop().await;
}

/// [A42] an explicit non-privacy sort without `minimum_privacy` uses
/// Private as its floor (the seed's example: only venice and deepinfra by
/// throughput leaves venice); privacy, or an explicit floor, does not; the
/// workspace's floor still applies on top
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a42_an_explicit_non_privacy_sort_implies_a_private_floor() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for sort in ["price", "latency", "throughput"] {
        let (reply, tried) = chat(
            &stack,
            LUMEN,
            routed(DEEPSEEK, json!({"only": ["deepinfra"], "sort": sort})),
        )
        .await;
        policy_error(&reply, 403, "no_provider_route_meets_privacy");
        assert!(tried.is_empty());
    }
    for provider in [
        json!({"only": ["deepinfra"], "sort": "privacy"}),
        json!({"only": ["deepinfra"]}),
        json!({"only": ["deepinfra"], "sort": "price", "minimum_privacy": "anonymous"}),
    ] {
        let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, provider)).await;
        assert_served(&reply, "deepinfra");
    }

    replay(&stack, &all("500"));
    let seed_example = json!({"only": ["venice", "deepinfra"], "sort": "throughput"});
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, seed_example)).await;
    assert_eq!(tried, names(&["venice"]));
    forget_failures(&clock);

    // A workspace floor of tee is above the implied one.
    default_workspace(&stack, "{provider_minimum_privacy: tee}");
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!({"sort": "price"}))).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    stack.stop().await;
}

/// [A43] for free models the account's free-model opt-in supplies
/// Anonymous consent: lumen (opted in) gets the free Anonymous route under
/// `price`, orbit does not; a paid model keeps the Private floor
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a43_the_free_model_opt_in_supplies_anonymous_consent() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let price = json!({"sort": "price"});
    let (_, tried) = chat(&stack, LUMEN, routed(QWEN, price.clone())).await;
    assert_eq!(tried, names(&["deepinfra", "near-ai-eu"]));
    let (_, tried) = chat(&stack, ORBIT, routed(QWEN, price.clone())).await;
    assert_eq!(tried, names(&["near-ai-eu"]));
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, price)).await;
    assert!(!tried.contains(&String::from("deepinfra")), "{tried:?}");

    replay(&stack, &scenario(HEALTHY));
    let only_free = json!({"only": ["deepinfra"], "sort": "price"});
    let (reply, _) = chat(&stack, LUMEN, routed(QWEN, only_free.clone())).await;
    assert_served(&reply, "deepinfra");
    let (reply, _) = chat(&stack, ORBIT, routed(QWEN, only_free)).await;
    policy_error(&reply, 403, "no_provider_route_meets_privacy");
    stack.stop().await;
}

/// [A46] an exact pin and an explicit `order` keep their meaning under
/// every sort, the workspace's or the request's
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a46_pins_and_order_keep_their_meaning_under_every_sort() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for key in [LUMEN, RESEARCH] {
        for pin in ["deepinfra", "venice", "near-ai"] {
            let (reply, tried) = chat(&stack, key, routed(DEEPSEEK, json!(pin))).await;
            assert_eq!(reply.header(PROVIDER), Some(pin));
            assert_eq!(tried.len(), 1);
        }
    }
    replay(&stack, &all("500"));
    for (provider, expected) in [
        (
            json!({"order": ["deepinfra"]}),
            &["deepinfra", "tinfoil", "near-ai-us"][..],
        ),
        (
            json!({"order": ["venice"], "sort": "privacy"}),
            &["venice", "tinfoil", "near-ai-us"][..],
        ),
        (
            json!({"order": ["near-ai"], "sort": "price"}),
            &["near-ai-us", "venice", "tinfoil"][..],
        ),
        (
            json!({"order": ["near-ai", "venice"], "sort": "latency"}),
            &["near-ai-us", "venice", "tinfoil"][..],
        ),
        (
            json!({"order": ["tinfoil", "near-ai"], "sort": "throughput"}),
            &["tinfoil", "near-ai-us", "venice"][..],
        ),
    ] {
        let (_, tried) = chat(&stack, RESEARCH, routed(DEEPSEEK, provider.clone())).await;
        assert_eq!(tried, names(expected), "{provider}");
        forget_failures(&clock);
    }
    // Under lumen's Default sort.
    let (_, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"order": ["venice"]})),
    )
    .await;
    assert_eq!(tried, names(&["venice", "tinfoil", "near-ai-us"]));
    stack.stop().await;
}

/// A chat completion whose body is about `bytes` long: the proxy estimates
/// a quarter as many tokens.
fn sized(model: &str, provider: Value, bytes: usize) -> Value {
    let mut body =
        json!({"model": model, "messages": [{"role": "user", "content": "x".repeat(bytes)}]});
    if !provider.is_null() {
        body["provider"] = provider;
    }
    body
}

/// [A47] [A48] decided: a route whose context window is smaller than the
/// request's estimate goes behind the routes of its tier that fit (under
/// Default out of the weighing, under `privacy` after the tier), never
/// ahead of a pin or an explicit order, and is never removed: the provider
/// decides whether the prompt fits
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a47_a48_context_estimates_order_routes_but_never_reject() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;
    // About 75,000 tokens: more than tinfoil's 65,536, less than the rest.
    const MEDIUM: usize = 300_000;
    // About 150,000 tokens: only deepinfra's 163,840 fits.
    const LARGE: usize = 600_000;

    for (key, provider, bytes, expected) in [
        // Default: TEE tinfoil is too small while TEE near-ai-us fits, so
        // it is left out of the weighing and goes behind near-ai-us, which
        // Private venice still outweighs (it costs more than 1.5 times as
        // much); a fallback from venice may go up to a TEE route.
        (
            LUMEN,
            Value::Null,
            MEDIUM,
            &["venice", "near-ai-us", "tinfoil"][..],
        ),
        // Among the two TEE routes, the one that fits first.
        (
            LUMEN,
            json!({"ignore": ["venice"]}),
            MEDIUM,
            &["near-ai-us", "tinfoil"][..],
        ),
        (
            RESEARCH,
            Value::Null,
            MEDIUM,
            &["near-ai-us", "tinfoil", "venice"][..],
        ),
        (
            RESEARCH,
            json!({"sort": "price"}),
            MEDIUM,
            &["venice", "near-ai-us", "tinfoil"][..],
        ),
        // Only Anonymous deepinfra fits, but while no route of its tier
        // fits a route keeps its place: Default never leaves a more private
        // tier for an estimate.
        (LUMEN, Value::Null, LARGE, &["tinfoil", "near-ai-us"][..]),
        (
            RESEARCH,
            json!({"order": ["tinfoil"]}),
            MEDIUM,
            &["tinfoil", "near-ai-us", "venice"][..],
        ),
        (LUMEN, json!("tinfoil"), MEDIUM, &["tinfoil"][..]),
        // Small requests: the usual order.
        (LUMEN, Value::Null, 1_000, &["tinfoil", "near-ai-us"][..]),
    ] {
        let (_, tried) = chat(&stack, key, sized(DEEPSEEK, provider.clone(), bytes)).await;
        assert_eq!(tried, names(expected), "{key} {provider} {bytes}");
        forget_failures(&clock);
    }

    // glm's only route (131,072 tokens) still gets a larger prompt.
    replay(&stack, &scenario(HEALTHY));
    let (reply, tried) = chat(&stack, LUMEN, sized(GLM, Value::Null, LARGE)).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["venice"]));
    let (reply, _) = chat(&stack, LUMEN, sized(DEEPSEEK, json!("tinfoil"), LARGE)).await;
    assert_served(&reply, "tinfoil");
    stack.stop().await;
}

/// [A47] [A64] a route too small for the estimate refuses with a context
/// error, which stops failover: under Default a route of its tier that
/// fits, or one a route that fits outweighs, serves before it is asked.
/// About 75,000 tokens: TEE tinfoil (65,536) is left out of the weighing,
/// so Private venice (cheaper than 1.5 times TEE near-ai-us) leads and
/// near-ai-us follows; a small request still goes to tinfoil
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a47_a_route_that_fits_serves_before_a_too_small_one_refuses() {
    let clock = Arc::new(ManualClock::default());
    const TOO_LONG: &str = "400 code=context_length_exceeded";
    const MEDIUM: usize = 300_000;
    let stack = shipped(&scenario(&[("tinfoil", &[TOO_LONG])]), &clock).await;

    let (reply, tried) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, MEDIUM)).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["venice"]));
    // venice fails: the TEE route that fits serves, tinfoil is not asked.
    replay(
        &stack,
        &scenario(&[("tinfoil", &[TOO_LONG]), ("venice", &["500"])]),
    );
    let (reply, tried) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, MEDIUM)).await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(tried, names(&["venice", "near-ai-us"]));
    forget_failures(&clock);
    // Both fail: tinfoil last, whose context error ends the request.
    replay(
        &stack,
        &scenario(&[
            ("tinfoil", &[TOO_LONG]),
            ("venice", &["500"]),
            ("near-ai-us", &["500"]),
        ]),
    );
    let (reply, tried) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, MEDIUM)).await;
    policy_error(&reply, 503, "provider_fallback_exhausted");
    assert_eq!(tried, names(&["venice", "near-ai-us", "tinfoil"]));
    forget_failures(&clock);
    // A small request: tinfoil keeps its TEE preference.
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, 1_000)).await;
    assert_served(&reply, "tinfoil");

    // tinfoil made a cheap Private route (typical price 1.15): while it fits
    // it outweighs near-ai-us, repriced to 2.25, 1.5 times venice's 1.50.
    // Too small, it outweighs no route: near-ai-us keeps its TEE
    // preference and leads.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[
            (
                "attributes: {tier: tee, context_window: 65536}",
                "attributes: {tier: private, context_window: 65536}",
            ),
            (
                "price: {input: 0.50, output: 1.50, cache_read: 0.12}",
                "price: {input: 0.30, output: 0.90, cache_read: 0.10}",
            ),
            (NEAR_AI_PRICE, "price: {input: 0.50, output: 1.50}"),
        ],
        &[],
    );
    let (reply, _) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, 1_000)).await;
    assert_served(&reply, "tinfoil");
    replay(&stack, &scenario(&[("tinfoil", &[TOO_LONG])]));
    let (reply, tried) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, MEDIUM)).await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(tried, names(&["near-ai-us"]));

    // tinfoil made a cheap Anonymous route (typical price 0.30, under a
    // third of every more private one), near-ai-us at its own price again:
    // tinfoil is preferred while it fits; too small while Anonymous
    // deepinfra fits, it is not, and the Private route leads.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[
            (
                "attributes: {tier: private, context_window: 65536}",
                "attributes: {tier: anonymous, context_window: 65536}",
            ),
            (
                "price: {input: 0.30, output: 0.90, cache_read: 0.10}",
                "price: {input: 0.10, output: 0.10, cache_read: 0.05}",
            ),
            ("price: {input: 0.50, output: 1.50}", NEAR_AI_PRICE),
        ],
        &[],
    );
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, 1_000)).await;
    assert_served(&reply, "tinfoil");
    replay(&stack, &scenario(&[("tinfoil", &[TOO_LONG])]));
    let (reply, tried) = chat(&stack, LUMEN, sized(DEEPSEEK, Value::Null, MEDIUM)).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["venice"]));
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Automatic failover

/// [A5] [A52] a provider that fails before any output is followed by the
/// next route of the plan, up to 3 providers in total (even when the
/// workspace saved more); the client gets one response, from the provider
/// that succeeded
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a5_a52_failover_tries_up_to_three_providers() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(
        &scenario(&[("tinfoil", &["500"]), ("near-ai-us", &["503"])]),
        &clock,
    )
    .await;

    let (reply, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "venice");
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    assert_eq!(reply.json["object"], "chat.completion");
    assert_eq!(reply.json["choices"].as_array().unwrap().len(), 1);
    forget_failures(&clock);

    // A fourth eligible route is never tried, whatever the workspace saved.
    default_workspace(&stack, "{provider_max_attempts: 5}");
    replay(&stack, &all("500"));
    let (reply, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"order": ["deepinfra"]})),
    )
    .await;
    assert_eq!(tried, names(&["deepinfra", "tinfoil", "venice"]));
    assert_eq!(reply.header(ATTEMPTS), Some("3"));
    stack.stop().await;
}

/// [A53] before output means, for a stream, before the response headers
/// (which go out with the provider's first event): a stream that fails
/// before its first event — an error status, a connection cut after the
/// headers, a malformed first event, no first event in time — fails over,
/// and the client sees one clean stream
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a53_a_stream_fails_over_until_its_first_event() {
    let clock = Arc::new(ManualClock::default());
    // The sim's pauses run on the test's clock too, so the test decides
    // when the late stream's headers come.
    let stack = Stack::shipped_on_one_clock("anonrouter", &scenario(HEALTHY), clock.clone()).await;

    for step in ["503", "reset", "cut_after=0", "malformed"] {
        replay(&stack, &scenario(&[("tinfoil", &[step])]));
        let reply = stack.chat(RESEARCH, streamed(body(DEEPSEEK))).await;
        assert_served(&reply, "near-ai-us");
        assert_eq!(reply.events().last().unwrap().1, "[DONE]", "{step}");
        assert!(!reply.text.contains("\"error\""), "{step}: {}", reply.text);
        assert_eq!(
            stack.providers_tried(),
            names(&["tinfoil", "near-ai-us"]),
            "{step}"
        );
        forget_failures(&clock);
    }

    // The first event is late: the proxy gives up after the first-token
    // timeout (the clock's), and near-ai-us serves.
    replay(
        &stack,
        &scenario(&[("tinfoil", &["slow_headers=1s first_token=10m"])]),
    );
    let asked_at = clock.now_ms();
    let streaming = spawn_chat(&stack, RESEARCH, streamed(body(DEEPSEEK)));
    until("tinfoil is asked", || stack.sim.requests().len() == 1).await;
    headers_come_after(&clock, asked_at, 1_000, TIMEOUT_MS).await;
    clock.advance(TIMEOUT_MS - 1);
    settle().await;
    assert_eq!(
        stack.providers_tried(),
        names(&["tinfoil"]),
        "left too early"
    );
    clock.advance(1);
    let reply = finished_within(PATIENCE, streaming).await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(stack.providers_tried(), names(&["tinfoil", "near-ai-us"]));
    stack.stop().await;
}

/// [A88] once the stream's headers and first event went out, a failure is
/// reported to the client — an error event in its wire format, no end
/// marker — and nothing is retried elsewhere; decided: the route is
/// penalized
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a88_after_output_started_a_failure_is_reported_not_retried() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for step in ["cut_after=2", "malformed_chunk=3"] {
        replay(&stack, &scenario(&[("tinfoil", &[step])]));
        let reply = stack.chat(RESEARCH, streamed(body(DEEPSEEK))).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header(PROVIDER), Some("tinfoil"));
        let text = reply.answer_text();
        assert!(
            !text.is_empty() && "hello from tinfoil".starts_with(&text),
            "{}",
            reply.text
        );
        let events = reply.events();
        let error: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
        assert_eq!(error["error"]["code"], "provider_error", "{step}");
        assert_eq!(error["error"]["type"], "api_error");
        assert!(!reply.text.contains("[DONE]"));
        assert_eq!(stack.providers_tried(), names(&["tinfoil"]), "{step}");

        // Decided: the broken stream's route is tried last for a while.
        let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
        assert_served(&reply, "near-ai-us");
        forget_failures(&clock);
    }

    // A stall past the idle timeout (on the clock) ends it the same way.
    // The clock moves once the stream is committed (its headers go out with
    // its first event), so it is the idle wait that ends.
    replay(&stack, &scenario(&[("tinfoil", &["stall_after=2"])]));
    let opening = spawn_open_chat(&stack, RESEARCH, streamed(body(DEEPSEEK)));
    let response = finished(opening).await;
    let reply = advance_until(
        &clock,
        5_000,
        300_000,
        Reply::rest(response, String::new(), Instant::now()),
    )
    .await;
    let error: Value = serde_json::from_str(&reply.events().last().unwrap().1).unwrap();
    assert_eq!(error["error"]["code"], "provider_error");
    assert_eq!(stack.providers_tried(), names(&["tinfoil"]));
    stack.stop().await;
}

/// [A88] [A65] [A126] a stream that breaks after output started, after a
/// fallback, reports the serving provider's failure: its sanitized error
/// (`provider_error`), not `provider_fallback_exhausted`, which says every
/// attempt failed before output; an output-limit error there too, and
/// without a penalty
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a88_a126_a_stream_broken_after_a_fallback_is_the_providers_own_error() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (step, penalized) in [
        ("cut_after=2", true),
        ("error_after=2 code=server_error", true),
        ("error_after=2 code=max_tokens_exceeded", false),
    ] {
        replay(
            &stack,
            &scenario(&[("tinfoil", &["500"]), ("near-ai-us", &[step])]),
        );
        let reply = stack.chat(RESEARCH, streamed(body(DEEPSEEK))).await;
        assert_eq!(reply.header(PROVIDER), Some("near-ai"), "{step}");
        assert!(
            "hello from near-ai-us".starts_with(&reply.answer_text()),
            "{step}: {}",
            reply.text
        );
        let (_, error) = reply.broken_stream();
        assert_eq!(error["error"]["code"], "provider_error", "{step}");
        assert_eq!(error["error"]["type"], "api_error", "{step}");
        assert_eq!(
            stack.providers_tried(),
            names(&["tinfoil", "near-ai-us"]),
            "{step}"
        );
        // tinfoil is penalized for its 500: the next request goes to
        // near-ai-us unless its broken stream penalized it too (then the
        // cheaper tinfoil leads the two penalized TEE routes).
        replay(&stack, &scenario(HEALTHY));
        let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
        let next = if penalized { "tinfoil" } else { "near-ai-us" };
        assert_served(&reply, next);
        forget_failures(&clock);
    }
    stack.stop().await;
}

/// What the failover table says of one result.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Penalty {
    None,
    Route,
}

/// tinfoil, research's first choice for deepseek, answers `step` (near-ai-us
/// serves): whether the request moved on to near-ai-us, and whether tinfoil
/// was then tried last by the next request. Clears the penalties after.
async fn first_attempt_answers(
    stack: &Stack,
    clock: &ManualClock,
    step: &str,
    request: Value,
) -> (Reply, bool, Penalty) {
    replay(stack, &scenario(&[("tinfoil", &[step])]));
    let attempts_before = finished_attempts(stack);
    let requesting = spawn_chat(stack, RESEARCH, request);
    // The clock moves only until tinfoil's attempt has ended (a timeout
    // needs it to, a status does not): its penalty counts from then, and
    // moving on could let the penalty run out before the next request.
    advance_until(
        clock,
        1_000,
        300_000,
        until("tinfoil's attempt ends", || {
            finished_attempts(stack) > attempts_before
        }),
    )
    .await;
    let reply = finished(requesting).await;
    let tried = stack.providers_tried();
    let moved_on = match tried.as_slice() {
        [first, second] if first == "tinfoil" && second == "near-ai-us" => {
            assert_served(&reply, "near-ai-us");
            true
        }
        [first] if first == "tinfoil" => false,
        _ => panic!("{step}: tried {tried:?}"),
    };
    replay(stack, &scenario(HEALTHY));
    let (next, _) = chat(stack, RESEARCH, body(DEEPSEEK)).await;
    let penalty = match next.header(PROVIDER) {
        Some("tinfoil") => Penalty::None,
        Some("near-ai") => Penalty::Route,
        other => panic!("{step}: then served by {other:?}"),
    };
    forget_failures(clock);
    (reply, moved_on, penalty)
}

/// [A54] [A55] [A59] rate limited (429), a server error (5xx) or model
/// unavailable (404): the next provider, and that route is penalized
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a54_a55_a59_429_5xx_and_404_move_on_and_penalize_the_route() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for step in [
        "429",
        "429 retry_after=1s",
        "500",
        "502",
        "503",
        "504",
        "529",
        "599",
        "404",
    ] {
        let (_, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, step, body(DEEPSEEK)).await;
        assert!(moved_on, "{step}");
        assert_eq!(penalty, Penalty::Route, "{step}");
    }
    // The same for a stream (the status comes before any output).
    let (_, moved_on, penalty) =
        first_attempt_answers(&stack, &clock, "429", streamed(body(DEEPSEEK))).await;
    assert!(moved_on);
    assert_eq!(penalty, Penalty::Route);
    stack.stop().await;
}

/// [A56] a timeout (no headers within 60 s on the proxy's clock, or a
/// stream's first event late): the next provider, and that route is
/// penalized
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a56_a_timeout_moves_on_and_penalizes_the_route() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(&[("tinfoil", &["no_answer"])]), &clock).await;

    let waiting = spawn_chat(&stack, RESEARCH, body(DEEPSEEK));
    until("tinfoil is asked", || stack.sim.requests().len() == 1).await;
    settle().await;
    clock.advance(TIMEOUT_MS - 1);
    settle().await;
    assert_eq!(
        stack.providers_tried(),
        names(&["tinfoil"]),
        "left too early"
    );
    clock.advance(1);
    let reply = finished_within(PATIENCE, waiting).await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(stack.providers_tried(), names(&["tinfoil", "near-ai-us"]));
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "near-ai-us");
    forget_failures(&clock);

    for step in ["no_answer", "slow_headers=10m", "first_token=10m"] {
        let (_, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, step, streamed(body(DEEPSEEK))).await;
        assert!(moved_on, "{step}");
        assert_eq!(penalty, Penalty::Route, "{step}");
    }
    stack.stop().await;
}

/// [A57] a network failure before any output (the connection dropped, or
/// refused): the next provider, and that route is penalized
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a57_a_network_failure_moves_on_and_penalizes_the_route() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for request in [body(DEEPSEEK), streamed(body(DEEPSEEK))] {
        let (_, moved_on, penalty) = first_attempt_answers(&stack, &clock, "reset", request).await;
        assert!(moved_on);
        assert_eq!(penalty, Penalty::Route);
    }

    // tinfoil where nothing listens.
    let tinfoil = format!("http://{}/tinfoil/v1", stack.sim.addr());
    let nowhere = format!("http://127.0.0.1:{}/tinfoil/v1", closed_port());
    reconfigure(&stack, "catalog.yaml", &[(&tinfoil, &nowhere)], &[]);
    let (reply, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(tried, names(&["near-ai-us"]));
    assert_eq!(reply.header(ATTEMPTS), Some("2"));
    // Penalized: tinfoil is now tried last, so near-ai-us is asked first.
    let (reply, _) = chat(
        &stack,
        RESEARCH,
        routed(DEEPSEEK, json!({"max_attempts": 1})),
    )
    .await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(reply.header(ATTEMPTS), Some("1"));
    stack.stop().await;
}

/// [A58] a malformed or incomplete response before any output (decided:
/// also a redirect): the next provider, and that route is penalized
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a58_a_malformed_or_incomplete_answer_moves_on_and_penalizes_the_route() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for step in ["malformed", "cut_after=1", "301", "302", "307"] {
        let (_, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, step, body(DEEPSEEK)).await;
        assert!(moved_on, "{step}");
        assert_eq!(penalty, Penalty::Route, "{step}");
    }
    for step in ["malformed", "cut_after=0"] {
        let (_, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, step, streamed(body(DEEPSEEK))).await;
        assert!(moved_on, "stream {step}");
        assert_eq!(penalty, Penalty::Route, "stream {step}");
    }
    stack.stop().await;
}

/// [A60] [A61] [A66] a provider's 401 or 402 is about AnonRouter's account
/// with it: the request moves on and every route of that provider is
/// penalized (deepinfra's qwen route too), where a 429 penalizes the one
/// route
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a60_a61_a66_401_and_402_penalize_the_whole_provider() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;
    let deepinfra_first = routed(DEEPSEEK, json!({"order": ["deepinfra"]}));
    let qwen_by_price = routed(QWEN, json!({"sort": "price"}));

    for (step, provider_penalized) in [
        ("401", true),
        ("402", true),
        ("402 code=insufficient_quota", true),
        ("429", false),
        ("500", false),
    ] {
        replay(&stack, &scenario(&[("deepinfra", &[step])]));
        let (reply, tried) = chat(&stack, LUMEN, deepinfra_first.clone()).await;
        assert_served(&reply, "tinfoil");
        assert_eq!(tried, names(&["deepinfra", "tinfoil"]), "{step}");

        replay(&stack, &scenario(HEALTHY));
        // deepseek's deepinfra route is penalized either way...
        let (reply, _) = chat(
            &stack,
            LUMEN,
            routed(
                DEEPSEEK,
                json!({"sort": "price", "minimum_privacy": "anonymous"}),
            ),
        )
        .await;
        assert_served(&reply, "venice");
        // ...qwen's only when the whole provider is.
        let (reply, _) = chat(&stack, LUMEN, qwen_by_price.clone()).await;
        let expected = if provider_penalized {
            "near-ai-eu"
        } else {
            "deepinfra"
        };
        assert_served(&reply, expected);
        forget_failures(&clock);
    }
    stack.stop().await;
}

/// [A60] [A61] NEAR AI's two regions are one provider (one name, one
/// account): a 401 or 402 from near-ai-us penalizes near-ai-eu too, so
/// qwen's TEE route there no longer leads; a 429 penalizes the one route
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a60_a61_a_providers_regions_are_penalized_together() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;
    let near_ai_first = routed(DEEPSEEK, json!({"order": ["near-ai"]}));

    let (reply, _) = chat(&stack, LUMEN, body(QWEN)).await;
    assert_served(&reply, "near-ai-eu");
    for (step, provider_penalized) in [("401", true), ("402", true), ("429", false)] {
        replay(&stack, &scenario(&[("near-ai-us", &[step])]));
        let (_, tried) = chat(&stack, LUMEN, near_ai_first.clone()).await;
        assert_eq!(
            tried.first().map(String::as_str),
            Some("near-ai-us"),
            "{step}"
        );

        replay(&stack, &scenario(HEALTHY));
        let (reply, _) = chat(&stack, LUMEN, body(QWEN)).await;
        let expected = if provider_penalized {
            "deepinfra"
        } else {
            "near-ai-eu"
        };
        assert_served(&reply, expected);
        forget_failures(&clock);
    }
    stack.stop().await;
}

/// [A62] [A67] [A69] [A93] a 400 means the request is invalid for the
/// model: no other provider sees it, the client gets a sanitized 400 (never
/// the provider's body), and the route is not penalized
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a62_a67_a69_a93_a_400_stops_with_a_sanitized_400() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let secret = "400 code=invalid_parameter message=\"tinfoil internals: bad temperature\"";
    for request in [body(DEEPSEEK), streamed(body(DEEPSEEK))] {
        let (reply, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, secret, request).await;
        assert!(!moved_on);
        assert_eq!(penalty, Penalty::None);
        let message = reply.openai_error(400, "provider_error", "invalid_request_error");
        assert_eq!(message, "the provider could not serve this request");
        assert!(!reply.text.contains("internals"), "{}", reply.text);
        assert!(!reply.text.contains("invalid_parameter"), "{}", reply.text);
        // An error, even the provider's own, was served by no provider.
        assert_eq!(reply.header(PROVIDER), None);
    }
    stack.stop().await;
}

/// [A68] a 400 from a later attempt, after a fallback already happened, is
/// 503 provider_fallback_exhausted, and stops there
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a68_a_400_after_a_fallback_is_503_provider_fallback_exhausted() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(
        &scenario(&[("tinfoil", &["500"]), ("near-ai-us", &["400"])]),
        &clock,
    )
    .await;

    let (reply, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    let message = policy_error(&reply, 503, "provider_fallback_exhausted");
    assert_eq!(
        message,
        "every permitted attempt failed before output after a fallback, or a later attempt got a 400"
    );
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    assert_eq!(reply.header(ATTEMPTS), Some("2"));
    stack.stop().await;
}

/// [A63] another 4xx (403, 409, 413, 422, ...): the next provider, no
/// penalty
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a63_other_4xx_move_on_without_a_penalty() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for step in ["403", "405", "408", "409", "413", "422"] {
        let (_, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, step, body(DEEPSEEK)).await;
        assert!(moved_on, "{step}");
        assert_eq!(penalty, Penalty::None, "{step}");
    }
    stack.stop().await;
}

/// [A64] [A65] [A69] [A70] [A93] [A128] a content-policy refusal, or a
/// recognized context or output-limit error (decided: these error codes,
/// even inside a 5xx, on a stream or from a later attempt), stops without a
/// penalty and without a retry, the SDKs' own included
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a64_a65_a69_a70_a93_refusals_and_context_errors_stop_without_penalty() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (step, status) in [
        ("403 code=content_policy_violation", 403),
        ("400 code=content_filter", 400),
        ("422 code=content_filter", 422),
        ("400 code=context_length_exceeded", 400),
        ("500 code=context_length_exceeded", 500),
        ("503 code=context_length_exceeded", 503),
        ("413 code=max_tokens_exceeded", 413),
    ] {
        for request in [body(DEEPSEEK), streamed(body(DEEPSEEK))] {
            let (reply, moved_on, penalty) =
                first_attempt_answers(&stack, &clock, step, request).await;
            assert!(!moved_on, "{step}");
            assert_eq!(penalty, Penalty::None, "{step}");
            assert_eq!(reply.status, status);
            assert_eq!(reply.json["error"]["code"], "provider_error", "{step}");
        }
    }
    // Pinned, a retry would go to tinfoil again, for the same refusal: the
    // SDKs are told not to.
    replay(
        &stack,
        &scenario(&[("tinfoil", &["500 code=context_length_exceeded"])]),
    );
    let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("tinfoil"))).await;
    reply.openai_error(500, "provider_error", "api_error");
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    assert_eq!(tried, names(&["tinfoil"]));

    // After a fallback: 503 provider_fallback_exhausted, no third attempt.
    replay(
        &stack,
        &scenario(&[
            ("tinfoil", &["502"]),
            ("near-ai-us", &["500 code=content_filter"]),
        ]),
    );
    let (reply, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    policy_error(&reply, 503, "provider_fallback_exhausted");
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    stack.stop().await;
}

/// [A65] an output-limit error inside a stream, after output started (two
/// content chunks, then the provider's error event): the client gets an
/// error event and no end marker, nothing is retried, and the route is not
/// penalized; any other error event there is a broken stream, whose route
/// is penalized (decided, as for a cut)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a65_an_output_limit_error_inside_a_stream_stops_without_penalty() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (code, expected) in [
        ("max_tokens_exceeded", Penalty::None),
        ("server_error", Penalty::Route),
    ] {
        let step = format!("error_after=2 code={code}");
        let (reply, moved_on, penalty) =
            first_attempt_answers(&stack, &clock, &step, streamed(body(DEEPSEEK))).await;
        assert!(!moved_on, "{code}");
        assert_eq!(penalty, expected, "{code}");
        assert_eq!(reply.header(PROVIDER), Some("tinfoil"), "{code}");
        assert!(
            "hello from tinfoil".starts_with(&reply.answer_text()),
            "{code}: {}",
            reply.text
        );
        let (_, error) = reply.broken_stream();
        assert_eq!(error["error"]["code"], "provider_error", "{code}");
    }
    stack.stop().await;
}

/// [A126] [A128] when every permitted attempt failed after a fallback, 503
/// provider_fallback_exhausted; when only one provider was tried, that
/// provider's own sanitized error (its status; 502 provider_unreachable
/// without an answer)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a126_a128_exhausted_after_a_fallback_else_the_providers_own_error() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    for (key, expected) in [
        (RESEARCH, &["tinfoil", "near-ai-us", "venice"][..]),
        (LUMEN, &["tinfoil", "near-ai-us"][..]),
    ] {
        let (reply, tried) = chat(&stack, key, body(DEEPSEEK)).await;
        policy_error(&reply, 503, "provider_fallback_exhausted");
        assert_eq!(tried, names(expected));
        forget_failures(&clock);
    }
    // Failures without an answer, after a fallback.
    replay(
        &stack,
        &scenario(&[
            ("tinfoil", &["reset"]),
            ("near-ai-us", &["malformed"]),
            ("venice", &["404"]),
        ]),
    );
    let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    policy_error(&reply, 503, "provider_fallback_exhausted");
    forget_failures(&clock);

    // One provider tried: its own status, never its body.
    for (step, status, code, error_type) in [
        (
            "429 retry_after=7s message=\"venice quota\"",
            429,
            "provider_error",
            "rate_limit_error",
        ),
        (
            "503 message=\"venice quota\"",
            503,
            "provider_error",
            "api_error",
        ),
        // A 401 or 402 is about AnonRouter's account with the provider,
        // "never about your request or your key": not passed on as such.
        (
            "401 message=\"venice quota\"",
            502,
            "provider_error",
            "api_error",
        ),
        (
            "402 code=insufficient_quota message=\"venice quota\"",
            502,
            "provider_error",
            "api_error",
        ),
        (
            "404 message=\"venice quota\"",
            404,
            "provider_error",
            "not_found_error",
        ),
        ("reset", 502, "provider_unreachable", "api_error"),
        ("malformed", 502, "provider_unreachable", "api_error"),
    ] {
        replay(&stack, &all(step));
        let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("venice"))).await;
        reply.openai_error(status, code, error_type);
        assert!(!reply.text.contains("venice quota"), "{}", reply.text);
        assert_eq!(tried, names(&["venice"]));
        // Pinned, an SDK's own retry goes to venice again: left to the
        // SDK, unless the answer would only be the same (AnonRouter's
        // account at venice).
        let account = step.starts_with("401") || step.starts_with("402");
        assert_eq!(
            reply.header("x-should-retry"),
            account.then_some("false"),
            "{step}"
        );
        forget_failures(&clock);
    }
    // The only TEE route left after tinfoil: one provider tried.
    replay(&stack, &all("500"));
    let (reply, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"ignore": ["near-ai"]})),
    )
    .await;
    reply.openai_error(500, "provider_error", "api_error");
    assert_eq!(tried, names(&["tinfoil"]));
    // An SDK's own retry would be a new plan with tinfoil penalized and
    // last: a weaker tier first. It is told not to.
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    // A single attempt that timed out.
    replay(&stack, &all("no_answer"));
    let reply = advance_until(
        &clock,
        5_000,
        300_000,
        stack.chat(LUMEN, routed(DEEPSEEK, json!({"max_attempts": 1}))),
    )
    .await;
    reply.openai_error(502, "provider_unreachable", "api_error");
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    stack.stop().await;
}

// ---------------------------------------------------------------------
// The Default sort

/// The provider lumen's Default sort serves deepseek from (all healthy
/// now), with `provider` when it is not null.
async fn default_choice(stack: &Stack, provider: Value) -> String {
    replay(stack, &scenario(HEALTHY));
    let request = if provider.is_null() {
        body(DEEPSEEK)
    } else {
        routed(DEEPSEEK, provider)
    };
    let (reply, _) = chat(stack, LUMEN, request).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    stack.sim.requests()[0].provider.clone()
}

/// [A36] [A72] Default prefers the more private tier: a TEE route over a
/// Private one unless it costs more than 1.5 times as much (near-ai-us at
/// 2.70 against venice's 1.50; at exactly 1.5 times it keeps the
/// preference) or keeps failing (tinfoil recently failed)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a36_a72_default_prefers_tee_unless_pricier_or_failing() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    assert_eq!(default_choice(&stack, Value::Null).await, "tinfoil");
    // tinfoil keeps failing: it loses its TEE preference, and near-ai-us
    // (more than 1.5 times venice's price) has none: venice leads.
    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    assert_eq!(default_choice(&stack, Value::Null).await, "venice");
    // near-ai-us at exactly 1.5 times venice's typical price (2.25) is
    // still preferred; a cent more (2.26) and it is not.
    reprice(&stack, NEAR_AI_PRICE, "price: {input: 0.50, output: 1.50}");
    assert_eq!(default_choice(&stack, Value::Null).await, "near-ai-us");
    reprice(
        &stack,
        "price: {input: 0.50, output: 1.50}\n",
        "price: {input: 0.50, output: 1.52}\n",
    );
    assert_eq!(default_choice(&stack, Value::Null).await, "venice");
    stack.stop().await;
}

/// [A72] a TEE route more than twice as slow (time to first token,
/// measured) as the fastest Private one loses its preference
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a72_default_drops_a_tee_route_twice_as_slow_as_private() {
    let clock = Arc::new(ManualClock::default());
    let slow_tinfoil = fleet(&[("tinfoil", String::from("{latency: 400ms}"))]);
    let stack = shipped(&slow_tinfoil, &clock).await;

    warm(&stack, DEEPSEEK, "tinfoil", 20, false).await;
    warm(&stack, DEEPSEEK, "venice", 19, false).await;
    // venice's nineteen measurements do not count yet: it is average.
    replay(&stack, &slow_tinfoil);
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "tinfoil");
    warm(&stack, DEEPSEEK, "venice", 1, false).await;
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "venice");
    stack.stop().await;
}

/// [A71] [A73] an Anonymous route leads only when every more private route
/// keeps failing (two of three are not enough), is more than 3 times its
/// price, or when the model has no more private route; the boundary,
/// disabled providers and price ceilings still apply first
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a71_a73_anonymous_leads_only_when_every_private_route_is_outweighed() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    fail_pinned(&stack, DEEPSEEK, "near-ai", "500").await;
    assert_eq!(default_choice(&stack, Value::Null).await, "venice");
    fail_pinned(&stack, DEEPSEEK, "venice", "500").await;
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "deepinfra");
    assert_eq!(reply.header(PRIVACY), Some("anonymous"));
    // Boundaries, disabled providers and ceilings come first: without
    // deepinfra, every route left has failed, so none counts as failing and
    // they go in their normal order [A83], TEE first.
    for (key, provider) in [
        (LEGAL, Value::Null),
        (LUMEN, json!({"ignore": ["deepinfra"]})),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider)
        };
        let (reply, _) = chat(&stack, key, request).await;
        assert_served(&reply, "tinfoil");
    }
    forget_failures(&clock);
    assert_eq!(default_choice(&stack, Value::Null).await, "tinfoil");

    // Every more private route more than 3 times deepinfra's price.
    let deepinfra = "price: {input: 0.27, output: 0.80}";
    reprice(&stack, deepinfra, "price: {input: 0.10, output: 0.20}");
    assert_eq!(default_choice(&stack, Value::Null).await, "deepinfra");
    // 0.55: venice's 1.50 is not more than 3 times as much.
    reprice(
        &stack,
        "price: {input: 0.10, output: 0.20}",
        "price: {input: 0.15, output: 0.20}",
    );
    assert_eq!(default_choice(&stack, Value::Null).await, "tinfoil");

    // qwen without its TEE route: the Anonymous one, where the boundary
    // allows it.
    let only_anonymous = routed(QWEN, json!({"ignore": ["near-ai"]}));
    let (reply, _) = chat(&stack, LUMEN, only_anonymous.clone()).await;
    assert_served(&reply, "deepinfra");
    let (reply, tried) = chat(&stack, LEGAL, only_anonymous).await;
    assert_ne!(reply.status, 200);
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [A73] an Anonymous route leads when every more private route is more
/// than 3 times as slow
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a73_anonymous_leads_when_every_private_route_is_3_times_as_slow() {
    let clock = Arc::new(ManualClock::default());
    let slow = String::from("{latency: 400ms}");
    let latencies = fleet(&[
        ("venice", slow.clone()),
        ("tinfoil", slow.clone()),
        ("near-ai-us", slow),
    ]);
    let stack = shipped(&latencies, &clock).await;

    for pin in ["venice", "tinfoil", "near-ai", "deepinfra"] {
        warm(&stack, DEEPSEEK, pin, 20, false).await;
    }
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "deepinfra");
    // Once the measurements are older than a day, the preference is back.
    clock.advance(24 * 3_600_000 + 1_000);
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "tinfoil");
    stack.stop().await;
}

/// [A74] within a tier Default weighs the expected cost of a typical
/// request counting cached-input pricing: near-ai-us without a cache price
/// (typical 2.25) goes behind tinfoil (1.87), with a free cached input
/// (1.60) ahead
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a74_default_weighs_the_typical_cost_with_cached_input() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    reprice(&stack, NEAR_AI_PRICE, "price: {input: 0.65, output: 0.60}");
    for _ in 0..5 {
        assert_eq!(default_choice(&stack, Value::Null).await, "tinfoil");
    }
    reprice(
        &stack,
        "price: {input: 0.65, output: 0.60}",
        "price: {input: 0.65, output: 0.60, cache_read: 0.0}",
    );
    for _ in 0..5 {
        assert_eq!(default_choice(&stack, Value::Null).await, "near-ai-us");
    }
    stack.stop().await;
}

/// [A74] within a tier Default weighs measured speed: at the same price,
/// the TEE route with the faster first token leads
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a74_default_weighs_measured_speed_within_a_tier() {
    let clock = Arc::new(ManualClock::default());
    let latencies = fleet(&[
        ("tinfoil", String::from("{latency: 300ms}")),
        ("venice", String::from("{latency: 200ms}")),
    ]);
    let stack = shipped(&latencies, &clock).await;
    // near-ai-us at tinfoil's price: only speed tells them apart.
    reprice(
        &stack,
        NEAR_AI_PRICE,
        "price: {input: 0.50, output: 1.50, cache_read: 0.12}",
    );
    for pin in ["tinfoil", "venice", "near-ai"] {
        warm(&stack, DEEPSEEK, pin, 20, false).await;
    }
    for _ in 0..3 {
        let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
        assert_served(&reply, "near-ai-us");
    }
    stack.stop().await;
}

/// [A74] [A75] within a tier Default weighs the success rate over the last
/// 24 hours; a route with fewer than 20 recent requests is treated as
/// average, never guessed: tinfoil's failures count only from its 20th,
/// against the other TEE route, near-ai-us
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a74_a75_default_weighs_success_once_measured() {
    let clock = Arc::new(ManualClock::default());
    let seven_failures = ["500", "500", "500", "500", "500", "500", "500", "200"];
    let stack = shipped(&scenario(&[("tinfoil", &seven_failures)]), &clock).await;

    // tinfoil: 7 failures in 19 requests; near-ai-us: 20 successes.
    for _ in 0..19 {
        chat(&stack, LUMEN, routed(DEEPSEEK, json!("tinfoil"))).await;
    }
    warm(&stack, DEEPSEEK, "near-ai", 20, false).await;
    forget_failures(&clock);

    let the_two_tees = json!({"ignore": ["venice"]});
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, the_two_tees.clone())).await;
    // Average (near-ai-us's 100%), so tinfoil's lower price wins.
    assert_served(&reply, "tinfoil");
    recorded(&stack, DEEPSEEK, "tinfoil", 20);
    // That was tinfoil's 20th: 65% success outweighs its price now.
    for _ in 0..3 {
        let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, the_two_tees.clone())).await;
        assert_served(&reply, "near-ai-us");
    }
    // A day later none of it counts.
    clock.advance(24 * 3_600_000 + 1_000);
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, the_two_tees)).await;
    assert_served(&reply, "tinfoil");
    stack.stop().await;
}

/// [A76] [A80] routes that score within 10% of the best share traffic
/// (tinfoil 2.87 and near-ai-us 2.96), even for the same conversation sent
/// again (nothing sticks a conversation to a provider); never across
/// preference levels (venice scores 2.50 but is Private), never ahead of an
/// explicit order or under an explicit sort, never beyond 10% (3.25)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a76_a80_routes_within_10_percent_share_traffic() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;
    reprice(&stack, NEAR_AI_PRICE, "price: {input: 0.42, output: 1.40}");

    let conversation = body(DEEPSEEK);
    let served = first_choices(&stack, LUMEN, &conversation, 30).await;
    assert_eq!(
        distinct(&served),
        BTreeSet::from(["near-ai", "tinfoil"]),
        "{served:?}"
    );
    for provider in [json!({"order": ["tinfoil"]}), json!({"sort": "privacy"})] {
        let served = first_choices(&stack, LUMEN, &routed(DEEPSEEK, provider.clone()), 12).await;
        assert_eq!(distinct(&served), BTreeSet::from(["tinfoil"]), "{provider}");
    }
    let served = first_choices(
        &stack,
        LUMEN,
        &routed(DEEPSEEK, json!({"order": ["near-ai"]})),
        12,
    )
    .await;
    assert_eq!(distinct(&served), BTreeSet::from(["near-ai"]));

    // 2.25 + 1: more than 10% above tinfoil's 2.87.
    reprice(
        &stack,
        "price: {input: 0.42, output: 1.40}",
        "price: {input: 0.50, output: 1.50}",
    );
    let served = first_choices(&stack, LUMEN, &conversation, 30).await;
    assert_eq!(distinct(&served), BTreeSet::from(["tinfoil"]));
    stack.stop().await;
}

/// [A71] [A77] [A91] [A99] fallback follows the same order and never steps
/// below the first provider's tier (No downgrade, the default) unless the
/// workspace's fallback floor allows it, never below what the request and
/// the workspace's boundary allow (a floor below the boundary counts as the
/// boundary)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a71_a77_a91_a99_fallback_never_steps_below_the_floor() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    // No downgrade: tinfoil (TEE) falls back to near-ai-us only, venice
    // (Private) is skipped though second in the order.
    let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    forget_failures(&clock);
    // A Private first attempt may fall back to TEE, in the same order.
    let (_, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"order": ["venice"]})),
    )
    .await;
    assert_eq!(tried, names(&["venice", "tinfoil", "near-ai-us"]));
    forget_failures(&clock);
    // research's floor, private: down to venice, never deepinfra.
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    forget_failures(&clock);
    // The request's floor holds over the workspace's fallback floor.
    let (_, tried) = chat(
        &stack,
        RESEARCH,
        routed(DEEPSEEK, json!({"minimum_privacy": "tee"})),
    )
    .await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    forget_failures(&clock);

    // A fallback floor private under the Default sort: down to venice.
    default_workspace(&stack, "{fallback_floor: private}");
    let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "venice", "near-ai-us"]));
    forget_failures(&clock);
    // A floor below legal's boundary (Private) is the boundary: never
    // deepinfra.
    reconfigure(
        &stack,
        "tenants.yaml",
        &[(
            "provider_max_attempts: 2\n",
            "provider_max_attempts: 3\n          fallback_floor: anonymous\n",
        )],
        &[],
    );
    let (_, tried) = chat(&stack, LEGAL, routed(DEEPSEEK, json!({"sort": "price"}))).await;
    assert_eq!(tried, names(&["venice", "tinfoil", "near-ai-us"]));
    stack.stop().await;
}

/// [A78] the measurements aggregate by provider route and model: venice's
/// slow glm answers do not slow its deepseek route, which stays more than
/// twice as fast as tinfoil's
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a78_measurements_are_per_route_and_model() {
    let clock = Arc::new(ManualClock::default());
    let latencies = fleet(&[
        ("tinfoil", String::from("{latency: 400ms}")),
        (
            "venice",
            String::from("{models: {\"glm-4.6\": {latency: 800ms}}}"),
        ),
    ]);
    let stack = shipped(&latencies, &clock).await;

    warm(&stack, DEEPSEEK, "tinfoil", 20, false).await;
    warm(&stack, DEEPSEEK, "venice", 20, false).await;
    warm(&stack, GLM, "venice", 20, false).await;
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_served(&reply, "venice");
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Recently failed providers go last

/// Whether research's next deepseek request (tinfoil failing, near-ai-us
/// serving) tried tinfoil first, that is whether tinfoil was not penalized.
async fn tinfoil_tried_first(stack: &Stack) -> bool {
    let (reply, tried) = chat(stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "near-ai-us");
    match tried.as_slice() {
        [only] if only == "near-ai-us" => false,
        [first, second] if first == "tinfoil" && second == "near-ai-us" => true,
        _ => panic!("tried {tried:?}"),
    }
}

/// [A81] a failed route is tried last for 30 s after its first failure;
/// each further failure within 10 minutes doubles it (60, 120, 240 s, up to
/// 5 minutes); the count resets 10 minutes after the last failure
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a81_the_penalty_doubles_up_to_5_minutes_and_resets_after_10() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(&[("tinfoil", &["500"])]), &clock).await;

    assert!(tinfoil_tried_first(&stack).await);
    for seconds in [30, 60, 120, 240, 300, 300] {
        clock.advance(seconds * 1_000 - 1);
        assert!(
            !tinfoil_tried_first(&stack).await,
            "back before {seconds} s"
        );
        clock.advance(1);
        assert!(
            tinfoil_tried_first(&stack).await,
            "still last after {seconds} s"
        );
    }
    // Ten minutes after the last failure the count starts over: 30 s.
    clock.advance(600_000);
    assert!(tinfoil_tried_first(&stack).await);
    clock.advance(29_999);
    assert!(!tinfoil_tried_first(&stack).await);
    clock.advance(1);
    assert!(tinfoil_tried_first(&stack).await);
    // That was a second failure (60 s); a third a moment short of ten
    // minutes later still counts: 120 s.
    clock.advance(599_999);
    assert!(tinfoil_tried_first(&stack).await);
    clock.advance(119_999);
    assert!(!tinfoil_tried_first(&stack).await);
    clock.advance(1);
    assert!(tinfoil_tried_first(&stack).await);
    stack.stop().await;
}

/// [A51] [A82] a recently failed route moves behind the healthy routes
/// within the applicable ordering, under every sort
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a51_a82_a_failed_route_goes_behind_healthy_ones_under_every_sort() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for (key, provider, failed, expected) in [
        // Default: behind every healthy route (the Anonymous one, behind
        // venice's tier, is not a fallback here; the model list shows it).
        (
            LUMEN,
            Value::Null,
            "tinfoil",
            &["venice", "near-ai-us", "tinfoil"][..],
        ),
        (
            RESEARCH,
            Value::Null,
            "tinfoil",
            &["near-ai-us", "tinfoil", "venice"][..],
        ),
        (
            RESEARCH,
            json!({"sort": "price"}),
            "venice",
            &["tinfoil", "near-ai-us", "venice"][..],
        ),
        (
            RESEARCH,
            json!({"sort": "latency"}),
            "venice",
            &["tinfoil", "near-ai-us", "venice"][..],
        ),
        (
            RESEARCH,
            json!({"sort": "throughput"}),
            "venice",
            &["tinfoil", "near-ai-us", "venice"][..],
        ),
        (
            LUMEN,
            json!({"sort": "price"}),
            "tinfoil",
            &["venice", "near-ai-us", "tinfoil"][..],
        ),
    ] {
        fail_pinned(&stack, DEEPSEEK, failed, "500").await;
        replay(&stack, &all("500"));
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (_, tried) = chat(&stack, key, request).await;
        assert_eq!(tried, names(expected), "{key} {provider} {failed}");
        forget_failures(&clock);
    }
    stack.stop().await;
}

/// [A83] a failed route is never excluded: a model with a single route
/// keeps working, and when every route has failed they are tried in their
/// normal order
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a83_failed_routes_are_never_excluded() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    for _ in 0..3 {
        fail_pinned(&stack, GLM, "venice", "503").await;
        let (reply, tried) = chat(&stack, LUMEN, body(GLM)).await;
        assert_served(&reply, "venice");
        assert_eq!(tried, names(&["venice"]));
    }

    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    // All three penalized: the normal order again.
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    // Under the Default sort too, the Anonymous route failed as well: the
    // healthy fleet's order, not the Anonymous route first.
    fail_pinned(&stack, DEEPSEEK, "deepinfra", "500").await;
    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "tinfoil");
    stack.stop().await;
}

/// [A84] [A85] the penalty never crosses a privacy boundary: it reorders
/// only routes that passed the floor and every filter; under `privacy` a
/// failed route stays ahead of any weaker tier
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a84_a85_penalties_never_cross_a_privacy_boundary() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["near-ai-us", "tinfoil", "venice"]));
    forget_failures(&clock);

    // Both TEE routes failed: still ahead of Private, in their order.
    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    fail_pinned(&stack, DEEPSEEK, "near-ai", "500").await;
    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    // A TEE floor: the failed TEE routes are tried, never venice.
    let (_, tried) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"minimum_privacy": "tee"})),
    )
    .await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    // Every route legal may use has failed: deepinfra stays out.
    let (_, tried) = chat(&stack, LEGAL, routed(DEEPSEEK, json!({"sort": "price"}))).await;
    assert_eq!(tried, names(&["venice", "tinfoil"]));
    stack.stop().await;
}

/// [A86] an explicit order is honored as written, failed routes included;
/// the penalty reorders only the routes the sort places
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a86_an_explicit_order_is_honored_as_written() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    fail_pinned(&stack, DEEPSEEK, "deepinfra", "500").await;
    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    replay(&stack, &all("500"));
    let seed_example = json!({"order": ["deepinfra", "venice"]});
    let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, seed_example)).await;
    assert_eq!(tried, names(&["deepinfra", "venice", "near-ai-us"]));

    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"order": ["tinfoil"]})),
    )
    .await;
    assert_served(&reply, "tinfoil");
    stack.stop().await;
}

// ---------------------------------------------------------------------
// When there is no failover

/// A second E2EE route for deepseek, at near-ai-eu (pricier than phala), so
/// that a failover would have somewhere to go.
fn second_e2ee_route(stack: &Stack) {
    reconfigure(
        stack,
        "catalog.yaml",
        &[(
            "        attributes: {tier: e2ee}\n",
            "        attributes: {tier: e2ee}\n      - provider: near-ai-eu\n        upstream: deepseek-v3.2-e2ee\n        price: {input: 1.20, output: 3.00}\n        attributes: {tier: e2ee}\n",
        )],
        &[],
    );
}

/// [A89] [A127] an E2EE request never switches providers: when its
/// provider fails before output, 503
/// provider_fallback_not_supported_for_e2ee, even with a second E2EE route
/// and fallbacks allowed; a failure still penalizes as the table says. A
/// 400 or a context error is about the request, not a failure: the
/// provider's sanitized error, as without E2EE
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a89_a127_an_e2ee_provider_failing_is_503_without_fallback() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;
    second_e2ee_route(&stack);
    let e2ee = [(E2EE, "true")];
    let fallbacks = routed(
        DEEPSEEK,
        json!({"allow_fallbacks": true, "max_attempts": 3}),
    );

    let (reply, _) = chat_with(&stack, LUMEN, &e2ee, fallbacks.clone()).await;
    assert_served(&reply, "phala");
    for (step, penalized) in [
        ("500", true),
        ("429", true),
        ("404", true),
        ("401", true),
        ("302", true),
        ("reset", true),
        ("malformed", true),
        ("403", false),
    ] {
        replay(&stack, &scenario(&[("phala", &[step])]));
        let (reply, tried) = chat_with(&stack, LUMEN, &e2ee, fallbacks.clone()).await;
        let message = policy_error(&reply, 503, "provider_fallback_not_supported_for_e2ee");
        assert_eq!(
            message,
            "an E2EE provider failed before output; E2EE cannot switch providers"
        );
        assert_eq!(tried, names(&["phala"]), "{step}");
        assert_eq!(reply.header(ATTEMPTS), Some("1"));
        replay(&stack, &scenario(HEALTHY));
        let (reply, _) = chat_with(&stack, LUMEN, &e2ee, fallbacks.clone()).await;
        let expected = if penalized { "near-ai-eu" } else { "phala" };
        assert_served(&reply, expected);
        forget_failures(&clock);
    }
    for (step, status, kind) in [
        ("400", 400, "invalid_request_error"),
        ("500 code=context_length_exceeded", 500, "api_error"),
    ] {
        replay(&stack, &scenario(&[("phala", &[step])]));
        let (reply, tried) = chat_with(&stack, LUMEN, &e2ee, fallbacks.clone()).await;
        reply.openai_error(status, "provider_error", kind);
        assert_eq!(tried, names(&["phala"]), "{step}");
        replay(&stack, &scenario(HEALTHY));
        let (reply, _) = chat_with(&stack, LUMEN, &e2ee, fallbacks.clone()).await;
        assert_served(&reply, "phala");
        forget_failures(&clock);
    }
    // A timeout, and the Anthropic format.
    replay(&stack, &scenario(&[("phala", &["no_answer"])]));
    let reply = advance_until(
        &clock,
        5_000,
        300_000,
        stack.post("/v1/chat/completions", Some(LUMEN), &e2ee, &fallbacks),
    )
    .await;
    policy_error(&reply, 503, "provider_fallback_not_supported_for_e2ee");
    assert_eq!(stack.providers_tried(), names(&["phala"]));
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Workspace defaults

/// [A96] the privacy boundary is the weakest tier any request of the
/// workspace may use: Standard (lumen's default: Anonymous), Private
/// (legal), Maximum (vault: TEE); a request cannot go below it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a96_the_privacy_boundary_is_the_weakest_tier_allowed() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("deepinfra"))).await;
    assert_served(&reply, "deepinfra");
    let (reply, _) = chat(
        &stack,
        VAULT,
        routed(
            QWEN,
            json!({"sort": "price", "minimum_privacy": "anonymous"}),
        ),
    )
    .await;
    assert_served(&reply, "near-ai-eu");

    replay(&stack, &all("500"));
    let anything = json!({"sort": "price", "minimum_privacy": "anonymous"});
    let (_, tried) = chat(&stack, LEGAL, routed(DEEPSEEK, anything.clone())).await;
    assert_eq!(tried, names(&["venice", "tinfoil"]));
    forget_failures(&clock);
    let (_, tried) = chat(&stack, VAULT, routed(DEEPSEEK, anything)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    let (reply, tried) = chat(&stack, VAULT, body(GLM)).await;
    policy_error(&reply, 403, "privacy_boundary_not_met");
    assert!(tried.is_empty());
    stack.stop().await;
}

/// [A97] [A111] "Allow fallback to another provider" is on by default;
/// off means one attempt, and a request cannot turn it back on
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a97_a111_the_workspace_fallback_setting() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    forget_failures(&clock);

    default_workspace(&stack, "{provider_allow_fallbacks: false}");
    for provider in [
        Value::Null,
        json!({"allow_fallbacks": true, "max_attempts": 3}),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (reply, tried) = chat(&stack, LUMEN, request).await;
        reply.openai_error(500, "provider_error", "api_error");
        assert_eq!(tried, names(&["tinfoil"]), "{provider}");
        forget_failures(&clock);
    }
    // Other workspaces keep theirs.
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried.len(), 3);
    stack.stop().await;
}

/// [A98] [A111] "Retries on another provider", up to 1 (legal) or up to 2
/// (the default), is max_attempts minus the first; each retry goes to a
/// different provider of the same model under the same privacy rules, so
/// NEAR AI's two regions count as one provider; a request asking for more
/// gets the workspace's limit
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a98_a111_retries_go_to_different_providers_up_to_the_workspace_limit() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    for provider in [
        Value::Null,
        json!({"max_attempts": 3}),
        json!({"max_attempts": 3, "sort": "privacy"}),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (reply, tried) = chat(&stack, LEGAL, request).await;
        assert_eq!(tried.len(), 2, "{provider}");
        assert_eq!(reply.header(ATTEMPTS), Some("2"));
        forget_failures(&clock);
    }
    let (_, tried) = chat(&stack, LEGAL, routed(DEEPSEEK, json!({"max_attempts": 1}))).await;
    assert_eq!(tried.len(), 1);
    forget_failures(&clock);

    // near-ai-eu serves deepseek too: a region of the provider just tried.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[(
            "        attributes: {tier: e2ee}\n",
            "        attributes: {tier: e2ee}\n      - provider: near-ai-eu\n        upstream: deepseek-ai/DeepSeek-V3.2\n        price: {input: 0.60, output: 1.80}\n        attributes: {tier: tee}\n",
        )],
        &[],
    );
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us", "venice"]));
    forget_failures(&clock);
    let (_, tried) = chat(
        &stack,
        RESEARCH,
        routed(DEEPSEEK, json!({"order": ["near-ai"]})),
    )
    .await;
    assert_eq!(tried, names(&["near-ai-us", "tinfoil", "venice"]));
    forget_failures(&clock);
    // Alone, the EU region serves.
    replay(&stack, &scenario(&[("near-ai-us", &["500"])]));
    let (reply, tried) = chat(
        &stack,
        RESEARCH,
        routed(DEEPSEEK, json!({"only": ["near-ai"]})),
    )
    .await;
    reply.openai_error(500, "provider_error", "api_error");
    assert_eq!(tried, names(&["near-ai-us"]));
    stack.stop().await;
}

/// [A102] the Auto router's limits apply only to `/auto`: its tiers
/// (Private by default, never below the boundary) and its models (all, only
/// these, or all except these: research excludes qwen)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a102_the_auto_routers_limits_apply_to_auto_only() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    // Tiers: Auto does not use Anonymous routes; a named model does.
    let anonymous = json!({"only": ["deepinfra"]});
    let (reply, _) = chat(&stack, LUMEN, routed(AUTO, anonymous.clone())).await;
    policy_error(&reply, 400, "no_provider_route");
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, anonymous.clone())).await;
    assert_served(&reply, "deepinfra");

    // Models: research's Auto may not use qwen; a named qwen is served.
    let qwen_only = json!({"only": ["near-ai"], "max_price": {"input": 0.5, "output": 1.5}});
    let (reply, _) = chat(&stack, LUMEN, routed(AUTO, qwen_only.clone())).await;
    assert_served(&reply, "near-ai-eu");
    // (Without qwen, deepseek's near-ai-us is left, above the ceiling.)
    let (reply, tried) = chat(&stack, RESEARCH, routed(AUTO, qwen_only)).await;
    policy_error(&reply, 400, "no_provider_route_meets_price");
    assert!(tried.is_empty());
    let (reply, _) = chat(&stack, RESEARCH, body(QWEN)).await;
    assert_served(&reply, "near-ai-eu");
    // The boundary holds for /auto (vault: TEE only).
    let (reply, _) = chat(&stack, VAULT, routed(AUTO, json!({"only": ["venice"]}))).await;
    assert_eq!(reply.status, 400, "{}", reply.text);

    // The tier setting: Standard lets Auto use Anonymous, Maximum not Private.
    default_workspace(&stack, "{auto_minimum_privacy: anonymous}");
    let (reply, _) = chat(&stack, LUMEN, routed(AUTO, anonymous)).await;
    assert_served(&reply, "deepinfra");
    default_workspace(&stack, "{auto_minimum_privacy: tee}");
    let (reply, _) = chat(&stack, LUMEN, routed(AUTO, json!({"only": ["venice"]}))).await;
    policy_error(&reply, 400, "no_provider_route");
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, json!({"only": ["venice"]}))).await;
    assert_served(&reply, "venice");
    // "Only these" models.
    default_workspace(&stack, "{auto_only_models: [zai/glm-4.6]}");
    let (reply, _) = chat(&stack, LUMEN, body(AUTO)).await;
    assert_served(&reply, "venice");
    assert_eq!(stack.tried().last().unwrap().1.as_deref(), Some("glm-4.6"));
    stack.stop().await;
}

/// [A4] [A103] [A106] the workspace's default provider sort applies to
/// every request that sends no sort of its own: new workspaces use Default,
/// research kept Privacy, and a workspace may save Price, Latency or
/// Throughput; a key without a workspace belongs to the Default Workspace
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a4_a103_a106_the_workspace_default_provider_sort() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    // Default (lumen, no workspace on its key) and Privacy (research) tell
    // apart once tinfoil has failed.
    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["venice", "near-ai-us", "tinfoil"]));
    forget_failures(&clock);
    fail_pinned(&stack, DEEPSEEK, "tinfoil", "500").await;
    replay(&stack, &all("500"));
    let (_, tried) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["near-ai-us", "tinfoil", "venice"]));
    forget_failures(&clock);

    // A saved Price, Latency or Throughput sort (unmeasured: by price) is
    // no explicit request sort: no implied Private floor.
    for sort in ["price", "latency", "throughput"] {
        default_workspace(&stack, &format!("{{provider_sort: {sort}}}"));
        let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
        assert_eq!(tried, names(&["deepinfra", "venice", "tinfoil"]), "{sort}");
        forget_failures(&clock);
        // A request's own sort wins.
        let (_, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!({"sort": "privacy"}))).await;
        assert_eq!(tried, names(&["tinfoil", "near-ai-us"]), "{sort}");
        forget_failures(&clock);
    }
    default_workspace(&stack, "{provider_sort: privacy}");
    let (_, tried) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(tried, names(&["tinfoil", "near-ai-us"]));
    stack.stop().await;
}

/// [A92] [A104] [A109] a provider the workspace disabled is never used, as
/// first choice or fallback, and a request cannot turn it back on; a
/// request's `ignore` adds to the disabled ones
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a92_a104_a109_disabled_providers_are_never_used() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;
    default_workspace(&stack, "{provider_ignore: [tinfoil]}");

    for provider in [
        Value::Null,
        json!({"order": ["tinfoil"]}),
        json!({"only": ["tinfoil", "venice", "near-ai"]}),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (_, tried) = chat(&stack, LUMEN, request).await;
        assert_eq!(tried, names(&["venice", "near-ai-us"]), "{provider}");
        forget_failures(&clock);
    }
    let (reply, tried) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("tinfoil"))).await;
    policy_error(&reply, 400, "no_provider_route");
    assert!(tried.is_empty());
    // The request's ignore adds to the workspace's.
    let (_, tried) = chat(
        &stack,
        LUMEN,
        routed(
            DEEPSEEK,
            json!({"ignore": ["near-ai"], "order": ["deepinfra"]}),
        ),
    )
    .await;
    assert_eq!(tried, names(&["deepinfra", "venice"]));
    // legal disabled deepinfra: a pin is refused.
    let (reply, _) = chat(&stack, LEGAL, routed(QWEN, json!("deepinfra"))).await;
    policy_error(&reply, 400, "no_provider_route");
    stack.stop().await;
}

/// [A3] [A107] [A108] [A110] [A111] workspace settings apply to requests
/// without `provider`, and merge restrictively with a request's: `only`
/// intersects the workspace's allowed providers; a request cannot lower
/// the privacy floor, raise the price ceiling or allow more attempts, but
/// can tighten each
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a3_a107_a108_a110_a111_request_settings_only_tighten_the_workspaces() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&all("500"), &clock).await;

    // Allowed providers: venice and near-ai.
    default_workspace(&stack, "{provider_only: [venice, near-ai]}");
    for (provider, expected) in [
        (Value::Null, &["venice", "near-ai-us"][..]),
        (json!({"only": ["venice", "tinfoil"]}), &["venice"][..]),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (_, tried) = chat(&stack, LUMEN, request).await;
        assert_eq!(tried, names(expected), "{provider}");
        forget_failures(&clock);
    }
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(DEEPSEEK, json!({"only": ["tinfoil"]})),
    )
    .await;
    policy_error(&reply, 400, "no_provider_route");

    // A privacy floor of TEE: a request's lower floor does not lower it.
    default_workspace(&stack, "{provider_minimum_privacy: tee}");
    for provider in [
        Value::Null,
        json!({"minimum_privacy": "anonymous", "sort": "price"}),
    ] {
        let request = if provider.is_null() {
            body(DEEPSEEK)
        } else {
            routed(DEEPSEEK, provider.clone())
        };
        let (_, tried) = chat(&stack, LUMEN, request).await;
        assert_eq!(tried, names(&["tinfoil", "near-ai-us"]), "{provider}");
        forget_failures(&clock);
    }
    let (reply, _) = chat(
        &stack,
        LUMEN,
        routed(GLM, json!({"minimum_privacy": "private"})),
    )
    .await;
    policy_error(&reply, 403, "no_provider_route_meets_privacy");

    // orbit's ceilings (0.45 / 1.50): a higher request ceiling is no
    // higher, a lower one applies.
    for (provider, expected) in [
        (
            json!({"order": ["deepinfra"]}),
            &["deepinfra", "venice"][..],
        ),
        (
            json!({"order": ["deepinfra"], "max_price": {"input": 1.0, "output": 3.0}}),
            &["deepinfra", "venice"][..],
        ),
        (
            json!({"order": ["deepinfra"], "max_price": {"input": 0.3, "output": 1.0}}),
            &["deepinfra"][..],
        ),
    ] {
        let (_, tried) = chat(&stack, ORBIT, routed(DEEPSEEK, provider.clone())).await;
        assert_eq!(tried, names(expected), "{provider}");
        forget_failures(&clock);
    }

    // Attempts: legal allows 2; a request may lower it or turn fallback off.
    for (provider, attempts) in [
        (json!({"max_attempts": 3}), 2),
        (json!({"max_attempts": 1}), 1),
        (json!({"allow_fallbacks": false}), 1),
        (json!({"allow_fallbacks": true}), 2),
    ] {
        let (_, tried) = chat(&stack, LEGAL, routed(DEEPSEEK, provider.clone())).await;
        assert_eq!(tried.len(), attempts, "{provider}");
        forget_failures(&clock);
    }
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Response headers

/// [A113] [A114] [A115] [A116] [A117] every completion reports the provider
/// that served it (public ids: NEAR AI as `near-ai`), the routing (`exact`,
/// or `auto` when /auto chose the model), the providers tried, whether a
/// fallback served it, and the serving route's privacy tier — streams and
/// Anthropic answers too; an error, which no provider served, names no
/// provider and no tier
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a113_to_a117_responses_report_the_route_that_served() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(
        &scenario(&[("tinfoil", &["500"]), ("near-ai-us", &["503", "200"])]),
        &clock,
    )
    .await;

    let headers = |reply: &Reply| -> [Option<String>; 5] {
        [PROVIDER, ROUTING, ATTEMPTS, FALLBACK, PRIVACY]
            .map(|name| reply.header(name).map(str::to_string))
    };
    let expect = |values: [&str; 5]| values.map(|value| Some(value.to_string()));

    // research: tinfoil fails, near-ai-us fails, venice serves.
    let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_served(&reply, "venice");
    assert_eq!(
        headers(&reply),
        expect(["venice", "exact", "3", "true", "private"])
    );
    forget_failures(&clock);
    // tinfoil fails, near-ai-us serves.
    let (reply, _) = chat(&stack, RESEARCH, streamed(body(DEEPSEEK))).await;
    assert_served(&reply, "near-ai-us");
    assert_eq!(
        headers(&reply),
        expect(["near-ai", "exact", "2", "true", "tee"])
    );
    forget_failures(&clock);

    replay(&stack, &scenario(HEALTHY));
    let (reply, _) = chat(&stack, LUMEN, body(DEEPSEEK)).await;
    assert_eq!(
        headers(&reply),
        expect(["tinfoil", "exact", "1", "false", "tee"])
    );
    let (reply, _) = chat(&stack, LUMEN, routed(QWEN, json!({"sort": "price"}))).await;
    assert_served(&reply, "deepinfra");
    assert_eq!(
        headers(&reply),
        expect(["deepinfra", "exact", "1", "false", "anonymous"])
    );
    let (reply, _) = chat(&stack, LUMEN, body(QWEN)).await;
    assert_eq!(
        headers(&reply),
        expect(["near-ai", "exact", "1", "false", "tee"])
    );
    let (reply, _) = chat_with(&stack, LUMEN, &[(E2EE, "true")], body(DEEPSEEK)).await;
    assert_eq!(
        headers(&reply),
        expect(["phala", "exact", "1", "false", "e2ee"])
    );
    let (reply, _) = chat(&stack, LUMEN, routed(AUTO, json!({"only": ["venice"]}))).await;
    assert_eq!(
        headers(&reply),
        expect(["venice", "auto", "1", "false", "private"])
    );
    let (reply, _) = chat(&stack, LUMEN, streamed(body(AUTO))).await;
    assert_served(&reply, "tinfoil");
    assert_eq!(
        headers(&reply),
        expect(["tinfoil", "auto", "1", "false", "tee"])
    );

    // Errors: no provider served, so none is named, nor a tier, whether
    // attempts were made (after a fallback, or one) or not; the providers
    // tried are counted.
    replay(&stack, &all("500"));
    let (reply, _) = chat(&stack, RESEARCH, body(DEEPSEEK)).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header(PROVIDER), None);
    assert_eq!(reply.header(PRIVACY), None);
    assert_eq!(reply.header(ATTEMPTS), Some("3"));
    assert_eq!(reply.header(FALLBACK), Some("false"));
    forget_failures(&clock);
    let (reply, _) = chat(&stack, LUMEN, routed(DEEPSEEK, json!("venice"))).await;
    assert_eq!(reply.status, 500);
    assert_eq!(reply.header(PROVIDER), None);
    assert_eq!(reply.header(PRIVACY), None);
    assert_eq!(reply.header(ATTEMPTS), Some("1"));
    forget_failures(&clock);
    // A stream that breaks after output was served: its headers went out
    // with its first event and name the provider.
    replay(&stack, &scenario(&[("tinfoil", &["cut_after=2"])]));
    let reply = stack.chat(LUMEN, streamed(body(DEEPSEEK))).await;
    reply.broken_stream();
    assert_eq!(
        headers(&reply),
        expect(["tinfoil", "exact", "1", "false", "tee"])
    );
    forget_failures(&clock);
    let (reply, _) = chat(&stack, LUMEN, routed(GLM, json!({"only": ["tinfoil"]}))).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header(PROVIDER), None);
    assert_eq!(reply.header(PRIVACY), None);
    assert_eq!(reply.header(ROUTING), Some("exact"));
    assert_eq!(reply.header(FALLBACK), Some("false"));
    stack.stop().await;
}

// ---------------------------------------------------------------------
// Errors

/// [A121] [A122] [A123] [A124] [A130] the error table: each error with its
/// status and its name as `type` (and code), refused before any provider
/// sees the request; through /v1/messages, which no route serves, 400
/// no_provider_route in Anthropic's format
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a121_to_a124_a130_routing_errors_carry_their_status_and_type() {
    let clock = Arc::new(ManualClock::default());
    let stack = shipped(&scenario(HEALTHY), &clock).await;

    let mut tools = routed(GLM, json!({"require_parameters": true}));
    tools["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    for (key, headers, request, status, name, message) in [
        (
            LUMEN,
            &[][..],
            body("deepseek/deepseek-v9"),
            400,
            "no_provider_route",
            "no eligible provider route is available for the model under your policy",
        ),
        (
            LUMEN,
            &[][..],
            routed(GLM, json!({"only": ["tinfoil"]})),
            400,
            "no_provider_route",
            "no eligible provider route is available for the model under your policy",
        ),
        (
            LUMEN,
            &[(E2EE, "true")][..],
            body(GLM),
            400,
            "no_provider_route",
            "no eligible provider route is available for the model under your policy",
        ),
        (
            LUMEN,
            &[][..],
            tools,
            400,
            "no_provider_route",
            "no eligible provider route is available for the model under your policy",
        ),
        (
            LUMEN,
            &[][..],
            routed(GLM, json!({"minimum_privacy": "tee"})),
            403,
            "no_provider_route_meets_privacy",
            "no route meets the privacy floor",
        ),
        (
            ORBIT,
            &[][..],
            routed(QWEN, json!({"only": ["deepinfra"], "sort": "price"})),
            403,
            "no_provider_route_meets_privacy",
            "no route meets the privacy floor",
        ),
        (
            VAULT,
            &[][..],
            body(GLM),
            403,
            "privacy_boundary_not_met",
            "no route of the model meets the workspace's privacy boundary",
        ),
        (
            LUMEN,
            &[][..],
            routed(
                DEEPSEEK,
                json!({"max_price": {"input": 0.1, "output": 0.1}}),
            ),
            400,
            "no_provider_route_meets_price",
            "no route is within max_price",
        ),
        (
            ORBIT,
            &[][..],
            routed(DEEPSEEK, json!("tinfoil")),
            400,
            "no_provider_route_meets_price",
            "no route is within max_price",
        ),
    ] {
        let (reply, tried) = chat_with(&stack, key, headers, request.clone()).await;
        assert_eq!(policy_error(&reply, status, name), message, "{request}");
        assert!(tried.is_empty());

        // Anthropic's /v1/messages, which no route serves, is refused for
        // that first, in Anthropic's format, before any provider sees it.
        let mut anthropic = request.clone();
        anthropic["max_tokens"] = json!(32);
        let mut with_version = vec![("anthropic-version", "2023-06-01")];
        with_version.extend_from_slice(headers);
        let reply = stack
            .post("/v1/messages", Some(key), &with_version, &anthropic)
            .await;
        assert_eq!(
            reply.anthropic_error(400, "no_provider_route"),
            "no eligible provider route is available for the model under your policy",
            "{request}"
        );
        assert_eq!(reply.json["error"]["code"], "no_provider_route");
    }
    // The providers serve chat completions alone: other endpoints are
    // refused the same way, before any provider sees the input.
    for (path, request) in [
        (
            "/v1/embeddings",
            json!({"model": GLM, "input": "secret text", "provider": "venice"}),
        ),
        ("/v1/responses", json!({"model": DEEPSEEK, "input": "Hi"})),
        (
            "/v1/completions",
            json!({"model": DEEPSEEK, "prompt": "Hi"}),
        ),
    ] {
        let reply = stack.post(path, Some(LUMEN), &[], &request).await;
        assert_eq!(
            policy_error(&reply, 400, "no_provider_route"),
            "no eligible provider route is available for the model under your policy",
            "{path}"
        );
    }
    assert!(stack.sim.requests().is_empty());
    stack.stop().await;
}
