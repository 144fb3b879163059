//! Evaluate: a pure, deterministic function of (snapshot, request, health)
//! to a [`Decision`] — an ordered attempt plan or the error the policy names
//! — with a trace of why. No clock, no randomness, no I/O: the time, the
//! health of providers and the load-balancing seed are inputs. A snapshot
//! may remember the plan it made for a caller, model, endpoint and input
//! values, where its policy's plans depend on nothing else (module `memo`);
//! a remembered plan is the plan that would be made afresh.
//!
//! During execution the proxy asks the same program what an attempt's
//! outcome means ([`Plan::react`]), which later candidates a `keep`
//! constraint allows, and which error and headers to answer with.

mod candidates;
pub(crate) mod compiled;
mod execution;
pub mod health;
mod inputs;
pub(crate) mod machine;
pub(crate) mod memo;
mod merge;
pub(crate) mod order;
mod shape;

pub use crate::data::Endpoint;
pub use execution::{
    Action, AfterCommit, AttemptOutcome, Ending, NextCandidate, OutcomeClass, Reaction, Timeouts,
    default_type, headers_before_decision,
};
pub use machine::{OutcomeFacts, Progress};
pub use order::Rng;

use crate::compile::{ModelName, Snapshot};
use crate::language::ir::{BalanceSpec, StepKind, StrategySpec};
use crate::source::Span;
use crate::value::Value;
use health::{AskedHealth, CandidateHealth, HealthView};
use machine::{Focus, Machine, Operand};
use serde_json::Value as Json;
use std::sync::Arc;

/// Who is asking: a tenant, one of its workspaces and, usually, a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller {
    pub tenant: usize,
    pub workspace: usize,
    pub key: Option<usize>,
}

/// A request as the evaluator sees it.
#[derive(Debug, Clone)]
pub struct RequestContext<'a> {
    /// Shared with the plan's request state, which keeps it.
    pub id: Arc<str>,
    pub endpoint: Endpoint,
    /// The parsed body, or why there is none (the built-in error's message
    /// for a body that is not a JSON object).
    pub body: Result<&'a Json, &'a str>,
    pub body_bytes: usize,
    /// Request headers, names in lowercase.
    pub headers: &'a [(String, String)],
    pub caller: Caller,
    /// Drives load balancing; the proxy draws one per request.
    pub seed: u64,
    /// Drives round-robin balancing: asked for a turn only when a
    /// `round_robin` balance applies. The proxy counts turns per model
    /// ([`round_robin_model`]); a number is a fixed turn.
    pub rotation: &'a dyn Turns,
}

/// Round-robin balancing's turns. The evaluator takes one only when a
/// `round_robin` balance applies, so requests that do not rotate (another
/// tenant's, one with an explicit order) leave a model's turns alone.
pub trait Turns: std::fmt::Debug + Sync {
    fn next_turn(&self) -> u64;
}

impl Turns for u64 {
    fn next_turn(&self) -> u64 {
        *self
    }
}

/// The model whose round-robin counter a request named `requested` (its
/// body's `model`) advances: the catalog model it names, directly, through
/// an alias (its first model) or a pin; `""` for any other text, which
/// shares one counter. `None` when the policy balances by no `round_robin`,
/// so no counter is needed.
pub fn round_robin_model<'s>(
    snapshot: &'s Snapshot,
    requested: &str,
    caller: Caller,
) -> Option<&'s str> {
    let rotates = |spec: &BalanceSpec| matches!(spec.strategy, StrategySpec::RoundRobin);
    if !snapshot.program.balance.iter().any(rotates) {
        return None;
    }
    let named = |id: &str| match snapshot.model_named(id)? {
        ModelName::Model(model) => Some(*model),
        ModelName::Alias(models) => models.first().copied(),
    };
    let model = named(requested)
        .or_else(|| {
            candidates::match_pin(snapshot, requested, caller.tenant)
                .and_then(|pin| named(pin.model_id))
        })
        .and_then(|model| snapshot.data.catalog.models.get(model));
    Some(model.map_or("", |model| model.id.as_str()))
}

/// Why a body that is JSON, but not an object, is refused.
pub const NOT_AN_OBJECT: &str = "the request body is not a JSON object";

/// The capabilities `request.parameters` can list, by the name routes list
/// in `capabilities`, in the order it lists them.
const CAPABILITIES: [&str; 5] = [
    "tools",
    "reasoning",
    "response_format",
    "logprobs",
    "web_search",
];

