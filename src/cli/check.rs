//! `switchyard check [PATHS]`: parse and check policies with their data.

use super::{Format, exit};
use crate::diagnostics::render::{self, Style};
use crate::diagnostics::{Diagnostic, Severity};
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

/// The policy files a list of paths names, or why one cannot be used.
pub fn policy_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let paths = if paths.is_empty() {
        vec![PathBuf::from("policies")]
    } else {
        paths.to_vec()
    };
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|p| is_policy(p))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(format!("`{}` holds no `.policy` files", path.display()));
            }
            files.extend(found);
        } else if path.is_file() {
            files.push(path);
        } else {
            return Err(format!("`{}` does not exist", path.display()));
        }
    }
    Ok(files)
}

pub fn run(args: &CheckArgs) -> ExitCode {
    let files = match policy_files(&args.paths) {
        Ok(files) => files,
        Err(message) => {
            eprintln!("error: {message}");
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
            // One array for all files: each report renders with its own sources.
            let mut items: Vec<serde_json::Value> = Vec::new();
            for report in &reports {
                let diagnostics: Vec<&Diagnostic> = report.diagnostics.iter().collect();
                let text = render::json(diagnostics, &report.sources);
                if let Ok(serde_json::Value::Array(values)) = serde_json::from_str(&text) {
                    items.extend(values);
                }
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&items).unwrap_or_else(|_| String::from("[]"))
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
                    eprintln!("{}\n", render::human(diagnostic, &report.sources, style));
                }
            }
            let noun = if files.len() == 1 {
                "policy"
            } else {
                "policies"
            };
            eprintln!(
                "checked {} {noun}: {}",
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

/// Whether `path` looks like a policy file.
pub fn is_policy(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == "policy")
}
