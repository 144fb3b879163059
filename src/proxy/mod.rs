//! The proxy: authenticates callers, asks the evaluator for a plan, and
//! executes it against the providers. It decides nothing itself: which
//! provider, in which order, after which outcome, with which error — all of
//! that comes from the live snapshot's evaluation.

mod access_log;
pub mod body;
mod client_body;
mod event_data;
mod execute;
mod header_names;
pub mod metrics;
mod models;
mod respond;
mod upstream;
pub mod wire;

use crate::compile::Snapshot;
use crate::data::WireFormat;
use crate::diagnostics::redact::redact;
use crate::evaluate::{
    Caller, Endpoint, RequestContext, Turns, evaluate, headers_before_decision, reads_body_member,
    round_robin_model,
};
use crate::language::ir::InputSourceKind;
use crate::reload::ReloadStatus;
use crate::state::{InProcess, StateView};
use crate::sync::lock;
pub use access_log::{AccessLog, ExchangeLine, RequestLine, TracingAccessLog};
use arc_swap::ArcSwap;
use body::ProxyBody;
use bytes::Bytes;
use client_body::ClientBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{HeaderMap, Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics::Metrics;
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use subtle::ConstantTimeEq;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use execute::{AttemptRecord, Report};
/// For the `provider_error` fuzz target: what the proxy makes of a
/// provider's error body.
pub use upstream::{outcome_facts, without_secret};

/// Limits on what a client may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// The most of a request's line and headers hyper buffers.
    pub max_header_bytes: usize,
    /// The longest a request's body may go without a byte arriving: a
    /// client that stops sending would otherwise hold its connection and
    /// its place in flight for ever.
    pub body_idle_timeout: Duration,
    /// The longest a whole body may take to arrive, a trickle included.
    pub body_timeout: Duration,
    /// The least time the client of a stream with no deadline may take no
    /// event before it counts as gone (more where the stream's `idle` limit
    /// is longer): the proxy sees a slow reader's progress only as the
    /// kernel frees a good part of the connection's buffers, so a short
    /// span would cut clients that read.
    pub stream_client_stall: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            body_idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(300),
            stream_client_stall: Duration::from_secs(300),
        }
    }
}

/// How a proxy behaves beyond what its policy says.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub limits: Limits,
    /// Whether responses carry `x-switchyard-policy-version`: the version
    /// of the snapshot that decided them.
    pub version_header: bool,
}

/// The target of the one log line per request.
pub const REQUEST_LOG_TARGET: &str = "switchyard::request";

/// Everything requests share: the live snapshot, the state, metrics and
/// upstream connection pools.
pub struct Proxy {
    live: ArcSwap<Snapshot>,
    /// Where the live snapshot is: a request asks whether its own is still
    /// live with one load, not a load of the snapshot itself.
    live_address: AtomicUsize,
    pub state: Arc<InProcess>,
    pub metrics: Metrics,
    clients: upstream::Clients,
    pub limits: Limits,
    version_header: bool,
    /// What `/healthz` says about live reloads.
    pub reload_status: Mutex<ReloadStatus>,
    /// Requests being handled, as `switchyard_in_flight` counts them.
    requests_in_flight: AtomicU64,
    access_log: Arc<dyn AccessLog>,
    /// Set when a shutdown's drain time ran out: requests cut from then on
    /// were cut by the proxy, not by their clients.
    drain_over: Arc<DrainFlag>,
}

/// Whether a shutdown's drain time ran out, for requests to look at as they
/// run (one load) and for connections to wait on.
pub struct DrainFlag {
    over: AtomicBool,
    changed: watch::Sender<bool>,
}

impl DrainFlag {
    fn new() -> DrainFlag {
        DrainFlag {
            over: AtomicBool::new(false),
            changed: watch::Sender::new(false),
        }
    }

    fn end(&self) {
        self.over.store(true, Ordering::SeqCst);
        self.changed.send_replace(true);
    }

    fn is_over(&self) -> bool {
        self.over.load(Ordering::SeqCst)
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.changed.subscribe()
    }
}

/// Tells the request a connection is serving that the drain time ran out,
/// so that it ends with an error its client can read rather than a closed
/// connection. One per connection: HTTP/1.1 serves one request at a time.
///
/// It also closes a connection whose client stopped reading a stream: the
/// exchange runs as hyper takes the stream's events, so while they wait to
/// be written it cannot end the attempt itself when its time runs out, nor
/// notice that the client has taken nothing for longer than the stream may
/// be silent.
pub struct ConnectionCut {
    over: AtomicBool,
    /// The proxy's: a request woken by room that a cut request freed may
    /// run before this connection's task has cut it.
    drain: Arc<DrainFlag>,
    waker: futures_util::task::AtomicWaker,
    /// When the connection began: the origin of `stream_deadline_ms`.
    began: tokio::time::Instant,
    /// When the stream being sent must have ended, in ms from `began`: its
    /// attempt's time or the request's budget. [`NO_STREAM_DEADLINE`] when
    /// there is none.
    stream_deadline_ms: AtomicU64,
    /// How long the client of the stream being sent may take no event, when
    /// the stream has no deadline. [`NO_STREAM_DEADLINE`] when there is no
    /// such limit.
    stream_stall_ms: AtomicU64,
    deadline_waker: futures_util::task::AtomicWaker,
    /// Events of the stream being sent that its client has made room for.
    events_taken: AtomicU64,
}

/// What the watchdog of the stream being sent has seen: its limits as set,
/// and the last time its client was seen to have taken an event.
struct StallWatch {
    limits: (u64, u64),
    events_taken: u64,
    progress_at: tokio::time::Instant,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

const NO_STREAM_DEADLINE: u64 = u64::MAX;

impl ConnectionCut {
    fn new(drain: Arc<DrainFlag>) -> ConnectionCut {
        ConnectionCut {
            over: AtomicBool::new(false),
            drain,
            waker: futures_util::task::AtomicWaker::new(),
            began: tokio::time::Instant::now(),
            stream_deadline_ms: AtomicU64::new(NO_STREAM_DEADLINE),
            stream_stall_ms: AtomicU64::new(NO_STREAM_DEADLINE),
            deadline_waker: futures_util::task::AtomicWaker::new(),
            events_taken: AtomicU64::new(0),
        }
    }
}

impl ConnectionCut {
    /// Watches the stream being sent: it must have ended `ends_in_ms` from
    /// now, if it has such a limit, and its client may take no event for
    /// `stalls_after_ms`, if that is limited.
    pub fn watch_stream(&self, ends_in_ms: Option<u64>, stalls_after_ms: Option<u64>) {
        let deadline = ends_in_ms.map_or(NO_STREAM_DEADLINE, |in_ms| {
            let since_began = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
            since_began
                .saturating_add(in_ms)
                .min(NO_STREAM_DEADLINE - 1)
        });
        self.stream_deadline_ms.store(deadline, Ordering::SeqCst);
        let stall = stalls_after_ms.map_or(NO_STREAM_DEADLINE, |ms| ms.min(NO_STREAM_DEADLINE - 1));
        self.stream_stall_ms.store(stall, Ordering::SeqCst);
        self.deadline_waker.wake();
    }

    /// No stream is being sent any more.
    pub fn stream_ended(&self) {
        self.stream_deadline_ms
            .store(NO_STREAM_DEADLINE, Ordering::SeqCst);
        self.stream_stall_ms
            .store(NO_STREAM_DEADLINE, Ordering::SeqCst);
        self.deadline_waker.wake();
    }

