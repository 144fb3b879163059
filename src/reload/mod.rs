//! Live reloads: the policy and its data files are watched (and SIGHUP asks
//! too); each change is checked and compiled off the request path, exactly
//! as `switchyard check` does, and only a snapshot that checks replaces the
//! live one. A failed reload leaves the last good policy serving and says
//! why in the log, in `/healthz` and in a metric.

use crate::compile::{Environment, SecretSource, Snapshot, compile_report};
use crate::diagnostics::render;
use crate::language::{DataCache, check_file_cached};
use crate::proxy::Proxy;
use crate::source::SourceMap;
use crate::sync::lock;
use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, new_debouncer};
use serde_json::{Value as Json, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// How long a burst of file events is gathered before one reload: editors
/// write a file in several steps.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Diagnostics of a failed reload shown in `/healthz`.
const SHOWN_DIAGNOSTICS: usize = 3;

/// What `/healthz` says about reloads.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    pub reloads: u64,
    pub failures: u64,
    /// The last successful reload: when (Unix ms) and which version.
    pub last_success: Option<(u64, String)>,
    /// The last failed reload, if no reload succeeded since.
    pub last_failure: Option<FailedReload>,
}

#[derive(Debug, Clone)]
pub struct FailedReload {
    pub at_unix_ms: u64,
    /// The file of the first error.
    pub file: Option<String>,
    /// The first diagnostics, as `switchyard check --format json` prints them.
    pub diagnostics: Json,
}

impl ReloadStatus {
    pub fn to_json(&self) -> Json {
        json!({
            "reloads": self.reloads,
            "failures": self.failures,
            "last_success": self.last_success.as_ref().map(|(at, version)| json!({
                "at_unix_ms": at,
                "version": version,
            })),
            "last_failure": self.last_failure.as_ref().map(|failure| json!({
                "at_unix_ms": failure.at_unix_ms,
                "file": failure.file,
                "diagnostics": failure.diagnostics,
            })),
        })
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The result of one reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new version is live.
    Reloaded(String),
    /// The files are unchanged in content: nothing to do.
    Unchanged,
    /// The policy did not check; the previous version still serves.
    Failed,
}

/// Reloads one proxy's policy.
pub struct Reloader {
    proxy: Arc<Proxy>,
    policy: PathBuf,
    secrets: Arc<dyn SecretSource + Send + Sync>,
    /// The files the policy consists of, as of the last attempt.
    files: Mutex<Vec<PathBuf>>,
    /// The last clean data files, reused while they do not change.
    data: DataCache,
}

impl Reloader {
    /// `sources` are the files of the policy now live (from its check).
    pub fn new(
        proxy: Arc<Proxy>,
        policy: PathBuf,
        sources: &SourceMap,
        secrets: Arc<dyn SecretSource + Send + Sync>,
    ) -> Arc<Reloader> {
        let reloader = Reloader {
            proxy,
            policy,
            secrets,
            files: Mutex::new(Vec::new()),
            data: DataCache::default(),
        };
        reloader.remember_files(sources);
        Arc::new(reloader)
    }

    /// The files to watch: the policy and the data files it names.
    pub fn files(&self) -> Vec<PathBuf> {
        lock(&self.files).clone()
    }

    fn remember_files(&self, sources: &SourceMap) {
        let mut files: Vec<PathBuf> = (0..)
            .map_while(|index| sources.file_at(index))
            .map(|file| PathBuf::from(&file.name))
            .collect();
        if !files.contains(&self.policy) {
            files.insert(0, self.policy.clone());
        }
        *lock(&self.files) = files;
    }

    fn status(&self) -> std::sync::MutexGuard<'_, ReloadStatus> {
        lock(&self.proxy.reload_status)
    }

