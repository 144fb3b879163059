//! `switchyard demo`: the proxy with a shipped policy in front of simulated
//! providers, one of them flaky, in one process. No provider keys needed.

use super::daemon::{LogFormat, init_logging, runtime};
use super::exit;
use super::serve::{Service, load};
use crate::compile::AllSecrets;
use crate::proxy::{Options, Running};
use crate::sim::{self, Scenario};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The shipped files the demo serves, by path inside its policy directory.
const FILES: &[(&str, &str)] = &[
    (
        "noirdoc.policy",
        include_str!("../../policies/noirdoc.policy"),
    ),
    (
        "noirdoc/catalog.yaml",
        include_str!("../../policies/noirdoc/catalog.yaml"),
    ),
    (
        "noirdoc/tenants.yaml",
        include_str!("../../policies/noirdoc/tenants.yaml"),
    ),
];
const POLICY: &str = "noirdoc.policy";
const SCENARIO: &str = include_str!("../../scenarios/demo.yaml");
/// Where the shipped catalog expects its providers.
const SIM_ADDR: &str = "127.0.0.1:9100";

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where the proxy listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve the policy from this directory, which you may edit while the
    /// demo runs (changes reload live). The shipped policy is copied there
    /// when the directory is empty or new. Without it, a fresh temporary
    /// directory is used.
    #[arg(long, value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(exit::USAGE)
}

/// Copies the shipped policy into `dir` unless it already holds files.
fn prepare(dir: &Path) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    if std::fs::read_dir(dir)?.next().is_some() {
        return Ok(false);
    }
    for (path, text) in FILES {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(target, text)?;
    }
    Ok(true)
}

pub fn run(args: &DemoArgs) -> ExitCode {
    init_logging(args.log_format);
    let dir = args.policy_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("switchyard-demo-{}", std::process::id()))
    });
    let copied = match prepare(&dir) {
        Ok(copied) => copied,
        Err(error) => return fail(format!("cannot prepare {}: {error}", dir.display())),
    };
    let policy = dir.join(POLICY);
    if !policy.is_file() {
        return fail(format!(
            "{} holds no {POLICY}; give an empty directory to start from the shipped policy",
            dir.display()
        ));
    }
    let scenario = match Scenario::parse(SCENARIO, "scenarios/demo.yaml") {
        Ok(scenario) => scenario,
        Err(message) => return fail(message),
    };
    // The simulated providers accept any key: every credential gets a
    // placeholder.
    let secrets = Arc::new(AllSecrets);
    let (snapshot, sources) = match load(&policy, secrets.as_ref()) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => return fail(format!("could not start the runtime: {error}")),
    };
    let service = Service {
        policy: policy.clone(),
        listen: args.listen,
        options: Options::default(),
        drain: Duration::from_secs(5),
        watch: true,
        secrets,
    };
    let code = runtime.block_on(async {
        let sim_addr: SocketAddr = match SIM_ADDR.parse() {
            Ok(addr) => addr,
            Err(error) => return fail(error),
        };
        let simulated = match sim::start(sim_addr, scenario).await {
            Ok(handle) => handle,
            Err(error) => {
                return fail(format!(
                    "cannot start the simulated providers on {SIM_ADDR} (the shipped catalog expects them there): {error}"
                ));
            }
        };
        let (running, reloader, _watch) = match service.start(snapshot, &sources).await {
            Ok(started) => started,
            Err(message) => return fail(message),
        };
        print_welcome(&policy, copied || args.policy_dir.is_none(), &running, simulated.providers());
        Service::run_until_stopped(running, reloader, Duration::from_secs(5)).await;
        simulated.shutdown().await;
        ExitCode::from(exit::OK)
    });
    // A temporary copy goes with the demo; a directory the user named stays.
    if args.policy_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    code
}

fn print_welcome(policy: &Path, shipped: bool, running: &Running, providers: Vec<String>) {
    let url = format!("http://{}", running.addr());
    let origin = if shipped {
        " (a copy of the shipped Noirdoc policy)"
    } else {
        ""
    };
    let curl = |key: &str, model: &str| {
        format!(
            "curl -s {url}/v1/chat/completions -H 'Authorization: Bearer {key}' \\\n    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'"
        )
    };
    println!(
        "Switchyard demo: the proxy on {url}, simulated providers ({}) on http://{SIM_ADDR}.
Serving {}{origin}; edit it and the proxy reloads it (a broken edit keeps the last good one).

A normal request (acme's own OpenAI key serves gpt-5):
  {}

One that fails over (aki-io, first in line for qwen3.8-27b, answers 503 to every other
request, and scaleway takes over; run it twice to see aki-io answer again):
  {}

One the policy refuses (this key may only use EU providers without the CLOUD Act; gpt-5 has none):
  {}

Add -i to see the x-noirdoc-provider header. Stop with Ctrl-C.",
        providers.join(", "),
        policy.display(),
        curl("sk-noirdoc-acme", "gpt-5"),
        curl("sk-noirdoc-acme", "qwen3.8-27b"),
        curl("sk-noirdoc-acme-eu", "gpt-5"),
    );
}
