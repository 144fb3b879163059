//! What the loopback tests share: simulated providers, a policy written to
//! a fresh directory with its providers pointing at them, and the proxy
//! serving it; scenarios for the simulated fleet; requests, and what a
//! reply says; waiting for the proxy in real time.

#![allow(dead_code)]

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use switchyard::compile::{FixedSecrets, SecretSource, Snapshot, compile_report};
use switchyard::language::check_file;
use switchyard::proxy::{AccessLog, Options, Proxy, RequestLine, Running, TracingAccessLog, serve};
use switchyard::sim::{self, Scenario, SimHandle};
use switchyard::source::SourceMap;
use switchyard::state::{Clock, InProcess, ManualClock, SystemClock};
use tokio::task::JoinHandle;

/// The SHA-256 hex digest tenants files store for a key.
pub fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tenants file with one tenant (`t`) and one key (`k`), `key`.
pub fn one_key_tenants(key: &str) -> String {
    format!(
        "tenants:\n  - id: t\n    keys:\n      - id: k\n        sha256: {}\n",
        sha256_hex(key)
    )
}

/// A fresh, empty directory under the system's temporary directory,
/// removed with everything in it when dropped, so that a test that fails
/// or never stops its stack leaves nothing behind.
pub fn unique_dir(name: &str) -> ScratchDir {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "switchyard-test-{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    ScratchDir(dir)
}

/// See [`unique_dir`].
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl std::ops::Deref for ScratchDir {
    type Target = PathBuf;

    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<std::path::Path> for ScratchDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A policy and its data, as text. In the catalog, `{sim}` stands for the
/// simulated providers' address.
pub struct Files<'a> {
    pub policy: &'a str,
    pub catalog: &'a str,
    pub tenants: &'a str,
    pub scenario: &'a str,
    /// Environment variable → secret, for the catalog's credentials.
    pub secrets: &'a [(&'a str, &'a str)],
}

impl Files<'_> {
    pub fn secrets(&self) -> FixedSecrets {
        FixedSecrets(
            self.secrets
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
        )
    }
}

/// Simulated providers and the proxy in front of them.
pub struct Stack {
    pub dir: ScratchDir,
    pub policy: PathBuf,
    pub sim: SimHandle,
    pub proxy: Arc<Proxy>,
    pub running: Running,
    pub sources: SourceMap,
    pub client: reqwest::Client,
    /// The request lines the proxy logged.
    pub log: Arc<KeptLines>,
}

/// Keeps the request lines a proxy logs, for tests that read them, and
/// hands each on to tracing as a proxy without a log of its own does.
#[derive(Default)]
pub struct KeptLines(std::sync::Mutex<Vec<RequestLine>>);

impl KeptLines {
    pub fn lines(&self) -> Vec<RequestLine> {
        self.0.lock().unwrap().clone()
    }
}

impl AccessLog for KeptLines {
    fn write(&self, line: RequestLine) {
        self.0.lock().unwrap().push(line.clone());
        TracingAccessLog.write(line);
    }
}

impl Stack {
    pub async fn start(name: &str, files: &Files<'_>, options: Options) -> Stack {
        Stack::start_with_clock(name, files, options, Arc::new(SystemClock::new())).await
    }

    /// Like `start`, with the proxy's time (pauses, waits, timeouts) on
    /// `clock`, for example a `ManualClock` the test moves.
    pub async fn start_with_clock(
        name: &str,
        files: &Files<'_>,
        options: Options,
        clock: Arc<dyn Clock>,
    ) -> Stack {
        let sim = start_sim(files.scenario).await;
        let dir = unique_dir(name);
        let catalog = files.catalog.replace("{sim}", &sim.addr().to_string());
        std::fs::write(dir.join("catalog.yaml"), catalog).unwrap();
        std::fs::write(dir.join("tenants.yaml"), files.tenants).unwrap();
        let policy = dir.join(format!("{name}.policy"));
        std::fs::write(&policy, files.policy).unwrap();
        let (snapshot, sources) = compile(&policy, &files.secrets());
        Stack::serve(dir, policy, sim, (snapshot, sources), options, clock).await
    }

    /// One of the shipped policies (`policies/NAME.policy` and its data),
    /// copied to a fresh directory with its providers pointed at simulated
    /// ones that behave as `scenario` says. Every credential has a secret
    /// but those whose variables are in `missing`.
    pub async fn shipped(
        name: &str,
        scenario: &str,
        missing: &[&str],
        clock: Arc<dyn Clock>,
    ) -> Stack {
        Stack::shipped_with_sim(name, start_sim(scenario).await, missing, clock).await
    }

