//! `switchyard serve` as a process: what it says when signalled.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg(unix)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A `serve` process, killed when the test ends however it ends.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `serve` with the shipped Noirdoc policy on a free port; its standard
/// error, line by line.
fn serve() -> (Serving, Receiver<String>) {
    serve_with(&[])
}

/// The same with these variables in its environment.
fn serve_with(variables: &[(&str, &OsStr)]) -> (Serving, Receiver<String>) {
    serve_policy("policies/noirdoc.policy", variables, &["--no-watch"])
}

/// `serve` of `policy` with these variables and further arguments.
fn serve_policy(
    policy: &str,
    variables: &[(&str, &OsStr)],
    more: &[&str],
) -> (Serving, Receiver<String>) {
    let mut child = Command::new(BIN)
        .envs(variables.iter().copied())
        .args(["serve", "--policy", policy, "--listen", "127.0.0.1:0"])
        .args(more)
        .current_dir(ROOT)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, received) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (Serving(child), received)
}

/// Waits up to 20 s for a line containing `text`; all lines read so far.
fn wait_for(lines: &Receiver<String>, text: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(100)) {
            let found = line.contains(text);
            seen.push(line);
            if found {
                return;
            }
        }
    }
    panic!("no line with `{text}` in:\n{}", seen.join("\n"));
}

fn signal(serving: &Serving, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), serving.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_sighup_that_finds_nothing_changed_says_so() {
    let (mut serving, lines) = serve();
    let mut seen = Vec::new();
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    signal(&serving, "HUP");
    wait_for(&lines, "SIGHUP: reloading", &mut seen);
    wait_for(
        &lines,
        "SIGHUP: the policy's files are unchanged; the policy being served stays",
        &mut seen,
    );
    signal(&serving, "TERM");
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
}

#[test]
fn a_secret_is_read_without_its_trailing_line_break_and_one_it_cannot_send_is_named() {
    // Mounted from a file, a secret often ends in a line break: it is sent
    // without it. One broken inside cannot be sent at all: `serve` says so
    // instead of each attempt failing as if the provider were unreachable.
    use std::os::unix::ffi::OsStrExt as _;
    let (mut serving, lines) = serve_with(&[
        ("NOIRDOC_IONOS_KEY", OsStr::new("sk-ionos-123\n")),
        ("NOIRDOC_AKI_IO_KEY", OsStr::new("sk-aki\n123")),
        // Not UTF-8: no text at all, though set.
        (
            "NOIRDOC_SCALEWAY_KEY",
            OsStr::from_bytes(b"sk-scale\xffway"),
        ),
    ]);
    let mut seen = Vec::new();
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    let about = |provider: &str| {
        seen.iter()
            .filter(|line| line.contains(&format!("provider={provider} ")))
            .cloned()
            .collect::<Vec<_>>()
    };
    let aki = about("aki-io");
    assert!(
        aki.len() == 1 && aki[0].contains("holds a control character"),
        "{}",
        seen.join("\n")
    );
    assert!(about("ionos").is_empty(), "{}", seen.join("\n"));
    let scaleway = about("scaleway");
    assert!(
        scaleway.len() == 1 && scaleway[0].contains("not UTF-8 text"),
        "{}",
        seen.join("\n")
    );
    signal(&serving, "TERM");
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
}

/// Noirdoc's policy with `definition` added, reading Noirdoc's data where
/// it is.
fn noirdoc_with(definition: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/policies/noirdoc.policy"))
        .unwrap()
        .replace("\"noirdoc/", &format!("\"{ROOT}/policies/noirdoc/"))
        .replacen(
            "eligibility {\n",
            &format!("{definition}\neligibility {{\n"),
            1,
        )
}

