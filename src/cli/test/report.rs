//! What `switchyard test` found, file by file and case by case, and its two
//! renderings: lines for a person and one JSON document for CI. Both print
//! the same structure, so they cannot disagree.

use crate::data::FileProblem;
use crate::diagnostics::codes;
use crate::diagnostics::redact::redact;
use crate::diagnostics::render::{JsonDiagnostic, json_items};
use crate::language::CheckReport;
use serde::Serialize;
use serde_json::Value as Json;

/// What running one cases file found.
pub struct FileRun {
    /// The cases file, as the command line names it.
    pub file: String,
    /// The policy its cases test, once the file names it.
    pub policy: Option<String>,
    /// What kept its cases from running: then none ran.
    pub problems: Vec<FileFailure>,
    /// The check of a policy that does not check.
    pub report: Option<Box<CheckReport>>,
    /// The cases run, in the file's order.
    pub cases: Vec<CaseRun>,
    /// The cases a filter left out.
    pub filtered_out: usize,
    /// The policy's errors that no case expects; `None` when not known:
    /// under a filter (the cases left out may expect them), or when the
    /// cases did not run.
    pub errors_no_case_expects: Option<Vec<String>>,
}

/// A problem of a cases file as a whole.
pub struct FileFailure {
    pub problem: FileProblem,
    /// `E0902`, or none for a policy that does not check: its diagnostics
    /// say why.
    pub code: Option<&'static str>,
    /// The failures it counts for: one, or each of the file's cases when
    /// they cannot run against their policy.
    pub failures: usize,
}

/// A case that ran, or was refused before it ran.
pub struct CaseRun {
    /// Its name, masked, or `case N` for an empty one.
    pub name: String,
    /// Where the case begins (line and column, from 1).
    pub place: Option<(usize, usize)>,
    pub verdict: Verdict,
}

pub enum Verdict {
    Passed,
    /// It ran, and the policy did not do what it expects.
    Failed(Vec<Difference>),
    /// It cannot run as written, or could pass whatever the policy does
    /// (`E0903`): why, and where (the case, or the part of it at fault).
    Invalid {
        place: Option<(usize, usize)>,
        message: String,
    },
}

/// A field of a case's `expect` that the policy did not meet.
#[derive(Debug, Serialize)]
pub struct Difference {
    /// The field compared: `plan`, `attempts`, `tried_if_each_fails`,
    /// `error`, `status`, `headers`, `action`, `retry_after`, `pause` or
    /// `penalize`.
    pub field: &'static str,
    /// What the case expects, written as a case writes it; `null` where it
    /// expects none (no error, a header absent).
    pub expected: Json,
    /// What the policy gave, in the same form; `null` where it gave none.
    pub actual: Json,
    /// What the text output says, one or more lines.
    pub message: String,
}

impl Difference {
    /// What a case names or expects is echoed masked, as in diagnostics: a
    /// key pasted in the wrong field stays out of CI logs.
    pub fn new(field: &'static str, expected: Json, actual: Json, message: &str) -> Difference {
        Difference {
            field,
            expected: masked(expected),
            actual: masked(actual),
            message: redact(message).into_owned(),
        }
    }
}

/// `value` with every text in it, names of members too, masked by [`redact`].
fn masked(value: Json) -> Json {
    match value {
        Json::String(text) => Json::String(redact(&text).into_owned()),
        Json::Array(items) => Json::Array(items.into_iter().map(masked).collect()),
        Json::Object(members) => Json::Object(
            members
                .into_iter()
                .map(|(name, value)| (redact(&name).into_owned(), masked(value)))
                .collect(),
        ),
        other => other,
    }
}

impl FileRun {
    pub fn new(file: String) -> FileRun {
        FileRun {
            file,
            policy: None,
            problems: Vec::new(),
            report: None,
            cases: Vec::new(),
            filtered_out: 0,
            errors_no_case_expects: None,
        }
    }

    /// The file, failed with `problem`, counted as `failures` failures.
    pub fn failed_with(
        mut self,
        problem: FileProblem,
        code: Option<&'static str>,
        failures: usize,
    ) -> FileRun {
        self.problems.push(FileFailure {
            problem,
            code,
            failures,
        });
        self
    }

    pub fn passed(&self) -> usize {
        self.cases
            .iter()
            .filter(|case| matches!(case.verdict, Verdict::Passed))
            .count()
    }

    pub fn failed(&self) -> usize {
        let cases = self.cases.len() - self.passed();
        self.problems
            .iter()
            .map(|failure| failure.failures)
            .sum::<usize>()
            + cases
    }
}

/// The counts of a run's summary line.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub filtered_out: usize,
}

