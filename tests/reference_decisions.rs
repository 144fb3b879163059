//! Decisions for the reference policies, end to end from their files,
//! through the library's `evaluate` (no proxy).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::json;
use std::cell::Cell;
use std::path::Path;
use switchyard::compile::{AllSecrets, Snapshot, compile_file};
use switchyard::evaluate::health::{CandidateHealth, HealthView, Healthy};
use switchyard::evaluate::*;

fn snapshot(name: &str) -> Snapshot {
    let path = format!("{}/policies/{name}.policy", env!("CARGO_MANIFEST_DIR"));
    match compile_file(Path::new(&path), &AllSecrets) {
        Ok(snapshot) => snapshot,
        Err(report) => panic!("{name} does not compile: {:#?}", report.diagnostics),
    }
}

fn caller(snapshot: &Snapshot, key_id: &str) -> Caller {
    let tenants = &snapshot.data.tenants;
    let (index, key) = tenants
        .keys
        .iter()
        .enumerate()
        .find(|(_, k)| k.id == key_id)
        .unwrap();
    Caller {
        tenant: key.tenant,
        workspace: key.workspace,
        key: Some(index),
    }
}

fn decide(
    snapshot: &Snapshot,
    key: &str,
    endpoint: Endpoint,
    body: serde_json::Value,
    headers: &[(String, String)],
) -> Decision {
    let text = body.to_string();
    let context = RequestContext {
        id: std::sync::Arc::from("req-1"),
        endpoint,
        body: Ok(&body),
        body_bytes: text.len(),
        headers,
        caller: caller(snapshot, key),
        seed: 7,
        rotation: &0,
    };
    evaluate(snapshot, &context, &Healthy)
}

/// A health view that counts how often it is asked.
#[derive(Default)]
struct CountingHealth(Cell<usize>);

impl HealthView for CountingHealth {
    fn health(&self, _candidate: &Candidate) -> CandidateHealth {
        self.0.set(self.0.get() + 1);
        CandidateHealth::default()
    }
}

/// How often `evaluate` (or, if `traced`, `evaluate_traced`) asks the
/// health view for a chat request of `model` with `key`, and how many
/// candidates the request had.
fn health_asked(snapshot: &Snapshot, key: &str, model: &str, traced: bool) -> (usize, usize) {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let text = body.to_string();
    let context = RequestContext {
        id: std::sync::Arc::from("req-1"),
        endpoint: Endpoint::ChatCompletions,
        body: Ok(&body),
        body_bytes: text.len(),
        headers: &[],
        caller: caller(snapshot, key),
        seed: 7,
        rotation: &0,
    };
    let counting = CountingHealth::default();
    let decision = if traced {
        evaluate_traced(snapshot, &context, &counting)
    } else {
        evaluate(snapshot, &context, &counting)
    };
    assert!(decision.result.is_ok(), "{:?}", decision.trace.refused);
    let candidates = evaluate_traced(snapshot, &context, &Healthy)
        .trace
        .candidates
        .len();
    (counting.0.get(), candidates)
}

#[test]
fn health_is_asked_once_per_candidate_and_only_by_decisions_that_read_it() {
    // Noirdoc's decision reads no health, measurements or capacity (its
    // capacity rules act when the plan runs).
    let noirdoc = snapshot("noirdoc");
    let (asked, candidates) = health_asked(&noirdoc, "acme-default", "qwen3.8-27b", false);
    assert!(candidates > 1);
    assert_eq!(asked, 0);
    // Its trace shows each candidate's health.
    let (asked, _) = health_asked(&noirdoc, "acme-default", "qwen3.8-27b", true);
    assert_eq!(asked, candidates);

    // AnonRouter's sorts read measurements and penalties, several of them
    // per candidate: the view is asked once for each candidate all the same.
    let anonrouter = snapshot("anonrouter");
    let (asked, candidates) = health_asked(
        &anonrouter,
        "lumen-default",
        "deepseek/deepseek-v3.2",
        false,
    );
    assert!(candidates > 1);
    assert_eq!(asked, candidates);
}

