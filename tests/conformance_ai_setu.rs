//! AI Setu (shared/seeds/ai-setu-routing.txt) through the real proxy: the
//! shipped `policies/ai-setu.policy` and its data, served on loopback in
//! front of simulated providers, with the proxy's time on a manual clock.
//! Each test names the CONFORMANCE.md rows it proves.
//!
//! The shipped data: globex owns BYOK bindings for anthropic (precedence 10)
//! and vertex (precedence 20), initech one for azure; the platform has keys
//! for anthropic (weight 2), bedrock and openai. Both kill-switches are on.
//! globex balances `weighted`; its workspace `batch` `least_busy`, and
//! `round_robin` for claude-sonnet-4-5; initech configures no balancing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{
    Reply, Stack, advance_until, assert_nothing_sent, chat_body, closed_port, finished,
    messages_body, names, reconfigure, replay, settle, spawn_open, streamed, tried_by, until_asked,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;
use switchyard::state::ManualClock;

/// Test keys, from the comments in policies/ai-setu/tenants.yaml.
const INITECH: &str = "sk-setu-initech";
const GLOBEX: &str = "sk-setu-globex";
const GLOBEX_BATCH: &str = "sk-setu-globex-batch";

const CLAUDE: &str = "claude-sonnet-4-5";
const GPT: &str = "gpt-4.1";

const ORDER_HEADER: &str = "x-ai-setu-provider-order";
const PROVIDER_HEADER: &str = "x-ai-setu-provider";
const BYOK_HEADER: &str = "x-ai-setu-byok";
const CONNECTION_HEADER: &str = "x-ai-setu-connection";

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

/// The providers of the catalog, by their sim paths.
const PROVIDERS: [&str; 5] = ["anthropic", "bedrock", "vertex", "openai", "azure"];

/// claude-sonnet-4-5's candidates for globex, by workspace precedence.
const GLOBEX_CLAUDE: [&str; 3] = ["vertex", "anthropic", "bedrock"];

/// How long an attempt waits for headers or a first event: the policy sets
/// no `timeouts`, so the language's default.
const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// Every provider answers 200.
const HEALTHY: &str =
    "providers: {anthropic: {}, bedrock: {}, vertex: {}, openai: {}, azure: {}}\n";

// ---------------------------------------------------------------------------
// Scenarios, bodies and requests

/// A scenario in which the named providers answer with these steps (the
/// last repeating) and the others answer 200.
fn scenario(steps: &[(&str, &[&str])]) -> String {
    common::scenario(&PROVIDERS, steps)
}

/// Every provider answers `step`.
fn all_answer(step: &str) -> String {
    common::all_answer(&PROVIDERS, step)
}

/// A chat completion with `X-AI-Setu-Provider-Order`.
async fn chat_ordered(stack: &Stack, key: &str, model: &str, order: &str) -> Reply {
    stack
        .post(CHAT, Some(key), &[(ORDER_HEADER, order)], &chat_body(model))
        .await
}

/// A streamed chat completion.
async fn chat_stream(stack: &Stack, key: &str, model: &str) -> Reply {
    stack
        .post(CHAT, Some(key), &[], &streamed(chat_body(model)))
        .await
}

/// A streamed Anthropic message.
async fn messages_stream(stack: &Stack, key: &str, model: &str) -> Reply {
    stack
        .post(
            MESSAGES,
            Some(key),
            &[("anthropic-version", "2023-06-01")],
            &streamed(messages_body(model)),
        )
        .await
}

// ---------------------------------------------------------------------------
// What the client got

/// A successful answer from `provider`, which X-AI-Setu-Provider names; a
/// stream must also have ended properly, with no error anywhere in it.
fn assert_served(reply: &Reply, provider: &str) {
    reply.assert_served(provider);
    assert_eq!(
        reply.header(PROVIDER_HEADER),
        Some(provider),
        "the provider header"
    );
    if reply.is_stream() {
        assert!(
            !reply.text.contains("\"error\""),
            "a clean stream: {}",
            reply.text
        );
    }
}

/// A stream that started from `provider` and then ended with an error event
/// in its wire format, never with a completion sentinel.
fn assert_broken_stream(reply: &Reply, provider: &str) {
    let (name, error) = reply.broken_stream();
    assert_eq!(reply.header(PROVIDER_HEADER), Some(provider));
    let full = format!("hello from {provider}");
    let text = reply.answer_text();
    assert!(
        text.len() < full.len() && full.starts_with(&text),
        "part of {provider}'s answer reached the client: {}",
        reply.text
    );
    if name.as_deref() == Some("error") {
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "api_error");
    } else {
        assert_eq!(error["error"]["code"], "provider_unreachable");
    }
}

/// Which provider served each of `count` successful chat completions.
async fn first_choices(stack: &Stack, key: &str, model: &str, count: usize) -> Vec<String> {
    common::first_choices(stack, key, &chat_body(model), PROVIDER_HEADER, count).await
}

fn counts(names: &[String]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for name in names {
        *counts.entry(name.as_str()).or_insert(0) += 1;
    }
    counts
}

/// Whether each name follows the one before it in `cycle`, as a
/// round-robin rotation makes the first choice move.
fn is_rotation(firsts: &[String], cycle: &[&str]) -> bool {
    let position = |name: &String| cycle.iter().position(|c| c == name);
    firsts.windows(2).all(|pair| {
        matches!((position(&pair[0]), position(&pair[1])),
            (Some(a), Some(b)) if b == (a + 1) % cycle.len())
    })
}

// ---------------------------------------------------------------------------
// Resolution precedence