/// The capability a body field asks for, as an index into [`CAPABILITIES`].
fn capability_of(field: &str) -> Option<usize> {
    match field {
        "tools" | "tool_choice" | "functions" | "parallel_tool_calls" => Some(0),
        "reasoning" | "reasoning_effort" | "thinking" => Some(1),
        "response_format" => Some(2),
        "logprobs" => Some(3),
        "web_search_options" => Some(4),
        _ => None,
    }
}

/// Whether the evaluator reads the body's top-level member `name`: the
/// model, `stream`, the fields `request.parameters` looks at and the
/// policy's body inputs. Nothing else of a body can change a decision, so
/// the proxy makes a JSON tree of these members only.
pub fn reads_body_member(snapshot: &Snapshot, name: &str) -> bool {
    name == "model"
        || name == "stream"
        || capability_of(name).is_some()
        || snapshot.program.inputs.iter().any(|spec| {
            spec.source == crate::language::ir::InputSourceKind::Body && spec.field == name
        })
}

/// `body` as the proxy gives it to the evaluator: of an object, only the
/// members [`reads_body_member`] names; anything else as it is.
pub fn body_as_read(snapshot: &Snapshot, body: &Json) -> Json {
    match body {
        Json::Object(members) => Json::Object(
            members
                .iter()
                .filter(|(name, _)| reads_body_member(snapshot, name))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `request.parameters` for a body: one pass over its fields, values shared
/// between requests.
fn parameters_of(body: &serde_json::Map<String, Json>) -> Arc<[Value]> {
    static NAMES: std::sync::LazyLock<Vec<Value>> =
        std::sync::LazyLock::new(|| CAPABILITIES.into_iter().map(Value::string).collect());
    static NONE: std::sync::LazyLock<Arc<[Value]>> =
        std::sync::LazyLock::new(|| Arc::from(Vec::new()));
    let mut asked = [false; CAPABILITIES.len()];
    for (field, value) in body {
        if let Some(slot) = capability_of(field).and_then(|index| asked.get_mut(index))
            && !value.is_null()
        {
            *slot = true;
        }
    }
    if !asked.contains(&true) {
        return NONE.clone();
    }
    NAMES
        .iter()
        .zip(asked)
        .filter(|(_, asked)| *asked)
        .map(|(name, _)| name.clone())
        .collect()
}

/// Request-level values, fixed once inputs and merges are known. A plan
/// keeps them for the rest of the request.
#[derive(Debug, Clone)]
pub struct RequestState {
    pub id: Arc<str>,
    pub model: Arc<str>,
    pub endpoint: Endpoint,
    pub stream: bool,
    pub parameters: Arc<[Value]>,
    pub estimated_tokens: f64,
    pub caller: Caller,
    pub inputs: Vec<Value>,
    pub settings: Vec<Value>,
    pub merges: Vec<Value>,
}

impl RequestState {
    /// A request that reads as nothing: the compiler evaluates the
    /// catalog-only terms, which never look at it, against this.
    pub(crate) fn placeholder() -> RequestState {
        RequestState {
            id: Arc::from(""),
            model: Arc::from(""),
            endpoint: Endpoint::ChatCompletions,
            stream: false,
            parameters: Arc::from(Vec::new()),
            estimated_tokens: 0.0,
            caller: Caller {
                tenant: usize::MAX,
                workspace: usize::MAX,
                key: None,
            },
            inputs: Vec::new(),
            settings: Vec::new(),
            merges: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolutionKind {
    Bare,
    Alias,
    Pin,
    Unknown,
}

/// Which requested id a candidate came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    /// Position of its model among the requested models, aliases expanded.
    pub index: usize,
    pub kind: ResolutionKind,
    pub id: Arc<str>,
}

/// A route of a model with one credential.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The catalog model; `None` for an id the catalog does not know, served
    /// by an `unknown serve` tier.
    pub model: Option<usize>,
    pub route: Option<usize>,
    pub provider: usize,
    pub credential: usize,
    pub requested: Requested,
    /// Its route and credential's row in the snapshot's table of
    /// precomputed catalog parts, found once when the candidate is made so
    /// a read of one is a single index; `None` outside the catalog.
    pub static_row: Option<usize>,
}

impl Candidate {
    /// The model name its provider is sent: its route's upstream model, or
    /// for an id the catalog does not know, the id as the client sent it.
    /// Read from the snapshot rather than kept per candidate, so a
    /// candidate counts no reference to it.
    pub fn upstream_model<'s>(&'s self, snapshot: &'s Snapshot) -> &'s Arc<str> {
        self.model
            .zip(self.route)
            .and_then(|(model, route)| snapshot.interned.route_upstream.get(model)?.get(route))
            .unwrap_or(&self.requested.id)
    }

    /// A catalog route with one of its provider's credentials, requested by
    /// its own id, for computing the precomputed table itself (so it has no
    /// row in it yet).
    pub(crate) fn of_route(
        model: usize,
        route_index: usize,
        route: &crate::data::Route,
        credential: usize,
    ) -> Candidate {
        Candidate {
            model: Some(model),
            route: Some(route_index),
            provider: route.provider,
            credential,
            requested: Requested {
                index: 0,
                kind: ResolutionKind::Bare,
                id: Arc::from(""),
            },
            static_row: None,
        }
    }
}

/// The error object a request ends with.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorResponse {
    pub status: u16,
    /// The error's name in the policy.
    pub code: String,
    pub message: String,
    pub error_type: String,
    pub retry_after_secs: Option<u64>,
    /// Whether a client should send the request again, for the official
    /// SDKs' `x-should-retry`; absent leaves it to their own rules.
    pub should_retry: Option<bool>,
}

impl ErrorResponse {
    /// The headers the error itself adds to its answer: `retry-after` in
    /// whole seconds and `x-should-retry`, when it gives them.
    pub fn advice_headers(&self) -> Vec<(&'static str, String)> {
        let retry_after = self
            .retry_after_secs
            .map(|secs| ("retry-after", secs.to_string()));
        let should_retry = self
            .should_retry
            .map(|retry| ("x-should-retry", retry.to_string()));
        retry_after.into_iter().chain(should_retry).collect()
    }
}

/// What the client gets instead of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub error: ErrorResponse,
    pub headers: Vec<(String, String)>,
}

/// An ordered attempt plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Held by value: only the plan's own attempts read it, and a shared
    /// handle would cost an allocation per request.
    pub request: RequestState,
    /// In attempt order: the first, then the rest as `reorder` puts them.
    pub candidates: Vec<Candidate>,
    /// How many distinct candidates may be tried.
    pub attempts: usize,
    pub budget_ms: Option<u64>,
    pub capacity_wait_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub result: Result<Plan, Refusal>,
    pub trace: Recorded,
}

/// A decision's [`Trace`], made on the first thing recorded in it. An
/// untraced decision that ends in a plan records nothing, and then carries
/// and drops one pointer instead of a trace of empty vectors.
#[derive(Debug, Clone, Default)]
pub struct Recorded(Option<Box<Trace>>);

/// What an empty [`Recorded`] reads as.
static NOTHING_RECORDED: Trace = Trace {
    model: String::new(),
    inputs: Vec::new(),
    merges: Vec::new(),
    candidates: Vec::new(),
    steps: Vec::new(),
    keys: Vec::new(),
    balance: None,
    reordered_by: None,
    refused: None,
    refused_by: None,
};

impl std::ops::Deref for Recorded {
    type Target = Trace;

    fn deref(&self) -> &Trace {
        self.0.as_deref().unwrap_or(&NOTHING_RECORDED)
    }
}

impl std::ops::DerefMut for Recorded {
    fn deref_mut(&mut self) -> &mut Trace {
        self.0.get_or_insert_with(Box::default)
    }
}

/// Why a decision came out as it did.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub model: String,
    pub inputs: Vec<(String, Value)>,
    pub merges: Vec<(String, Value)>,
    pub candidates: Vec<CandidateTrace>,
    pub steps: Vec<StepTrace>,
    /// The sort keys applied, in order.
    pub keys: Vec<KeyTrace>,
    pub balance: Option<Span>,
    /// The `reorder` statement (its first key), when it put the candidates
    /// after the first in another order than the sort's.
    pub reordered_by: Option<Span>,
    /// What ended the request, when it was refused.
    pub refused: Option<String>,
    /// Where the rule that refused it is written, when one rule did.
    pub refused_by: Option<Span>,
}