    /// The stream's client made room for one more event.
    pub fn event_taken(&self) {
        self.events_taken.fetch_add(1, Ordering::Relaxed);
    }

    /// Ready once the stream being sent has a client that stopped reading:
    /// one that took no event for a whole [`CUT_GRACE`] after the stream's
    /// deadline or, for a stream with no deadline, for its stall limit and
    /// a [`CUT_GRACE`] more. An exchange still being polled ends the stream
    /// itself at its deadline, or when its provider is silent past its
    /// `idle` limit, its error event written; and one whose client reads
    /// slowly goes on. Progress is looked at when the watchdog wakes, so a
    /// client is cut between one and two such spans after it stopped. Polled at each wake-up of its
    /// connection's task: when no stream is being sent, it costs a waker
    /// registration and two atomic loads.
    async fn stream_stalled(&self) {
        let mut watch: Option<StallWatch> = None;
        std::future::poll_fn(|cx| {
            self.deadline_waker.register(cx.waker());
            let limits = (
                self.stream_deadline_ms.load(Ordering::SeqCst),
                self.stream_stall_ms.load(Ordering::SeqCst),
            );
            if limits == (NO_STREAM_DEADLINE, NO_STREAM_DEADLINE) {
                watch = None;
                return std::task::Poll::Pending;
            }
            let now = tokio::time::Instant::now();
            let events_taken = self.events_taken.load(Ordering::Relaxed);
            let watch = match &mut watch {
                Some(watch) if watch.limits == limits => watch,
                unwatched => unwatched.insert(StallWatch {
                    limits,
                    events_taken,
                    progress_at: now,
                    sleep: Box::pin(tokio::time::sleep_until(now)),
                }),
            };
            loop {
                if watch.sleep.as_mut().poll(cx).is_pending() {
                    return std::task::Poll::Pending;
                }
                let now = tokio::time::Instant::now();
                let events_taken = self.events_taken.load(Ordering::Relaxed);
                if events_taken != watch.events_taken {
                    watch.events_taken = events_taken;
                    watch.progress_at = now;
                }
                let (deadline_ms, stall_ms) = watch.limits;
                let deadline = (deadline_ms != NO_STREAM_DEADLINE)
                    .then(|| self.began + Duration::from_millis(deadline_ms));
                let stall = Duration::from_millis(stall_ms) + CUT_GRACE;
                // Past the deadline, a grace without an event; or a whole
                // stall limit and grace without one.
                let cut_at = [
                    deadline.map(|deadline| deadline.max(watch.progress_at) + CUT_GRACE),
                    (stall_ms != NO_STREAM_DEADLINE).then(|| watch.progress_at + stall),
                ]
                .into_iter()
                .flatten()
                .min();
                let Some(cut_at) = cut_at else {
                    return std::task::Poll::Pending;
                };
                if now >= cut_at {
                    return std::task::Poll::Ready(());
                }
                watch.sleep.as_mut().reset(cut_at);
            }
        })
        .await;
    }

