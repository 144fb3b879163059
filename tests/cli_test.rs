//! `switchyard test` as users run it: the real binary on a cases file of
//! its own. A case whose fields would not be compared, or contradict each
//! other, would pass whatever the policy does; such a case fails, saying
//! why, instead. And `switchyard explain`'s account of which step removed
//! which candidate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const PACKAGE_ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Writes `text` as a cases file in a directory of its own and runs
/// `switchyard test` on it.
fn run_cases(name: &str, file_name: &str, text: &str) -> (Output, PathBuf) {
    let (output, mut paths) = run_files(name, &[(file_name, text)], &[]);
    (output, paths.remove(0))
}

/// Writes `files` (each a name and its text) in a directory of their own
/// and runs `switchyard test` with `more` arguments on those that are not
/// policies; the paths of the files written.
fn run_files(name: &str, files: &[(&str, &str)], more: &[&str]) -> (Output, Vec<PathBuf>) {
    let dir =
        std::env::temp_dir().join(format!("switchyard-cli-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|(file_name, text)| {
            let file = dir.join(file_name);
            std::fs::write(&file, text).unwrap();
            file
        })
        .collect();
    let output = Command::new(BIN)
        .arg("test")
        .args(paths.iter().filter(|path| {
            path.extension()
                .is_none_or(|extension| extension != "policy")
        }))
        .args(more)
        .current_dir(PACKAGE_ROOT)
        .output()
        .expect("the switchyard binary runs");
    std::fs::remove_dir_all(&dir).unwrap();
    (output, paths)
}

fn noirdoc() -> String {
    format!("{PACKAGE_ROOT}/policies/noirdoc.policy")
}

#[test]
fn the_example_test_file_in_docs_testing_md_passes() {
    let doc = std::fs::read_to_string(format!("{PACKAGE_ROOT}/docs/testing.md")).unwrap();
    let example = doc
        .split("## A test file")
        .nth(1)
        .and_then(|rest| rest.split("```yaml\n").nth(1))
        .and_then(|block| block.split("```").next())
        .unwrap();
    let cases = example.replace("policy: noirdoc.policy", &format!("policy: {}", noirdoc()));
    assert_ne!(cases, example, "the example names its policy");
    let (output, _) = run_cases("doc-example", "example.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
}

#[test]
fn a_case_with_an_empty_name_fails_and_is_shown_by_its_place() {
    let cases = format!(
        "policy: {policy}\ncases:\n  - name: \"  \"\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    expect: {{attempts: 3}}\n",
        policy = noirdoc()
    );
    let (output, _) = run_cases("empty-name", "empty.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(": case 1: the case's `name` is empty"),
        "{stdout}"
    );
    assert_eq!(output.status.code(), Some(1), "{stdout}");
}

#[test]
fn an_outcome_case_compares_the_headers_of_the_error_it_ends_with() {
    // Noirdoc names the provider that answered last, and passes on the
    // provider's Retry-After with `resource_exhausted`.
    let cases = format!(
        r#"policy: {policy}
cases:
  - name: as the proxy answers
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 2, result: "429", retry_after: 30s}}
    expect:
      pause: {{provider: 30s}}
      error: resource_exhausted
      headers: {{retry-after: "30", x-noirdoc-provider: scaleway, x-should-retry: null}}
  - name: wrong values
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "429"}}
    expect:
      pause: {{provider: 10s}}
      error: resource_exhausted
      headers: {{retry-after: "10", x-noirdoc-provider: scaleway}}
"#,
        policy = noirdoc()
    );
    let (output, _) = run_cases("outcome-headers", "headers.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("ok    "), "{stdout}");
    assert!(stdout.contains(": as the proxy answers\n"), "{stdout}");
    assert!(
        stdout.contains("expected header retry-after: 10, it is missing"),
        "{stdout}"
    );
    assert!(
        stdout.contains("expected header x-noirdoc-provider: scaleway, got aki-io"),
        "{stdout}"
    );
    assert!(stdout.contains("1 passed, 1 failed"), "{stdout}");
}

#[test]
fn each_plan_entry_is_compared_as_precisely_as_it_is_written() {
    let cases = format!(
        r#"policy: {policy}
cases:
  - name: mixed
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io/aki-io-platform, scaleway@qwen3.8-27b, ionos, together]}}
  - name: a wrong model
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io/aki-io-platform, scaleway@gpt-5, ionos, together]}}
"#,
        policy = noirdoc()
    );
    let (output, _) = run_cases("mixed-plan", "mixed.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("ok    "), "{stdout}");
    assert!(stdout.contains(": mixed\n"), "{stdout}");
    assert!(stdout.contains("FAIL  "), "{stdout}");
    assert!(stdout.contains("1 passed, 1 failed"), "{stdout}");
    // The difference is shown with a credential and a model for each entry.
    assert!(
        stdout.contains("actual plan [aki-io/aki-io-platform@qwen3.8-27b, scaleway/"),
        "{stdout}"
    );
}

/// `keep` rules never change a plan, only which of its candidates are
/// tried: a case pins them with `tried_if_each_fails`. Without it, deleting
/// Noirdoc's `keep prev.priced implies priced` passed every case.
#[test]
fn a_case_pins_the_candidates_tried_if_each_fails() {
    let cases = format!(
        r#"policy: {policy}
cases:
  - name: priced after priced
    key: acme-default
    body: {{model: qwen3.8-27b}}
    health: [{{provider: aki-io, paused_for: 30s}}]
    expect: {{tried_if_each_fails: [scaleway, ionos]}}
  - name: the unpriced one as well
    key: acme-default
    body: {{model: qwen3.8-27b}}
    health: [{{provider: aki-io, paused_for: 30s}}]
    expect: {{tried_if_each_fails: [scaleway, ionos, together]}}
  - name: a misspelt provider
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{tried_if_each_fails: [aki-io, scalewey]}}
  - name: tried and refused
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{error: model_not_available, tried_if_each_fails: [aki-io]}}
  - name: an attempt never made
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 4, result: "500"}}
    expect: {{action: next}}
  - name: an attempt made past a paused one
    key: acme-default
    body: {{model: gpt-oss-120b}}
    health: [{{provider: together, paused_for: 30s}}, {{provider: scaleway, paused_for: 30s}}]
    outcome: {{attempt: 4, result: "500"}}
    expect: {{action: next}}
  - name: an attempt at a paused one
    key: acme-default
    body: {{model: qwen3.8-27b}}
    health: [{{provider: aki-io, paused_for: 30s}}]
    outcome: {{attempt: 1, result: "500"}}
    expect: {{action: next}}
"#,
        policy = noirdoc()
    );
    let (output, file) = run_cases("tried", "tried.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let shown = file.display();
    assert!(
        stdout.contains(&format!("ok    {shown}: priced after priced\n")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "FAIL  {shown}: the unpriced one as well\n        \
             expected tried_if_each_fails [scaleway, ionos, together]\n          \
             actual tried_if_each_fails [scaleway, ionos]\n"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("`expect.tried_if_each_fails` names `scalewey`, which is no provider of the catalog; did you mean `scaleway`?"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "FAIL  {shown}:17:5: tried and refused: `expect` names an error and a plan"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "FAIL  {shown}:21:5: an attempt never made: attempt 4 is never made: the plan makes at most 3 attempts, \
             and if each fails it tries [aki-io, scaleway, ionos] [E0903]"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "ok    {shown}: an attempt made past a paused one\n"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "FAIL  {shown}:32:5: an attempt at a paused one: attempt 1 is never made: the plan makes \
             at most 3 attempts, and if each fails it tries [scaleway, ionos] [E0903]"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("2 passed, 5 failed"), "{stdout}");
}

/// `null` for an expected value reads as not given: `status: null` passed
/// whatever the status was. It is refused where it is written, in every
/// case that writes one.
#[test]
fn an_expectation_written_null_is_refused_at_its_place() {
    let cases = format!(
        r#"policy: {policy}
cases:
  - name: a status of null
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{error: model_not_available, status: null}}
  - name: a plan of null
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: ~}}
"#,
        policy = noirdoc()
    );
    let (output, file) = run_cases("null", "null.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("FAIL  {}:6:", file.display()))
            && stdout
                .contains("`null` compares nothing here: give a value, or leave the field out"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("FAIL  {}:10:", file.display())),
        "{stdout}"
    );
    assert!(stdout.contains("0 passed, 2 failed"), "{stdout}");
}

