//! `switchyard test [PATHS]`: runs policy test cases kept beside policies
//! (`NAME.tests.yaml` next to `NAME.policy`): a request, who sends it and
//! the providers' health in; the expected plan or error out.

mod report;

use super::common::{
    RequestSpec, entry_detail, files_named, plan_entries, plan_entry, print_report, resolve_caller,
    why_no_file,
};
use super::exit;
use crate::compile::{SecretSource, Snapshot, compile_report};
use crate::data::schema::duration_text;
use crate::data::{FileProblem, place_of, yaml_error};
use crate::diagnostics::redact::redact;
use crate::diagnostics::{codes, io_reason};
use crate::evaluate::health::{HealthEntry, HealthTable};
use crate::evaluate::{
    Action, AttemptOutcome, Candidate, Decision, Ending, ErrorResponse, OutcomeClass, OutcomeFacts,
    Plan, Progress, RequestContext, body_as_read, evaluate_traced,
};
use crate::language::ast::HealthScope;
use crate::language::check_file;
use crate::source::{MAX_FILE_BYTES, read_text};
use report::{CaseRun, Difference, FileRun, Summary, Verdict};
use serde_json::{Value as Json, json};
use serde_saphyr::Spanned;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Test files, or directories whose `*.tests.yaml` files run. Defaults
    /// to `policies/`.
    pub paths: Vec<PathBuf>,
    /// Runs only the cases whose name holds this text (ignoring case).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    #[arg(long, value_enum, default_value_t = TestFormat::Human)]
    pub format: TestFormat,
}

/// How `test` prints its results, on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TestFormat {
    /// A line per case (what differs indented below a failure), then
    /// `N passed, M failed`: for a person.
    Human,
    /// One JSON document with every file, case, difference and count: for
    /// CI. Usage errors stay text on standard error.
    Json,
}

/// A file of cases for one policy.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestFile {
    /// The policy, relative to the test file (default: `NAME.policy` for
    /// `NAME.tests.yaml`).
    #[serde(default)]
    pub policy: Option<String>,
    pub cases: Vec<Spanned<Case>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    /// The caller's key id (or the key itself).
    #[serde(default)]
    pub key: Option<String>,
    /// Or a tenant without a key, optionally with a workspace.
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub workspace: Option<String>,
    #[serde(default = "chat")]
    pub endpoint: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub body: Json,
    #[serde(default)]
    pub health: Vec<Spanned<HealthEntry>>,
    /// Environment variables of credentials to treat as unset.
    #[serde(default)]
    pub missing_secrets: Vec<String>,
    #[serde(default)]
    pub seed: u64,
    /// An attempt's outcome to react to, instead of judging the decision.
    #[serde(default)]
    pub outcome: Option<OutcomeSpec>,
    pub expect: Expect,
}

/// An attempt of a plan's candidate and how it ended.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeSpec {
    /// Which attempt (1 = the plan's first candidate).
    #[serde(default = "first_attempt")]
    pub attempt: usize,
    /// A status, or one of connect_error, reset, timeout,
    /// first_token_timeout, malformed, stream_broken.
    pub result: String,
    #[serde(default)]
    pub retry_after: Option<String>,
    #[serde(default)]
    pub error_code: Option<String>,
    #[serde(default)]
    pub error_type: Option<String>,
    #[serde(default)]
    pub error_message: Option<String>,
    /// Same-candidate retries so far.
    #[serde(default)]
    pub retries: u32,
    #[serde(default)]
    pub elapsed: Option<String>,
}

/// Where each case of a cases file begins, read without reading the cases.
#[derive(serde::Deserialize)]
struct CasePlaces {
    cases: Vec<serde_saphyr::Spanned<serde::de::IgnoredAny>>,
}

/// The mistakes of a cases file's other cases, when `first` stopped reading
/// it: each case read again on its own, so that one run names every case to
/// fix, each mistake at its `file:line:col`. Only mistakes that reading a
/// case alone cannot make up are named: a case is read up to the line where
/// the next begins, and the last up to its first line indented less than it
/// (which may cut it short), so the last case's re-read names only unknown
/// and repeated fields, which cutting lines off cannot cause. A case that
/// refers to another case's anchor, or that its lines cannot hold alone (a
/// flow list of cases), is passed over.
fn other_case_mistakes(file: &str, text: &str, first: &serde_saphyr::Error) -> Vec<FileProblem> {
    // The parser also breaks lines at a lone `\r`, which `lines` does not.
    if text.replace("\r\n", "").contains('\r') {
        return Vec::new();
    }
    // Only where cases begin: a key repeated in one of them is that case's
    // mistake, found when it is read alone, and must not hide the others.
    let mut options = serde_saphyr::Options::default();
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::FirstWins;
    let Ok(places) = serde_saphyr::from_str_with_options::<CasePlaces>(text, options) else {
        return Vec::new();
    };
    let first_place = yaml_error(file, text, first).place;
    let lines: Vec<&str> = text.lines().collect();
    let starts: Vec<(u64, u64)> = places
        .cases
        .iter()
        .map(|case| (case.referenced.line(), case.referenced.column()))
        .collect();
    let mut mistakes = Vec::new();
    for (index, &(line, column)) in starts.iter().enumerate() {
        let next_line = starts.get(index + 1).map(|&(next, _)| next);
        if next_line.is_some_and(|next| next <= line) {
            continue;
        }
        let Some((alone, lines_before)) = case_alone(&lines, line, column, next_line) else {
            continue;
        };
        let Err(mistake) = serde_saphyr::from_str::<Case>(&alone) else {
            continue;
        };
        if !made_by_the_case(&mistake, next_line.is_some()) {
            continue;
        }
        let mut problem = yaml_error(file, &alone, &mistake);
        if let Some((line, _)) = &mut problem.place {
            *line = line.saturating_add(lines_before);
        }
        if problem.place != first_place {
            mistakes.push(problem);
        }
    }
    mistakes
}