    fn cut(&self) {
        self.over.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Ready once the connection is cut; pending until then, with the
    /// caller woken when it is.
    pub fn poll_cut(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.over.load(Ordering::SeqCst) || self.drain.is_over() {
            return std::task::Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // A cut between the look and the registration woke nobody.
        if self.over.load(Ordering::SeqCst) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }
}

/// How long requests cut at the end of the drain time have to send their
/// error before their connections close.
const CUT_GRACE: Duration = Duration::from_secs(1);

impl Proxy {
    /// A proxy that logs each request as a tracing event.
    pub fn new(snapshot: Arc<Snapshot>, state: Arc<InProcess>, options: Options) -> Arc<Proxy> {
        Proxy::logging_to(snapshot, state, options, Arc::new(TracingAccessLog))
    }

    /// A proxy that sends its request lines to `access_log`.
    pub fn logging_to(
        snapshot: Arc<Snapshot>,
        state: Arc<InProcess>,
        options: Options,
        access_log: Arc<dyn AccessLog>,
    ) -> Arc<Proxy> {
        install_tls_provider();
        Arc::new(Proxy {
            live_address: AtomicUsize::new(Arc::as_ptr(&snapshot) as usize),
            live: ArcSwap::new(snapshot),
            state,
            metrics: Metrics::new(),
            clients: upstream::Clients::default(),
            limits: options.limits,
            version_header: options.version_header,
            reload_status: Mutex::new(ReloadStatus::default()),
            requests_in_flight: AtomicU64::new(0),
            access_log,
            drain_over: Arc::new(DrainFlag::new()),
        })
    }

    /// Whether a shutdown's drain time ran out.
    pub fn drain_over(&self) -> bool {
        self.drain_over.is_over()
    }

    /// The snapshot requests starting now use.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.live.load_full()
    }

    /// Makes `snapshot` the live one; requests already running keep theirs.
    pub fn replace(&self, snapshot: Arc<Snapshot>) {
        self.live_address
            .store(Arc::as_ptr(&snapshot) as usize, Ordering::SeqCst);
        self.live.store(snapshot);
    }

    /// Whether `snapshot` is the live one (a request holding it keeps its
    /// address from being reused).
    fn is_live(&self, snapshot: &Snapshot) -> bool {
        self.live_address.load(Ordering::Relaxed) == std::ptr::from_ref(snapshot) as usize
    }
}

impl crate::state::LiveLimits for Proxy {
    /// A reload that changes a provider's limits applies to the requests
    /// already waiting for its room as well as to new ones: the provider
    /// is found in the live policy by its id (one that left keeps the
    /// limits it had).
    fn limits(&self, snapshot: &Snapshot, provider: usize) -> Option<crate::data::CapacityLimits> {
        let own = snapshot.provider(provider)?;
        if self.is_live(snapshot) {
            return own.capacity;
        }
        self.live
            .load()
            .data
            .catalog
            .providers
            .iter()
            .find(|reloaded| reloaded.id == own.id)
            .map_or(own.capacity, |reloaded| reloaded.capacity)
    }
}

/// rustls needs one process-wide crypto provider; the first proxy installs
/// ring's (a second install fails harmlessly).
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A random number from the standard library's per-process seeded hasher:
/// enough for balancing seeds and backoff jitter, never for secrets.
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// Uniform in [0, 1).
pub fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A running server.
pub struct Running {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    drain_over: Arc<DrainFlag>,
    task: tokio::task::JoinHandle<()>,
}

/// Ends a server's drain before its time: the requests still in flight end
/// as they do when the drain time runs out.
#[derive(Clone)]
pub struct DrainEnd(Arc<DrainFlag>);

impl DrainEnd {
    pub fn now(&self) {
        self.0.end();
    }
}

impl Running {
    /// What ends the drain that [`Running::shutdown`] starts.
    pub fn drain_end(&self) -> DrainEnd {
        DrainEnd(self.drain_over.clone())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in flight finish (up to the drain
    /// time given to `serve`), then returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }

    /// Waits until the server stops (after `shutdown` from elsewhere).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    /// A handle that can ask the server to stop.
    pub fn stopper(&self) -> watch::Sender<bool> {
        self.shutdown.clone()
    }
}

/// Serves `proxy` on `listener` until shut down; `drain` bounds how long
/// requests in flight may take to finish after that.
pub fn serve(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    drain: Duration,
) -> std::io::Result<Running> {
    let addr = listener.local_addr()?;
    let (shutdown, mut stop) = watch::channel(false);
    let drain_over = proxy.drain_over.clone();
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        let mut upkeep = tokio::time::interval(metrics::UPKEEP_INTERVAL);
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = upkeep.tick() => proxy.metrics.upkeep(),
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else {
                        // Out of file descriptors and the like: keep going.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    send_without_delay(&stream);
                    let proxy = proxy.clone();
                    let mut stop = stop.clone();
                    let cut = Arc::new(ConnectionCut::new(proxy.drain_over.clone()));
                    // hyper's smallest read buffer is 8 KiB.
                    let header_bytes = proxy.limits.max_header_bytes.max(8192);
                    connections.spawn(async move {
                        let mut drain_over = proxy.drain_over.subscribe();
                        let request_cut = cut.clone();
                        let service = service_fn(move |request| {
                            let proxy = proxy.clone();
                            // hyper keeps a slot the size of this future for
                            // the connection's whole life, so the request's
                            // state is boxed: until its exchange starts (the
                            // body being read, the decision's inputs: 1.7 KB),
                            // then, apart, while it waits for its answer
                            // (0.6 KB). A thousand streams waiting for their
                            // providers hold only the second.
                            let unlogged = Unlogged::of(&proxy, &request);
                            let handling =
                                Box::pin(handle(proxy, request, request_cut.clone(), unlogged));
                            async move {
                                let response = match handling.await {
                                    Handled::Answered(response) => response,
                                    Handled::Answering(answering) => {
                                        Box::pin(answering.response()).await
                                    }
                                };
                                Ok::<_, Infallible>(response)
                            }
                        });
                        let mut builder = hyper::server::conn::http1::Builder::new();
                        builder
                            .timer(TokioTimer::new())
                            .header_read_timeout(Duration::from_secs(30))
                            .max_buf_size(header_bytes);
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        tokio::pin!(connection);
                        tokio::select! {
                            _ = connection.as_mut() => {}
                            // Dropped with the connection: the exchange
                            // ends as cancelled, its capacity freed and
                            // its provider's stream closed.
                            () = cut.stream_stalled() => {}
                            _ = stop.changed() => {
                                connection.as_mut().graceful_shutdown();
                                tokio::select! {
                                    _ = connection.as_mut() => {}
                                    () = cut.stream_stalled() => {}
                                    () = async {
                                        let _ = drain_over.wait_for(|over| *over).await;
                                    } => {
                                        cut.cut();
                                        let _ = connection.await;
                                    }
                                }
                            }
                        }
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        // The drain ends when every connection has, when its time is over,
        // or when it is ended early (`DrainEnd`, a second signal).
        let mut ended_early = proxy.drain_over.subscribe();
        let drained = tokio::time::timeout(drain, async {
            tokio::select! {
                () = async { while connections.join_next().await.is_some() {} } => true,
                _ = ended_early.wait_for(|over| *over) => false,
            }
        })
        .await;
        if drained != Ok(true) {
            if drained.is_err() {
                proxy.drain_over.end();
                tracing::warn!(
                    connections = connections.len(),
                    "drain time over; ending the remaining requests with 503 `shutting_down`"
                );
            }
            let _ = tokio::time::timeout(CUT_GRACE, async {
                while connections.join_next().await.is_some() {}
            })
            .await;
        }
    });
    Ok(Running {
        addr,
        shutdown,
        drain_over,
        task,
    })
}

/// Turns Nagle's algorithm off on a client's connection. A stream's events
/// and its end are small writes; with Nagle, each waits until the client
/// acknowledges the write before it, and a client that delays its
/// acknowledgements (Linux: up to 40 ms) held the end of every stream on a
/// kept-alive connection that long.
fn send_without_delay(stream: &TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY on a client connection");
    }
}

/// A request handled up to its exchange: answered already, or with its
/// exchange under way.
enum Handled {
    Answered(Response<ProxyBody>),
    Answering(Answering),
}

/// What answers a request whose exchange has started.
struct Answering {
    started: execute::Started,
    wire: WireFormat,
    request_id: Arc<str>,
    /// The value of `x-switchyard-policy-version`, when responses carry it.
    version: Option<HeaderValue>,
}

impl Answering {
    async fn response(self) -> Response<ProxyBody> {
        let response = match execute::answer(self.started).await {
            Some(response) => response,
            // The exchange ended without answering: only a bug can do that.
            None => respond::builtin_error(
                self.wire,
                &self.request_id,
                500,
                "internal_error",
                "the gateway failed to answer",
            ),
        };
        finish(response, self.version.as_ref(), self.wire)
    }
}

async fn handle(
    proxy: Arc<Proxy>,
    request: Request<Incoming>,
    cut: Arc<ConnectionCut>,
    unlogged: Unlogged,
) -> Handled {
    let request_id = unlogged.request_id.clone();
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    // An endpoint's answers are in its own wire format; the others in the
    // one the client's headers ask for.
    let endpoint = Endpoint::from_path(&path);
    let wire = match endpoint {
        Some(endpoint) => endpoint.wire(),
        None if request
            .headers()
            .contains_key(header_names::ANTHROPIC_VERSION) =>
        {
            WireFormat::Anthropic
        }
        None => WireFormat::OpenAi,
    };
    // One snapshot answers the request and names its version.
    let snapshot = proxy.snapshot();
    // HEAD asks what GET would answer; hyper leaves the body out (RFC
    // 9110 asks every general-purpose server to support both).
    let reads = method == Method::GET || method == Method::HEAD;
    let response = match (method, path.as_str()) {
        (_, "/healthz") if reads => {
            let reloads = lock(&proxy.reload_status).to_json();
            respond::json(
                200,
                &request_id,
                &json!({
                    "status": "ok",
                    "policy": snapshot.name,
                    "version": snapshot.version,
                    "in_flight": proxy.requests_in_flight.load(Ordering::Relaxed),
                    "upstream_in_flight": proxy.state.in_flight_total(),
                    "reload": reloads,
                }),
            )
        }
        (_, "/metrics") if reads => respond::base(
            200,
            &request_id,
            "text/plain; version=0.0.4",
            ProxyBody::full(proxy.metrics.render()),
        ),
        (_, path) if reads && (path == "/v1/models" || path.starts_with(MODEL_PATH)) => {
            let listed = match authenticate(&snapshot, request.headers()) {
                Ok(caller) => {
                    let health = StateView {
                        state: &proxy.state,
                        snapshot: &snapshot,
                        live_limits: None,
                    };
                    let query = request.uri().query();
                    model_listing(&snapshot, caller, wire, &health, &request_id, path, query)
                }
                Err(refusal) => unauthorized(wire, &request_id, refusal),
            };
            before_decision(&snapshot, &request_id, endpoint, wire, listed)
        }
        (method, path) => {
            let refused = match endpoint {
                Some(endpoint) if method == Method::POST => {
                    let handled =
                        complete(proxy, snapshot, request, endpoint, request_id, cut).await;
                    // Logged by now: as refused, or by the exchange.
                    unlogged.logged();
                    return handled;
                }
                Some(_) => method_not_allowed(wire, &request_id, "POST"),
                None if matches!(path, "/healthz" | "/metrics" | "/v1/models")
                    || path.starts_with(MODEL_PATH) =>
                {
                    method_not_allowed(wire, &request_id, "GET, HEAD")
                }
                None => not_found(wire, &request_id, path),
            };
            before_decision(&snapshot, &request_id, endpoint, wire, refused)
        }
    };
    drain_unread(request, proxy.limits.max_body_bytes);
    let version = policy_version(&proxy, &snapshot);
    Handled::Answered(finish(response, version.as_ref(), wire))
}

/// An answer given before the policy decides anything, with the policy's
/// headers as far as they can be known then: its own refusals carry them,
/// and so do these (docs/language.md, `headers`).
fn before_decision(
    snapshot: &Snapshot,
    request_id: &Arc<str>,
    endpoint: Option<Endpoint>,
    wire: WireFormat,
    response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let endpoint = endpoint.unwrap_or(match wire {
        WireFormat::Anthropic => Endpoint::Messages,
        WireFormat::OpenAi => Endpoint::ChatCompletions,
    });
    let headers = headers_before_decision(snapshot, request_id.clone(), endpoint);
    respond::with_headers(response, &headers)
}

/// `GET /v1/models`, or one model of it at `/v1/models/{id}`.
fn model_listing(
    snapshot: &Snapshot,
    caller: Caller,
    wire: WireFormat,
    health: &StateView<'_>,
    request_id: &str,
    path: &str,
    query: Option<&str>,
) -> Response<ProxyBody> {
    let Some(escaped) = path.strip_prefix(MODEL_PATH) else {
        let parameters = query
            .unwrap_or_default()
            .split('&')
            .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
            .map(|(name, value)| (name, percent_decoded(value).unwrap_or_default()));
        // Only Anthropic's list comes in pages.
        let page = match wire {
            WireFormat::Anthropic => models::Page::from_query(parameters),
            WireFormat::OpenAi => Ok(models::Page::default()),
        };
        let listing = page.and_then(|page| models::list(snapshot, caller, wire, health, &page));
        return match listing {
            Ok(listing) => respond::json(200, request_id, &listing),
            Err(problem) => {
                respond::builtin_error(wire, request_id, 400, "invalid_request", &problem)
            }
        };
    };
    let id = percent_decoded(escaped).unwrap_or_default();
    match models::one(snapshot, caller, wire, health, &id) {
        Some(entry) => respond::json(200, request_id, &entry),
        None => respond::builtin_error(
            wire,
            request_id,
            404,
            "model_not_found",
            &format!(
                "the model `{}` does not exist or this key may not call it",
                redact(&id)
            ),
        ),
    }
}

/// Where `GET` reads one model of `/v1/models`: `/v1/models/{id}`.
const MODEL_PATH: &str = "/v1/models/";

/// A path segment with its `%XX` escapes decoded (a model id may hold a
/// `/`, which clients send as `%2F`); `None` when it is not UTF-8 then.
fn percent_decoded(segment: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(segment.len());
    let mut rest = segment.as_bytes();
    while let Some((&byte, after)) = rest.split_first() {
        let escaped = (byte == b'%')
            .then(|| after.get(..2))
            .flatten()
            .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(decoded) => {
                bytes.push(decoded);
                rest = after.get(2..).unwrap_or_default();
            }
            None => {
                bytes.push(byte);
                rest = after;
            }
        }
    }
    String::from_utf8(bytes).ok()
}

/// The value of `x-switchyard-policy-version` for answers decided on
/// `snapshot`, when responses carry it.
fn policy_version(proxy: &Proxy, snapshot: &Snapshot) -> Option<HeaderValue> {
    proxy
        .version_header
        .then(|| HeaderValue::from_str(&snapshot.version).ok())
        .flatten()
}

/// What every answer carries besides its own headers: the policy's
/// version when asked for, and in Anthropic's wire format the request id
/// also under the name Anthropic's clients read it from (`request-id`).
fn finish(
    mut response: Response<ProxyBody>,
    version: Option<&HeaderValue>,
    wire: WireFormat,
) -> Response<ProxyBody> {
    let headers = response.headers_mut();
    if let Some(version) = version {
        headers.insert(header_names::POLICY_VERSION, version.clone());
    }
    if wire == WireFormat::Anthropic
        && let Some(id) = headers.get(header_names::REQUEST_ID).cloned()
    {
        headers.insert(header_names::ANTHROPIC_REQUEST_ID, id);
    }
    response
}

fn not_found(wire: WireFormat, request_id: &str, path: &str) -> Response<ProxyBody> {
    respond::builtin_error(
        wire,
        request_id,
        404,
        "not_found",
        &format!("no endpoint at {}", redact(path)),
    )
}

/// 405, with the `Allow` header RFC 9110 requires of it.
fn method_not_allowed(
    wire: WireFormat,
    request_id: &str,
    allowed: &'static str,
) -> Response<ProxyBody> {
    let mut response = respond::builtin_error(
        wire,
        request_id,
        405,
        "method_not_allowed",
        &format!("use {allowed} for this endpoint"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allowed));
    response
}

/// The client's `X-Request-Id` when it is a sensible one, else a new id.
/// The id is logged and sent on to providers, so one that holds the
/// client's key (as a logged model id would be masked for it), or a word
/// that looks like an API key, is not taken.
fn request_id(headers: &HeaderMap) -> Arc<str> {
    headers
        .get(header_names::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| {
            !id.is_empty()
                && id.len() <= 128
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
                && matches!(redact(id), Cow::Borrowed(_))
                && !presented_key(headers).is_some_and(|key| holds_key(id, key))
        })
        .map_or_else(new_request_id, Arc::from)
}

/// `req_` and 16 random hex digits.
fn new_request_id() -> Arc<str> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let random = random_u64();
    // Written in place and shared from the start: the exchange, the
    // evaluator's request state and the log line each hold it.
    let mut id = *b"req_0000000000000000";
    for (slot, shift) in id.iter_mut().skip(4).zip((0..16).rev()) {
        let digit = (random >> (shift * 4)) & 0xf;
        *slot = DIGITS.get(digit as usize).copied().unwrap_or(b'0');
    }
    Arc::from(String::from_utf8_lossy(&id).as_ref())
}

/// Why a caller was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unauthorized {
    Missing,
    Unknown,
}

impl Unauthorized {
    /// The code the client gets, and the log line says.
    fn code(self) -> &'static str {
        match self {
            Unauthorized::Missing => "missing_api_key",
            Unauthorized::Unknown => "invalid_api_key",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Unauthorized::Missing => {
                "send an API key as `Authorization: Bearer KEY` or `x-api-key: KEY`"
            }
            Unauthorized::Unknown => "the API key is not valid",
        }
    }
}

