//! `switchyard serve` and `switchyard sim` failing to start: on an address
//! another process holds, a usage error that says so and what to do, not a
//! panic or an operating system's bare message; with `--log-format json`,
//! every line of it JSON. And what `serve` warns of before it listens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs the binary with `args` while another listener holds the address
/// given as `--listen`; returns its exit code and what it wrote to stderr.
fn run_on_a_busy_address(args: &[&str]) -> (Option<i32>, String) {
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = holder.local_addr().unwrap().to_string();
    let output = Command::new(BIN)
        .args(args)
        .args(["--listen", &address])
        .current_dir(ROOT)
        .output()
        .unwrap();
    drop(holder);
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Checks that running `args` on a busy address fails as a usage error
/// naming `who`, the reason and what to do.
fn assert_explained(who: &str, args: &[&str]) {
    let (code, stderr) = run_on_a_busy_address(args);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("error: {who} cannot listen on 127.0.0.1:")),
        "{stderr}"
    );
    assert!(stderr.contains(": the address is in use"), "{stderr}");
    assert!(
        stderr.contains(
            "= help: another process listens there: stop it, or choose another address with `--listen ADDR`"
        ),
        "{stderr}"
    );
}

/// Each line of `stderr` as JSON; a line that is not fails the test.
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .map_err(|_| line)
                .expect("every line is JSON")
        })
        .collect()
}

#[test]
fn serve_on_a_busy_address_says_what_to_do() {
    assert_explained(
        "the proxy",
        &["serve", "--policy", "policies/noirdoc.policy"],
    );
}

#[test]
fn sim_on_a_busy_address_says_what_to_do() {
    assert_explained(
        "the simulated providers",
        &["sim", "--scenario", "scenarios/healthy.yaml"],
    );
}

#[test]
fn with_json_logs_the_refusal_is_a_json_line_too() {
    let (code, stderr) = run_on_a_busy_address(&[
        "serve",
        "--policy",
        "policies/noirdoc.policy",
        "--log-format",
        "json",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    let lines = json_lines(&stderr);
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR", "{stderr}");
    let message = last["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("the proxy cannot listen on 127.0.0.1:"),
        "{message}"
    );
}

#[test]
fn with_json_logs_a_command_line_mistake_is_a_json_line_too() {
    for args in [
        &[
            "serve",
            "--policy",
            "policies/noirdoc.policy",
            "--log-format",
            "json",
            "--listen",
            "localhost:8080",
        ][..],
        &[
            "serve",
            "--log-format=json",
            "--policy",
            "policies/noirdoc.policy",
            "--drain",
            "soon",
        ][..],
        &["demo", "--log-format", "json", "--no-such-flag"][..],
    ] {
        let output = Command::new(BIN)
            .args(args)
            .current_dir(ROOT)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        let lines = json_lines(&stderr);
        assert_eq!(lines.len(), 1, "{stderr}");
        assert_eq!(lines[0]["level"], "ERROR", "{stderr}");
        assert!(
            lines[0]["fields"]["message"]
                .as_str()
                .unwrap()
                .starts_with("error: "),
            "{stderr}"
        );
    }
}

#[test]
fn a_host_name_to_listen_on_is_refused_with_the_form_an_address_takes() {
    let output = Command::new(BIN)
        .args([
            "sim",
            "--scenario",
            "scenarios/healthy.yaml",
            "--listen",
            "localhost:9100",
        ])
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "`localhost:9100` is not an IP address and port; write one such as 127.0.0.1:8080"
        ),
        "{stderr}"
    );
}

#[test]
fn with_json_logs_a_policy_that_does_not_check_is_reported_in_json() {
    let output = Command::new(BIN)
        .args([
            "serve",
            "--policy",
            "tests/diagnostics/E0508-bad-attempts.policy",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
        ])
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let lines = json_lines(&stderr);
    let messages: Vec<&str> = lines
        .iter()
        .map(|line| line["fields"]["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.iter().any(|m| m.starts_with("error[E0508]")),
        "{stderr}"
    );
    assert!(
        messages.last().unwrap().contains("does not check"),
        "{stderr}"
    );
}

/// The variables the Noirdoc catalog reads its credentials from.
const NOIRDOC_VARIABLES: [&str; 7] = [
    "NOIRDOC_AKI_IO_KEY",
    "NOIRDOC_IONOS_KEY",
    "NOIRDOC_SCALEWAY_KEY",
    "NOIRDOC_TOGETHER_KEY",
    "NOIRDOC_OPENAI_KEY",
    "NOIRDOC_ANTHROPIC_KEY",
    "ACME_OPENAI_KEY",
];

/// What `serve` writes before it fails to listen, with only `set` of the
/// Noirdoc variables in its environment.
fn serve_warnings(set: &[&str]) -> String {
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = holder.local_addr().unwrap().to_string();
    let mut command = Command::new(BIN);
    command
        .args([
            "serve",
            "--policy",
            "policies/noirdoc.policy",
            "--listen",
            &address,
        ])
        .current_dir(ROOT);
    for variable in NOIRDOC_VARIABLES {
        command.env_remove(variable);
    }
    for variable in set {
        command.env(variable, "sk-any");
    }
    let output = command.output().unwrap();
    drop(holder);
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn serve_says_so_when_no_credential_can_be_used() {
    const NONE_SET: &str = "no credential's variable is set: every request will fail";
    let stderr = serve_warnings(&[]);
    assert!(stderr.contains(NONE_SET), "{stderr}");
    assert!(stderr.contains("NOIRDOC_IONOS_KEY"), "{stderr}");
    let stderr = serve_warnings(&["NOIRDOC_IONOS_KEY"]);
    assert!(!stderr.contains(NONE_SET), "{stderr}");
    assert!(
        stderr.contains("NOIRDOC_AKI_IO_KEY"),
        "each missing one is named: {stderr}"
    );
    assert!(!stderr.contains("variable=NOIRDOC_IONOS_KEY"), "{stderr}");
}

#[test]
fn a_scenario_that_does_not_read_is_shown_at_its_place() {
    let dir = std::env::temp_dir().join(format!("switchyard-bad-scenario-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = dir.join("bad.yaml");
    std::fs::write(
        &scenario,
        "providers:\n  a:\n    sequence: [\"503 retry_afte=2s\"]\n",
    )
    .unwrap();
    let output = Command::new(BIN)
        .args(["sim", "--listen", "127.0.0.1:0", "--scenario"])
        .arg(&scenario)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr
            .contains("error[E0901]: `retry_afte` is not a step word; did you mean `retry_after`?"),
        "{stderr}"
    );
    assert!(stderr.contains("bad.yaml:3:21"), "{stderr}");
    assert!(
        stderr.contains("3 |     sequence: [\"503 retry_afte=2s\"]"),
        "{stderr}"
    );
    assert!(stderr.contains("^^^^^^^^^^ here"), "{stderr}");
    assert!(
        stderr.contains("= help: docs/sim.md describes what a scenario holds"),
        "{stderr}"
    );
}

#[test]
fn demo_asked_to_listen_where_its_providers_do_says_so() {
    let output = Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:9100"])
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the demo's simulated providers listen on 127.0.0.1:9100"),
        "{stderr}"
    );
    assert!(!stderr.contains("another process"), "{stderr}");
}