/// Whether reading a case alone found a mistake of the case itself: a field
/// unknown or given twice, or, when the case was read whole (`whole`), a
/// field missing or of the wrong kind. Not one of reading it alone: YAML
/// that its lines do not complete, an anchor set elsewhere.
fn made_by_the_case(mistake: &serde_saphyr::Error, whole: bool) -> bool {
    use serde_saphyr::Error;
    match mistake.without_snippet() {
        Error::SerdeUnknownField { .. } | Error::DuplicateMappingKey { .. } => true,
        Error::Message { msg, .. } => msg == NULL_EXPECTED,
        Error::SerdeMissingField { .. }
        | Error::SerdeInvalidType { .. }
        | Error::SerdeInvalidValue { .. }
        | Error::SerdeInvalidLength { .. }
        | Error::SerdeUnknownVariant { .. }
        // A text where a list or mapping belongs, a word where a number does.
        | Error::Unexpected { .. }
        | Error::InvalidScalar { .. }
        | Error::NullIntoString { .. } => whole,
        _ => false,
    }
}

/// The case beginning at `line` and `column` (both from 1) as a document of
/// its own, and the number of lines before it in the file: what precedes it
/// on its line blanked, then its lines up to `next_line` (where the next case
/// begins) or, without one, up to the first line indented less than it.
fn case_alone(
    lines: &[&str],
    line: u64,
    column: u64,
    next_line: Option<u64>,
) -> Option<(String, usize)> {
    let first = usize::try_from(line).ok()?.checked_sub(1)?;
    let indent = usize::try_from(column).ok()?.checked_sub(1)?;
    let end = match next_line {
        Some(next) => usize::try_from(next).ok()?.checked_sub(1)?,
        None => lines.len(),
    };
    let opening = lines.get(first)?;
    let mut alone: String = opening
        .chars()
        .enumerate()
        .map(|(at, c)| if at < indent { ' ' } else { c })
        .collect();
    alone.push('\n');
    for more in lines.iter().take(end).skip(first + 1) {
        let content = more.trim_start_matches(' ');
        let shallower = more.len() - content.len() < indent;
        if next_line.is_none() && shallower && !content.is_empty() && !content.starts_with('#') {
            break;
        }
        alone.push_str(more);
        alone.push('\n');
    }
    Some((alone, first))
}

/// `n` and the noun, plural unless `n` is 1.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn first_attempt() -> usize {
    1
}

fn chat() -> String {
    String::from("chat_completions")
}

/// A field of `expect` that is given: written `null`, it would compare
/// nothing, and the case would pass whatever the policy does.
fn given<'de, D, T>(field: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    use serde::Deserialize as _;
    use serde::de::Error as _;
    Option::<T>::deserialize(field)?
        .map(Some)
        .ok_or_else(|| D::Error::custom(NULL_EXPECTED))
}

/// Why an expected field written `null` is refused.
const NULL_EXPECTED: &str = "`null` compares nothing here: give a value, or leave the field out";

/// What a case expects: a plan, or an error.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The plan in order; each entry `provider`, `provider/credential`,
    /// `provider@model` or `provider/credential@model`.
    #[serde(default, deserialize_with = "given")]
    pub plan: Option<Vec<String>>,
    #[serde(default, deserialize_with = "given")]
    pub attempts: Option<usize>,
    /// The candidates tried, in order, if every attempt fails: the plan
    /// walked as `failover` walks it (its attempt limit, its `keep` rules,
    /// paused candidates passed over), entries written as in `plan`.
    #[serde(default, deserialize_with = "given")]
    pub tried_if_each_fails: Option<Vec<String>>,
    #[serde(default, deserialize_with = "given")]
    pub error: Option<String>,
    #[serde(default, deserialize_with = "given")]
    pub status: Option<u16>,
    /// Response headers of the expected error (a refusal, or the end of an
    /// outcome) that must be present with these values, or, written
    /// `null`, absent.
    #[serde(default)]
    pub headers: BTreeMap<String, Option<String>>,
    /// For an outcome: `next`, `stop` or `retry`.
    #[serde(default, deserialize_with = "given")]
    pub action: Option<ExpectedAction>,
    /// For a retry: the wait.
    #[serde(default, deserialize_with = "given")]
    pub retry_after: Option<String>,
    /// Pauses by scope (`provider`, `route`, `credential`) and duration.
    #[serde(default)]
    pub pause: BTreeMap<String, String>,
    /// Scopes penalized.
    #[serde(default)]
    pub penalize: Vec<String>,
}

/// What the policy does after an attempt's outcome, as a case names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpectedAction {
    Next,
    Stop,
    Retry,
}

impl ExpectedAction {
    fn name(self) -> &'static str {
        match self {
            ExpectedAction::Next => "next",
            ExpectedAction::Stop => "stop",
            ExpectedAction::Retry => "retry",
        }
    }
}

/// Every credential is set except the named ones.
struct AllBut<'a>(&'a [String]);

impl SecretSource for AllBut<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (!self.0.iter().any(|missing| missing == name)).then(|| String::from("unused"))
    }
}

/// Whether a plan entry names a credential and a model:
/// `provider/credential@model`, where a model id may hold a `/` too.
fn entry_names(written: &str) -> (bool, bool) {
    match written.split_once('@') {
        Some((provider, _)) => (provider.contains('/'), true),
        None => (written.contains('/'), false),
    }
}

