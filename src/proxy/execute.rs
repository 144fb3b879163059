//! Executing a plan: attempts in the order the plan and the state allow,
//! the policy's reaction to each outcome, and the one answer the client
//! gets. Every decision here is the evaluator's (`Plan::next_candidate`,
//! `Plan::react`, `Plan::timeouts`, `Plan::headers`); this module performs
//! the I/O and the waits they ask for.

use super::body::{ChunkSender, ProxyBody, chunk_queue};
use super::header_names;
use super::respond;
use super::upstream::{Outgoing, error_event_facts, outcome_facts};
use super::wire::{self, ChoiceSet, EventKind, EventReader};
use super::{ConnectionCut, Proxy, RequestLog};
use crate::compile::{Secret, Snapshot};
use crate::data::WireFormat;
use crate::data::schema::MAX_DURATION_MS;
use crate::evaluate::{
    Action, AfterCommit, AttemptOutcome, Ending, Endpoint, ErrorResponse, NextCandidate,
    OutcomeClass, OutcomeFacts, Plan, Progress, Timeouts,
};
use crate::language::ast::HealthScope;
use crate::state::{CandidateKeys, Clock, Sample, ScopeKey, StateView, Ticket, Timer};
use crate::sync::lock;
use bytes::Bytes;
use futures_util::StreamExt;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{HeaderMap, Response};
use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

/// The most of a provider's error answer that is read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// The most of a provider's non-streamed answer that is accepted.
const MAX_ANSWER_BODY: usize = 64 * 1024 * 1024;

/// How long a stream that has finished its answer may take to close, ms.
const FINISHED_GRACE_MS: u64 = 500;
/// How long a finished stream may take to send the usage the request asked
/// for (`stream_options.include_usage`), ms: bounded, as a provider that
/// ignores the option would otherwise hold the end for the idle timeout.
const USAGE_GRACE_MS: u64 = 5_000;

/// The way back to the client: the slot for the response not yet sent, or,
/// once the headers went out, the body's queue. The exchange runs inside the
/// request's own future (and then its body), so a client that goes away
/// drops the exchange with it: nothing here waits for that.
pub enum Link {
    Pending(AnswerSlot),
    Open(ChunkSender),
    Closed,
}

/// Where the exchange leaves its response for `answer`, which polls it: a
/// plain slot for the reason `body::chunk_queue` gives.
type AnswerSlot = Arc<Mutex<Option<Response<ProxyBody>>>>;

fn take_answer(slot: &AnswerSlot) -> Option<Response<ProxyBody>> {
    lock(slot).take()
}

impl Link {
    fn respond(&mut self, response: Response<ProxyBody>) {
        if let Link::Pending(slot) = std::mem::replace(self, Link::Closed) {
            *lock(&slot) = Some(response);
        }
    }

    /// Sends the headers of a stream; the body follows through `send`.
    fn open(&mut self, head: Response<ProxyBody>) -> bool {
        if !matches!(self, Link::Pending(_)) {
            return false;
        }
        let (chunks, receiver) = chunk_queue();
        let (parts, _) = head.into_parts();
        self.respond(Response::from_parts(
            parts,
            ProxyBody::Stream {
                chunks: receiver,
                exchange: None,
            },
        ));
        *self = Link::Open(chunks);
        true
    }

    async fn send(&mut self, bytes: Bytes) -> bool {
        match self {
            Link::Open(sender) => sender.send(bytes).await,
            _ => false,
        }
    }

    fn is_open(&self) -> bool {
        matches!(self, Link::Open(_))
    }
}

/// A provider's own failed answer, for `error passthrough`.
struct Passthrough {
    status: u16,
    content_type: Option<HeaderValue>,
    /// The provider's advice on retrying, which clients read: the official
    /// SDKs prefer `retry-after-ms` to `Retry-After` and obey
    /// `x-should-retry` before their own rules.
    retry_advice: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

/// The headers that advise a client on retrying, in [`Passthrough`].
const RETRY_ADVICE: [HeaderName; 3] = [
    header::RETRY_AFTER,
    header_names::RETRY_AFTER_MS,
    header_names::SHOULD_RETRY,
];

enum Attempted {
    /// The answer reached the client.
    Served {
        usage: Option<(u64, u64)>,
        first_byte: Option<Duration>,
    },
    Failed {
        outcome: AttemptOutcome,
        passthrough: Option<Passthrough>,
    },
    /// The client's end of the answer is gone.
    Cancelled,
}

/// One attempt, for the request's log line.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub provider: String,
    pub credential: String,
    pub outcome: String,
    pub millis: u64,
}

/// What the request's log line and metrics report.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub status: u16,
    pub outcome: &'static str,
    pub attempts: Vec<AttemptRecord>,
    pub served_provider: Option<String>,
    pub served_model: Option<String>,
    pub usage: Option<(u64, u64)>,
    pub waited_ms: u64,
    /// The code of the error the request ended with, if the proxy answered
    /// one (a provider's own answer passed through is not one).
    pub error: Option<String>,
}

pub struct Exchange {
    pub proxy: Arc<Proxy>,
    pub snapshot: Arc<Snapshot>,
    pub endpoint: Endpoint,
    pub request_id: Arc<str>,
    pub plan: Plan,
    pub outgoing: Outgoing,
    /// When the request arrived, on the state's clock.
    pub started_ms: u64,
    /// When the plan began to run: waits for capacity count from here, not
    /// from the request's arrival, whose body may have taken a while.
    running_since_ms: u64,
    pub report: Report,
    /// Whether the response headers went out (a stream held past
    /// `hold_headers`, or a committed answer).
    head_sent: bool,
    /// For a stream with `hold_headers`: when its headers go out at the
    /// latest, on the clock.
    hold_until_ms: Option<u64>,
    /// Attempts and time so far, as the policy's terms read them.
    progress: Progress,
    /// The rest of the request's log line, until it is written; counts
    /// the request in flight meanwhile.
    log: Option<RequestLog>,
    /// The attempt under way (candidate, start), which a client that goes
    /// away ends as `cancelled`.
    attempting: Option<(usize, Instant)>,
    /// The candidate whose answer began to reach the client, if one did:
    /// it answered, even if the client leaves before the end.
    committed: Option<usize>,
    /// Whether the exchange waits for a candidate with room.
    waiting_for_capacity: bool,
    /// A stream whose provider finished its answer, waiting only for its
    /// end: the candidate, when its attempt began, its first byte and
    /// usage. Cut then, it still ends as an answer, not an error.
    finished_stream: Option<FinishedStream>,
    /// The connection the request came on, told when a stream being sent
    /// must have ended (see [`ConnectionCut`]).
    connection: Option<Arc<ConnectionCut>>,
}

/// While a committed stream is sent: its deadline, if it has one, and how
/// long it may be silent, known to its connection, which closes if its
/// client stops taking events past either (a client that stopped reading).
/// The time left is counted on the proxy's clock and watched on the
/// runtime's: under a test's manual clock, only a stream that takes no
/// event for a real second past its deadline's real time is cut.
struct StreamWatch(Arc<ConnectionCut>);

impl StreamWatch {
    fn set(
        connection: Option<&Arc<ConnectionCut>>,
        ends_in_ms: Option<u64>,
        stalls_after_ms: Option<u64>,
    ) -> Option<StreamWatch> {
        let connection = connection?;
        connection.watch_stream(ends_in_ms, stalls_after_ms);
        Some(StreamWatch(connection.clone()))
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        self.0.stream_ended();
    }
}

#[derive(Clone, Copy)]
struct FinishedStream {
    index: usize,
    begun: Instant,
    first_byte: Option<Duration>,
    usage: Option<(u64, u64)>,
    /// Whether its measurements went into the health state already (its
    /// end was being sent).
    recorded: bool,
}