    /// [`Stack::shipped`], with the scenario's pauses on `clock` too: the
    /// test decides when the sim answers as well as when the proxy's waits
    /// end.
    pub async fn shipped_on_one_clock(
        name: &str,
        scenario: &str,
        clock: Arc<ManualClock>,
    ) -> Stack {
        let sim = sim::start_on_clock(
            "127.0.0.1:0".parse().unwrap(),
            parsed_scenario(scenario),
            clock.clone(),
        )
        .await
        .expect("the sim starts");
        Stack::shipped_with_sim(name, sim, &[], clock).await
    }

    async fn shipped_with_sim(
        name: &str,
        sim: SimHandle,
        missing: &[&str],
        clock: Arc<dyn Clock>,
    ) -> Stack {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let dir = unique_dir(name);
        std::fs::copy(
            root.join(format!("{name}.policy")),
            dir.join(format!("{name}.policy")),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join(name)).unwrap();
        for file in ["catalog.yaml", "tenants.yaml"] {
            let text = std::fs::read_to_string(root.join(name).join(file)).unwrap();
            let text = text.replace(SHIPPED_SIM_ADDR, &sim.addr().to_string());
            std::fs::write(dir.join(name).join(file), text).unwrap();
        }
        let policy = dir.join(format!("{name}.policy"));
        let secrets = AllBut(missing.iter().map(|m| m.to_string()).collect());
        let compiled = compile(&policy, &secrets);
        Stack::serve(dir, policy, sim, compiled, Options::default(), clock).await
    }