/// `expected` against the candidates `actual`, each entry compared as
/// precisely as it is written: the difference, if there is one, `what`
/// naming the sequence, shown on two lines.
fn sequence_difference(
    snapshot: &Snapshot,
    what: &'static str,
    expected: &[String],
    actual: &[&Candidate],
) -> Option<Difference> {
    let matches = expected.len() == actual.len()
        && expected.iter().zip(actual).all(|(e, c)| {
            let (with_credential, with_model) = entry_names(e);
            plan_entry(snapshot, c, with_credential, with_model) == *e
        });
    if matches {
        return None;
    }
    // Shown as precisely as the most precise expected entry.
    let with_credential = expected.iter().any(|e| entry_names(e).0);
    let with_model = expected.iter().any(|e| entry_names(e).1);
    let actual: Vec<String> = actual
        .iter()
        .map(|c| plan_entry(snapshot, c, with_credential, with_model))
        .collect();
    let width = what.len() + "expected ".len();
    let message = format!(
        "expected {what} [{}]\n{:>width$} [{}]",
        expected.join(", "),
        format!("actual {what}"),
        actual.join(", ")
    );
    Some(Difference::new(
        what,
        json!(expected),
        json!(actual),
        &message,
    ))
}

/// Compares a decision with what the case expects; the differences, if any.
fn differences(
    snapshot: &Snapshot,
    health: &HealthTable<'_>,
    decision: &Decision,
    expect: &Expect,
) -> Vec<Difference> {
    let mut problems = Vec::new();
    match &decision.result {
        Ok(plan) => {
            if let Some(error) = &expect.error {
                let actual = plan_entries(snapshot, &plan.candidates);
                let message = format!(
                    "expected error `{error}`, got a plan of {}: [{}]",
                    count(plan.candidates.len(), "candidate"),
                    actual.join(", ")
                );
                problems.push(Difference::new("error", json!(error), Json::Null, &message));
            }
            if let Some(expected) = &expect.plan {
                let candidates: Vec<&Candidate> = plan.candidates.iter().collect();
                problems.extend(sequence_difference(snapshot, "plan", expected, &candidates));
            }
            if let Some(expected) = &expect.tried_if_each_fails {
                let tried: Vec<&Candidate> = plan
                    .failover_sequence(snapshot, health)
                    .iter()
                    .filter_map(|index| plan.candidates.get(*index))
                    .collect();
                problems.extend(sequence_difference(
                    snapshot,
                    "tried_if_each_fails",
                    expected,
                    &tried,
                ));
            }
            if let Some(attempts) = expect.attempts
                && attempts != plan.attempts
            {
                let message = format!(
                    "expected at most {}, the plan allows {}",
                    count(attempts, "attempt"),
                    plan.attempts
                );
                problems.push(Difference::new(
                    "attempts",
                    json!(attempts),
                    json!(plan.attempts),
                    &message,
                ));
            }
        }
        Err(refusal) => {
            let actual = &refusal.error.code;
            match &expect.error {
                Some(code) if code == actual => {}
                Some(code) => problems.push(error_difference(code, actual)),
                None => {
                    let message = format!(
                        "expected a plan, got error `{actual}` ({}){}",
                        refusal.error.status,
                        decision
                            .trace
                            .refused
                            .as_ref()
                            .map_or_else(String::new, |why| format!(": {why}"))
                    );
                    problems.push(Difference::new(
                        "error",
                        Json::Null,
                        json!(actual),
                        &message,
                    ));
                }
            }
            status_difference(expect.status, refusal.error.status, &mut problems);
            header_differences(
                &expect.headers,
                &refusal.headers,
                &refusal.error,
                &mut problems,
            );
        }
    }
    problems
}

/// An error that is not the one a case expects.
fn error_difference(expected: &str, actual: &str) -> Difference {
    let message = format!("expected error `{expected}`, got `{actual}`");
    Difference::new("error", json!(expected), json!(actual), &message)
}

/// Compares the status a case expects, if it gives one, with an error's.
fn status_difference(expected: Option<u16>, actual: u16, problems: &mut Vec<Difference>) {
    if let Some(status) = expected
        && status != actual
    {
        let message = format!("expected status {status}, got {actual}");
        problems.push(Difference::new(
            "status",
            json!(status),
            json!(actual),
            &message,
        ));
    }
}

/// Compares the headers a case expects with those of an error answer: the
/// policy's `headers` and the error's own advice, as the proxy adds them.
/// Each header that differs is one difference, `{name: value}` expected
/// and actual, a value `null` where the header is absent.
fn header_differences(
    expected: &BTreeMap<String, Option<String>>,
    policy_headers: &[(String, String)],
    error: &ErrorResponse,
    problems: &mut Vec<Difference>,
) {
    let advice = error
        .advice_headers()
        .into_iter()
        .map(|(name, value)| (name.to_string(), value));
    let answered: Vec<(String, String)> = policy_headers.iter().cloned().chain(advice).collect();
    for (name, value) in expected {
        let actual = answered
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, actual)| actual);
        let message = match (value, actual) {
            (Some(value), Some(actual)) if actual == value => continue,
            (None, None) => continue,
            (Some(value), Some(actual)) => format!("expected header {name}: {value}, got {actual}"),
            (Some(value), None) => format!("expected header {name}: {value}, it is missing"),
            (None, Some(actual)) => format!("expected no header {name}, got {actual}"),
        };
        let header = |value: Option<&String>| json!({ name.as_str(): value });
        problems.push(Difference::new(
            "headers",
            header(value.as_ref()),
            header(actual),
            &message,
        ));
    }
}

/// "; did you mean `x`?" for the name closest to `wrong`, if one is close.
fn closest(wrong: &str, names: &[&str]) -> String {
    crate::diagnostics::did_you_mean(wrong, names.iter().copied())
}

/// Errors a case may expect beyond the policy's own: the proxy's when the
/// policy names none for a body that is not JSON or for full capacity, and
/// an outcome's ending with the provider's own answer.
const BUILT_IN_ERRORS: [&str; 3] = ["invalid_request_body", "capacity_exhausted", "passthrough"];