fn unauthorized(wire: WireFormat, request_id: &str, why: Unauthorized) -> Response<ProxyBody> {
    let mut response = respond::builtin_error(wire, request_id, 401, why.code(), why.message());
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The key the client sent: `Authorization: Bearer KEY`, else `x-api-key`.
/// The scheme is case-insensitive (RFC 9110); an empty credential is none.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .filter(|key| !key.is_empty());
    bearer.or_else(|| {
        headers
            .get(header_names::API_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|key| !key.is_empty())
    })
}

/// Whether the client sent a credential that cannot be read as one key: a
/// credential header given twice, or with bytes other than visible ASCII.
/// Such a key was sent, so it is not valid rather than missing.
fn unreadable_credential(headers: &HeaderMap) -> bool {
    [header::AUTHORIZATION, header_names::API_KEY]
        .iter()
        .any(|name| {
            let mut lines = headers.get_all(name).iter();
            let first = lines.next();
            lines.next().is_some() || first.is_some_and(|value| value.to_str().is_err())
        })
}

/// The caller a key belongs to. Keys are stored as SHA-256 hashes; the
/// table finds the candidate and a constant-time comparison confirms it.
fn authenticate(snapshot: &Snapshot, headers: &HeaderMap) -> Result<Caller, Unauthorized> {
    if unreadable_credential(headers) {
        return Err(Unauthorized::Unknown);
    }
    let key = presented_key(headers).ok_or(Unauthorized::Missing)?;
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    let index = snapshot.key_by_hash(&digest).ok_or(Unauthorized::Unknown)?;
    let stored = snapshot
        .data
        .tenants
        .keys
        .get(index)
        .ok_or(Unauthorized::Unknown)?;
    if !bool::from(stored.sha256.ct_eq(&digest)) {
        return Err(Unauthorized::Unknown);
    }
    Ok(Caller {
        tenant: stored.tenant,
        workspace: stored.workspace,
        key: Some(index),
    })
}