#[test]
fn policies_whose_plans_depend_on_the_key_alone_remember_them() {
    // Noirdoc and noeta plan from the caller, the model and the endpoint,
    // ngrok from those and an input, ai-setu from those and a header (its
    // balance applies as the key's settings say). AnonRouter reads health
    // and measurements.
    for (name, remembers) in [
        ("noirdoc", true),
        ("noeta", true),
        ("ngrok", true),
        ("ai-setu", true),
        ("anonrouter", false),
    ] {
        let remembered = snapshot(name).remembered_plans();
        assert_eq!(remembered.is_some(), remembers, "{name}: {remembered:?}");
    }
    // What keeps AnonRouter's plans from being remembered: the first term
    // found, its step that reads the request's parameters.
    let anonrouter = snapshot("anonrouter");
    let span = anonrouter.plans_made_afresh_by().unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/anonrouter.policy");
    let text = std::fs::read_to_string(path).unwrap();
    let reader = text.get(span.range()).unwrap();
    assert!(reader.contains("request.parameters"), "{reader}");
    assert_eq!(snapshot("noirdoc").plans_made_afresh_by(), None);

    let noirdoc = snapshot("noirdoc");
    let ask = |key: &str, endpoint: Endpoint| {
        let body = json!({"model": "qwen3.8-27b", "messages": []});
        decide(&noirdoc, key, endpoint, body, &[])
    };
    let first = providers(&noirdoc, &ask("acme-default", Endpoint::ChatCompletions));
    assert_eq!(noirdoc.remembered_plans(), Some(1));
    let again = providers(&noirdoc, &ask("acme-default", Endpoint::ChatCompletions));
    assert_eq!(first, again);
    assert_eq!(noirdoc.remembered_plans(), Some(1));
    // A refusal is not remembered; another key's plan is its own.
    ask("acme-default", Endpoint::Embeddings);
    assert_eq!(noirdoc.remembered_plans(), Some(1));
    ask("kanzlei-default", Endpoint::ChatCompletions);
    assert_eq!(noirdoc.remembered_plans(), Some(2));
}

/// `files` (name, text) written to a directory of their own and
/// `policy` among them compiled there, on its own thread, so that a walk
/// gone exponential fails the test instead of hanging the suite (compiling
/// takes milliseconds).
fn compiled_from(name: &str, files: &[(&str, String)], policy: &str) -> Snapshot {
    let dir = std::env::temp_dir().join(format!("switchyard-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let path = dir.join(policy);
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // The receiver is gone only if the test already failed.
        let _ = sender.send(compile_file(&path, &AllSecrets));
    });
    let compiled = receiver
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("compiling a policy takes milliseconds, not minutes");
    std::fs::remove_dir_all(&dir).unwrap();
    match compiled {
        Ok(snapshot) => snapshot,
        Err(report) => panic!("{name} does not compile: {:#?}", report.diagnostics),
    }
}

/// Noirdoc's policy text as `edit` changes it, compiled with Noirdoc's data.
fn noirdoc_edited(name: &str, edit: impl FnOnce(String) -> String) -> Snapshot {
    let policies = concat!(env!("CARGO_MANIFEST_DIR"), "/policies");
    let text = std::fs::read_to_string(format!("{policies}/noirdoc.policy"))
        .unwrap()
        .replace("\"noirdoc/", &format!("\"{policies}/noirdoc/"));
    let file = format!("{name}.policy");
    compiled_from(name, &[(file.as_str(), edit(text))], &file)
}

#[test]
fn a_plan_that_reads_every_input_is_remembered_per_value_of_each() {
    // Noirdoc with a header input read only through `input` itself, the
    // record of every input.
    let snapshot = noirdoc_edited("whole-input", |text| {
        text.replacen(
            "eligibility {\n",
            "let asked = input\n\
             input only from header \"x-only\" : string\n  malformed error wrong_endpoint_for_model\n\
             eligibility {\n  require not present(asked.only) or provider.name == asked.only\n    \
             else provider_not_allowed_for_key\n",
            1,
        )
    });
    assert!(snapshot.remembered_plans().is_some());
    let ask = |headers: &[(String, String)]| {
        let body = json!({"model": "qwen3.8-27b", "messages": []});
        providers(
            &snapshot,
            &decide(
                &snapshot,
                "acme-default",
                Endpoint::ChatCompletions,
                body,
                headers,
            ),
        )
    };
    let all = ask(&[]);
    assert!(all.len() > 1, "{all:?}");
    let last = all.last().unwrap().clone();
    let only = [(String::from("x-only"), last.clone())];
    assert_eq!(ask(&only), [last]);
    assert_eq!(ask(&[]), all);
    assert_eq!(snapshot.remembered_plans(), Some(2));
}