#[test]
fn serve_shows_a_policys_warnings_at_start_and_when_a_reload_brings_them() {
    let dir =
        std::env::temp_dir().join(format!("switchyard-serve-warnings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("warned.policy");
    std::fs::write(&policy, noirdoc_with("let unused_at_start = 1")).unwrap();
    let (mut serving, lines) = serve_policy(policy.to_str().unwrap(), &[], &[]);
    let mut seen = Vec::new();
    wait_for(&lines, "`unused_at_start` is never used", &mut seen);
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    // Saved by rename, as editors do.
    let saved = dir.join("warned.policy.new");
    std::fs::write(&saved, noirdoc_with("let unused_after_reload = 2")).unwrap();
    std::fs::rename(&saved, &policy).unwrap();
    wait_for(&lines, "`unused_after_reload` is never used", &mut seen);
    wait_for(&lines, "policy reloaded", &mut seen);
    // The line says which policy is now live, as the start line does.
    let reloaded = seen.last().unwrap();
    assert!(reloaded.contains("policy=noirdoc"), "{reloaded}");
    assert!(
        seen.iter().any(|line| line.contains("W0602")),
        "{}",
        seen.join("\n")
    );
    signal(&serving, "TERM");
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reload_says_which_credentials_it_leaves_without_a_secret() {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-serve-reload-secrets-{}",
        std::process::id()
    ));
    let data = dir.join("noirdoc");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(
        format!("{ROOT}/policies/noirdoc.policy"),
        dir.join("noirdoc.policy"),
    )
    .unwrap();
    for file in ["catalog.yaml", "tenants.yaml"] {
        std::fs::copy(format!("{ROOT}/policies/noirdoc/{file}"), data.join(file)).unwrap();
    }
    // Every credential's variable set, but one.
    let variables = [
        "NOIRDOC_AKI_IO_KEY",
        "NOIRDOC_IONOS_KEY",
        "NOIRDOC_SCALEWAY_KEY",
        "NOIRDOC_TOGETHER_KEY",
        "NOIRDOC_OPENAI_KEY",
        "NOIRDOC_ANTHROPIC_KEY",
        "ACME_OPENAI_KEY",
        "STARTER_BYOK_OPENAI_KEY",
    ]
    .map(|name| (name, OsStr::new("sk-test")));
    let policy = dir.join("noirdoc.policy");
    let (mut serving, lines) = serve_policy(policy.to_str().unwrap(), &variables, &[]);
    let mut seen = Vec::new();
    wait_for(&lines, "provider=managed-off-byok-openai", &mut seen);
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    // The catalog now reads aki-io's secret from a variable that is not set.
    let catalog = data.join("catalog.yaml");
    let text = std::fs::read_to_string(&catalog).unwrap();
    let saved = data.join("catalog.yaml.new");
    std::fs::write(
        &saved,
        text.replace("${NOIRDOC_AKI_IO_KEY}", "${NOIRDOC_AKI_IO_KEY_RENAMED}"),
    )
    .unwrap();
    std::fs::rename(&saved, &catalog).unwrap();
    let from = seen.len();
    wait_for(&lines, "policy reloaded", &mut seen);
    let reloaded = &seen[from..];
    let about = |provider: &str| {
        reloaded
            .iter()
            .filter(|line| line.contains(&format!("provider={provider} ")))
            .count()
    };
    assert_eq!(about("aki-io"), 1, "{}", seen.join("\n"));
    assert!(
        reloaded
            .iter()
            .any(|line| line.contains("variable=NOIRDOC_AKI_IO_KEY_RENAMED")),
        "{}",
        seen.join("\n")
    );
    // Skipped before the reload too: not said again.
    assert_eq!(about("managed-off-byok-openai"), 0, "{}", seen.join("\n"));
    signal(&serving, "TERM");
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_body_limit_of_zero_is_refused_at_start() {
    let output = Command::new(BIN)
        .args(["serve", "--policy", "policies/noirdoc.policy"])
        .args(["--listen", "127.0.0.1:0", "--max-body-bytes", "0"])
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("0 would refuse every request"), "{stderr}");
}

/// A served policy is read again at every reload, where opening a pipe
/// would wait for a writer: `serve` refuses one at start instead of
/// waiting there.
#[test]
fn a_policy_that_is_a_named_pipe_is_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("switchyard-serve-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pipe = dir.join("p.policy");
    let made = Command::new("mkfifo").arg(&pipe).status().unwrap();
    assert!(made.success());
    let (mut serving, lines) = serve_policy(pipe.to_str().unwrap(), &[], &["--no-watch"]);
    let mut seen = Vec::new();
    wait_for(&lines, "it is a named pipe, not a file", &mut seen);
    wait_for(&lines, "read again at every reload", &mut seen);
    assert_eq!(serving.0.wait().unwrap().code(), Some(1), "{seen:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_signal_ends_the_drain_now() {
    use std::io::Write as _;
    let (mut serving, lines) = serve_policy(
        "policies/noirdoc.policy",
        &[],
        &["--no-watch", "--drain", "120s"],
    );
    let mut seen = Vec::new();
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    let address = seen
        .last()
        .and_then(|line| line.rsplit_once("http://"))
        .map(|(_, address)| address.trim().to_string())
        .unwrap();
    // A request whose body is still arriving, one byte a second: in flight
    // far longer than the test waits.
    let mut client = std::net::TcpStream::connect(&address).unwrap();
    write!(
        client,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-noirdoc-acme\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{"
    )
    .unwrap();
    let trickle = std::thread::spawn(move || {
        for _ in 0..60 {
            std::thread::sleep(Duration::from_secs(1));
            if client.write_all(b" ").is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    signal(&serving, "TERM");
    wait_for(&lines, "requests in flight may take up to 120s", &mut seen);
    // The same signal delivered twice, as by a terminal and a process
    // manager, is one: the drain goes on.
    signal(&serving, "TERM");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        serving.0.try_wait().unwrap().is_none(),
        "{}",
        seen.join("\n")
    );
    signal(&serving, "INT");
    wait_for(
        &lines,
        "a second signal; ending the requests in flight now",
        &mut seen,
    );
    let stopped = Instant::now();
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
    // Cut within the second the cut allows, not left to trickle on for a
    // minute.
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "the drain was not ended"
    );
    drop(trickle);
}

#[test]
fn stopping_without_a_drain_says_requests_are_cut() {
    let (mut serving, lines) = serve_policy(
        "policies/noirdoc.policy",
        &[],
        &["--no-watch", "--drain", "0s"],
    );
    let mut seen = Vec::new();
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    signal(&serving, "TERM");
    wait_for(&lines, "requests in flight are cut now", &mut seen);
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
}

#[test]
fn a_policys_warnings_at_start_are_warnings_in_json_logs_too() {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-serve-json-warnings-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("warned.policy");
    std::fs::write(&policy, noirdoc_with("let unused_at_start = 1")).unwrap();
    let (mut serving, lines) = serve_policy(
        policy.to_str().unwrap(),
        &[],
        &["--no-watch", "--log-format", "json"],
    );
    let mut seen = Vec::new();
    wait_for(&lines, "`unused_at_start` is never used", &mut seen);
    let line = seen.last().unwrap();
    assert!(line.contains("\"level\":\"WARN\""), "{line}");
    wait_for(&lines, "serving policy noirdoc", &mut seen);
    signal(&serving, "TERM");
    assert!(serving.0.wait().unwrap().success(), "{}", seen.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}
