//! `switchyard check [PATHS]`: parse and check policies with their data.

use super::common::files_named;
use super::{Format, exit};
use crate::diagnostics::Severity;
use crate::diagnostics::render::{self, Style};
use crate::language::{CheckReport, check_file};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Policy files, or directories whose `*.policy` files are checked.
    /// Defaults to `policies/`.
    pub paths: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Treat warnings as errors.
    #[arg(long)]
    pub deny_warnings: bool,
}

/// Why `path`, named on the command line, is not a policy to check, when
/// its name says it is another kind of file: checking it as a policy would
/// only list grammar errors.
fn not_a_policy(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_string_lossy();
    let shown = path.display();
    if name.ends_with(".tests.yaml") {
        return Some(format!(
            "`{shown}` holds test cases; `switchyard test {shown}` runs them (and checks their policy)"
        ));
    }
    let extension = path.extension()?.to_string_lossy().to_ascii_lowercase();
    ["yaml", "yml", "json", "md"]
        .contains(&extension.as_str())
        .then(|| {
            format!(
                "`{shown}` is not a policy (a `.{extension}` file); data files are checked with \
                 the policy that names them: `switchyard check POLICY.policy`"
            )
        })
}

pub fn run(args: &CheckArgs) -> ExitCode {
    if let Some(reason) = args
        .paths
        .iter()
        .filter(|path| path.is_file())
        .find_map(|path| not_a_policy(path))
    {
        say_err!("error: {reason}");
        return ExitCode::from(exit::USAGE);
    }
    let files = match files_named(&args.paths, ".policy") {
        Ok(files) => files,
        Err(message) => {
            say_err!("error: {message}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let reports: Vec<CheckReport> = files.iter().map(|file| check_file(file)).collect();
    let errors: usize = reports
        .iter()
        .map(|r| r.diagnostics.count(Severity::Error))
        .sum();
    let warnings: usize = reports
        .iter()
        .map(|r| r.diagnostics.count(Severity::Warning))
        .sum();

    match args.format {
        Format::Json => {
            // One array for all files: each report renders with its own
            // sources, its members in the order `explain` gives them too.
            say!(
                "{}",
                render::json_of_files(
                    reports
                        .iter()
                        .map(|report| (report.diagnostics.iter(), &report.sources))
                )
            );
        }
        Format::Human => {
            let style = if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            {
                Style::Colored
            } else {
                Style::Plain
            };
            for report in &reports {
                for diagnostic in report.diagnostics.iter() {
                    say_err!("{}\n", render::human(diagnostic, &report.sources, style));
                }
            }
            let noun = if files.len() == 1 {
                "policy"
            } else {
                "policies"
            };
            // Otherwise a CI log would show a failure and only warnings.
            let denied = if args.deny_warnings && warnings > 0 && errors == 0 {
                " (--deny-warnings makes warnings fail the check)"
            } else {
                ""
            };
            say_err!(
                "checked {} {noun}: {}{denied}",
                files.len(),
                render::summary(errors, warnings)
            );
        }
    }
    if errors > 0 || (args.deny_warnings && warnings > 0) {
        ExitCode::from(exit::PROBLEMS)
    } else {
        ExitCode::from(exit::OK)
    }
}