/// A sort key: where it is written, its direction, where absent values
/// go, the named sort it came from.
#[derive(Debug, Clone)]
pub struct KeyTrace {
    pub span: Span,
    pub descending: bool,
    pub nulls_first: bool,
    pub sort: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CandidateTrace {
    pub candidate: Candidate,
    /// Provider, credential and model, for people.
    pub label: String,
    /// The step that removed it, as an index into `Trace::steps`.
    pub removed_by: Option<usize>,
    /// Its sort key values.
    pub keys: Vec<Value>,
    /// Its position in the plan.
    pub position: Option<usize>,
    pub health: CandidateHealth,
}

#[derive(Debug, Clone)]
pub struct StepTrace {
    pub span: Span,
    /// `require … else ERROR` or `prefer exclusively`.
    pub label: String,
    pub kept: usize,
    pub removed: usize,
}

/// Decides a request. The trace holds only why a request was refused; use
/// [`evaluate_traced`] for the full account.
pub fn evaluate(
    snapshot: &Snapshot,
    context: &RequestContext<'_>,
    health: &dyn HealthView,
) -> Decision {
    decision(snapshot, context, health, Mode::Remembering)
}

/// Decides a request as [`evaluate`] does, but makes its plan afresh even
/// when the snapshot remembers one (to compare the two).
pub fn evaluate_afresh(
    snapshot: &Snapshot,
    context: &RequestContext<'_>,
    health: &dyn HealthView,
) -> Decision {
    decision(snapshot, context, health, Mode::Afresh)
}

/// Decides a request and records every step, candidate and key value, for
/// `explain` and policy tests. Its plan is always made afresh.
pub fn evaluate_traced(
    snapshot: &Snapshot,
    context: &RequestContext<'_>,
    health: &dyn HealthView,
) -> Decision {
    decision(snapshot, context, health, Mode::Traced)
}

fn decision(
    snapshot: &Snapshot,
    context: &RequestContext<'_>,
    health: &dyn HealthView,
    mode: Mode,
) -> Decision {
    let mut trace = Recorded::default();
    let result = decide(snapshot, context, health, &mut trace, mode);
    Decision { result, trace }
}

/// How [`decide`] makes a plan.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Recalls the snapshot's plan for the request's key, or makes one and
    /// keeps it.
    Remembering,
    /// Makes the plan, running the steps and sort keys as compiled.
    Afresh,
    /// Makes the plan from the terms as written, recording each step.
    Traced,
}