/// What is wrong with the entries of `expect.FIELD` (a plan, or the
/// candidates tried): names that can never match make a mismatch whose
/// reason is a typo.
fn entry_problem(snapshot: &Snapshot, field: &str, entries: &[String]) -> Option<String> {
    let providers: Vec<&str> = snapshot
        .data
        .catalog
        .providers
        .iter()
        .map(|p| p.id.as_str())
        .collect();
    if let Some(unknown) = entries.iter().find_map(|entry| {
        let provider = entry.split(['/', '@']).next().unwrap_or_default();
        (!providers.contains(&provider)).then_some(provider)
    }) {
        let hint = closest(unknown, &providers);
        return Some(format!(
            "`expect.{field}` names `{unknown}`, which is no provider of the catalog{hint}"
        ));
    }
    // A credential named must be one of its provider's.
    if let Some((provider, credential)) = entries.iter().find_map(|entry| {
        let head = entry
            .split_once('@')
            .map_or(entry.as_str(), |(head, _)| head);
        let (provider, credential) = head.split_once('/')?;
        let known = snapshot
            .data
            .catalog
            .providers
            .iter()
            .find(|p| p.id == provider)?;
        (!known.credentials.iter().any(|c| c.id == credential)).then_some((known, credential))
    }) {
        let ids: Vec<&str> = provider.credentials.iter().map(|c| c.id.as_str()).collect();
        let hint = closest(credential, &ids);
        return Some(format!(
            "`expect.{field}` names the credential `{credential}`, which is no credential of `{}`{hint}",
            provider.id
        ));
    }
    if let Some(bare) = entries.iter().find(|entry| entry.ends_with('@')) {
        return Some(format!(
            "`expect.{field}` entry `{bare}` names no model after `@`: give one, or leave out the `@`"
        ));
    }
    // A plan entry's model is a catalog model's id, unless an `unknown
    // serve` tier may serve any id as it was requested.
    if snapshot.program.models.unknown_serve.is_empty() {
        let models: Vec<&str> = snapshot
            .data
            .catalog
            .models
            .iter()
            .map(|m| m.id.as_str())
            .collect();
        if let Some(unknown) = entries.iter().find_map(|entry| {
            let (_, model) = entry.split_once('@')?;
            (!models.contains(&model)).then_some(model)
        }) {
            let hint = closest(unknown, &models);
            return Some(format!(
                "`expect.{field}` names the model `{unknown}`, which is no model of the catalog{hint}"
            ));
        }
    }
    None
}