/// [S1] [S12] [S14] a bare model id: the provider first in the catalog serves
/// it; the others become failover candidates in catalog order
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_model_id_is_served_by_the_first_survivor_and_the_rest_fail_over() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    // initech has no binding and no balancing: the catalog's order decides.
    let (reply, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(CLAUDE))).await;
    assert_served(&reply, "anthropic");
    assert_eq!(tried, names(&["anthropic"]));
    assert_eq!(stack.tried()[0].1.as_deref(), Some(CLAUDE));
    let (reply, _) = tried_by(&stack, stack.messages(INITECH, messages_body(CLAUDE))).await;
    assert_served(&reply, "anthropic");
    // The proxy does not translate: each request went on in its caller's
    // format, through an endpoint Anthropic's base URL serves, so the
    // credential went as each format sends one.
    let requests = stack.sim.requests();
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer secret-of-AISETU_ANTHROPIC_KEY")
    );
    assert_eq!(requests[0].header("x-api-key"), None);
    assert_eq!(
        requests[1].header("x-api-key"),
        Some("secret-of-AISETU_ANTHROPIC_KEY")
    );
    assert_eq!(requests[1].header("authorization"), None);
    // No provider of gpt-4.1 serves /v1/messages.
    let (reply, tried) = tried_by(&stack, stack.messages(INITECH, messages_body(GPT))).await;
    let message = reply.anthropic_error(400, "invalid_request_error");
    assert!(message.contains("serves the endpoint"), "{message}");
    assert_eq!(reply.json["error"]["code"], "unsupported_endpoint");
    assert!(tried.is_empty(), "{tried:?}");

    // The rest are the failover candidates, each with its own upstream name.
    replay(&stack, &scenario(&[("anthropic", &["503"])]));
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_served(&reply, "bedrock");
    assert_eq!(
        stack.tried(),
        vec![
            (String::from("anthropic"), Some(String::from(CLAUDE))),
            (
                String::from("bedrock"),
                Some(String::from("anthropic.claude-sonnet-4-5-v1"))
            ),
        ]
    );
    stack.stop().await;
}

/// [S2] [S7] X-AI-Setu-Provider-Order reorders the candidates of the one
/// request that sends it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_header_reorders_the_candidates_of_that_request_only() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    let (reply, tried) = tried_by(
        &stack,
        chat_ordered(&stack, INITECH, CLAUDE, "bedrock,anthropic"),
    )
    .await;
    assert_served(&reply, "bedrock");
    assert_eq!(tried, names(&["bedrock"]));
    // A routing instruction for the gateway, not for the provider.
    assert_eq!(stack.sim.requests()[0].header(ORDER_HEADER), None);
    // The next call without it is back to the default order.
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_served(&reply, "anthropic");

    // The failover candidates follow the header's order too.
    replay(&stack, &all_answer("503"));
    let (_, tried) = tried_by(
        &stack,
        chat_ordered(&stack, INITECH, CLAUDE, "bedrock,anthropic"),
    )
    .await;
    assert_eq!(tried, names(&["bedrock", "anthropic"]));
    // It beats BYOK-first: the platform's openai before initech's own azure.
    let (_, tried) = tried_by(&stack, chat_ordered(&stack, INITECH, GPT, "openai,azure")).await;
    assert_eq!(tried, names(&["openai", "azure"]));
    // It beats workspace precedence: anthropic (10) before vertex (20).
    let (_, tried) = tried_by(
        &stack,
        chat_ordered(&stack, GLOBEX_BATCH, CLAUDE, "anthropic,bedrock,vertex"),
    )
    .await;
    assert_eq!(tried, names(&["anthropic", "bedrock", "vertex"]));
    stack.stop().await;
}

/// [S3] [S10] [S11] [S12] each step orders only what the steps before it
/// left tied: the header, workspace precedence (higher first), BYOK before
/// the platform key, then the catalog's order
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_steps_apply_in_order_each_only_where_the_previous_did_not_decide() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;
    // Without balancing (its kill-switch's default) the order is the
    // precedence alone.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[("  load_balance: true\n", "")],
        &[],
    );

    // Workspace precedence: vertex (20) before anthropic (10) before bedrock
    // (a platform key, none), against the catalog's anthropic, bedrock, vertex.
    for key in [GLOBEX, GLOBEX_BATCH] {
        let (_, tried) = tried_by(&stack, stack.chat(key, chat_body(CLAUDE))).await;
        assert_eq!(tried, names(&GLOBEX_CLAUDE), "{key}");
    }
    // The header decides before precedence does.
    let (_, tried) = tried_by(
        &stack,
        chat_ordered(&stack, GLOBEX, CLAUDE, "bedrock,vertex,anthropic"),
    )
    .await;
    assert_eq!(tried, names(&["bedrock", "vertex", "anthropic"]));
    // No precedence on either: BYOK-first puts initech's azure binding
    // before the platform's openai, which the catalog lists first.
    stack.sim.clear();
    let (_, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(GPT))).await;
    assert_eq!(tried, names(&["azure", "openai"]));
    assert_eq!(
        stack.sim.requests()[0].header("authorization"),
        Some("Bearer secret-of-INITECH_AZURE_KEY")
    );
    // Nothing else decides: the catalog's order.
    let (_, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(CLAUDE))).await;
    assert_eq!(tried, names(&["anthropic", "bedrock"]));

    // BYOK-first within a provider: globex reaches anthropic with its own key.
    replay(&stack, HEALTHY);
    let reply = stack
        .chat(GLOBEX, chat_body("anthropic/claude-sonnet-4-5"))
        .await;
    assert_served(&reply, "anthropic");
    assert_eq!(
        stack.sim.requests()[0].header("authorization"),
        Some("Bearer secret-of-GLOBEX_ANTHROPIC_KEY")
    );

    // Without globex's anthropic binding, the platform keys (no precedence,
    // not BYOK) follow vertex in catalog order.
    reconfigure(&stack, "catalog.yaml", &[], &["GLOBEX_ANTHROPIC_KEY"]);
    replay(&stack, &all_answer("503"));
    let (_, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(CLAUDE))).await;
    assert_eq!(tried, names(&GLOBEX_CLAUDE));
    assert_eq!(
        stack.sim.requests()[1].header("authorization"),
        Some("Bearer secret-of-AISETU_ANTHROPIC_KEY")
    );
    stack.stop().await;
}

