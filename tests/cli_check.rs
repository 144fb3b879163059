//! `switchyard check` as users run it: the real binary, its exit codes, and
//! what it prints on standard error (human) or standard output (JSON).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const PACKAGE_ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `switchyard check ARGS` from the package root.
fn check(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("check")
        .args(args)
        .current_dir(PACKAGE_ROOT)
        .env("NO_COLOR", "1")
        .output()
        .expect("the switchyard binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The text of `policies/noirdoc.policy`.
fn noirdoc_text() -> String {
    std::fs::read_to_string(Path::new(PACKAGE_ROOT).join("policies/noirdoc.policy")).unwrap()
}

/// A temp dir holding `noirdoc.policy` with the given text, next to a copy of
/// its data directory `noirdoc/`. Returns the dir and the policy's path.
fn noirdoc_copy(name: &str, text: &str) -> (common::ScratchDir, PathBuf) {
    let dir = common::unique_dir(name);
    copy_dir(
        &Path::new(PACKAGE_ROOT).join("policies/noirdoc"),
        &dir.join("noirdoc"),
    );
    let policy = dir.join("noirdoc.policy");
    std::fs::write(&policy, text).unwrap();
    (dir, policy)
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    (line, text[line_start..offset].chars().count() + 1)
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn the_reference_policies_check_cleanly() {
    let output = check(&["policies/"]);
    let err = stderr(&output);
    assert_eq!(code(&output), 0, "{err}");
    assert!(!err.contains("warning["), "{err}");
    assert!(!err.contains("error["), "{err}");
    assert!(err.contains("no problems found"), "{err}");
}

/// A cases file or a data file named to `check` is a usage error that
/// says which command reads it: checked as a policy, a cases file gave 18
/// grammar errors.
#[test]
fn a_file_that_is_no_policy_is_refused_with_the_command_for_it() {
    let cases = check(&["policies/noirdoc.tests.yaml"]);
    assert_eq!(code(&cases), 2, "{}", stderr(&cases));
    assert!(
        stderr(&cases).contains("`switchyard test policies/noirdoc.tests.yaml` runs them"),
        "{}",
        stderr(&cases)
    );
    let data = check(&["policies/noirdoc/catalog.yaml"]);
    assert_eq!(code(&data), 2, "{}", stderr(&data));
    assert!(
        stderr(&data).contains("is not a policy (a `.yaml` file)"),
        "{}",
        stderr(&data)
    );
    assert!(!stderr(&data).contains("E0101"), "{}", stderr(&data));
}

#[test]
fn without_a_path_check_reads_policies() {
    let output = check(&[]);
    let err = stderr(&output);
    assert_eq!(code(&output), 0, "{err}");
    let policies = std::fs::read_dir(Path::new(PACKAGE_ROOT).join("policies"))
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|ext| ext == "policy")
        })
        .count();
    assert!(
        err.contains(&format!("checked {policies} policies")),
        "expected all {policies} policies to be checked: {err}"
    );
    assert!(!err.contains("error["), "{err}");
}

#[test]
fn a_misspelled_attribute_is_located_underlined_and_corrected() {
    let original = noirdoc_text();
    // The first use, in `order`; `failover` keeps the correct spelling.
    let start = original
        .find("provider.priority")
        .expect("noirdoc.policy uses provider.priority");
    let text = format!(
        "{}provider.prioritty{}",
        &original[..start],
        &original[start + "provider.priority".len()..]
    );
    let (_dir, policy) = noirdoc_copy("typo", &text);

    let output = check(&[policy.to_str().unwrap()]);
    let err = stderr(&output);
    assert_eq!(code(&output), 1, "{err}");

    let (line, column) = line_col(&text, start);
    assert!(
        err.contains(&format!("noirdoc.policy:{line}:{column}")),
        "expected noirdoc.policy:{line}:{column} in:\n{err}"
    );
    let source_line = text.lines().nth(line - 1).unwrap();
    assert!(
        err.contains(source_line),
        "expected the source line in:\n{err}"
    );
    // The underline sits under the misspelled path, in the line after it.
    let underline = format!(
        "{}{}",
        " ".repeat(column - 1),
        "^".repeat("provider.prioritty".len())
    );
    let quoted = err
        .lines()
        .position(|l| l.ends_with(source_line))
        .expect("the source line is quoted");
    let marker_line = err.lines().nth(quoted + 1).unwrap();
    let gutter = err.lines().nth(quoted).unwrap().len() - source_line.len();
    assert!(
        marker_line.get(gutter..).is_some_and(
            |marks| marks.starts_with(&underline) && !marks[underline.len()..].starts_with('^')
        ),
        "expected {} carets under `provider.prioritty` in:\n{err}",
        "provider.prioritty".len()
    );
    // Accept the suggestion with or without backticks around it.
    assert!(
        err.contains("did you mean provider.priority")
            || err.contains("did you mean `provider.priority`"),
        "{err}"
    );
    assert!(err.contains("error[E0302]"), "{err}");
    assert_eq!(count(&err, "error["), 1, "{err}");
}