/// The names of the policy's inputs read from one part of the request:
/// routing instructions, which the evaluator reads and the provider never
/// sees.
fn input_names(snapshot: &Snapshot, source: InputSourceKind) -> Vec<&str> {
    snapshot
        .program
        .inputs
        .iter()
        .filter(|input| input.source == source)
        .map(|input| input.field.as_str())
        .collect()
}

/// Round-robin turns from the requested model's counter, taken only when
/// the policy rotates this request.
struct ModelTurns<'a> {
    state: &'a InProcess,
    snapshot: &'a Snapshot,
    /// The body's `model`.
    requested: Option<&'a str>,
    caller: Caller,
}

impl std::fmt::Debug for ModelTurns<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTurns")
            .field("requested", &self.requested)
            .finish_non_exhaustive()
    }
}

impl Turns for ModelTurns<'_> {
    fn next_turn(&self) -> u64 {
        round_robin_model(self.snapshot, self.requested.unwrap_or(""), self.caller)
            .map_or(0, |model| self.state.next_rotation(model))
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<Proxy>);

impl InFlight {
    fn new(proxy: Arc<Proxy>) -> InFlight {
        proxy.metrics.in_flight(1.0);
        proxy.requests_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(proxy)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.metrics.in_flight(-1.0);
        self.0.requests_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn complete(
    proxy: Arc<Proxy>,
    snapshot: Arc<Snapshot>,
    request: Request<Incoming>,
    endpoint: Endpoint,
    request_id: Arc<str>,
    cut: Arc<ConnectionCut>,
) -> Handled {
    let started = Instant::now();
    let started_ms = proxy.state.clock().now_ms();
    let in_flight = InFlight::new(proxy.clone());
    let wire = endpoint.wire();
    let version = policy_version(&proxy, &snapshot);
    let answered = |response| Handled::Answered(finish(response, version.as_ref(), wire));
    let caller = match authenticate(&snapshot, request.headers()) {
        Ok(caller) => caller,
        Err(why) => {
            record_refusal(
                &proxy,
                &request_id,
                endpoint,
                None,
                "",
                (401, why.code()),
                "unauthorized",
            );
            let response = unauthorized(wire, &request_id, why);
            drain_unread(request, proxy.limits.max_body_bytes);
            return answered(before_decision(
                &snapshot,
                &request_id,
                Some(endpoint),
                wire,
                response,
            ));
        }
    };
    // The gateway's own refusal of a known caller's request, before its
    // body is read: counted, logged and answered in the endpoint's format.
    let refused_here = |status: u16, code: &str, message: &str, outcome: &'static str| {
        record_refusal(
            &proxy,
            &request_id,
            endpoint,
            Some((tenant_id(&snapshot, caller), "")),
            "",
            (status, code),
            outcome,
        );
        answered(before_decision(
            &snapshot,
            &request_id,
            Some(endpoint),
            wire,
            respond::builtin_error(wire, &request_id, status, code, message),
        ))
    };
    // Only a body without a declared length has a transfer coding.
    let length_declared = hyper::body::Body::size_hint(request.body())
        .exact()
        .is_some();
    if let Some((header, encoding)) = body_encoding(request.headers(), length_declared) {
        // A compressed body would otherwise be refused as JSON that does
        // not parse, which hides the reason.
        let message = format!(
            "the request body is sent with `{header}: {encoding}`; this gateway accepts it uncompressed"
        );
        drain_unread(request, proxy.limits.max_body_bytes);
        return refused_here(415, "unsupported_content_encoding", &message, "refused");
    }
    let (parts, mut incoming) = request.into_parts();
    let limit = proxy.limits.max_body_bytes;
    // A body whose declared length is over the limit is refused before any
    // of it is read, and so before a client that sent `Expect:
    // 100-continue` is told to send it.
    let declared = hyper::body::Body::size_hint(&incoming).lower();
    let waits_to_send = waits_for_continue(&parts.headers);
    let declared_too_large = declared > u64::try_from(limit).unwrap_or(u64::MAX);
    let read = if declared_too_large {
        Err(BodyProblem::TooLarge)
    } else {
        read_limited(&mut incoming, limit, &proxy.limits).await
    };
    let bytes: Bytes = match read {
        Ok(bytes) => bytes,
        Err(problem) => {
            // A client still sending the rest of a body too large (or a
            // trickle past the body timeout) reads the refusal only if the
            // rest is read; one that waits for `100 Continue` before
            // sending was never told to send it.
            let client_is_sending = !(waits_to_send && declared_too_large);
            if matches!(problem, BodyProblem::TooLarge | BodyProblem::TooSlow) && client_is_sending
            {
                drain(incoming, DRAIN_MAX_BYTES);
            }
            let (status, code, message, outcome) = match problem {
                BodyProblem::TooLarge => (
                    413,
                    "request_too_large",
                    "the request body is larger than this gateway accepts",
                    "refused",
                ),
                BodyProblem::Unreadable => (
                    400,
                    "invalid_request_body",
                    "the request body could not be read",
                    "refused",
                ),
                BodyProblem::Stalled => (
                    408,
                    "request_timeout",
                    "the request body stopped arriving",
                    "refused",
                ),
                BodyProblem::TooSlow => (
                    408,
                    "request_timeout",
                    "the request body took longer to arrive than this gateway waits",
                    "refused",
                ),
                // Nobody reads this answer; the status is nginx's "client
                // closed request", as for a client that leaves later.
                BodyProblem::ClientGone => (
                    499,
                    "client_closed_request",
                    "the client closed the connection before the body ended",
                    "cancelled",
                ),
            };
            return refused_here(status, code, message, outcome);
        }
    };
    let exchange = match prepare(
        &proxy,
        &snapshot,
        Arrived {
            parts,
            bytes,
            endpoint,
            caller,
            started,
            started_ms,
            in_flight,
        },
        &request_id,
    ) {
        Ok(exchange) => exchange,
        Err(refused) => return answered(*refused),
    };
    Handled::Answering(Answering {
        started: execute::start(exchange, cut),
        wire,
        request_id,
        version,
    })
}

/// The header and coding a request body is sent in, unless none is
/// (`identity`, and for `Transfer-Encoding` the `chunked` framing HTTP
/// itself undoes): `Transfer-Encoding: gzip, chunked` compresses as
/// `Content-Encoding: gzip` does.
fn body_encoding(
    headers: &hyper::HeaderMap,
    length_declared: bool,
) -> Option<(&'static str, String)> {
    let codings = |name: hyper::header::HeaderName, undone: &[&str]| {
        // A list, over one or several lines: `gzip, identity`.
        let text = headers
            .get_all(name)
            .iter()
            .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
            .map(|coding| {
                // Said back in the error: a few characters are enough.
                let coding = String::from_utf8_lossy(coding);
                coding.trim().chars().take(32).collect::<String>()
            })
            .filter(|coding| {
                !coding.is_empty() && !undone.iter().any(|u| coding.eq_ignore_ascii_case(u))
            })
            .collect::<Vec<_>>()
            .join(", ");
        (!text.is_empty()).then_some(text)
    };
    codings(hyper::header::CONTENT_ENCODING, &["identity"])
        .map(|text| ("Content-Encoding", text))
        .or_else(|| {
            if length_declared {
                return None;
            }
            codings(hyper::header::TRANSFER_ENCODING, &["identity", "chunked"])
                .map(|text| ("Transfer-Encoding", text))
        })
}

/// Whether reading failed because the client's connection ended (closed or
/// reset) before the body did.
fn client_left(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
            )
        }) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Reads a client's body up to `limit` bytes, waiting at most the idle
