//! Live reloads: the policy and its data files are watched (and SIGHUP asks
//! too); each change is checked and compiled off the request path, exactly
//! as `switchyard check` does, and only a snapshot that checks replaces the
//! live one. A failed reload leaves the last good policy serving and says
//! why in the log, in `/healthz` and in a metric.

use crate::compile::{
    Environment, SecretSource, Snapshot, UnusableCredential, compile_report, unusable_credentials,
};
use crate::diagnostics::render;
use crate::language::{DataCache, check_served_file};
use crate::proxy::Proxy;
use crate::source::SourceMap;
use crate::sync::lock;
use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, new_debouncer};
use serde_json::{Value as Json, json};
use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// A digest of the files read and of every diagnostic: a reload that
    /// fails with the same is the same failure again.
    pub digest: u64,
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

/// What a failed check read and said, as a digest: the files' names and
/// texts, those it could not read, and every diagnostic.
fn failure_digest(report: &crate::language::CheckReport) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for file in (0..).map_while(|index| report.sources.file_at(index)) {
        for part in [file.name.as_bytes(), b"\0", file.text.as_bytes(), b"\0"] {
            hasher.update(part);
        }
    }
    for path in &report.unread {
        hasher.update(path.as_os_str().as_encoded_bytes());
        hasher.update(b"\0");
    }
    hasher.update(render::json(report.diagnostics.iter(), &report.sources).as_bytes());
    hasher.digest()
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
    /// The files fail again as they did in the failed reload that stands:
    /// said and counted once (one swap of a mounted directory can raise a
    /// reload or two more).
    StillFailing,
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
    /// Held through a reload: one from the watch and one from SIGHUP must
    /// not interleave their status and gauge updates.
    reloading: Mutex<()>,
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
            reloading: Mutex::new(()),
        };
        let files = reloader.files_of(sources, &[]);
        *lock(&reloader.files) = files;
        Arc::new(reloader)
    }

    /// The files to watch: the policy and the data files it names.
    pub fn files(&self) -> Vec<PathBuf> {
        lock(&self.files).clone()
    }

    /// The policy, the files a check read and those it looked for in vain.
    fn files_of(&self, sources: &SourceMap, unread: &[PathBuf]) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = (0..)
            .map_while(|index| sources.file_at(index))
            .map(|file| PathBuf::from(&file.name))
            .chain(unread.iter().cloned())
            .collect();
        if !files.contains(&self.policy) {
            files.insert(0, self.policy.clone());
        }
        files
    }

    /// Remembers the files to watch after a reload. One that failed keeps
    /// the files watched before as well: a failure must not narrow the
    /// watch (a policy too broken to name its data files still has them,
    /// and they may be what gets fixed).
    fn remember_files(&self, files: Vec<PathBuf>, succeeded: bool) {
        let mut remembered = lock(&self.files);
        if succeeded {
            *remembered = files;
        } else {
            for file in files {
                if !remembered.contains(&file) {
                    remembered.push(file);
                }
            }
        }
    }

    fn status(&self) -> std::sync::MutexGuard<'_, ReloadStatus> {
        lock(&self.proxy.reload_status)
    }

    /// Checks and compiles the files now and, if they check, makes them live.
    /// Blocking: run it off the async workers.
    pub fn reload(&self) -> Outcome {
        let _one_at_a_time = lock(&self.reloading);
        let started = Instant::now();
        let report = check_served_file(&self.policy, Some(&self.data));
        let files = self.files_of(&report.sources, &report.unread);
        // What `check` would warn about the new files, said only when they
        // go live: a rule that can never match is worth knowing at once.
        let warnings: Vec<String> = report
            .warnings_of_a_policy()
            .take(SHOWN_DIAGNOSTICS)
            .map(|d| render::one_line(d, &report.sources))
            .collect();
        match compile_report(report, self.secrets.as_ref()) {
            Ok((snapshot, _)) => {
                self.remember_files(files, true);
                let live = self.proxy.snapshot();
                if snapshot.version == live.version {
                    // Back to what is served (a bad edit undone): no
                    // failure stands any more.
                    let failed = self.status().last_failure.is_some();
                    if failed {
                        // The gauge first: whoever sees the status clear
                        // sees the gauge clear too.
                        self.proxy.metrics.set("switchyard_reload_failed", &[], 0.0);
                        self.status().last_failure = None;
                        tracing::info!(
                            version = %snapshot.version,
                            "the policy's files match the policy being served again"
                        );
                    }
                    return Outcome::Unchanged;
                }
                let version = snapshot.version.clone();
                let name = snapshot.name.clone();
                // A credential the new files add (or whose variable went
                // away) that cannot be sent is said, as at start; one
                // already skipped before is not said again.
                let secrets = self.secrets.as_ref();
                let before = unusable_credentials(&live, secrets);
                let newly_unusable: Vec<UnusableCredential> =
                    unusable_credentials(&snapshot, secrets)
                        .into_iter()
                        .filter(|credential| !before.contains(credential))
                        .collect();
                self.install(snapshot);
                for warning in &warnings {
                    tracing::warn!("{warning}");
                }
                for credential in &newly_unusable {
                    log_unusable(credential);
                }
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
                    policy = %name,
                    version = %version,
                    ms = started.elapsed().as_millis() as u64,
                    "policy reloaded"
                );
                Outcome::Reloaded(version)
            }
            Err(report) => {
                self.remember_files(files, false);
                let digest = failure_digest(&report);
                if self
                    .status()
                    .last_failure
                    .as_ref()
                    .is_some_and(|failure| failure.digest == digest)
                {
                    return Outcome::StillFailing;
                }
                let first_error = report
                    .diagnostics
                    .iter()
                    .find(|d| d.severity() == crate::diagnostics::Severity::Error);
                let failed_file = first_error
                    .and_then(|d| d.file_name(&report.sources))
                    .map(str::to_string);
                let diagnostics: Json = serde_json::from_str(&render::json(
                    report.diagnostics.iter().take(SHOWN_DIAGNOSTICS),
                    &report.sources,
                ))
                .unwrap_or(Json::Null);
                // One line each, as every log event is; `switchyard check`
                // shows the source line and its caret.
                for diagnostic in report.diagnostics.iter().take(SHOWN_DIAGNOSTICS) {
                    tracing::error!("{}", render::one_line(diagnostic, &report.sources));
                }
                tracing::error!(
                    policy = %self.policy.display(),
                    errors = report.diagnostics.iter().filter(|d| d.severity() == crate::diagnostics::Severity::Error).count(),
                    version = %self.proxy.snapshot().version,
                    "reload failed; the previous policy keeps serving"
                );
                // The gauge first, as where a failure clears: whoever sees
                // the status sees the gauge agree.
                self.proxy.metrics.set("switchyard_reload_failed", &[], 1.0);
                self.proxy.metrics.count(
                    "switchyard_reloads_total",
                    &[("result", String::from("failed"))],
                );
                let mut status = self.status();
                status.failures += 1;
                status.last_failure = Some(FailedReload {
                    at_unix_ms: unix_ms(),
                    file: failed_file,
                    diagnostics,
                    digest,
                });
                drop(status);
                Outcome::Failed
            }
        }
    }

    fn install(&self, snapshot: Snapshot) {
        let snapshot = Arc::new(snapshot);
        self.proxy.metrics.set("switchyard_reload_failed", &[], 0.0);
        self.proxy.replace(snapshot.clone());
        // After the replacement: the requests waiting for room, woken
        // here, look again under the new policy's limits.
        let providers: HashSet<&str> = snapshot
            .data
            .catalog
            .providers
            .iter()
            .map(|p| p.id.as_str())
            .collect();
        self.proxy.state.retain_providers(&providers);
    }

    /// Watches the policy's files and reloads on every change (and on
    /// `requests`, e.g. SIGHUP) until the returned handle is dropped.
    pub fn watch(self: &Arc<Self>) -> notify::Result<Watch> {
        let (events, mut changes) = mpsc::unbounded_channel::<()>();
        let relevant = self.clone();
        let watched_events = events.clone();
        // Set when a watched directory (or one above it) was renamed or
        // removed: the watcher drops its watches there by itself, so the
        // cover after the reload puts them back, and one more reload reads
        // what changed while they were gone.
        let watches_dropped = Arc::new(AtomicBool::new(false));
        let dropped_seen = watches_dropped.clone();
        let debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
            let Ok(batch) = result else {
                return;
            };
            // Events the watch may have missed (the kernel's queue ran
            // over) can be the policy's as well as any.
            let rescan = batch.iter().any(|event| event.need_rescan());
            // After a failed reload, a file's permissions may be what was
            // wrong: a chmod that makes it readable changes only metadata.
            let failing = relevant.status().last_failure.is_some();
            let changes: Vec<&PathBuf> = batch
                .iter()
                .filter(|event| changes_content(&event.kind, failing))
                .flat_map(|event| event.paths.iter())
                .collect();
            if !rescan && changes.is_empty() {
                return;
            }
            let watched = paths_to_watch(&relevant.files());
            let directories: HashSet<PathBuf> =
                watched.iter().map(|path| directory_of(path)).collect();
            let above_a_directory = |path: &PathBuf| {
                comparable(path).is_some_and(|path| {
                    directories
                        .iter()
                        .any(|directory| directory.starts_with(&path))
                })
            };
            if batch.iter().any(|event| {
                matches!(
                    event.kind,
                    EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
                ) && event.paths.iter().any(above_a_directory)
            }) {
                dropped_seen.store(true, Ordering::SeqCst);
            }
            // A directory renamed, removed or created as a whole, or one
            // above it, takes its files along.
            let touches_policy = rescan
                || changes
                    .into_iter()
                    .filter_map(|path| comparable(path))
                    .any(|path| {
                        watched.contains(&path)
                            || directories
                                .iter()
                                .any(|directory| directory.starts_with(&path))
                    });
            if touches_policy {
                let _ = watched_events.send(());
            }
        })?;
        let directories = Arc::new(Mutex::new(WatchedDirectories::new(debouncer)));
        lock(&directories).cover(&self.files())?;
        // The files may have changed between the check that made the live
        // policy and the watch's start: one reload looks (and finds nothing
        // to do if they did not).
        let _ = events.send(());
        let more_reloads = events.clone();
        let reloader = self.clone();
        let task_directories = directories.clone();
        let task = tokio::spawn(async move {
            while changes.recv().await.is_some() {
                // Changes that arrive while a reload runs are one more reload.
                while changes.try_recv().is_ok() {}
                let reloading = reloader.clone();
                let _ = tokio::task::spawn_blocking(move || reloading.reload()).await;
                // The reload may have named new files, or a swapped link may
                // lead to a new directory. A directory watched only now may
                // have changed after the reload read it and before its watch
                // began: one more reload reads it again (and finds nothing
                // to do if it did not change).
                let covered = lock(&task_directories).cover(&reloader.files());
                let dropped = watches_dropped.swap(false, Ordering::SeqCst);
                match covered {
                    Ok(Covered::AsBefore) if !dropped => {}
                    Ok(_) => {
                        let _ = more_reloads.send(());
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot watch a directory of the policy's files; SIGHUP still reloads");
                    }
                }
            }
        });
        Ok(Watch {
            _directories: directories,
            requests: events,
            task,
        })
    }
}

