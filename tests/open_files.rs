//! `switchyard serve` raises its soft limit on open files to the hard one:
//! each request in flight holds two sockets, and the soft limit shells and
//! systemd give by default (1,024) would cap the proxy near 500 at once.

#![cfg(target_os = "linux")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{Spawned, closed_port, wait_until_listening};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/noirdoc.policy");

/// The soft and hard limits on open files of process `pid`.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap();
    let mut values = line["Max open files".len()..].split_whitespace();
    (
        values.next().unwrap().to_string(),
        values.next().unwrap().to_string(),
    )
}

#[test]
fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    let listen = format!("127.0.0.1:{}", closed_port());
    // Started under a soft limit of 256, as a shell with `ulimit -Sn 256`.
    let running = Spawned(
        Command::new("sh")
            .args(["-c", "ulimit -Sn 256 && exec \"$0\" \"$@\"", BIN])
            .args([
                "serve",
                "--no-watch",
                "--policy",
                POLICY,
                "--listen",
                &listen,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until_listening(&listen);
    let (soft, hard) = open_file_limits(running.0.id());
    assert_ne!(soft, "256", "the soft limit was not raised");
    assert_eq!(soft, hard);
}