impl Exchange {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        proxy: Arc<Proxy>,
        snapshot: Arc<Snapshot>,
        endpoint: Endpoint,
        request_id: Arc<str>,
        plan: Plan,
        outgoing: Outgoing,
        started_ms: u64,
        log: RequestLog,
    ) -> Exchange {
        let hold_until_ms = if plan.request.stream && !plan.candidates.is_empty() {
            let view = StateView {
                state: &proxy.state,
                snapshot: &snapshot,
                live_limits: None,
            };
            plan.timeouts(&snapshot, &view, 0)
                .hold_headers_ms
                .map(|ms| started_ms.saturating_add(ms))
        } else {
            None
        };
        Exchange {
            proxy,
            snapshot,
            endpoint,
            request_id,
            plan,
            outgoing,
            started_ms,
            running_since_ms: started_ms,
            report: Report::default(),
            head_sent: false,
            hold_until_ms,
            progress: Progress::default(),
            log: Some(log),
            attempting: None,
            committed: None,
            waiting_for_capacity: false,
            finished_stream: None,
            connection: None,
        }
    }

    /// Whether a held stream's headers are still waiting to go out.
    fn holding(&self, link: &Link) -> bool {
        self.hold_until_ms.is_some() && !self.head_sent && matches!(link, Link::Pending(_))
    }

    fn hold_until(&self) -> u64 {
        self.hold_until_ms.unwrap_or(u64::MAX)
    }

    /// The progress as of now, for terms that read `elapsed`.
    fn progress_now(&self) -> Progress {
        self.progress_at(self.now_ms())
    }

    /// The progress as of `at_ms` on the proxy's clock.
    fn progress_at(&self, at_ms: u64) -> Progress {
        Progress {
            elapsed_ms: at_ms.saturating_sub(self.started_ms),
            ..self.progress
        }
    }

    fn wire(&self) -> WireFormat {
        self.endpoint.wire()
    }

    fn now_ms(&self) -> u64 {
        self.proxy.state.clock().now_ms()
    }

    fn elapsed_ms(&self) -> u64 {
        self.now_ms().saturating_sub(self.started_ms)
    }

    fn keys(&self, candidate: usize) -> Option<CandidateKeys> {
        let candidate = self.plan.candidates.get(candidate)?;
        Some(CandidateKeys::of(&self.snapshot, candidate))
    }

    fn limits(&self, candidate: usize) -> Option<crate::data::CapacityLimits> {
        let candidate = self.plan.candidates.get(candidate)?;
        crate::state::LiveLimits::limits(&*self.proxy, &self.snapshot, candidate.provider)
    }

    fn provider_id(&self, candidate: usize) -> String {
        self.plan
            .candidates
            .get(candidate)
            .and_then(|c| self.snapshot.provider(c.provider))
            .map_or_else(String::new, |p| p.id.clone())
    }

    /// Whether the candidate may be tried now: not paused, and with room.
    fn available(&self, candidate: usize, ticket: Option<&Ticket>) -> bool {
        let Some(keys) = self.keys(candidate) else {
            return false;
        };
        !self.paused(candidate)
            && self
                .proxy
                .state
                .has_room(keys.provider.provider(), self.limits(candidate), ticket)
    }

    /// Whether the candidate's own route or credential is paused, which
    /// other candidates of its provider are not.
    fn own_scope_paused(&self, candidate: usize) -> bool {
        self.keys(candidate).is_some_and(|keys| {
            let state = &self.proxy.state;
            state.scope_paused(&keys.route) || state.scope_paused(&keys.credential)
        })
    }

    /// Whether the candidate's route, provider or credential is paused.
    fn paused(&self, candidate: usize) -> bool {
        self.keys(candidate).is_none_or(|keys| {
            self.proxy
                .state
                .candidate_health(&keys, None, self.snapshot.health.stats_window_ms)
                .paused()
        })
    }

    /// The health and capacity state now, as the policy's terms read it.
    fn state_view(&self) -> StateView<'_> {
        StateView {
            state: &self.proxy.state,
            snapshot: &self.snapshot,
            live_limits: Some(&*self.proxy),
        }
    }

    /// Milliseconds until some candidate may become available, if known.
    fn soonest_available_ms(&self) -> Option<u64> {
        let view = self.state_view();
        self.plan
            .candidates
            .iter()
            .filter_map(|candidate| {
                crate::evaluate::health::HealthView::health(&view, candidate).available_in_ms()
            })
            .min()
    }

    /// Runs the plan to its end, answers the client through `link`, and
    /// writes the request's log line. An `async fn` would keep the exchange
    /// twice in its future (the argument, and the local it is moved to):
    /// 544 bytes more for every request in flight.
    #[allow(clippy::manual_async_fn)]
    pub fn run(
        mut self,
        mut link: Link,
        cut: Arc<ConnectionCut>,
    ) -> impl Future<Output = ()> + Send {
        async move {
            // An exchange that starts after the drain ran out (its body was
            // still arriving) is cut before its first step, even when its
            // connection's task has not yet been told of the cut.
            self.connection = Some(cut.clone());
            let was_cut = self.proxy.drain_over() || {
                let mut executing = std::pin::pin!(self.execute(&mut link));
                // The cut first: a request whose exchange starts after it
                // (its body still arriving when the drain ran out) must not
                // take a step, which could already call a provider.
                std::future::poll_fn(|cx| {
                    if cut.poll_cut(cx).is_ready() {
                        return Poll::Ready(true);
                    }
                    executing.as_mut().poll(cx).map(|()| false)
                })
                .await
            };
            if was_cut {
                self.shut_out(&mut link).await;
            }
            self.write_log();
        }
    }

    /// The providers a request waiting for room waits at: those of its
    /// untried candidates, but not one whose candidate here has its own
    /// route or credential paused.
    fn providers_to_wait_for(&self, tried: &[usize]) -> HashSet<Arc<str>> {
        (0..self.plan.candidates.len())
            .filter(|i| !tried.contains(i) && !self.own_scope_paused(*i))
            .filter_map(|i| self.keys(i))
            .map(|keys| Arc::from(keys.provider.provider()))
            .collect()
    }

    /// The drain time ran out with the request still running: it ends with
    /// a 503 in its wire format, or, once a stream's headers went out, an
    /// error event (and no completion sentinel), so that its client reads
    /// why rather than a closed connection.
    async fn shut_out(&mut self, link: &mut Link) {
        // The provider had finished: the client gets the end it expects.
        if link.is_open()
            && let Some(finished) = self.finished_stream.take()
        {
            let FinishedStream {
                index,
                begun,
                first_byte,
                usage,
                ..
            } = finished;
            self.attempting = None;
            if !finished.recorded {
                self.record_end(finished);
            }
            if let Some(sentinel) = wire::sentinel(self.endpoint) {
                link.send(sentinel).await;
            }
            *link = Link::Closed;
            self.record_attempt(index, begun, String::from("ok"));
            self.served(index, usage, first_byte);
            return;
        }
        self.cancel();
        // As for any error after a stream's headers: they said 200.
        if link.is_open() {
            self.report.status = 200;
        }
        let attempted = self.attempting.take();
        if let Some((index, begun)) = attempted {
            self.record_attempt(index, begun, self.report.outcome.to_string());
        }
        let error = ErrorResponse {
            status: 503,
            code: String::from("shutting_down"),
            message: String::from("the gateway is shutting down; retry the request"),
            error_type: crate::evaluate::default_type(503).to_string(),
            retry_after_secs: None,
            should_retry: None,
        };
        self.report.error = Some(error.code.clone());
        if link.is_open() {
            link.send(wire::error_event(self.endpoint, &self.request_id, &error))
                .await;
            *link = Link::Closed;
        } else {
            // The policy's headers, as on any error: for the candidate
            // being tried when the drain ended, if any.
            let headers = self.plan.headers(
                &self.snapshot,
                attempted.map(|(index, _)| index),
                self.progress_now(),
                false,
            );
            link.respond(respond::error(
                self.wire(),
                &self.request_id,
                &error,
                &headers,
            ));
        }
    }

    fn write_log(&mut self) {
        if let Some(log) = self.log.take() {
            log.write(
                &self.proxy,
                self.request_id.clone(),
                self.endpoint,
                std::mem::take(&mut self.report),
            );
        }
    }

    async fn execute(&mut self, link: &mut Link) {
        let mut tried: Vec<usize> = Vec::new();
        let mut rule_retries: HashMap<usize, u32> = HashMap::new();
        let mut last: Option<(Ending, usize, Option<Passthrough>)> = None;
        // What the last attempt's failure said, for `keep` to read.
        let mut failed: Option<OutcomeFacts> = None;
        let mut ticket: Option<Ticket> = None;
        self.running_since_ms = self.now_ms();
        // Waiting for capacity never outlasts the time budget either.
        let wait_until = self
            .running_since_ms
            .saturating_add(self.plan.capacity_wait_ms)
            .min(
                self.plan
                    .budget_ms
                    .map_or(u64::MAX, |ms| self.started_ms.saturating_add(ms)),
            );

        loop {
            let next = {
                let ticket_ref = ticket.as_ref();
                self.plan.next_candidate(
                    &self.snapshot,
                    &self.state_view(),
                    (&tried, failed.as_ref()),
                    &|index| self.available(index, ticket_ref),
                )
            };
            match next {
                NextCandidate::Try(index) => {
                    let Some(provider) = self.keys(index).map(|k| k.provider) else {
                        break;
                    };
                    let Some(permit) = self.proxy.state.try_acquire(
                        provider.provider(),
                        self.limits(index),
                        ticket.as_ref(),
                    ) else {
                        // Taken since it was looked at: look again.
                        tokio::task::yield_now().await;
                        continue;
                    };
                    ticket = None;
                    tried.push(index);
                    self.progress.attempts = u32::try_from(tried.len()).unwrap_or(u32::MAX);
                    let mut permit = Some(permit);
                    loop {
                        self.progress.attempt += 1;
                        let (attempted, ended_ms) = self.attempt(index, link).await;
                        drop(permit.take());
                        match attempted {
                            Attempted::Served { usage, first_byte } => {
                                self.served(index, usage, first_byte);
                                return;
                            }
                            Attempted::Cancelled => return self.cancel(),
                            Attempted::Failed {
                                outcome,
                                passthrough,
                            } => {
                                self.progress.jitter = super::random_unit();
                                let reaction = self.plan.react(
                                    &self.snapshot,
                                    &self.state_view(),
                                    index,
                                    &outcome,
                                    self.progress_at(ended_ms),
                                    &|rule| rule_retries.get(&rule).copied().unwrap_or(0),
                                );
                                self.apply_health(index, &reaction, ended_ms);
                                // A pause that begins while a retry waits is
                                // another request's.
                                let paused_at_failure = self.paused(index);
                                last = Some((reaction.ending, index, passthrough));
                                failed = Some(outcome.facts);
                                match reaction.action {
                                    Action::Stop => return self.end(last, link).await,
                                    Action::Next => break,
                                    Action::Retry { after_ms } => {
                                        if let Some(rule) = reaction.rule {
                                            *rule_retries.entry(rule).or_insert(0) += 1;
                                        }
                                        let wake = ended_ms.saturating_add(after_ms);
                                        self.wait_until(wake, link, std::future::pending()).await;
                                        // Paused meanwhile by another request:
                                        // a paused candidate is skipped. One
                                        // paused already (a rule that pauses
                                        // and retries) is retried as it says.
                                        if !paused_at_failure && self.paused(index) {
                                            break;
                                        }
                                        match self.proxy.state.try_acquire(
                                            provider.provider(),
                                            self.limits(index),
                                            None,
                                        ) {
                                            Some(again) => permit = Some(again),
                                            // Full now: on to the next candidate.
                                            None => break,
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                NextCandidate::Wait => {
                    let now = self.now_ms();
                    if now >= wait_until {
                        return self.exhausted(link).await;
                    }
                    // Only the providers it waits for room at, looked at
                    // again on every pass: one whose candidate here has its
                    // own route or credential paused is not held back from
                    // requests that can use it. (A paused provider is paused
                    // for everyone: holding it costs nobody anything.)
                    let providers = self.providers_to_wait_for(&tried);
                    let waits_for = providers.clone();
                    match &ticket {
                        Some(waiting) => self.proxy.state.wait_for(waiting, providers),
                        None => {
                            ticket = Some(self.proxy.state.enqueue(providers));
                            self.proxy.metrics.capacity_wait();
                        }
                    }
                    // Listening before looking again: room freed after the
                    // look above and before the wait began would otherwise
                    // wake nobody.
                    let Some(waiting) = ticket.as_ref() else {
                        break;
                    };
                    let changed = waiting.room_may_have_appeared();
                    let ticket_ref = Some(waiting);
                    let room_now = self.plan.next_candidate(
                        &self.snapshot,
                        &self.state_view(),
                        (&tried, failed.as_ref()),
                        &|index| self.available(index, ticket_ref),
                    );
                    // A route or credential paused by another request since
                    // the set was taken would hold its provider back from
                    // everyone behind this waiter, which cannot use it.
                    if matches!(room_now, NextCandidate::Try(_))
                        || self.providers_to_wait_for(&tried) != waits_for
                    {
                        continue;
                    }
                    let mut wake = wait_until;
                    if let Some(ms) = self.soonest_available_ms() {
                        wake = wake.min(now.saturating_add(ms.max(1)));
                    }
                    // A client that leaves meanwhile drops this future:
                    // `cancel` counts the wait so far.
                    self.waiting_for_capacity = true;
                    self.wait_until(wake, link, changed).await;
                    self.waiting_for_capacity = false;
                    self.report.waited_ms = self.now_ms().saturating_sub(self.running_since_ms);
                }
                NextCandidate::Done => break,
            }
        }
        if last.is_none() {
            return self.exhausted(link).await;
        }
        self.end(last, link).await
    }

    /// Waits until `wake` on the proxy's clock, or until `also` finishes,
    /// sending held stream headers when their time comes. A client that
    /// goes away meanwhile drops the whole exchange (see its `Drop`).
    async fn wait_until(
        &mut self,
        wake: u64,
        link: &mut Link,
        also: impl std::future::Future<Output = ()>,
    ) {
        let state = self.proxy.state.clone();
        let clock = state.clock();
        let mut also = std::pin::pin!(also);
        loop {
            let (holding, hold_at) = (self.holding(link), self.hold_until());
            tokio::select! {
                () = async { clock.sleep_until(hold_at).await }, if holding => {
                    self.send_stream_head(None, link);
                }
                () = &mut also => return,
                () = clock.sleep_until(wake) => return,
            }
        }
    }

    /// The client went away, or the proxy cut the request when its drain
    /// time ran out: nobody gets the rest of an answer, the log says why,
    /// and who had begun to answer if one had.
    fn cancel(&mut self) {
        (self.report.outcome, self.report.status) = if self.proxy.drain_over() {
            ("shutdown", 503)
        } else {
            ("cancelled", 499)
        };
        if let Some(index) = self.committed {
            self.answered_by(index);
        }
        if self.waiting_for_capacity {
            self.report.waited_ms = self.now_ms().saturating_sub(self.running_since_ms);
        }
    }

    /// The log's and the metrics' provider and upstream model: the
    /// candidate that answered last.
    fn answered_by(&mut self, index: usize) {
        self.report.served_provider = Some(self.provider_id(index));
        // An `unknown serve` tier's upstream model is the client's id.
        self.report.served_model = self.plan.candidates.get(index).map(|c| {
            let upstream = c.upstream_model(&self.snapshot);
            match &self.log {
                Some(log) => log.served_model(upstream),
                None => super::logged_model(upstream, None),
            }
        });
    }

    fn served(&mut self, index: usize, usage: Option<(u64, u64)>, first_byte: Option<Duration>) {
        if let Some(first_byte) = first_byte {
            self.proxy
                .metrics
                .first_byte(&self.provider_id(index), first_byte.as_secs_f64());
        }
        self.report.outcome = "served";
        self.report.status = self.report.status.max(200);
        self.answered_by(index);
        self.report.usage = usage;
    }

    /// A provider's error text without the credential this attempt sent,
    /// which some providers echo back.
    fn without_own_secret(&self, index: usize, text: Bytes) -> Bytes {
        let secret = self
            .plan
            .candidates
            .get(index)
            .and_then(|c| self.snapshot.secret(c.provider, c.credential));
        without_secret_of(secret, text)
    }

    /// Pauses and penalties of a reaction, by the candidate's stable ids.
    /// They count from `failed_ms`, when the failure was seen, not from
    /// whenever this task gets to run.
    fn apply_health(&self, index: usize, reaction: &crate::evaluate::Reaction, failed_ms: u64) {
        let Some(candidate) = self.plan.candidates.get(index) else {
            return;
        };
        for (scope, ms) in &reaction.pauses {
            self.proxy.metrics.pause(scope_name(*scope));
            for key in ScopeKey::named_by(&self.snapshot, candidate, *scope) {
                self.proxy.state.pause(&key, failed_ms, *ms);
                tracing::info!(
                    request_id = %self.request_id,
                    // A route's model may be an id a client sent: escaped, so
                    // it cannot break the line or reach a terminal raw.
                    scope = %key.to_string().escape_debug(),
                    for_ms = ms,
                    "paused"
                );
            }
        }
        for scope in &reaction.penalties {
            for key in ScopeKey::named_by(&self.snapshot, candidate, *scope) {
                self.proxy
                    .state
                    .penalize(&key, failed_ms, &self.snapshot.health.penalty);
            }
        }
    }

    /// Ends with the last attempt's ending.
    async fn end(&mut self, last: Option<(Ending, usize, Option<Passthrough>)>, link: &mut Link) {
        let Some((ending, served, passthrough)) = last else {
            return self.exhausted(link).await;
        };
        let headers = self
            .plan
            .headers(&self.snapshot, Some(served), self.progress_now(), false);
        self.answered_by(served);
        match (ending, passthrough) {
            (Ending::Passthrough, Some(answer)) if !link.is_open() => {
                self.report.status = answer.status;
                self.report.outcome = "passthrough";
                let mut response = respond::base(
                    answer.status,
                    &self.request_id,
                    "application/json",
                    ProxyBody::full(answer.body),
                );
                if let Some(content_type) = answer.content_type {
                    response
                        .headers_mut()
                        .insert(header::CONTENT_TYPE, content_type);
                }
                response.headers_mut().extend(answer.retry_advice);
                link.respond(respond::with_headers(response, &headers));
            }
            (Ending::Passthrough, answer) => {
                // Headers already went out (or nothing came back to pass
                // on): say what the provider said, in the stream's format.
                let status = answer.as_ref().map_or(502, |a| a.status);
                let facts = answer
                    .as_ref()
                    .map(|a| outcome_facts(a.status, &HeaderMap::new(), &a.body, SystemTime::now()))
                    .unwrap_or_default();
                let error = ErrorResponse {
                    status,
                    code: facts
                        .error_code
                        .as_deref()
                        .unwrap_or("upstream_error")
                        .to_string(),
                    message: facts
                        .error_message
                        .as_deref()
                        .unwrap_or("the provider failed")
                        .to_string(),
                    error_type: facts.error_type.as_deref().map_or_else(
                        || crate::evaluate::default_type(status).to_string(),
                        str::to_string,
                    ),
                    retry_after_secs: facts.retry_after_ms.map(|ms| ms.div_ceil(1000)),
                    should_retry: None,
                };
                self.fail(&error, &headers, link).await;
            }
            (Ending::Error(error), _) => self.fail(&error, &headers, link).await,
        }
    }

    /// No candidate was available in time, or the budget ran out first.
    async fn exhausted(&mut self, link: &mut Link) {
        let budget_spent = self
            .plan
            .budget_ms
            .is_some_and(|budget| self.elapsed_ms() >= budget);
        let refusal = self.plan.exhausted(
            &self.snapshot,
            budget_spent,
            self.soonest_available_ms(),
            None,
            self.progress_now(),
        );
        self.fail(&refusal.error, &refusal.headers, link).await;
    }

    /// Answers with an error: the error object, or an error event when the
    /// stream's headers already went out.
    async fn fail(&mut self, error: &ErrorResponse, headers: &[(String, String)], link: &mut Link) {
        self.report.status = if link.is_open() { 200 } else { error.status };
        self.report.error = Some(error.code.clone());
        if self.report.outcome.is_empty() || self.report.outcome == "served" {
            self.report.outcome = "error";
        }
        if link.is_open() {
            link.send(wire::error_event(self.endpoint, &self.request_id, error))
                .await;
            *link = Link::Closed;
        } else {
            link.respond(respond::error(
                self.wire(),
                &self.request_id,
                error,
                headers,
            ));
        }
    }

    /// One attempt at a candidate, and when it ended on the proxy's clock.
    /// What follows a failure (a retry's wait, a pause) counts from then:
    /// the end is read before the attempt's metric is, so whoever sees the
    /// metric sees a time that is already fixed.
    async fn attempt(&mut self, index: usize, link: &mut Link) -> (Attempted, u64) {
        let begun = Instant::now();
        self.attempting = Some((index, begun));
        let attempted = self.attempt_inner(index, link).await;
        let ended_ms = self.now_ms();
        self.attempting = None;
        let outcome = match &attempted {
            Attempted::Served { .. } => String::from("ok"),
            Attempted::Failed { outcome, .. } => outcome.class.name(),
            Attempted::Cancelled => String::from("cancelled"),
        };
        // A served attempt recorded its measurements before its last bytes
        // went out (`record_served`).
        if let (Attempted::Failed { outcome, .. }, Some(keys)) = (&attempted, self.keys(index))
            && !outcome.class.blames_the_request()
        {
            self.proxy.state.record(
                &keys.route,
                Sample::default(),
                self.snapshot.health.stats_window_ms,
            );
        }
        self.record_attempt(index, begun, outcome);
        (attempted, ended_ms)
    }

    /// An attempt's metric and its entry in the log line.
    fn record_attempt(&mut self, index: usize, begun: Instant, outcome: String) {
        let millis = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
        let provider = self.provider_id(index);
        self.proxy
            .metrics
            .upstream(&provider, &outcome, begun.elapsed().as_secs_f64());
        self.report.attempts.push(AttemptRecord {
            credential: self
                .plan
                .candidates
                .get(index)
                .and_then(|c| self.snapshot.credential(c.provider, c.credential))
                .map_or_else(String::new, |c| c.id.clone()),
            provider,
            outcome,
            millis,
        });
    }

    async fn attempt_inner(&mut self, index: usize, link: &mut Link) -> Attempted {
        let state = self.proxy.state.clone();
        let clock = state.clock();
        let begun_ms = clock.now_ms();
        let begun = Instant::now();
        let failed = |class: OutcomeClass| Attempted::Failed {
            outcome: AttemptOutcome {
                class,
                facts: OutcomeFacts::default(),
            },
            passthrough: None,
        };
        let Some(candidate) = self.plan.candidates.get(index) else {
            return failed(OutcomeClass::ConnectError);
        };
        let timeouts = self
            .plan
            .timeouts(&self.snapshot, &self.state_view(), index);
        let Some((url, headers, body)) =
            self.outgoing
                .request_for(&self.snapshot, candidate, self.endpoint)
        else {
            return failed(OutcomeClass::ConnectError);
        };
        let client = match self.proxy.clients.get(timeouts.connect_ms) {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "could not build an HTTP client");
                return failed(OutcomeClass::ConnectError);
            }
        };
        // The attempt's own limit, and the request's time budget: an
        // attempt in flight when the budget runs out ends there.
        let budget_deadline = self
            .plan
            .budget_ms
            .map(|ms| self.started_ms.saturating_add(ms));
        let own_deadline = timeouts.attempt_ms.map(|ms| begun_ms.saturating_add(ms));
        let attempt_deadline = match (own_deadline, budget_deadline) {
            (Some(own), Some(budget)) => Some(own.min(budget)),
            (own, budget) => own.or(budget),
        };
        let by_attempt = |at: u64| attempt_deadline.map_or(at, |limit| at.min(limit));
        let headers_deadline = by_attempt(begun_ms.saturating_add(timeouts.headers_ms));
        let request = match self.proxy.clients.url(&url) {
            Some(parsed) => client.post(parsed),
            // reqwest reports the bad URL as the attempt's error.
            None => client.post(&url),
        };
        let send = request.headers(headers).body(body).send();
        tokio::pin!(send);
        let response = loop {
            let (holding, hold_at) = (self.holding(link), self.hold_until());
            tokio::select! {
                // A branch's future is made even when it is disabled: the
                // sleep is made on the first poll, so only when holding.
                () = async { clock.sleep_until(hold_at).await }, if holding => {
                    self.send_stream_head(None, link);
                }
                () = clock.sleep_until(headers_deadline) => break None,
                result = &mut send => break Some(result),
            }
        };
        let response = match response {
            None => return failed(OutcomeClass::Timeout),
            Some(Err(error)) => {
                return failed(if error.is_connect() {
                    OutcomeClass::ConnectError
                } else if error.is_timeout() {
                    OutcomeClass::Timeout
                } else {
                    OutcomeClass::Reset
                });
            }
            Some(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        if !(200..600).contains(&status) {
            // HTTP's final statuses are 200 to 599 (the client takes 1xx as
            // interim): any other is no answer the policy's status rules name.
            return failed(OutcomeClass::Malformed);
        }
        if !response.status().is_success() {
            let headers = response.headers().clone();
            let limits = BodyLimits {
                max_bytes: MAX_ERROR_BODY,
                oversize: Oversize::Truncate,
                idle_ms: timeouts.idle_ms,
                deadline: attempt_deadline,
            };
            let body = read_body(response, limits, clock).await.unwrap_or_default();
            let body = self.without_own_secret(index, body);
            return Attempted::Failed {
                outcome: AttemptOutcome {
                    class: OutcomeClass::Status(status),
                    facts: outcome_facts(status, &headers, &body, SystemTime::now()),
                },
                passthrough: Some(Passthrough {
                    status,
                    content_type: headers.get(header::CONTENT_TYPE).cloned(),
                    retry_advice: RETRY_ADVICE
                        .into_iter()
                        .filter_map(|name| {
                            let value = headers.get(&name)?.clone();
                            Some((name, value))
                        })
                        .collect(),
                    body,
                }),
            };
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        // Asked for a stream, some servers send its events as `text/plain`,
        // NDJSON or with no type at all: anything but JSON is read as events.
        let is_stream = content_type.is_some_and(is_event_stream)
            || (self.plan.request.stream && !content_type.is_some_and(is_json));
        if is_stream && self.plan.request.stream {
            return self
                .stream(index, response, &timeouts, begun, attempt_deadline, link)
                .await;
        }
        self.answer(index, response, &timeouts, begun, attempt_deadline, link)
            .await
    }

    /// Records a served attempt's measurements. Called before the answer's
    /// last bytes go to the client, so that the client's next request is
    /// already routed on them. Throughput (output tokens per second while
    /// generating) is measured only on an answer streamed over time: a whole
    /// answer, or a stream that arrived in one piece, has no generating time
    /// to divide by.
    fn record_served(
        &self,
        index: usize,
        begun: Instant,
        first_byte: Option<Duration>,
        usage: Option<(u64, u64)>,
        streamed_over_time: bool,
    ) {
        let Some(keys) = self.keys(index) else {
            return;
        };
        let latency = begun.elapsed();
        let generating = latency.saturating_sub(first_byte.unwrap_or(latency));
        let as_ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let throughput = usage
            .filter(|_| streamed_over_time && !generating.is_zero())
            .map(|(_, output)| output as f64 / generating.as_secs_f64());
        self.proxy.state.record(
            &keys.route,
            Sample {
                success: true,
                ttft_ms: first_byte.map(as_ms),
                latency_ms: Some(as_ms(latency)),
                throughput,
            },
            self.snapshot.health.stats_window_ms,
        );
    }

    /// A stream's answer is complete and its end about to go out: its
    /// measurements go into the health state, once, before the end does.
    fn record_end(&mut self, finished: FinishedStream) {
        self.record_served(
            finished.index,
            finished.begun,
            finished.first_byte,
            finished.usage,
            true,
        );
        self.finished_stream = Some(FinishedStream {
            recorded: true,
            ..finished
        });
    }

    /// A whole (non-streamed) answer: read, checked, then sent.
    async fn answer(
        &mut self,
        index: usize,
        response: reqwest::Response,
        timeouts: &Timeouts,
        begun: Instant,
        attempt_deadline: Option<u64>,
        link: &mut Link,
    ) -> Attempted {
        let failed_as = |class| Attempted::Failed {
            outcome: AttemptOutcome {
                class,
                facts: OutcomeFacts::default(),
            },
            passthrough: None,
        };
        let malformed = || failed_as(OutcomeClass::Malformed);
        if link.is_open() {
            // The client already has the headers of a stream: a whole JSON
            // answer cannot follow them.
            return malformed();
        }
        let status = response.status().as_u16();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let state = self.proxy.state.clone();
        let limits = BodyLimits {
            max_bytes: MAX_ANSWER_BODY,
            oversize: Oversize::Fail,
            idle_ms: timeouts.idle_ms,
            deadline: attempt_deadline,
        };
        let body = match read_body(response, limits, state.clock()).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => return malformed(),
            Err(ReadError::Cut) => return failed_as(OutcomeClass::Reset),
            Err(ReadError::TimedOut) => return failed_as(OutcomeClass::Timeout),
        };
        let first_byte = begun.elapsed();
        let Some(answer) = wire::whole_answer(&body) else {
            return malformed();
        };
        if answer.is_error {
            // An error object with a success status: not an answer. Read
            // as an error answer's body is, so rules can tell what failed,
            // and never passed on as a success.
            let body = self.without_own_secret(index, body);
            return Attempted::Failed {
                outcome: AttemptOutcome {
                    class: OutcomeClass::Malformed,
                    facts: error_event_facts(status, &String::from_utf8_lossy(&body)),
                },
                passthrough: None,
            };
        }
        if self.plan.request.stream {
            // The client asked for a stream, and its SDK reads events: a
            // whole answer reaches it as a stream of none, silently empty.
            return Attempted::Failed {
                outcome: AttemptOutcome {
                    class: OutcomeClass::Malformed,
                    facts: OutcomeFacts {
                        error_message: Some(Arc::from(
                            "the provider sent a whole answer to a request for a stream",
                        )),
                        ..OutcomeFacts::default()
                    },
                },
                passthrough: None,
            };
        }
        let usage = answer.usage;
        let mut headers = self
            .plan
            .headers(&self.snapshot, Some(index), self.progress_now(), true);
        let mut response = respond::base(
            status,
            &self.request_id,
            "application/json",
            ProxyBody::full(body),
        );
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
        }
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case("content-type"));
        self.record_served(index, begun, Some(first_byte), usage, false);
        self.report.status = status;
        link.respond(respond::with_headers(response, &headers));
        Attempted::Served {
            usage,
            first_byte: Some(first_byte),
        }
    }

    /// A streamed answer: held until its first event (failover is still
    /// possible until then), then passed on event by event.
    async fn stream(
        &mut self,
        index: usize,
        response: reqwest::Response,
        timeouts: &Timeouts,
        begun: Instant,
        attempt_deadline: Option<u64>,
        link: &mut Link,
    ) -> Attempted {
        let endpoint = self.endpoint;
        let state = self.proxy.state.clone();
        let clock = state.clock();
        let status = response.status().as_u16();
        let mut upstream = response.bytes_stream();
        let mut reader = EventReader::default();
        let by_attempt = |at: u64| attempt_deadline.map_or(at, |limit| at.min(limit));
        // The first event's wait starts when the headers came, as documented:
        // a provider slow to send them has had the `headers` timeout for that.
        let headers_came_ms = clock.now_ms();
        let first_token_deadline = headers_came_ms.saturating_add(timeouts.first_token_ms);
        let first_deadline = by_attempt(first_token_deadline);
        // The attempt's own limit (or the budget) ending the wait is a
        // `timeout`, as documented; only the first-event limit is
        // `first_token_timeout`.
        let no_first_event = if first_deadline < first_token_deadline {
            OutcomeClass::Timeout
        } else {
            OutcomeClass::FirstTokenTimeout
        };
        // Silence is `idle`'s before the answer begins too, where the policy
        // gives it: from the headers on, any event (those that only
        // announce the answer, keep-alives, comments) shows the provider is
        // still there. Running out, the answer did not begin in time.
        let mut heard_ms = headers_came_ms;
        let failed = |class: OutcomeClass, message: Option<String>| Attempted::Failed {
            outcome: AttemptOutcome {
                class,
                facts: OutcomeFacts {
                    error_message: message.map(|m| Arc::from(m.as_str())),
                    ..OutcomeFacts::default()
                },
            },
            passthrough: None,
        };
        // The provider's error event: its error object read as an error
        // answer's is, so that rules on `upstream.error.*` tell one error
        // from another (an overload from a fault, an output limit from a
        // breakdown), before the commit and after it.
        let snapshot = self.snapshot.clone();
        let credential = self
            .plan
            .candidates
            .get(index)
            .map(|c| (c.provider, c.credential));
        let failed_with_error_event = move |class: OutcomeClass, event: &wire::Event| {
            let secret = credential.and_then(|(provider, key)| snapshot.secret(provider, key));
            let data = without_secret_of(secret, Bytes::from(event.data.clone()));
            Attempted::Failed {
                outcome: AttemptOutcome {
                    class,
                    facts: error_event_facts(status, &String::from_utf8_lossy(&data)),
                },
                passthrough: None,
            }
        };

        // Before the first event: nothing reached the client yet. What
        // announces the answer is held for it, up to as much as a whole
        // answer may hold (a Responses stream repeats the request's
        // instructions and tools in several of its announcements);
        // keep-alives are not, as they would reach the client all at once
        // with the answer.
        let mut held: Vec<Bytes> = Vec::new();
        let mut held_bytes = 0usize;
        let mut pending: VecDeque<wire::Event> = VecDeque::new();
        let mut usage = None;
        // The answer is complete once each choice asked for finished; a
        // message or a response has one.
        let choices = match endpoint {
            Endpoint::ChatCompletions | Endpoint::Completions => self.outgoing.choices(),
            _ => 1,
        };
        // Asked for, the usage comes in a chunk of its own after the last
        // choice finished: until it came, the end gets a longer grace.
        let usage_to_come = matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions)
            && self.outgoing.wants_usage();
        let mut finished_choices = ChoiceSet::default();
        // Some providers send a finish reason with every chunk (Gemini
        // behind some OpenAI-compatible relays, KoboldCpp's "null"): output
        // for a choice after its finish shows it, and from then on only the
        // stream's own end ends it.
        let mut finishes_hold = true;
        // A chat or completion stream ends early (without waiting for its
        // own end) only on a finish that brings no output of its own and
        // follows some: a finish on a chunk of output may be a relay's
        // finish on every chunk, not yet told apart by the output after
        // it. Other streams have one stop, told by its event.
        let tracks_output = matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions);
        let (mut output_seen, mut bare_finish) = (false, !tracks_output);
        let first_byte: Option<Duration>;
        // Whether events announcing the answer came (held, not yet sent).
        let mut opened = false;
        // Each chunk waits on the same timers, moved rather than made anew.
        let (mut hold, mut first_token, mut idle) =
            (Timer::default(), Timer::default(), Timer::default());
        'first: loop {
            while let Some(event) = pending.pop_front() {
                let reading = event.read(endpoint);
                let (kind, reported) = (reading.kind, reading.usage);
                match kind {
                    EventKind::Comment => {}
                    // Held with the first event of the answer itself: until
                    // that came, a stall or an error can still fail over,
                    // and the first token's limit still runs.
                    EventKind::Opening => {
                        held_bytes = held_bytes.saturating_add(event.raw.len());
                        if held_bytes > MAX_ANSWER_BODY {
                            return failed(
                                OutcomeClass::Malformed,
                                Some(String::from(
                                    "the provider's stream announced more than 64 MiB before any answer",
                                )),
                            );
                        }
                        usage = wire::accumulated_usage(usage, reported);
                        opened = true;
                        held.push(event.raw);
                    }
                    // An answer opened and ended with nothing in it (a
                    // Responses stream `incomplete` at once, by a content
                    // filter): the provider's own end, passed on after the
                    // commit.
                    EventKind::Sentinel if opened => {
                        first_byte = Some(begun.elapsed());
                        pending.push_front(event);
                        break 'first;
                    }
                    EventKind::Malformed => return failed(OutcomeClass::Malformed, None),
                    // An error in place of the answer.
                    EventKind::Error => {
                        return failed_with_error_event(OutcomeClass::Malformed, &event);
                    }
                    // The end before anything of an answer: an empty answer,
                    // not to be served as complete while failover can still
                    // find a real one. An answer that arrived whole in one
                    // chunk began with another event, and its end is taken
                    // after the commit.
                    EventKind::Sentinel => {
                        return failed(
                            OutcomeClass::Malformed,
                            Some(String::from(
                                "the provider's stream ended before any answer",
                            )),
                        );
                    }
                    kind => {
                        first_byte = Some(begun.elapsed());
                        usage = wire::accumulated_usage(usage, reported);
                        if let EventKind::Finished(those) = kind {
                            finished_choices = finished_choices.and(those);
                        }
                        output_seen = !reading.output.is_empty();
                        held.push(event.raw);
                        break 'first;
                    }
                }
            }
            // A ready chunk goes first, as in the committed loop; one that
            // keeps coming could then keep the deadline's timer from ever
            // being polled, so a provider sending only comments is held to
            // the deadline here, even when a chunk is waiting at that
            // moment (its event came after the deadline all the same).
            if clock.now_ms() >= first_deadline {
                return failed(no_first_event, None);
            }
            let (holding, hold_at) = (self.holding(link), self.hold_until());
            let silent_deadline = timeouts
                .silence_before_answer_ms
                .map_or(u64::MAX, |idle_ms| heard_ms.saturating_add(idle_ms));
            let chunk = tokio::select! {
                biased;
                chunk = upstream.next() => Some(chunk),
                () = async { hold.until(clock, hold_at).await }, if holding => {
                    self.send_stream_head(None, link);
                    continue;
                }
                () = first_token.until(clock, first_deadline.min(silent_deadline)) => None,
            };
            let bytes = match chunk {
                None if silent_deadline < first_deadline => {
                    return failed(OutcomeClass::FirstTokenTimeout, None);
                }
                None => return failed(no_first_event, None),
                // A whole body that held no event was no stream: an HTML
                // page, NDJSON, a JSON object sent under another type
                // (read for `upstream.error.*` as an error answer is).
                Some(None) if !reader.pending().trim_ascii().is_empty() => {
                    let facts = outcome_facts(
                        status,
                        &HeaderMap::new(),
                        reader.pending(),
                        SystemTime::now(),
                    );
                    return Attempted::Failed {
                        outcome: AttemptOutcome {
                            class: OutcomeClass::Malformed,
                            facts: OutcomeFacts {
                                error_message: facts.error_message.or_else(|| {
                                    Some(Arc::from("the provider's answer held no event"))
                                }),
                                ..facts
                            },
                        },
                        passthrough: None,
                    };
                }
                // The connection ended before the answer began: nothing
                // reached the client, like a reset before the headers.
                Some(None) | Some(Some(Err(_))) => return failed(OutcomeClass::Reset, None),
                Some(Some(Ok(bytes))) => bytes,
            };
            heard_ms = clock.now_ms();
            match reader.push(&bytes) {
                Ok(events) => pending.extend(events),
                Err(_) => return failed(OutcomeClass::Malformed, None),
            }
        }
        // Committed, the usage reported so far is the request's, however
        // the stream ends: the tokens were spent, and the log line says so.
        self.report.usage = usage;
        let committed_deadline = match timeouts.after_commit {
            AfterCommit::AttemptAndBudget => attempt_deadline,
            AfterCommit::Within(ms) => Some(clock.now_ms().saturating_add(ms)),
            AfterCommit::Unlimited => None,
        };
        // The watchdog only cuts a client that stopped taking events. With
        // no limit after the commit it still watches from the attempt's own
        // limit on: a client that reads goes on, and one that stopped
        // cannot hold the stream and its room forever. With no limit at
        // all, a client that takes nothing for as long as the stream may be
        // silent (and at least the proxy's floor for it) has stopped all
        // the same.
        let watched = committed_deadline.or(attempt_deadline);
        let stall_floor_ms =
            u64::try_from(self.proxy.limits.stream_client_stall.as_millis()).unwrap_or(u64::MAX);
        let _watch = StreamWatch::set(
            self.connection.as_ref(),
            watched.map(|limit| limit.saturating_sub(clock.now_ms())),
            watched
                .is_none()
                .then(|| timeouts.idle_ms.max(stall_floor_ms).min(MAX_DURATION_MS)),
        );
        let attempt_deadline = committed_deadline;
        let by_attempt = |at: u64| attempt_deadline.map_or(at, |limit| at.min(limit));
        if !self.commit(index, held, link).await {
            return Attempted::Cancelled;
        }

        // Committed: nothing fails over from here on.
        let finished_with = |usage| FinishedStream {
            index,
            begun,
            first_byte,
            usage,
            recorded: false,
        };
        loop {
            while let Some(event) = pending.pop_front() {
                let reading = event.read(endpoint);
                let (kind, reported) = (reading.kind, reading.usage);
                match kind {
                    // Some Anthropic-format relays (GitHub Copilot's) end a
                    // finished stream with OpenAI's `[DONE]`: the answer
                    // is whole, and ends as the client's format ends one.
                    EventKind::Malformed
                        if event.is_done_marker()
                            && finishes_hold
                            && finished_choices.are_all_of(choices) =>
                    {
                        return self.end_finished(finished_with(usage), link).await;
                    }
                    EventKind::Malformed => {
                        return failed(
                            OutcomeClass::StreamBroken,
                            Some(String::from("the provider sent a malformed event")),
                        );
                    }
                    // The client gets an error event of the policy's own
                    // (no sentinel); the provider's says why it broke off.
                    EventKind::Error => {
                        return failed_with_error_event(OutcomeClass::StreamBroken, &event);
                    }
                    _ => {}
                }
                usage = wire::accumulated_usage(usage, reported);
                self.report.usage = usage;
                if reading.output.overlaps(finished_choices) {
                    finishes_hold = false;
                }
                if let EventKind::Finished(those) = kind {
                    finished_choices = finished_choices.and(those);
                    bare_finish = !tracks_output || (output_seen && reading.output.is_empty());
                }
                output_seen |= !reading.output.is_empty();
                if kind == EventKind::Sentinel {
                    self.record_end(finished_with(usage));
                }
                if !link.send(event.raw).await {
                    return Attempted::Cancelled;
                }
                if let Some(connection) = &self.connection {
                    connection.event_taken();
                }
                if kind == EventKind::Sentinel {
                    return Attempted::Served { usage, first_byte };
                }
            }
            let all_finished = finished_choices.are_all_of(choices);
            let finished = finishes_hold && all_finished;
            // Cleared again by a choice that was not asked for.
            self.finished_stream = finished.then(|| finished_with(usage));
            let wait = match (finished && bare_finish, usage_to_come && usage.is_none()) {
                (true, false) => FINISHED_GRACE_MS.min(timeouts.idle_ms),
                (true, true) => USAGE_GRACE_MS.min(timeouts.idle_ms),
                (false, _) => timeouts.idle_ms,
            };
            let wake = by_attempt(clock.now_ms().saturating_add(wait));
            let past_attempt_deadline =
                || attempt_deadline.is_some_and(|limit| clock.now_ms() >= limit);
            // A ready chunk goes before an idle wait that ran out at the
            // same time (`biased`). Both are ready together when the
            // exchange was not polled for a while: it runs inside the
            // response body, which waits while the client does not read,
            // and the provider kept sending meanwhile; that is no stall,
            // though an unbiased `select!` took it for one half the time.
            // (No test forces it: it needs the client's socket buffers
            // full at the moment the wait runs out.) Taking chunks first
            // cannot starve the idle wait, which each chunk restarts anyway;
            // the attempt's deadline, which chunks do not move, is checked
            // before each wait.
            let chunk = if past_attempt_deadline() {
                None
            } else {
                tokio::select! {
                    biased;
                    chunk = upstream.next() => Some(chunk),
                    () = idle.until(clock, wake) => None,
                }
            };
            let out_of_time = past_attempt_deadline();
            let body_ended = matches!(chunk, Some(None));
            match chunk {
                Some(Some(Ok(bytes))) => match reader.push(&bytes) {
                    Ok(events) => pending.extend(events),
                    Err(_) => {
                        return failed(
                            OutcomeClass::StreamBroken,
                            Some(String::from("the provider sent an event without end")),
                        );
                    }
                },
                // The answer is complete but its end marker is missing:
                // finish it as the client expects, promptly. A body that
                // ended cleanly after every choice's finish ended the
                // stream itself, whatever its finishes were worth.
                _ if finished || (all_finished && body_ended) => {
                    return self.end_finished(finished_with(usage), link).await;
                }
                None if out_of_time => {
                    return failed(
                        OutcomeClass::StreamBroken,
                        Some(String::from("the attempt ran out of time")),
                    );
                }
                None => {
                    return failed(
                        OutcomeClass::StreamBroken,
                        Some(String::from("the provider's stream stalled")),
                    );
                }
                Some(None) | Some(Some(Err(_))) => {
                    return failed(
                        OutcomeClass::StreamBroken,
                        Some(String::from("the provider's stream was cut off")),
                    );
                }
            }
        }
    }

    /// Ends a finished stream whose own end is missing (or not the
    /// client's format's): its measurements recorded, then the sentinel.
    async fn end_finished(&mut self, finished: FinishedStream, link: &mut Link) -> Attempted {
        let (usage, first_byte) = (finished.usage, finished.first_byte);
        self.record_end(finished);
        if let Some(sentinel) = wire::sentinel(self.endpoint)
            && !link.send(sentinel).await
        {
            return Attempted::Cancelled;
        }
        Attempted::Served { usage, first_byte }
    }

    /// Sends a stream's headers: all of the policy's when the serving
    /// candidate is known (it is answering), otherwise those that do not
    /// read `served`; the provider then follows as the `late_comment`.
    fn send_stream_head(&mut self, served: Option<usize>, link: &mut Link) {
        let headers = self.plan.headers(
            &self.snapshot,
            served,
            self.progress_now(),
            served.is_some(),
        );
        let mut head = respond::base(
            200,
            &self.request_id,
            "text/event-stream",
            ProxyBody::empty(),
        );
        head.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        self.head_sent = link.open(respond::with_headers(head, &headers)) || self.head_sent;
    }

    /// Commits to the candidate: headers (if still held) and the events
    /// received so far go to the client.
    async fn commit(&mut self, index: usize, held: Vec<Bytes>, link: &mut Link) -> bool {
        // Committed: no attempt follows this one.
        self.outgoing.release();
        self.committed = Some(index);
        if self.head_sent {
            if let Some(comment) = self.plan.late_comment(&self.snapshot, index) {
                let line: String = comment.replace(['\r', '\n'], " ");
                if !link.send(Bytes::from(format!(": {line}\n\n"))).await {
                    return false;
                }
            }
        } else {
            self.send_stream_head(Some(index), link);
        }
        for bytes in held {
            if !link.send(bytes).await {
                return false;
            }
        }
        link.is_open()
    }
}

/// Whether a `Content-Type` names an event stream: media types are
/// case-insensitive, and may carry parameters (`; charset=utf-8`).
fn is_event_stream(content_type: &str) -> bool {
    media_type(content_type).eq_ignore_ascii_case("text/event-stream")
}

/// Whether a `Content-Type` is JSON: `application/json`, or a type with
/// the `+json` suffix (RFC 6839).
fn is_json(content_type: &str) -> bool {
    let media_type = media_type(content_type).as_bytes();
    media_type.eq_ignore_ascii_case(b"application/json")
        || media_type
            .len()
            .checked_sub(5)
            .and_then(|start| media_type.get(start..))
            .is_some_and(|suffix| suffix.eq_ignore_ascii_case(b"+json"))
}

/// A `Content-Type`'s media type, without its parameters.
fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

impl Drop for Exchange {
    /// Dropped before it ended: the request's future went with its client
    /// (or with the connection, when the drain time ran out). The attempt
    /// under way ends as `cancelled`, and the log line says so.
    fn drop(&mut self) {
        if self.log.is_none() {
            return;
        }
        self.cancel();
        if let Some((index, begun)) = self.attempting.take() {
            self.record_attempt(index, begun, self.report.outcome.to_string());
        }
        self.write_log();
    }
}

/// An exchange under way, not yet polled: its future, and the slot where
/// it leaves its answer.
pub struct Started {
    run: Pin<Box<dyn Future<Output = ()> + Send>>,
    slot: AnswerSlot,
}

pub fn start(exchange: Exchange, cut: Arc<ConnectionCut>) -> Started {
    let slot = AnswerSlot::default();
    Started {
        run: Box::pin(exchange.run(Link::Pending(slot.clone()), cut)),
        slot,
    }
}

/// Runs the exchange on the request's own task until its answer (or a
/// stream's headers) is ready. A stream's events are read by the same
/// exchange as hyper polls the body: no task or cross-thread wake-up per
/// request. `None` only if the exchange ended without answering (a bug).
pub async fn answer(started: Started) -> Option<Response<ProxyBody>> {
    let Started { mut run, slot } = started;
    let mut running = true;
    // The slot is filled only while `run` is polled here: it needs no waker.
    let mut response = std::future::poll_fn(|cx| {
        if running && run.as_mut().poll(cx).is_ready() {
            running = false;
        }
        match take_answer(&slot) {
            Some(response) => Poll::Ready(Some(response)),
            None if running => Poll::Pending,
            None => Poll::Ready(None),
        }
    })
    .await?;
    if running {
        match response.body_mut() {
            ProxyBody::Stream { exchange, .. } => *exchange = Some(run),
            // What is left after a whole answer is bookkeeping: finish it
            // before the answer goes out, so it ends with the exchange.
            ProxyBody::Full(_) => run.await,
        }
    }
    Some(response)
}

fn without_secret_of(secret: Option<&Secret>, text: Bytes) -> Bytes {
    match secret {
        Some(secret) => super::upstream::without_secret(text, secret.expose()),
        None => text,
    }
}

fn scope_name(scope: HealthScope) -> &'static str {
    match scope {
        HealthScope::Provider => "provider",
        HealthScope::Route => "route",
        HealthScope::Credential => "credential",
    }
}

