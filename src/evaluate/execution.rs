//! What the program says while a plan executes: how an attempt's outcome is
//! handled, which later candidates `keep` allows, the timeouts of an
//! attempt, and the error and headers a request ends with. Pure functions
//! the proxy calls; they never perform I/O themselves.

use super::health::{AskedHealth, CandidateHealth, HealthView};
use super::machine::{Focus, Health, Machine, OutcomeFacts, Progress};
use super::{ErrorResponse, Plan, Refusal};
use crate::compile::Snapshot;
use crate::language::ast::{HealthScope, OutcomeKind, TimeoutKind};
use crate::language::ir::{self, ErrorChoiceSpec, ErrorRef};
use crate::value::Value;

/// How an attempt ended, as `on` rules classify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    /// The provider answered with this (non-success) status.
    Status(u16),
    ConnectError,
    Reset,
    Timeout,
    FirstTokenTimeout,
    Malformed,
    StreamBroken,
}

impl OutcomeClass {
    /// The provider answered that the request itself is at fault (malformed,
    /// too large, its headers too large, unprocessable): the answer says
    /// nothing of the provider's
    /// health, so it is no failure of the route's measured success rate;
    /// otherwise one tenant's bad requests would rank a route lower for all.
    pub fn blames_the_request(self) -> bool {
        matches!(self, OutcomeClass::Status(400 | 413 | 422 | 431))
    }

    fn matches(self, pattern: OutcomeKind) -> bool {
        match (pattern, self) {
            (OutcomeKind::Any, _) => true,
            (OutcomeKind::Status { low, high }, OutcomeClass::Status(status)) => {
                (low..=high).contains(&status)
            }
            (OutcomeKind::ConnectError, OutcomeClass::ConnectError)
            | (OutcomeKind::Reset, OutcomeClass::Reset)
            | (OutcomeKind::Timeout, OutcomeClass::Timeout)
            | (OutcomeKind::FirstTokenTimeout, OutcomeClass::FirstTokenTimeout)
            | (OutcomeKind::Malformed, OutcomeClass::Malformed)
            | (OutcomeKind::StreamBroken, OutcomeClass::StreamBroken) => true,
            _ => false,
        }
    }

    pub fn name(self) -> String {
        match self {
            OutcomeClass::Status(status) => status.to_string(),
            OutcomeClass::ConnectError => String::from("connect_error"),
            OutcomeClass::Reset => String::from("reset"),
            OutcomeClass::Timeout => String::from("timeout"),
            OutcomeClass::FirstTokenTimeout => String::from("first_token_timeout"),
            OutcomeClass::Malformed => String::from("malformed"),
            OutcomeClass::StreamBroken => String::from("stream_broken"),
        }
    }
}

/// One attempt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptOutcome {
    pub class: OutcomeClass,
    pub facts: OutcomeFacts,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Next,
    Stop,
    /// The same candidate again after this many milliseconds.
    Retry {
        after_ms: u64,
    },
}

/// The error a request ends with, if it ends after this attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Error(ErrorResponse),
    /// The provider's own response, as received.
    Passthrough,
}

/// The policy's answer to an attempt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Reaction {
    pub action: Action,
    pub pauses: Vec<(HealthScope, u64)>,
    pub penalties: Vec<HealthScope>,
    pub ending: Ending,
    /// The `on` rule that decided (its index), for retry counts and logs.
    pub rule: Option<usize>,
}

/// Per-attempt limits, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect_ms: u64,
    pub headers_ms: u64,
    pub first_token_ms: u64,
    pub idle_ms: u64,
    /// The silence a stream may keep before its answer begins, from the
    /// headers on: `idle` where the policy gives it, else none but
    /// `first_token` (a default would cut a `first_token` the policy set
    /// longer).
    pub silence_before_answer_ms: Option<u64>,
    pub attempt_ms: Option<u64>,
    /// How long a stream's response headers may wait for its first event;
    /// `None`: until the first event (or the final error).
    pub hold_headers_ms: Option<u64>,
    pub after_commit: AfterCommit,
}

/// What limits a stream once it committed (its first event reached the
/// client), besides `idle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCommit {
    /// What is left of the `attempt` timeout and the `budget`.
    AttemptAndBudget,
    /// This long from the commit.
    Within(u64),
    /// Nothing but `idle`.
    Unlimited,
}