#[test]
fn every_mistake_in_a_file_is_reported() {
    let original = noirdoc_text();
    let edits = [
        // A syntax error in `eligibility`.
        (
            "else wrong_endpoint_for_model",
            "els wrong_endpoint_for_model",
        ),
        // A misspelled attribute in `order`.
        ("by provider.listed", "by provider.lsited"),
        // An undeclared error in `capacity`.
        ("error capacity_exhausted", "error capacity_exhaustd"),
        // A duration without a unit in `timeouts`.
        ("connect 10s", "connect 10"),
    ];
    let mut text = original.clone();
    for (from, to) in edits {
        assert_eq!(count(&text, from), 1, "`{from}` is not unique");
        text = text.replacen(from, to, 1);
    }
    let (_dir, policy) = noirdoc_copy("several", &text);

    let output = check(&[policy.to_str().unwrap()]);
    let err = stderr(&output);
    assert_eq!(code(&output), 1, "{err}");
    for expected in [
        "error[E0101]",
        "error[E0302]",
        "error[E0303]",
        "error[E0401]",
    ] {
        assert!(err.contains(expected), "missing {expected} in:\n{err}");
    }
    assert!(
        count(&err, "error[") >= edits.len(),
        "expected at least {} errors:\n{err}",
        edits.len()
    );
    assert!(
        err.contains(&format!("{} errors", count(&err, "error["))),
        "the summary counts every error:\n{err}"
    );
}

