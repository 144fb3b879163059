//! Request latency through the proxy while its policy is reloaded again and
//! again, against a quiet run with the same load in the same process.
//!
//! The Noirdoc policy over a generated 1,000-route catalog serves a closed
//! loop of chat completions (simulated providers, no upstream delay). The
//! storm rewrites the policy file every 50 ms, alternating a valid change
//! and an invalid edit, so the watcher checks and compiles it each time.
//!
//! Run: `cargo bench --bench reload_storm` (20,000 requests per run);
//! under `cargo test` it runs a small smoke version.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use switchyard::compile::{AllSecrets, compile_report};
use switchyard::language::check_file;
use switchyard::proxy::{Options, Proxy, serve};
use switchyard::reload::Reloader;
use switchyard::sim::{self, Scenario};
use switchyard::state::{InProcess, SystemClock};

const KEY: &str = "sk-noirdoc-acme";
const STORM_INTERVAL: Duration = Duration::from_millis(50);

struct Load {
    requests: usize,
    workers: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Sends `load.requests` chat completions from `load.workers` loops;
/// returns every latency, sorted.
async fn run_load(url: &str, load: &Load) -> Vec<Duration> {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..load.workers {
        let (client, url, next) = (client.clone(), url.to_string(), next.clone());
        let total = load.requests;
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < total {
                let started = Instant::now();
                let response = client
                    .post(&url)
                    .bearer_auth(KEY)
                    .json(&serde_json::json!({
                        "model": "qwen3.8-27b",
                        "messages": [{"role": "user", "content": "Hello"}],
                    }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200, "a request failed during the run");
                let _ = response.bytes().await.unwrap();
                latencies.push(started.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all.sort();
    all
}

/// Rewrites the policy every interval until stopped: a valid change, then
/// an invalid edit. Returns how many writes it made.
fn storm(policy: PathBuf, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let original = std::fs::read_to_string(&policy).unwrap();
        let mut writes = 0;
        while !stop.load(Ordering::SeqCst) {
            let text = if writes % 2 == 0 {
                format!("{original}\n# storm {writes}\n")
            } else {
                format!("{original}\nnot a policy {writes}\n")
            };
            std::fs::write(&policy, text).unwrap();
            writes += 1;
            tokio::time::sleep(STORM_INTERVAL).await;
        }
        std::fs::write(&policy, original).unwrap();
        writes
    })
}

fn row(name: &str, latencies: &[Duration]) -> [Duration; 4] {
    let figures = [
        percentile(latencies, 0.50),
        percentile(latencies, 0.90),
        percentile(latencies, 0.99),
        *latencies.last().unwrap(),
    ];
    println!(
        "{name:<8} {:>10.3?} {:>10.3?} {:>10.3?} {:>10.3?}  ({} requests)",
        figures[0],
        figures[1],
        figures[2],
        figures[3],
        latencies.len()
    );
    figures
}

/// Points the generated catalog's providers at the simulated ones.
fn retarget(policy: &Path, sim_addr: &str) {
    let catalog = policy.with_file_name("catalog.yaml");
    let text = std::fs::read_to_string(&catalog).unwrap();
    std::fs::write(&catalog, text.replace("127.0.0.1:9100", sim_addr)).unwrap();
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let load = if full {
        Load {
            requests: 20_000,
            workers: 8,
        }
    } else {
        Load {
            requests: 200,
            workers: 2,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let scenario = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/healthy.yaml"),
        )
        .unwrap();
        let simulated = sim::start(
            "127.0.0.1:0".parse().unwrap(),
            Scenario::parse(&scenario, "scenarios/healthy.yaml").unwrap(),
        )
        .await
        .unwrap();
        let policy = common::generate_policy("noirdoc", 1_000);
        retarget(&policy, &simulated.addr().to_string());
        let (snapshot, sources) = match compile_report(check_file(&policy), &AllSecrets) {
            Ok(compiled) => compiled,
            Err(report) => panic!(
                "the generated policy does not check: {:#?}",
                report.diagnostics
            ),
        };
        let proxy = Proxy::new(
            Arc::new(snapshot),
            InProcess::new(Arc::new(SystemClock::new())),
            Options::default(),
        );
        let reloader = Reloader::new(
            proxy.clone(),
            policy.clone(),
            &sources,
            Arc::new(AllSecrets),
        );
        let _watch = reloader.watch().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = serve(proxy.clone(), listener, Duration::from_secs(5)).unwrap();
        let url = format!("http://{}/v1/chat/completions", running.addr());

        // Warm up connections and caches, then the quiet run.
        run_load(
            &url,
            &Load {
                requests: load.workers * 20,
                workers: load.workers,
            },
        )
        .await;
        let quiet = run_load(&url, &load).await;

        let stop = Arc::new(AtomicBool::new(false));
        let storming = storm(policy.clone(), stop.clone());
        let stormy = run_load(&url, &load).await;
        stop.store(true, Ordering::SeqCst);
        let writes = storming.await.unwrap();
        let status = proxy.reload_status.lock().unwrap().clone();

        println!(
            "{:<8} {:>10} {:>10} {:>10} {:>10}",
            "run", "p50", "p90", "p99", "max"
        );
        let quiet_row = row("quiet", &quiet);
        let storm_row = row("storm", &stormy);
        let ratio = |i: usize| storm_row[i].as_secs_f64() / quiet_row[i].as_secs_f64();
        println!(
            "storm / quiet: p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
            ratio(0),
            ratio(1),
            ratio(2),
            ratio(3)
        );
        println!(
            "{writes} policy writes during the storm: {} reloads, {} failed reloads",
            status.reloads, status.failures
        );
        running.shutdown().await;
        simulated.shutdown().await;
    });
}
