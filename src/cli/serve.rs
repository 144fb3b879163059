//! `switchyard serve`: the proxy that enforces a policy, following changes
//! to its files.

use super::common::{CHOOSE_ANOTHER, listen_failure};
use super::daemon::{
    LogFormat, Signals, duration_arg, fail, init_logging, listen_arg, problem,
    raise_open_file_limit, runtime, status, warning,
};
use super::exit;
use crate::compile::{SecretSource, Snapshot, compile_report, unusable_credentials};
use crate::diagnostics::render::{self, Style};
use crate::language::check_served_file;
use crate::proxy::{AccessLog, Limits, Options, Proxy, Running, serve};
use crate::reload::{Outcome, Reloader, log_unusable};
use crate::source::SourceMap;
use crate::state::{InProcess, SystemClock};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The policy file; its `policy` block names the catalog and tenants
    /// files, relative to it.
    #[arg(long)]
    pub policy: PathBuf,
    /// Where to listen. Only loopback unless you say otherwise.
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = listen_arg)]
    pub listen: SocketAddr,
    /// The largest request body accepted, in bytes (at least 1).
    #[arg(long, default_value_t = Limits::default().max_body_bytes, value_parser = body_limit_arg)]
    pub max_body_bytes: usize,
    /// How long requests in flight may take to finish after SIGINT or
    /// SIGTERM.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub drain: Duration,
    /// Do not watch the policy's files for changes (SIGHUP still reloads).
    #[arg(long)]
    pub no_watch: bool,
    /// Add `x-switchyard-policy-version` to every response: the version of
    /// the policy that decided it.
    #[arg(long)]
    pub version_header: bool,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// A body limit of 0 refuses every request the proxy serves (each has a
/// body); a limit of a few bytes does too, but 0 is the value a user types
/// meaning "no limit", which this option has no way to say.
fn body_limit_arg(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err(String::from(
            "0 would refuse every request; give the largest body to accept, in bytes",
        )),
        Ok(bytes) => Ok(bytes),
        Err(_) => Err(format!("`{text}` is not a number of bytes")),
    }
}

/// Checks and compiles a policy to serve, as `check` does; on failure
/// prints why.
pub fn load(policy: &Path, secrets: &dyn SecretSource) -> Result<(Snapshot, SourceMap), ExitCode> {
    let report = check_served_file(policy, None);
    // A policy that checks may still have warnings, as `check` shows them.
    let warnings: Vec<String> = report
        .warnings_of_a_policy()
        .map(|d| render::human(d, &report.sources, Style::Plain))
        .collect();
    match compile_report(report, secrets) {
        Ok(compiled) => {
            for text in &warnings {
                warning(format_args!("{text}\n"));
            }
            Ok(compiled)
        }
        Err(report) => {
            // Through the log's writer: with `--log-format json`, each
            // diagnostic is a JSON line too.
            for diagnostic in report.diagnostics.iter() {
                problem(format_args!(
                    "{}\n",
                    render::human(diagnostic, &report.sources, Style::Plain)
                ));
            }
            problem(format_args!(
                "error: {} does not check; the proxy serves only a policy that does",
                policy.display()
            ));
            Err(ExitCode::from(exit::PROBLEMS))
        }
    }
}

/// Says which credentials have no secret in the environment, or one no
/// request header can carry: their routes are skipped until a reload finds
/// one. When none has, says so plainly: every request would fail.
fn warn_missing_secrets(snapshot: &Snapshot, secrets: &dyn SecretSource) {
    let unusable = unusable_credentials(snapshot, secrets);
    for credential in &unusable {
        log_unusable(credential);
    }
    let credentials: usize = snapshot
        .data
        .catalog
        .providers
        .iter()
        .map(|provider| provider.credentials.len())
        .sum();
    if credentials > 0 && unusable.len() == credentials {
        tracing::warn!(
            "no credential's variable is set: every request will fail; start the proxy with them in its environment"
        );
    }
}

/// What `serve` and `demo` run once the policy is loaded: the proxy, its
/// reloads (file changes and SIGHUP), until SIGINT or SIGTERM.
pub struct Service {
    pub policy: PathBuf,
    pub listen: SocketAddr,
    pub options: Options,
    pub drain: Duration,
    pub watch: bool,
    pub secrets: Arc<dyn SecretSource + Send + Sync>,
    pub access_log: Arc<dyn AccessLog>,
}