#[test]
fn json_output_is_an_array_of_located_diagnostics() {
    let original = noirdoc_text();
    let text = original.replacen("by provider.listed", "by provider.lsited", 1);
    let start = text.find("provider.lsited").unwrap();
    let (line, column) = line_col(&text, start);
    let (_dir, policy) = noirdoc_copy("json", &text);

    let output = check(&["--format", "json", policy.to_str().unwrap()]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let value: serde_json::Value = serde_json::from_str(&stdout(&output))
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", stdout(&output)));
    let items = value.as_array().expect("a JSON array");
    assert_eq!(items.len(), 1, "{value:#}");
    let item = &items[0];
    assert_eq!(item["code"], "E0302");
    assert_eq!(item["severity"], "error");
    assert!(
        item["file"]
            .as_str()
            .is_some_and(|file| file.ends_with("noirdoc.policy")),
        "{item:#}"
    );
    assert_eq!(item["line"], line);
    assert_eq!(item["column"], column);
    assert!(
        item["help"]
            .as_str()
            .is_some_and(|help| help.contains("provider.listed")),
        "{item:#}"
    );
    assert!(item["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(item["labels"].as_array().is_some_and(|l| !l.is_empty()));

    // A clean policy gives an empty array.
    let output = check(&["--format", "json", "policies/noirdoc.policy"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(value, serde_json::json!([]));
}

#[test]
fn deny_warnings_fails_on_warnings_only() {
    let mut text = noirdoc_text();
    text.push_str("\nlet never_used = 1\n");
    let (_dir, policy) = noirdoc_copy("warning", &text);
    let path = policy.to_str().unwrap();

    let output = check(&[path]);
    let err = stderr(&output);
    assert_eq!(code(&output), 0, "{err}");
    assert!(err.contains("warning[W0602]"), "{err}");
    assert!(!err.contains("error["), "{err}");

    assert!(!err.contains("--deny-warnings"), "{err}");

    let output = check(&["--deny-warnings", path]);
    let err = stderr(&output);
    assert_eq!(code(&output), 1, "{err}");
    assert!(err.contains("warning[W0602]"), "{err}");
    assert!(
        err.contains("1 warning (--deny-warnings makes warnings fail the check)"),
        "{err}"
    );
}

#[test]
fn no_path_where_there_is_no_policies_directory_says_it_is_the_default() {
    let empty = std::env::temp_dir().join(format!(
        "switchyard-check-no-default-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&empty).unwrap();
    let output = Command::new(BIN)
        .arg("check")
        .current_dir(&empty)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
    let err = stderr(&output);
    assert_eq!(code(&output), 2, "{err}");
    assert!(
        err.contains("there is no `policies` directory here (the default)"),
        "{err}"
    );
}

#[test]
fn a_closed_standard_error_does_not_make_it_panic() {
    // A pipe whose reader is gone before the first line, as under
    // `check 2>&1 | true`: every write fails, none may panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    for args in [
        vec!["policies/noirdoc.policy"],
        vec!["policies/no-such-file.policy"],
    ] {
        let status = Command::new(BIN)
            .arg("check")
            .args(&args)
            .current_dir(PACKAGE_ROOT)
            .stderr(writer.try_clone().unwrap())
            .status()
            .expect("the switchyard binary runs");
        let expected = if args[0].contains("no-such") { 2 } else { 0 };
        assert_eq!(status.code(), Some(expected), "{args:?}");
    }
}

#[test]
fn a_missing_path_is_a_usage_error() {
    let output = check(&["policies/no-such-file.policy"]);
    let err = stderr(&output);
    assert_eq!(code(&output), 2, "{err}");
    assert!(err.contains("no-such-file.policy"), "{err}");
}

#[test]
fn explain_and_serve_given_no_policy_file_are_usage_errors() {
    for (command, path) in [
        ("explain", "policies/no-such-file.policy"),
        ("serve", "policies/no-such-file.policy"),
        ("explain", "policies"),
        ("serve", "policies"),
    ] {
        let mut args = vec![command, "--policy", path];
        if command == "explain" {
            args.extend(["--request", "README.md", "--key", "k"]);
        }
        let output = Command::new(BIN)
            .args(&args)
            .current_dir(PACKAGE_ROOT)
            .output()
            .expect("the switchyard binary runs");
        let err = stderr(&output);
        assert_eq!(code(&output), 2, "{command} {path}: {err}");
        assert!(
            err.starts_with("error: `policies"),
            "{command} {path}: {err}"
        );
        assert!(!err.contains("E0108"), "{command} {path}: {err}");
    }
}

#[test]
fn explain_in_json_on_a_policy_that_does_not_check_prints_its_diagnostics() {
    let output = Command::new(BIN)
        .args([
            "explain",
            "--policy",
            "tests/diagnostics/E0508-bad-attempts.policy",
            "--request",
            "docs/examples/request.json",
            "--key",
            "k",
            "--format",
            "json",
        ])
        .current_dir(PACKAGE_ROOT)
        .output()
        .expect("the switchyard binary runs");
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let diagnostics: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(diagnostics[0]["code"], "E0508", "{diagnostics}");
    // Once: not again, rendered for a person, on stderr.
    assert!(
        !stderr(&output).contains("error[E0508]"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_policy_that_is_not_text_is_a_problem_in_it() {
    let dir = common::unique_dir("not-text");
    let policy = dir.join("binary.policy");
    std::fs::write(&policy, b"\xff\xfe policy").unwrap();
    let output = check(&[policy.to_str().unwrap()]);
    let err = stderr(&output);
    assert_eq!(code(&output), 1, "{err}");
    assert!(err.contains("error[E0108]"), "{err}");
    assert!(err.contains("help: save the file as UTF-8 text"), "{err}");
    // It has no line to point at, but says which file it is about, so a
    // run over many files, or CI reading JSON, can tell.
    let shown = policy.display().to_string();
    assert!(err.contains(&format!("--> {shown}\n")), "{err}");
    let output = check(&["--format", "json", policy.to_str().unwrap()]);
    let items: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(items[0]["file"], shown.as_str(), "{items}");
    assert_eq!(items[0]["line"], serde_json::Value::Null, "{items}");
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let output = check(&["--no-such-flag", "policies/"]);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
}

#[cfg(unix)]
#[test]
fn a_data_path_to_a_device_is_refused_before_it_is_read() {
    // `/dev/zero` never ends: read whole, it would fill memory (one-shot
    // reads stop at the size limit; a data file is no device at all).
    let (_dir, policy) = noirdoc_copy(
        "endless-data",
        &noirdoc_text().replace("noirdoc/catalog.yaml", "/dev/zero"),
    );
    let output = check(&[policy.to_str().unwrap()]);
    let err = stderr(&output);
    assert_eq!(code(&output), 1, "{err}");
    assert!(
        err.contains("error[E0108]: cannot read `/dev/zero`: it is a character device, not a file"),
        "{err}"
    );
    assert!(err.contains("give a regular file"), "{err}");
}

#[test]
fn a_byte_order_mark_before_a_policy_is_not_part_of_it() {
    let mut text = String::from('\u{feff}');
    text.push_str(&noirdoc_text());
    let (_dir, policy) = noirdoc_copy("byte-order-mark", &text);
    let output = check(&[policy.to_str().unwrap()]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

#[cfg(unix)]
#[test]
fn a_path_that_names_no_readable_file_says_what_it_is() {
    let dir = common::unique_dir("not-a-file");
    let looped = dir.join("loop.policy");
    std::os::unix::fs::symlink(dir.join("back.policy"), &looped).unwrap();
    std::os::unix::fs::symlink(&looped, dir.join("back.policy")).unwrap();
    let fifo = dir.join("pipe.policy");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for (path, said) in [
        (&looped, "its symbolic links form a loop"),
        (&fifo, "is not a regular file (a pipe or a device?)"),
    ] {
        let output = check(&[path.to_str().unwrap()]);
        let err = stderr(&output);
        assert_eq!(code(&output), 2, "{err}");
        assert!(err.contains(said), "{err}");
        assert!(!err.contains("does not exist"), "{err}");
    }
}
