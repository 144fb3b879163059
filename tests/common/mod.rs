//! What the loopback tests share: simulated providers, a policy written to
//! a fresh directory with its providers pointing at them, and the proxy
//! serving it.

#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use switchyard::compile::{FixedSecrets, SecretSource, Snapshot, compile_report};
use switchyard::language::check_file;
use switchyard::proxy::{Options, Proxy, Running, serve};
use switchyard::sim::{self, Scenario, SimHandle};
use switchyard::source::SourceMap;
use switchyard::state::{Clock, InProcess, SystemClock};

/// The SHA-256 hex digest tenants files store for a key.
pub fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh, empty directory under the system's temporary directory.
pub fn unique_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "switchyard-test-{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    pub dir: PathBuf,
    pub policy: PathBuf,
    pub sim: SimHandle,
    pub proxy: Arc<Proxy>,
    pub running: Running,
    pub sources: SourceMap,
    pub client: reqwest::Client,
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
        let sim = start_sim(scenario).await;
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
        dir: PathBuf,
        policy: PathBuf,
        sim: SimHandle,
        (snapshot, sources): (Snapshot, SourceMap),
        options: Options,
        clock: Arc<dyn Clock>,
    ) -> Stack {
        let proxy = Proxy::new(Arc::new(snapshot), InProcess::new(clock), options);
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
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        Reply {
            status,
            headers,
            text,
            json,
        }
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_sim(scenario: &str) -> SimHandle {
    sim::start(
        "127.0.0.1:0".parse().unwrap(),
        Scenario::parse(scenario, "scenario").unwrap(),
    )
    .await
    .unwrap()
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
    pub json: serde_json::Value,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The server-sent events of a streamed answer: (event name, data).
    pub fn events(&self) -> Vec<(Option<String>, String)> {
        self.text
            .split("\n\n")
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
}

/// Moves `clock` forward `step_ms` at a time (yielding a little real time
/// between steps, so the proxy can reach its next wait) until `future`
/// finishes; returns its output. Panics after `max_ms` of clock time.
pub async fn advance_until<T>(
    clock: &switchyard::state::ManualClock,
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