#[test]
fn definitions_used_twice_each_in_a_long_chain_compile_promptly() {
    // Each definition uses the one before twice: looking through every use
    // anew would take 2^40 visits to find what a term reads.
    // One chain for a sort key, one for an eligibility step (whose guard,
    // what a request settles of it, looks through definitions too).
    let mut chain = String::from(
        "let chain0 = if tenant.secrecy_bound then provider.priority else 1\n\
         let gate0 = tenant.secrecy_bound and provider.s203_approved\n",
    );
    for n in 1..=40 {
        let before = n - 1;
        chain.push_str(&format!("let chain{n} = chain{before} + chain{before}\n"));
        chain.push_str(&format!("let gate{n} = gate{before} and gate{before}\n"));
    }
    let snapshot = noirdoc_edited("let-chain", |text| {
        text.replacen(
            "eligibility {\n",
            &format!(
                "{chain}eligibility {{\n  require gate40 or not gate40 \
                 else provider_not_allowed_for_key\n"
            ),
            1,
        )
        .replacen("order {\n", "order {\n  by chain40 desc\n", 1)
    });
    assert!(snapshot.remembered_plans().is_some());
    let body = json!({"model": "qwen3.8-27b", "messages": []});
    let decision = decide(
        &snapshot,
        "acme-default",
        Endpoint::ChatCompletions,
        body,
        &[],
    );
    assert!(!providers(&snapshot, &decision).is_empty());
}

fn providers(snapshot: &Snapshot, decision: &Decision) -> Vec<String> {
    match &decision.result {
        Ok(plan) => plan
            .candidates
            .iter()
            .map(|c| snapshot.provider(c.provider).unwrap().id.clone())
            .collect(),
        Err(refusal) => panic!(
            "refused: {:?} ({:?})",
            refusal.error, decision.trace.refused
        ),
    }
}

fn refused(decision: &Decision) -> (u16, String) {
    match &decision.result {
        Ok(plan) => panic!(
            "expected a refusal, got a plan of {}",
            plan.candidates.len()
        ),
        Err(refusal) => (refusal.error.status, refusal.error.code.clone()),
    }
}

#[test]
fn noirdoc_orders_by_price_then_priority_then_listing() {
    let snap = snapshot("noirdoc");
    let decision = decide(
        &snap,
        "acme-default",
        Endpoint::ChatCompletions,
        serde_json::json!({"model": "qwen3.8-27b", "messages": []}),
        &[],
    );
    // aki-io and scaleway cost 3*0.20+0.60 = 1.20, ionos 3*0.25+0.45 = 1.20:
    // equal; aki-io has priority 10, then ionos and scaleway (8) by listing
    // date: scaleway listed earlier. together has no price: last.
    let order = providers(&snap, &decision);
    assert_eq!(order[0], "aki-io");
    assert_eq!(order.last().unwrap(), "together");
}

#[test]
fn noirdoc_prefers_own_provider_exclusively() {
    let snap = snapshot("noirdoc");
    let decision = decide(
        &snap,
        "acme-default",
        Endpoint::ChatCompletions,
        serde_json::json!({"model": "gpt-5"}),
        &[],
    );
    assert_eq!(providers(&snap, &decision), ["acme-openai"]);
    let decision = decide(
        &snap,
        "kanzlei-default",
        Endpoint::ChatCompletions,
        serde_json::json!({"model": "gpt-5"}),
        &[],
    );
    assert_eq!(
        refused(&decision),
        (403, String::from("provider_not_allowed_for_tenant"))
    );
}

#[test]
fn noirdoc_refuses_the_wrong_endpoint_and_unknown_models() {
    let snap = snapshot("noirdoc");
    let decision = decide(
        &snap,
        "acme-default",
        Endpoint::Embeddings,
        serde_json::json!({"model": "qwen3.8-27b"}),
        &[],
    );
    assert_eq!(
        refused(&decision),
        (400, String::from("wrong_endpoint_for_model"))
    );
    let decision = decide(
        &snap,
        "acme-default",
        Endpoint::ChatCompletions,
        serde_json::json!({"model": "nope"}),
        &[],
    );
    assert_eq!(
        refused(&decision),
        (404, String::from("model_not_available"))
    );
}