#[test]
fn a_case_that_could_not_fail_fails_and_says_why() {
    let cases = format!(
        r#"policy: {policy}
cases:
  - name: sound
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io, scaleway, ionos, together]}}
  - name: error and plan
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{error: model_not_available, plan: [aki-io]}}
  - name: a plan for an outcome
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "500"}}
    expect: {{action: next, plan: [aki-io]}}
  - name: key and tenant
    key: acme-default
    tenant: acme
    body: {{model: qwen3.8-27b}}
    expect: {{attempts: 3}}
  - name: headers of a plan
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io, scaleway, ionos, together], headers: {{x-anything: y}}}}
  - name: a secret no credential reads
    key: acme-default
    missing_secrets: [NO_SUCH_VARIABLE]
    body: {{model: qwen3.8-27b}}
    expect: {{attempts: 3}}
  - name: sound
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{attempts: 3}}
  - name: a status alone
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{status: 403}}
  - name: a misspelt scope
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "500"}}
    expect: {{action: next, penalize: [provder]}}
  - name: an outcome's fields without an outcome
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io, scaleway, ionos, together], action: next}}
  - name: nothing to compare
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{}}
  - name: an error the policy does not declare
    key: acme-default
    body: {{model: nothing-of-the-sort}}
    expect: {{error: model_not_availabel}}
  - name: a provider the catalog does not have
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [akiio, scaleway]}}
  - name: a status with passthrough
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "418"}}
    expect: {{error: passthrough, status: 999}}
  - name: nobody asks
    body: {{model: qwen3.8-27b}}
    expect: {{attempts: 3}}
  - name: a success as an outcome
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "200"}}
    expect: {{action: stop, error: passthrough}}
  - name: headers of an outcome without its error
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "500"}}
    expect: {{action: next, headers: {{x-noirdoc-provider: aki-io}}}}
  - name: headers with passthrough
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "418"}}
    expect: {{error: passthrough, headers: {{retry-after: null}}}}
  - name: a model the catalog does not have
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io@qwen3.8-27c, scaleway]}}
  - name: a credential the provider does not have
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io/aki-io-platfrm, scaleway]}}
  - name: no model after the at sign
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io@, scaleway]}}
"#,
        policy = noirdoc()
    );
    let (output, _) = run_cases("shapes", "shapes.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let failures: Vec<(&str, &str)> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("FAIL  "))
        .map(|line| {
            // `FILE:LINE:COLUMN: NAME: WHY [E0903]`, at the case's place.
            let (_, rest) = line.split_once(".tests.yaml:").unwrap();
            let (place, rest) = rest.split_once(": ").unwrap();
            assert!(place.split(':').all(|n| n.parse::<u32>().is_ok()), "{line}");
            let rest = rest
                .strip_suffix(" [E0903]")
                .unwrap_or_else(|| panic!("{line}"));
            rest.split_once(": ").unwrap()
        })
        .collect();
    let expected = [
        ("error and plan", "one or the other"),
        ("a plan for an outcome", "does not compare `plan`"),
        ("key and tenant", "not both"),
        ("headers of a plan", "describe a refusal"),
        ("a secret no credential reads", "`NO_SUCH_VARIABLE`"),
        ("sound", "same name"),
        ("a status alone", "give its `error` too"),
        ("a misspelt scope", "`provder` is not a scope"),
        ("an outcome's fields without an outcome", "`action`"),
        ("nothing to compare", "nothing to compare"),
        (
            "an error the policy does not declare",
            "did you mean `model_not_available`?",
        ),
        (
            "a provider the catalog does not have",
            "did you mean `aki-io`?",
        ),
        ("a status with passthrough", "provider's own status"),
        ("nobody asks", "give the case a `key:`"),
        ("a success as an outcome", "which no `on` rule sees"),
        (
            "headers of an outcome without its error",
            "give `error` too",
        ),
        ("headers with passthrough", "are not compared"),
        (
            "a model the catalog does not have",
            "did you mean `qwen3.8-27b`?",
        ),
        (
            "a credential the provider does not have",
            "did you mean `aki-io-platform`?",
        ),
        ("no model after the at sign", "names no model after `@`"),
    ];
    assert_eq!(failures.len(), expected.len(), "{stdout}");
    for ((name, why), (expected_name, expected_why)) in failures.iter().zip(expected) {
        assert_eq!(*name, expected_name, "{stdout}");
        assert!(why.contains(expected_why), "{name}: {why}\n{stdout}");
    }
    assert!(stdout.contains("ok    "), "{stdout}");
    assert!(stdout.ends_with("1 passed, 20 failed\n"), "{stdout}");
    // The note names the errors no case expects, but not the capacity
    // error, which only the proxy answers.
    assert!(
        stdout.contains("no case expects wrong_endpoint_for_model"),
        "{stdout}"
    );
    assert!(!stdout.contains("capacity_exhausted"), "{stdout}");
    assert_eq!(output.status.code(), Some(1));
}

#[test]
fn a_cases_file_not_named_for_its_policy_must_name_it() {
    let cases = "cases:\n  - name: a\n    key: acme-default\n    body: {model: qwen3.8-27b}\n    expect: {attempts: 3}\n";
    let (output, _) = run_cases("unnamed", "cases.yaml", cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("name its policy with `policy:`"),
        "{stdout}"
    );
    assert_eq!(output.status.code(), Some(1));
}

#[test]
fn a_cases_file_whose_policy_is_missing_says_so() {
    let cases = "policy: nothere.policy\ncases:\n  - name: a\n    key: acme-default\n    body: {model: qwen3.8-27b}\n    expect: {attempts: 3}\n";
    let (output, _) = run_cases("missing-policy", "missing.tests.yaml", cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("its policy: `") && stdout.contains("nothere.policy` does not exist"),
        "{stdout}"
    );
    assert_eq!(output.status.code(), Some(1));
}

#[test]
fn a_policy_given_for_its_cases_is_a_usage_error() {
    let output = Command::new(BIN)
        .args(["test", "policies/noirdoc.policy"])
        .current_dir(PACKAGE_ROOT)
        .output()
        .expect("the switchyard binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`noirdoc.tests.yaml`"), "{stderr}");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn a_reader_that_stops_early_does_not_make_it_panic() {
    use std::io::{BufRead, BufReader};
    // More output than a pipe holds, so the writes go on after it closes.
    let mut child = Command::new(BIN)
        .args(["test", "policies/", "policies/", "policies/", "policies/"])
        .current_dir(PACKAGE_ROOT)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the switchyard binary runs");
    // One line, then the pipe closes, as under `| head -1`.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("ok "), "{first}");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
}

/// A key-shaped string, as a user might paste by mistake.
const PASTED_KEY: &str = "sk-proj-AbCdEf1234567890XyZ";