impl Summary {
    pub fn of(runs: &[FileRun]) -> Summary {
        runs.iter().fold(Summary::default(), |sum, run| Summary {
            passed: sum.passed + run.passed(),
            failed: sum.failed + run.failed(),
            filtered_out: sum.filtered_out + run.filtered_out,
        })
    }

    /// `N passed, M failed`, and with a filter, how many it left out.
    pub fn text(&self, filtered: bool) -> String {
        let Summary {
            passed,
            failed,
            filtered_out,
        } = self;
        if filtered {
            format!("{passed} passed, {failed} failed, {filtered_out} filtered out")
        } else {
            format!("{passed} passed, {failed} failed")
        }
    }
}

/// A file's lines of the text output, each ending in a line break: `ok` or
/// `FAIL` for each case (what differs indented below a failure), `FAIL`
/// for each problem of the file, and the note of errors no case expects.
/// The diagnostics of a policy that does not check go to standard error,
/// before these.
pub fn text(run: &FileRun) -> String {
    use std::fmt::Write as _;
    // Writing to a string does not fail.
    let mut out = String::new();
    let file = &run.file;
    for failure in &run.problems {
        let _ = match failure.code {
            Some(code) => writeln!(out, "FAIL  {} [{code}]", failure.problem),
            None => writeln!(out, "FAIL  {}", failure.problem),
        };
    }
    for case in &run.cases {
        let name = &case.name;
        let _ = match &case.verdict {
            Verdict::Passed => writeln!(out, "ok    {file}: {name}"),
            Verdict::Failed(differences) => {
                let _ = writeln!(out, "FAIL  {file}: {name}");
                differences
                    .iter()
                    .flat_map(|difference| difference.message.lines())
                    .try_for_each(|text| writeln!(out, "        {text}"))
            }
            Verdict::Invalid { place, message } => {
                let message = format!("{name}: {message} [{}]", codes::UNSOUND_CASE.id);
                writeln!(out, "FAIL  {}", FileProblem::at(file, *place, message))
            }
        };
    }
    if let Some(errors) = &run.errors_no_case_expects
        && !errors.is_empty()
    {
        let _ = writeln!(out, "note  {file}: no case expects {}", errors.join(", "));
    }
    out
}

/// The whole run as one JSON document (docs/testing.md lists its members).
pub fn json(runs: &[FileRun]) -> String {
    let summary = Summary::of(runs);
    let document = JsonRun {
        files: runs.iter().map(json_file).collect(),
        passed: summary.passed,
        failed: summary.failed,
        filtered_out: summary.filtered_out,
    };
    serde_json::to_string_pretty(&document).unwrap_or_default()
}

// Members in the order the text shows them, counts last as its summary is.

#[derive(Serialize)]
struct JsonRun<'a> {
    files: Vec<JsonFile<'a>>,
    passed: usize,
    failed: usize,
    filtered_out: usize,
}

#[derive(Serialize)]
struct JsonFile<'a> {
    file: &'a str,
    policy: Option<&'a str>,
    problems: Vec<JsonProblem<'a>>,
    diagnostics: Vec<JsonDiagnostic<'a>>,
    cases: Vec<JsonCase<'a>>,
    errors_no_case_expects: Option<&'a [String]>,
    passed: usize,
    failed: usize,
    filtered_out: usize,
}

/// A problem in the cases file, placed as a diagnostic is.
#[derive(Serialize)]
struct JsonProblem<'a> {
    code: Option<&'a str>,
    message: &'a str,
    file: &'a str,
    line: Option<usize>,
    column: Option<usize>,
}

impl<'a> JsonProblem<'a> {
    fn at(
        code: Option<&'a str>,
        file: &'a str,
        place: Option<(usize, usize)>,
        message: &'a str,
    ) -> JsonProblem<'a> {
        JsonProblem {
            code,
            message,
            file,
            line: place.map(|(line, _)| line),
            column: place.map(|(_, column)| column),
        }
    }
}

#[derive(Serialize)]
struct JsonCase<'a> {
    name: &'a str,
    file: &'a str,
    line: Option<usize>,
    column: Option<usize>,
    status: &'static str,
    differences: &'a [Difference],
    problem: Option<JsonProblem<'a>>,
}

