//! The official OpenAI and Anthropic Python SDKs against the proxy: a plain
//! call, a streamed call and a failover, in each wire format
//! (tests/sdk/test_clients.py).
//!
//! Ignored by plain `cargo test` because it needs Python with both SDKs;
//! `scripts/test` makes that virtual environment and runs this with
//! `--ignored`, passing the interpreter in `SWITCHYARD_SDK_PYTHON`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{Files, Stack, one_key_tenants};
use std::path::Path;
use switchyard::proxy::Options;

const KEY: &str = "sk-sdk-test";

const POLICY: &str = r#"policy sdk {
  catalog "catalog.yaml"
  tenants "tenants.yaml"
}

models {
  credentials each else upstream_failed
  unknown error unknown_model
}

eligibility {
  require provider.format == request.wire else wrong_endpoint
}

failover {
  attempts 2
  on stream_broken => stop, error upstream_failed
  on 500 when model.id == "down-chat" => stop, error down
  on any => next, error upstream_failed
}

headers {
  "x-served-by" = served.provider.id
}

errors {
  unknown_model = 404, "no model has this id", type "not_found_error"
  wrong_endpoint = 400, "this model is served on the other wire format"
  upstream_failed = 502, "every provider failed"
  down = 503, "the model's only provider is down", should_retry false
}
"#;

const CATALOG: &str = r#"providers:
  - id: oa-main
    format: openai
    base_url: http://{sim}/oa-main/v1
    credentials: [{id: oa-main-key, key: "${OA_MAIN}"}]
  - id: oa-backup
    format: openai
    base_url: http://{sim}/oa-backup/v1
    credentials: [{id: oa-backup-key, key: "${OA_BACKUP}"}]
  - id: an-main
    format: anthropic
    base_url: http://{sim}/an-main/v1
    credentials: [{id: an-main-key, key: "${AN_MAIN}"}]
  - id: an-backup
    format: anthropic
    base_url: http://{sim}/an-backup/v1
    credentials: [{id: an-backup-key, key: "${AN_BACKUP}"}]
models:
  - id: chat
    kind: chat
    routes: [{provider: oa-main}, {provider: oa-backup}]
  - id: flaky-chat
    kind: chat
    routes: [{provider: oa-main}, {provider: oa-backup}]
  - id: broken-chat
    kind: chat
    routes: [{provider: oa-main}]
  - id: down-chat
    kind: chat
    routes: [{provider: oa-main}]
  - id: claude
    kind: chat
    routes: [{provider: an-main}, {provider: an-backup}]
  - id: flaky-claude
    kind: chat
    routes: [{provider: an-main}, {provider: an-backup}]
"#;

const SCENARIO: &str = r#"defaults:
  chunks: 4
providers:
  oa-main:
    models:
      flaky-chat: {sequence: ["503"]}
      broken-chat: {sequence: ["cut_after=2"]}
      down-chat: {sequence: ["500"], repeat: true}
  oa-backup: {}
  an-main:
    models:
      flaky-claude: {sequence: ["529"]}
  an-backup: {}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python with the openai and anthropic SDKs: scripts/test installs them and runs this"]
async fn the_official_sdks_work_through_the_proxy() {
    let python = std::env::var("SWITCHYARD_SDK_PYTHON").expect(
        "SWITCHYARD_SDK_PYTHON must name a Python with tests/sdk/requirements.txt installed \
         (scripts/test sets it)",
    );
    let tenants = one_key_tenants(KEY);
    let files = Files {
        policy: POLICY,
        catalog: CATALOG,
        tenants: &tenants,
        scenario: SCENARIO,
        secrets: &[
            ("OA_MAIN", "oa-main-secret"),
            ("OA_BACKUP", "oa-backup-secret"),
            ("AN_MAIN", "an-main-secret"),
            ("AN_BACKUP", "an-backup-secret"),
        ],
    };
    let stack = Stack::start("sdk", &files, Options::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/test_clients.py");
    let url = stack.url("");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .env("SWITCHYARD_URL", url)
            .env("SWITCHYARD_KEY", KEY)
            .output()
            .expect("the SDK Python runs")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(output.status.success(), "the SDK tests failed:\n{stderr}");
    // `should_retry false` kept the SDK, allowed two retries, to its one call.
    let down = stack
        .sim
        .requests()
        .iter()
        .filter(|request| request.model.as_deref() == Some("down-chat"))
        .count();
    assert_eq!(down, 1, "the SDK retried an error it was told not to");
    // Every client credential stayed behind: providers saw only their own.
    for request in stack.sim.requests() {
        let sent = request
            .headers
            .values()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            !sent.contains(KEY),
            "the client's key reached {}",
            request.provider
        );
    }
    stack.stop().await;
}
