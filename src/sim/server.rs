//! The HTTP side: accepting connections, routing `/{provider}/v1/...`,
//! choosing the scenario step, and playing it out in time.

use super::body::{Feed, Gone, SimBody, read_limited};
use super::record::{Record, RecordedRequest, body_json};
use super::scenario::{Scenario, SequenceKey, Settings};
use super::step::{Action, Ending, ErrorReply, Step, Success};
use super::wire::{self, Answer, StreamEvents};
use crate::data::Endpoint;
use crate::state::Clock;
use crate::sync::lock;
use bytes::Bytes;
use hyper::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Largest request body read; larger ones are answered 413.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// How long shutdown waits for connections to close before dropping them;
/// answers in progress end at once when the sim stops, so this is a bound,
/// not a wait.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(2);

/// Pause after a failed accept (out of file descriptors), so the loop does
/// not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What the server and the handle share.
#[derive(Debug)]
pub struct Shared {
    started: Instant,
    /// Makes answer ids unique.
    serial: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    scenario: Scenario,
    /// Requests each sequence has answered so far.
    positions: HashMap<SequenceKey, usize>,
    record: Record,
}

impl Shared {
    pub fn new(scenario: Scenario) -> Shared {
        Shared {
            started: Instant::now(),
            serial: AtomicU64::new(1),
            state: Mutex::new(State {
                scenario,
                positions: HashMap::new(),
                record: Record::default(),
            }),
        }
    }

    /// The state; a panic elsewhere while it was held leaves it usable, as
    /// every change to it is a single assignment or push.
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state().record.to_vec()
    }

    pub fn set_scenario(&self, scenario: Scenario) {
        let mut state = self.state();
        state.scenario = scenario;
        state.positions.clear();
    }

    pub fn clear(&self) {
        let mut state = self.state();
        state.record.clear();
        state.positions.clear();
    }

    pub fn providers(&self) -> Vec<String> {
        self.state()
            .scenario
            .providers()
            .map(str::to_string)
            .collect()
    }
}

/// What steps are played out against: the signal that the sim is told to
/// stop, and the clock its pauses run on.
#[derive(Clone)]
pub struct Timing {
    pub stopped: watch::Receiver<bool>,
    /// `None`: the runtime's own timer. A test that drives the proxy's
    /// clock by hand can drive the sim's pauses with the same clock.
    pub clock: Option<Arc<dyn Clock>>,
}

impl Timing {
    /// Resolves once the sim is told to stop (or its handle is gone).
    async fn stopped(&self) {
        let mut receiver = self.stopped.clone();
        // An error means the handle was dropped, which also stops the sim.
        let _ = receiver.wait_for(|stopped| *stopped).await;
    }

    async fn sleep(&self, duration: Duration) {
        match &self.clock {
            None => tokio::time::sleep(duration).await,
            Some(clock) => {
                let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
                clock.sleep_until(clock.now_ms().saturating_add(ms)).await;
            }
        }
    }
}

/// Waits `duration`; `Err` when the sim stops first.
async fn pause(duration: Duration, timing: &Timing) -> Result<(), Stopped> {
    if duration.is_zero() {
        return Ok(());
    }
    tokio::select! {
        () = timing.sleep(duration) => Ok(()),
        () = timing.stopped() => Err(Stopped),
    }
}

struct Stopped;

/// Returned by the service to make hyper drop the connection without
/// writing a response: a reset, a no-answer at shutdown, a client gone.
#[derive(Debug)]
pub struct CloseConnection;

impl fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the scenario closes this connection")
    }
}

impl std::error::Error for CloseConnection {}

/// Accepts connections until told to stop, then waits for every
/// connection to close.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, timing: Timing) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, Arc::clone(&shared), timing.clone()));
                }
                Err(error) => {
                    tracing::warn!(%error, "sim: accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            () = timing.stopped() => break,
        }
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_LIMIT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
}