#[test]
fn a_pasted_key_is_never_echoed() {
    let cases = format!(
        "policy: {policy}\ncases:\n  - name: pasted\n    key: {PASTED_KEY}\n    body: {{model: qwen3.8-27b}}\n    expect: {{plan: [aki-io]}}\n  - name: model\n    key: acme-default\n    body: {{model: {PASTED_KEY}}}\n    expect: {{plan: [aki-io]}}\n  - name: named {PASTED_KEY}\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    missing_secrets: [{PASTED_KEY}]\n    expect: {{plan: [{PASTED_KEY}]}}\n  - name: expected error\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    expect: {{error: {PASTED_KEY}}}\n  - name: header\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    outcome: {{attempt: 1, result: \"429\"}}\n    expect: {{pause: {{provider: 10s}}, error: resource_exhausted, headers: {{x-noirdoc-provider: {PASTED_KEY}}}}}\n",
        policy = noirdoc()
    );
    let (output, _) = run_cases("pasted-key", "pasted.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stdout}{stderr}");
    assert!(!stdout.contains(PASTED_KEY), "{stdout}");
    assert!(!stderr.contains(PASTED_KEY), "{stderr}");
    assert!(stdout.contains("sk-*****"), "{stdout}");
    let (json, _) = run_files(
        "pasted-key-json",
        &[("pasted.tests.yaml", &cases)],
        &["--format", "json"],
    );
    let stdout = String::from_utf8_lossy(&json.stdout);
    assert!(!stdout.contains(PASTED_KEY), "{stdout}");
    assert!(stdout.contains("sk-*****"), "{stdout}");

    let dir = std::env::temp_dir().join(format!("switchyard-cli-pasted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let request = dir.join("request.json");
    std::fs::write(&request, format!("{{\"model\": \"{PASTED_KEY}\"}}")).unwrap();
    for who in [
        vec!["--key", PASTED_KEY],
        vec!["--tenant", PASTED_KEY],
        vec!["--key", "acme-default"],
    ] {
        let output = Command::new(BIN)
            .args(["explain", "--policy", &noirdoc(), "--request"])
            .arg(&request)
            .args(&who)
            .current_dir(PACKAGE_ROOT)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!all.contains(PASTED_KEY), "{who:?}: {all}");
        assert!(all.contains("sk-*****"), "{who:?}: {all}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_health_entry_that_names_nothing_fails_its_case() {
    let case = |name: &str, entry: &str| {
        format!(
            "  - name: {name}\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    health: [{entry}]\n    expect: {{plan: [aki-io, scaleway, ionos, together]}}\n"
        )
    };
    let cases = format!(
        "policy: {policy}\ncases:\n{}{}{}{}{}{}{}",
        case(
            "credential",
            "{provider: aki-io, credential: nope, full: true}"
        ),
        case("model", "{provider: aki-io, model: nope, paused_for: 30s}"),
        case(
            "rate",
            "{provider: aki-io, stats: {samples: 40, success_rate: 9}}"
        ),
        case("no state", "{provider: aki-io, penalized: false}"),
        case("no time", "{provider: aki-io, paused_for: 0s}"),
        // Before a later entry for its provider, an entry that sets nothing
        // keeps what it names healthy: here the route the request takes.
        case(
            "carve-out",
            "{provider: aki-io, model: qwen3.8-27b}, {provider: aki-io, penalized: true}"
        ),
        case(
            "sound",
            "{provider: aki-io, credential: aki-io-platform, model: qwen3.8-27b, in_flight: 1}"
        ),
        policy = noirdoc()
    );
    let (output, _) = run_cases("health-names", "health.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains("provider `aki-io` has no credential `nope`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("provider `aki-io` serves no catalog model `nope`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("`stats.success_rate` is a share"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the entry for provider `aki-io` sets no state"),
        "{stdout}"
    );
    assert!(
        stdout.contains("`paused_for: 0s` is a pause that has already ended"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok    ") && stdout.contains(": carve-out"),
        "{stdout}"
    );
    assert!(stdout.contains("2 passed, 5 failed"), "{stdout}");
}

/// One run names every case with a field mistake, each at its place, not
/// only the first; a case that reads well is not reported.
#[test]
fn a_cases_file_with_several_mistakes_names_each() {
    let policy = noirdoc();
    let text = format!(
        "policy: {policy}\ncases:\n\
         \x20 - name: a\n    key: acme-default\n    body: {{model: gpt-5}}\n    expct: {{plan: [x]}}\n\
         \x20 - name: b\n    key: acme-default\n    body: {{model: gpt-5}}\n    expect: {{plan: [x]}}\n\
         \x20 - name: c\n    key: acme-default\n    body:\n      model: gpt-5\n    expect:\n      plan: [x]\n      atempts: 2\n\
         \x20 - name: d\n    kye: acme-default\n"
    );
    let (output, file) = run_cases("several-mistakes", "bad.tests.yaml", &text);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    let file = file.display();
    for said in [
        ":6:5: `expct` is not a field here; did you mean `expect`?",
        ":17:7: `atempts` is not a field here; did you mean `attempts`?",
        ":19:5: `kye` is not a field here; did you mean `key`?",
    ] {
        let expected = format!("FAIL  {file}{said} [E0902]\n");
        assert!(
            stdout.contains(&expected),
            "expected `{expected}` in:\n{stdout}"
        );
    }
    assert_eq!(stdout.matches("FAIL  ").count(), 3, "{stdout}");
    assert!(stdout.contains("0 passed, 3 failed"), "{stdout}");
}

#[test]
fn a_cases_file_that_does_not_read_says_where_and_what_in_its_terms() {
    let policy = noirdoc();
    for (text, said) in [
        (
            format!(
                "policy: {policy}\ncases:\n  - name: a\n    key: acme-default\n    body: {{model: m}}\n    expect: {{plan: aki-io}}\n"
            ),
            ":6:20: expected a list (`[a, b]`, or `- a` lines)",
        ),
        (
            format!(
                "policy: {policy}\ncases:\n  - name: a\n    key: acme-default\n    body: {{model: m}}\n    body: {{model: n}}\n    expect: {{plan: [aki-io]}}\n"
            ),
            ":6:5: duplicate mapping key: body",
        ),
        (
            format!("policy: {policy}\ncases:\n  - name: a\n    kye: acme-default\n"),
            ":4:5: `kye` is not a field here; did you mean `key`?",
        ),
        // A key pasted where a field's name goes is masked.
        (
            format!("policy: {policy}\ncases:\n  - name: a\n    {PASTED_KEY}: 1\n"),
            ":4:5: `sk-************************` is not a field here",
        ),
    ] {
        let (output, file) = run_cases("unreadable-cases", "bad.tests.yaml", &text);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "{stdout}");
        let expected = format!("FAIL  {}{said}", file.display());
        assert!(
            stdout.contains(&expected),
            "expected `{expected}` in:\n{stdout}"
        );
        assert!(!stdout.contains("DuplicateKeyPolicy"), "{stdout}");
        assert!(!stdout.contains(PASTED_KEY), "{stdout}");
    }
}

/// What `switchyard explain` prints on standard output for `policy`'s
/// request for `model` by `key`, with `more` arguments.
fn explain_output(policy: &str, key: &str, model: &str, more: &[&str]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-cli-explain-{policy}-{key}-{model}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let request = dir.join("request.json");
    std::fs::write(&request, format!("{{\"model\": \"{model}\"}}")).unwrap();
    let output = Command::new(BIN)
        .args(["explain", "--policy"])
        .arg(format!("{PACKAGE_ROOT}/policies/{policy}.policy"))
        .args(["--key", key, "--request"])
        .arg(&request)
        .args(more)
        .current_dir(PACKAGE_ROOT)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(output.status.success(), "{output:?}");
    output.stdout
}

/// `switchyard explain` of a qwen3.8-27b request by `acme-default` under
/// the shipped Noirdoc policy as `edit` changes it; its standard output.
fn explain_edited_noirdoc(name: &str, edit: impl Fn(&str) -> String) -> String {
    let [output] = explain_edited_noirdoc_for(name, edit, [r#"{"model": "qwen3.8-27b"}"#]);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}");
    stdout
}

/// `switchyard explain` of each request body by `acme-default` under the
/// shipped Noirdoc policy as `edit` changes it.
fn explain_edited_noirdoc_for<const N: usize>(
    name: &str,
    edit: impl Fn(&str) -> String,
    bodies: [&str; N],
) -> [Output; N] {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-cli-explain-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let shipped = std::fs::read_to_string(noirdoc())
        .unwrap()
        .replace("\"noirdoc/", &format!("\"{PACKAGE_ROOT}/policies/noirdoc/"));
    let edited = edit(&shipped);
    assert_ne!(edited, shipped, "the edit changed nothing");
    let policy = dir.join("edited.policy");
    std::fs::write(&policy, edited).unwrap();
    let request = dir.join("request.json");
    let outputs = bodies.map(|body| {
        std::fs::write(&request, body).unwrap();
        Command::new(BIN)
            .arg("explain")
            .arg("--policy")
            .arg(&policy)
            .args(["--key", "acme-default", "--request"])
            .arg(&request)
            .output()
            .unwrap()
    });
    std::fs::remove_dir_all(&dir).unwrap();
    outputs
}

/// A plan names each candidate as precisely as it takes to tell them
/// apart: ngrok's tries two OpenAI keys for gpt-4o, then a fallback model
/// at a reseller that served gpt-4o too; Noirdoc's one provider needs no
/// more than its id. A case that expected a refusal shows the plan it got
/// the same way.
#[test]
fn plans_name_the_credential_and_model_that_tell_candidates_apart() {
    let stdout =
        String::from_utf8(explain_output("ngrok", "sk-ngrok-tunnelco", "gpt-4o", &[])).unwrap();
    assert!(
        stdout.contains(
            "plan   openai/openai-primary@gpt-4o -> openai/openai-secondary@gpt-4o -> \
             openrouter/openrouter-primary@gpt-4o -> openrouter/openrouter-primary@claude-sonnet-4-5 "
        ),
        "{stdout}"
    );
    let json: serde_json::Value = serde_json::from_slice(&explain_output(
        "ngrok",
        "sk-ngrok-tunnelco",
        "gpt-4o",
        &["--format", "json"],
    ))
    .unwrap();
    assert_eq!(
        json["result"]["plan_entries"],
        serde_json::json!([
            "openai/openai-primary@gpt-4o",
            "openai/openai-secondary@gpt-4o",
            "openrouter/openrouter-primary@gpt-4o",
            "openrouter/openrouter-primary@claude-sonnet-4-5"
        ])
    );
    let stdout =
        String::from_utf8(explain_output("noirdoc", "sk-noirdoc-acme", "gpt-5", &[])).unwrap();
    assert!(stdout.contains("plan   acme-openai (at most"), "{stdout}");

    let cases = format!(
        "policy: {PACKAGE_ROOT}/policies/ngrok.policy\ncases:\n  - name: refused\n    key: tunnelco-default\n    body: {{model: gpt-4o}}\n    expect: {{error: ERR_NGROK_3804}}\n"
    );
    let (output, _) = run_cases("refused-plan", "refused.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(
            "expected error `ERR_NGROK_3804`, got a plan of 4 candidates: [openai/openai-primary@gpt-4o, "
        ),
        "{stdout}"
    );
}

/// The sort keys `explain` lists say where absent values go, when a key
/// puts them first.
#[test]
fn explain_lists_a_keys_nulls_first() {
    let stdout = explain_edited_noirdoc("nulls", |policy| {
        policy.replace("  by weighted_price  ", "  by weighted_price nulls first  ")
    });
    assert!(stdout.contains(" weighted_price nulls first\n"), "{stdout}");
    assert!(stdout.contains(" provider.priority desc\n"), "{stdout}");
}

/// `keep` may pass a candidate over: `explain` then says which are tried
/// if each attempt fails. Noirdoc never goes from a priced provider to the
/// unpriced `together`, so a fourth attempt is never made.
#[test]
fn explain_says_which_candidates_keep_lets_be_tried() {
    let stdout = explain_edited_noirdoc("keep", |policy| {
        policy.replace("  attempts 3\n", "  attempts 4\n")
    });
    assert!(
        stdout.contains("plan   aki-io -> scaleway -> ionos -> together (at most 4 attempts)\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("       tried if each fails: aki-io -> scaleway -> ionos\n"),
        "{stdout}"
    );
    // A paused candidate is passed over, as the proxy passes it over.
    let (output, _) = explain_qwen_with_health("paused", "- {provider: aki-io, paused_for: 30s}\n");
    let paused = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{paused}");
    assert!(
        paused.contains("       tried if each fails: scaleway -> ionos\n"),
        "{paused}"
    );

    // Where the plan's first attempts are the ones made, nothing is added.
    let shipped = explain_output("noirdoc", "acme-default", "gpt-5", &[]);
    let shipped = String::from_utf8_lossy(&shipped);
    assert!(!shipped.contains("tried if each fails"), "{shipped}");
}

/// `explain` of `body` under a shipped policy, with `health` (a health
/// file's text) if given, as text and as JSON.
fn explain_both(
    label: &str,
    policy: &str,
    key: &str,
    body: &str,
    health: Option<&str>,
) -> (String, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-cli-explain-{label}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let request = dir.join("request.json");
    std::fs::write(&request, body).unwrap();
    let health_file = dir.join("health.yaml");
    if let Some(health) = health {
        std::fs::write(&health_file, health).unwrap();
    }
    let explain = |more: &[&str]| {
        let mut command = Command::new(BIN);
        command
            .args(["explain", "--policy", policy, "--key", key, "--seed", "2"])
            .arg("--request")
            .arg(&request);
        if health.is_some() {
            command.arg("--health").arg(&health_file);
        }
        let output = command
            .args(more)
            .current_dir(PACKAGE_ROOT)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let text = explain(&[]);
    let json = serde_json::from_str(&explain(&["--format", "json"])).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (text, json)
}

#[test]
fn explain_says_when_reorder_moved_the_candidates_after_the_first() {
    // gpt-oss-120b: together is cheapest, then failover by priority first.
    let (text, json) = explain_both(
        "reorder",
        "policies/noirdoc.policy",
        "acme-default",
        r#"{"model": "gpt-oss-120b", "messages": []}"#,
        None,
    );
    let line = json["result"]["reordered_by"]["line"]
        .as_u64()
        .expect("reordered");
    let source = json["result"]["reordered_by"]["source"].as_str().unwrap();
    assert!(
        source.starts_with("reorder by priced desc, provider.priority"),
        "{source}"
    );
    assert!(
        text.contains(&format!(
            "after the first, reordered by line {line}: {source}"
        )),
        "{text}"
    );
    // qwen3.8-27b: the sort's order is already the reorder's.
    let (text, json) = explain_both(
        "no-reorder",
        "policies/noirdoc.policy",
        "acme-default",
        r#"{"model": "qwen3.8-27b", "messages": []}"#,
        None,
    );
    assert!(json["result"]["reordered_by"].is_null(), "{json}");
    assert!(!text.contains("reordered by"), "{text}");
}

#[test]
fn explain_says_what_happens_when_every_candidate_is_paused() {
    let (text, json) = explain_both(
        "all-paused",
        "policies/noirdoc.policy",
        "acme-default",
        r#"{"model": "qwen3.8-27b", "messages": []}"#,
        Some(
            "- {provider: aki-io, paused_for: 30s}\n- {provider: scaleway, paused_for: 30s}\n\
             - {provider: ionos, paused_for: 30s}\n- {provider: together, paused_for: 30s}\n",
        ),
    );
    assert!(
        text.contains("tried if each fails: none now, every candidate is paused"),
        "{text}"
    );
    assert_eq!(json["result"]["tried_if_each_fails"], serde_json::json!([]));
}

#[test]
fn explain_says_which_balance_statement_reshuffled_the_plan() {
    let (text, json) = explain_both(
        "balance",
        "policies/anonrouter.policy",
        "lumen-default",
        r#"{"model": "deepseek/deepseek-v3.2", "messages": []}"#,
        None,
    );
    let line = json["result"]["reshuffled_by"]["line"]
        .as_u64()
        .expect("reshuffled");
    let source = json["result"]["reshuffled_by"]["source"].as_str().unwrap();
    assert!(source.starts_with("balance share by score"), "{source}");
    assert!(
        text.contains(&format!("reshuffled by line {line}: {source}")),
        "{text}"
    );
    // The sort keys in JSON are those the text lists, one for each of a
    // candidate's key values, each with its line and expression.
    let sort_keys = json["sort_keys"].as_array().unwrap();
    let kept = json["candidates"].as_array().unwrap().iter();
    for candidate in kept.filter(|c| c["removed_by_step"].is_null()) {
        assert_eq!(
            candidate["keys"].as_array().unwrap().len(),
            sort_keys.len(),
            "{json}"
        );
    }
    for key in sort_keys {
        let (line, source) = (
            key["line"].as_u64().unwrap(),
            key["source"].as_str().unwrap(),
        );
        assert!(
            text.contains(&format!("line {line:<4} {source}")),
            "{key}\n{text}"
        );
    }
    let sorts: Vec<&str> = sort_keys
        .iter()
        .filter_map(|key| key["sort"].as_str())
        .collect();
    assert!(
        !sorts.is_empty() && sorts.iter().all(|sort| *sort == "default"),
        "{sorts:?}"
    );
    assert!(text.contains("(sort default)"), "{text}");
}

#[test]
fn a_health_entry_that_names_nothing_is_shown_at_its_place() {
    let (output, health) = explain_qwen_with_health(
        "health-entry",
        "- provider: aki-io\n  paused_for: 30s\n- provider: nosuch\n  penalized: true\n",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:3:3: no provider has the id `nosuch`",
            health.display()
        )),
        "{stderr}"
    );

    // In a case, which of its entries is meant.
    let cases = format!(
        "policy: {policy}\ncases:\n  - name: health\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    \
         health: [{{provider: aki-io, penalized: true}}, {{provider: aki-io, paused_for: 30}}]\n    \
         expect: {{attempts: 3}}\n",
        policy = noirdoc()
    );
    let (output, file) = run_cases("health-entry", "health.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!(
            "FAIL  {}:6:51: health: `paused_for: 30` is not a duration",
            file.display()
        )),
        "{stdout}"
    );

    // A misspelt provider is named with the one meant, at its entry.
    let cases = format!(
        "policy: {policy}\ncases:\n  - name: health\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    \
         health:\n      - {{provider: aki-io, penalized: true}}\n      - {{provider: aki_io, full: true}}\n    \
         expect: {{attempts: 3}}\n",
        policy = noirdoc()
    );
    let (output, file) = run_cases("health-entry-typo", "health.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!(
            "FAIL  {}:8:9: health: no provider has the id `aki_io`; did you mean `aki-io`? [E0903]\n",
            file.display()
        )),
        "{stdout}"
    );
}

