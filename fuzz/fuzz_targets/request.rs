//! A request (endpoint, caller, headers, body) → the evaluator, against each
//! of the five shipped policies, then the execution terms of the plan:
//! failover order, `keep`, timeouts, reactions to outcomes, headers, errors.
//! The provider's failed answer the reactions see (status, `Retry-After`,
//! error code, type and message) comes from the input too: it is as
//! untrusted as the request.
//!
//! Besides crashes, the target checks that `evaluate` (what the proxy calls,
//! running the snapshot's compiled terms) and `evaluate_traced` (what
//! `explain` and `switchyard test` call, interpreting the staged terms)
//! decide the same, and that the body's members the evaluator reads
//! (`body_as_read`, what the proxy gives it) decide as the whole body does.
//! The snapshots live for the whole run, so where a snapshot remembers plans
//! (Noirdoc, noeta), `evaluate` recalls those that earlier inputs made, and
//! the comparison checks them too.
//!
//! Input format (fuzz/seed.sh writes seeds this way from policies/*.tests.yaml):
//!
//! | byte | meaning |
//! |------|---------|
//! | 0    | policy, modulo 5, in the order of `POLICIES` |
//! | 1    | endpoint, modulo 5, in the order of `Endpoint::ALL` (chat_completions, completions, embeddings, responses, messages) |
//! | 2    | caller, modulo the number of callers: the tenants file's keys by index, then each tenant's workspaces without a key |
//! | 3    | load-balancing seed (`RequestContext::seed`) |
//! | 4    | rotation (`RequestContext::rotation`) |
//! | 5    | number of headers, modulo 4 |
//! | then | per header: a name byte (modulo the number of names, in the order of `HEADER_NAMES`), a length byte, that many bytes of value |
//! | 2    | the provider's status, big-endian, modulo 900, plus 100 (100 to 999, what an HTTP client can receive) |
//! | 1    | `Retry-After` length n, modulo 9: none for 0, else n bytes, big-endian, in milliseconds |
//! | 3 ×  | error code, type, message: a length byte, none for 0, else that many bytes minus one |
//! | 1    | the `on` rule's retries so far |
//! | 2    | time elapsed before the first attempt, big-endian, in 100 ms |
//! | rest | the body: JSON, or anything else (then the body is `None`) |
//!
//! Missing bytes read as 0. Every outcome class is reacted to, for each of
//! the first candidates of the failover sequence; a provider status with the
//! class `Status`, the other facts with all of them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use switchyard::compile::{AllSecrets, Snapshot, compile_file};
use switchyard::evaluate::health::Healthy;
use switchyard::evaluate::{
    AttemptOutcome, Caller, Endpoint, OutcomeClass, OutcomeFacts, Plan, Progress, Refusal,
    NOT_AN_OBJECT, RequestContext, body_as_read, evaluate, evaluate_traced,
};
use switchyard::language::ir::InputSourceKind;

const POLICIES: [&str; 5] = ["ai-setu", "anonrouter", "ngrok", "noeta", "noirdoc"];

/// Header names by index: the shipped policies' header inputs and a few
/// that no policy reads. Header inputs a policy declares that are not here
/// are appended (so a new one is exercised without a change here, while the
/// indices of these, which the seeds use, stay put).
const HEADER_NAMES: [&str; 6] = [
    "x-ai-setu-provider-order",
    "x-anonrouter-e2ee",
    "x-anonrouter-ticket-provider",
    "authorization",
    "content-type",
    "x-request-id",
];

/// Candidates whose execution terms are evaluated, at most.
const MAX_CANDIDATES: usize = 6;

struct Policy {
    snapshot: Snapshot,
    callers: Vec<Caller>,
}

struct World {
    policies: Vec<Policy>,
    header_names: Vec<String>,
}

static WORLD: OnceLock<World> = OnceLock::new();

fn world() -> &'static World {
    WORLD.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let mut header_names: Vec<String> = HEADER_NAMES.iter().map(|n| n.to_string()).collect();
        let policies = POLICIES
            .iter()
            .map(|name| {
                let path = dir.join(format!("{name}.policy"));
                let snapshot = match compile_file(&path, &AllSecrets) {
                    Ok(snapshot) => snapshot,
                    Err(report) => panic!(
                        "{} does not compile: {:#?}",
                        path.display(),
                        report.diagnostics
                    ),
                };
                for spec in &snapshot.program.inputs {
                    if spec.source == InputSourceKind::Header && !header_names.contains(&spec.field)
                    {
                        header_names.push(spec.field.clone());
                    }
                }
                let tenants = &snapshot.data.tenants;
                let mut callers: Vec<Caller> = tenants
                    .keys
                    .iter()
                    .enumerate()
                    .map(|(index, key)| Caller {
                        tenant: key.tenant,
                        workspace: key.workspace,
                        key: Some(index),
                    })
                    .collect();
                for (tenant, t) in tenants.tenants.iter().enumerate() {
                    for workspace in 0..t.workspaces.len().max(1) {
                        callers.push(Caller {
                            tenant,
                            workspace,
                            key: None,
                        });
                    }
                }
                assert!(!callers.is_empty(), "{name} has no tenants");
                Policy { snapshot, callers }
            })
            .collect();
        World {
            policies,
            header_names,
        }
    })
}