async fn connection(stream: TcpStream, shared: Arc<Shared>, timing: Timing) {
    // Stream events are small writes; without this they could wait for
    // the previous one to be acknowledged.
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "sim: cannot set TCP_NODELAY");
    }
    let service_timing = timing.clone();
    let service =
        service_fn(move |request| handle(Arc::clone(&shared), service_timing.clone(), request));
    let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = timing.stopped() => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

async fn handle(
    shared: Arc<Shared>,
    timing: Timing,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<SimBody>, CloseConnection> {
    let (parts, body) = request.into_parts();
    let body = read_limited(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| CloseConnection)?;
    if let Some(route) = parts.uri.path().strip_prefix("/_sim/") {
        return Ok(control(&shared, &parts.method, route, body));
    }
    // No provider's path (a provider's name is never empty and never
    // starts with `_`): not recorded, and answered as an unknown control
    // endpoint.
    let (provider, _) = split_provider(parts.uri.path());
    if provider.is_empty() || provider.starts_with('_') {
        return Ok(control(&shared, &parts.method, "", body));
    }
    match shared.plan(&parts, body) {
        Plan::Reply(response) => Ok(response),
        Plan::Play(play) => play.run(&timing).await,
    }
}

// ------------------------------------------------------- control endpoints

/// `/_sim/requests` (GET the record, DELETE to clear it) and
/// `/_sim/scenario` (POST a new scenario as YAML).
fn control(
    shared: &Shared,
    method: &Method,
    route: &str,
    body: Option<Bytes>,
) -> Response<SimBody> {
    match (route, method) {
        ("requests", &Method::GET) => json_response(
            StatusCode::OK,
            &serde_json::to_value(shared.requests()).unwrap_or(Json::Null),
        ),
        ("requests", &Method::DELETE) => {
            shared.clear();
            empty_response(StatusCode::NO_CONTENT)
        }
        ("scenario", &Method::POST) => {
            let parsed = match body.as_deref().map(std::str::from_utf8) {
                Some(Ok(text)) => {
                    Scenario::parse(text, "scenario").map_err(|problem| problem.to_string())
                }
                // As the command line says of such a file.
                Some(Err(_)) => Err(String::from("scenario: it is not UTF-8 text")),
                None => Err(String::from("scenario: a scenario is at most 1 MiB")),
            };
            match parsed {
                Ok(scenario) => {
                    shared.set_scenario(scenario);
                    empty_response(StatusCode::NO_CONTENT)
                }
                Err(message) => control_error(StatusCode::BAD_REQUEST, &message),
            }
        }
        ("requests", _) => allowing(
            control_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET or DELETE on /_sim/requests",
            ),
            "GET, DELETE",
        ),
        ("scenario", _) => allowing(
            control_error(StatusCode::METHOD_NOT_ALLOWED, "use POST on /_sim/scenario"),
            "POST",
        ),
        _ => control_error(
            StatusCode::NOT_FOUND,
            "the sim's own endpoints are /_sim/requests and /_sim/scenario",
        ),
    }
}

/// A 405 with the `Allow` header RFC 9110 requires of it.
fn allowing(mut response: Response<SimBody>, methods: &'static str) -> Response<SimBody> {
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(methods));
    response
}

fn control_error(status: StatusCode, message: &str) -> Response<SimBody> {
    json_response(status, &serde_json::json!({"error": {"message": message}}))
}

// ------------------------------------------------------------ the decision

/// What to do with a provider request.
enum Plan {
    /// Answer at once: the sim refuses the request, or lists models.
    Reply(Response<SimBody>),
    /// Play a scenario step.
    Play(Play),
}

/// A scenario step with everything needed to play it.
struct Play {
    step: Step,
    settings: Settings,
    endpoint: Endpoint,
    stream: bool,
    provider: String,
    model: String,
    request: Json,
    serial: u64,
}