type Debouncer = notify_debouncer_full::Debouncer<
    notify::RecommendedWatcher,
    notify_debouncer_full::RecommendedCache,
>;

/// The watcher and the directories it watches, each with the identity of
/// the directory the watch follows.
struct WatchedDirectories {
    debouncer: Debouncer,
    watched: HashMap<PathBuf, Option<DirectoryId>>,
}

impl WatchedDirectories {
    fn new(debouncer: Debouncer) -> WatchedDirectories {
        WatchedDirectories {
            debouncer,
            watched: HashMap::new(),
        }
    }

    /// Watches every directory where a change to `files` can show, and
    /// stops watching those where none can any more (the old target of a
    /// swapped link, which a ConfigMap update also deletes). Directories,
    /// not files: an editor that saves by renaming a new file over the old
    /// one replaces the inode a file watch would follow. Their parents
    /// too, or the nearest directory that exists while one is missing: a
    /// directory renamed into place shows only there. A watch follows a
    /// directory, not its path: a path that now leads to another directory
    /// (one replaced as a whole) has its old watch dropped first. Every
    /// directory is watched again each time, which for one already watched
    /// costs nothing, since the watcher may have dropped a watch by itself
    /// (on a directory moved away, which may come back).
    ///
    /// Only the files' own directories must be watched; a parent that
    /// cannot be (not readable) is left out.
    ///
    /// The directories can change while they are being watched (a deploy
    /// right after the reload that asked for this cover): a watch placed on
    /// a path that no longer leads where it led would miss every later
    /// change. So the directories are looked at again once watched, and
    /// covered again until they hold still; a cover that had to go round
    /// again is `Anew`, since what changed meanwhile may not have been seen.
    fn cover(&mut self, files: &[PathBuf]) -> notify::Result<Covered> {
        self.cover_observed(files, || {})
    }