/// `switchyard explain` of a qwen3.8-27b request by `acme-default` under
/// the shipped Noirdoc policy with `health` as its `--health` file; its
/// output and where that file was (removed by then).
fn explain_qwen_with_health(name: &str, health: &str) -> (Output, PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-cli-explain-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (request, health_file) = (dir.join("request.json"), dir.join("health.yaml"));
    std::fs::write(&request, "{\"model\": \"qwen3.8-27b\"}").unwrap();
    std::fs::write(&health_file, health).unwrap();
    let output = Command::new(BIN)
        .args(["explain", "--policy"])
        .arg(noirdoc())
        .args(["--key", "acme-default", "--request"])
        .arg(&request)
        .arg("--health")
        .arg(&health_file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (output, health_file)
}

/// `switchyard explain --format json` for a Noirdoc request.
fn explain_json(key: &str, model: &str) -> serde_json::Value {
    serde_json::from_slice(&explain_output(
        "noirdoc",
        key,
        model,
        &["--format", "json"],
    ))
    .unwrap()
}

/// Each candidate's provider and the step (1-based) that removed it.
fn removed_by(explained: &serde_json::Value) -> Vec<(String, Option<u64>)> {
    let mut removed: Vec<(String, Option<u64>)> = explained["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["provider"].as_str().unwrap().to_string(),
                c["removed_by_step"].as_u64(),
            )
        })
        .collect();
    removed.sort();
    removed
}