impl Service {
    /// Starts the proxy; the reload watch lives as long as the returned guard.
    pub async fn start(
        &self,
        snapshot: Snapshot,
        sources: &SourceMap,
    ) -> Result<(Running, Arc<Reloader>, Option<crate::reload::Watch>), String> {
        warn_missing_secrets(&snapshot, self.secrets.as_ref());
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|error| {
                listen_failure("the proxy", self.listen, &error, Some(CHOOSE_ANOTHER))
            })?;
        let state = InProcess::new(Arc::new(SystemClock::new()));
        let proxy = Proxy::logging_to(
            Arc::new(snapshot),
            state,
            self.options,
            self.access_log.clone(),
        );
        let reloader = Reloader::new(
            proxy.clone(),
            self.policy.clone(),
            sources,
            self.secrets.clone(),
        );
        let watch = if self.watch {
            match reloader.watch() {
                Ok(watch) => Some(watch),
                Err(error) => {
                    tracing::warn!(%error, "cannot watch the policy's files; reload with SIGHUP");
                    None
                }
            }
        } else {
            None
        };
        let running = serve(proxy, listener, self.drain)
            .map_err(|error| format!("cannot serve on {}: {error}", self.listen))?;
        Ok((running, reloader, watch))
    }

    /// Serves until SIGINT or SIGTERM, reloading on SIGHUP.
    pub async fn run_until_stopped(
        running: Running,
        reloader: Arc<Reloader>,
        drain: Duration,
        mut signals: Signals,
    ) {
        let hangups = hangup_reloads(reloader, &mut signals);
        signals.stopped().await;
        hangups.abort();
        if drain.is_zero() {
            status(format_args!(
                "switchyard: stopping; requests in flight are cut now (--drain 0s)"
            ));
        } else {
            status(format_args!(
                "switchyard: stopping; requests in flight may take up to {drain:?}"
            ));
        }
        // A second signal ends the drain now, as operators expect of a
        // second Ctrl-C; one within a second of the first is the same
        // signal delivered twice (a terminal's and a process manager's).
        let first_signal = std::time::Instant::now();
        let drain_end = running.drain_end();
        let shutting_down = running.shutdown();
        tokio::pin!(shutting_down);
        let second_signal = async {
            loop {
                signals.stopped().await;
                if first_signal.elapsed() >= SAME_SIGNAL_WITHIN {
                    break;
                }
            }
        };
        tokio::select! {
            () = &mut shutting_down => {}
            () = second_signal => {
                status(format_args!(
                    "switchyard: a second signal; ending the requests in flight now"
                ));
                drain_end.now();
                shutting_down.await;
            }
        }
    }
}

/// Signals this close after the first that stopped the proxy are taken
/// for the same one.
const SAME_SIGNAL_WITHIN: Duration = Duration::from_secs(1);

/// Reloads on every SIGHUP.
fn hangup_reloads(reloader: Arc<Reloader>, signals: &mut Signals) -> tokio::task::JoinHandle<()> {
    #[cfg(unix)]
    let hangups = signals.take_hangup();
    #[cfg(not(unix))]
    let _ = signals;
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let Some(mut hangups) = hangups else {
                return;
            };
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading");
                let reloader = reloader.clone();
                // A reload or its failure says so itself; one that finds
                // nothing changed would otherwise leave the SIGHUP unanswered.
                match tokio::task::spawn_blocking(move || reloader.reload()).await {
                    Ok(Outcome::Unchanged) => tracing::info!(
                        "SIGHUP: the policy's files are unchanged; the policy being served stays"
                    ),
                    Ok(Outcome::StillFailing) => tracing::error!(
                        "SIGHUP: the policy's files are unchanged since the reload that failed; \
                         the previous policy keeps serving"
                    ),
                    _ => {}
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = reloader;
        }
    })
}

pub fn run(args: &ServeArgs) -> ExitCode {
    let logs = init_logging(args.log_format);
    raise_open_file_limit();
    if let Some(problem) = super::common::not_a_policy_file(&args.policy) {
        return fail(problem);
    }
    let secrets = crate::reload::environment();
    let (snapshot, sources) = match load(&args.policy, secrets.as_ref()) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => return fail(format!("could not start the runtime: {error}")),
    };
    let service = Service {
        policy: args.policy.clone(),
        listen: args.listen,
        options: Options {
            limits: Limits {
                max_body_bytes: args.max_body_bytes,
                ..Limits::default()
            },
            version_header: args.version_header,
        },
        drain: args.drain,
        watch: !args.no_watch,
        secrets,
        access_log: logs.access_log.clone(),
    };
    runtime.block_on(async {
        let name = snapshot.name.clone();
        let version = snapshot.version.clone();
        let (running, reloader, _watch) = match service.start(snapshot, &sources).await {
            Ok(started) => started,
            Err(message) => return fail(message),
        };
        let signals = match Signals::to_stop_or_reload() {
            Ok(signals) => signals,
            Err(error) => return fail(format!("cannot listen for signals: {error}")),
        };
        status(format_args!(
            "switchyard: serving policy {name} (version {version}) from {} on http://{}",
            args.policy.display(),
            running.addr()
        ));
        Service::run_until_stopped(running, reloader, args.drain, signals).await;
        ExitCode::from(exit::OK)
    })
}