    /// [`cover`](Self::cover), calling `meanwhile` after each round's
    /// watches are placed, where a change from outside would land.
    fn cover_observed(
        &mut self,
        files: &[PathBuf],
        mut meanwhile: impl FnMut(),
    ) -> notify::Result<Covered> {
        let before = self.watched.clone();
        let mut needed = needed_directories(files);
        let mut moved = false;
        for _ in 0..COVER_ROUNDS {
            let placed = self.watch_exactly(&needed);
            meanwhile();
            let now = needed_directories(files);
            if now == needed {
                placed?;
                return Ok(if moved || self.watched != before {
                    Covered::Anew
                } else {
                    Covered::AsBefore
                });
            }
            moved = true;
            needed = now;
        }
        // Still changing: the watches follow the latest look, and the reload
        // that `Anew` asks for reads whatever is there by then.
        let _ = self.watch_exactly(&needed);
        Ok(Covered::Anew)
    }

    /// Watches the `needed` directories and no others. New watches go in
    /// before old ones come out, so that no moment watches neither; but a
    /// path that now leads to another directory loses its old watch first,
    /// since the watcher keeps one watch per path, and so does an old path
    /// to a directory now needed under another path (moved, or reached
    /// through a swapped link), since the kernel keeps one watch per
    /// directory: unwatching the old path afterwards would take the new
    /// path's watch with it.
    fn watch_exactly(&mut self, needed: &Needed) -> notify::Result<()> {
        for (directory, id) in &self.watched {
            let moved_here = || {
                id.is_some()
                    && needed
                        .iter()
                        .any(|(path, (needed_id, _))| path != directory && needed_id == id)
            };
            let elsewhere_now = needed
                .get(directory)
                .is_some_and(|(needed_id, _)| needed_id != id);
            if elsewhere_now || (!needed.contains_key(directory) && moved_here()) {
                // A deleted directory's watch is gone already; nothing to
                // undo.
                let _ = self.debouncer.unwatch(directory);
            }
        }
        let before = std::mem::take(&mut self.watched);
        let mut first_error = None;
        for (directory, (id, own)) in needed {
            match self.debouncer.watch(directory, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(directory.clone(), *id);
                }
                Err(error) if *own => first_error = first_error.or(Some(error)),
                Err(_) => {}
            }
        }
        for directory in before.keys() {
            if !needed.contains_key(directory) {
                let _ = self.debouncer.unwatch(directory);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// How many times a cover looks again while the directories keep changing
/// under it.
const COVER_ROUNDS: usize = 8;

/// Each directory to watch, with the directory it is now and whether the
/// policy's files are in it itself (not only below a parent watched for a
/// replacement).
type Needed = HashMap<PathBuf, (Option<DirectoryId>, bool)>;

/// The directories where a change to `files` can show: each file's own (or
/// the nearest that exists while it is missing) and that one's parent.
fn needed_directories(files: &[PathBuf]) -> Needed {
    let mut needed = Needed::new();
    for path in paths_to_watch(files) {
        let directory = directory_of(&path);
        let Some((existing, id)) = directory
            .ancestors()
            .find_map(|ancestor| Some((ancestor, directory_id(ancestor)?)))
        else {
            continue;
        };
        if let Some(parent) = existing.parent() {
            needed
                .entry(parent.to_path_buf())
                .or_insert((directory_id(parent), false));
        }
        let own = existing == directory;
        let entry = needed
            .entry(existing.to_path_buf())
            .or_insert((Some(id), own));
        entry.1 |= own;
    }
    needed
}

/// Whether [`WatchedDirectories::cover`] watches what it watched before.
#[derive(Debug, PartialEq, Eq)]
enum Covered {
    AsBefore,
    Anew,
}

/// What tells one directory from another at the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirectoryId {
    device: u64,
    inode: u64,
}

/// The directory at `path`, or `None` when there is none.
#[cfg(unix)]
fn directory_id(path: &Path) -> Option<DirectoryId> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    metadata.is_dir().then(|| DirectoryId {
        device: metadata.dev(),
        inode: metadata.ino(),
    })
}

/// Elsewhere directories are told apart by path only: one replaced as a
/// whole keeps the old one's watch.
#[cfg(not(unix))]
fn directory_id(path: &Path) -> Option<DirectoryId> {
    path.is_dir().then_some(DirectoryId {
        device: 0,
        inode: 0,
    })
}

/// A running watch; dropping it stops watching.
pub struct Watch {
    _directories: Arc<Mutex<WatchedDirectories>>,
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

/// Whether an event may change what a file holds, or, while the last
/// reload `failing`, whether the file can be read. Reads (which a reload
/// itself causes) do not; metadata changes (permissions, owners, times)
/// only matter for a file that could not be read.
fn changes_content(kind: &EventKind, failing: bool) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(_)) => failing,
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

/// Where a change to the policy's files can show: each file, every
/// symbolic link its path goes through, and the file it resolves to. A
/// Kubernetes ConfigMap volume, for one, updates every file at once by
/// pointing one `..data` link at a new directory, so no event names the
/// files themselves. Each path is in [`comparable`] form.
fn paths_to_watch(files: &[PathBuf]) -> HashSet<PathBuf> {
    let mut paths = HashSet::new();
    for file in files {
        let Ok(absolute) = std::path::absolute(file) else {
            continue;
        };
        let mut links = Vec::new();
        let resolved = resolve(&absolute, &mut links);
        let all = std::iter::once(absolute).chain(links).chain(resolved);
        paths.extend(all.filter_map(|path| comparable(&path)));
    }
    paths
}

/// A path as events are compared: the watcher reports paths under the
/// directory it was given, the policy names files as written, so both are
/// taken as their directory's canonical path joined with their name. While
/// the directory is missing (renamed away, its replacement not yet in
/// place), as the nearest one that exists makes it.
fn comparable(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let directory = directory_of(path);
    let (existing, canonical) = directory
        .ancestors()
        .find_map(|ancestor| Some((ancestor, std::fs::canonicalize(ancestor).ok()?)))?;
    let missing = directory.strip_prefix(existing).ok()?;
    Some(canonical.join(missing).join(name))
}

/// More links than this on one path is a loop, as for the kernel.
const MAX_LINKS: usize = 40;

/// Resolves an absolute path as the kernel does, collecting every symbolic
/// link met on the way; `None` for a loop.
fn resolve(path: &Path, links: &mut Vec<PathBuf>) -> Option<PathBuf> {
    let mut resolved = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => {
                let next = resolved.join(name);
                match std::fs::read_link(&next) {
                    Ok(target) => {
                        if links.len() >= MAX_LINKS {
                            return None;
                        }
                        links.push(next);
                        // A relative target starts at the link's directory;
                        // an absolute one replaces the path so far.
                        resolved = resolve(&resolved.join(target), links)?;
                    }
                    Err(_) => resolved = next,
                }
            }
            Component::ParentDir => {
                resolved.pop();
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => resolved.push(component),
        }
    }
    Some(resolved)
}