fn decide(
    snapshot: &Snapshot,
    context: &RequestContext<'_>,
    health_view: &dyn HealthView,
    trace: &mut Recorded,
    mode: Mode,
) -> Result<Plan, Refusal> {
    let tracing = mode == Mode::Traced;
    let program = &snapshot.program;
    let Some(body) = context.body.ok().and_then(Json::as_object) else {
        let problem = context.body.err().unwrap_or(NOT_AN_OBJECT);
        trace.refused = Some(problem.to_string());
        return Err(execution::malformed_body_refusal(
            snapshot, context, problem,
        ));
    };
    let (model, model_named) = requested_model(
        snapshot,
        body.get("model").and_then(Json::as_str).unwrap_or(""),
    );
    if tracing {
        trace.model = model.to_string();
    }
    let mut request = RequestState {
        id: context.id.clone(),
        model,
        endpoint: context.endpoint,
        stream: context.endpoint.streams()
            && body.get("stream").and_then(Json::as_bool).unwrap_or(false),
        parameters: parameters_of(body),
        estimated_tokens: (context.body_bytes / 4) as f64,
        caller: context.caller,
        inputs: Vec::with_capacity(program.inputs.len()),
        settings: Vec::new(),
        merges: Vec::new(),
    };
    request.settings = resolve_settings(snapshot, &request, model_named);

    // Inputs.
    let mut joined_lines = String::new();
    for spec in &program.inputs {
        if let Some(unless) = &spec.unless
            && Machine::new(snapshot, &request, &[], &[]).truth(unless, &Focus::default())
        {
            request.inputs.push(Value::Null);
            continue;
        }
        let raw = match spec.source {
            crate::language::ir::InputSourceKind::Body => {
                body.get(&spec.field).map(inputs::Raw::Json)
            }
            crate::language::ir::InputSourceKind::Header => {
                let mut lines = context
                    .headers
                    .iter()
                    .filter(|(name, _)| *name == spec.field)
                    .map(|(_, value)| value.as_str());
                let first = lines.next();
                let mut more = lines.peekable();
                match (first, &spec.ty) {
                    // A list given on several lines is one list, its
                    // lines joined by commas (RFC 9110, section 5.3).
                    (Some(first), crate::language::ir::InputType::Csv(_))
                        if more.peek().is_some() =>
                    {
                        joined_lines.clear();
                        joined_lines.push_str(first);
                        for line in more {
                            joined_lines.push(',');
                            joined_lines.push_str(line);
                        }
                        Some(inputs::Raw::Text(joined_lines.as_str()))
                    }
                    (first, _) => first.map(inputs::Raw::Text),
                }
            }
        };
        let mut expand = |spec: &crate::language::ir::InputSpec, value: Value| {
            let Some((_, term)) = &spec.shorthand else {
                return value;
            };
            let mut machine = Machine::new(snapshot, &request, &[], &[]);
            machine.shorthand = Some(value);
            machine.eval(term, &Focus::default())
        };
        match inputs::parse_input(snapshot, spec, raw, &mut expand) {
            Ok(value) => {
                if tracing && !value.is_null() {
                    trace.inputs.push((spec.name.clone(), value.clone()));
                }
                request.inputs.push(value);
            }
            Err(problem) => {
                trace.refused = Some(problem.detail);
                // The error may read the request (its id, the inputs read
                // so far); the rest are absent.
                request.inputs.resize(program.inputs.len(), Value::Null);
                request.merges = vec![Value::Null; program.merges.len()];
                let mut machine = Machine::new(snapshot, &request, &[], &[]);
                return Err(execution::refusal_with(
                    snapshot,
                    problem.error,
                    &mut machine,
                    None,
                ));
            }
        }
    }

    // Validation, then merges.
    if !program.rejects.is_empty() || !program.merges.is_empty() {
        let mut machine = Machine::new(snapshot, &request, &[], &[]);
        for reject in &program.rejects {
            if machine.truth(&reject.condition, &Focus::default()) {
                trace.refused = Some(String::from("a `validate` rule rejected the request"));
                trace.refused_by = Some(reject.span);
                return Err(execution::refusal_with(
                    snapshot,
                    reject.error,
                    &mut machine,
                    None,
                ));
            }
        }
        let mut merges = Vec::with_capacity(program.merges.len());
        for (index, spec) in program.merges.iter().enumerate() {
            let value = machine.merge(index);
            if let Some(error) = spec.strict {
                let requested = machine.eval(&spec.request, &Focus::default());
                if !requested.is_null() && requested != value {
                    trace.refused = Some(format!("`{}` may only tighten the default", spec.name));
                    return Err(execution::refusal_with(snapshot, error, &mut machine, None));
                }
            }
            if tracing {
                trace.merges.push((spec.name.clone(), value.clone()));
            }
            merges.push(value);
        }
        request.merges = merges;
    }

    // A plan made before for the same caller, name, endpoint and inputs,
    // when the policy's plans depend on nothing else.
    let remembering = mode == Mode::Remembering && snapshot.plans.applies();
    if remembering
        && let Some(recalled) = snapshot.plans.recall(&request, |plan| {
            (
                plan.candidates.to_vec(),
                plan.attempts,
                plan.budget_ms,
                plan.capacity_wait_ms,
            )
        })
    {
        let (candidates, attempts, budget_ms, capacity_wait_ms) = recalled;
        return Ok(Plan {
            request,
            candidates,
            attempts,
            budget_ms,
            capacity_wait_ms,
        });
    }

    // Candidates.
    let candidates = match candidates::resolve(snapshot, &request, model_named) {
        Ok(candidates) => candidates,
        Err(unresolved) => {
            trace.refused = Some(unresolved.detail);
            let mut machine = Machine::new(snapshot, &request, &[], &[]);
            return Err(execution::refusal_with(
                snapshot,
                unresolved.error,
                &mut machine,
                None,
            ));
        }
    };
    let health = AskedHealth::new(health_view, &candidates);
    if tracing {
        trace.candidates = candidates
            .iter()
            .zip(health.all())
            .map(|(candidate, health)| CandidateTrace {
                candidate: candidate.clone(),
                label: label(snapshot, candidate),
                removed_by: None,
                keys: Vec::new(),
                position: None,
                health: health.clone(),
            })
            .collect();
    }

    let mut machine = Machine::new(snapshot, &request, &candidates, &[]);
    machine.health = machine::Health::Asked(&health);
    // Untraced, the steps and sort keys run as compiled; traced, as written
    // (the property tests and the fuzz target compare the two).
    let compiled = (!tracing).then_some(&snapshot.compiled);
    // What the snapshot settled per catalog row (steps per endpoint, the
    // ranks of sort keys) applies only if every candidate has a row.
    let in_catalog = candidates.iter().all(|c| c.static_row.is_some());

    // Eligibility. What a step keeps is a subsequence of what it found, so
    // it is kept in place.
    let mut remaining: Vec<usize> = (0..candidates.len()).collect();
    // Whether the machine's set differs from `remaining`: most steps keep
    // every candidate, and then the set is not compared again.
    let mut set_changed = false;
    for (step_index, step) in program.steps.iter().enumerate() {
        // The set as the step found it, also for the error a refusal reads.
        if set_changed {
            machine.set_candidates(&remaining);
        }
        let found = remaining.len();
        // A condition the request alone settles is not asked per candidate
        // (for a single candidate, asking is no dearer than settling).
        let settled = if remaining.len() > 1 {
            match compiled {
                Some(code) => code.settled(step_index, &mut machine),
                None => snapshot
                    .guards
                    .get(step_index)
                    .and_then(|g| machine.settled(g)),
            }
        } else {
            None
        };
        match settled {
            Some(true) => {}
            Some(false) => remaining.clear(),
            None => {
                let condition: &dyn Operand = match compiled.and_then(|c| c.steps.get(step_index)) {
                    Some(code) => code,
                    None => &step.condition,
                };
                if snapshot.once_per_set.get(step_index) == Some(&true) {
                    // The same for every candidate: asked of the first.
                    if let Some(&first) = remaining.first()
                        && !condition.truth(&mut machine, &Focus::on(first))
                    {
                        remaining.clear();
                    }
                } else {
                    let rows = snapshot.statics.rows();
                    let by_row = compiled.filter(|_| in_catalog).and_then(|code| {
                        code.settled_by_endpoint(step_index, request.endpoint, rows)
                    });
                    remaining.retain(|candidate| {
                        let looked_up = by_row.and_then(|by_row| {
                            let row = candidates.get(*candidate)?.static_row?;
                            by_row.get(row).copied()
                        });
                        looked_up.unwrap_or_else(|| {
                            condition.truth(&mut machine, &Focus::on(*candidate))
                        })
                    });
                }
            }
        }
        // An exclusive preference that nothing satisfies keeps everything:
        // the set as the step found it, which the machine holds.
        if remaining.is_empty() && step.kind == StepKind::PreferExclusively {
            remaining.extend_from_slice(&machine.set);
        }
        if tracing {
            // What the step removed: the set it found less what it kept,
            // both in the same order.
            let mut kept = remaining.iter().peekable();
            for candidate in &machine.set {
                if kept.next_if_eq(&candidate).is_none()
                    && let Some(entry) = trace.candidates.get_mut(*candidate)
                {
                    entry.removed_by = Some(step_index);
                }
            }
            let label = match &step.kind {
                StepKind::Require(error) => {
                    format!("require … else {}", execution::error_name(snapshot, *error))
                }
                StepKind::PreferExclusively => String::from("prefer exclusively …"),
            };
            trace.steps.push(StepTrace {
                span: step.span,
                label,
                kept: remaining.len(),
                removed: found - remaining.len(),
            });
        }
        if remaining.is_empty()
            && let StepKind::Require(error) = step.kind
        {
            trace.refused = Some(format!("no candidate passed step {}", step_index + 1));
            return Err(execution::refusal_with(snapshot, error, &mut machine, None));
        }
        set_changed = remaining.len() != found;
    }

    // Order, then balance.
    if set_changed {
        machine.set_candidates(&remaining);
    }
    if let Some(code) = compiled {
        let keys = code.order_keys(&mut machine, in_catalog);
        order::sort_by_chosen(&mut machine, &mut remaining, &keys);
    } else {
        let keys = order::order_keys(&mut machine, &program.order);
        trace.keys = keys
            .iter()
            .map(|key| KeyTrace {
                span: key.spec.term.span,
                descending: key.spec.descending,
                nulls_first: key.spec.nulls_first,
                sort: key.sort.map(str::to_string),
            })
            .collect();
        for (candidate, key_values) in
            order::sort_by_keys_traced(&mut machine, &mut remaining, &keys)
        {
            if let Some(entry) = trace.candidates.get_mut(candidate) {
                entry.keys = key_values;
            }
        }
    }
    let mut ordered = remaining;
    // A balanced order draws on the request's seed: its plan is not
    // remembered.
    let mut balanced = false;
    for spec in &program.balance {
        let applies = match &spec.when {
            Some(when) => machine.truth(when, &Focus::default()),
            None => true,
        };
        if applies {
            order::balance(
                &mut machine,
                &mut ordered,
                &spec.strategy,
                context.seed,
                context.rotation,
            );
            if tracing {
                trace.balance = Some(spec.span);
            }
            balanced = true;
            break;
        }
    }

    // The plan: the first, then the rest as `reorder` says.
    if let Some(rest) = ordered.get_mut(1..) {
        let sorted = tracing.then(|| rest.to_vec());
        match compiled {
            Some(code) => {
                let keys = code.reorder.for_candidates(in_catalog);
                order::sort_by_keys(&mut machine, rest, keys);
            }
            None => order::sort_by_keys(&mut machine, rest, &program.failover.reorder),
        }
        if sorted.is_some_and(|sorted| sorted != rest) {
            trace.reordered_by = program.failover.reorder.first().map(|key| key.term.span);
        }
    }
    let attempts = machine
        .eval(&program.failover.attempts, &Focus::default())
        .as_number()
        .filter(|n| *n >= 1.0)
        .map_or(1, |n| n.min(1e6) as usize);
    let budget_ms = program
        .failover
        .budget
        .as_ref()
        .and_then(|(limit, _)| machine.eval(limit, &Focus::default()).as_duration());
    let capacity_wait_ms = program
        .capacity_wait
        .as_ref()
        .and_then(|wait| machine.eval(wait, &Focus::default()).as_duration())
        .unwrap_or(0);
    if tracing {
        for (position, candidate) in ordered.iter().enumerate() {
            if let Some(entry) = trace.candidates.get_mut(*candidate) {
                entry.position = Some(position);
            }
        }
    }
    // The machine's set is done with: its room holds the ranks.
    let mut rank = std::mem::take(&mut machine.set);
    // The candidates move into the plan in attempt order, in place: the
    // unplanned dropped, then each moved to its position.
    rank.clear();
    rank.resize(candidates.len(), usize::MAX);
    for (position, candidate) in ordered.iter().enumerate() {
        if let Some(slot) = rank.get_mut(*candidate) {
            *slot = position;
        }
    }
    let mut planned = candidates;
    let mut index = 0;
    planned.retain(|_| {
        let keep = rank.get(index).is_some_and(|r| *r != usize::MAX);
        index += 1;
        keep
    });
    rank.retain(|r| *r != usize::MAX);
    for slot in 0..rank.len() {
        while let Some(&target) = rank.get(slot).filter(|target| **target != slot) {
            if target >= rank.len() {
                break;
            }
            planned.swap(slot, target);
            rank.swap(slot, target);
        }
    }
    let plan = Plan {
        request,
        candidates: planned,
        attempts,
        budget_ms,
        capacity_wait_ms,
    };
    if remembering && !balanced {
        snapshot.plans.remember(&plan);
    }
    Ok(plan)
}