/// Which candidate to try next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextCandidate {
    /// This one (an index into `candidates`).
    Try(usize),
    /// Nothing has been tried yet and every allowed candidate is paused or
    /// full: wait for one, up to the capacity wait.
    Wait,
    /// No further attempt: the limit is reached, or no candidate is left
    /// that `keep` allows and that is available.
    Done,
}

/// Waits of `retry` without `after`: 250 ms doubling to 5 s, half random.
const DEFAULT_RETRY_BASE_MS: f64 = 250.0;
const DEFAULT_RETRY_MAX_MS: f64 = 5_000.0;

impl Plan {
    fn machine<'a>(&'a self, snapshot: &'a Snapshot, health: &'a [CandidateHealth]) -> Machine<'a> {
        Machine::new(snapshot, &self.request, &self.candidates, health)
    }

    /// A machine for a candidate place (`on` rules, `keep`, timeouts): it
    /// asks `health` for the candidates' health only if a term reads it.
    fn machine_asking<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        asked: &'a AskedHealth<'a>,
    ) -> Machine<'a> {
        let mut machine = self.machine(snapshot, &[]);
        machine.health = Health::Asked(asked);
        machine
    }

    /// The policy's reaction to an attempt of `candidate` (an index into
    /// `candidates`).
    pub fn react(
        &self,
        snapshot: &Snapshot,
        health: &dyn HealthView,
        candidate: usize,
        outcome: &AttemptOutcome,
        progress: Progress,
        rule_retries: &dyn Fn(usize) -> u32,
    ) -> Reaction {
        let asked = AskedHealth::new(health, &self.candidates);
        let mut machine = self.machine_asking(snapshot, &asked);
        machine.outcome = Some(&outcome.facts);
        machine.progress = progress;
        let focus = &Focus {
            current: Some(candidate),
            served: Some(candidate),
            ..Focus::default()
        };
        for (index, rule) in snapshot.program.failover.rules.iter().enumerate() {
            if !rule
                .outcomes
                .iter()
                .any(|pattern| outcome.class.matches(*pattern))
            {
                continue;
            }
            machine.progress.retries = rule_retries(index);
            if let Some(when) = &rule.when
                && !machine.truth(when, focus)
            {
                continue;
            }
            let mut action = match &rule.action {
                ir::Action::Next => Action::Next,
                ir::Action::Stop => Action::Stop,
                ir::Action::Retry(after) => {
                    // A wait that comes out absent (a division by zero) is
                    // the default one, never a retry at once.
                    let asked = after
                        .as_ref()
                        .and_then(|after| machine.eval(after, focus).as_duration());
                    let after_ms = asked.unwrap_or_else(|| {
                        let retries = i32::try_from(machine.progress.retries).unwrap_or(30);
                        let full =
                            (DEFAULT_RETRY_BASE_MS * 2f64.powi(retries)).min(DEFAULT_RETRY_MAX_MS);
                        (full * (0.5 + 0.5 * progress.jitter.clamp(0.0, 1.0))) as u64
                    });
                    Action::Retry { after_ms }
                }
            };
            // Once output reached the client nothing fails over, whatever
            // the rule says; its health effects still apply.
            if outcome.class == OutcomeClass::StreamBroken {
                action = Action::Stop;
            }
            let pauses = rule
                .pauses
                .iter()
                .filter_map(|(scope, term)| {
                    machine
                        .eval(term, focus)
                        .as_duration()
                        .map(|ms| (*scope, ms))
                })
                .collect();
            let mut ending = match &rule.error {
                Some(choice) => ending(snapshot, &mut machine, choice, focus),
                None => Ending::Passthrough,
            };
            // The time budget: no further attempt or wait starts once it is
            // spent, or when a wait would outlast it; a request whose budget
            // is spent ends with the budget's error, whatever the rule says.
            if let Some((limit, error)) = &snapshot.program.failover.budget
                && let Some(limit_ms) = machine.eval(limit, &Focus::default()).as_duration()
            {
                let needed = match action {
                    Action::Retry { after_ms } => progress.elapsed_ms.saturating_add(after_ms),
                    Action::Next | Action::Stop => progress.elapsed_ms,
                };
                if needed >= limit_ms {
                    action = Action::Stop;
                    ending = Ending::Error(error_response(snapshot, *error, &mut machine, focus));
                }
            }
            return Reaction {
                action,
                pauses,
                penalties: rule.penalties.clone(),
                ending,
                rule: Some(index),
            };
        }
        // `check` requires every outcome to be covered; this is a safe end
        // should a program ever reach here.
        Reaction {
            action: Action::Stop,
            pauses: Vec::new(),
            penalties: Vec::new(),
            ending: Ending::Error(builtin_error(502, "upstream_error", "the provider failed")),
            rule: None,
        }
    }

    /// The next candidate to try after `tried` (indices in the order they
    /// were tried), the last of which ended as `failed` said (what `keep`
    /// reads as `upstream`), given which candidates are available now. The
    /// walk only moves forward in plan order: one `keep` does not allow
    /// after the previous attempt is passed over for good, and so is one
    /// that is paused or full when the walk reaches it.
    pub fn next_candidate(
        &self,
        snapshot: &Snapshot,
        health: &dyn HealthView,
        (tried, failed): (&[usize], Option<&OutcomeFacts>),
        available: &dyn Fn(usize) -> bool,
    ) -> NextCandidate {
        if tried.len() >= self.attempts {
            return NextCandidate::Done;
        }
        let mut any_allowed = false;
        let start = tried.last().map_or(0, |last| last + 1);
        // One asking for the whole walk: `keep` reading health asks the
        // view once per candidate, not once per candidate and step.
        let asked = AskedHealth::new(health, &self.candidates);
        for index in start..self.candidates.len() {
            if let (Some(&first), Some(&prev)) = (tried.first(), tried.last())
                && !self.allows_asking(snapshot, &asked, (first, prev, failed), index)
            {
                continue;
            }
            any_allowed = true;
            if available(index) {
                return NextCandidate::Try(index);
            }
        }
        if any_allowed && tried.is_empty() {
            NextCandidate::Wait
        } else {
            NextCandidate::Done
        }
    }

    /// The candidates tried, in order, if every attempt fails and every
    /// candidate has room, under `health`: a paused candidate is passed over
    /// as the proxy passes it over, and `keep` may read health too (but no
    /// provider's answer: `upstream` is absent).
    pub fn failover_sequence(&self, snapshot: &Snapshot, health: &dyn HealthView) -> Vec<usize> {
        let mut tried = Vec::new();
        let unpaused = |index: usize| {
            self.candidates
                .get(index)
                .is_some_and(|candidate| !health.health(candidate).paused())
        };
        while let NextCandidate::Try(index) =
            self.next_candidate(snapshot, health, (&tried, None), &unpaused)
        {
            tried.push(index);
        }
        tried
    }

    /// Whether `keep` allows trying `next` after `prev`, the first attempt
    /// having been `first` (indices into `candidates`) and `prev` having
    /// ended as `failed` says.
    pub fn allows(
        &self,
        snapshot: &Snapshot,
        health: &dyn HealthView,
        after: (usize, usize, Option<&OutcomeFacts>),
        next: usize,
    ) -> bool {
        let asked = AskedHealth::new(health, &self.candidates);
        self.allows_asking(snapshot, &asked, after, next)
    }

    fn allows_asking(
        &self,
        snapshot: &Snapshot,
        asked: &AskedHealth<'_>,
        (first, prev, failed): (usize, usize, Option<&OutcomeFacts>),
        next: usize,
    ) -> bool {
        let mut machine = self.machine_asking(snapshot, asked);
        machine.outcome = failed;
        let focus = &Focus {
            current: Some(next),
            prev: Some(prev),
            first: Some(first),
            ..Focus::default()
        };
        snapshot
            .program
            .failover
            .keep
            .iter()
            .all(|constraint| machine.truth(constraint, focus))
    }

    /// Whether a `keep` rule reads the previous attempt's failure
    /// (`upstream`): then the walk [`Plan::failover_sequence`] makes, which
    /// sees no failure, is not the only one the proxy may make. Only a
    /// `keep` itself can read it; definitions cannot (E0307).
    pub fn keep_reads_upstream(snapshot: &Snapshot) -> bool {
        fn without_upstream(term: &ir::Term) -> bool {
            use ir::{Read, TermKind};
            super::compiled::reads_only(term, &|term| match &term.kind {
                TermKind::Read(read) => Some(!matches!(
                    read,
                    Read::UpstreamStatus
                        | Read::UpstreamRetryAfter
                        | Read::UpstreamErrorCode
                        | Read::UpstreamErrorType
                        | Read::UpstreamErrorMessage
                )),
                TermKind::Let(_) | TermKind::Merge(_) | TermKind::Static(..) => Some(true),
                TermKind::Hoisted(_, inner) | TermKind::At(_, inner) => {
                    Some(without_upstream(inner))
                }
                TermKind::Aggregate(_, scored, filter) => {
                    Some(without_upstream(scored) && filter.as_deref().is_none_or(without_upstream))
                }
                TermKind::Grouped(_, parts, aggregate) => {
                    Some(parts.iter().all(without_upstream) && without_upstream(aggregate))
                }
                TermKind::Call(_, args) => Some(args.iter().all(without_upstream)),
                _ => None,
            })
        }
        !snapshot.program.failover.keep.iter().all(without_upstream)
    }

    pub fn timeouts(
        &self,
        snapshot: &Snapshot,
        health: &dyn HealthView,
        candidate: usize,
    ) -> Timeouts {
        let asked = AskedHealth::new(health, &self.candidates);
        let mut machine = self.machine_asking(snapshot, &asked);
        let focus = &Focus::on(candidate);
        // A limit that comes out as no time (a setting of 0 s, say) is no
        // limit anyone means: the timeout's default holds instead, as
        // where the policy gives none (E0515 refuses one written so).
        let mut get = |kind: TimeoutKind| {
            snapshot
                .program
                .timeouts
                .iter()
                .find(|(k, _)| *k == kind)
                .and_then(|(_, term)| machine.eval(term, focus).as_duration())
                .filter(|ms| *ms > 0)
        };
        let connect_ms = get(TimeoutKind::Connect).unwrap_or(10_000);
        let headers_ms = get(TimeoutKind::Headers).unwrap_or(60_000);
        let first_token_ms = get(TimeoutKind::FirstToken).unwrap_or(headers_ms);
        let silence_before_answer_ms = get(TimeoutKind::Idle);
        let idle_ms = silence_before_answer_ms.unwrap_or(60_000);
        let attempt_ms = get(TimeoutKind::Attempt);
        let hold_headers_ms = snapshot
            .program
            .hold_headers
            .as_ref()
            .and_then(|term| machine.eval(term, focus).as_duration());
        let after_commit = match &snapshot.program.after_commit {
            None => AfterCommit::AttemptAndBudget,
            Some(term) => match machine.eval(term, focus).as_duration() {
                Some(ms) => AfterCommit::Within(ms),
                None => AfterCommit::Unlimited,
            },
        };
        Timeouts {
            connect_ms,
            headers_ms,
            first_token_ms,
            idle_ms,
            silence_before_answer_ms,
            attempt_ms,
            hold_headers_ms,
            after_commit,
        }
    }

    /// The response headers, once `served` (an index, if any) answered last
    /// after `progress.attempts` candidates; `succeeded` when that answer is
    /// the provider's success (not an error or a passthrough).
    pub fn headers(
        &self,
        snapshot: &Snapshot,
        served: Option<usize>,
        progress: Progress,
        succeeded: bool,
    ) -> Vec<(String, String)> {
        let health = [];
        let mut machine = self.machine(snapshot, &health);
        machine.progress = progress;
        machine.succeeded = succeeded;
        headers(snapshot, &mut machine, served)
    }

    /// The `listing` fields of the plan's model in `GET /v1/models`: read
    /// for the plan's first candidate, aggregates over all of them, under
    /// the candidates' health as `health` has it now.
    pub fn listing(
        &self,
        snapshot: &Snapshot,
        health: &dyn super::health::HealthView,
    ) -> Vec<(String, Value)> {
        let health: Vec<_> = self
            .candidates
            .iter()
            .map(|candidate| health.health(candidate))
            .collect();
        let mut machine = self.machine(snapshot, &health);
        let focus = &Focus::on(0);
        snapshot
            .program
            .listing
            .iter()
            .map(|field| (field.name.clone(), machine.eval(&field.term, focus)))
            .filter(|(_, value)| !value.is_null())
            .collect()
    }

    /// The SSE comment naming the serving provider when headers went out
    /// before it was known.
    pub fn late_comment(&self, snapshot: &Snapshot, served: usize) -> Option<String> {
        let term = snapshot.program.late_comment.as_ref()?;
        let health = [];
        let mut machine = self.machine(snapshot, &health);
        let focus = &Focus {
            served: Some(served),
            ..Focus::default()
        };
        machine.eval(term, focus).as_str().map(str::to_string)
    }

    /// The error a request ends with when it gives up before any attempt
    /// (no capacity) or runs out of time.
    pub fn exhausted(
        &self,
        snapshot: &Snapshot,
        budget: bool,
        free_in_ms: Option<u64>,
        served: Option<usize>,
        progress: Progress,
    ) -> Refusal {
        let error = if budget {
            snapshot
                .program
                .failover
                .budget
                .as_ref()
                .map(|(_, error)| *error)
        } else {
            snapshot.program.capacity_error
        };
        let health = [];
        let mut machine = self.machine(snapshot, &health);
        machine.free_in_ms = free_in_ms;
        machine.progress = progress;
        match error {
            Some(error) => refusal_with(snapshot, error, &mut machine, served),
            // A policy without a `capacity` section: every candidate was
            // paused (or, with a budget, the wait would outlast it).
            None => Refusal {
                error: ErrorResponse {
                    // When a candidate is expected free, as a declared
                    // error's `free_in` would say.
                    retry_after_secs: free_in_ms.map(|ms| ms.div_ceil(1000).max(1)),
                    ..builtin_error(
                        503,
                        "capacity_exhausted",
                        "no provider is available for the request now: every candidate is \
                         paused or has no room",
                    )
                },
                headers: headers(snapshot, &mut machine, served),
            },
        }
    }
}