/// timeout for each next part of it and the body timeout for all of it.
async fn read_limited(
    incoming: &mut Incoming,
    limit: usize,
    limits: &Limits,
) -> Result<Bytes, BodyProblem> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let idle_first = limits.body_idle_timeout <= left;
        let wait = limits.body_idle_timeout.min(left);
        let Ok(next) = tokio::time::timeout(wait, incoming.frame()).await else {
            return Err(if idle_first {
                BodyProblem::Stalled
            } else {
                BodyProblem::TooSlow
            });
        };
        let Some(frame) = next else {
            break;
        };
        let frame = frame.map_err(|error| {
            if client_left(&error) {
                BodyProblem::ClientGone
            } else {
                BodyProblem::Unreadable
            }
        })?;
        if let Ok(data) = frame.into_data() {
            total = total.saturating_add(data.len());
            if total > limit {
                return Err(BodyProblem::TooLarge);
            }
            chunks.push(data);
        }
    }
    Ok(match chunks.as_slice() {
        [only] => only.clone(),
        _ => Bytes::from(chunks.concat()),
    })
}

/// How much of a refused body is still read, and for how long. Closing a
/// connection with unread data resets it, and the reset can reach the
/// client before it reads the refusal: a client that sends its whole body
/// before reading the answer, as most do, would get a broken pipe instead
/// of the refusal (a `413`, a `401`, a `404`).
const DRAIN_MAX_BYTES: usize = 64 << 20;
const DRAIN_MAX_TIME: Duration = Duration::from_secs(5);

/// Drains up to `max_bytes` of the body of a request refused before any
/// of it was read, unless it has none or its client waits for `100
/// Continue` before sending it: reading it would tell that client to go
/// ahead. Such a refusal needs no key, so it reads no more than a body
/// the gateway would accept.
fn drain_unread(request: Request<Incoming>, max_bytes: usize) {
    let waits_to_send = waits_for_continue(request.headers());
    let body = request.into_body();
    if !waits_to_send && !hyper::body::Body::is_end_stream(&body) {
        drain(body, max_bytes.min(DRAIN_MAX_BYTES));
    }
}

/// Whether the client sends its body only once told to (`Expect:
/// 100-continue`), which hyper does when the body is first read.
fn waits_for_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|expect| expect.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads and drops the rest of a refused body, up to `max_bytes` and
/// [`DRAIN_MAX_TIME`], while the refusal goes out.
fn drain(mut body: Incoming, max_bytes: usize) {
    tokio::spawn(async move {
        let mut left = max_bytes;
        let _ = tokio::time::timeout(DRAIN_MAX_TIME, async {
            while left > 0 {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        left = left.saturating_sub(frame.data_ref().map_or(0, Bytes::len));
                    }
                    _ => break,
                }
            }
        })
        .await;
    });
}

/// The id of the caller's tenant; empty for none.
fn tenant_id(snapshot: &Snapshot, caller: Caller) -> &str {
    snapshot
        .data
        .tenants
        .tenants
        .get(caller.tenant)
        .map_or("", |t| t.id.as_str())
}

/// Why a request's body was not read.
enum BodyProblem {
    TooLarge,
    /// The connection closed before the body's end.
    ClientGone,
    /// Anything else: the body's framing was wrong, or reading it failed.
    Unreadable,
    /// No byte of it arrived for the idle limit.
    Stalled,
    /// Still arriving when the body timeout passed.
    TooSlow,
}

/// A request read in full, before its decision.
struct Arrived {
    parts: hyper::http::request::Parts,
    bytes: Bytes,
    endpoint: Endpoint,
    caller: Caller,
    started: Instant,
    started_ms: u64,
    in_flight: InFlight,
}

