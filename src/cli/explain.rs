//! `switchyard explain`: the decision for one request, and why.

use super::common::{RequestSpec, not_a_policy_file, plan_entries, print_report, resolve_caller};
use super::exit;
use crate::compile::{AllSecrets, Snapshot, compile_report};
use crate::data::{FileProblem, yaml_error};
use crate::diagnostics::io_reason;
use crate::diagnostics::redact::redact;
use crate::evaluate::health::{HealthEntry, HealthTable, HealthView};
use crate::evaluate::{Decision, RequestContext, StepTrace, evaluate_traced};
use crate::language::check_file;
use crate::language::ir::{StepKind, StepSpec};
use crate::source::{MAX_FILE_BYTES, SourceMap, Span, read_text};
use crate::value::Value;
use serde_json::json;
use std::borrow::Cow;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The policy file.
    #[arg(long)]
    pub policy: PathBuf,
    /// The request: a JSON file with `endpoint`, `headers` and `body`, or
    /// just the body of a chat completion (an object with `model`).
    #[arg(long)]
    pub request: PathBuf,
    /// The caller's key, by id or the key itself.
    #[arg(long, conflicts_with = "tenant")]
    pub key: Option<String>,
    /// The caller's tenant, when asking without a key.
    #[arg(long)]
    pub tenant: Option<String>,
    /// With --tenant: the workspace (default: the tenant's first).
    #[arg(long, requires = "tenant")]
    pub workspace: Option<String>,
    /// A YAML file of the health to decide with: a list of entries such
    /// as `- {provider: aki-io, paused_for: 30s}`.
    #[arg(long, value_name = "FILE")]
    pub health: Option<PathBuf>,
    /// The load-balancing seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value_t = ExplainFormat::Human)]
    pub format: ExplainFormat,
}

/// How `explain` prints the decision, on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExplainFormat {
    /// The candidates as a table, each kept or removed and why, then the
    /// plan or the error: for a person.
    Human,
    /// One JSON object (`candidates`, `result`): for tools. A policy that
    /// does not check prints its diagnostics instead, as `check --format
    /// json` does.
    Json,
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    say_err!("error: {message}");
    ExitCode::from(exit::USAGE)
}

pub fn run(args: &ExplainArgs) -> ExitCode {
    if let Some(problem) = not_a_policy_file(&args.policy) {
        return fail(problem);
    }
    let report = check_file(&args.policy);
    // Every credential counts as configured: explain shows the policy's
    // decision, not this machine's environment.
    let (snapshot, sources) = match compile_report(report, &AllSecrets) {
        Ok(compiled) => compiled,
        Err(report) => {
            // Once, in the format asked for, as `check` does.
            if args.format == ExplainFormat::Json {
                say!(
                    "{}",
                    crate::diagnostics::render::json(report.diagnostics.iter(), &report.sources)
                );
            } else {
                print_report(&report);
            }
            say_err!("error: the policy does not check; fix it first");
            return ExitCode::from(exit::PROBLEMS);
        }
    };
    let request_text = match read_text(&args.request, MAX_FILE_BYTES) {
        Ok(text) => text,
        Err(error) => {
            return fail(format_args!(
                "cannot read `{}`: {}",
                args.request.display(),
                io_reason(&error)
            ));
        }
    };
    let request_json = match serde_json::from_str(&request_text) {
        Ok(json) => json,
        Err(error) => {
            return fail(format_args!(
                "`{}` is not JSON: {error}",
                args.request.display()
            ));
        }
    };
    let spec = match RequestSpec::from_json(request_json) {
        Ok(spec) => spec,
        Err(message) => return fail(message),
    };
    let endpoint = match spec.endpoint() {
        Ok(endpoint) => endpoint,
        Err(message) => return fail(message),
    };
    let caller = match resolve_caller(
        &snapshot,
        args.key.as_deref(),
        args.tenant.as_deref(),
        args.workspace.as_deref(),
    ) {
        Ok(caller) => caller,
        Err(message) => return fail(message),
    };
    let mut health_text = String::new();
    let entries: Vec<HealthEntry> = match &args.health {
        None => Vec::new(),
        Some(path) => {
            let text = match read_text(path, MAX_FILE_BYTES) {
                Ok(text) => text,
                Err(error) => {
                    return fail(format_args!(
                        "cannot read `{}`: {}",
                        path.display(),
                        io_reason(&error)
                    ));
                }
            };
            match serde_saphyr::from_str(&text) {
                Ok(entries) => {
                    health_text = text;
                    entries
                }
                Err(error) => {
                    return fail(yaml_error(&path.display().to_string(), &text, &error));
                }
            }
        }
    };
    let health = match HealthTable::written(&snapshot, &entries) {
        Ok(health) => health,
        Err(problem) => {
            let shown = args
                .health
                .as_ref()
                .map_or_else(String::new, |path| path.display().to_string());
            let place = entry_place(&health_text, problem.entry);
            let message = match place {
                Some(_) => problem.message,
                None => problem.to_string(),
            };
            return fail(FileProblem::at(&shown, place, message));
        }
    };
    let headers = spec.header_list();
    let body_bytes = spec.body.to_string().len();
    let context = RequestContext {
        id: std::sync::Arc::from("explain"),
        endpoint,
        body: Ok(&spec.body),
        body_bytes,
        headers: &headers,
        caller,
        seed: args.seed,
        rotation: &0,
    };
    let decision = evaluate_traced(&snapshot, &context, &health);
    match args.format {
        ExplainFormat::Human => {
            use std::io::Write as _;
            let _ = write!(
                std::io::stdout().lock(),
                "{}",
                human(&snapshot, &sources, &decision, &health)
            );
        }
        ExplainFormat::Json => say!(
            "{}",
            serde_json::to_string_pretty(&as_json(&snapshot, &sources, &decision, &health))
                .unwrap_or_default()
        ),
    }
    ExitCode::from(exit::OK)
}