/// `/aki-io/v1/chat/completions` → (`aki-io`, `/v1/chat/completions`).
fn split_provider(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    match path.find('/') {
        Some(at) => path.split_at(at),
        None => (path, ""),
    }
}

fn header_map(parts: &Parts) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        headers
            .entry(name.as_str().to_string())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    headers
}

impl Shared {
    /// Records the request and decides its answer, advancing its sequence.
    fn plan(&self, parts: &Parts, body: Option<Bytes>) -> Plan {
        let path = parts.uri.path();
        let (provider, rest) = split_provider(path);
        let json = body_json(body.as_ref());
        let model = json.get("model").and_then(Json::as_str).map(str::to_string);
        let endpoint = Endpoint::from_path(rest);
        let stream = endpoint.is_some_and(|endpoint| endpoint != Endpoint::Embeddings)
            && json.get("stream").and_then(Json::as_bool) == Some(true);
        let mut state = self.state();
        let decision = decide(
            &mut state,
            parts,
            provider,
            rest,
            endpoint,
            body.is_none(),
            &json,
        );
        let step = match &decision {
            Decision::Reply(_) => None,
            Decision::Play { step, .. } => Some(step.text.clone()),
        };
        tracing::info!(
            "{} {path} model={} step={}",
            parts.method,
            model.as_deref().unwrap_or("-"),
            step.as_deref().unwrap_or("-"),
        );
        state.record.push(
            RecordedRequest {
                provider: provider.to_string(),
                model,
                method: parts.method.to_string(),
                path: path.to_string(),
                at_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                stream,
                body: Json::Null,
                headers: header_map(parts),
                step,
            },
            body,
        );
        drop(state);
        match decision {
            Decision::Reply(response) => Plan::Reply(response),
            Decision::Play {
                step,
                settings,
                endpoint,
                model,
            } => Plan::Play(Play {
                step,
                settings,
                endpoint,
                stream,
                provider: provider.to_string(),
                model,
                request: json,
                serial: self.serial.fetch_add(1, Ordering::Relaxed),
            }),
        }
    }
}

enum Decision {
    Reply(Response<SimBody>),
    Play {
        step: Step,
        settings: Settings,
        endpoint: Endpoint,
        model: String,
    },
}

fn decide(
    state: &mut State,
    parts: &Parts,
    provider: &str,
    rest: &str,
    endpoint: Option<Endpoint>,
    too_large: bool,
    json: &Json,
) -> Decision {
    let error = |endpoint: Endpoint, status: StatusCode, code: &str, message: String| {
        error_response(endpoint, status, Some(code), &message, None)
    };
    let refuse = |endpoint: Endpoint, status: StatusCode, code: &str, message: String| {
        Decision::Reply(error(endpoint, status, code, message))
    };
    let Some(models) = state.scenario.models(provider) else {
        return refuse(
            Endpoint::ChatCompletions,
            StatusCode::NOT_FOUND,
            "unknown_provider",
            format!("the sim has no provider `{provider}`"),
        );
    };
    if rest == "/v1/models" {
        if parts.method != Method::GET {
            let response = error(
                Endpoint::ChatCompletions,
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                String::from("the model list is read with GET"),
            );
            return Decision::Reply(allowing(response, "GET"));
        }
        let models: Vec<&str> = models.collect();
        return Decision::Reply(json_response(
            StatusCode::OK,
            &wire::models_body(provider, &models),
        ));
    }
    let Some(endpoint) = endpoint else {
        return refuse(
            Endpoint::ChatCompletions,
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            format!("`{rest}` is not an endpoint of the sim's providers"),
        );
    };
    if parts.method != Method::POST {
        let response = error(
            endpoint,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("`{rest}` takes POST"),
        );
        return Decision::Reply(allowing(response, "POST"));
    }
    if too_large {
        return refuse(
            endpoint,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        );
    }
    let Some(model) = json.get("model").and_then(Json::as_str) else {
        return refuse(
            endpoint,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            String::from("the body must be a JSON object with a string `model`"),
        );
    };
    let Some(script) = state.scenario.script(provider, model) else {
        return refuse(
            endpoint,
            StatusCode::NOT_FOUND,
            "unknown_provider",
            format!("the sim has no provider `{provider}`"),
        );
    };
    let step = match script.sequence {
        Some(sequence) => {
            let key = SequenceKey {
                provider: provider.to_string(),
                model: script.per_model.then(|| model.to_string()),
            };
            let position = state.positions.entry(key).or_insert(0);
            let step = sequence.step_at(*position);
            *position = position.saturating_add(1);
            step
        }
        None => Step::success(),
    };
    Decision::Play {
        step,
        settings: script.settings,
        endpoint,
        model: model.to_string(),
    }
}