/// Why a body was not read whole.
enum ReadError {
    /// The provider's connection dropped mid-body.
    Cut,
    /// A chunk (or the attempt's deadline) did not come in time.
    TimedOut,
    TooLarge,
}

/// How much of a body to read, and for how long.
struct BodyLimits {
    max_bytes: usize,
    oversize: Oversize,
    /// Each chunk must arrive within this.
    idle_ms: u64,
    /// All of it by then (the attempt's deadline), on the clock.
    deadline: Option<u64>,
}

/// What a body larger than allowed becomes.
enum Oversize {
    /// A failed read (an answer too large to pass on).
    Fail,
    /// Its first `max_bytes` (an error body, kept for its message).
    Truncate,
}

/// Reads a whole body within `limits`.
async fn read_body(
    response: reqwest::Response,
    limits: BodyLimits,
    clock: &dyn Clock,
) -> Result<Bytes, ReadError> {
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    let mut idle = Timer::default();
    loop {
        let idle_deadline = clock.now_ms().saturating_add(limits.idle_ms);
        let wake = limits
            .deadline
            .map_or(idle_deadline, |limit| limit.min(idle_deadline));
        let chunk = tokio::select! {
            () = idle.until(clock, wake) => None,
            chunk = stream.next() => Some(chunk),
        };
        match chunk {
            Some(Some(Ok(bytes))) => {
                let room = limits.max_bytes.saturating_sub(body.len());
                if bytes.len() > room {
                    return match limits.oversize {
                        Oversize::Fail => Err(ReadError::TooLarge),
                        Oversize::Truncate => {
                            body.extend_from_slice(bytes.get(..room).unwrap_or_default());
                            Ok(Bytes::from(body))
                        }
                    };
                }
                body.extend_from_slice(&bytes);
            }
            Some(None) => return Ok(Bytes::from(body)),
            Some(Some(Err(_))) => return Err(ReadError::Cut),
            None => return Err(ReadError::TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_event_stream, is_json};

    #[test]
    fn an_event_stream_is_known_by_its_media_type_in_any_case() {
        assert!(is_event_stream("text/event-stream"));
        assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
        assert!(is_event_stream(" text/event-stream ;charset=utf-8"));
        assert!(!is_event_stream("text/event-streamx"));
        assert!(!is_event_stream("application/json"));
    }

    #[test]
    fn json_is_known_by_its_media_type_or_suffix() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/problem+json"));
        assert!(!is_json("application/x-ndjson"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/jsonx"));
    }
}
