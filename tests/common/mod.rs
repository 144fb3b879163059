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