/// [S3] [S4] `<provider>/<model>` hard-overrides everything below it: the
/// header, workspace precedence, balancing and failover to other providers
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_prefix_hard_overrides_everything_below() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    // globex-batch would put vertex (precedence 20) first; the header names
    // other providers; the prefix alone decides.
    let (reply, tried) = tried_by(
        &stack,
        chat_ordered(
            &stack,
            GLOBEX_BATCH,
            "bedrock/claude-sonnet-4-5",
            "vertex,anthropic",
        ),
    )
    .await;
    assert_served(&reply, "bedrock");
    assert_eq!(tried, names(&["bedrock"]));
    assert_eq!(
        stack.tried()[0].1.as_deref(),
        Some("anthropic.claude-sonnet-4-5-v1")
    );
    // A header the prefix overrides is not read: a name in it that is no
    // provider is not refused.
    let (reply, tried) = tried_by(
        &stack,
        chat_ordered(
            &stack,
            INITECH,
            "bedrock/claude-sonnet-4-5",
            "bedrock,nosuch",
        ),
    )
    .await;
    assert_served(&reply, "bedrock");
    assert_eq!(tried, names(&["bedrock"]));
    // Balancing (globex is weighted) never brings another provider in.
    for _ in 0..10 {
        let reply = stack
            .chat(GLOBEX, chat_body("vertex/claude-sonnet-4-5"))
            .await;
        assert_served(&reply, "vertex");
    }

    // When the pinned provider fails, no other provider is tried: its own
    // answer is the client's.
    replay(&stack, &all_answer("503"));
    let (reply, tried) = tried_by(
        &stack,
        stack.chat(INITECH, chat_body("bedrock/claude-sonnet-4-5")),
    )
    .await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    assert_eq!(tried, names(&["bedrock"]));

    // A provider that does not serve the model resolves to nothing.
    stack.sim.clear();
    let reply = stack
        .chat(INITECH, chat_body("openai/claude-sonnet-4-5"))
        .await;
    reply.openai_error(404, "model_not_found", "not_found_error");
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [S5] `@<slug>/<model>` serves from that BYOK binding only, whatever the
/// header says; another tenant's slug is answered as an unknown one, so
/// the answer does not tell a caller that another tenant's binding exists
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slug_prefix_pins_the_byok_binding() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    let reply = chat_ordered(
        &stack,
        GLOBEX,
        "@globex-anthropic/claude-sonnet-4-5",
        "bedrock",
    )
    .await;
    assert_served(&reply, "anthropic");
    let sent = &stack.sim.requests()[0];
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer secret-of-GLOBEX_ANTHROPIC_KEY")
    );
    assert_eq!(sent.model.as_deref(), Some(CLAUDE));

    stack.sim.clear();
    let reply = stack
        .messages(
            GLOBEX_BATCH,
            messages_body("@globex-vertex/claude-sonnet-4-5"),
        )
        .await;
    assert_served(&reply, "vertex");
    let sent = &stack.sim.requests()[0];
    assert_eq!(
        sent.header("x-api-key"),
        Some("secret-of-GLOBEX_VERTEX_KEY")
    );
    assert_eq!(sent.model.as_deref(), Some("claude-sonnet-4-5@20250929"));

    // The binding failing is the end: nothing else is tried.
    replay(&stack, &all_answer("503"));
    let (reply, tried) = tried_by(
        &stack,
        stack.chat(GLOBEX, chat_body("@globex-anthropic/claude-sonnet-4-5")),
    )
    .await;
    assert_eq!(reply.status, 503);
    assert_eq!(tried, names(&["anthropic"]));

    // initech cannot use globex's binding, and is not told it exists: it
    // gets what a slug no tenant has gets.
    stack.sim.clear();
    let theirs = stack
        .chat(INITECH, chat_body("@globex-anthropic/claude-sonnet-4-5"))
        .await;
    theirs.openai_error(404, "model_not_found", "not_found_error");
    let nobodys = stack
        .chat(INITECH, chat_body("@nosuch-binding/claude-sonnet-4-5"))
        .await;
    let error = |reply: &Reply| reply.json["error"].clone();
    assert_eq!(error(&theirs), error(&nobodys));
    let reply = stack
        .messages(
            INITECH,
            messages_body("@globex-anthropic/claude-sonnet-4-5"),
        )
        .await;
    reply.anthropic_error(404, "not_found_error");
    // A slug names a BYOK binding: an unknown one, or the id of a platform
    // key, names no model.
    for model in [
        "@nosuch/claude-sonnet-4-5",
        "@anthropic-platform/claude-sonnet-4-5",
    ] {
        let reply = stack.chat(GLOBEX, chat_body(model)).await;
        reply.openai_error(404, "model_not_found", "not_found_error");
    }
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [S6] the header is a comma-separated, case-insensitive provider list
/// (on one line or several); a name that is no provider is 400
/// invalid_provider_order
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_header_is_a_case_insensitive_list_and_unknown_names_are_refused() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;

    for order in [
        "BEDROCK,Anthropic",
        "bedrock, anthropic",
        "Bedrock ,ANTHROPIC",
    ] {
        let (_, tried) = tried_by(&stack, chat_ordered(&stack, INITECH, CLAUDE, order)).await;
        assert_eq!(tried, names(&["bedrock", "anthropic"]), "{order}");
    }
    // Given on two lines, the header is one list (RFC 9110, section 5.3).
    let body = chat_body(CLAUDE);
    let two_lines = stack.post(
        CHAT,
        Some(INITECH),
        &[(ORDER_HEADER, "bedrock"), (ORDER_HEADER, "anthropic")],
        &body,
    );
    let (_, tried) = tried_by(&stack, two_lines).await;
    assert_eq!(tried, names(&["bedrock", "anthropic"]));
    // Commas alone name nothing: as good as no header.
    let unordered = stack.post(CHAT, Some(INITECH), &[], &body);
    let (_, usual) = tried_by(&stack, unordered).await;
    let (_, tried) = tried_by(&stack, chat_ordered(&stack, INITECH, CLAUDE, " , ,")).await;
    assert_eq!(tried, usual);

    stack.sim.clear();
    let reply = chat_ordered(&stack, GLOBEX, CLAUDE, "bedrock,nosuch").await;
    reply.openai_error(400, "invalid_provider_order", "invalid_request_error");
    let reply = stack
        .post(
            MESSAGES,
            Some(GLOBEX),
            &[
                ("anthropic-version", "2023-06-01"),
                (ORDER_HEADER, "bedrock,nosuch"),
            ],
            &messages_body(CLAUDE),
        )
        .await;
    reply.anthropic_error(400, "invalid_request_error");
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [S8] the header filters the candidates: unnamed providers are never
/// tried; none left is 503 no_provider_available
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_header_filters_the_candidates() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;

    // vertex has globex's highest precedence and a usable key, but is not named.
    for _ in 0..5 {
        let (reply, tried) = tried_by(
            &stack,
            chat_ordered(&stack, GLOBEX, CLAUDE, "bedrock,anthropic"),
        )
        .await;
        assert_eq!(tried, names(&["bedrock", "anthropic"]));
        assert_eq!(reply.status, 503);
        assert_eq!(reply.header(PROVIDER_HEADER), Some("anthropic"));
    }
    // A named provider without a usable credential stays dropped.
    let (_, tried) = tried_by(
        &stack,
        chat_ordered(&stack, INITECH, CLAUDE, "vertex,bedrock"),
    )
    .await;
    assert_eq!(tried, names(&["bedrock"]));

    // Naming only providers that do not serve the model leaves nothing.
    stack.sim.clear();
    let reply = chat_ordered(&stack, GLOBEX, CLAUDE, "openai,azure").await;
    reply.openai_error(503, "no_provider_available", "api_error");
    assert_eq!(reply.header(PROVIDER_HEADER), None);
    let reply = stack
        .post(
            MESSAGES,
            Some(GLOBEX),
            &[
                ("anthropic-version", "2023-06-01"),
                (ORDER_HEADER, "openai"),
            ],
            &messages_body(CLAUDE),
        )
        .await;
    reply.anthropic_error(503, "api_error");
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [S9] [S29] the header turns the load-balancing reshuffle off for its
/// request: the order is the header's, every time
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_header_skips_load_balancing() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;

    // globex is `weighted`, globex-batch `round_robin` for this model: both
    // would reorder these requests without the header.
    for (key, order) in [
        (GLOBEX, ["vertex", "anthropic", "bedrock"]),
        (GLOBEX, ["bedrock", "anthropic", "vertex"]),
        (GLOBEX_BATCH, ["anthropic", "vertex", "bedrock"]),
    ] {
        for _ in 0..15 {
            let (_, tried) =
                tried_by(&stack, chat_ordered(&stack, key, CLAUDE, &order.join(","))).await;
            assert_eq!(tried, names(&order), "{key}");
        }
    }
    stack.stop().await;
}