/// Each step's (kept, removed) counts.
fn step_counts(explained: &serde_json::Value) -> Vec<(u64, u64)> {
    explained["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["kept"].as_u64().unwrap(), s["removed"].as_u64().unwrap()))
        .collect()
}

#[test]
fn explain_names_the_step_that_removed_each_candidate() {
    // A key whose data must stay in Germany or France, without the CLOUD
    // Act: step 5 (the key's provider restrictions) removes together.ai;
    // step 1 (`prefer exclusively own`) finds no own credential and keeps
    // everything.
    let explained = explain_json("acme-eu-only", "qwen3.8-27b");
    assert_eq!(
        removed_by(&explained),
        [
            (String::from("aki-io"), None),
            (String::from("ionos"), None),
            (String::from("scaleway"), None),
            (String::from("together"), Some(5)),
        ]
    );
    assert_eq!(
        step_counts(&explained),
        [(4, 0), (4, 0), (4, 0), (4, 0), (3, 1), (3, 0), (3, 0)]
    );
    assert_eq!(
        explained["result"]["plan"],
        serde_json::json!(["aki-io", "scaleway", "ionos"])
    );
    // Positions count from 1, as the text's `#1` and the steps do.
    let positions: Vec<_> = explained["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["provider"].clone(), c["position"].clone()))
        .collect();
    assert_eq!(
        positions,
        [
            (serde_json::json!("aki-io"), serde_json::json!(1)),
            (serde_json::json!("ionos"), serde_json::json!(3)),
            (serde_json::json!("scaleway"), serde_json::json!(2)),
            (serde_json::json!("together"), serde_json::json!(null)),
        ]
    );
    // Each candidate's `keys` are the sort keys listed, as the text names them.
    let sort_keys = explained["sort_keys"].as_array().unwrap();
    let keys = explained["candidates"][0]["keys"].as_array().unwrap();
    assert!(!sort_keys.is_empty());
    assert_eq!(sort_keys.len(), keys.len(), "{explained}");
    for key in sort_keys {
        assert!(key["line"].as_u64().is_some(), "{key}");
        assert!(!key["source"].as_str().unwrap().is_empty(), "{key}");
    }
    assert_eq!(
        explained["result"]["reshuffled_by"],
        serde_json::Value::Null
    );

    // The organisation's own OpenAI credential: step 1 keeps it alone.
    let explained = explain_json("acme-default", "gpt-5");
    assert_eq!(
        removed_by(&explained),
        [
            (String::from("acme-openai"), None),
            (String::from("openai"), Some(1)),
        ]
    );
    assert_eq!(step_counts(&explained)[0], (1, 1));
    // Noirdoc plans from the caller, model and endpoint alone.
    assert_eq!(
        explained["plans"],
        serde_json::json!({"remembered": true, "made_afresh_by": null})
    );
}

/// What `switchyard explain` prints for `policy`'s request.
fn explain_text(policy: &str, key: &str, model: &str) -> String {
    String::from_utf8(explain_output(policy, key, model, &[])).unwrap()
}

fn explain_plans_line(policy: &str, key: &str, model: &str) -> String {
    let text = explain_text(policy, key, model);
    text.trim_end().lines().last().unwrap().to_string()
}

#[test]
fn explain_says_which_plans_are_decided_every_time() {
    assert_eq!(
        explain_plans_line("noirdoc", "acme-default", "qwen3.8-27b"),
        "plans  made once per caller, model, endpoint and input values, then reused \
         (refusals are decided every time)"
    );
    // ai-setu balances some plans: those draw on the request's seed.
    assert_eq!(
        explain_plans_line("ai-setu", "globex-default", "gpt-4.1"),
        "plans  made once per caller, model, endpoint and input values, then reused \
         (refusals, and plans a balance reorders, are decided every time)"
    );
    // AnonRouter's plans read each request's parameters: the line named is
    // the one that reads them, not the first line of its step.
    let reader = "or subset(request.parameters, route.capabilities)";
    let policy =
        std::fs::read_to_string(format!("{PACKAGE_ROOT}/policies/anonrouter.policy")).unwrap();
    let line = 1 + policy.lines().position(|l| l.trim() == reader).unwrap();
    assert_eq!(
        explain_plans_line("anonrouter", "lumen-default", "deepseek/deepseek-v3.2"),
        format!(
            "plans  made for every request: line {line} reads more than the caller, model, \
             endpoint and inputs: {reader}"
        )
    );
}

#[test]
fn explain_suggests_the_key_id_meant() {
    let output = Command::new(BIN)
        .args(["explain", "--policy", &noirdoc()])
        .args(["--request", "docs/examples/request.json"])
        .args(["--key", "acme-defualt"])
        .current_dir(PACKAGE_ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("did you mean `acme-default`?"), "{stderr}");
}

#[test]
fn explain_names_the_validate_rule_that_refused() {
    let rule = "reject tenant.credits <= 0 error ERR_NGROK_3807";
    let policy = std::fs::read_to_string(format!("{PACKAGE_ROOT}/policies/ngrok.policy")).unwrap();
    let line = 1 + policy.lines().position(|l| l.trim() == rule).unwrap();
    let text = explain_text("ngrok", "brokeco-default", "gpt-4o");
    assert!(
        text.contains(&format!("       by line {line}: {rule}\n")),
        "{text}"
    );
}

#[test]
fn explain_shows_a_step_written_over_several_lines_whole() {
    // Noirdoc's step 5 removes together.ai for its residency, written on
    // the step's second line: the first line alone would blame the key's
    // allowed providers.
    let text = explain_text("noirdoc", "acme-eu-only", "qwen3.8-27b");
    let step: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("  5. line "))
        .take(5)
        .map(str::trim)
        .collect();
    assert_eq!(
        step,
        [
            "5. line 65   require (empty(key.allowed_providers) or provider.name in key.allowed_providers)",
            "and (empty(key.residency) or provider.region in key.residency)",
            "and (key.no_cloud_act implies not provider.cloud_act)",
            "and (key.require_s203 implies provider.s203_approved)",
            "else provider_not_allowed_for_key  (kept 3, removed 1)",
        ],
        "{text}"
    );
    // The JSON holds the same step whole.
    let explained = explain_json("acme-eu-only", "qwen3.8-27b");
    assert_eq!(
        explained["steps"][4]["source"],
        "require (empty(key.allowed_providers) or provider.name in key.allowed_providers)\n\
         and (empty(key.residency) or provider.region in key.residency)\n\
         and (key.no_cloud_act implies not provider.cloud_act)\n\
         and (key.require_s203 implies provider.s203_approved)\n\
         else provider_not_allowed_for_key",
        "{explained}"
    );
}

#[test]
fn a_plan_of_providers_at_models_may_name_models_with_a_slash() {
    let policy = format!("{PACKAGE_ROOT}/policies/anonrouter.policy");
    let cases = format!(
        "policy: {policy}\ncases:\n  - name: models with a slash\n    key: lumen-default\n    \
         body: {{model: deepseek/deepseek-v3.2, messages: [{{role: user, content: Hi}}]}}\n    \
         expect:\n      plan: [tinfoil@deepseek/deepseek-v3.2, venice@deepseek/deepseek-v3.2, \
         near-ai-us@deepseek/deepseek-v3.2, deepinfra@deepseek/deepseek-v3.2]\n"
    );
    let (output, _) = run_cases("slash-models", "slash.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
}

#[test]
fn a_cases_file_without_cases_fails() {
    let cases = format!("policy: {}\ncases: []\n", noirdoc());
    let (output, file) = run_cases("no-cases", "empty.tests.yaml", &cases);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("FAIL  {}: it holds no cases", file.display())),
        "{stdout}"
    );
    assert!(stdout.contains("0 passed, 1 failed"), "{stdout}");
}

