//! Golden tests for diagnostics.
//!
//! Every `tests/diagnostics/*.policy` file is one case: a small, complete
//! policy whose first line is a `#` comment naming the mistake it contains.
//! Its expected output sits beside it as `<same name>.stderr`: every
//! diagnostic rendered as plain human text, separated by blank lines, then the
//! summary line.
//!
//! A case named `<CODE>-<short-name>.policy` (such as
//! `E0302-unknown-attribute.policy`) must produce that code. Codes written in
//! the case's leading comment lines (`E0101`, `W0602`, ...) must appear too,
//! which is how the `multi-*` cases say what they expect.
//!
//! Run with `SWITCHYARD_BLESS=1` to (re)write the `.stderr` files from the
//! current output, then review the diff by eye.
//!
//! Data files live in `tests/diagnostics/data/`: `catalog.yaml` and
//! `tenants.yaml` are valid; each data-error case names its own broken copy
//! (`bad-unknown-field.catalog.yaml`, ...) in its header. The policies in
//! `tests/diagnostics/regressions/` are not golden cases: the tests in
//! `regressions`, each a fixed checker bug, use them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use switchyard::diagnostics::render::{self, Style};
use switchyard::diagnostics::{Severity, codes};
use switchyard::language::check_file;

/// Where the cases live, relative to the package root (the working directory
/// cargo gives integration tests), so paths in the output are stable.
const CASES: &str = "tests/diagnostics";

/// Codes no policy or data file can produce, each with the reason.
const UNREACHABLE_FROM_FILES: &[(&str, &str)] = &[
    (
        "E0901",
        "scenario files are read by `switchyard sim`, not by `check`; tests/cli_listen.rs renders one",
    ),
    (
        "E0902",
        "cases files are read by `switchyard test`, not by `check`; tests/cli_test.rs prints them",
    ),
    (
        "E0903",
        "test cases are run by `switchyard test`, not by `check`; tests/cli_test.rs prints them",
    ),
];

/// Fewest distinct codes the golden cases must cover.
const MIN_COVERED: usize = 25;

fn bless() -> bool {
    std::env::var_os("SWITCHYARD_BLESS").is_some_and(|value| value == "1")
}

/// Every case file, sorted by name.
fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(CASES)
        .expect("tests/diagnostics exists")
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "policy"))
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases found in {CASES}");
    cases
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned()
}

fn is_code(text: &str) -> bool {
    codes::by_id(text).is_some()
}

/// The code a case is named after: `E0302` for `E0302-unknown-attribute.policy`.
fn code_of(case: &Path) -> Option<String> {
    let name = file_name(case);
    let prefix = name.split('-').next()?;
    is_code(prefix).then(|| prefix.to_string())
}