    async fn serve(
        dir: ScratchDir,
        policy: PathBuf,
        sim: SimHandle,
        (snapshot, sources): (Snapshot, SourceMap),
        options: Options,
        clock: Arc<dyn Clock>,
    ) -> Stack {
        let log = Arc::new(KeptLines::default());
        let proxy = Proxy::logging_to(
            Arc::new(snapshot),
            InProcess::new(clock),
            options,
            log.clone(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = serve(proxy.clone(), listener, Duration::from_secs(5)).unwrap();
        Stack {
            dir,
            policy,
            sim,
            proxy,
            running,
            sources,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.addr())
    }

    /// POSTs `body` to `path` with `key` as `Authorization: Bearer` (no
    /// key when `None`) and the extra headers; reads the whole answer.
    pub async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Reply {
        let mut request = self.client.post(self.url(path)).json(body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Reply::of(request).await
    }

    /// `post` to `/v1/chat/completions`.
    pub async fn chat(&self, key: &str, body: serde_json::Value) -> Reply {
        self.post("/v1/chat/completions", Some(key), &[], &body)
            .await
    }

    /// `post` to `/v1/messages`, as an Anthropic client (with
    /// `anthropic-version`).
    pub async fn messages(&self, key: &str, body: serde_json::Value) -> Reply {
        self.post(
            "/v1/messages",
            Some(key),
            &[("anthropic-version", "2023-06-01")],
            &body,
        )
        .await
    }

    /// The providers the simulated fleet received requests for, in order
    /// (each with the model it was asked for).
    pub fn tried(&self) -> Vec<(String, Option<String>)> {
        self.sim
            .requests()
            .into_iter()
            .map(|request| (request.provider, request.model))
            .collect()
    }

    /// Just the providers of `tried`.
    pub fn providers_tried(&self) -> Vec<String> {
        self.tried()
            .into_iter()
            .map(|(provider, _)| provider)
            .collect()
    }

    pub async fn stop(self) {
        self.running.shutdown().await;
        self.sim.shutdown().await;
    }
}

/// Simulated providers on a free loopback port, behaving as `scenario`
/// (YAML) says.
pub async fn start_sim(scenario: &str) -> SimHandle {
    sim::start("127.0.0.1:0".parse().unwrap(), parsed_scenario(scenario))
        .await
        .expect("the sim starts")
}

fn parsed_scenario(text: &str) -> Scenario {
    Scenario::parse(text, "scenario")
        .unwrap_or_else(|error| panic!("the test scenario does not parse: {error}"))
}

/// Where the shipped catalogs expect the simulated providers.
const SHIPPED_SIM_ADDR: &str = "127.0.0.1:9100";

/// Every credential has a placeholder secret, but those named.
pub struct AllBut(pub Vec<String>);

impl SecretSource for AllBut {
    fn get(&self, name: &str) -> Option<String> {
        (!self.0.iter().any(|missing| missing == name)).then(|| format!("secret-of-{name}"))
    }
}

/// Checks and compiles a policy; a test policy that does not check is a
/// broken test.
pub fn compile(policy: &std::path::Path, secrets: &dyn SecretSource) -> (Snapshot, SourceMap) {
    match compile_report(check_file(policy), secrets) {
        Ok(compiled) => compiled,
        Err(report) => {
            let rendered: Vec<String> = report
                .diagnostics
                .iter()
                .map(|d| {
                    switchyard::diagnostics::render::human(
                        d,
                        &report.sources,
                        switchyard::diagnostics::render::Style::Plain,
                    )
                })
                .collect();
            panic!("the test policy does not check:\n{}", rendered.join("\n"));
        }
    }
}

/// A whole answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    /// The body as JSON (null when it is not).
    pub json: Value,
    /// From sending the request to the end of the body.
    pub elapsed: Duration,
}

impl Reply {
    /// Sends `request` and reads the whole answer.
    pub async fn of(request: reqwest::RequestBuilder) -> Reply {
        let started = Instant::now();
        let response = request.send().await.expect("the proxy answers");
        Reply::rest(response, String::new(), started).await
    }

    /// The rest of `response`, after `text` was read of it; the request
    /// was sent at `started`.
    pub async fn rest(mut response: reqwest::Response, text: String, started: Instant) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let mut body = text.into_bytes();
        while let Some(chunk) = response.chunk().await.expect("the body arrives whole") {
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(body).expect("the body is UTF-8");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            text,
            json,
            elapsed: started.elapsed(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The server-sent events of a streamed answer: (event name, data).
    pub fn events(&self) -> Vec<(Option<String>, String)> {
        events(&self.text)
    }

    /// Whether the answer is a stream of server-sent events.
    pub fn is_stream(&self) -> bool {
        self.header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"))
    }

    /// The content of a whole chat completion (not streamed).
    pub fn chat_text(&self) -> String {
        self.json
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no message content in {}", self.text))
            .to_string()
    }

    /// The answer text of a stream's events, joined, in any of the three
    /// wire formats.
    pub fn streamed_text(&self) -> String {
        self.events()
            .iter()
            .filter_map(|(_, data)| event_text(data))
            .collect()
    }

    /// The answer's text: a whole answer's content (chat completion,
    /// message or response), or a stream's pieces joined.
    pub fn answer_text(&self) -> String {
        match self
            .json
            .pointer("/choices/0/message/content")
            .or_else(|| self.json.pointer("/content/0/text"))
            .or_else(|| self.json.pointer("/output/0/content/0/text"))
            .and_then(Value::as_str)
        {
            Some(text) => text.to_string(),
            None => self.streamed_text(),
        }
    }

    /// A successful answer from `provider` (the sim's answers name it); a
    /// stream must also have ended properly: with its sentinel, and
    /// without an error event.
    pub fn assert_served(&self, provider: &str) {
        assert_eq!(self.status, 200, "{}", self.text);
        assert_eq!(
            self.answer_text(),
            format!("hello from {provider}"),
            "{}",
            self.text
        );
        if self.is_stream() {
            let events = self.events();
            assert!(
                events.last().is_some_and(is_sentinel),
                "the stream ends with its sentinel: {}",
                self.text
            );
            assert!(
                !events.iter().any(is_error_event),
                "a clean stream: {}",
                self.text
            );
        }
    }

    /// A stream that began and then broke: status 200, part of the answer
    /// reached the client, no event ends it as complete, and the last
    /// event is an error. Returns that event: its name and its data.
    pub fn broken_stream(&self) -> (Option<String>, Value) {
        assert_eq!(self.status, 200, "{}", self.text);
        assert!(
            !self.answer_text().is_empty(),
            "part of the answer reached the client: {}",
            self.text
        );
        let events = self.events();
        assert!(
            !events.iter().any(is_sentinel),
            "no sentinel after a broken stream: {}",
            self.text
        );
        let last = events
            .last()
            .unwrap_or_else(|| panic!("a stream without events: {}", self.text));
        assert!(
            is_error_event(last),
            "the stream ends with an error event: {}",
            self.text
        );
        let (name, data) = last;
        let data: Value = serde_json::from_str(data).unwrap();
        if data["type"] == "error" && data.get("code").is_none() {
            // Anthropic's error event names its request, as its error
            // object does (a Responses error event has its own `code`).
            assert_eq!(
                data["request_id"].as_str(),
                self.header("x-request-id"),
                "{}",
                self.text
            );
        }
        (name.clone(), data)
    }

    /// The OpenAI error object: status, `code` and `type`; returns the
    /// message.
    pub fn openai_error(&self, status: u16, code: &str, error_type: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        let error = &self.json["error"];
        assert_eq!(error["code"], code, "{}", self.text);
        assert_eq!(error["type"], error_type, "{}", self.text);
        message(error, &self.text)
    }

    /// The Anthropic error object (`{"type": "error", "error": {"type",
    /// "message"}}`; the proxy's own add a `code`, a provider's passed
    /// through has none): status and `type`; returns the message.
    pub fn anthropic_error(&self, status: u16, error_type: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.json["type"], "error", "{}", self.text);
        let error = &self.json["error"];
        assert_eq!(error["type"], error_type, "{}", self.text);
        message(error, &self.text)
    }
}

/// An error object's message, which must be there and say something.
fn message(error: &Value, text: &str) -> String {
    let message = error["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {text}"));
    assert!(!message.is_empty(), "an empty message: {text}");
    message.to_string()
}

/// The server-sent events of `text`: (event name, data).
pub fn events(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.trim().to_string());
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push(value.trim_start().to_string());
                } else if line.starts_with(':') {
                    name = Some(String::from(":comment"));
                    data.push(line.trim_start_matches(':').trim().to_string());
                }
            }
            (name, data.join("\n"))
        })
        .collect()
}