/// `--filter` runs the cases whose name holds its text (ignoring case); one
/// that matches nothing tested nothing, and is a usage error.
#[test]
fn a_filter_runs_the_cases_it_names_and_matching_none_is_an_error() {
    let run = |filter: &str| {
        Command::new(BIN)
            .args(["test", "policies/", "--filter", filter])
            .current_dir(PACKAGE_ROOT)
            .output()
            .expect("the switchyard binary runs")
    };
    let some = run("failover: n33");
    let stdout = String::from_utf8_lossy(&some.stdout);
    assert_eq!(some.status.code(), Some(0), "{stdout}");
    assert_eq!(stdout.matches("ok    ").count(), 1, "{stdout}");
    assert!(stdout.contains("1 passed, 0 failed, "), "{stdout}");
    assert!(stdout.contains(" filtered out"), "{stdout}");
    assert!(!stdout.contains("note  "), "{stdout}");
    let none = run("no case is named like this");
    assert_eq!(none.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no case's name holds the filter's text")
    );
}

#[test]
fn a_cases_file_named_twice_runs_once() {
    let file = format!("{PACKAGE_ROOT}/policies/noeta.tests.yaml");
    let once = Command::new(BIN)
        .args(["test", &file])
        .current_dir(PACKAGE_ROOT)
        .output()
        .unwrap();
    let twice = Command::new(BIN)
        .args(["test", &file, "policies/noeta.tests.yaml"])
        .current_dir(PACKAGE_ROOT)
        .output()
        .unwrap();
    let summary = |output: &Output| {
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        stdout.trim_end().lines().last().unwrap().to_string()
    };
    assert!(once.status.success() && twice.status.success());
    assert_eq!(summary(&once), summary(&twice));
}

