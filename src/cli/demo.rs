//! `switchyard demo`: the proxy with a shipped policy in front of simulated
//! providers, one of them flaky, in one process. No provider keys needed.

use super::common::listen_failure;
use super::daemon::{LogFormat, Signals, fail, init_logging, raise_open_file_limit, runtime};
use super::exit;
use super::serve::{Service, load};
use crate::compile::AllSecrets;
use crate::diagnostics::io_reason;
use crate::proxy::{Options, Running};
use crate::sim::{self, Scenario};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Every file under policies/, by path inside it (bundled by build.rs).
const SHIPPED: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/shipped_policies.rs"));
/// What the demo serves and suggests: policies/demo.yaml.
const TOUR: &str = "demo.yaml";
const SCENARIO: &str = include_str!("../../scenarios/demo.yaml");
/// Where the shipped catalogs expect their providers.
const SIM_ADDR: &str = "127.0.0.1:9100";

/// policies/demo.yaml: the shipped policy the demo serves, and the
/// requests it suggests.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tour {
    /// A policy file directly under policies/; its data directory (the
    /// file's name without `.policy`) is served with it.
    pub policy: String,
    /// The response header that names the provider that answered.
    pub provider_header: String,
    pub requests: Vec<Suggestion>,
}

/// A request the demo prints as a ready-to-paste curl command.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suggestion {
    /// What the request shows.
    pub say: String,
    /// The API key (in clear; the tenants file holds its hash).
    pub key: String,
    pub model: String,
    /// What happens, as tests/demo.rs checks.
    pub shows: Shows,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shows {
    /// The first provider asked answers.
    Answer,
    /// The first provider asked fails and another answers.
    Failover,
    /// The policy refuses the request before any provider is asked.
    Refusal,
}

impl Tour {
    /// The tour built into this binary.
    pub fn shipped() -> Result<Tour, String> {
        let text = shipped_file(TOUR).ok_or("the binary was built without policies/demo.yaml")?;
        serde_saphyr::from_str(text).map_err(|error| {
            crate::data::yaml_error(&format!("policies/{TOUR}"), text, &error).to_string()
        })
    }

    /// The files to serve, by path inside the policy directory: the policy
    /// and everything in its data directory.
    pub fn files(&self) -> Vec<(&'static str, &'static str)> {
        let data_dir = format!("{}/", self.policy.trim_end_matches(".policy"));
        SHIPPED
            .iter()
            .filter(|(path, _)| *path == self.policy || path.starts_with(&data_dir))
            .copied()
            .collect()
    }
}

fn shipped_file(path: &str) -> Option<&'static str> {
    SHIPPED
        .iter()
        .find(|(shipped, _)| *shipped == path)
        .map(|(_, text)| *text)
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where the proxy listens.
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = super::daemon::listen_arg)]
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

/// Copies the shipped policy into `dir` unless it already holds files.
fn prepare(dir: &Path, tour: &Tour) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    if std::fs::read_dir(dir)?.next().is_some() {
        return Ok(false);
    }
    for (path, text) in tour.files() {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(target, text)?;
    }
    Ok(true)
}

pub fn run(args: &DemoArgs) -> ExitCode {
    let logs = init_logging(args.log_format);
    raise_open_file_limit();
    let tour = match Tour::shipped() {
        Ok(tour) => tour,
        Err(message) => return fail(message),
    };
    let dir = args.policy_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("switchyard-demo-{}", std::process::id()))
    });
    if dir.exists() && !dir.is_dir() {
        return fail(format!(
            "{} is not a directory; --policy-dir names a directory (an empty one starts from the shipped policy)",
            dir.display()
        ));
    }
    let copied = match prepare(&dir, &tour) {
        Ok(copied) => copied,
        Err(error) => {
            return fail(format!(
                "cannot prepare {}: {}",
                dir.display(),
                io_reason(&error)
            ));
        }
    };
    let policy = dir.join(&tour.policy);
    if !policy.is_file() {
        return fail(format!(
            "{} holds no {}; give an empty directory to start from the shipped policy",
            dir.display(),
            tour.policy
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
        access_log: logs.access_log.clone(),
    };
    let code = runtime.block_on(async {
        let sim_addr: SocketAddr = match SIM_ADDR.parse() {
            Ok(addr) => addr,
            Err(error) => return fail(error),
        };
        // Not "another process": the demo's own providers would be there.
        if args.listen.port() == sim_addr.port()
            && (args.listen.ip() == sim_addr.ip() || args.listen.ip().is_unspecified())
        {
            return fail(format!(
                "the demo's simulated providers listen on {SIM_ADDR}; give the proxy another \
                 address, such as --listen 127.0.0.1:8080"
            ));
        }
        let simulated = match sim::start(sim_addr, scenario).await {
            Ok(handle) => handle,
            // The shipped catalog names this address: there is no other.
            Err(error) => {
                return fail(listen_failure(
                    "the simulated providers",
                    SIM_ADDR,
                    &error,
                    None,
                ));
            }
        };
        let (running, reloader, _watch) = match service.start(snapshot, &sources).await {
            Ok(started) => started,
            Err(message) => return fail(message),
        };
        let signals = match Signals::to_stop_or_reload() {
            Ok(signals) => signals,
            Err(error) => return fail(format!("cannot listen for signals: {error}")),
        };
        let shipped = copied || args.policy_dir.is_none();
        print_welcome(&tour, &policy, shipped, &running, simulated.providers());
        Service::run_until_stopped(running, reloader, Duration::from_secs(5), signals).await;
        simulated.shutdown().await;
        ExitCode::from(exit::OK)
    });
    // A temporary copy goes with the demo; a directory the user named stays.
    if args.policy_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    code
}

fn print_welcome(
    tour: &Tour,
    policy: &Path,
    shipped: bool,
    running: &Running,
    providers: Vec<String>,
) {
    let url = format!("http://{}", running.addr());
    let origin = if shipped {
        format!(" (a copy of the shipped {})", tour.policy)
    } else {
        String::new()
    };
    say!(
        "Switchyard demo: the proxy on {url}, simulated providers ({}) on http://{SIM_ADDR}.
Serving {}{origin}; edit it and the proxy reloads it (a broken edit keeps the last good one).",
        providers.join(", "),
        policy.display(),
    );
    for suggestion in &tour.requests {
        say!(
            "\n{}\n  curl -s {url}/v1/chat/completions -H 'Authorization: Bearer {}' \\\n    -d '{{\"model\": \"{}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'",
            suggestion.say,
            suggestion.key,
            suggestion.model
        );
    }
    say!(
        "\nAdd -i to see the {} header. Stop with Ctrl-C.",
        tour.provider_header
    );
}