fn ending(
    snapshot: &Snapshot,
    machine: &mut Machine<'_>,
    choice: &ErrorChoiceSpec,
    focus: &Focus,
) -> Ending {
    let chosen = match choice {
        ErrorChoiceSpec::Fixed(error) => *error,
        ErrorChoiceSpec::Conditional(condition, error, rest) => {
            if machine.truth(condition, focus) {
                *error
            } else {
                return ending(snapshot, machine, rest, focus);
            }
        }
    };
    match chosen {
        ErrorRef::Passthrough => Ending::Passthrough,
        ErrorRef::Declared(_) => Ending::Error(error_response(snapshot, chosen, machine, focus)),
    }
}

fn headers(
    snapshot: &Snapshot,
    machine: &mut Machine<'_>,
    served: Option<usize>,
) -> Vec<(String, String)> {
    let focus = &Focus {
        served,
        ..Focus::default()
    };
    snapshot
        .program
        .headers
        .iter()
        .filter_map(|field| {
            let value = machine.eval(&field.term, focus);
            if value.is_null() {
                return None;
            }
            let text = value.to_string();
            can_travel_in_a_header(&text).then(|| (field.name.clone(), text))
        })
        .collect()
}

/// Whether HTTP can carry `value` as a header's value: no control
/// character but a tab. A value that cannot is left out here, so that
/// `explain` and `test` show exactly the headers the proxy sends.
fn can_travel_in_a_header(value: &str) -> bool {
    value
        .bytes()
        .all(|byte| byte == b'\t' || (byte >= 0x20 && byte != 0x7f))
}