/// The requested model's id as the request holds it: the catalog's own
/// text when it is a model's id, so the request shares it; and what the
/// catalog names so, looked up once for candidate resolution too.
fn requested_model<'s>(snapshot: &'s Snapshot, name: &str) -> (Arc<str>, Option<&'s ModelName>) {
    let named = snapshot.model_named(name);
    let shared = match named {
        Some(ModelName::Model(model)) => snapshot.interned.model_id.get(*model),
        _ => None,
    };
    let id = match shared {
        Some(Value::String(id)) if **id == *name => id.clone(),
        _ => Arc::from(name),
    };
    (id, named)
}

/// The catalog model whose settings the per-model layers give: the
/// requested model by its id, by an alias for it alone, or by a pin. An
/// alias for several models, or an id the catalog does not know, has none.
fn settings_model(
    snapshot: &Snapshot,
    request: &RequestState,
    named: Option<&ModelName>,
) -> Option<usize> {
    // Pins first, as candidates are resolved.
    let named = match candidates::match_pin(snapshot, &request.model, request.caller.tenant) {
        Some(pinned) => snapshot.model_named(pinned.model_id)?,
        None => named?,
    };
    match named {
        ModelName::Model(model) => Some(*model),
        ModelName::Alias(models) => match models.as_slice() {
            [model] => Some(*model),
            _ => None,
        },
    }
}