/// The decision on a request read in full: the exchange that carries out
/// its plan, or the policy's refusal. Kept out of `complete` so that none
/// of its locals (the body's tree, the trace) take room in the request's
/// future while the exchange runs.
fn prepare(
    proxy: &Arc<Proxy>,
    snapshot: &Arc<Snapshot>,
    arrived: Arrived,
    request_id: &Arc<str>,
) -> Result<execute::Exchange, Box<Response<ProxyBody>>> {
    let endpoint = arrived.endpoint;
    let caller = arrived.caller;
    let wire = endpoint.wire();
    let client_body = ClientBody::read(&arrived.bytes);
    // The evaluator's view of the body: the members it can read, no more.
    let body: Result<Json, String> = match &client_body {
        Ok(body) => body.tree(|member| reads_body_member(snapshot, member)),
        Err(problem) => Err(problem.clone()),
    };
    let input_headers = input_names(snapshot, InputSourceKind::Header);
    // The evaluator reads headers only as the policy's header inputs: only
    // those are copied for it.
    let headers: Vec<(String, String)> = arrived
        .parts
        .headers
        .iter()
        .filter(|(name, _)| input_headers.contains(&name.as_str()))
        .filter_map(|(name, value)| {
            value
                .to_str()
                .ok()
                .map(|value| (name.as_str().to_ascii_lowercase(), value.to_string()))
        })
        .collect();
    let context = RequestContext {
        id: request_id.clone(),
        endpoint,
        body: body.as_ref().map_err(String::as_str),
        body_bytes: arrived.bytes.len(),
        headers: &headers,
        caller,
        seed: random_u64(),
        rotation: &ModelTurns {
            state: &proxy.state,
            snapshot,
            requested: body
                .as_ref()
                .ok()
                .and_then(|body| body.get("model")?.as_str()),
            caller,
        },
    };
    let deciding = Instant::now();
    let view = StateView {
        state: &proxy.state,
        snapshot,
        live_limits: None,
    };
    let decision = evaluate(snapshot, &context, &view);
    proxy.metrics.decision(deciding.elapsed().as_secs_f64());
    let tenant = tenant_id(snapshot, caller).to_string();
    let requested = body
        .as_ref()
        .ok()
        .and_then(|b| b.get("model"))
        .and_then(Json::as_str)
        .unwrap_or("");
    let named = snapshot.model_named(requested).is_some();
    // An id the catalog names is no key: the caller's is looked for (which
    // costs a header lookup) only in an id it does not name.
    let requested_model = logged_model(
        requested,
        (!named)
            .then(|| presented_key(&arrived.parts.headers))
            .flatten(),
    );
    let plan = match decision.result {
        Ok(plan) => plan,
        Err(refusal) => {
            record_refusal(
                proxy,
                request_id,
                endpoint,
                Some((&tenant, &requested_model)),
                model_label(snapshot, (requested, named), None),
                (refusal.error.status, &refusal.error.code),
                "refused",
            );
            return Err(Box::new(respond::error(
                wire,
                request_id,
                &refusal.error,
                &refusal.headers,
            )));
        }
    };
    let mut unsent_fields = input_names(snapshot, InputSourceKind::Body);
    if !arrived.endpoint.streams() {
        // Never a stream here (embeddings): a provider asked for one would
        // refuse the request, or answer in events the proxy does not read.
        unsent_fields.extend(["stream", "stream_options"]);
    }
    let outgoing = upstream::Outgoing::new(
        arrived.endpoint,
        client_body.as_ref().ok(),
        &arrived.parts.headers,
        &unsent_fields,
        &input_headers,
        request_id,
    );
    let mut decision = String::with_capacity(64);
    decision.push_str("plan ");
    for (n, provider) in plan
        .candidates
        .iter()
        .filter_map(|c| snapshot.provider(c.provider))
        .enumerate()
    {
        if n > 0 {
            decision.push(',');
        }
        decision.push_str(&provider.id);
    }
    let _ = write!(decision, " (at most {})", plan.attempts);
    let log = RequestLog {
        tenant,
        model_label: model_label(snapshot, (requested, named), Some(&plan)).to_string(),
        model: requested_model,
        // Other sources (a `models` list) may add ids the catalog does not
        // name, which `unknown serve` sends upstream as they are.
        ids_holding_the_key: ids_holding_the_key(
            &plan,
            plan.candidates
                .iter()
                .any(|c| c.model.is_none())
                .then(|| presented_key(&arrived.parts.headers))
                .flatten(),
        ),
        decision,
        started: arrived.started,
        _in_flight: arrived.in_flight,
    };
    Ok(execute::Exchange::new(
        proxy.clone(),
        snapshot.clone(),
        endpoint,
        request_id.clone(),
        plan,
        outgoing,
        arrived.started_ms,
        log,
    ))
}

/// The `model` label of a request's metrics for a client's requested id
/// (and whether the catalog names it, as a model or an alias): the id when
/// it does, else the model of the plan's first candidate (a pin's), else
/// [`OTHER_MODEL`]. Labels come from the catalog, so made-up ids cannot add
/// series without end.
fn model_label<'a>(
    snapshot: &'a Snapshot,
    (requested, named): (&'a str, bool),
    plan: Option<&crate::evaluate::Plan>,
) -> &'a str {
    if named {
        return requested;
    }
    plan.and_then(|plan| plan.candidates.first())
        .and_then(|candidate| candidate.model)
        .and_then(|model| snapshot.data.catalog.models.get(model))
        .map_or(OTHER_MODEL, |model| model.id.as_str())
}

/// The `model` label of requests for ids the catalog does not know.
pub const OTHER_MODEL: &str = "(other)";

/// Longest model id a log line quotes in full.
const LOGGED_MODEL_BYTES: usize = 256;

/// A model id as the log line shows it: `***` for one holding the caller's
/// own key, a word that looks like an API key masked (a client may paste
/// one there by mistake), and cut short (at a character boundary, marked
/// with `…`) when a client sent a long one.
fn logged_model(requested: &str, caller_key: Option<&str>) -> String {
    if caller_key.is_some_and(|key| holds_key(requested, key)) {
        return String::from(KEY_MASK);
    }
    let requested = redact(requested);
    if requested.len() <= LOGGED_MODEL_BYTES {
        return requested.into_owned();
    }
    let mut end = LOGGED_MODEL_BYTES;
    while !requested.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", requested.get(..end).unwrap_or_default())
}

/// What a logged model id holding the caller's own key becomes: all of it,
/// so that what is left of the id tells nothing of the key.
const KEY_MASK: &str = "***";

/// Shorter keys are looked for as the whole id or one of its words only: a
/// short key may be part of a real model id, which must not be masked.
const KEY_SEARCHED_WITHIN_BYTES: usize = 8;

/// Whether model id `id` holds the caller's `key`.
fn holds_key(id: &str, key: &str) -> bool {
    id == key
        || id.split_whitespace().any(|word| word == key)
        || (key.len() >= KEY_SEARCHED_WITHIN_BYTES && id.contains(key))
}

/// The requested ids an `unknown serve` candidate of the plan would send
/// upstream as they are, which hold the caller's key, each with its logged
/// form; empty (no allocation) for every sensible request.
fn ids_holding_the_key(
    plan: &crate::evaluate::Plan,
    caller_key: Option<&str>,
) -> Vec<(Arc<str>, String)> {
    let Some(key) = caller_key else {
        return Vec::new();
    };
    let mut ids: Vec<(Arc<str>, String)> = Vec::new();
    for id in plan
        .candidates
        .iter()
        .filter(|c| c.model.is_none())
        .map(|c| &c.requested.id)
    {
        if holds_key(id, key) && !ids.iter().any(|(seen, _)| Arc::ptr_eq(seen, id)) {
            ids.push((id.clone(), logged_model(id, Some(key))));
        }
    }
    ids
}

/// A request that ended before any exchange: its log line and its count in
/// `switchyard_requests_total` (under `outcome`, with its model label).
fn record_refusal(
    proxy: &Proxy,
    request_id: &str,
    endpoint: Endpoint,
    who: Option<(&str, &str)>,
    model_label: &str,
    (status, code): (u16, &str),
    outcome: &'static str,
) {
    let (tenant, model) = who.unwrap_or(("", ""));
    proxy.metrics.request("", model_label, outcome, status);
    proxy.access_log.write(RequestLine {
        at: SystemTime::now(),
        request_id: Arc::from(request_id),
        endpoint: endpoint.name(),
        tenant: tenant.to_string(),
        model: model.to_string(),
        decision: format!("refused {code}"),
        status,
        outcome,
        error: Some(code.to_string()),
        exchange: None,
    });
}

/// A request to a policy endpoint whose log line is not written yet, which
/// writes it (`cancelled`, 499) if dropped so: hyper drops a request's
/// future, before its first poll or part way, when its client closes the
/// connection (a half-close included) right after sending it.
struct Unlogged {
    proxy: Arc<Proxy>,
    request_id: Arc<str>,
    /// The endpoint a `POST` is to; `None` once logged, and for any other
    /// request (which has no log line).
    endpoint: Option<Endpoint>,
}

impl Unlogged {
    fn of(proxy: &Arc<Proxy>, request: &Request<Incoming>) -> Unlogged {
        Unlogged {
            proxy: proxy.clone(),
            request_id: request_id(request.headers()),
            endpoint: Endpoint::from_path(request.uri().path())
                .filter(|_| request.method() == Method::POST),
        }
    }

