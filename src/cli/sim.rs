//! `switchyard sim`: simulated providers for demos and tests.

use super::common::{CHOOSE_ANOTHER, listen_failure};
use super::daemon::{Signals, fail};
use super::exit;
use crate::data::FileProblem;
use crate::diagnostics::render::{self, Style};
use crate::diagnostics::{Diagnostic, codes, io_reason};
use crate::sim::{self, Scenario};
use crate::source::{MAX_FILE_BYTES, SourceMap, Span, read_text};
use clap::Args;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct SimArgs {
    /// The address to listen on; the shipped catalogs expect 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9100", value_parser = super::daemon::listen_arg)]
    pub listen: SocketAddr,

    /// The scenario: which providers to simulate and how each answers
    /// (see docs/sim.md; scenarios/ has examples).
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
}

pub fn run(args: &SimArgs) -> ExitCode {
    let shown = args.scenario.display().to_string();
    let text = match read_text(&args.scenario, MAX_FILE_BYTES) {
        Ok(text) => text,
        Err(error) => return fail(format!("cannot read `{shown}`: {}", io_reason(&error))),
    };
    let scenario = match Scenario::parse(&text, &shown) {
        Ok(scenario) => scenario,
        Err(problem) => {
            say_err!("{}", scenario_problem(&text, &problem));
            return ExitCode::from(exit::PROBLEMS);
        }
    };
    init_logging();
    super::daemon::raise_open_file_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            say_err!("error: cannot start the async runtime: {error}");
            return ExitCode::from(exit::PROBLEMS);
        }
    };
    runtime.block_on(serve(args.listen, scenario))
}

async fn serve(listen: SocketAddr, scenario: Scenario) -> ExitCode {
    let handle = match sim::start(listen, scenario).await {
        Ok(handle) => handle,
        Err(error) => {
            return fail(listen_failure(
                "the simulated providers",
                listen,
                &error,
                Some(CHOOSE_ANOTHER),
            ));
        }
    };
    let mut signals = match Signals::to_stop() {
        Ok(signals) => signals,
        Err(error) => return fail(format!("cannot listen for signals: {error}")),
    };
    say!(
        "switchyard sim: listening on http://{} for {}",
        handle.addr(),
        handle.providers().join(", ")
    );
    signals.stopped().await;
    handle.shutdown().await;
    ExitCode::from(exit::OK)
}

/// One line per request on standard error; `RUST_LOG` overrides the level.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("switchyard::sim=info"));
    // Fails only when a subscriber is already set, which then does the job.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// A scenario that does not parse, as a diagnostic: `E0901`, the source
/// line with a caret under the word at the problem's place, and where
/// scenarios are described.
fn scenario_problem(text: &str, problem: &FileProblem) -> String {
    let mut sources = SourceMap::new();
    let id = sources.add(problem.file.as_str(), text);
    let diagnostic = Diagnostic::new(codes::BAD_SCENARIO, problem.message.as_str());
    let diagnostic = match problem.place {
        Some((line, column)) => {
            let start = sources.file(id).map_or(0, |f| f.offset_of(line, column));
            let end = text.get(start..).map_or(start, |after| {
                start
                    + after
                        .find(|c: char| c.is_whitespace() || ",:=\"[]{}".contains(c))
                        .unwrap_or(after.len())
            });
            diagnostic.at(id, Span::new(start, end), "here")
        }
        None => diagnostic.at(id, Span::new(0, 0), "in this file"),
    };
    render::human(
        &diagnostic.help("docs/sim.md describes what a scenario holds"),
        &sources,
        Style::Plain,
    )
}