/// Embeddings never come as a stream: a body's `stream: true` there must
/// not make the proxy wait for events, nor read a JSON answer as a broken
/// stream.
#[test]
fn an_embeddings_request_is_never_a_stream() {
    let snap = snapshot("noirdoc");
    for (endpoint, model, streamed) in [
        (Endpoint::Embeddings, "mistral-embed", false),
        (Endpoint::ChatCompletions, "gpt-5", true),
    ] {
        let body = serde_json::json!({"model": model, "input": "hi", "stream": true});
        let decision = decide(&snap, "acme-default", endpoint, body, &[]);
        let plan = decision.result.as_ref().unwrap();
        assert_eq!(plan.request.stream, streamed, "{model}");
    }
}

#[test]
fn anonrouter_applies_pins_conflicts_and_floors() {
    let snap = snapshot("anonrouter");
    let body = serde_json::json!({"model": "deepseek/deepseek-v3.2", "provider": "venice"});
    let decision = decide(&snap, "lumen-default", Endpoint::ChatCompletions, body, &[]);
    assert_eq!(providers(&snap, &decision), ["venice"]);
    let plan = decision.result.unwrap();
    assert_eq!(plan.attempts, 1);

    let body = serde_json::json!({"model": "deepseek/deepseek-v3.2", "provider": {"only": ["venice"], "ignore": ["venice"]}});
    let decision = decide(&snap, "lumen-default", Endpoint::ChatCompletions, body, &[]);
    assert_eq!(
        refused(&decision),
        (400, String::from("provider_policy_conflict"))
    );

    let body =
        serde_json::json!({"model": "deepseek/deepseek-v3.2", "provider": {"max_attempts": 4}});
    let decision = decide(&snap, "lumen-default", Endpoint::ChatCompletions, body, &[]);
    assert_eq!(refused(&decision), (400, String::from("invalid_request")));

    let body =
        serde_json::json!({"model": "deepseek/deepseek-v3.2", "provider": {"only": ["nowhere"]}});
    let decision = decide(&snap, "lumen-default", Endpoint::ChatCompletions, body, &[]);
    assert_eq!(
        refused(&decision),
        (400, String::from("invalid_provider_policy"))
    );

    // The privacy sort keeps the strongest tier first.
    let body =
        serde_json::json!({"model": "deepseek/deepseek-v3.2", "provider": {"sort": "privacy"}});
    let decision = decide(&snap, "lumen-default", Endpoint::ChatCompletions, body, &[]);
    let order = providers(&snap, &decision);
    assert!(
        order[0] == "tinfoil" || order[0] == "near-ai-us",
        "{order:?}"
    );
    assert!(
        !order.contains(&String::from("phala")),
        "E2EE routes serve only E2EE requests"
    );
}

#[test]
fn noirdoc_failover_keeps_priced_after_priced_and_stops_at_three() {
    let snap = snapshot("noirdoc");
    let decision = decide(
        &snap,
        "acme-default",
        Endpoint::ChatCompletions,
        serde_json::json!({"model": "qwen3.8-27b"}),
        &[],
    );
    let plan = decision.result.unwrap();
    let sequence: Vec<String> = plan
        .failover_sequence(&snap, &Healthy)
        .into_iter()
        .map(|i| {
            snap.provider(plan.candidates[i].provider)
                .unwrap()
                .id
                .clone()
        })
        .collect();
    // `together` has no price: never after a priced provider.
    assert_eq!(sequence, ["aki-io", "scaleway", "ionos"]);
    // With the first full, the next free one in the failover order serves.
    let next = plan.next_candidate(&snap, &Healthy, (&[], None), &|i| i != 0);
    assert_eq!(next, NextCandidate::Try(1));
    // Nothing tried and everything full: wait for capacity.
    assert_eq!(
        plan.next_candidate(&snap, &Healthy, (&[], None), &|_| false),
        NextCandidate::Wait
    );
    // After an attempt, nothing available: done, the last answer stands.
    assert_eq!(
        plan.next_candidate(&snap, &Healthy, (&[0], None), &|_| false),
        NextCandidate::Done
    );
}