/// What is wrong with a case as written, before it runs: fields that would
/// not be compared, or that contradict each other, make a case that passes
/// whatever the policy does.
fn case_problem(snapshot: &Snapshot, case: &Case) -> Option<String> {
    let expect = &case.expect;
    // A case is shown, and its failure found, by its name.
    if case.name.trim().is_empty() {
        return Some(String::from(
            "the case's `name` is empty: say what it checks",
        ));
    }
    // Names that can never match make a mismatch whose reason is a typo.
    if let Some(error) = &expect.error {
        let declared = snapshot.program.errors.iter().map(|e| e.name.as_str());
        let known: Vec<&str> = declared.chain(BUILT_IN_ERRORS).collect();
        if !known.contains(&error.as_str()) {
            let hint = closest(error, &known);
            return Some(format!(
                "`expect.error` names `{error}`, which the policy does not declare{hint}"
            ));
        }
    }
    for (field, entries) in [
        ("plan", &expect.plan),
        ("tried_if_each_fails", &expect.tried_if_each_fails),
    ] {
        if let Some(problem) = entries
            .as_deref()
            .and_then(|entries| entry_problem(snapshot, field, entries))
        {
            return Some(problem);
        }
    }
    if let Some(missing) = case.missing_secrets.iter().find(|name| {
        !snapshot
            .data
            .catalog
            .providers
            .iter()
            .flat_map(|p| &p.credentials)
            .any(|c| &c.env == *name)
    }) {
        return Some(format!(
            "`missing_secrets` names `{missing}`, which no credential of the catalog reads"
        ));
    }
    let for_outcomes = [
        ("action", expect.action.is_some()),
        ("retry_after", expect.retry_after.is_some()),
        ("pause", !expect.pause.is_empty()),
        ("penalize", !expect.penalize.is_empty()),
    ];
    let for_decisions = [
        ("plan", expect.plan.is_some()),
        ("attempts", expect.attempts.is_some()),
        ("tried_if_each_fails", expect.tried_if_each_fails.is_some()),
    ];
    let given = |fields: &[(&'static str, bool)]| -> Vec<&'static str> {
        fields
            .iter()
            .filter(|(_, given)| *given)
            .map(|(name, _)| *name)
            .collect()
    };
    let fields = |names: &[&str]| {
        names
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if case.outcome.is_some() {
        let ignored = given(&for_decisions);
        if !ignored.is_empty() {
            return Some(format!(
                "a case with an `outcome` does not compare {}: give them in a case without one",
                fields(&ignored)
            ));
        }
        let scopes = ["provider", "route", "credential"];
        if let Some(scope) = expect
            .pause
            .keys()
            .chain(&expect.penalize)
            .find(|scope| !scopes.contains(&scope.as_str()))
        {
            return Some(format!(
                "`{scope}` is not a scope: `pause` and `penalize` name provider, route or credential"
            ));
        }
        let describes_error = expect.status.is_some() || !expect.headers.is_empty();
        if describes_error && expect.error.is_none() {
            return Some(String::from(
                "`status` and `headers` are compared with the error they belong to: give `error` too",
            ));
        }
        if describes_error && expect.error.as_deref() == Some("passthrough") {
            return Some(String::from(
                "`error: passthrough` answers with the provider's own status and headers, from the outcome: `status` and `headers` are not compared",
            ));
        }
        return None;
    }
    let ignored = given(&for_outcomes);
    if !ignored.is_empty() {
        return Some(format!(
            "{}: only for a case with an `outcome`, which says how an attempt ended",
            fields(&ignored)
        ));
    }
    match (
        &expect.error,
        expect.plan.is_some() || expect.attempts.is_some() || expect.tried_if_each_fails.is_some(),
    ) {
        (Some(_), true) => Some(String::from(
            "`expect` names an error and a plan; a request gets one or the other",
        )),
        (None, _) if expect.status.is_some() || !expect.headers.is_empty() => Some(String::from(
            "`status` and `headers` describe a refusal: give its `error` too",
        )),
        (None, false) => Some(String::from(
            "`expect` gives nothing to compare: give `plan`, `attempts`, `tried_if_each_fails` or `error`",
        )),
        _ => None,
    }
}

/// Why a case could not run, and where in its file, when that is more
/// precise than where the case begins.
struct CaseProblem {
    place: Option<(usize, usize)>,
    message: String,
}

impl From<String> for CaseProblem {
    fn from(message: String) -> CaseProblem {
        CaseProblem {
            place: None,
            message,
        }
    }
}

/// Runs one case: the differences from what it expects, or why it could
/// not run.
fn run_case(policy: &Path, base: &Snapshot, case: &Case) -> Result<Vec<Difference>, CaseProblem> {
    if let Some(problem) = case_problem(base, case) {
        return Err(problem.into());
    }
    let rebuilt;
    let snapshot = if case.missing_secrets.is_empty() {
        base
    } else {
        rebuilt = compile_report(check_file(policy), &AllBut(&case.missing_secrets))
            .map_err(|_| String::from("the policy does not check"))?
            .0;
        &rebuilt
    };
    let spec = RequestSpec {
        endpoint: case.endpoint.clone(),
        headers: case.headers.clone(),
        body: case.body.clone(),
    };
    let endpoint = spec.endpoint()?;
    if case.key.is_none() && case.tenant.is_none() {
        return Err(CaseProblem::from(String::from(
            "say who asks: give the case a `key:` (a key id, or the key itself) or a `tenant:`",
        )));
    }
    let caller = resolve_caller(
        snapshot,
        case.key.as_deref(),
        case.tenant.as_deref(),
        case.workspace.as_deref(),
    )?;
    let entries: Vec<HealthEntry> = case
        .health
        .iter()
        .map(|entry| entry.value.clone())
        .collect();
    let health = HealthTable::written(snapshot, &entries).map_err(|problem| {
        match case.health.get(problem.entry).and_then(place_of) {
            Some(place) => CaseProblem {
                place: Some(place),
                message: problem.message,
            },
            None => CaseProblem::from(problem.to_string()),
        }
    })?;
    let headers = spec.header_list();
    let body_bytes = spec.body.to_string().len();
    // As the proxy gives it: cases pin what the proxy decides.
    let body = body_as_read(snapshot, &spec.body);
    let context = RequestContext {
        id: std::sync::Arc::from("test"),
        endpoint,
        body: Ok(&body),
        body_bytes,
        headers: &headers,
        caller,
        seed: case.seed,
        rotation: &0,
    };
    let decision = evaluate_traced(snapshot, &context, &health);
    match &case.outcome {
        None => Ok(differences(snapshot, &health, &decision, &case.expect)),
        Some(outcome) => {
            let plan = decision.result.as_ref().map_err(|refusal| {
                format!(
                    "an outcome needs a plan, but the request was refused with `{}`",
                    refusal.error.code
                )
            })?;
            Ok(reaction_differences(
                snapshot,
                &health,
                plan,
                outcome,
                &case.expect,
            )?)
        }
    }
}

fn duration(text: &Option<String>, what: &str) -> Result<Option<u64>, String> {
    match text {
        None => Ok(None),
        Some(text) => crate::data::schema::parse_duration(text)
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "`{what}: {text}` {}",
                    crate::data::schema::why_not_a_duration(text)
                )
            }),
    }
}

fn outcome_class(text: &str) -> Result<OutcomeClass, String> {
    Ok(match text {
        "connect_error" => OutcomeClass::ConnectError,
        "reset" => OutcomeClass::Reset,
        "timeout" => OutcomeClass::Timeout,
        "first_token_timeout" => OutcomeClass::FirstTokenTimeout,
        "malformed" => OutcomeClass::Malformed,
        "stream_broken" => OutcomeClass::StreamBroken,
        status => {
            let code: u16 = status
                .parse()
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| format!("`{status}` is not an HTTP status or an outcome"))?;
            // The proxy serves a 2xx and takes a 1xx as `malformed`: no `on`
            // rule sees either as a status, so a case of one tests nothing
            // the proxy does.
            if code < 200 {
                return Err(format!(
                    "`{status}` is no final status: the proxy takes such an answer as `malformed`; write `malformed`, or give a failing status (3xx to 5xx)"
                ));
            }
            if code < 300 {
                return Err(format!(
                    "`{status}` is an answer the proxy serves, which no `on` rule sees; give a failing status (3xx to 5xx) or an outcome"
                ));
            }
            OutcomeClass::Status(code)
        }
    })
}