// ------------------------------------------------------------ playing a step

impl Play {
    async fn run(self, timing: &Timing) -> Result<Response<SimBody>, CloseConnection> {
        if self.step.action == Action::NoAnswer {
            timing.stopped().await;
            return Err(CloseConnection);
        }
        let before_headers = self.step.slow_headers.unwrap_or(self.settings.latency);
        pause(before_headers, timing)
            .await
            .map_err(|Stopped| CloseConnection)?;
        match &self.step.action {
            Action::NoAnswer | Action::Reset => Err(CloseConnection),
            Action::Error(reply) => Ok(self.error(reply)),
            Action::Malformed { first_token } => Ok(self.malformed(*first_token, timing)),
            Action::Success(success) => Ok(self.success(success, timing)),
        }
    }

    fn answer(&self) -> Answer<'_> {
        Answer {
            provider: &self.provider,
            model: &self.model,
            serial: self.serial,
            created: unix_seconds(),
            usage: self.settings.usage,
            chunks: self.settings.chunks,
            request: &self.request,
        }
    }

    /// The events of the answer, when the request asked for a stream and
    /// the endpoint streams.
    fn stream_events(&self) -> Option<StreamEvents> {
        if self.stream {
            self.answer().stream(self.endpoint)
        } else {
            None
        }
    }

    fn error(&self, reply: &ErrorReply) -> Response<SimBody> {
        let status =
            StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = reply
            .message
            .clone()
            .unwrap_or_else(|| format!("{} answered {} (simulated)", self.provider, reply.status));
        error_response(
            self.endpoint,
            status,
            reply.code.as_deref(),
            &message,
            reply.retry_after,
        )
    }

    /// A 200 that is not valid JSON: half the body, or a stream of half its
    /// first event.
    fn malformed(&self, first_token: Option<Duration>, timing: &Timing) -> Response<SimBody> {
        let Some(events) = self.stream_events() else {
            let whole = self.answer().body(self.endpoint).to_string();
            return with_json_type(
                StatusCode::OK,
                SimBody::whole(wire::first_half(&whole).to_string()),
            );
        };
        let first = events.preamble.first().or(events.chunks.first());
        let text = first
            .map(wire::Event::to_malformed_text)
            .unwrap_or_default();
        let delay = first_token.unwrap_or(self.settings.first_token);
        let (mut feed, body) = SimBody::channel();
        let timing = timing.clone();
        tokio::spawn(async move {
            if pause(delay, &timing).await.is_ok() {
                let _ = feed.send(text).await;
            }
        });
        stream_response(StatusCode::OK, body)
    }

    /// The message of `error_after`'s error when the step gives none.
    fn failure_message(&self, message: Option<&str>) -> String {
        message.map_or_else(
            || format!("{} failed mid-answer (simulated)", self.provider),
            str::to_string,
        )
    }

    /// The error event an `error_after` stream ends with; `None` for the
    /// other endings. The events before the first chunk go out with it
    /// (unless keep-alives come first), so after none they were not sent
    /// either.
    fn stream_error(&self, success: &Success, events: &StreamEvents) -> Option<wire::Event> {
        let Ending::ErrorAfter {
            chunks,
            code,
            message,
        } = &success.ending
        else {
            return None;
        };
        let chunks_sent = events
            .chunks
            .len()
            .min(usize::try_from(*chunks).unwrap_or(usize::MAX));
        let events_sent = match chunks_sent {
            0 if success.ping_every.is_none() => 0,
            sent => events.preamble.len() + sent,
        };
        Some(wire::stream_error(
            self.endpoint,
            code.as_deref(),
            &self.failure_message(message.as_deref()),
            events_sent,
        ))
    }

    fn success(&self, success: &Success, timing: &Timing) -> Response<SimBody> {
        let status = StatusCode::from_u16(success.status).unwrap_or(StatusCode::OK);
        if let Some(events) = self.stream_events() {
            let stream_error = self.stream_error(success, &events);
            let (feed, body) = SimBody::channel();
            let producer = Producer {
                feed,
                timing: timing.clone(),
            };
            let keep_alive = wire::keep_alive(self.endpoint);
            tokio::spawn(producer.stream(
                events,
                success.clone(),
                self.settings,
                (stream_error, keep_alive),
            ));
            return stream_response(status, body);
        }
        let whole = self.answer().body(self.endpoint).to_string();
        match &success.ending {
            Ending::CutAfter(_) | Ending::StallAfter(_) => {
                let (feed, body) = SimBody::channel();
                let producer = Producer {
                    feed,
                    timing: timing.clone(),
                };
                tokio::spawn(producer.partial_body(whole, success.ending.clone()));
                with_json_type(status, body)
            }
            // A whole answer has no chunks to send first: the error alone,
            // under the step's status, as some providers answer.
            Ending::ErrorAfter { code, message, .. } => {
                let error = wire::failed_answer_error(
                    self.endpoint,
                    code.as_deref(),
                    &self.failure_message(message.as_deref()),
                );
                json_response(status, &error)
            }
            Ending::Complete | Ending::NoTerminator | Ending::Linger => {
                with_json_type(status, SimBody::whole(whole))
            }
        }
    }
}