    fn logged(mut self) {
        self.endpoint = None;
    }
}

impl Drop for Unlogged {
    fn drop(&mut self) {
        if let Some(endpoint) = self.endpoint {
            record_refusal(
                &self.proxy,
                &self.request_id,
                endpoint,
                None,
                "",
                (499, "client_closed_request"),
                "cancelled",
            );
        }
    }
}

/// What a request's log line says beyond the exchange's report; counts the
/// request in flight while it lives.
struct RequestLog {
    tenant: String,
    /// As the log line shows it.
    model: String,
    /// See [`ids_holding_the_key`]: the answering model is logged in the
    /// same masked form.
    ids_holding_the_key: Vec<(Arc<str>, String)>,
    /// As the metrics count it.
    model_label: String,
    /// The plan: its providers in order and how many attempts it allows.
    decision: String,
    started: Instant,
    _in_flight: InFlight,
}

impl RequestLog {
    /// A candidate's upstream model as the log line shows it.
    fn served_model(&self, upstream: &Arc<str>) -> String {
        self.ids_holding_the_key
            .iter()
            .find(|(id, _)| Arc::ptr_eq(id, upstream))
            .map_or_else(
                || logged_model(upstream, None),
                |(_, logged)| logged.clone(),
            )
    }

    /// The request's log line and metrics, once its exchange has ended.
    fn write(self, proxy: &Proxy, request_id: Arc<str>, endpoint: Endpoint, report: Report) {
        proxy.metrics.request(
            report.served_provider.as_deref().unwrap_or(""),
            &self.model_label,
            report.outcome,
            report.status,
        );
        proxy
            .metrics
            .attempts(u32::try_from(report.attempts.len()).unwrap_or(u32::MAX));
        proxy.access_log.write(RequestLine {
            at: SystemTime::now(),
            request_id,
            endpoint: endpoint.name(),
            tenant: self.tenant,
            model: self.model,
            decision: self.decision,
            status: report.status,
            outcome: report.outcome,
            error: report.error.clone(),
            exchange: Some(ExchangeLine {
                ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                report,
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A key that was sent but cannot be read as one is not valid, rather
    /// than missing: `missing_api_key` told such a client to send a key.
    #[test]
    fn a_credential_given_twice_or_not_in_visible_ascii_is_unreadable() {
        let with = |lines: &[(&hyper::header::HeaderName, &[u8])]| {
            let mut headers = HeaderMap::new();
            for (name, value) in lines {
                headers.append((*name).clone(), HeaderValue::from_bytes(value).unwrap());
            }
            unreadable_credential(&headers)
        };
        let api_key = &header_names::API_KEY;
        let authorization = &header::AUTHORIZATION;
        assert!(!unreadable_credential(&HeaderMap::new()));
        assert!(!with(&[(authorization, b"Bearer sk-a")]));
        assert!(!with(&[
            (authorization, b"Bearer sk-a"),
            (api_key, b"sk-b")
        ]));
        assert!(with(&[(authorization, b"Bearer sk-a\xc3\xa9")]));
        assert!(with(&[(api_key, b"sk-a\xc3\xa9")]));
        assert!(with(&[
            (authorization, b"Bearer sk-a"),
            (authorization, b"Bearer sk-b")
        ]));
        assert!(with(&[(api_key, b"sk-a"), (api_key, b"sk-a")]));
    }

    #[test]
    fn generated_request_ids_are_sixteen_hex_digits() {
        let id = new_request_id();
        let digits = id.strip_prefix("req_").unwrap();
        assert_eq!(digits.len(), 16, "{id}");
        assert!(
            digits
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(new_request_id(), id);
        assert_eq!(request_id(&HeaderMap::new()).len(), 20);
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(percent_decoded("gpt-5").as_deref(), Some("gpt-5"));
        assert_eq!(
            percent_decoded("deepseek%2Fdeepseek-v3.2").as_deref(),
            Some("deepseek/deepseek-v3.2")
        );
        assert_eq!(percent_decoded("a%2fb%20c").as_deref(), Some("a/b c"));
        // Not an escape: kept as it is.
        assert_eq!(percent_decoded("50%").as_deref(), Some("50%"));
        assert_eq!(percent_decoded("%+1x").as_deref(), Some("%+1x"));
        assert_eq!(percent_decoded("%zz").as_deref(), Some("%zz"));
        assert_eq!(percent_decoded("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decoded("%FF"), None);
    }

    #[test]
    fn a_request_id_that_is_a_key_is_not_taken() {
        let with = |pairs: &[(&'static str, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_str(value).unwrap());
            }
            request_id(&headers)
        };
        assert_eq!(
            &*with(&[("x-request-id", "client-req-42")]),
            "client-req-42"
        );
        // The client's own key, however short, and anything shaped like one.
        let id = with(&[("x-request-id", "k-acme"), ("x-api-key", "k-acme")]);
        assert!(id.starts_with("req_"), "{id}");
        let id = with(&[
            ("x-request-id", "k-acme"),
            ("authorization", "Bearer k-acme"),
        ]);
        assert!(id.starts_with("req_"), "{id}");
        // Holding the client's key, which no key shape gives away.
        let id = with(&[
            ("x-request-id", "trace.noirdoc-acme-key"),
            ("x-api-key", "noirdoc-acme-key"),
        ]);
        assert!(id.starts_with("req_"), "{id}");
        let id = with(&[("x-request-id", "sk-proj-ABCDEFGHIJ0123456789")]);
        assert!(id.starts_with("req_"), "{id}");
        // Anywhere in the id, not only at its start.
        let id = with(&[("x-request-id", "trace:sk-proj-ABCDEFGHIJ0123456789")]);
        assert!(id.starts_with("req_"), "{id}");
        let id = with(&[("x-request-id", "foo-sk-proj-AbCdEf0123456789xyzABC")]);
        assert!(id.starts_with("req_"), "{id}");
    }

    #[test]
    fn a_logged_model_masks_what_looks_like_a_key_and_is_cut_short() {
        assert_eq!(logged_model("gpt-5", None), "gpt-5");
        let key = "sk-proj-ABCDEFGHIJ0123456789";
        assert_eq!(
            logged_model(key, None),
            format!("sk-{}", "*".repeat(key.len() - 3))
        );
        // An id holding the caller's own key is masked whole.
        assert_eq!(logged_model("k-acme", Some("k-acme")), "***");
        assert_eq!(logged_model("a k-acme b", Some("k-acme")), "***");
        // A short key only as the id or one of its words: not inside a
        // real model's id, which masking would turn into a clue.
        assert_eq!(logged_model("acme-chat", Some("acme")), "acme-chat");
        assert_eq!(logged_model("x-sk-test-acme", Some("sk-test-acme")), "***");
        assert_eq!(logged_model("gpt-5", Some("k-acme")), "gpt-5");
        let long = "é".repeat(200);
        let logged = logged_model(&long, None);
        assert!(logged.ends_with('…'), "{logged}");
        assert!(logged.len() <= LOGGED_MODEL_BYTES + '…'.len_utf8());
    }

    #[tokio::test]
    async fn client_connections_send_without_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (stream, _) = accepted.unwrap();
        assert!(!stream.nodelay().unwrap(), "Nagle is on by default");
        send_without_delay(&stream);
        assert!(stream.nodelay().unwrap());
    }
}