/// Codes named in the leading comment lines of a case.
fn codes_in_header(text: &str) -> BTreeSet<String> {
    text.lines()
        .take_while(|line| line.starts_with('#'))
        .flat_map(|line| {
            line.split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|word| is_code(word))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What `switchyard check` would print for a case, rendered without colour.
fn render_case(case: &Path) -> String {
    let report = check_file(case);
    let mut parts: Vec<String> = report
        .diagnostics
        .iter()
        .map(|diagnostic| render::human(diagnostic, &report.sources, Style::Plain))
        .collect();
    parts.push(render::summary(
        report.diagnostics.count(Severity::Error),
        report.diagnostics.count(Severity::Warning),
    ));
    let mut out = parts.join("\n\n");
    out.push('\n');
    out
}

fn expected_path(case: &Path) -> PathBuf {
    case.with_extension("stderr")
}

/// A line diff (longest common subsequence), `-` for expected and `+` for
/// actual lines, with a little context around each change.
fn diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            lines.push(('-', a[i]));
            i += 1;
        } else {
            lines.push(('+', b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, (tag, _))| *tag != ' ')
        .map(|(index, _)| index)
        .collect();
    let mut out = String::new();
    let mut last_shown: Option<usize> = None;
    for (index, (tag, line)) in lines.iter().enumerate() {
        let near = changed
            .iter()
            .any(|&c| index + CONTEXT >= c && index <= c + CONTEXT);
        if !near {
            continue;
        }
        if last_shown.is_some_and(|last| index > last + 1) {
            out.push_str("   ...\n");
        }
        let _ = writeln!(out, "{tag}  {line}");
        last_shown = Some(index);
    }
    if expected.ends_with('\n') != actual.ends_with('\n') {
        out.push_str("(the files differ in their final newline)\n");
    }
    out
}

#[test]
fn golden_cases_match_their_expected_output() {
    let mut failures = Vec::new();
    for case in cases() {
        let name = file_name(&case);
        let text = std::fs::read_to_string(&case).unwrap();
        if !text.starts_with('#') {
            failures.push(format!(
                "{name}: the first line must be a `#` comment saying what mistake the case contains"
            ));
        }

        let actual = render_case(&case);

        let mut wanted: BTreeSet<String> = codes_in_header(&text);
        wanted.extend(code_of(&case));
        for code in wanted {
            if !actual.contains(&format!("[{code}]")) {
                failures.push(format!(
                    "{name}: expected `[{code}]` in the output, got:\n{actual}"
                ));
            }
        }

        let expected_file = expected_path(&case);
        if bless() {
            std::fs::write(&expected_file, &actual).unwrap();
            continue;
        }
        match std::fs::read_to_string(&expected_file) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => failures.push(format!(
                "{name}: output differs from {} (- expected, + actual):\n{}",
                expected_file.display(),
                diff(&expected, &actual)
            )),
            Err(_) => failures.push(format!(
                "{name}: {} is missing; run with SWITCHYARD_BLESS=1 to create it. Output:\n{actual}",
                expected_file.display()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case problem(s):\n\n{}\n\nIf the new output is right, rerun with SWITCHYARD_BLESS=1 and review the .stderr diff.",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_expected_output_has_a_case() {
    let stale: Vec<String> = std::fs::read_dir(CASES)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "stderr"))
        .filter(|path| !path.with_extension("policy").exists())
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        stale.is_empty(),
        "expected output without a case: {stale:?}"
    );
}

#[test]
fn every_code_has_a_golden_case() {
    let mut covered = BTreeSet::new();
    for case in cases() {
        let Some(code) = code_of(&case) else { continue };
        // The golden test checks the rendered text; this checks the report.
        let report = check_file(&case);
        assert!(
            report.diagnostics.iter().any(|d| d.code.id == code),
            "{} does not produce {code}",
            case.display()
        );
        covered.insert(code);
    }

    for (code, why) in UNREACHABLE_FROM_FILES {
        assert!(
            is_code(code),
            "{code} in UNREACHABLE_FROM_FILES is not a code"
        );
        assert!(!why.is_empty(), "say why {code} is unreachable");
        assert!(
            !covered.contains(*code),
            "{code} has a golden case; remove it from UNREACHABLE_FROM_FILES"
        );
    }
    let missing: Vec<&str> = codes::ALL
        .iter()
        .map(|code| code.id)
        .filter(|id| !covered.contains(*id))
        .filter(|id| !UNREACHABLE_FROM_FILES.iter().any(|(code, _)| code == id))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a golden case in {CASES}: {missing:?}; add `<CODE>-<name>.policy` or list the code in UNREACHABLE_FROM_FILES with the reason"
    );
    assert!(
        covered.len() >= MIN_COVERED,
        "only {} codes covered",
        covered.len()
    );
}

/// docs/language.md promises a help line for every problem `check` reports;
/// the golden cases between them reach every code, so each must carry one.
#[test]
fn every_diagnostic_has_a_help_line() {
    let mut without_help = Vec::new();
    for case in cases() {
        let report = check_file(&case);
        for diagnostic in report.diagnostics.iter() {
            if diagnostic.help.as_deref().is_none_or(str::is_empty) {
                without_help.push(format!(
                    "{}: [{}] {}",
                    file_name(&case),
                    diagnostic.code.id,
                    diagnostic.message
                ));
            }
        }
    }
    assert!(
        without_help.is_empty(),
        "diagnostics without a help line:\n{}",
        without_help.join("\n")
    );
}

#[test]
fn several_mistakes_are_all_reported_in_one_run() {
    let multi: Vec<PathBuf> = cases()
        .into_iter()
        .filter(|case| file_name(case).starts_with("multi-"))
        .collect();
    assert!(!multi.is_empty(), "no multi-* cases");
    for case in multi {
        let report = check_file(&case);
        let errors = report.diagnostics.count(Severity::Error);
        assert!(
            errors >= 2,
            "{} reports {errors} error(s); a multi case needs several",
            case.display()
        );
    }
}

/// Checker bugs found while writing the golden cases. Each test states the
/// right behaviour and is ignored until the bug is fixed; the golden files of
/// the cases they use record today's output, so fixing a bug also shows up as
/// a `.stderr` diff to bless.
mod regressions {
    use super::*;
    use switchyard::language::CheckReport;