/// Feeds a channel body in time.
struct Producer {
    feed: Feed,
    timing: Timing,
}

impl Producer {
    async fn pause(&self, duration: Duration) -> Result<(), Gone> {
        pause(duration, &self.timing).await.map_err(|Stopped| Gone)
    }

    /// Sends nothing more until the client leaves, or the sim stops (then
    /// the body is cut rather than ended cleanly).
    async fn stall(self) {
        tokio::select! {
            () = self.feed.closed() => {}
            () = self.timing.stopped() => self.feed.abort().await,
        }
    }

    /// Cuts the body once what was sent is written, unless the sim stops first.
    async fn cut(self) {
        let Producer { feed, timing } = self;
        tokio::select! {
            () = feed.cut() => {}
            () = timing.stopped() => {}
        }
    }

    /// Plays the stream; `stream_error` is the error event an
    /// `error_after` stream ends with, `keep_alive` what `ping_every` sends.
    async fn stream(
        mut self,
        events: StreamEvents,
        success: Success,
        settings: Settings,
        (stream_error, keep_alive): (Option<wire::Event>, String),
    ) {
        match self
            .play_stream(&events, &success, &settings, &keep_alive)
            .await
        {
            Ok(()) => match success.ending {
                Ending::CutAfter(_) => self.cut().await,
                Ending::StallAfter(_) | Ending::Linger => self.stall().await,
                // Then a normal close, as a provider's after its error (a
                // client already gone gets nothing either way).
                Ending::ErrorAfter { .. } => {
                    if let Some(event) = stream_error {
                        let _ = self.feed.send(event.to_text()).await;
                    }
                }
                Ending::Complete | Ending::NoTerminator => {}
            },
            Err(Gone) => self.feed.abort().await,
        }
    }