/// [S13] providers without a usable credential (another tenant's binding,
/// an unset platform key or BYOK secret) are dropped; none left is 503
/// no_provider_available
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_without_a_usable_credential_are_dropped() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;

    // vertex's only key is globex's binding: initech never reaches it.
    let (_, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(CLAUDE))).await;
    assert_eq!(tried, names(&["anthropic", "bedrock"]));
    // azure's only key is initech's: globex never reaches it.
    let (_, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(GPT))).await;
    assert_eq!(tried, names(&["openai"]));

    // A platform key not configured on this deployment.
    reconfigure(&stack, "catalog.yaml", &[], &["AISETU_ANTHROPIC_KEY"]);
    let (_, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(CLAUDE))).await;
    assert_eq!(tried, names(&["bedrock"]));
    // A BYOK binding whose secret is not set.
    reconfigure(&stack, "catalog.yaml", &[], &["INITECH_AZURE_KEY"]);
    let (_, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(GPT))).await;
    assert_eq!(tried, names(&["openai"]));

    // Nobody left.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[],
        &["AISETU_ANTHROPIC_KEY", "AISETU_BEDROCK_KEY"],
    );
    stack.sim.clear();
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    reply.openai_error(503, "no_provider_available", "api_error");
    // Configuration, not a passing failure: SDKs are told not to retry.
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    let reply = stack.messages(INITECH, messages_body(CLAUDE)).await;
    reply.anthropic_error(503, "api_error");
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    reconfigure(&stack, "catalog.yaml", &[], &["AISETU_OPENAI_KEY"]);
    // initech's azure binding does not count for globex.
    let reply = stack.chat(GLOBEX, chat_body(GPT)).await;
    reply.openai_error(503, "no_provider_available", "api_error");
    assert_nothing_sent(&stack);
    stack.stop().await;
}

/// [S15] an unknown model is 404 model_not_found
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_is_model_not_found() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    let reply = stack.chat(INITECH, chat_body("claude-opus-9")).await;
    reply.openai_error(404, "model_not_found", "not_found_error");
    assert_eq!(reply.header(PROVIDER_HEADER), None);
    let reply = stack.messages(GLOBEX, messages_body("claude-opus-9")).await;
    reply.anthropic_error(404, "not_found_error");
    let reply = stack.chat(GLOBEX, chat_body("anthropic/gpt-4.1")).await;
    reply.openai_error(404, "model_not_found", "not_found_error");
    assert_nothing_sent(&stack);
    stack.stop().await;
}

// ---------------------------------------------------------------------------
// Failover

/// [S16] a 5xx or 429 goes to the next candidate (a 429 is not retried at
/// the same provider, even with Retry-After); when the last fails too, its
/// own answer is passed through
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_429_fail_over_and_the_last_answer_passes_through() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    for status in ["500", "502", "503", "504", "529", "429 retry_after=2s"] {
        replay(&stack, &scenario(&[("anthropic", &[status])]));
        let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
        assert_served(&reply, "bedrock");
        assert_eq!(
            stack.providers_tried(),
            names(&["anthropic", "bedrock"]),
            "{status}"
        );
    }

    // The last candidate's answer, as it sent it.
    replay(
        &stack,
        &scenario(&[
            ("anthropic", &["429 retry_after=2s"]),
            ("bedrock", &["500 message=\"bedrock is down\" code=down"]),
        ]),
    );
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_eq!(reply.status, 500);
    assert_eq!(reply.json["error"]["message"], "bedrock is down");
    assert_eq!(reply.json["error"]["code"], "down");
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));

    replay(
        &stack,
        &scenario(&[
            ("anthropic", &["500"]),
            ("bedrock", &["429 retry_after=7s message=\"slow down\""]),
        ]),
    );
    let reply = stack.messages(INITECH, messages_body(CLAUDE)).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("7"));
    assert_eq!(reply.json["type"], "error");
    assert_eq!(reply.json["error"]["type"], "rate_limit_error");
    assert_eq!(reply.json["error"]["message"], "slow down");
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    stack.stop().await;
}

