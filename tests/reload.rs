//! Live reloads through the real proxy on loopback: a valid change takes
//! effect, an invalid one never serves, requests are never dropped, and
//! health state survives.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{Files, Stack, healthz, one_key_tenants, until};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard::compile::FixedSecrets;
use switchyard::proxy::Options;
use switchyard::reload::{Outcome, Reloader, Watch};

const KEY: &str = "sk-reload-test";
/// The most a valid change may take to serve (the issue's promise).
const IN_EFFECT_WITHIN: Duration = Duration::from_secs(1);

const POLICY: &str = r#"policy reloading {
  catalog "catalog.yaml"
  tenants "tenants.yaml"
}

models {
  credentials each else failed
  unknown error failed
}

failover {
  attempts 2
  on 429 => next, pause provider for 30s, error busy
  on any => next, error failed
}

headers {
  "x-generation" = "GENERATION"
}

errors {
  busy = 429, "every provider is busy"
  failed = 502, "the providers failed"
}
"#;

fn policy_text(generation: &str) -> String {
    POLICY.replace("GENERATION", generation)
}

const CATALOG: &str = r#"providers:
  - id: alpha
    format: openai
    base_url: http://{sim}/alpha/v1
    credentials:
      - id: alpha-key
        key: "${ALPHA_KEY}"
  - id: beta
    format: openai
    base_url: http://{sim}/beta/v1
    credentials:
      - id: beta-key
        key: "${BETA_KEY}"
models:
  - id: m
    kind: chat
    routes:
      - provider: alpha
      - provider: beta
"#;

const SECRETS: &[(&str, &str)] = &[("ALPHA_KEY", "alpha-secret"), ("BETA_KEY", "beta-secret")];

struct Setup {
    stack: Stack,
    _watch: Watch,
}

impl std::ops::Deref for Setup {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

/// Generation g0 of the policy served in front of `scenario`, and the
/// secrets its catalog reads.
async fn start_stack(name: &str, scenario: &str) -> (Stack, FixedSecrets) {
    let tenants = one_key_tenants(KEY);
    let policy = policy_text("g0");
    let files = Files {
        policy: &policy,
        catalog: CATALOG,
        tenants: &tenants,
        scenario,
        secrets: SECRETS,
    };
    let options = Options {
        version_header: true,
        ..Options::default()
    };
    (Stack::start(name, &files, options).await, files.secrets())
}

impl Setup {
    async fn start(name: &str, scenario: &str) -> Setup {
        let (stack, secrets) = start_stack(name, scenario).await;
        let policy = stack.policy.clone();
        let reloader = Reloader::new(
            stack.proxy.clone(),
            policy,
            &stack.sources,
            Arc::new(secrets),
        );
        Setup {
            _watch: reloader.watch().unwrap(),
            stack,
        }
    }

    /// One chat completion: its status and `x-generation`.
    async fn ask(&self) -> (u16, Option<String>) {
        ask(&self.client, &self.url("/v1/chat/completions")).await
    }

    fn failures(&self) -> u64 {
        self.proxy.reload_status.lock().unwrap().failures
    }

