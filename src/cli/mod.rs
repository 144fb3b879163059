//! The command-line interface: one module per subcommand.

/// `println!` for a command's output on standard output. A reader that
/// stops reading (`| head`, a `jq` that fails) closes the pipe; that ends
/// the output, not the command with a panic, and the exit code stays the
/// command's own.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that does the same for standard error: `check 2>&1 | head`
/// must not turn a closed pipe into a panic and exit code 101.
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

pub mod check;
mod common;
#[cfg(feature = "server")]
pub mod daemon;
#[cfg(feature = "server")]
pub mod demo;
pub mod explain;
#[cfg(feature = "server")]
mod log_batch;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod sim;
pub mod test;

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Routing policies as data for LLM API gateways",
    long_about = "Switchyard checks routing policies written in its policy language against their \
                  provider catalog and tenants, and enforces them in a proxy in front of \
                  OpenAI- and Anthropic-compatible providers."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parse and check policies with their data files; report every problem.
    Check(check::CheckArgs),
    /// Show the decision for one request: every candidate, the step that
    /// removed it, the sort keys, and the plan or the error.
    Explain(explain::ExplainArgs),
    /// Run policy test cases (`*.tests.yaml` beside the policies).
    Test(test::TestArgs),
    /// Run the proxy with a shipped policy in front of simulated providers:
    /// no provider keys needed.
    #[cfg(feature = "server")]
    Demo(demo::DemoArgs),
    /// Run the proxy that enforces a policy.
    #[cfg(feature = "server")]
    Serve(serve::ServeArgs),
    /// Run simulated providers that speak the OpenAI and Anthropic wire
    /// formats and misbehave as a scenario file says.
    #[cfg(feature = "server")]
    Sim(sim::SimArgs),
}

/// How diagnostics are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// rustc-style text with source excerpts, on standard error.
    Human,
    /// One JSON array on standard output, for CI.
    Json,
}

/// Exit codes shared by every command.
pub mod exit {
    /// Everything checked out.
    pub const OK: u8 = 0;
    /// The input has errors (or warnings under `--deny-warnings`).
    pub const PROBLEMS: u8 = 1;
    /// The command was used wrongly: bad arguments, missing paths.
    pub const USAGE: u8 = 2;
}

/// The command line, or the exit code of a command line that is not one:
/// clap's error (or help, or version) printed as clap prints it, but an
/// error as a JSON line when the arguments ask for `--log-format json`, so
/// that a collector reading every line as JSON reads this one too.
pub fn parse_args(args: Vec<std::ffi::OsString>) -> Result<Cli, ExitCode> {
    Cli::try_parse_from(&args).map_err(|error| {
        #[cfg(feature = "server")]
        if error.use_stderr() && asks_for_json_logs(&args) {
            daemon::json_error(&error.render().to_string());
            return ExitCode::from(exit::USAGE);
        }
        let code = error.exit_code();
        // Printing fails only on a closed stream, which has no reader left.
        let _ = error.print();
        ExitCode::from(u8::try_from(code).unwrap_or(exit::USAGE))
    })
}

/// Whether the arguments are those of a command that logs (`serve`,
/// `demo`) and hold `--log-format json` (or `--log-format=json`).
#[cfg(feature = "server")]
fn asks_for_json_logs(args: &[std::ffi::OsString]) -> bool {
    let logs = args
        .get(1)
        .is_some_and(|command| command == "serve" || command == "demo");
    let json = args.iter().any(|arg| arg == "--log-format=json")
        || args
            .windows(2)
            .any(|pair| matches!(pair, [flag, value] if flag == "--log-format" && value == "json"));
    logs && json
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Test(args) => test::run(&args),
        #[cfg(feature = "server")]
        Command::Demo(args) => demo::run(&args),
        #[cfg(feature = "server")]
        Command::Serve(args) => serve::run(&args),
        #[cfg(feature = "server")]
        Command::Sim(args) => sim::run(&args),
    }
}