    /// Sends the stream up to its ending.
    async fn play_stream(
        &mut self,
        events: &StreamEvents,
        success: &Success,
        settings: &Settings,
        keep_alive: &str,
    ) -> Result<(), Gone> {
        let last_chunk = match success.ending {
            Ending::CutAfter(chunks)
            | Ending::StallAfter(chunks)
            | Ending::ErrorAfter { chunks, .. } => Some(chunks),
            Ending::Complete | Ending::NoTerminator | Ending::Linger => None,
        };
        let first_token = success.first_token.unwrap_or(settings.first_token);
        match success.ping_every {
            // As Anthropic sends them: the answer announced at once, then
            // pings while the model works.
            Some(every) => {
                for event in &events.preamble {
                    self.feed.send(event.to_text()).await?;
                }
                let mut waited = Duration::ZERO;
                while waited + every < first_token {
                    self.pause(every).await?;
                    self.feed.send(keep_alive.to_string()).await?;
                    waited += every;
                }
                self.pause(first_token - waited).await?;
            }
            None => self.pause(first_token).await?,
        }
        for (number, chunk) in (1u32..).zip(&events.chunks) {
            if last_chunk.is_some_and(|last| number > last) {
                return Ok(());
            }
            if number == 1 {
                // Unless they went out with the headers, the events before
                // the content go out with the first chunk, so `cut_after=0`
                // and `stall_after=0` send nothing at all (and
                // `error_after=0` only its error).
                if success.ping_every.is_none() {
                    for event in &events.preamble {
                        self.feed.send(event.to_text()).await?;
                    }
                }
            } else {
                self.pause(settings.chunk_interval).await?;
            }
            let text = if success.malformed_chunk == Some(number) {
                chunk.to_malformed_text()
            } else {
                chunk.to_text()
            };
            self.feed.send(text).await?;
        }
        if last_chunk.is_some() {
            return Ok(());
        }
        for event in &events.closing {
            self.feed.send(event.to_text()).await?;
        }
        if success.ending == Ending::Complete {
            self.feed.send(events.terminator.to_text()).await?;
        }
        Ok(())
    }

    /// A JSON body of which only the first half is sent, then cut or stalled.
    async fn partial_body(mut self, whole: String, ending: Ending) {
        if self
            .feed
            .send(wire::first_half(&whole).to_string())
            .await
            .is_err()
        {
            return;
        }
        match ending {
            Ending::StallAfter(_) => self.stall().await,
            _ => self.cut().await,
        }
    }
}

// ------------------------------------------------------------- responses

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn with_json_type(status: StatusCode, body: SimBody) -> Response<SimBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn json_response(status: StatusCode, json: &Json) -> Response<SimBody> {
    with_json_type(status, SimBody::whole(json.to_string()))
}

fn empty_response(status: StatusCode) -> Response<SimBody> {
    let mut response = Response::new(SimBody::empty());
    *response.status_mut() = status;
    response
}

fn stream_response(status: StatusCode, body: SimBody) -> Response<SimBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// An error in the endpoint's wire format, with `Retry-After` in whole
/// seconds (rounded up) when given.
fn error_response(
    endpoint: Endpoint,
    status: StatusCode,
    code: Option<&str>,
    message: &str,
    retry_after: Option<Duration>,
) -> Response<SimBody> {
    let body = wire::error_body(endpoint, status.as_u16(), code, message);
    let mut response = json_response(status, &body);
    if let Some(retry_after) = retry_after {
        let seconds = retry_after.as_millis().div_ceil(1000);
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(RETRY_AFTER, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_is_the_first_segment() {
        assert_eq!(
            split_provider("/aki-io/v1/chat/completions"),
            ("aki-io", "/v1/chat/completions")
        );
        assert_eq!(split_provider("/aki-io"), ("aki-io", ""));
        assert_eq!(split_provider("/"), ("", ""));
    }
}