/// The answer text an event's data carries, in any of the three wire
/// formats.
pub fn event_text(data: &str) -> Option<String> {
    let event: Value = serde_json::from_str(data).ok()?;
    event
        .pointer("/choices/0/delta/content")
        .or_else(|| event.pointer("/delta/text"))
        .or_else(|| {
            (event["type"] == "response.output_text.delta")
                .then(|| event.get("delta"))
                .flatten()
        })
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Whether an event ends a stream as complete: `[DONE]`, `message_stop`
/// or `response.completed`.
pub fn is_sentinel((name, data): &(Option<String>, String)) -> bool {
    data == "[DONE]"
        || matches!(
            name.as_deref(),
            Some("message_stop") | Some("response.completed")
        )
}

/// An error event: Anthropic's `event: error`, or an OpenAI event with an
/// `error` object.
pub fn is_error_event((name, data): &(Option<String>, String)) -> bool {
    name.as_deref() == Some("error")
        || serde_json::from_str::<Value>(data).is_ok_and(|event| event["error"].is_object())
}

// ---------------------------------------------------------------------
// Scenarios

/// A scenario with every provider of `providers`: those named with the
/// settings given (YAML flow mappings), the others answering 200.
pub fn fleet<S: AsRef<str>>(providers: &[&str], overrides: &[(&str, S)]) -> String {
    let mut yaml = String::from("providers:\n");
    for provider in providers {
        let settings = overrides
            .iter()
            .find(|(name, _)| name == provider)
            .map_or("{}", |(_, settings)| settings.as_ref());
        yaml.push_str(&format!("  {provider}: {settings}\n"));
    }
    yaml
}

/// A provider's settings: these steps, the last repeating.
pub fn steps(sequence: &[&str]) -> String {
    let quoted: Vec<String> = sequence.iter().map(|step| format!("'{step}'")).collect();
    format!("{{sequence: [{}]}}", quoted.join(", "))
}

/// A scenario in which every provider of `providers` answers 200 but
/// those given a sequence of steps (the last repeating).
pub fn scenario(providers: &[&str], sequences: &[(&str, &[&str])]) -> String {
    let overrides: Vec<(&str, String)> = sequences
        .iter()
        .map(|(provider, sequence)| (*provider, steps(sequence)))
        .collect();
    fleet(providers, &overrides)
}

/// No provider given steps: every one answers 200.
pub const HEALTHY: &[(&str, &[&str])] = &[];

/// Every provider of `providers` answers `step`.
pub fn all_answer(providers: &[&str], step: &str) -> String {
    let overrides: Vec<(&str, String)> = providers
        .iter()
        .map(|provider| (*provider, steps(&[step])))
        .collect();
    fleet(providers, &overrides)
}

/// New behaviour for the sim (sequences from their first step) and an
/// empty record; the proxy's state (pauses, penalties, counts) stays.
pub fn replay(stack: &Stack, yaml: &str) {
    stack
        .sim
        .set_scenario(Scenario::parse(yaml, "scenario").unwrap());
    stack.sim.clear();
}

// ---------------------------------------------------------------------
// Bodies and requests

/// An OpenAI chat completion asking for `model`.
pub fn chat_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]})
}