    /// Polls until responses carry `generation`; returns how long it took.
    async fn until_serving(&self, generation: &str) -> Duration {
        let started = Instant::now();
        loop {
            if self.ask().await.1.as_deref() == Some(generation) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{generation} never took effect"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the failed-reload count is above `before`.
    async fn until_failed(&self, before: u64) {
        until("the bad edit is looked at", || self.failures() > before).await;
    }

    async fn stop(self) {
        drop(self._watch);
        self.stack.stop().await;
    }
}

async fn ask(client: &reqwest::Client, url: &str) -> (u16, Option<String>) {
    let response = client
        .post(url)
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let generation = response
        .headers()
        .get("x-generation")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let _ = response.bytes().await;
    (status, generation)
}

const HEALTHY: &str = "providers:\n  alpha: {}\n  beta: {}\n";

/// Replaces a file the way editors that save atomically do.
fn rename_over(path: &Path, text: &str) {
    let temporary = path.with_extension("policy.swp");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_keeps_the_last_good_policy_and_healthz_says_where() {
    let setup = Setup::start("garbage", HEALTHY).await;
    assert_eq!(setup.ask().await, (200, Some(String::from("g0"))));
    let version = healthz(&setup).await["version"].clone();

    let before = setup.failures();
    let mut text = policy_text("g0");
    text.push_str("this is not a policy\n");
    std::fs::write(&setup.policy, &text).unwrap();
    setup.until_failed(before).await;

    assert_eq!(setup.ask().await, (200, Some(String::from("g0"))));
    let health = healthz(&setup).await;
    assert_eq!(
        health["version"], version,
        "the live version did not change"
    );
    let failure = &health["reload"]["last_failure"];
    assert_eq!(
        failure["file"].as_str().unwrap(),
        setup.policy.display().to_string(),
        "{failure}"
    );
    let garbage_line = text.lines().count();
    assert_eq!(failure["diagnostics"][0]["line"], garbage_line);
    assert_eq!(failure["diagnostics"][0]["column"], 1);
    assert_eq!(failure["diagnostics"][0]["severity"], "error");
    assert!(
        metrics(&setup)
            .await
            .contains("\nswitchyard_reload_failed 1\n")
    );

    // The bad edit undone: the files are the served policy again, and the
    // failure no longer stands, for /healthz and the alerting gauge alike.
    std::fs::write(&setup.policy, policy_text("g0")).unwrap();
    until("the undone edit is looked at", || {
        setup
            .proxy
            .reload_status
            .lock()
            .unwrap()
            .last_failure
            .is_none()
    })
    .await;
    assert!(
        metrics(&setup)
            .await
            .contains("\nswitchyard_reload_failed 0\n")
    );
    assert_eq!(healthz(&setup).await["version"], version);
    setup.stop().await;
}

/// One bad deploy is one failed reload, however many events it raises: a
/// ConfigMap-style swap of a mounted directory raises a reload or two more,
/// which find the same files failing the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_seen_again_is_said_and_counted_once() {
    let (stack, secrets) = start_stack("failing-again", HEALTHY).await;
    let read = |file: &str| std::fs::read_to_string(stack.dir.join(file)).unwrap();
    let (catalog, tenants) = (read("catalog.yaml"), read("tenants.yaml"));
    let version = |policy: String, catalog: &str| {
        [
            ("failing-again.policy", policy),
            ("catalog.yaml", catalog.to_string()),
            ("tenants.yaml", tenants.clone()),
        ]
    };
    let mount = stack.dir.join("mounted");
    update_configmap(&mount, "v1", &version(policy_text("first"), &catalog));
    let setup = serving_from(stack, secrets, mount.join("failing-again.policy"), "first").await;

    let broken = catalog.replacen("kind: chat", "kind: chatty", 1);
    let before = setup.failures();
    update_configmap(&mount, "v2", &version(policy_text("second"), &broken));
    setup.until_failed(before).await;
    // The reloads the swap raised after the first have had their time.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(setup.failures(), before + 1);
    let reloader = Reloader::new(
        setup.proxy.clone(),
        mount.join("failing-again.policy"),
        &setup.sources,
        Arc::new(FixedSecrets::default()),
    );
    let again = reloader.clone();
    let outcome = tokio::task::spawn_blocking(move || again.reload())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::StillFailing);
    assert_eq!(setup.failures(), before + 1);

    // Broken another way: a failure of its own.
    update_configmap(
        &mount,
        "v3",
        &version(policy_text("third") + "errors { half = }\n", &catalog),
    );
    setup.until_failed(before + 1).await;
    assert_eq!(setup.ask().await, (200, Some(String::from("first"))));
    setup.stop().await;
}

/// A served policy is read again at every reload. Opening a pipe waits for
/// a writer, so a pipe put in its place once froze every later reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_replaced_by_a_named_pipe_fails_its_reload_and_later_ones_run() {
    let setup = Setup::start("pipe", HEALTHY).await;
    assert_eq!(setup.ask().await, (200, Some(String::from("g0"))));

    std::fs::remove_file(&setup.policy).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&setup.policy)
        .status()
        .unwrap();
    assert!(made.success());
    until("the pipe is refused", || {
        let status = setup.proxy.reload_status.lock().unwrap();
        status
            .last_failure
            .as_ref()
            .is_some_and(|failure| failure.diagnostics.to_string().contains("named pipe"))
    })
    .await;
    assert_eq!(setup.ask().await, (200, Some(String::from("g0"))));
    // The failure names the policy file, though no line of it was read.
    let file = setup
        .proxy
        .reload_status
        .lock()
        .unwrap()
        .last_failure
        .as_ref()
        .and_then(|failure| failure.file.clone());
    assert_eq!(file.as_deref(), setup.policy.to_str());

