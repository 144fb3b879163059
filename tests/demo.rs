//! `switchyard demo` suggests three requests (policies/demo.yaml): each
//! behaves as the demo says, through the proxy serving the demo's policy in
//! front of the demo's simulated providers (scenarios/demo.yaml).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::Stack;
use serde_json::json;
use std::sync::Arc;
use switchyard::cli::demo::{Shows, Tour};
use switchyard::state::SystemClock;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_suggested_requests_do_what_it_says() {
    let tour = Tour::shipped().unwrap();
    let shows: Vec<Shows> = tour.requests.iter().map(|r| r.shows).collect();
    for kind in [Shows::Answer, Shows::Failover, Shows::Refusal] {
        assert!(shows.contains(&kind), "the demo suggests no {kind:?}");
    }
    let scenario =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/demo.yaml"))
            .unwrap();
    let name = tour.policy.trim_end_matches(".policy");
    let stack = Stack::shipped(name, &scenario, &[], Arc::new(SystemClock::new())).await;

    for suggestion in &tour.requests {
        stack.sim.clear();
        let body = json!({
            "model": suggestion.model,
            "messages": [{"role": "user", "content": "Hello"}],
        });
        let reply = stack.chat(&suggestion.key, body).await;
        let asked = stack.providers_tried();
        let what = format!(
            "{:?} ({}): {}",
            suggestion.shows, suggestion.model, reply.text
        );
        match suggestion.shows {
            Shows::Answer | Shows::Failover => {
                assert_eq!(reply.status, 200, "{what}");
                let answered = reply.header(&tour.provider_header);
                assert!(
                    answered.is_some(),
                    "no {} header: {what}",
                    tour.provider_header
                );
                let expected_asks = if suggestion.shows == Shows::Answer {
                    1
                } else {
                    2
                };
                assert_eq!(asked.len(), expected_asks, "{asked:?}: {what}");
            }
            Shows::Refusal => {
                assert!((400..500).contains(&reply.status), "{what}");
                assert!(reply.json["error"]["code"].is_string(), "{what}");
                assert!(asked.is_empty(), "{asked:?}: {what}");
            }
        }
    }
    stack.stop().await;
}

#[test]
fn a_policy_dir_that_is_a_file_is_named_as_such() {
    let file = std::env::temp_dir().join(format!("switchyard-demo-file-{}", std::process::id()));
    std::fs::write(&file, "").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["demo", "--listen", "127.0.0.1:0", "--policy-dir"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not a directory"), "{stderr}");
}