/// A header whose value HTTP cannot carry (here a line break from the
/// body) is left out by the proxy; `explain` and `test` compute headers the
/// same way, so they leave it out too instead of showing what is not sent.
#[test]
fn explain_leaves_out_a_header_value_http_cannot_carry() {
    let bodies = ["one line", "two\nlines", "\u{1b}[2J"]
        .map(|note| serde_json::json!({"model": "no-such-model", "note": note}).to_string());
    let [plain, broken, escape] = explain_edited_noirdoc_for(
        "header",
        |policy| {
            policy.replace(
                "headers {\n",
                "input note from body \"note\" : string\n  malformed error model_not_available\n\
                 headers {\n  \"x-note\" = input.note\n",
            )
        },
        bodies.each_ref().map(String::as_str),
    )
    .map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
    assert!(plain.contains("       x-note: one line\n"), "{plain}");
    assert!(broken.contains("error  "), "{broken}");
    assert!(!broken.contains("x-note"), "{broken}");
    // The input itself is shown on one line, its line break escaped, as
    // is a terminal escape.
    assert!(broken.contains("input  note = two\\nlines\n"), "{broken}");
    assert!(escape.contains("input  note = \\u{1b}[2J\n"), "{escape}");
    assert!(!escape.contains('\u{1b}'), "{escape}");
}