/// [S17] a connection failure goes to the next candidate; when the last
/// one fails so, 502 provider_unreachable
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_fail_over_and_the_last_is_provider_unreachable() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ai-setu",
        &scenario(&[("anthropic", &["reset"])]),
        &[],
        clock.clone(),
    )
    .await;

    // A connection dropped before any answer.
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_served(&reply, "bedrock");
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));

    replay(&stack, &all_answer("reset"));
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    reply.openai_error(502, "provider_unreachable", "api_error");
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));
    let reply = stack.messages(INITECH, messages_body(CLAUDE)).await;
    reply.anthropic_error(502, "api_error");

    // A connection refused: bedrock where nothing listens.
    let bedrock = format!("http://{}/bedrock/v1", stack.sim.addr());
    let nowhere = format!("http://127.0.0.1:{}/bedrock/v1", closed_port());
    reconfigure(&stack, "catalog.yaml", &[(&bedrock, &nowhere)], &[]);
    replay(&stack, HEALTHY);
    let reply = chat_ordered(&stack, INITECH, CLAUDE, "bedrock,anthropic").await;
    assert_served(&reply, "anthropic");
    replay(&stack, &all_answer("503"));
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    reply.openai_error(502, "provider_unreachable", "api_error");
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    assert_eq!(stack.providers_tried(), names(&["anthropic"]));
    stack.stop().await;
}

/// [S17] a timeout goes to the next candidate (no answer within the headers
/// timeout, or a stream's first event late); when the last times out, 504
/// provider_timeout
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_fail_over_and_the_last_is_provider_timeout() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ai-setu",
        &scenario(&[("anthropic", &["no_answer"])]),
        &[],
        clock.clone(),
    )
    .await;

    // anthropic never answers: bedrock is asked once the timeout passed.
    let (reply, ()) = tokio::join!(stack.chat(INITECH, chat_body(CLAUDE)), async {
        until_asked(&stack, 1).await;
        clock.advance(DEFAULT_TIMEOUT_MS - 1_000);
        settle().await;
        assert_eq!(stack.providers_tried(), names(&["anthropic"]), "too early");
        clock.advance(1_000);
    });
    assert_served(&reply, "bedrock");
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));

    replay(&stack, &all_answer("no_answer"));
    let reply = advance_until(
        &clock,
        5_000,
        300_000,
        stack.chat(INITECH, chat_body(CLAUDE)),
    )
    .await;
    reply.openai_error(504, "provider_timeout", "api_error");
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));
    let reply = advance_until(
        &clock,
        5_000,
        300_000,
        stack.messages(INITECH, messages_body(CLAUDE)),
    )
    .await;
    reply.anthropic_error(504, "api_error");

    // A stream whose first event is late (the sim would wait ten real
    // minutes; the proxy gives up on its clock).
    replay(&stack, &scenario(&[("anthropic", &["first_token=10m"])]));
    let reply = advance_until(&clock, 5_000, 300_000, chat_stream(&stack, INITECH, CLAUDE)).await;
    assert_served(&reply, "bedrock");
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));
    replay(&stack, &all_answer("first_token=10m"));
    let reply = advance_until(&clock, 5_000, 300_000, chat_stream(&stack, INITECH, CLAUDE)).await;
    reply.openai_error(504, "provider_timeout", "api_error");
    stack.stop().await;
}

/// [S18] until a byte of the response reached the client, a failed stream
/// fails over transparently: the client sees one clean stream
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_before_its_first_byte_fails_over_transparently() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    // Refused, dropped before its headers, and dropped after its headers but
    // before any event.
    for step in ["503", "reset", "cut_after=0"] {
        replay(&stack, &scenario(&[("anthropic", &[step])]));
        let reply = chat_stream(&stack, INITECH, CLAUDE).await;
        assert_served(&reply, "bedrock");
        assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));

        stack.sim.clear();
        let reply = messages_stream(&stack, INITECH, CLAUDE).await;
        assert_served(&reply, "bedrock");
        assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));
    }
    stack.stop().await;
}

/// [S18] [S23] once the first byte of a stream reached the client the
/// request is committed: a cut, malformed or stalled stream ends with an
/// error event and no other provider is tried
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_committed_to_its_provider_after_the_first_byte() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    for step in ["cut_after=2", "malformed_chunk=3"] {
        replay(&stack, &scenario(&[("anthropic", &[step])]));
        let reply = chat_stream(&stack, INITECH, CLAUDE).await;
        assert_broken_stream(&reply, "anthropic");
        assert_eq!(stack.providers_tried(), names(&["anthropic"]), "{step}");

        stack.sim.clear();
        let reply = messages_stream(&stack, INITECH, CLAUDE).await;
        assert_broken_stream(&reply, "anthropic");
        assert_eq!(stack.providers_tried(), names(&["anthropic"]), "{step}");
    }

    // A stall: the idle timeout on the proxy's clock ends it. The clock
    // moves once the stream is committed (its headers go out with its first
    // event), so it is the idle wait that ends, not the wait for the start.
    replay(&stack, &scenario(&[("anthropic", &["stall_after=2"])]));
    let opening = spawn_open(
        &stack,
        MESSAGES,
        INITECH,
        &[("anthropic-version", "2023-06-01")],
        streamed(messages_body(CLAUDE)),
    );
    let response = finished(opening).await;
    let reply = advance_until(
        &clock,
        5_000,
        300_000,
        Reply::rest(response, String::new(), Instant::now()),
    )
    .await;
    assert_broken_stream(&reply, "anthropic");
    assert_eq!(stack.providers_tried(), names(&["anthropic"]));
    stack.stop().await;
}