/// `defaults.NAME`: the first layer that sets it, else its declared default.
fn resolve_settings(
    snapshot: &Snapshot,
    request: &RequestState,
    model_named: Option<&ModelName>,
) -> Vec<Value> {
    let data = &snapshot.data;
    let tenant = data.tenants.tenants.get(request.caller.tenant);
    let workspace = tenant.and_then(|t| t.workspaces.get(request.caller.workspace));
    let key = request.caller.key.and_then(|k| data.tenants.keys.get(k));
    let model = settings_model(snapshot, request, model_named)
        .and_then(|model| data.catalog.models.get(model))
        .map(|model| model.id.as_str());
    data.schema
        .settings
        .entries
        .iter()
        .enumerate()
        .map(|(index, decl)| {
            snapshot
                .program
                .layers
                .iter()
                .find_map(|layer| {
                    let settings = match layer.level {
                        crate::language::ast::Level::Key => key.map(|k| &k.settings),
                        crate::language::ast::Level::Workspace => workspace.map(|w| &w.settings),
                        crate::language::ast::Level::Tenant => tenant.map(|t| &t.settings),
                    }?;
                    if layer.per_model {
                        settings
                            .per_model
                            .iter()
                            .find(|(id, _)| Some(id.as_str()) == model)
                            .and_then(|(_, values)| values.get(index))
                            .cloned()
                    } else {
                        settings.all_models.get(index).cloned()
                    }
                })
                .or_else(|| decl.default.clone())
                .unwrap_or(Value::Null)
        })
        .collect()
}