#[test]
fn a_definition_aggregating_over_the_set_follows_the_set_step_by_step() {
    // `survivors` reads no candidate field, yet its aggregate ranges over
    // the candidates before each step: the first step reads it before any
    // removal, the last after some (residency removes providers for
    // `acme-eu-only`), and the two must not share one value.
    let snapshot = noirdoc_edited("set-wide-definition", |text| {
        text.replacen(
            "eligibility {\n",
            "let survivors = count_of(true)\n\
             eligibility {\n  require survivors >= 1 else provider_not_allowed_for_key\n",
            1,
        )
        .replacen(
            "  require own or tenant.managed_models\n    else model_not_available\n}",
            "  require own or tenant.managed_models\n    else model_not_available\n  \
             require survivors == count_of(true) else provider_not_allowed_for_key\n}",
            1,
        )
    });
    let ask = |key: &str| {
        let body = json!({"model": "qwen3.8-27b", "messages": []});
        decide(&snapshot, key, Endpoint::ChatCompletions, body, &[])
    };
    let everyone = providers(&snapshot, &ask("acme-default"));
    let eu_only = providers(&snapshot, &ask("acme-eu-only"));
    assert!(
        !eu_only.is_empty() && eu_only.len() < everyone.len(),
        "{eu_only:?} against {everyone:?}"
    );
}

/// A catalog of one model, `small-chat` (alias `small`), on two providers,
/// and a tenant whose `small-chat` setting differs from the default.
const TWO_PROVIDERS: &str = r#"
providers:
  - id: alpha
    format: openai
    base_url: http://127.0.0.1:9/alpha/v1
    credentials:
      - {id: alpha-key, key: "${ALPHA_API_KEY}"}
  - id: beta
    format: openai
    base_url: http://127.0.0.1:9/beta/v1
    credentials:
      - {id: beta-key, key: "${BETA_API_KEY}"}
models:
  - id: small-chat
    kind: chat
    aliases: [small]
    routes:
      - {provider: alpha, price: {input: 0.1, output: 0.4}}
      - {provider: beta, price: {input: 0.2, output: 0.6}}
  # Its id reads as a pin too: as a pin it is taken, settings and all.
  - id: "alpha:small-chat"
    kind: chat
    routes:
      - {provider: beta, price: {input: 0.3, output: 0.9}}
"#;

const ONE_TENANT: &str = r#"
settings:
  max_attempts: {type: number, default: 1}
tenants:
  - id: acme
    model_settings:
      small-chat: {max_attempts: 2}
    keys:
      - id: acme-dev
        sha256: 9d72c7cfb7ccac5fb1184e70600d9a57c2871be7e61bfab2cb13e76717bce387
"#;

/// `sections` compiled as a policy over [`TWO_PROVIDERS`] and [`ONE_TENANT`],
/// with a failover of `defaults.max_attempts` unless they have their own.
fn two_providers(name: &str, sections: &str) -> Snapshot {
    let identifier = name.replace('-', "_");
    let failover = if sections.contains("failover {") {
        ""
    } else {
        "failover {\n  attempts defaults.max_attempts\n  on any => next, error upstream_failed\n}\n"
    };
    let policy = format!(
        "policy {identifier} {{\n  catalog \"catalog.yaml\"\n  tenants \"tenants.yaml\"\n}}\n{sections}\n\
         {failover}\
         errors {{\n  no_route = 503, \"no provider can serve this model\"\n  \
         unknown_model = 404, \"there is no such model\"\n  \
         upstream_failed = 502, \"every provider failed\"\n}}\n"
    );
    let files = [
        ("catalog.yaml", TWO_PROVIDERS.to_string()),
        ("tenants.yaml", ONE_TENANT.to_string()),
        ("policy.policy", policy),
    ];
    compiled_from(name, &files, "policy.policy")
}

#[test]
fn a_model_setting_applies_however_the_request_names_the_model() {
    let snapshot = two_providers(
        "model-settings",
        "models {\n  pin \"{provider}:{model}\"\n  credentials one by credential.owned desc else no_route\n  \
         unknown error unknown_model\n}\n\
         defaults {\n  layers tenant.model, tenant\n}",
    );
    let attempts = |model: &str| {
        let body = json!({"model": model, "messages": []});
        match decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[]).result {
            Ok(plan) => plan.attempts,
            Err(refusal) => panic!("{model} refused: {refusal:?}"),
        }
    };
    // By its id, by its alias, and pinned to a provider: `small-chat`'s own
    // setting of 2 each time, not the default of 1.
    assert_eq!(attempts("small-chat"), 2);
    assert_eq!(attempts("small"), 2);
    assert_eq!(attempts("alpha:small-chat"), 2);
    assert_eq!(attempts("beta:small"), 2);
}