/// [S19] at most 3 attempts: the primary and two fallbacks, however many
/// candidates there are
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_three_attempts_per_request() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;
    // A fourth provider for the model, so that the limit is what stops.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[(
            "        upstream: claude-sonnet-4-5@20250929\n",
            "        upstream: claude-sonnet-4-5@20250929\n      - provider: openai\n",
        )],
        &[],
    );

    let (reply, tried) = tried_by(
        &stack,
        chat_ordered(&stack, GLOBEX, CLAUDE, "openai,bedrock,vertex,anthropic"),
    )
    .await;
    assert_eq!(tried, names(&["openai", "bedrock", "vertex"]));
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header(PROVIDER_HEADER), Some("vertex"));

    // Reshuffled by balancing, still three distinct providers of the four.
    for _ in 0..20 {
        let (_, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(CLAUDE))).await;
        let distinct: BTreeSet<&String> = tried.iter().collect();
        assert_eq!((tried.len(), distinct.len()), (3, 3), "{tried:?}");
    }
    // Two candidates: both tried, nothing more.
    let (_, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(GPT))).await;
    assert_eq!(tried, names(&["azure", "openai"]));
    stack.stop().await;
}

/// [S20] any other 4xx is returned as it is, at once, without failover
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_client_errors_are_returned_as_is_without_failover() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    for status in [400, 401, 403, 404, 409, 413, 422] {
        let step = format!("{status} message=\"refused by anthropic\" code=refused_{status}");
        replay(&stack, &scenario(&[("anthropic", &[&step])]));
        let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
        assert_eq!(reply.status, status, "{}", reply.text);
        assert_eq!(reply.json["error"]["message"], "refused by anthropic");
        assert_eq!(reply.json["error"]["code"], format!("refused_{status}"));
        assert_eq!(reply.header(PROVIDER_HEADER), Some("anthropic"));
        assert_eq!(stack.providers_tried(), names(&["anthropic"]), "{status}");

        stack.sim.clear();
        let reply = stack.messages(INITECH, messages_body(CLAUDE)).await;
        assert_eq!(reply.status, status, "{}", reply.text);
        assert_eq!(reply.json["type"], "error");
        assert_eq!(reply.json["error"]["type"], format!("refused_{status}"));
        assert_eq!(reply.json["error"]["message"], "refused by anthropic");
        assert_eq!(stack.providers_tried(), names(&["anthropic"]), "{status}");
    }
    stack.stop().await;
}

/// [S21] a malformed answer or a redirect is a provider failure: the next
/// candidate is tried; the last one's is 502 provider_unreachable
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_answers_and_redirects_fail_over() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    for step in ["malformed", "301", "302", "307"] {
        replay(&stack, &scenario(&[("anthropic", &[step])]));
        let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
        assert_served(&reply, "bedrock");
        assert_eq!(
            stack.providers_tried(),
            names(&["anthropic", "bedrock"]),
            "{step}"
        );
    }
    // A stream whose first event is malformed.
    replay(&stack, &scenario(&[("anthropic", &["malformed"])]));
    let reply = chat_stream(&stack, INITECH, CLAUDE).await;
    assert_served(&reply, "bedrock");

    replay(&stack, &all_answer("malformed"));
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    reply.openai_error(502, "provider_unreachable", "api_error");
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));
    replay(&stack, &all_answer("302"));
    let reply = stack.messages(INITECH, messages_body(CLAUDE)).await;
    reply.anthropic_error(502, "api_error");
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));
    stack.stop().await;
}

/// [S24] X-AI-Setu-Provider names the provider that served, after
/// failover, in both wire formats, streamed or not, and on a provider's
/// passed-through error
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_header_names_whoever_served() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ai-setu",
        &scenario(&[("anthropic", &["503"])]),
        &[],
        clock.clone(),
    )
    .await;

    assert_served(&stack.chat(INITECH, chat_body(CLAUDE)).await, "bedrock");
    assert_served(
        &stack.messages(INITECH, messages_body(CLAUDE)).await,
        "bedrock",
    );
    assert_served(&chat_stream(&stack, INITECH, CLAUDE).await, "bedrock");
    assert_served(&messages_stream(&stack, INITECH, CLAUDE).await, "bedrock");
    assert_served(
        &chat_ordered(&stack, GLOBEX, CLAUDE, "vertex,anthropic").await,
        "vertex",
    );
    assert_served(&stack.chat(INITECH, chat_body(GPT)).await, "azure");
    // Whatever balancing picked.
    for _ in 0..10 {
        let (reply, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(CLAUDE))).await;
        assert_eq!(
            reply.header(PROVIDER_HEADER),
            tried.last().map(String::as_str)
        );
    }

    replay(&stack, &all_answer("503"));
    let (reply, tried) = tried_by(&stack, stack.chat(INITECH, chat_body(CLAUDE))).await;
    assert_eq!(reply.status, 503);
    assert_eq!(tried.last().map(String::as_str), Some("bedrock"));
    assert_eq!(reply.header(PROVIDER_HEADER), Some("bedrock"));
    stack.stop().await;
}

/// [S25] GATEWAY_FAILOVER is on unless switched off; off, only the first
/// candidate is attempted
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failover_kill_switch_is_on_by_default_and_off_means_one_attempt() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ai-setu",
        &scenario(&[("anthropic", &["503"])]),
        &[],
        clock.clone(),
    )
    .await;

    // On (as shipped), and on when the deployment does not set it.
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_served(&reply, "bedrock");
    reconfigure(&stack, "catalog.yaml", &[("  failover: true\n", "")], &[]);
    stack.sim.clear();
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_served(&reply, "bedrock");
    assert_eq!(stack.providers_tried(), names(&["anthropic", "bedrock"]));

    // Off: the first candidate's failure is the answer.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[("\ndeployment:\n", "\ndeployment:\n  failover: false\n")],
        &[],
    );
    stack.sim.clear();
    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(reply.header(PROVIDER_HEADER), Some("anthropic"));
    assert_eq!(stack.providers_tried(), names(&["anthropic"]));
    replay(&stack, &scenario(&[("anthropic", &["reset"])]));
    let reply = stack.messages(INITECH, messages_body(CLAUDE)).await;
    reply.anthropic_error(502, "api_error");
    assert_eq!(stack.providers_tried(), names(&["anthropic"]));
    stack.stop().await;
}

// ---------------------------------------------------------------------------
// Load balancing