/// The first line of the statement at `offset` in the policy, trimmed.
fn policy_line(sources: &SourceMap, offset: usize) -> (usize, String) {
    let Some(file) = sources.file_at(0) else {
        return (0, String::new());
    };
    let (line, _) = file.line_col(offset);
    let text = file
        .text
        .lines()
        .nth(line.saturating_sub(1))
        .unwrap_or("")
        .trim()
        .to_string();
    (line, text)
}

/// Where a step is written: from its keyword through its condition and,
/// for `require`, the `else` that names its error.
fn step_extent(sources: &SourceMap, spec: &StepSpec) -> Span {
    let start = spec.span.start;
    let mut end = spec.span.end.max(spec.condition.span.end);
    if let (StepKind::Require(_), Some(text)) = (&spec.kind, sources.file_at(0).map(|f| &f.text)) {
        // The line of the first `else` outside a comment.
        let rest = text.get(end..).unwrap_or("");
        let mut offset = 0;
        for line in rest.split_inclusive('\n') {
            let code = line.split('#').next().unwrap_or("");
            let words = code.split(|c: char| !(c.is_alphanumeric() || c == '_'));
            if words.into_iter().any(|word| word == "else") {
                end += offset + line.trim_end_matches('\n').len();
                break;
            }
            offset += line.len();
        }
    }
    Span { start, end }
}

/// The lines of the statement at `span` after its first, trimmed, without
/// comment lines and blank lines.
fn continuation_lines(sources: &SourceMap, span: Span) -> impl Iterator<Item = &str> {
    sources
        .file_at(0)
        .and_then(|file| file.text.get(span.range()))
        .unwrap_or("")
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|text| !text.is_empty() && !text.starts_with('#'))
}

/// Step `index`'s line number and its text, line by line: a step written
/// over several lines is shown whole, as the clause that removed a
/// candidate may be on any of them.
fn step_lines<'s>(
    snapshot: &Snapshot,
    sources: &'s SourceMap,
    index: usize,
    step: &StepTrace,
) -> (usize, Vec<Cow<'s, str>>) {
    let whole = snapshot
        .program
        .steps
        .get(index)
        .map_or(step.span, |spec| step_extent(sources, spec));
    statement_lines(sources, Span::new(step.span.start, whole.end))
}

/// The line number of the statement at `span` and its text, line by line
/// (trimmed, without comment and blank lines).
fn statement_lines(sources: &SourceMap, span: Span) -> (usize, Vec<Cow<'_, str>>) {
    let (number, first) = policy_line(sources, span.start);
    let lines = std::iter::once(Cow::Owned(first))
        .chain(continuation_lines(sources, span).map(Cow::Borrowed))
        .collect();
    (number, lines)
}