    /// Checks and compiles the files now and, if they check, makes them live.
    /// Blocking: run it off the async workers.
    pub fn reload(&self) -> Outcome {
        let started = Instant::now();
        let report = check_file_cached(&self.policy, Some(&self.data));
        self.remember_files(&report.sources);
        match compile_report(report, self.secrets.as_ref()) {
            Ok((snapshot, _)) => {
                let live = self.proxy.snapshot();
                if snapshot.version == live.version {
                    let mut status = self.status();
                    status.last_failure = None;
                    return Outcome::Unchanged;
                }
                let version = snapshot.version.clone();
                self.install(snapshot);
                let mut status = self.status();
                status.reloads += 1;
                status.last_success = Some((unix_ms(), version.clone()));
                status.last_failure = None;
                drop(status);
                self.proxy.metrics.count(
                    "switchyard_reloads_total",
                    &[("result", String::from("ok"))],
                );
                tracing::info!(
                    version = %version,
                    ms = started.elapsed().as_millis() as u64,
                    "policy reloaded"
                );
                Outcome::Reloaded(version)
            }
            Err(report) => {
                let first_error = report
                    .diagnostics
                    .iter()
                    .find(|d| d.severity() == crate::diagnostics::Severity::Error);
                let failed_file = first_error
                    .and_then(|d| d.primary.as_ref())
                    .and_then(|label| report.sources.file(label.source))
                    .map(|file| file.name.clone());
                let diagnostics: Json = serde_json::from_str(&render::json(
                    report.diagnostics.iter().take(SHOWN_DIAGNOSTICS),
                    &report.sources,
                ))
                .unwrap_or(Json::Null);
                for diagnostic in report.diagnostics.iter().take(SHOWN_DIAGNOSTICS) {
                    tracing::error!(
                        "{}",
                        render::human(diagnostic, &report.sources, render::Style::Plain)
                    );
                }
                tracing::error!(
                    policy = %self.policy.display(),
                    errors = report.diagnostics.iter().filter(|d| d.severity() == crate::diagnostics::Severity::Error).count(),
                    version = %self.proxy.snapshot().version,
                    "reload failed; the previous policy keeps serving"
                );
                let mut status = self.status();
                status.failures += 1;
                status.last_failure = Some(FailedReload {
                    at_unix_ms: unix_ms(),
                    file: failed_file,
                    diagnostics,
                });
                drop(status);
                self.proxy.metrics.count(
                    "switchyard_reloads_total",
                    &[("result", String::from("failed"))],
                );
                self.proxy.metrics.set("switchyard_reload_failed", &[], 1.0);
                Outcome::Failed
            }
        }
    }

    fn install(&self, snapshot: Snapshot) {
        let providers: HashSet<&str> = snapshot
            .data
            .catalog
            .providers
            .iter()
            .map(|p| p.id.as_str())
            .collect();
        self.proxy.state.retain_providers(&providers);
        self.proxy.metrics.set("switchyard_reload_failed", &[], 0.0);
        self.proxy.replace(Arc::new(snapshot));
    }

    /// Watches the policy's files and reloads on every change (and on
    /// `requests`, e.g. SIGHUP) until the returned handle is dropped.
    pub fn watch(self: &Arc<Self>) -> notify::Result<Watch> {
        let (events, mut changes) = mpsc::unbounded_channel::<()>();
        let relevant = self.clone();
        let watched_events = events.clone();
        let mut debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
            let Ok(batch) = result else {
                return;
            };
            let files = relevant.files();
            let touches_policy = batch
                .iter()
                .filter(|event| changes_content(&event.kind))
                .flat_map(|event| event.paths.iter())
                .any(|path| files.iter().any(|file| same_file(path, file)));
            if touches_policy {
                let _ = watched_events.send(());
            }
        })?;
        // Directories, not files: an editor that saves by renaming a new
        // file over the old one replaces the inode a file watch would follow.
        let mut directories: Vec<PathBuf> = Vec::new();
        for file in self.files() {
            let directory = directory_of(&file);
            if !directories.contains(&directory) {
                debouncer.watch(&directory, RecursiveMode::NonRecursive)?;
                directories.push(directory);
            }
        }
        let reloader = self.clone();
        let task = tokio::spawn(async move {
            while changes.recv().await.is_some() {
                // Changes that arrive while a reload runs are one more reload.
                while changes.try_recv().is_ok() {}
                let reloader = reloader.clone();
                let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
            }
        });
        Ok(Watch {
            _debouncer: debouncer,
            requests: events,
            task,
        })
    }
}

/// A running watch; dropping it stops watching.
pub struct Watch {
    _debouncer: notify_debouncer_full::Debouncer<
        notify::RecommendedWatcher,
        notify_debouncer_full::RecommendedCache,
    >,
    requests: mpsc::UnboundedSender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Asks for a reload (SIGHUP).
    pub fn request(&self) {
        let _ = self.requests.send(());
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether an event may change what a file holds. Reads (which a reload
/// itself causes) and metadata changes do not.
fn changes_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Modify(_) => true,
        EventKind::Access(_) | EventKind::Any | EventKind::Other => false,
    }
}

fn directory_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether an event's path is one of the policy's files: the watcher
/// reports absolute paths, the policy names them as given.
fn same_file(event: &Path, file: &Path) -> bool {
    if event == file {
        return true;
    }
    let absolute = |path: &Path| {
        let directory = directory_of(path);
        let name = path.file_name()?;
        Some(std::fs::canonicalize(directory).ok()?.join(name))
    };
    match (absolute(event), absolute(file)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Secrets from the process environment, shareable across threads.
pub fn environment() -> Arc<dyn SecretSource + Send + Sync> {
    Arc::new(Environment)
}