#[test]
fn unknown_ids_served_by_one_provider_are_each_a_candidate() {
    let snapshot = two_providers(
        "unknown-ids",
        "input models from body \"models\" : list<string>\n  malformed error no_route\n\
         models {\n  from request.model, input.models\n  \
         credentials one by credential.owned desc else no_route\n  \
         unknown serve where provider.id == \"alpha\"\n  unknown error unknown_model\n}",
    );
    let body =
        json!({"model": "vendor/foo", "models": ["vendor/bar", "vendor/foo"], "messages": []});
    let decision = decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[]);
    let Ok(plan) = &decision.result else {
        panic!("refused: {:?}", decision.result)
    };
    let sent: Vec<&str> = plan
        .candidates
        .iter()
        .map(|candidate| candidate.upstream_model(&snapshot).as_ref())
        .collect();
    // `vendor/foo` repeated is one candidate; `vendor/bar` is another.
    assert_eq!(sent, ["vendor/foo", "vendor/bar"]);
}

#[test]
fn what_a_shorthand_makes_is_read_as_a_written_object() {
    let snapshot = two_providers(
        "shorthand-types",
        "input p from body \"p\" : { tries: int 1..3, mode: one of [fast, cheap] }\n  \
         shorthand number => { tries: it, mode: \"fast\" }\n  malformed error no_route\n\
         models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n\
         defaults {\n  layers tenant\n}\n\
         let tries = if coalesce(input.p.mode == \"fast\", false) then coalesce(input.p.tries, 1) else 1\n\
         failover {\n  attempts tries\n  on any => next, error upstream_failed\n}",
    );
    let ask = |p: serde_json::Value| {
        let body = json!({"model": "small-chat", "p": p, "messages": []});
        decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[]).result
    };
    // The shorthand's number is held to the field's range, as a written
    // object's is; its enumeration member is one by name.
    match ask(json!(3)) {
        Ok(plan) => assert_eq!(plan.attempts, 3),
        Err(refusal) => panic!("{refusal:?}"),
    }
    for out_of_range in [json!(1_000_000_000), json!(2.5)] {
        match ask(out_of_range.clone()) {
            Err(refusal) => assert_eq!(refusal.error.code, "no_route", "{out_of_range}"),
            Ok(plan) => panic!("{out_of_range} gave {} attempts", plan.attempts),
        }
    }
}

/// A timeout that comes out as no time when a request runs is the
/// timeout's default: a stream with `idle` of 0 s would race its own first
/// chunk, and one with `connect` of 0 s could never connect.
#[test]
fn a_timeout_that_comes_out_as_no_time_is_its_default() {
    let snapshot = two_providers(
        "zero-timeouts",
        "models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n\
         failover {\n  attempts 2\n  on any => next, error upstream_failed\n}\n\
         timeouts {\n  connect 1s - 1s\n  first_token 0 * 1s\n  idle 2s - 2s\n  attempt 5s - 5s\n}",
    );
    let body = json!({"model": "small-chat", "messages": []});
    let plan = decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[])
        .result
        .unwrap();
    let limits = plan.timeouts(&snapshot, &Healthy, 0);
    assert_eq!(limits.connect_ms, 10_000);
    assert_eq!(limits.first_token_ms, limits.headers_ms);
    assert_eq!(limits.idle_ms, 60_000);
    assert_eq!(limits.silence_before_answer_ms, None);
    assert_eq!(limits.attempt_ms, None);
}

/// A retry whose wait comes out absent (a division by zero, or a
/// `backoff` step that does) waits the default backoff, never nothing: a
/// provider that keeps failing is not asked again at once.
#[test]
fn a_retry_whose_wait_is_absent_waits_the_default_backoff() {
    for wait in [
        "1s * (1 / (attempt - attempt))",
        "backoff(1s, 2, 30s, 0, 1 / (attempt - attempt))",
    ] {
        let snapshot = two_providers(
            "absent-wait",
            &format!(
                "models {{\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}}\n\
                 failover {{\n  attempts 2\n  on 5xx when retries < 2 => retry after {wait}, error upstream_failed\n  \
                 on any => next, error upstream_failed\n}}"
            ),
        );
        let body = json!({"model": "small-chat", "messages": []});
        let decision = decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[]);
        let plan = decision.result.unwrap();
        let outcome = AttemptOutcome {
            class: OutcomeClass::Status(503),
            facts: OutcomeFacts {
                status: Some(503),
                ..OutcomeFacts::default()
            },
        };
        let progress = Progress {
            attempt: 1,
            attempts: 1,
            jitter: 0.5,
            ..Progress::default()
        };
        let reaction = plan.react(&snapshot, &Healthy, 0, &outcome, progress, &|_| 0);
        // 250 ms, three quarters of it at the middle of the jitter.
        assert_eq!(reaction.action, Action::Retry { after_ms: 187 }, "{wait}");
    }
}