fn json_file(run: &FileRun) -> JsonFile<'_> {
    let file = run.file.as_str();
    JsonFile {
        file,
        policy: run.policy.as_deref(),
        problems: run
            .problems
            .iter()
            .map(|failure| {
                let FileProblem {
                    file,
                    place,
                    message,
                } = &failure.problem;
                JsonProblem::at(failure.code, file, *place, message)
            })
            .collect(),
        diagnostics: run
            .report
            .as_deref()
            .map(|report| json_items(report.diagnostics.iter(), &report.sources))
            .unwrap_or_default(),
        cases: run
            .cases
            .iter()
            .map(|case| {
                let (status, differences, problem) = match &case.verdict {
                    Verdict::Passed => ("passed", &[][..], None),
                    Verdict::Failed(differences) => ("failed", &differences[..], None),
                    Verdict::Invalid { place, message } => (
                        "invalid",
                        &[][..],
                        Some(JsonProblem::at(
                            Some(codes::UNSOUND_CASE.id),
                            file,
                            *place,
                            message,
                        )),
                    ),
                };
                JsonCase {
                    name: &case.name,
                    file,
                    line: case.place.map(|(line, _)| line),
                    column: case.place.map(|(_, column)| column),
                    status,
                    differences,
                    problem,
                }
            })
            .collect(),
        errors_no_case_expects: run.errors_no_case_expects.as_deref(),
        passed: run.passed(),
        failed: run.failed(),
        filtered_out: run.filtered_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A file with a case of each verdict, a problem and the note.
    fn a_run() -> FileRun {
        let mut run = FileRun::new(String::from("t.tests.yaml")).failed_with(
            FileProblem::at("t.tests.yaml", Some((9, 3)), "a problem"),
            Some(codes::BAD_CASES_FILE.id),
            2,
        );
        run.policy = Some(String::from("t.policy"));
        run.filtered_out = 4;
        run.errors_no_case_expects = Some(vec![String::from("a"), String::from("b")]);
        let case = |name: &str, line, verdict| CaseRun {
            name: String::from(name),
            place: Some((line, 5)),
            verdict,
        };
        run.cases = vec![
            case("passes", 3, Verdict::Passed),
            case(
                "differs",
                5,
                Verdict::Failed(vec![Difference::new(
                    "plan",
                    json!(["a"]),
                    json!(["b"]),
                    "expected plan [a]\n  actual plan [b]",
                )]),
            ),
            case(
                "refused",
                7,
                Verdict::Invalid {
                    place: Some((8, 9)),
                    message: String::from("why"),
                },
            ),
        ];
        run
    }

    #[test]
    fn the_text_shows_each_case_each_problem_and_the_note() {
        assert_eq!(
            text(&a_run()),
            "FAIL  t.tests.yaml:9:3: a problem [E0902]\n\
             ok    t.tests.yaml: passes\n\
             FAIL  t.tests.yaml: differs\n\
             \x20       expected plan [a]\n\
             \x20         actual plan [b]\n\
             FAIL  t.tests.yaml:8:9: refused: why [E0903]\n\
             note  t.tests.yaml: no case expects a, b\n"
        );
    }

    #[test]
    fn the_json_holds_what_the_text_shows_with_the_same_counts() {
        let runs = [a_run()];
        let document: Json = serde_json::from_str(&json(&runs)).unwrap();
        let file = &document["files"][0];
        assert_eq!(file["policy"], "t.policy");
        assert_eq!(
            file["problems"][0],
            json!({"code": "E0902", "message": "a problem", "file": "t.tests.yaml", "line": 9, "column": 3})
        );
        let statuses: Vec<&Json> = (0..3).map(|n| &file["cases"][n]["status"]).collect();
        assert_eq!(statuses, ["passed", "failed", "invalid"]);
        assert_eq!(
            file["cases"][1]["differences"][0],
            json!({"field": "plan", "expected": ["a"], "actual": ["b"],
                   "message": "expected plan [a]\n  actual plan [b]"})
        );
        let refused = &file["cases"][2];
        assert_eq!(
            (&refused["line"], &refused["column"]),
            (&json!(7), &json!(5))
        );
        assert_eq!(
            refused["problem"],
            json!({"code": "E0903", "message": "why", "file": "t.tests.yaml", "line": 8, "column": 9})
        );
        assert_eq!(file["errors_no_case_expects"], json!(["a", "b"]));
        // The problem counts twice, as for a policy its two cases cannot
        // run against; the summary line says the same.
        let counts = json!({"passed": 1, "failed": 4, "filtered_out": 4});
        for counted in [file, &document] {
            for member in ["passed", "failed", "filtered_out"] {
                assert_eq!(counted[member], counts[member], "{member}");
            }
        }
        assert_eq!(
            Summary::of(&runs).text(true),
            "1 passed, 4 failed, 4 filtered out"
        );
        assert_eq!(Summary::of(&runs).text(false), "1 passed, 4 failed");
    }

    #[test]
    fn a_difference_masks_a_pasted_key_in_its_values_and_names() {
        let key = "sk-proj-AbCdEf1234567890XyZ";
        let difference = Difference::new(
            "headers",
            json!({ key: key }),
            json!({ key: null }),
            &format!("expected header {key}: {key}, it is missing"),
        );
        let shown = serde_json::to_string(&difference).unwrap();
        assert!(!shown.contains(key), "{shown}");
        assert!(shown.contains("sk-*****"), "{shown}");
    }
}