/// The one JSON document `switchyard test --format json` printed.
fn json_of(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "not one JSON document ({error}):\n{}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// `switchyard test --format json` on `files`, as [`run_files`] runs them,
/// the text output of the same run without `--format json`, and the paths.
fn json_and_text(name: &str, files: &[(&str, &str)]) -> (Output, String, Vec<PathBuf>) {
    let (output, paths) = run_files(name, files, &["--format", "json"]);
    let (text, _) = run_files(name, files, &[]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    (output, text, paths)
}

/// `switchyard test ARGS` in the package's directory.
fn run_test(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("test")
        .args(args)
        .current_dir(PACKAGE_ROOT)
        .output()
        .expect("the switchyard binary runs")
}

/// The members `line` and `column` of a case or a problem.
fn place(item: &serde_json::Value) -> (u64, u64) {
    (
        item["line"].as_u64().unwrap(),
        item["column"].as_u64().unwrap(),
    )
}

#[test]
fn json_gives_each_case_of_a_passing_file_and_the_counts() {
    let file = "policies/noeta.tests.yaml";
    let output = run_test(&[file, "--format", "json"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(output.stderr.is_empty(), "{output:?}");
    let document = json_of(&output);
    let files = document["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    let tested = &files[0];
    assert_eq!(tested["file"], file);
    assert_eq!(tested["policy"], "policies/noeta.policy");
    assert_eq!(tested["problems"], serde_json::json!([]));
    assert_eq!(tested["diagnostics"], serde_json::json!([]));
    // Every error of the policy is expected by a case: the text has no note.
    assert_eq!(tested["errors_no_case_expects"], serde_json::json!([]));
    let text = String::from_utf8_lossy(&run_test(&[file]).stdout).to_string();
    let cases = tested["cases"].as_array().unwrap();
    assert_eq!(cases.len(), text.matches("ok    ").count(), "{text}");
    let mut previous_line = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        assert!(text.contains(&format!("ok    {file}: {name}\n")), "{name}");
        assert_eq!(case["status"], "passed", "{case}");
        assert_eq!(case["file"], file);
        let (line, column) = place(case);
        assert!(line > previous_line && column > 0, "{case}");
        previous_line = line;
        assert_eq!(case["differences"], serde_json::json!([]));
        assert_eq!(case["problem"], serde_json::Value::Null);
    }
    let counts = serde_json::json!({"passed": cases.len(), "failed": 0, "filtered_out": 0});
    for counted in [tested, &document] {
        for member in ["passed", "failed", "filtered_out"] {
            assert_eq!(counted[member], counts[member], "{member}");
        }
    }
}

#[test]
fn json_gives_what_a_failing_case_expected_and_what_it_got() {
    let cases = format!(
        r#"policy: {policy}
cases:
  - name: a wrong plan
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [scaleway, aki-io], attempts: 2}}
  - name: a wrong answer to a 429
    key: acme-default
    body: {{model: qwen3.8-27b}}
    outcome: {{attempt: 1, result: "429"}}
    expect:
      pause: {{provider: 30s}}
      error: resource_exhausted
      status: 503
      headers: {{x-noirdoc-provider: scaleway, x-should-retry: "false"}}
  - name: a right plan
    key: acme-default
    body: {{model: qwen3.8-27b}}
    expect: {{plan: [aki-io, scaleway, ionos, together]}}
"#,
        policy = noirdoc()
    );
    let files = [("failing.tests.yaml", cases.as_str())];
    let (output, text, paths) = json_and_text("json-failing", &files);
    assert_eq!(output.status.code(), Some(1));
    let document = json_of(&output);
    let cases = document["files"][0]["cases"].as_array().unwrap();
    let statuses: Vec<&str> = cases
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["failed", "failed", "passed"]);
    let differences = |case: &serde_json::Value| {
        case["differences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["field"].clone(),
                    d["expected"].clone(),
                    d["actual"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    use serde_json::json;
    assert_eq!(
        differences(&cases[0]),
        [
            (
                json!("plan"),
                json!(["scaleway", "aki-io"]),
                json!(["aki-io", "scaleway", "ionos", "together"])
            ),
            (json!("attempts"), json!(2), json!(3)),
        ]
    );
    assert_eq!(
        differences(&cases[1]),
        [
            (
                json!("pause"),
                json!({"provider": "30s"}),
                json!({"provider": "10s"})
            ),
            (json!("status"), json!(503), json!(429)),
            (
                json!("headers"),
                json!({"x-noirdoc-provider": "scaleway"}),
                json!({"x-noirdoc-provider": "aki-io"})
            ),
            (
                json!("headers"),
                json!({"x-should-retry": "false"}),
                json!({"x-should-retry": null})
            ),
        ]
    );
    // Each difference says what the text says, below its case's line.
    let file = paths[0].display();
    for case in &cases[..2] {
        let mut shown = format!("FAIL  {file}: {}\n", case["name"].as_str().unwrap());
        for difference in case["differences"].as_array().unwrap() {
            for line in difference["message"].as_str().unwrap().lines() {
                shown.push_str(&format!("        {line}\n"));
            }
        }
        assert!(text.contains(&shown), "expected `{shown}` in:\n{text}");
    }
    assert_eq!(
        (&document["passed"], &document["failed"]),
        (&json!(1), &json!(2))
    );
}

#[test]
fn json_gives_a_case_that_cannot_run_its_code_and_place() {
    let cases = format!(
        "policy: {policy}\ncases:\n\
         \x20 - name: a misspelt provider\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    \
         health: [{{provider: aki_io, full: true}}]\n    expect: {{plan: [aki-io]}}\n\
         \x20 - name: a misspelt provider\n    key: acme-default\n    body: {{model: qwen3.8-27b}}\n    \
         expect: {{plan: [aki-io]}}\n",
        policy = noirdoc()
    );
    let files = [("invalid.tests.yaml", cases.as_str())];
    let (output, text, paths) = json_and_text("json-invalid", &files);
    assert_eq!(output.status.code(), Some(1));
    let document = json_of(&output);
    let cases = document["files"][0]["cases"].as_array().unwrap();
    // The health entry at fault, then the case itself for its name.
    for (case, at, problem_at) in [(&cases[0], (3, 5), (6, 14)), (&cases[1], (8, 5), (8, 5))] {
        assert_eq!(case["status"], "invalid", "{case}");
        assert_eq!(case["differences"], serde_json::json!([]));
        assert_eq!(place(case), at, "{case}");
        let problem = &case["problem"];
        assert_eq!(problem["code"], "E0903");
        assert_eq!(place(problem), problem_at, "{problem}");
        let shown = format!(
            "FAIL  {}:{}:{}: {}: {} [E0903]\n",
            problem["file"].as_str().unwrap(),
            problem_at.0,
            problem_at.1,
            case["name"].as_str().unwrap(),
            problem["message"].as_str().unwrap()
        );
        assert!(text.contains(&shown), "expected `{shown}` in:\n{text}");
    }
    assert_eq!(
        cases[0]["problem"]["message"],
        "no provider has the id `aki_io`; did you mean `aki-io`?"
    );
    assert_eq!(cases[0]["problem"]["file"], paths[0].display().to_string());
    assert_eq!(document["failed"], 2);
}

#[test]
fn json_gives_a_files_problems_with_their_code_and_place() {
    let policy = noirdoc();
    let misspelt = format!("policy: {policy}\ncases:\n  - name: a\n    kye: acme-default\n");
    let case =
        "  - name: a\n    key: acme-default\n    body: {model: m}\n    expect: {attempts: 1}\n";
    let missing = format!(
        "policy: nothere.policy\ncases:\n{case}{}",
        case.replace("a\n", "b\n")
    );
    let broken = format!("cases:\n{case}");
    let files = [
        ("misspelt.tests.yaml", misspelt.as_str()),
        ("missing.tests.yaml", missing.as_str()),
        ("broken.tests.yaml", broken.as_str()),
        ("broken.policy", "providers: [\n"),
    ];
    let (output, paths) = run_files("json-file-problems", &files, &["--format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let document = json_of(&output);
    let tested = document["files"].as_array().unwrap();
    assert_eq!(tested.len(), 3);
    let [misspelt, missing, broken] = [&tested[0], &tested[1], &tested[2]];
    let problem = &misspelt["problems"][0];
    assert_eq!(problem["code"], "E0902");
    assert_eq!(
        problem["message"],
        "`kye` is not a field here; did you mean `key`?"
    );
    assert_eq!(problem["file"], paths[0].display().to_string());
    assert_eq!(place(problem), (4, 5));
    assert_eq!(misspelt["policy"], serde_json::Value::Null);
    assert_eq!(misspelt["cases"], serde_json::json!([]));
    assert_eq!(misspelt["failed"], 1);
    // A policy its cases cannot run against fails each of them.
    let problem = &missing["problems"][0];
    assert_eq!(problem["code"], "E0902");
    assert!(
        problem["message"]
            .as_str()
            .unwrap()
            .contains("nothere.policy` does not exist"),
        "{problem}"
    );
    assert_eq!(
        (&problem["line"], &problem["column"]),
        (&serde_json::Value::Null, &serde_json::Value::Null)
    );
    assert!(
        missing["policy"]
            .as_str()
            .unwrap()
            .ends_with("nothere.policy")
    );
    assert_eq!(missing["failed"], 2);
    // A policy that does not check: its diagnostics as `check --format
    // json` gives them, which say why; the problem has no code of its own.
    assert_eq!(broken["problems"][0]["code"], serde_json::Value::Null);
    let diagnostics = broken["diagnostics"].as_array().unwrap();
    assert!(!diagnostics.is_empty(), "{broken}");
    // The policy again where it was, for `check` to name it the same.
    std::fs::create_dir_all(paths[3].parent().unwrap()).unwrap();
    std::fs::write(&paths[3], files[3].1).unwrap();
    let check = Command::new(BIN)
        .args(["check", "--format", "json"])
        .arg(&paths[3])
        .output()
        .unwrap();
    std::fs::remove_dir_all(paths[3].parent().unwrap()).unwrap();
    assert_eq!(broken["diagnostics"], json_of(&check));
    assert!(output.stderr.is_empty(), "{output:?}");
    assert_eq!(document["failed"], 4);
}

#[test]
fn json_counts_the_cases_a_filter_leaves_out() {
    let filter = "failover: n33";
    let output = run_test(&["policies/", "--filter", filter, "--format", "json"]);
    assert_eq!(output.status.code(), Some(0));
    let document = json_of(&output);
    let files = document["files"].as_array().unwrap();
    let cases: Vec<&serde_json::Value> = files
        .iter()
        .flat_map(|file| file["cases"].as_array().unwrap())
        .collect();
    assert_eq!(cases.len(), 1, "{cases:?}");
    let name = cases[0]["name"].as_str().unwrap().to_lowercase();
    assert!(name.contains(filter), "{name}");
    // The cases left out may expect the errors: no file says which none do.
    for file in files {
        assert_eq!(file["errors_no_case_expects"], serde_json::Value::Null);
    }
    let left_out: u64 = files
        .iter()
        .map(|file| file["filtered_out"].as_u64().unwrap())
        .sum();
    assert!(left_out > 400, "{left_out}");
    assert_eq!(
        (
            &document["passed"],
            &document["failed"],
            &document["filtered_out"]
        ),
        (&1.into(), &0.into(), &left_out.into())
    );
    let text = run_test(&["policies/", "--filter", filter]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.ends_with(&format!("1 passed, 0 failed, {left_out} filtered out\n")),
        "{text}"
    );
}

/// Usage errors stay text on standard error, with nothing on standard
/// output, as `check --format json` leaves them.
#[test]
fn json_leaves_usage_errors_to_standard_error() {
    for (args, said) in [
        (
            &["policies/", "--filter", "no case is named like this"][..],
            "no case's name holds the filter's text",
        ),
        (&["policies/nothere.tests.yaml"][..], "does not exist"),
        (&["policies/noirdoc.policy"][..], "`noirdoc.tests.yaml`"),
    ] {
        let output = run_test(&[args, &["--format", "json"]].concat());
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("error: ") && stderr.contains(said),
            "{stderr}"
        );
    }
}

/// docs/testing.md names every member of `test --format json`, as found in
/// a run with a case of each status and a file that does not read.
#[test]
fn docs_testing_md_names_every_member_of_the_json() {
    fn members(value: &serde_json::Value, names: &mut std::collections::BTreeSet<String>) {
        match value {
            serde_json::Value::Object(object) => {
                for (name, member) in object {
                    names.insert(name.clone());
                    // What a difference compares is the case's own data,
                    // and diagnostics are `check`'s, documented with it.
                    if !["expected", "actual", "diagnostics"].contains(&name.as_str()) {
                        members(member, names);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| members(item, names)),
            _ => {}
        }
    }
    let case = "    key: acme-default\n    body: {model: qwen3.8-27b}\n";
    let cases = format!(
        "policy: {}\ncases:\n  - name: passes\n{case}    expect: {{attempts: 3}}\n  \
         - name: fails\n{case}    expect: {{attempts: 2}}\n  - name: \"\"\n{case}    expect: {{attempts: 3}}\n",
        noirdoc()
    );
    let files = [
        ("each.tests.yaml", cases.as_str()),
        ("unread.tests.yaml", "cases: [\n"),
    ];
    let (output, _) = run_files("json-members", &files, &["--format", "json"]);
    let mut names = std::collections::BTreeSet::new();
    members(&json_of(&output), &mut names);
    let doc = std::fs::read_to_string(format!("{PACKAGE_ROOT}/docs/testing.md")).unwrap();
    let section = doc
        .split("## `test --format json`")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap();
    // Its words, without the example, which holds every member anyway.
    let prose = section.split("```json").next().unwrap();
    let words: std::collections::BTreeSet<&str> = prose
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect();
    let undocumented: Vec<&String> = names
        .iter()
        .filter(|name| !words.contains(name.as_str()))
        .collect();
    assert!(undocumented.is_empty(), "{undocumented:?}");
    assert!(names.len() > 20, "{names:?}");
}