/// [S26] [S27] balancing reshuffles the credential-filtered candidates before
/// failover runs, and only reorders them: every request tries each
/// candidate once, no other, and no dropped one comes back
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balancing_reorders_the_available_candidates_without_adding_or_dropping() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;

    let everyone: BTreeSet<String> = names(&GLOBEX_CLAUDE).into_iter().collect();
    let mut orders = BTreeSet::new();
    let mut leaders = BTreeSet::new();
    for _ in 0..60 {
        let (_, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(CLAUDE))).await;
        assert_eq!(tried.len(), 3, "{tried:?}");
        assert_eq!(tried.iter().cloned().collect::<BTreeSet<_>>(), everyone);
        leaders.insert(tried[0].clone());
        orders.insert(tried);
    }
    assert_eq!(leaders, everyone, "every candidate leads some requests");
    assert!(orders.len() >= 4, "reshuffled: {orders:?}");

    // Without globex's vertex key, vertex is filtered out before balancing
    // and never comes back.
    reconfigure(&stack, "catalog.yaml", &[], &["GLOBEX_VERTEX_KEY"]);
    let mut orders = BTreeSet::new();
    for _ in 0..30 {
        let (_, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(CLAUDE))).await;
        let mut sorted = tried.clone();
        sorted.sort();
        assert_eq!(sorted, names(&["anthropic", "bedrock"]));
        orders.insert(tried);
    }
    assert_eq!(orders.len(), 2, "both orders: {orders:?}");
    stack.stop().await;
}

/// [S28] GATEWAY_LOAD_BALANCE is off unless switched on: then no strategy
/// reorders anything
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_balancing_kill_switch_is_off_by_default() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", &all_answer("503"), &[], clock.clone()).await;

    let always_precedence_order = |tried: &[String]| tried == names(&GLOBEX_CLAUDE);
    for edit in [
        ("  load_balance: true\n", ""),
        ("\ndeployment:\n", "\ndeployment:\n  load_balance: false\n"),
    ] {
        reconfigure(&stack, "catalog.yaml", &[edit], &[]);
        // Neither globex's weighted shuffle nor batch's round robin.
        for key in [GLOBEX, GLOBEX_BATCH] {
            for _ in 0..15 {
                let (_, tried) = tried_by(&stack, stack.chat(key, chat_body(CLAUDE))).await;
                assert!(always_precedence_order(&tried), "{key}: {tried:?}");
            }
        }
    }

    // Switched on, the same requests are reordered.
    reconfigure(
        &stack,
        "catalog.yaml",
        &[("load_balance: false", "load_balance: true")],
        &[],
    );
    let mut reordered = 0;
    for _ in 0..30 {
        let (_, tried) = tried_by(&stack, stack.chat(GLOBEX, chat_body(CLAUDE))).await;
        reordered += usize::from(!always_precedence_order(&tried));
    }
    assert!(reordered > 5, "balancing reordered {reordered} of 30");
    stack.stop().await;
}

/// [S30] `weighted`: each candidate leads in proportion to its credential's
/// weight (the platform's anthropic key has 2, the others 1)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_balancing_follows_the_credential_weights() {
    let clock = Arc::new(ManualClock::default());
    // Without globex's own anthropic binding, its platform key (weight 2) serves.
    let stack = Stack::shipped("ai-setu", HEALTHY, &["GLOBEX_ANTHROPIC_KEY"], clock.clone()).await;

    let served = first_choices(&stack, GLOBEX, CLAUDE, 400).await;
    let counts = counts(&served);
    // Expected 200, 100 and 100; the bounds are five standard deviations.
    let anthropic = counts.get("anthropic").copied().unwrap_or(0);
    assert!((150..=250).contains(&anthropic), "{counts:?}");
    for light in ["vertex", "bedrock"] {
        let n = counts.get(light).copied().unwrap_or(0);
        assert!((55..=145).contains(&n), "{counts:?}");
        assert!(n < anthropic, "{counts:?}");
    }
    stack.stop().await;
}

/// [S30] [S31] `round_robin`, configured for (workspace batch,
/// claude-sonnet-4-5), beats batch's `least_busy` and globex's `weighted`:
/// the list rotates by one per request
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_balancing_rotates_the_candidates() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    let served = first_choices(&stack, GLOBEX_BATCH, CLAUDE, 12).await;
    assert!(is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");

    // Failover walks the rotated list.
    replay(&stack, &all_answer("503"));
    let mut rotations = BTreeSet::new();
    for _ in 0..6 {
        let (_, tried) = tried_by(&stack, stack.chat(GLOBEX_BATCH, chat_body(CLAUDE))).await;
        let by = GLOBEX_CLAUDE.iter().position(|p| *p == tried[0]).unwrap();
        let mut expected = names(&GLOBEX_CLAUDE);
        expected.rotate_left(by);
        assert_eq!(tried, expected);
        rotations.insert(by);
    }
    assert_eq!(rotations.len(), 3);
    stack.stop().await;
}

/// [S30] [S31] the rotation is kept per model and moves only for requests
/// that rotate: requests for other models, and for the same model from a
/// workspace that balances otherwise, do not move it, even when they come
/// in a period that is a multiple of the candidate count
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_rotates_per_model_whatever_else_is_served() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;

    let mut served = Vec::new();
    for _ in 0..6 {
        served.extend(first_choices(&stack, GLOBEX_BATCH, CLAUDE, 1).await);
        first_choices(&stack, INITECH, GPT, 2).await;
    }
    assert!(is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");
    // The same model for globex's default workspace, which balances by
    // weight: those requests take no turn either.
    let mut served = Vec::new();
    for _ in 0..6 {
        served.extend(first_choices(&stack, GLOBEX_BATCH, CLAUDE, 1).await);
        first_choices(&stack, GLOBEX, CLAUDE, 2).await;
    }
    assert!(is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");
    stack.stop().await;
}

/// [S30] [S31] `least_busy`, batch's setting for any model once its
/// claude-sonnet-4-5 setting is gone (it beats globex's `weighted`): the
/// candidates with fewest requests in flight go first, the order otherwise kept
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_busy_balancing_puts_busy_providers_last() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped(
        "ai-setu",
        &scenario(&[("vertex", &["no_answer", "200"])]),
        &[],
        clock.clone(),
    )
    .await;
    reconfigure(
        &stack,
        "tenants.yaml",
        &[(
            "        model_settings:\n          claude-sonnet-4-5: {lb_strategy: round_robin}\n",
            "",
        )],
        &[],
    );

    // The first request holds vertex busy; the second goes elsewhere.
    let (held, second) = tokio::join!(stack.chat(GLOBEX_BATCH, chat_body(CLAUDE)), async {
        until_asked(&stack, 1).await;
        let second = stack.chat(GLOBEX_BATCH, chat_body(CLAUDE)).await;
        // Let the first one time out at vertex.
        clock.advance(DEFAULT_TIMEOUT_MS);
        second
    });
    assert_served(&second, "anthropic");
    assert_served(&held, "anthropic");
    assert_eq!(
        stack.providers_tried(),
        names(&["vertex", "anthropic", "anthropic"])
    );

    // Nothing in flight: precedence order, every time (no rotation, no shuffle).
    let served = first_choices(&stack, GLOBEX_BATCH, CLAUDE, 12).await;
    assert_eq!(served, vec![String::from("vertex"); 12]);
    stack.stop().await;
}