fn human(
    snapshot: &Snapshot,
    sources: &SourceMap,
    decision: &Decision,
    health: &dyn HealthView,
) -> String {
    let trace = &decision.trace;
    let mut out = String::new();
    // A control character from the request (a line break or a terminal
    // escape in an input's text) is shown escaped: it would break the
    // layout, or act on the reader's terminal.
    let mut line = |text: String| {
        for c in text.chars() {
            if c.is_control() && c != '\t' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        out.push('\n');
    };
    line(format!(
        "policy {} (version {})",
        snapshot.name, snapshot.version
    ));
    line(format!(
        "model  {}",
        if trace.model.is_empty() {
            Cow::Borrowed("(none)")
        } else {
            redact(&trace.model)
        }
    ));
    for (name, value) in &trace.inputs {
        line(format!("input  {name} = {value}"));
    }
    for (name, value) in &trace.merges {
        line(format!("merge  {name} = {value}"));
    }
    if !trace.steps.is_empty() {
        line(String::new());
        line(String::from("eligibility"));
        for (index, step) in trace.steps.iter().enumerate() {
            let (number, lines) = step_lines(snapshot, sources, index, step);
            let head = format!("  {}. line {number:<4} ", index + 1);
            let indent = " ".repeat(head.len() + 4);
            let mut rows: Vec<String> = lines
                .iter()
                .enumerate()
                .map(|(row, text)| {
                    if row == 0 {
                        format!("{head}{text}")
                    } else {
                        format!("{indent}{text}")
                    }
                })
                .collect();
            let counts = format!("  (kept {}, removed {})", step.kept, step.removed);
            if let Some(last) = rows.last_mut() {
                last.push_str(&counts);
            }
            rows.into_iter().for_each(&mut line);
        }
    }
    if !trace.keys.is_empty() {
        line(String::new());
        line(String::from("sort keys"));
        for (index, key) in trace.keys.iter().enumerate() {
            let (number, text) = key_source(sources, key);
            let sort = key
                .sort
                .as_ref()
                .map_or_else(String::new, |name| format!("  (sort {name})"));
            let direction = if key.descending { " desc" } else { "" };
            let nulls = if key.nulls_first { " nulls first" } else { "" };
            line(format!(
                "  {}. line {number:<4} {text}{direction}{nulls}{sort}",
                index + 1
            ));
        }
    }
    if !trace.candidates.is_empty() {
        line(String::new());
        line(String::from("candidates"));
        let width = trace
            .candidates
            .iter()
            .map(|c| c.label.len())
            .max()
            .unwrap_or(0);
        let mut sorted: Vec<&crate::evaluate::CandidateTrace> = trace.candidates.iter().collect();
        sorted.sort_by_key(|c| (c.position.is_none(), c.position, c.removed_by));
        for candidate in sorted {
            let status = match (candidate.position, candidate.removed_by) {
                (Some(position), _) => format!("#{}", position + 1),
                (None, Some(step)) => {
                    let (number, _) = trace
                        .steps
                        .get(step)
                        .map_or((0, String::new()), |s| policy_line(sources, s.span.start));
                    let label = trace.steps.get(step).map_or("", |s| s.label.as_str());
                    format!("removed by step {} (line {number}: {label})", step + 1)
                }
                (None, None) => String::from("-"),
            };
            let keys = if candidate.keys.is_empty() {
                String::new()
            } else {
                let keys: Vec<String> = candidate.keys.iter().map(|key| key.to_string()).collect();
                format!("  keys [{}]", keys.join(", "))
            };
            let health = health_note(&candidate.health);
            line(format!(
                "  {:<width$}  {status}{keys}{health}",
                candidate.label
            ));
        }
    }
    line(String::new());
    match &decision.result {
        Ok(plan) => {
            let names = plan_entries(snapshot, &plan.candidates);
            line(format!(
                "plan   {} (at most {} attempt{})",
                names.join(" -> "),
                plan.attempts,
                if plan.attempts == 1 { "" } else { "s" }
            ));
            // `keep` may pass candidates over: then the plan's first
            // attempts are not the ones made.
            let tried = plan.failover_sequence(snapshot, health);
            if !tried.iter().copied().eq(0..plan.attempts.min(names.len())) {
                let tried: Vec<&str> = tried
                    .iter()
                    .filter_map(|index| names.get(*index).map(String::as_str))
                    .collect();
                line(if tried.is_empty() {
                    String::from(
                        "       tried if each fails: none now, every candidate is paused: the proxy \
                         waits for room (a pause may end meanwhile), else answers the capacity error",
                    )
                } else {
                    format!("       tried if each fails: {}", tried.join(" -> "))
                });
            }
            if let Some(span) = trace.balance {
                let (number, text) = policy_line(sources, span.start);
                line(format!("       reshuffled by line {number}: {text}"));
            }
            if let Some(span) = trace.reordered_by {
                let (number, text) = policy_line(sources, span.start);
                line(format!(
                    "       after the first, reordered by line {number}: {text}"
                ));
            }
        }
        Err(refusal) => {
            let error = &refusal.error;
            line(format!(
                "error  {} {} ({})",
                error.status, error.code, error.message
            ));
            if let Some(why) = &trace.refused {
                line(format!("       because {why}"));
            }
            if let Some(span) = trace.refused_by {
                let (number, lines) = statement_lines(sources, span);
                line(format!("       by line {number}: {}", lines.join(" ")));
            }
            for (name, value) in error.advice_headers() {
                line(format!("       {name}: {value}"));
            }
            for (name, value) in &refusal.headers {
                line(format!("       {name}: {value}"));
            }
        }
    }
    line(plans_line(snapshot, sources));
    out
}

fn health_note(health: &crate::evaluate::health::CandidateHealth) -> String {
    let mut notes = Vec::new();
    if let Some(ms) = health.paused_for_ms {
        notes.push(format!("paused {}s", ms.div_ceil(1000)));
    }
    if health.penalized {
        notes.push(String::from("penalized"));
    }
    if health.full {
        notes.push(String::from("full"));
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!("  ({})", notes.join(", "))
    }
}

/// A sort key's line in the policy and its expression as written.
fn key_source(sources: &SourceMap, key: &crate::evaluate::KeyTrace) -> (usize, String) {
    let (number, _) = policy_line(sources, key.span.start);
    let text = sources
        .file_at(0)
        .and_then(|file| file.text.get(key.span.range()))
        .unwrap_or("")
        .to_string();
    (number, text)
}

/// Where the health file's entry `index` (from 0) begins.
fn entry_place(text: &str, index: usize) -> Option<(usize, usize)> {
    let entries: Vec<serde_saphyr::Spanned<serde::de::IgnoredAny>> =
        serde_saphyr::from_str(text).ok()?;
    crate::data::place_of(entries.get(index)?)
}

fn as_json(
    snapshot: &Snapshot,
    sources: &SourceMap,
    decision: &Decision,
    health: &dyn HealthView,
) -> serde_json::Value {
    let trace = &decision.trace;
    let steps: Vec<serde_json::Value> = trace
        .steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let (number, lines) = step_lines(snapshot, sources, index, step);
            json!({"line": number, "source": lines.join("\n"), "step": step.label, "kept": step.kept, "removed": step.removed})
        })
        .collect();
    let candidates: Vec<serde_json::Value> = trace
        .candidates
        .iter()
        .map(|c| {
            json!({
                "provider": snapshot.provider(c.candidate.provider).map(|p| p.id.clone()),
                "credential": snapshot.credential(c.candidate.provider, c.candidate.credential).map(|c| c.id.clone()),
                "upstream_model": c.candidate.upstream_model(snapshot).as_ref(),
                // From 1, as the text's `#N` and `removed_by_step` count.
                "position": c.position.map(|p| p + 1),
                "removed_by_step": c.removed_by.map(|s| s + 1),
                "keys": c.keys.iter().map(Value::to_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let result = match &decision.result {
        Ok(plan) => json!({
            "plan": plan.candidates.iter().map(|c| snapshot.provider(c.provider).map(|p| p.id.clone())).collect::<Vec<_>>(),
            "plan_entries": plan_entries(snapshot, &plan.candidates),
            "attempts": plan.attempts,
            "tried_if_each_fails": plan
                .failover_sequence(snapshot, health)
                .iter()
                .filter_map(|index| plan.candidates.get(*index))
                .map(|c| snapshot.provider(c.provider).map(|p| p.id.clone()))
                .collect::<Vec<_>>(),
            // The `balance` statement that reshuffled the plan, if one did.
            "reshuffled_by": trace.balance.map(|span| {
                let (line, source) = policy_line(sources, span.start);
                json!({"line": line, "source": source})
            }),
            // The `reorder` that put the candidates after the first in
            // another order than the sort's, if it did.
            "reordered_by": trace.reordered_by.map(|span| {
                let (line, source) = policy_line(sources, span.start);
                json!({"line": line, "source": source})
            }),
        }),
        Err(refusal) => json!({
            "error": {
                "status": refusal.error.status,
                "code": refusal.error.code,
                "message": refusal.error.message,
                "type": refusal.error.error_type,
                "retry_after": refusal.error.retry_after_secs,
                "should_retry": refusal.error.should_retry,
            },
            "headers": refusal.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
            "because": trace.refused,
            "refused_by": trace.refused_by.map(|span| {
                let (line, lines) = statement_lines(sources, span);
                json!({"line": line, "source": lines.join("\n")})
            }),
        }),
    };
    json!({
        "policy": snapshot.name,
        "version": snapshot.version,
        "model": redact(&trace.model),
        "inputs": trace.inputs.iter().map(|(n, v)| json!({"name": n, "value": v.to_json()})).collect::<Vec<_>>(),
        "merges": trace.merges.iter().map(|(n, v)| json!({"name": n, "value": v.to_json()})).collect::<Vec<_>>(),
        "steps": steps,
        // What each candidate's `keys` are, in order.
        "sort_keys": trace.keys.iter().map(|key| {
            let (line, source) = key_source(sources, key);
            json!({
                "line": line,
                "source": source,
                "descending": key.descending,
                "nulls_first": key.nulls_first,
                "sort": key.sort,
            })
        }).collect::<Vec<_>>(),
        "candidates": candidates,
        "result": result,
        "plans": plans_json(snapshot, sources),
    })
}

/// Whether the proxy makes this policy's plans once per caller, model,
/// endpoint and input values (and then recalls them), or for every
/// request; if for every request, the line of the first term found that
/// reads more.
fn plans_line(snapshot: &Snapshot, sources: &SourceMap) -> String {
    if snapshot.remembered_plans().is_some() {
        // A balance draws on each request's seed: what it reorders is not kept.
        let every_time = if snapshot.program.balance.is_empty() {
            "refusals are decided every time"
        } else {
            "refusals, and plans a balance reorders, are decided every time"
        };
        return format!(
            "plans  made once per caller, model, endpoint and input values, then reused \
             ({every_time})"
        );
    }
    match snapshot.plans_made_afresh_by() {
        Some(span) => {
            let (number, text) = policy_line(sources, span.start);
            format!(
                "plans  made for every request: line {number} reads more than the caller, \
                 model, endpoint and inputs: {text}"
            )
        }
        None => String::from("plans  made for every request"),
    }
}

fn plans_json(snapshot: &Snapshot, sources: &SourceMap) -> serde_json::Value {
    let reader = snapshot
        .plans_made_afresh_by()
        .map(|span| policy_line(sources, span.start));
    json!({
        "remembered": snapshot.remembered_plans().is_some(),
        "made_afresh_by": reader.map(|(line, source)| json!({"line": line, "source": source})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::language::ir::{ErrorRef, Term, TermKind};

    #[test]
    fn a_step_runs_to_the_else_that_names_its_error_not_one_in_a_comment() {
        let text = "require provider.region in key.regions  # or else\n  else residency\n\
                    require x else y\n";
        let mut sources = SourceMap::default();
        sources.add("p.policy", text);
        let condition_end = text.find("  #").unwrap_or(0);
        let spec = StepSpec {
            kind: StepKind::Require(ErrorRef::Declared(0)),
            condition: Term::new(
                TermKind::Const(Value::Bool(true)),
                Span::new(8, condition_end),
            ),
            span: Span::new(0, 7),
        };
        let extent = step_extent(&sources, &spec);
        assert_eq!(
            text.get(extent.range()),
            Some("require provider.region in key.regions  # or else\n  else residency")
        );
    }
}