/// Compares the policy's reaction to an outcome with what the case expects.
fn reaction_differences(
    snapshot: &Snapshot,
    health: &HealthTable<'_>,
    plan: &Plan,
    outcome: &OutcomeSpec,
    expect: &Expect,
) -> Result<Vec<Difference>, String> {
    let candidate = outcome
        .attempt
        .checked_sub(1)
        .filter(|i| *i < plan.candidates.len())
        .ok_or_else(|| {
            format!(
                "attempt {} is not in the plan of {} candidates",
                outcome.attempt,
                plan.candidates.len()
            )
        })?;
    // The candidates tried up to this one when each before it failed: its
    // place in the walk, which passes over paused candidates and those a
    // `keep` refuses. A candidate the walk does not reach is never tried,
    // unless a `keep` reads the failure before it (the walk sees none), and
    // then only within the attempt limit.
    let tried = plan.failover_sequence(snapshot, health);
    let walked = tried.iter().position(|index| *index == candidate);
    let reachable = walked.is_some()
        || (outcome.attempt <= plan.attempts && Plan::keep_reads_upstream(snapshot));
    if !reachable {
        let (with_credential, with_model) = entry_detail(&plan.candidates);
        let tried: Vec<String> = tried
            .iter()
            .filter_map(|index| plan.candidates.get(*index))
            .map(|c| plan_entry(snapshot, c, with_credential, with_model))
            .collect();
        return Err(format!(
            "attempt {} is never made: the plan makes at most {}, and if each fails it tries [{}]",
            outcome.attempt,
            count(plan.attempts, "attempt"),
            tried.join(", ")
        ));
    }
    let text = |t: &Option<String>| t.as_deref().map(std::sync::Arc::from);
    let facts = OutcomeFacts {
        status: match outcome_class(&outcome.result)? {
            OutcomeClass::Status(status) => Some(status),
            _ => None,
        },
        retry_after_ms: duration(&outcome.retry_after, "retry_after")?,
        error_code: text(&outcome.error_code),
        error_type: text(&outcome.error_type),
        error_message: text(&outcome.error_message),
    };
    let attempt = AttemptOutcome {
        class: outcome_class(&outcome.result)?,
        facts,
    };
    // Every try so far, this rule's retries included, is the attempt's
    // number. A candidate the walk does not reach (a `keep` that reads the
    // provider's answer lets it be tried) counts by its place.
    let candidates_tried =
        u32::try_from(walked.map_or(outcome.attempt, |k| k + 1)).unwrap_or(u32::MAX);
    let progress = Progress {
        attempt: candidates_tried.saturating_add(outcome.retries),
        attempts: candidates_tried,
        retries: outcome.retries,
        elapsed_ms: duration(&outcome.elapsed, "elapsed")?.unwrap_or(0),
        jitter: 0.5,
    };
    let retries = outcome.retries;
    let reaction = plan.react(snapshot, health, candidate, &attempt, progress, &|_| {
        retries
    });
    // The request's headers if it ends here, as the proxy gives them.
    let policy_headers = plan.headers(snapshot, Some(candidate), progress, false);
    let mut problems = Vec::new();
    let (action, retry_ms) = match reaction.action {
        Action::Next => ("next", None),
        Action::Stop => ("stop", None),
        Action::Retry { after_ms } => ("retry", Some(after_ms)),
    };
    if let Some(expected) = expect.action.map(ExpectedAction::name)
        && expected != action
    {
        let message = format!("expected `{expected}`, the policy says `{action}`");
        problems.push(Difference::new(
            "action",
            json!(expected),
            json!(action),
            &message,
        ));
    }
    if let Some(expected) = duration(&expect.retry_after, "retry_after")?
        && retry_ms != Some(expected)
    {
        let message = match retry_ms {
            Some(actual) => format!(
                "expected a retry after {}, got one after {}",
                duration_text(expected),
                duration_text(actual)
            ),
            None => format!(
                "expected a retry after {}, the policy says `{action}`",
                duration_text(expected)
            ),
        };
        problems.push(Difference::new(
            "retry_after",
            json!(duration_text(expected)),
            json!(retry_ms.map(duration_text)),
            &message,
        ));
    }
    let scope_name = |scope: HealthScope| match scope {
        HealthScope::Route => "route",
        HealthScope::Provider => "provider",
        HealthScope::Credential => "credential",
    };
    let pauses: BTreeMap<String, u64> = reaction
        .pauses
        .iter()
        .map(|(s, ms)| (scope_name(*s).to_string(), *ms))
        .collect();
    let expected_pauses: BTreeMap<String, u64> = expect
        .pause
        .iter()
        .map(|(scope, text)| {
            duration(&Some(text.clone()), "pause").map(|ms| (scope.clone(), ms.unwrap_or(0)))
        })
        .collect::<Result<_, _>>()?;
    if pauses != expected_pauses {
        let shown = |pauses: &BTreeMap<String, u64>| {
            let list: Vec<String> = pauses
                .iter()
                .map(|(scope, ms)| format!("{scope} {}", duration_text(*ms)))
                .collect();
            if list.is_empty() {
                String::from("none")
            } else {
                list.join(", ")
            }
        };
        // As a case writes them: `{provider: 30s}`.
        let written = |pauses: &BTreeMap<String, u64>| {
            let durations: BTreeMap<&str, String> = pauses
                .iter()
                .map(|(scope, ms)| (scope.as_str(), duration_text(*ms)))
                .collect();
            json!(durations)
        };
        let message = format!(
            "expected pauses: {}; got: {}",
            shown(&expected_pauses),
            shown(&pauses)
        );
        problems.push(Difference::new(
            "pause",
            written(&expected_pauses),
            written(&pauses),
            &message,
        ));
    }
    let penalties: Vec<&str> = reaction.penalties.iter().map(|s| scope_name(*s)).collect();
    let expected_penalties: Vec<&str> = expect.penalize.iter().map(String::as_str).collect();
    if penalties != expected_penalties {
        let shown = |scopes: &[&str]| {
            if scopes.is_empty() {
                String::from("none")
            } else {
                scopes.join(", ")
            }
        };
        let message = format!(
            "expected penalties: {}; got: {}",
            shown(&expected_penalties),
            shown(&penalties)
        );
        problems.push(Difference::new(
            "penalize",
            json!(expected_penalties),
            json!(penalties),
            &message,
        ));
    }
    match (&reaction.ending, &expect.error) {
        (Ending::Passthrough, Some(expected)) if expected == "passthrough" => {}
        (Ending::Error(error), Some(expected)) if *expected == error.code => {
            status_difference(expect.status, error.status, &mut problems);
            header_differences(&expect.headers, &policy_headers, error, &mut problems);
        }
        (_, None) => {}
        (ending, Some(expected)) => {
            let actual = match ending {
                Ending::Passthrough => "passthrough",
                Ending::Error(error) => error.code.as_str(),
            };
            problems.push(error_difference(expected, actual));
        }
    }
    Ok(problems)
}