/// An Anthropic message asking for `model`.
pub fn messages_body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]})
}

/// `body` asking for a stream.
pub fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

/// The providers the sim was asked since it had `before` requests.
pub fn asked_since(stack: &Stack, before: usize) -> Vec<String> {
    stack.providers_tried().split_off(before)
}

/// The reply to `request` and the providers the sim was asked while it
/// ran, in order.
pub async fn tried_by(stack: &Stack, request: impl Future<Output = Reply>) -> (Reply, Vec<String>) {
    let before = stack.sim.requests().len();
    let reply = request.await;
    (reply, asked_since(stack, before))
}

/// A chat completion and the providers it asked, in order.
pub async fn chat(stack: &Stack, key: &str, body: Value) -> (Reply, Vec<String>) {
    tried_by(stack, stack.chat(key, body)).await
}

/// A `/v1/messages` call and the providers it asked, in order.
pub async fn messages(stack: &Stack, key: &str, body: Value) -> (Reply, Vec<String>) {
    tried_by(stack, stack.messages(key, body)).await
}

/// POSTs `body` to `path` with `key`, like `Stack::post`, from a task of
/// its own.
pub fn spawn_post(stack: &Stack, path: &str, key: &str, body: Value) -> JoinHandle<Reply> {
    let request = stack
        .client
        .post(stack.url(path))
        .bearer_auth(key)
        .json(&body);
    tokio::spawn(Reply::of(request))
}

/// A chat completion from a task of its own.
pub fn spawn_chat(stack: &Stack, key: &str, body: Value) -> JoinHandle<Reply> {
    spawn_post(stack, "/v1/chat/completions", key, body)
}

/// [`spawn_open`] of a chat completion.
pub fn spawn_open_chat(stack: &Stack, key: &str, body: Value) -> JoinHandle<reqwest::Response> {
    spawn_open(stack, "/v1/chat/completions", key, &[], body)
}