/// Reads the input front to back; past the end, bytes read as 0.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&first, rest)) => {
                self.0 = rest;
                first
            }
            None => 0,
        }
    }

    fn bytes(&mut self, count: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(count.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    /// A length byte: 0 for none, else that many bytes minus one.
    fn text(&mut self) -> Option<Arc<str>> {
        let length = usize::from(self.byte()).checked_sub(1)?;
        Some(Arc::from(
            String::from_utf8_lossy(self.bytes(length)).as_ref(),
        ))
    }

    /// A length byte (modulo 9): 0 for none, else that many bytes, big-endian.
    fn number(&mut self) -> Option<u64> {
        let length = usize::from(self.byte() % 9);
        (length > 0)
            .then(|| (0..length).fold(0u64, |value, _| (value << 8) | u64::from(self.byte())))
    }
}

/// The outcome classes other than a status.
const CLASSES: [OutcomeClass; 6] = [
    OutcomeClass::ConnectError,
    OutcomeClass::Reset,
    OutcomeClass::Timeout,
    OutcomeClass::FirstTokenTimeout,
    OutcomeClass::Malformed,
    OutcomeClass::StreamBroken,
];

/// Whether two decisions are the same, traces aside.
fn same_decision(a: &Result<Plan, Refusal>, b: &Result<Plan, Refusal>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            a.candidates == b.candidates
                && a.attempts == b.attempts
                && a.budget_ms == b.budget_ms
                && a.capacity_wait_ms == b.capacity_wait_ms
        }
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

fuzz_target!(|bytes: &[u8]| {
    let world = world();
    let mut input = Input(bytes);
    let policy = &world.policies[usize::from(input.byte()) % world.policies.len()];
    let snapshot = &policy.snapshot;
    let endpoint = Endpoint::ALL[usize::from(input.byte()) % Endpoint::ALL.len()];
    let caller = policy.callers[usize::from(input.byte()) % policy.callers.len()];
    let seed = u64::from(input.byte());
    let rotation = u64::from(input.byte());
    let header_count = input.byte() % 4;
    let mut headers: Vec<(String, String)> = Vec::new();
    for _ in 0..header_count {
        let name = &world.header_names[usize::from(input.byte()) % world.header_names.len()];
        let length = usize::from(input.byte());
        let value = String::from_utf8_lossy(input.bytes(length)).into_owned();
        headers.push((name.clone(), value));
    }
    let status = 100 + input.u16() % 900;
    let facts = OutcomeFacts {
        status: None,
        retry_after_ms: input.number(),
        error_code: input.text(),
        error_type: input.text(),
        error_message: input.text(),
    };
    let retries = u32::from(input.byte());
    let elapsed_ms = u64::from(input.u16()) * 100;
    let outcomes: Vec<AttemptOutcome> = std::iter::once(AttemptOutcome {
        class: OutcomeClass::Status(status),
        facts: OutcomeFacts {
            status: Some(status),
            ..facts.clone()
        },
    })
    .chain(CLASSES.iter().map(|&class| AttemptOutcome {
        class,
        facts: facts.clone(),
    }))
    .collect();
    let body_bytes = input.0;
    let body: Option<serde_json::Value> = serde_json::from_slice(body_bytes).ok();

    let context = RequestContext {
        id: std::sync::Arc::from("fuzz"),
        endpoint,
        body: body.as_ref().ok_or(NOT_AN_OBJECT),
        body_bytes: body_bytes.len(),
        headers: &headers,
        caller,
        seed,
        rotation: &rotation,
    };
    let decision = evaluate_traced(snapshot, &context, &Healthy);
    let untraced = evaluate(snapshot, &context, &Healthy);
    assert!(
        same_decision(&decision.result, &untraced.result),
        "evaluate and evaluate_traced disagree:\n{:?}\n{:?}",
        decision.result,
        untraced.result
    );
    // The proxy gives the evaluator only the body members it reads.
    let read = body.as_ref().map(|body| body_as_read(snapshot, body));
    let lean = evaluate(
        snapshot,
        &RequestContext {
            body: read.as_ref().ok_or(NOT_AN_OBJECT),
            ..context
        },
        &Healthy,
    );
    assert!(
        same_decision(&untraced.result, &lean.result),
        "a body member the evaluator does not read changed its decision:\n{:?}\n{:?}",
        untraced.result,
        lean.result
    );
    let Ok(plan) = decision.result else {
        return;
    };

    let sequence = plan.failover_sequence(snapshot, &Healthy);
    let _ = plan.next_candidate(snapshot, &Healthy, (&[], None), &|index| index % 2 == 1);
    let _ = plan.listing(snapshot, &Healthy);
    let _ = plan.headers(snapshot, None, Progress::default(), false);
    let _ = plan.exhausted(snapshot, false, Some(1_500), None, Progress::default());
    if !plan.candidates.is_empty() {
        let _ = plan.headers(snapshot, Some(0), Progress::default(), true);
    }
    for (position, &candidate) in sequence.iter().take(MAX_CANDIDATES).enumerate() {
        let made = u32::try_from(position + 1).unwrap_or(u32::MAX);
        let progress = Progress {
            attempt: made,
            attempts: made,
            retries,
            elapsed_ms: elapsed_ms + 1_000 * position as u64,
            jitter: 0.5,
        };
        let _ = plan.timeouts(snapshot, &Healthy, candidate);
        let _ = plan.late_comment(snapshot, candidate);
        let _ = plan.headers(snapshot, Some(candidate), progress, position % 2 == 0);
        let _ = plan.exhausted(snapshot, true, None, Some(candidate), progress);
        if let Some(&first) = sequence.first()
            && candidate + 1 < plan.candidates.len()
        {
            let _ = plan.allows(snapshot, &Healthy, (first, candidate, None), candidate + 1);
            for outcome in &outcomes {
                let after = (first, candidate, Some(&outcome.facts));
                let _ = plan.allows(snapshot, &Healthy, after, candidate + 1);
            }
        }
        for outcome in &outcomes {
            let _ = plan.react(snapshot, &Healthy, candidate, outcome, progress, &|_| retries);
        }
    }
});