/// `provider/credential → model`, for traces and `explain`.
pub fn label(snapshot: &Snapshot, candidate: &Candidate) -> String {
    let provider = snapshot.provider(candidate.provider);
    let credential = snapshot.credential(candidate.provider, candidate.credential);
    format!(
        "{} ({}) {}",
        provider.map_or("?", |p| p.id.as_str()),
        credential.map_or("?", |c| c.id.as_str()),
        candidate.upstream_model(snapshot)
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::compile::{AllSecrets, compile_file};
    use health::Healthy;

    /// A shipped policy (`policies/NAME.policy`), every secret set.
    pub(crate) fn shipped(name: &str) -> Snapshot {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("policies/{name}.policy"));
        compile_file(&path, &AllSecrets).expect("the policy compiles")
    }

    /// A chat completion with `body` from the snapshot's key number `index`.
    fn chat_from_key<'a>(snapshot: &Snapshot, index: usize, body: &'a Json) -> RequestContext<'a> {
        let key = &snapshot.data.tenants.keys[index];
        RequestContext {
            id: Arc::from("test"),
            endpoint: Endpoint::ChatCompletions,
            body: Ok(body),
            body_bytes: 64,
            headers: &[],
            caller: Caller {
                tenant: key.tenant,
                workspace: key.workspace,
                key: Some(index),
            },
            seed: 0,
            rotation: &0,
        }
    }

    fn decide_for(key_id: &str, body: &Json, traced: bool) -> Decision {
        let snapshot = shipped("noirdoc");
        let index = snapshot
            .data
            .tenants
            .keys
            .iter()
            .position(|key| key.id == key_id)
            .expect("the key is in noirdoc's tenants");
        let context = chat_from_key(&snapshot, index, body);
        if traced {
            evaluate_traced(&snapshot, &context, &Healthy)
        } else {
            evaluate(&snapshot, &context, &Healthy)
        }
    }

    #[test]
    fn round_robin_counts_per_catalog_model_and_only_when_the_policy_rotates() {
        let setu = shipped("ai-setu");
        let caller = Caller {
            tenant: 0,
            workspace: 0,
            key: None,
        };
        let model = |requested| round_robin_model(&setu, requested, caller);
        assert_eq!(model("claude-sonnet-4-5"), Some("claude-sonnet-4-5"));
        assert_eq!(model("vertex/claude-sonnet-4-5"), Some("claude-sonnet-4-5"));
        assert_eq!(model("no-such-model"), Some(""));
        assert_eq!(model("vertex/no-such-model"), Some(""));
        assert_eq!(
            round_robin_model(&shipped("noirdoc"), "gpt-5", caller),
            None
        );
    }

    #[test]
    fn a_step_asked_once_per_set_decides_as_asking_every_candidate_does() {
        let once = shipped("ngrok");
        let mut each = shipped("ngrok");
        assert!(
            once.once_per_set.contains(&true),
            "ngrok has a step asked once per set"
        );
        each.once_per_set
            .iter_mut()
            .for_each(|asked_once| *asked_once = false);
        let bodies = [
            serde_json::json!({"model": "gpt-4o", "models": ["claude-sonnet-4-5"]}),
            serde_json::json!({"model": "openrouter:gpt-4o"}),
            serde_json::json!({"model": "llama-3.3-70b"}),
            serde_json::json!({"model": "groq:llama-3.3-70b"}),
            serde_json::json!({"models": ["groq:llama-3.3-70b", "gpt-4o"]}),
            serde_json::json!({"model": "gpt-4o", "models": ["openrouter:gpt-4o-mini"]}),
        ];
        for (index, key) in once.data.tenants.keys.iter().enumerate() {
            for body in &bodies {
                let context = chat_from_key(&once, index, body);
                let outcome = |snapshot: &Snapshot| match evaluate_afresh(
                    snapshot, &context, &Healthy,
                )
                .result
                {
                    Ok(plan) => format!("{:?}", plan.candidates),
                    Err(refusal) => format!("{refusal:?}"),
                };
                assert_eq!(outcome(&once), outcome(&each), "{} {body}", key.id);
            }
        }
    }

    #[test]
    fn an_untraced_plan_records_nothing_and_a_refusal_records_why() {
        let body = serde_json::json!({"model": "gpt-5", "messages": []});
        let plan = decide_for("acme-default", &body, false);
        assert!(plan.result.is_ok());
        // No trace was made: nothing was written to it.
        assert!(plan.trace.0.is_none());
        assert!(plan.trace.candidates.is_empty() && plan.trace.refused.is_none());

        let refused = decide_for("acme-eu-only", &body, false);
        assert!(refused.result.is_err());
        assert!(refused.trace.refused.is_some());

        let traced = decide_for("acme-default", &body, true);
        assert!(!traced.trace.candidates.is_empty());
    }
}