pub fn run(args: &TestArgs) -> ExitCode {
    if let Some(policy) = args
        .paths
        .iter()
        .find(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "policy"))
    {
        let stem = policy.file_stem().map(|s| s.to_string_lossy().to_string());
        say_err!(
            "error: `{}` is a policy; `switchyard test` runs the cases beside it, in `{}.tests.yaml`",
            policy.display(),
            stem.unwrap_or_default()
        );
        return ExitCode::from(exit::USAGE);
    }
    let files = match files_named(&args.paths, ".tests.yaml") {
        Ok(files) => files,
        Err(message) => {
            say_err!("error: {message}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let filter = args.filter.as_deref().map(str::to_lowercase);
    let mut runs = Vec::new();
    for file in &files {
        let run = run_file(file, filter.as_deref());
        // Each file as it is done: a long run shows its progress.
        if args.format == TestFormat::Human {
            if let Some(report) = &run.report {
                print_report(report);
            }
            use std::io::Write as _;
            let _ = write!(std::io::stdout().lock(), "{}", report::text(&run));
        }
        runs.push(run);
    }
    let summary = Summary::of(&runs);
    if args.format == TestFormat::Human {
        say!("{}", summary.text(filter.is_some()));
    }
    // A filter that matches nothing has tested nothing: a mistyped name in
    // CI must not pass.
    if filter.is_some() && summary.passed + summary.failed == 0 {
        say_err!("error: no case's name holds the filter's text");
        return ExitCode::from(exit::USAGE);
    }
    if args.format == TestFormat::Json {
        say!("{}", report::json(&runs));
    }
    if summary.failed > 0 {
        ExitCode::from(exit::PROBLEMS)
    } else {
        ExitCode::from(exit::OK)
    }
}

/// Runs the cases of one file that `filter` (in lowercase) lets through.
fn run_file(file: &Path, filter: Option<&str>) -> FileRun {
    let shown = file.display().to_string();
    let run = FileRun::new(shown.clone());
    let bad_file = Some(codes::BAD_CASES_FILE.id);
    let text = match read_text(file, MAX_FILE_BYTES) {
        Ok(text) => text,
        Err(error) => {
            let message = format!("cannot read it: {}", io_reason(&error));
            return run.failed_with(FileProblem::at(&shown, None, message), bad_file, 1);
        }
    };
    let tests: TestFile = match serde_saphyr::from_str(&text) {
        Ok(tests) => tests,
        Err(error) => {
            let first = yaml_error(&shown, &text, &error);
            return other_case_mistakes(&shown, &text, &error)
                .into_iter()
                .fold(run.failed_with(first, bad_file, 1), |run, mistake| {
                    run.failed_with(mistake, bad_file, 1)
                });
        }
    };
    // A file of no cases tests nothing: it fails, as a case that could not
    // fail does.
    if tests.cases.is_empty() {
        let message = "it holds no cases; write some under `cases:`";
        return run.failed_with(FileProblem::at(&shown, None, message), bad_file, 1);
    }
    // A policy its cases cannot run against fails each of them.
    let all_cases = tests.cases.len();
    let directory = file.parent().unwrap_or_else(|| Path::new("."));
    let file_name = file
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let policy_name = match (&tests.policy, file_name.strip_suffix(".tests.yaml")) {
        (Some(policy), _) => policy.clone(),
        (None, Some(stem)) => format!("{stem}.policy"),
        (None, None) => {
            let message = "name its policy with `policy:`; only a file named NAME.tests.yaml \
                           finds NAME.policy by itself";
            return run.failed_with(FileProblem::at(&shown, None, message), bad_file, all_cases);
        }
    };
    let policy = directory.join(&policy_name);
    let mut run = FileRun {
        policy: Some(policy.display().to_string()),
        ..run
    };
    if !policy.is_file() {
        let why = if policy.is_dir() {
            format!("`{}` is a directory", policy.display())
        } else {
            why_no_file(&policy)
        };
        let named_by = if tests.policy.is_some() {
            "`policy:` names a file relative to the tests file"
        } else {
            "a file named NAME.tests.yaml tests NAME.policy beside it, or names its policy with `policy:`"
        };
        let message = format!("its policy: {why} ({named_by})");
        return run.failed_with(FileProblem::at(&shown, None, message), bad_file, all_cases);
    }
    let base = match compile_report(check_file(&policy), &AllBut(&[])) {
        Ok((snapshot, _)) => snapshot,
        Err(report) => {
            run.report = Some(report);
            let message = format!("`{}` does not check", policy.display());
            return run.failed_with(FileProblem::at(&shown, None, message), None, all_cases);
        }
    };
    let mut expected_errors = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (number, spanned) in tests.cases.iter().enumerate() {
        let case = &spanned.value;
        if filter.is_some_and(|wanted| !case.name.to_lowercase().contains(wanted)) {
            run.filtered_out += 1;
            continue;
        }
        // An empty name (refused below) is shown by the case's place. What
        // a case names is echoed masked, as in diagnostics: a key pasted in
        // the wrong field stays out of CI logs.
        let name = if case.name.trim().is_empty() {
            format!("case {}", number + 1)
        } else {
            redact(&case.name).into_owned()
        };
        if let Some(error) = &case.expect.error {
            expected_errors.insert(error.clone());
        }
        // A repeated name would make a failure's line ambiguous.
        let outcome = if names.insert(case.name.as_str()) {
            run_case(&policy, &base, case)
        } else {
            Err(CaseProblem::from(String::from(
                "an earlier case of this file has the same name",
            )))
        };
        let place = place_of(spanned);
        let verdict = match outcome {
            Ok(differences) if differences.is_empty() => Verdict::Passed,
            Ok(differences) => Verdict::Failed(differences),
            Err(problem) => Verdict::Invalid {
                place: problem.place.or(place),
                message: redact(&problem.message).into_owned(),
            },
        };
        run.cases.push(CaseRun {
            name,
            place,
            verdict,
        });
    }
    // The capacity error is the proxy's, after its wait; no decision, and
    // so no case, ends with it.
    let capacity_error = match base.program.capacity_error {
        Some(crate::language::ir::ErrorRef::Declared(index)) => Some(index),
        _ => None,
    };
    // With a filter, the cases left out may expect them.
    if filter.is_none() {
        let untested = base
            .program
            .errors
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != capacity_error)
            .map(|(_, e)| e.name.clone())
            .filter(|name| !expected_errors.contains(name))
            .collect();
        run.errors_no_case_expects = Some(untested);
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_no_rule_sees_is_refused_as_an_outcome_and_says_why() {
        let refusal = |text: &str| outcome_class(text).err().unwrap_or_default();
        assert!(refusal("101").contains("`malformed`"), "{}", refusal("101"));
        assert!(
            refusal("204").contains("the proxy serves"),
            "{}",
            refusal("204")
        );
        assert!(
            refusal("600").contains("not an HTTP status"),
            "{}",
            refusal("600")
        );
        assert_eq!(outcome_class("503"), Ok(OutcomeClass::Status(503)));
    }

    fn mistakes(text: &str) -> Vec<String> {
        let first = serde_saphyr::from_str::<TestFile>(text).expect_err("the file has a mistake");
        other_case_mistakes("t.yaml", text, &first)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_case_read_alone_keeps_its_mistakes_place() {
        let text = "cases:\n  - name: a\n    kye: k\n  - name: b\n    body: {}\n    expect: {}\n    \
                    # a comment less indented than the case\n# and one at the margin\n    plan: 1\n";
        let found = mistakes(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("t.yaml:9:5: `plan` is not a field here"),
            "{found:?}"
        );
    }

    #[test]
    fn a_wrong_kind_of_value_or_a_repeated_field_in_another_case_is_named() {
        let case = |name: &str, more: &str| {
            format!("  - name: {name}\n    key: k\n    body: {{model: m}}\n{more}")
        };
        let text = format!(
            "cases:\n{}{}{}{}{}",
            case("a", "    expct: {plan: [p]}\n"),
            case("b", "    expect: {plan: p}\n"),
            case(
                "c",
                "    expect: {attempts: x}\n    outcome: {result: \"429\"}\n"
            ),
            case("d", "    expect: {action: nxt}\n"),
            case("e", "    key: k\n    expect: {attempts: 2}\n"),
        );
        let found = mistakes(&text);
        let places: Vec<&str> = found
            .iter()
            .filter_map(|mistake| mistake.split(": ").next())
            .collect();
        assert_eq!(
            places,
            ["t.yaml:9:20", "t.yaml:13:24", "t.yaml:18:22", "t.yaml:22:5"],
            "{found:?}"
        );
    }

    /// Every shipped cases file reads as a whole; with a mistake put in
    /// its first case, reading its other cases alone finds none in them,
    /// anchors shared between cases and all.
    #[test]
    fn the_shipped_cases_read_alone_raise_no_false_mistakes() {
        let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let mut files = 0;
        for entry in std::fs::read_dir(policies).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".tests.yaml") {
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            let broken = text.replacen("  - name:", "  - nmae:", 1);
            assert_ne!(broken, text, "{}", path.display());
            assert_eq!(
                mistakes(&broken),
                Vec::<String>::new(),
                "{}",
                path.display()
            );
        }
        assert_eq!(files, 5);
    }

    #[test]
    fn a_case_that_needs_another_cases_anchor_is_passed_over() {
        let text = "cases:\n  - name: a\n    kye: k\n  - &b\n    name: b\n    body: {}\n    expect: {}\n  \
                    - <<: *b\n    name: c\n";
        assert_eq!(mistakes(text), Vec::<String>::new());
    }

    #[test]
    fn a_mistake_near_the_words_alias_or_anchor_is_still_named() {
        let text = "cases:\n  - name: a\n    kye: k\n  - name: \"aliases resolve; no anchor\"\n    \
                    endpont: chat\n    body: {}\n    expect: {}\n";
        let found = mistakes(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("t.yaml:5:5: `endpont` is not a field here"),
            "{found:?}"
        );
    }

    /// Lines the parser takes inside a case that a cut by indentation would
    /// end it at: a case is read up to the next one, so they raise nothing.
    #[test]
    fn lines_less_indented_inside_a_case_raise_no_false_mistakes() {
        let text = "cases:\n  - name: a\n    kye: k\n  - name: b\n\t# a tab before a comment\n    \
                    body: {model: \"m,\n  n\"}\n    expect: {}\n  - name: c\n    body: {}\n    expect: {}\n";
        assert_eq!(mistakes(text), Vec::<String>::new());
        let flow = "cases: [{name: a, kye: k}, {name: b, body: {}, expect: {}},\n  {name: c, body: {}, expect: {}}]\n";
        assert_eq!(mistakes(flow), Vec::<String>::new());
    }

    /// A case read whole (one with a case after it) names a missing field
    /// or a value of the wrong kind; the last, perhaps cut short, only an
    /// unknown or repeated field.
    #[test]
    fn only_a_case_read_whole_names_a_missing_field() {
        let text = "cases:\n  - name: a\n    kye: k\n  - name: b\n    body: {}\n  - name: c\n    body: {}\n";
        let found = mistakes(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("t.yaml:5:5: missing field `expect`"),
            "{found:?}"
        );
    }

    #[test]
    fn the_cases_after_the_first_mistake_end_where_the_file_goes_on() {
        let text = "cases:\n  - name: a\n    kye: k\n  - name: b\n    body: {}\n    expect: {}\npolicy: p\n";
        assert_eq!(mistakes(text), Vec::<String>::new());
    }
}