/// `backoff` is `base × factor^step`, at most `max`: with no base it is no
/// time, even where the factor's power overflows (0 × ∞ is NaN, which took
/// the maximum), as a penalty schedule's growth already was.
#[test]
fn a_backoff_from_no_time_stays_no_time_when_its_factor_overflows() {
    let snapshot = two_providers(
        "zero-backoff",
        "models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n\
         failover {\n  attempts 2\n  on 5xx when retries < 5 => retry after backoff(0ms, 1000000000000000, 60s, 0, retries * 100), error upstream_failed\n  \
         on any => next, error upstream_failed\n}",
    );
    let body = json!({"model": "small-chat", "messages": []});
    let plan = decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[])
        .result
        .unwrap();
    let outcome = AttemptOutcome {
        class: OutcomeClass::Status(503),
        facts: OutcomeFacts {
            status: Some(503),
            ..OutcomeFacts::default()
        },
    };
    for retries in 0..4 {
        let progress = Progress {
            attempt: 1 + retries,
            attempts: 1,
            retries,
            jitter: 0.5,
            ..Progress::default()
        };
        let reaction = plan.react(&snapshot, &Healthy, 0, &outcome, progress, &|_| retries);
        assert_eq!(
            reaction.action,
            Action::Retry { after_ms: 0 },
            "after {retries} retries"
        );
    }
}

/// A `keep` that reads the previous attempt's failure lets candidates the
/// failure-blind walk passes over be tried: `switchyard test` then allows
/// an outcome at one of them.
#[test]
fn a_keep_reading_upstream_is_told_apart() {
    let models = "models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n";
    let with_keep = |name: &str, keep: &str| {
        two_providers(
            name,
            &format!(
                "{models}\nfailover {{\n  attempts 2\n  keep {keep}\n  on any => next, error upstream_failed\n}}"
            ),
        )
    };
    let reading = with_keep(
        "keep-upstream",
        "prev.provider.id == provider.id or coalesce(upstream.error.code, \"\") != \"context_length_exceeded\"",
    );
    assert!(Plan::keep_reads_upstream(&reading));
    let blind = with_keep("keep-blind", "prev.provider.id != provider.id");
    assert!(!Plan::keep_reads_upstream(&blind));
}

/// The first candidate's provider penalized, its first event measured at
/// 2 s over 40 samples; every other candidate healthy.
struct FirstProviderStruggling(usize);

impl HealthView for FirstProviderStruggling {
    fn health(&self, candidate: &Candidate) -> CandidateHealth {
        let mut health = CandidateHealth::default();
        if candidate.provider == self.0 {
            health.penalized = true;
            health.stats.samples = 40;
            health.stats.ttft_ms = Some(2_000);
        }
        health
    }
}