/// The name of an error, for traces.
pub fn error_name(snapshot: &Snapshot, error: ErrorRef) -> String {
    match error {
        ErrorRef::Passthrough => String::from("passthrough"),
        ErrorRef::Declared(index) => snapshot
            .program
            .errors
            .get(index)
            .map_or_else(|| String::from("?"), |spec| spec.name.clone()),
    }
}

/// The default `type` of an error object, by status.
pub fn default_type(status: u16) -> &'static str {
    match status {
        400 | 409 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

fn builtin_error(status: u16, code: &str, message: &str) -> ErrorResponse {
    ErrorResponse {
        status,
        code: code.to_string(),
        message: message.to_string(),
        error_type: default_type(status).to_string(),
        retry_after_secs: None,
        should_retry: None,
    }
}

fn error_response(
    snapshot: &Snapshot,
    error: ErrorRef,
    machine: &mut Machine<'_>,
    focus: &Focus,
) -> ErrorResponse {
    let ErrorRef::Declared(index) = error else {
        return builtin_error(502, "upstream_error", "the provider failed");
    };
    let Some(spec) = snapshot.program.errors.get(index) else {
        return builtin_error(
            500,
            "policy_error",
            "the policy names an error it does not declare",
        );
    };
    let status = machine
        .eval(&spec.status, focus)
        .as_number()
        .filter(|s| (400.0..=599.0).contains(s) && s.fract() == 0.0)
        .map_or(500, |s| s as u16);
    let message = match machine.eval(&spec.message, focus) {
        Value::Null => spec.name.clone(),
        value => value.to_string(),
    };
    let retry_after_secs = spec
        .retry_after
        .as_ref()
        .and_then(|term| machine.eval(term, focus).as_duration())
        .map(|ms| ms.div_ceil(1000));
    let should_retry = spec
        .should_retry
        .as_ref()
        .and_then(|term| machine.eval(term, focus).as_bool());
    let error_type = spec
        .error_type
        .as_ref()
        .and_then(|term| machine.eval(term, focus).as_str().map(str::to_string))
        .unwrap_or_else(|| default_type(status).to_string());
    ErrorResponse {
        status,
        code: spec.name.clone(),
        message,
        error_type,
        retry_after_secs,
        should_retry,
    }
}

/// The refusal of a body that is not a JSON object, before the request's
/// state exists: the policy's error for it, else the proxy's own, with the
/// policy's headers either way. Only what the context says is known.
pub fn malformed_body_refusal(
    snapshot: &Snapshot,
    context: &super::RequestContext<'_>,
    problem: &str,
) -> Refusal {
    let request = super::RequestState {
        estimated_tokens: (context.body_bytes / 4) as f64,
        caller: context.caller,
        ..unknown_request(snapshot, context.id.clone(), context.endpoint)
    };
    let mut machine = Machine::new(snapshot, &request, &[], &[]);
    match snapshot.program.malformed_body {
        Some(error) => refusal_with(snapshot, error, &mut machine, None),
        None => Refusal {
            error: builtin_error(400, "invalid_request_body", problem),
            headers: headers(snapshot, &mut machine, None),
        },
    }
}

/// The policy's headers on an answer the proxy gives before the policy
/// decides anything (no key or an unknown one, an unknown path or method, a
/// body it will not read, a model listing): only the request's id and its
/// endpoint are known, and everything else reads as absent.
pub fn headers_before_decision(
    snapshot: &Snapshot,
    id: std::sync::Arc<str>,
    endpoint: super::Endpoint,
) -> Vec<(String, String)> {
    let request = unknown_request(snapshot, id, endpoint);
    let mut machine = Machine::new(snapshot, &request, &[], &[]);
    headers(snapshot, &mut machine, None)
}

/// A request of which only the id and endpoint are known: every input,
/// setting and merge absent, no model, no caller.
fn unknown_request(
    snapshot: &Snapshot,
    id: std::sync::Arc<str>,
    endpoint: super::Endpoint,
) -> super::RequestState {
    super::RequestState {
        id,
        endpoint,
        inputs: vec![Value::Null; snapshot.program.inputs.len()],
        settings: vec![Value::Null; snapshot.data.schema.settings.entries.len()],
        merges: vec![Value::Null; snapshot.program.merges.len()],
        ..super::RequestState::placeholder()
    }
}

/// A refusal evaluated with the request's state.
pub fn refusal_with(
    snapshot: &Snapshot,
    error: ErrorRef,
    machine: &mut Machine<'_>,
    served: Option<usize>,
) -> Refusal {
    let focus = &Focus {
        served,
        ..Focus::default()
    };
    Refusal {
        error: error_response(snapshot, error, machine, focus),
        headers: headers(snapshot, machine, served),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route's success rate counts what the provider did, not what one
    /// tenant's requests were: a 431 answers headers the client sent.
    #[test]
    fn answers_that_blame_the_request_are_not_the_providers_failures() {
        for status in [400, 413, 422, 431] {
            assert!(
                OutcomeClass::Status(status).blames_the_request(),
                "{status}"
            );
        }
        for status in [401, 403, 404, 408, 429, 500, 503] {
            assert!(
                !OutcomeClass::Status(status).blames_the_request(),
                "{status}"
            );
        }
        assert!(!OutcomeClass::Reset.blames_the_request());
    }
}