    std::fs::remove_file(&setup.policy).unwrap();
    std::fs::write(&setup.policy, policy_text("g1")).unwrap();
    setup.until_serving("g1").await;
    setup.stop().await;
}

async fn metrics(stack: &Stack) -> String {
    stack
        .client
        .get(stack.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_edit_takes_effect_and_shows_its_version() {
    let setup = Setup::start("valid", HEALTHY).await;
    let old_version = healthz(&setup).await["version"].clone();
    std::fs::write(&setup.policy, policy_text("g1")).unwrap();
    let took = setup.until_serving("g1").await;
    assert!(took < IN_EFFECT_WITHIN, "took {took:?}");
    let health = healthz(&setup).await;
    assert_ne!(health["version"], old_version);
    assert_eq!(
        health["reload"]["last_success"]["version"],
        health["version"]
    );
    assert!(health["reload"]["last_failure"].is_null());
    // Responses say which version decided them: answers, refusals and
    // everything else the proxy says.
    let chat = |key: &str, model: &str| {
        setup
            .client
            .post(setup.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&serde_json::json!({"model": model, "messages": []}))
    };
    let requests = [
        ("answer", chat(KEY, "m")),
        ("policy refusal", chat(KEY, "no-such-model")),
        ("wrong key", chat("sk-nobody", "m")),
        (
            "models",
            setup.client.get(setup.url("/v1/models")).bearer_auth(KEY),
        ),
        ("health", setup.client.get(setup.url("/healthz"))),
        ("unknown path", setup.client.get(setup.url("/v2/models"))),
    ];
    for (what, request) in requests {
        let response = request.send().await.unwrap();
        assert_eq!(
            response
                .headers()
                .get("x-switchyard-policy-version")
                .map(|version| version.to_str().unwrap()),
            health["version"].as_str(),
            "{what} ({})",
            response.status()
        );
    }
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_by_rename_takes_effect() {
    let setup = Setup::start("rename", HEALTHY).await;
    rename_over(&setup.policy, &policy_text("renamed"));
    let took = setup.until_serving("renamed").await;
    assert!(took < IN_EFFECT_WITHIN, "took {took:?}");
    // And again: the watch survives the replaced file.
    rename_over(&setup.policy, &policy_text("renamed-again"));
    setup.until_serving("renamed-again").await;
    setup.stop().await;
}

/// Updates `mount` as Kubernetes updates a ConfigMap volume: the files of
/// `version` go in a directory of their own, a new `..data` link to it
/// replaces the old one in one rename, and each file is a link through
/// `..data`. No event names the files themselves.
fn update_configmap(mount: &Path, version: &str, files: &[(&str, String)]) {
    std::fs::create_dir_all(mount).unwrap();
    let old = std::fs::read_link(mount.join("..data")).ok();
    let directory = format!("..{version}");
    std::fs::create_dir(mount.join(&directory)).unwrap();
    for (name, text) in files {
        std::fs::write(mount.join(&directory).join(name), text).unwrap();
    }
    std::os::unix::fs::symlink(&directory, mount.join("..data_tmp")).unwrap();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    for (name, _) in files {
        let link = mount.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), link).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(mount.join(old)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_style_update_takes_effect() {
    deployed_updates_take_effect("configmap", "deployed", |mount, version, files| {
        update_configmap(mount, &format!("v{version}"), files);
    })
    .await;
}

/// Replaces the directory `config` with a new one holding `files`, as a
/// deploy that renames directories does: the new one is written beside
/// it, the old one renamed away, `gap` later the new one renamed into its
/// place; then the old one is deleted or kept.
fn replace_directory(
    config: &Path,
    files: &[(impl AsRef<Path>, String)],
    gap: Duration,
    keep: Keep,
) {
    let staged = config.with_extension("new");
    for (name, text) in files {
        let file = staged.join(name);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }
    let old = match keep {
        Keep::Nothing => config.with_extension("old"),
        Keep::OldAs(version) => config.with_extension(format!("before-{version}")),
    };
    if config.exists() {
        std::fs::rename(config, &old).unwrap();
        std::thread::sleep(gap);
    }
    std::fs::rename(&staged, config).unwrap();
    if matches!(keep, Keep::Nothing) && old.exists() {
        std::fs::remove_dir_all(&old).unwrap();
    }
}

/// What a deploy leaves of the directory it replaced.
#[derive(Clone, Copy)]
enum Keep {
    Nothing,
    /// Renamed for the version that replaced it.
    OldAs(usize),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_directory_takes_effect() {
    deployed_updates_take_effect("replaced", "deployed", |config, _, files| {
        replace_directory(config, files, Duration::ZERO, Keep::Nothing);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_replaced_with_a_gap_takes_effect() {
    // Long enough for the watch to see the directory missing; the old one
    // kept, as for a rollback, so that its deletion is no event either.
    deployed_updates_take_effect("replaced-with-gap", "deployed", |config, version, files| {
        replace_directory(config, files, Duration::from_secs(1), Keep::OldAs(version));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_directory_above_the_policy_takes_effect() {
    // The policy in `app/config/`, and `app` replaced with a gap: while it
    // is missing the watch is on the test's own directory, two levels up.
    deployed_updates_take_effect("replaced-above", "app/config", |config, version, files| {
        let app = config.parent().unwrap();
        let nested: Vec<(String, String)> = files
            .iter()
            .map(|(name, text)| (format!("config/{name}"), text.clone()))
            .collect();
        replace_directory(app, &nested, Duration::from_secs(1), Keep::OldAs(version));
    })
    .await;
}

/// Switches `stack` to the policy at `policy` (a reload), watches its
/// files, and waits until it serves `generation`.
async fn serving_from(
    stack: Stack,
    secrets: FixedSecrets,
    policy: std::path::PathBuf,
    generation: &str,
) -> Setup {
    let reloader = Reloader::new(
        stack.proxy.clone(),
        policy,
        &stack.sources,
        Arc::new(secrets),
    );
    let first = reloader.clone();
    let outcome = tokio::task::spawn_blocking(move || first.reload())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Reloaded(_)), "{outcome:?}");
    let setup = Setup {
        _watch: reloader.watch().unwrap(),
        stack,
    };
    setup.until_serving(generation).await;
    setup
}

/// Serves a policy whose files `deploy` puts in the directory `within` the
/// test's own (given it, the version's number and the files), then deploys
/// two more versions and waits for each to serve. The third deploy finds
/// whatever the second left in place, not what the watch began on.
async fn deployed_updates_take_effect(
    name: &str,
    within: &str,
    deploy: impl Fn(&Path, usize, &[(&str, String)]),
) {
    let (stack, secrets) = start_stack(name, HEALTHY).await;
    let read = |file: &str| std::fs::read_to_string(stack.dir.join(file)).unwrap();
    let (catalog, tenants) = (read("catalog.yaml"), read("tenants.yaml"));
    let policy_name = format!("{name}.policy");
    let version = |generation: &str| {
        [
            (policy_name.as_str(), policy_text(generation)),
            ("catalog.yaml", catalog.clone()),
            ("tenants.yaml", tenants.clone()),
        ]
    };
    let directory = stack.dir.join(within);
    deploy(&directory, 1, &version("first"));
    let setup = serving_from(stack, secrets, directory.join(&policy_name), "first").await;

    // Whether each deployment takes effect at all; how fast a change does
    // is `a_valid_edit_takes_effect_and_shows_its_version`'s.
    deploy(&directory, 2, &version("second"));
    setup.until_serving("second").await;
    deploy(&directory, 3, &version("third"));
    setup.until_serving("third").await;
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_file_change_reloads_too() {
    let setup = Setup::start("data", HEALTHY).await;
    // Beta first: the route order is the catalog's.
    let catalog = CATALOG
        .replace("{sim}", &setup.sim.addr().to_string())
        .replace(
            "      - provider: alpha\n      - provider: beta\n",
            "      - provider: beta\n      - provider: alpha\n",
        );
    std::fs::write(setup.dir.join("catalog.yaml"), catalog).unwrap();
    let started = Instant::now();
    loop {
        setup.sim.clear();
        assert_eq!(setup.ask().await.0, 200);
        if setup.sim.requests()[0].provider == "beta" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    setup.stop().await;
}

/// A reload that changes a provider's capacity applies to the requests
/// already waiting for its room, not only to those that come after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_capacity_applies_to_requests_already_waiting() {
    let setup = Setup::start(
        "capacity",
        "providers:\n  alpha: {latency: 4s}\n  beta: {}\n",
    )
    .await;
    let policy =
        |generation: &str| policy_text(generation) + "\ncapacity {\n  wait 30s\n  error busy\n}\n";
    let catalog = |concurrent: u32| {
        CATALOG
            .replace("{sim}", &setup.sim.addr().to_string())
            .replacen(
                "/alpha/v1\n",
                &format!("/alpha/v1\n    capacity: {{concurrent: {concurrent}}}\n"),
                1,
            )
            .replace("      - provider: beta\n", "")
    };
    std::fs::write(setup.dir.join("catalog.yaml"), catalog(1)).unwrap();
    rename_over(&setup.policy, &policy("one"));
    setup.until_serving("one").await;

    let reloads = || setup.proxy.reload_status.lock().unwrap().reloads;
    setup.sim.clear();
    let started = Instant::now();
    let client = setup.client.clone();
    let url = setup.url("/v1/chat/completions");
    let (first, second) = (client.clone(), url.clone());
    let holding = tokio::spawn(async move { ask(&first, &second).await });
    until("the first request is at alpha", || {
        setup.sim.requests().len() == 1
    })
    .await;
    let waiting = tokio::spawn(async move { ask(&client, &url).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(setup.sim.requests().len(), 1, "the second waits for room");

    let before = reloads();
    std::fs::write(setup.dir.join("catalog.yaml"), catalog(2)).unwrap();
    until("the new limit is live", || reloads() > before).await;
    until("the waiting request is at alpha", || {
        setup.sim.requests().len() == 2
    })
    .await;
    // Long before the first answer (4 s) would have freed its room.
    assert!(
        started.elapsed() < Duration::from_millis(3_000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(holding.await.unwrap().0, 200);
    assert_eq!(waiting.await.unwrap().0, 200);
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_replaced_with_a_gap_takes_effect() {
    // The policy stays; its data files live in `data/`, which a deploy
    // replaces with a gap. The reload in the gap fails (the files are
    // missing), and must not forget the directory it waits for.
    let (stack, secrets) = start_stack("data-gap", HEALTHY).await;
    let sim = stack.sim.addr().to_string();
    let catalog = |first: &str, second: &str| {
        CATALOG.replace("{sim}", &sim).replace(
            "      - provider: alpha\n      - provider: beta\n",
            &format!("      - provider: {first}\n      - provider: {second}\n"),
        )
    };
    let tenants = std::fs::read_to_string(stack.dir.join("tenants.yaml")).unwrap();
    let data = stack.dir.join("data");
    let version = |first: &str, second: &str| {
        [
            ("catalog.yaml", catalog(first, second)),
            ("tenants.yaml", tenants.clone()),
        ]
    };
    replace_directory(
        &data,
        &version("alpha", "beta"),
        Duration::ZERO,
        Keep::Nothing,
    );
    let policy = stack.dir.join("split.policy");
    std::fs::write(
        &policy,
        policy_text("split")
            .replace("\"catalog.yaml\"", "\"data/catalog.yaml\"")
            .replace("\"tenants.yaml\"", "\"data/tenants.yaml\""),
    )
    .unwrap();
    let setup = serving_from(stack, secrets, policy, "split").await;
    let answering = || async {
        setup.sim.clear();
        assert_eq!(setup.ask().await.0, 200);
        setup.sim.requests()[0].provider.clone()
    };
    assert_eq!(answering().await, "alpha");

    // Renamed away, and the new one renamed in only once the reload in
    // the gap has failed: the case that lost the watch.
    let staged = data.with_extension("new");
    std::fs::create_dir(&staged).unwrap();
    for (name, text) in version("beta", "alpha") {
        std::fs::write(staged.join(name), text).unwrap();
    }
    let before = setup.failures();
    std::fs::rename(&data, data.with_extension("before-1")).unwrap();
    until("the reload in the gap fails", || setup.failures() > before).await;
    std::fs::rename(&staged, &data).unwrap();
    let started = Instant::now();
    while answering().await != "beta" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the new data directory never took effect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_finish_on_the_policy_they_started_on() {
    let setup = Setup::start(
        "in-flight",
        "providers:\n  alpha:\n    latency: 600ms\n  beta: {}\n",
    )
    .await;
    let client = setup.client.clone();
    let url = setup.url("/v1/chat/completions");
    let slow = tokio::spawn(async move { ask(&client, &url).await });
    // Decided and sent: alpha holds it for 600 ms while the policy changes.
    until("the slow request reaches alpha", || {
        setup.sim.requests().len() == 1
    })
    .await;
    std::fs::write(&setup.policy, policy_text("g1")).unwrap();
    setup.until_serving("g1").await;
    assert_eq!(slow.await.unwrap(), (200, Some(String::from("g0"))));
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pauses_survive_a_reload() {
    let setup = Setup::start(
        "state",
        "providers:\n  alpha:\n    sequence: [\"429\", \"200\"]\n  beta: {}\n",
    )
    .await;
    assert_eq!(setup.ask().await.0, 200);
    let providers = |setup: &Setup| -> Vec<String> {
        setup
            .sim
            .requests()
            .iter()
            .map(|r| r.provider.clone())
            .collect()
    };
    assert_eq!(
        providers(&setup),
        ["alpha", "beta"],
        "alpha answered 429, beta served"
    );
    std::fs::write(&setup.policy, policy_text("g1")).unwrap();
    setup.until_serving("g1").await;
    // alpha stays paused for 30 s across the reload: only beta is asked.
    setup.sim.clear();
    assert_eq!(setup.ask().await, (200, Some(String::from("g1"))));
    assert_eq!(providers(&setup), ["beta"]);
    setup.stop().await;
}

/// The storm: 200 reloads (a valid change, an invalid edit, a truncated
/// write, in turn) under continuous load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_storm_drops_nothing_and_never_serves_a_bad_policy() {
    let setup = Arc::new(Setup::start("storm", HEALTHY).await);
    let valid: Arc<Mutex<HashSet<String>>> =
        Arc::new(Mutex::new(HashSet::from([String::from("g0")])));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (client, url) = (setup.client.clone(), setup.url("/v1/chat/completions"));
        let (valid, stop, served) = (valid.clone(), stop.clone(), served.clone());
        load.push(tokio::spawn(async move {
            let mut problems = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let (status, generation) = ask(&client, &url).await;
                served.fetch_add(1, Ordering::SeqCst);
                let known = generation
                    .as_ref()
                    .is_some_and(|g| valid.lock().unwrap().contains(g));
                if status != 200 || !known {
                    problems.push(format!("{status} from generation {generation:?}"));
                }
            }
            problems
        }));
    }

    let mut slowest = Duration::ZERO;
    for round in 1..=200 {
        match round % 3 {
            0 => {
                let generation = format!("g{round}");
                valid.lock().unwrap().insert(generation.clone());
                std::fs::write(&setup.policy, policy_text(&generation)).unwrap();
                slowest = slowest.max(setup.until_serving(&generation).await);
            }
            1 => {
                let before = setup.failures();
                let mut text = policy_text(&format!("bad{round}"));
                text.push_str("errors { half = }\n");
                std::fs::write(&setup.policy, text).unwrap();
                setup.until_failed(before).await;
            }
            _ => {
                let before = setup.failures();
                let text = policy_text(&format!("cut{round}"));
                // Cut inside the header's string: never a valid policy.
                let cut = text.find(&format!("cut{round}")).unwrap() + 2;
                std::fs::write(&setup.policy, &text[..cut]).unwrap();
                setup.until_failed(before).await;
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut problems = Vec::new();
    for task in load {
        problems.extend(task.await.unwrap());
    }
    let total = served.load(Ordering::SeqCst);
    eprintln!("storm: {total} requests during 200 reloads; slowest valid change took {slowest:?}");
    assert!(total > 200, "the load kept going ({total} requests)");
    assert!(
        problems.is_empty(),
        "{} bad answers: {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert!(
        slowest < IN_EFFECT_WITHIN,
        "a valid change took {slowest:?}"
    );
    match Arc::try_unwrap(setup) {
        Ok(setup) => setup.stop().await,
        Err(_) => panic!("the load tasks still hold the setup"),
    }
}