/// `on` rules, `keep` and timeouts are candidate places: they read the
/// candidates' health as it is when the plan runs, not a healthy default.
#[test]
fn on_rules_keep_and_timeouts_read_the_candidates_health() {
    let snapshot = two_providers(
        "health-while-running",
        "models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n\
         failover {\n  attempts 2\n  keep not health.penalized\n  \
         on 5xx when health.penalized => stop, error no_route\n  \
         on any => next, error upstream_failed\n}\n\
         timeouts {\n  first_token coalesce(stats.ttft * 3, 10s)\n}",
    );
    let body = json!({"model": "small-chat", "messages": []});
    let decision = decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[]);
    let plan = decision.result.unwrap();
    assert_eq!(plan.candidates.len(), 2);
    let outcome = AttemptOutcome {
        class: OutcomeClass::Status(503),
        facts: OutcomeFacts {
            status: Some(503),
            ..OutcomeFacts::default()
        },
    };
    let react = |health: &dyn HealthView| {
        let reaction = plan.react(&snapshot, health, 0, &outcome, Progress::default(), &|_| 0);
        (reaction.action, reaction.rule)
    };
    let struggling = FirstProviderStruggling(plan.candidates[0].provider);
    assert_eq!(react(&Healthy), (Action::Next, Some(1)));
    assert_eq!(react(&struggling), (Action::Stop, Some(0)));

    assert_eq!(plan.timeouts(&snapshot, &Healthy, 0).first_token_ms, 10_000);
    assert_eq!(
        plan.timeouts(&snapshot, &struggling, 0).first_token_ms,
        6_000
    );
    assert_eq!(
        plan.timeouts(&snapshot, &struggling, 1).first_token_ms,
        10_000
    );

    // `keep` is asked of the next candidate: a penalized one is passed over.
    let penalized_second = FirstProviderStruggling(plan.candidates[1].provider);
    assert_eq!(
        plan.next_candidate(&snapshot, &Healthy, (&[0], None), &|_| true),
        NextCandidate::Try(1)
    );
    assert_eq!(
        plan.next_candidate(&snapshot, &penalized_second, (&[0], None), &|_| true),
        NextCandidate::Done
    );
}

/// A `model` input takes an alias of one model as that model's id, as
/// `model.id` reads it; an alias of several models stays the alias, which
/// is no model's id.
#[test]
fn a_model_input_named_by_an_alias_is_its_model_id() {
    let catalog = format!("{TWO_PROVIDERS}aliases:\n  both: [small-chat, \"alpha:small-chat\"]\n");
    let policy = "policy model_input {\n  catalog \"catalog.yaml\"\n  tenants \"tenants.yaml\"\n}\n\
        input wanted from body \"wanted\" : model\n  malformed error no_route\n  invalid error no_route\n  unknown error unknown_model\n\
        models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n\
        eligibility {\n  require not present(input.wanted) or model.id == input.wanted else no_route\n}\n\
        failover {\n  attempts 2\n  on any => next, error upstream_failed\n}\n\
        errors {\n  no_route = 503, \"no provider can serve this model\"\n  \
        unknown_model = 404, \"there is no such model\"\n  \
        upstream_failed = 502, \"every provider failed\"\n}\n";
    let files = [
        ("catalog.yaml", catalog),
        ("tenants.yaml", ONE_TENANT.to_string()),
        ("policy.policy", policy.to_string()),
    ];
    let snapshot = compiled_from("model-input", &files, "policy.policy");
    let ask = |wanted: &str| {
        let body = json!({"model": "small-chat", "wanted": wanted, "messages": []});
        decide(&snapshot, "acme-dev", Endpoint::ChatCompletions, body, &[])
    };
    for wanted in ["small-chat", "small"] {
        let decision = ask(wanted);
        assert_eq!(
            providers(&snapshot, &decision),
            ["alpha", "beta"],
            "{wanted}"
        );
    }
    let (status, code) = refused(&ask("both"));
    assert_eq!((status, code.as_str()), (503, "no_route"));
    let (status, code) = refused(&ask("nothing-of-the-sort"));
    assert_eq!((status, code.as_str()), (404, "unknown_model"));
}

/// `share` shuffles the leading candidates within P% of the first one's
/// key, on either side: behind an order that did not sort by the key, a far
/// better candidate is no close rival of the first and stays where it is.
#[test]
fn share_takes_only_candidates_within_its_margin_of_the_first() {
    let snapshot = two_providers(
        "share-margin",
        "models {\n  credentials one by credential.owned desc else no_route\n  unknown error unknown_model\n}\n\
         order {\n  by coalesce(route.price.input, 0) desc\n}\n\
         balance share by coalesce(route.price.input, 0) within 10%",
    );
    let body = json!({"model": "small-chat", "messages": []});
    for seed in 0..16 {
        let context = RequestContext {
            id: std::sync::Arc::from("req-1"),
            endpoint: Endpoint::ChatCompletions,
            body: Ok(&body),
            body_bytes: 40,
            headers: &[],
            caller: caller(&snapshot, "acme-dev"),
            seed,
            rotation: &0,
        };
        let decision = evaluate(&snapshot, &context, &Healthy);
        // beta (0.2) first by the order; alpha (0.1) is half of it.
        assert_eq!(
            providers(&snapshot, &decision),
            ["beta", "alpha"],
            "seed {seed}"
        );
    }
}