    fn codes(report: &CheckReport) -> Vec<&'static str> {
        report.diagnostics.iter().map(|d| d.code.id).collect()
    }

    /// The text a diagnostic's primary label underlines.
    fn primary_text(report: &CheckReport, code: &str) -> String {
        let diagnostic = report
            .diagnostics
            .iter()
            .find(|d| d.code.id == code)
            .unwrap_or_else(|| panic!("no {code} in {:?}", codes(report)));
        let label = diagnostic.primary.as_ref().unwrap();
        let file = report.sources.file(label.source).unwrap();
        file.text[label.span.range()].to_string()
    }

    #[test]
    fn the_same_mistake_in_two_places_is_reported_twice() {
        let report = check_file(Path::new(
            "tests/diagnostics/regressions/same-typo-twice.policy",
        ));
        let found = codes(&report);
        assert_eq!(found, ["E0302", "E0302"], "{found:?}");
    }

    #[test]
    fn an_error_raised_by_an_unparsed_statement_is_not_unreachable() {
        let report = check_file(Path::new(
            "tests/diagnostics/regressions/unparsed-raise.policy",
        ));
        assert_eq!(codes(&report), ["E0101"]);
    }

    #[test]
    fn a_dropped_let_is_not_reported_as_undefined() {
        let report = check_file(Path::new(
            "tests/diagnostics/E0107-expression-too-long.policy",
        ));
        assert_eq!(codes(&report), ["E0107"]);
    }

    /// A policy whose order reads `top`, standing on a chain of `lets`
    /// definitions (`x0` uses none, each next one the one before), written
    /// first to last or last to first.
    fn chain_of_definitions(lets: usize, last_first: bool) -> CheckReport {
        chain_of_definitions_from(lets, last_first, "provider.priority", "")
    }

    /// [`chain_of_definitions`] with `x0 = first`, and `more` (such as an
    /// input) after the header.
    fn chain_of_definitions_from(
        lets: usize,
        last_first: bool,
        first: &str,
        more: &str,
    ) -> CheckReport {
        let header = "policy golden {\n  catalog \"data/catalog.yaml\"\n  tenants \"data/tenants.yaml\"\n}\n\n\
                      models {\n  credentials one by credential.owned desc else no_model\n  unknown error no_model\n}\n\n\
                      order {\n  by top\n}\n\n\
                      failover {\n  attempts 2\n  on any => stop, error provider_failed\n}\n\n\
                      capacity {\n  error all_busy\n}\n\n\
                      errors {\n  no_model = 404, \"the model is not available\"\n  \
                      provider_failed = 502, \"the provider failed\"\n  \
                      all_busy = 503, \"every provider is at its limit\"\n}\n";
        let mut lines: Vec<String> = (0..lets)
            .map(|i| match i {
                0 => format!("let x0 = {first}"),
                _ => format!("let x{i} = x{} + 1", i - 1),
            })
            .collect();
        lines.push(format!("let top = x{}", lets - 1));
        if last_first {
            lines.reverse();
        }
        let text = format!("{header}{more}\n{}\n", lines.join("\n"));
        let mut sources = switchyard::source::SourceMap::new();
        let source = sources.add("chain.policy", &text);
        switchyard::language::check_source(sources, source, Path::new(CASES), Vec::new())
    }

    /// The limit on chains of definitions held only where a definition was
    /// checked inside the one using it: written first to last, each
    /// definition found the one before already checked, and a chain of any
    /// length passed `check`, while the evaluator gives up past 256 and
    /// reads null, silently changing the decision.
    #[test]
    fn a_chain_of_definitions_is_as_deep_in_any_order() {
        // `top` stands on 200 definitions: 201 deep.
        for last_first in [false, true] {
            let report = chain_of_definitions(199, last_first);
            assert_eq!(
                codes(&report),
                Vec::<&str>::new(),
                "200 deep, last first: {last_first}"
            );
            let report = chain_of_definitions(200, last_first);
            assert_eq!(
                codes(&report),
                ["E0107"],
                "201 deep, last first: {last_first}"
            );
            let report = chain_of_definitions(300, last_first);
            assert_eq!(
                codes(&report),
                ["E0107"],
                "301 deep, last first: {last_first}"
            );
        }
        // What a definition refused before it was read reads is not known
        // to be unused: an input it reads is not reported as never used.
        // Here the one refused is `x0`, which reads the input.
        let report = chain_of_definitions_from(
            200,
            true,
            "coalesce(input.n, 1)",
            "\ninput n from body \"n\" : int 1..10\n  malformed error no_model\n",
        );
        assert_eq!(codes(&report), ["E0107"]);
    }

    #[test]
    fn too_deep_nesting_does_not_hide_the_header() {
        let report = check_file(Path::new("tests/diagnostics/E0107-nesting-too-deep.policy"));
        assert_eq!(codes(&report), ["E0107"]);
    }

    #[test]
    fn a_repeated_layer_underlines_only_the_layer() {
        let report = check_file(Path::new("tests/diagnostics/E0512-bad-layers.policy"));
        assert_eq!(primary_text(&report, "E0512"), "key");
        let report = check_file(Path::new("tests/diagnostics/E0505-pause-twice.policy"));
        assert_eq!(primary_text(&report, "E0505"), "pause provider for 5s");
    }

    #[test]
    fn a_bad_wire_format_does_not_orphan_routes() {
        let report = check_file(Path::new("tests/diagnostics/E0201-bad-wire-format.policy"));
        assert_eq!(codes(&report), ["E0201"]);
    }

    #[test]
    fn a_misspelled_header_setting_is_explained() {
        let report = check_file(Path::new("tests/diagnostics/E0101-header-typo.policy"));
        assert_eq!(codes(&report), ["E0101"]);
        let message = &report.diagnostics.iter().next().unwrap().message;
        assert!(message.contains("`catalog`"), "{message}");
    }

    #[test]
    fn a_broken_sort_header_points_at_the_mistake() {
        let report = check_file(Path::new("tests/diagnostics/E0101-sort-header.policy"));
        assert_eq!(codes(&report), ["E0101"]);
        assert_eq!(primary_text(&report, "E0101"), "by");
    }
}