/// Secrets from the process environment, shareable across threads.
pub fn environment() -> Arc<dyn SecretSource + Send + Sync> {
    Arc::new(Environment)
}

/// Logs a credential whose routes are skipped, with what names it.
pub fn log_unusable(credential: &UnusableCredential) {
    tracing::warn!(
        provider = %credential.provider,
        credential = %credential.credential,
        variable = %credential.variable,
        "{}",
        credential.why
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    fn fresh_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("switchyard-reload-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::canonicalize(dir).unwrap()
    }

    /// `p.policy` as a ConfigMap volume lays it out: a link into `..data`,
    /// itself a link to `..v1`.
    fn link_through_data(dir: &Path) {
        std::fs::create_dir(dir.join("..v1")).unwrap();
        std::fs::write(dir.join("..v1").join("p.policy"), "").unwrap();
        symlink("..v1", dir.join("..data")).unwrap();
        symlink("..data/p.policy", dir.join("p.policy")).unwrap();
    }

    #[test]
    fn a_metadata_change_matters_only_after_a_failed_reload() {
        use notify::event::{AccessKind, DataChange, MetadataKind};
        let chmod = EventKind::Modify(ModifyKind::Metadata(MetadataKind::Permissions));
        assert!(!changes_content(&chmod, false));
        assert!(changes_content(&chmod, true));
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Content));
        assert!(changes_content(&written, false));
        // A reload's own reads never start another.
        let read = EventKind::Access(AccessKind::Read);
        assert!(!changes_content(&read, false) && !changes_content(&read, true));
    }

    #[test]
    fn resolving_follows_links_as_the_kernel_does_and_names_each() {
        let dir = fresh_dir("resolve");
        link_through_data(&dir);
        symlink(dir.join("p.policy"), dir.join("absolute")).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();

        let mut links = Vec::new();
        let resolved = resolve(&dir.join("absolute"), &mut links);
        assert_eq!(resolved, Some(dir.join("..v1").join("p.policy")));
        assert_eq!(
            links,
            [
                dir.join("absolute"),
                dir.join("p.policy"),
                dir.join("..data")
            ]
        );
        assert_eq!(
            resolved.map(std::fs::canonicalize).and_then(Result::ok),
            std::fs::canonicalize(dir.join("absolute")).ok()
        );

        // `..` after a link leaves the directory the link leads to.
        symlink("sub", dir.join("to-sub")).unwrap();
        let mut links = Vec::new();
        assert_eq!(
            resolve(&dir.join("to-sub").join("..").join("p.policy"), &mut links),
            Some(dir.join("..v1").join("p.policy"))
        );
        assert_eq!(links[0], dir.join("to-sub"));

        symlink("loop-b", dir.join("loop-a")).unwrap();
        symlink("loop-a", dir.join("loop-b")).unwrap();
        assert_eq!(resolve(&dir.join("loop-a"), &mut Vec::new()), None);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_linked_file_is_watched_at_every_link_and_where_it_leads() {
        let dir = fresh_dir("watch");
        link_through_data(&dir);
        let watched = paths_to_watch(&[dir.join("p.policy")]);
        let expected: HashSet<PathBuf> = [
            dir.join("p.policy"),
            dir.join("..data"),
            dir.join("..v1").join("p.policy"),
        ]
        .into_iter()
        .collect();
        assert_eq!(watched, expected);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_swapped_link_moves_the_watch_to_its_new_target() {
        let dir = fresh_dir("swap");
        link_through_data(&dir);
        let debouncer = new_debouncer(DEBOUNCE, None, |_: DebounceEventResult| {}).unwrap();
        let mut directories = WatchedDirectories::new(debouncer);
        let files = [dir.join("p.policy")];
        directories.cover(&files).unwrap();
        let watched = |directories: &WatchedDirectories| {
            let mut watched: Vec<PathBuf> = directories.watched.keys().cloned().collect();
            watched.sort();
            watched
        };
        let parent = dir.parent().unwrap().to_path_buf();
        assert_eq!(
            watched(&directories),
            [parent.clone(), dir.clone(), dir.join("..v1")]
        );

        // The update a ConfigMap volume makes: a new directory, `..data`
        // renamed over to lead there, the old directory deleted.
        std::fs::create_dir(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v2").join("p.policy"), "").unwrap();
        symlink("..v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        std::fs::remove_dir_all(dir.join("..v1")).unwrap();
        directories.cover(&files).unwrap();
        assert_eq!(
            watched(&directories),
            [parent, dir.clone(), dir.join("..v2")]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_missing_directory_is_watched_through_the_nearest_that_exists() {
        let dir = fresh_dir("missing");
        let config = dir.join("config");
        std::fs::create_dir(&config).unwrap();
        std::fs::write(config.join("p.policy"), "").unwrap();
        let debouncer = new_debouncer(DEBOUNCE, None, |_: DebounceEventResult| {}).unwrap();
        let mut directories = WatchedDirectories::new(debouncer);
        let files = [config.join("p.policy")];
        assert_eq!(directories.cover(&files).unwrap(), Covered::Anew);
        assert_eq!(directories.cover(&files).unwrap(), Covered::AsBefore);
        let first = directories.watched.get(&config).copied().flatten();
        assert!(first.is_some());

        // Renamed away: the path compares as it did, and its parent, where
        // the replacement will show, stays watched.
        std::fs::rename(&config, dir.join("config.old")).unwrap();
        assert_eq!(
            comparable(&config.join("p.policy")),
            Some(config.join("p.policy"))
        );
        directories.cover(&files).unwrap();
        assert!(!directories.watched.contains_key(&config));
        assert!(directories.watched.contains_key(&dir));

        // A new directory at the path is watched, not the old one, and the
        // caller hears of it.
        std::fs::create_dir(&config).unwrap();
        assert_eq!(directories.cover(&files).unwrap(), Covered::Anew);
        let second = directories.watched.get(&config).copied().flatten();
        assert!(second.is_some());
        assert_ne!(first, second);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_directory_watched_under_a_new_path_keeps_its_watch() {
        let dir = fresh_dir("moved");
        std::fs::create_dir_all(dir.join("a").join("config")).unwrap();
        let (events, seen) = std::sync::mpsc::channel();
        let debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
            if let Ok(batch) = result {
                for event in batch {
                    let _ = events.send(event.paths.clone());
                }
            }
        })
        .unwrap();
        let mut directories = WatchedDirectories::new(debouncer);
        directories
            .cover(&[dir.join("a").join("config").join("p.policy")])
            .unwrap();

        // Moved where nothing watched it go (its parent is not watched),
        // then needed at its new path, as after a release directory is
        // renamed and a link swapped to it: the same directory, so the
        // kernel's one watch serves both paths, and dropping the old path
        // must not drop the new one's.
        std::fs::rename(dir.join("a"), dir.join("b")).unwrap();
        let config = dir.join("b").join("config");
        directories.cover(&[config.join("p.policy")]).unwrap();
        while seen.try_recv().is_ok() {}
        std::fs::write(config.join("p.policy"), "changed").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut noticed = false;
        while !noticed && Instant::now() < deadline {
            if let Ok(paths) = seen.recv_timeout(Duration::from_millis(100)) {
                noticed = paths.iter().any(|path| path.starts_with(&config));
            }
        }
        assert!(noticed, "a change in the moved directory went unseen");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_directory_replaced_while_being_watched_is_watched_anew() {
        let dir = fresh_dir("replaced-meanwhile");
        let config = dir.join("config");
        std::fs::create_dir(&config).unwrap();
        let debouncer = new_debouncer(DEBOUNCE, None, |_: DebounceEventResult| {}).unwrap();
        let mut directories = WatchedDirectories::new(debouncer);
        let files = [config.join("p.policy")];
        directories.cover(&files).unwrap();
        let first = directories.watched.get(&config).copied().flatten();

        // Replaced between the look that chose the watches and their
        // placing: the watch went on the old directory, so the cover goes
        // round again, watches the new one and says so.
        let mut replaced = false;
        let covered = directories.cover_observed(&files, || {
            if !replaced {
                std::fs::rename(&config, dir.join("config.old")).unwrap();
                std::fs::create_dir(&config).unwrap();
                replaced = true;
            }
        });
        assert_eq!(covered.unwrap(), Covered::Anew);
        let now = directories.watched.get(&config).copied().flatten();
        assert_eq!(now, directory_id(&config));
        assert_ne!(now, first);

        // Removed meanwhile: the parent, where a replacement will show, is
        // what the cover ends on.
        let mut removed = false;
        let covered = directories.cover_observed(&files, || {
            if !removed {
                std::fs::remove_dir(&config).unwrap();
                removed = true;
            }
        });
        assert_eq!(covered.unwrap(), Covered::Anew);
        assert!(!directories.watched.contains_key(&config));
        assert!(directories.watched.contains_key(&dir));

        // Nothing changing: as before.
        assert_eq!(directories.cover(&files).unwrap(), Covered::AsBefore);
        let _ = std::fs::remove_dir_all(dir);
    }
}