/// POSTs `body` to `path` from a task of its own, which ends when the
/// response's headers arrive (for a stream, at its commit unless the policy
/// holds them); [`Reply::rest`] reads the rest.
pub fn spawn_open(
    stack: &Stack,
    path: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> JoinHandle<reqwest::Response> {
    let mut request = stack
        .client
        .post(stack.url(path))
        .bearer_auth(key)
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    tokio::spawn(async move { request.send().await.unwrap() })
}

/// The header `header` (the provider that served) of `count` successful
/// chat completions of `body`, in turn.
pub async fn first_choices(
    stack: &Stack,
    key: &str,
    body: &Value,
    header: &str,
    count: usize,
) -> Vec<String> {
    let mut served = Vec::with_capacity(count);
    for _ in 0..count {
        let reply = stack.chat(key, body.clone()).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        served.push(reply.header(header).unwrap().to_string());
    }
    served
}

/// The entries of `GET /v1/models` for `key`, asked as an Anthropic
/// client (with `anthropic-version`) if `anthropic`.
pub async fn model_list(stack: &Stack, key: &str, anthropic: bool) -> Vec<Value> {
    let mut request = stack.client.get(stack.url("/v1/models")).bearer_auth(key);
    if anthropic {
        request = request.header("anthropic-version", "2023-06-01");
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    body["data"].as_array().unwrap().clone()
}

/// `GET path`, without a key.
pub async fn get(stack: &Stack, path: &str) -> Reply {
    Reply::of(stack.client.get(stack.url(path))).await
}

/// `GET /healthz`: its JSON object.
pub async fn healthz(stack: &Stack) -> Value {
    let reply = get(stack, "/healthz").await;
    assert!(reply.json.is_object(), "{}", reply.text);
    reply.json
}

pub fn names(providers: &[&str]) -> Vec<String> {
    providers.iter().map(|p| p.to_string()).collect()
}

/// Nothing reached any provider.
pub fn assert_nothing_sent(stack: &Stack) {
    assert_eq!(stack.providers_tried(), Vec::<String>::new());
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A process the test started (the `switchyard` binary), killed when
/// dropped.
pub struct Spawned(pub std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (up to 20 s) until something accepts connections at `address`.
pub fn wait_until_listening(address: &str) {
    let started = Instant::now();
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nothing listens at {address}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------
// The stack's copy of a shipped policy's data (never the shipped files)

/// The path of `file` in the stack's copy of the shipped policy's data.
pub fn data_file(stack: &Stack, file: &str) -> PathBuf {
    stack.policy.with_extension("").join(file)
}

/// Edits the stack's copy of a data file: each `(from, to)` replaces the
/// first `from`, which must be there.
pub fn edit(stack: &Stack, file: &str, edits: &[(&str, &str)]) {
    let path = data_file(stack, file);
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{file} has no {from:?}");
        text = text.replacen(from, to, 1);
    }
    std::fs::write(&path, text).unwrap();
}

/// Recompiles the stack's copy of the policy and its data and serves it,
/// with the secrets of `missing` unset.
pub fn recompile(stack: &Stack, missing: &[&str]) {
    let secrets = AllBut(missing.iter().map(|name| name.to_string()).collect());
    let (snapshot, _) = compile(&stack.policy, &secrets);
    stack.proxy.replace(Arc::new(snapshot));
}

/// Edits the stack's copy of a data file and makes it live, with the
/// secrets of `missing` unset: what an operator configures differently
/// from the shipped data.
pub fn reconfigure(stack: &Stack, file: &str, edits: &[(&str, &str)], missing: &[&str]) {
    edit(stack, file, edits);
    recompile(stack, missing);
}

// ---------------------------------------------------------------------
// Waiting, in real time

/// Lets the proxy act on what just happened, or reach its next wait (real
/// time, generously).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Polls `condition` until it holds (at most 10 s of real time).
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until something sleeps on `clock` until a time `wanted` accepts
/// (at most 10 s of real time): the proxy then waits on the clock, and a
/// move of the clock acts on that wait. Its wake time is fixed from then,
/// whereas after a `settle` it may not be yet on a busy machine.
pub async fn until_sleeping(clock: &ManualClock, what: &str, wanted: impl Fn(u64) -> bool) {
    until(what, || clock.sleeping_until().into_iter().any(&wanted)).await;
}

/// Waits until the sim has received `count` requests (at most 10 s of
/// real time).
pub async fn until_asked(stack: &Stack, count: usize) {
    let started = Instant::now();
    while stack.sim.requests().len() < count {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the sim never received {count} requests: {:?}",
            stack.providers_tried()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A stream asked at `asked_at` whose headers the sim, on `clock`, holds
/// `held_ms`: lets them come once the sim waits, then waits until the
/// proxy waits `first_event_ms` from them for the first event. That wake
/// time is the first event's own: the headers' wait counts from the
/// request.
pub async fn headers_come_after(
    clock: &ManualClock,
    asked_at: u64,
    held_ms: u64,
    first_event_ms: u64,
) {
    until_sleeping(clock, "the sim holds the headers", |at| {
        at == asked_at + held_ms
    })
    .await;
    clock.advance(held_ms);
    until_sleeping(clock, "the proxy waits for the first event", |at| {
        at == asked_at + held_ms + first_event_ms
    })
    .await;
}

/// Attempts the proxy has finished (its upstream histogram's count). An
/// attempt's end, from which its pauses and penalties count, is fixed
/// before it is counted.
pub fn finished_attempts(stack: &Stack) -> u64 {
    stack
        .proxy
        .metrics
        .render()
        .lines()
        .filter(|line| line.starts_with("switchyard_upstream_seconds_count"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits for a spawned request (at most 10 s of real time).
pub async fn finished<T>(task: JoinHandle<T>) -> T {
    finished_within(Duration::from_secs(10), task).await
}

/// Waits for a spawned request, at most `limit` of real time.
pub async fn finished_within<T>(limit: Duration, task: JoinHandle<T>) -> T {
    tokio::time::timeout(limit, task)
        .await
        .expect("the request did not finish")
        .unwrap()
}

/// Moves `clock` forward `step_ms` at a time (yielding a little real time
/// between steps, so the proxy can reach its next wait) until `future`
/// finishes; returns its output. Panics after `max_ms` of clock time.
pub async fn advance_until<T>(
    clock: &ManualClock,
    step_ms: u64,
    max_ms: u64,
    future: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(future);
    let mut moved = 0;
    loop {
        tokio::select! {
            output = &mut future => return output,
            () = tokio::time::sleep(Duration::from_millis(5)) => {
                assert!(moved < max_ms, "still waiting after {moved} ms of clock time");
                clock.advance(step_ms);
                moved += step_ms;
            }
        }
    }
}