/// [S30] `random`: a uniform shuffle, every candidate leading about as often
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_balancing_shuffles_uniformly() {
    let clock = Arc::new(ManualClock::default());
    // Without globex's anthropic binding the platform key's weight 2 would
    // show if the strategy were `weighted`.
    let stack = Stack::shipped("ai-setu", HEALTHY, &["GLOBEX_ANTHROPIC_KEY"], clock.clone()).await;
    reconfigure(
        &stack,
        "tenants.yaml",
        &[(
            "settings: {lb_strategy: weighted}",
            "settings: {lb_strategy: random}",
        )],
        &["GLOBEX_ANTHROPIC_KEY"],
    );

    let served = first_choices(&stack, GLOBEX, CLAUDE, 300).await;
    let counts = counts(&served);
    // Expected 100 each; the bounds are five standard deviations.
    for provider in GLOBEX_CLAUDE {
        let n = counts.get(provider).copied().unwrap_or(0);
        assert!((55..=145).contains(&n), "{counts:?}");
    }
    stack.stop().await;
}

/// [S31] balancing configuration resolves most-specific-first: (workspace,
/// model), then (workspace, any model), then (tenant, model), then
/// (tenant, any model)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balancing_configuration_resolves_most_specific_first() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;
    let always_vertex = vec![String::from("vertex"); 9];

    // As shipped: batch's claude-sonnet-4-5 setting (round_robin) beats
    // batch's least_busy (which would keep vertex first) ...
    let served = first_choices(&stack, GLOBEX_BATCH, CLAUDE, 9).await;
    assert!(is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");
    // ... and the default workspace falls back to globex's weighted shuffle.
    let served = first_choices(&stack, GLOBEX, CLAUDE, 30).await;
    assert!(!is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");
    assert!(counts(&served).len() > 1, "{served:?}");

    // A (tenant, model) setting beats the tenant-wide one ...
    reconfigure(
        &stack,
        "tenants.yaml",
        &[(
            "    settings: {lb_strategy: weighted}\n",
            "    settings: {lb_strategy: weighted}\n    model_settings:\n      claude-sonnet-4-5: {lb_strategy: round_robin}\n",
        )],
        &[],
    );
    let served = first_choices(&stack, GLOBEX, CLAUDE, 9).await;
    assert!(is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");
    // ... but not a (workspace, any model) one: batch without its model
    // setting is least_busy.
    reconfigure(
        &stack,
        "tenants.yaml",
        &[(
            "        model_settings:\n          claude-sonnet-4-5: {lb_strategy: round_robin}\n",
            "",
        )],
        &[],
    );
    let served = first_choices(&stack, GLOBEX_BATCH, CLAUDE, 9).await;
    assert_eq!(served, always_vertex);
    let served = first_choices(&stack, GLOBEX, CLAUDE, 9).await;
    assert!(is_rotation(&served, &GLOBEX_CLAUDE), "{served:?}");
    stack.stop().await;
}

// ---------------------------------------------------------------------------
// What a successful response carries

/// [S32] a successful answer carries the provider, whether the key was the
/// tenant's own, and which BYOK connection served; errors carry neither of
/// the last two
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successful_answers_say_provider_byok_and_connection() {
    let clock = Arc::new(ManualClock::default());
    let stack = Stack::shipped("ai-setu", HEALTHY, &[], clock.clone()).await;
    let routing = |reply: &Reply| {
        (
            reply.header(PROVIDER_HEADER).map(str::to_string),
            reply.header(BYOK_HEADER).map(str::to_string),
            reply.header(CONNECTION_HEADER).map(str::to_string),
        )
    };
    let expect = |provider: &str, byok: &str, connection: Option<&str>| {
        (
            Some(provider.to_string()),
            Some(byok.to_string()),
            connection.map(str::to_string),
        )
    };

    let reply = stack.chat(INITECH, chat_body(CLAUDE)).await;
    assert_eq!(routing(&reply), expect("anthropic", "false", None));
    let reply = stack.chat(INITECH, chat_body(GPT)).await;
    assert_eq!(
        routing(&reply),
        expect("azure", "true", Some("initech-azure"))
    );
    let reply = stack
        .messages(GLOBEX, messages_body("@globex-anthropic/claude-sonnet-4-5"))
        .await;
    assert_eq!(
        routing(&reply),
        expect("anthropic", "true", Some("globex-anthropic"))
    );
    let reply = stack
        .post(
            CHAT,
            Some(GLOBEX),
            &[],
            &streamed(chat_body("@globex-vertex/claude-sonnet-4-5")),
        )
        .await;
    assert_served(&reply, "vertex");
    assert_eq!(
        routing(&reply),
        expect("vertex", "true", Some("globex-vertex"))
    );

    // After failover, what served: initech's azure failed, the platform's
    // openai key served.
    replay(&stack, &scenario(&[("azure", &["503"])]));
    let reply = stack.chat(INITECH, chat_body(GPT)).await;
    assert_eq!(routing(&reply), expect("openai", "false", None));

    // An error is no successful response.
    replay(&stack, &all_answer("503"));
    let reply = stack.chat(INITECH, chat_body(GPT)).await;
    assert_eq!(reply.status, 503);
    assert_eq!(routing(&reply), (Some(String::from("openai")), None, None));
    stack.stop().await;
}
