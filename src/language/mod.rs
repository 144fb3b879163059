//! The policy language: grammar-driven parsing into a syntax tree, and the
//! checker that resolves and type-checks it against the data schema.
//!
//! [`check_file`] is the one entry point that reads a policy with its data
//! files and checks everything; `switchyard check` and live reloads both use it.

pub mod ast;
pub mod check;
pub mod ir;
pub mod parse;

use crate::data::{self, Data, ReadWhen};
use crate::diagnostics::{Diagnostic, Diagnostics, codes};
use crate::source::{SourceId, SourceMap, Span};
use ast::{DataFileKind, Item};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A policy that checked without errors, with its data.
#[derive(Debug)]
pub struct CheckedPolicy {
    pub name: String,
    pub source: SourceId,
    pub program: ir::Program,
    /// Shared: a reload whose data files did not change reuses them.
    pub data: Arc<Data>,
}

/// The data of the last load that was clean, by the exact text of its
/// files: a reload that only changes the policy skips reading them again
/// (for a large catalog, parsing is most of a reload's time).
#[derive(Default)]
pub struct DataCache {
    last: std::sync::Mutex<Option<(String, String, Arc<Data>)>>,
}

impl DataCache {
    fn get(&self, catalog: &str, tenants: &str) -> Option<Arc<Data>> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref() {
            Some((c, t, data)) if c == catalog && t == tenants => Some(data.clone()),
            _ => None,
        }
    }

    fn put(&self, catalog: &str, tenants: &str, data: Arc<Data>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((catalog.to_string(), tenants.to_string(), data));
    }
}

/// Everything one check produced: the files read, the diagnostics, and the
/// policy when there were no errors.
#[derive(Debug)]
pub struct CheckReport {
    pub sources: SourceMap,
    pub diagnostics: Diagnostics,
    pub policy: Option<CheckedPolicy>,
    /// The files the check looked for and could not read (each an `E0108`),
    /// so that a watch can wait for them to appear.
    pub unread: Vec<PathBuf>,
}

impl CheckReport {
    /// The warnings of a policy that checks, as `serve` and reloads say
    /// them when it goes live; none for one that does not (its errors are
    /// what matters then).
    pub fn warnings_of_a_policy(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| {
            self.policy.is_some() && d.severity() == crate::diagnostics::Severity::Warning
        })
    }
}

/// Largest policy file accepted: far above any real policy, small enough that
/// a runaway file cannot exhaust memory in the checker.
const MAX_POLICY_BYTES: usize = 4 * 1024 * 1024;

/// Reads, parses and checks a policy file together with the catalog and
/// tenants files it names (paths relative to the policy file).
pub fn check_file(path: &Path) -> CheckReport {
    check_file_read(path, ReadWhen::Once, None)
}

/// `check_file` for a policy that is served, which is read again at every
/// reload: a pipe in its place is refused, as in a data file's. Reuses
/// `cache`'s data when the data files are unchanged (and remembers them
/// when they load cleanly).
pub fn check_served_file(path: &Path, cache: Option<&DataCache>) -> CheckReport {
    check_file_read(path, ReadWhen::AtEveryReload, cache)
}

fn check_file_read(path: &Path, when: ReadWhen, cache: Option<&DataCache>) -> CheckReport {
    let mut sources = SourceMap::new();
    let mut diagnostics = Vec::new();
    let shown = path.display().to_string();
    let read = data::read_source(path, &shown, &mut sources, &mut diagnostics, None, when);
    let Some(source) = read else {
        let mut report = finish(sources, diagnostics, None);
        report.unread.push(path.to_path_buf());
        return report;
    };
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    check_source_cached(sources, source, base, diagnostics, cache)
}

/// Checks policy text already in the source map; data paths are resolved
/// against `base`.
pub fn check_source(
    sources: SourceMap,
    source: SourceId,
    base: &Path,
    diagnostics: Vec<Diagnostic>,
) -> CheckReport {
    check_source_cached(sources, source, base, diagnostics, None)
}

fn check_source_cached(
    mut sources: SourceMap,
    source: SourceId,
    base: &Path,
    mut diagnostics: Vec<Diagnostic>,
    cache: Option<&DataCache>,
) -> CheckReport {
    let text = sources
        .file(source)
        .map(|file| file.text.clone())
        .unwrap_or_default();
    if text.len() > MAX_POLICY_BYTES {
        diagnostics.push(
            Diagnostic::new(codes::READ_FAILED, "the policy file is larger than 4 MiB")
                .at(source, Span::new(0, 0), "in this file")
                .help("split long definitions; a policy is usually a few hundred lines"),
        );
        return finish(sources, diagnostics, None);
    }
    let parsed = parse::parse(source, &text);
    // Statements that did not parse may hold what seems missing: with syntax
    // errors, "missing" and "unused" findings would only be noise.
    let syntax_errors = parsed
        .diagnostics
        .iter()
        .any(|d| d.severity() == crate::diagnostics::Severity::Error);
    diagnostics.extend(parsed.diagnostics);

    let header = parsed.file.items.iter().find_map(|item| match item {
        Item::Policy(policy) => Some(policy),
        _ => None,
    });
    let mut catalog_setting = None;
    let mut tenants_setting = None;
    let name = header.map(|h| h.name.name.clone()).unwrap_or_default();
    if let Some(header) = header {
        for kind in [DataFileKind::Catalog, DataFileKind::Tenants] {
            let settings: Vec<_> = header.settings.iter().filter(|s| s.kind == kind).collect();
            let word = match kind {
                DataFileKind::Catalog => "catalog",
                DataFileKind::Tenants => "tenants",
            };
            match settings.as_slice() {
                [] if syntax_errors => {}
                [] => diagnostics.push(
                    Diagnostic::new(
                        codes::MISSING_SECTION,
                        format!("the policy header names no {word} file"),
                    )
                    .at(source, header.keyword, "in this header")
                    .help(format!(
                        "add `{word} \"PATH\"` inside `policy {} {{ ... }}`",
                        header.name.name
                    )),
                ),
                [only] => match kind {
                    DataFileKind::Catalog => catalog_setting = Some(*only),
                    DataFileKind::Tenants => tenants_setting = Some(*only),
                },
                [first, second, ..] => diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_SECTION,
                        format!("the policy header names two {word} files"),
                    )
                    .at(source, second.kind_span, "second one here")
                    .also(source, first.kind_span, "first one here")
                    .help("a policy reads one catalog and one tenants file"),
                ),
            }
        }
    }

    let mut checked = None;
    let mut unread = Vec::new();
    if let (Some(catalog), Some(tenants)) = (catalog_setting, tenants_setting) {
        let mut read = |setting: &ast::PolicySetting,
                        sources: &mut SourceMap,
                        diagnostics: &mut Vec<Diagnostic>| {
            let path = base.join(&setting.path.value);
            let shown = path.display().to_string();
            let read = data::read_source(
                &path,
                &shown,
                sources,
                diagnostics,
                Some((source, setting.path.span)),
                // Named by the policy: read again at every reload.
                ReadWhen::AtEveryReload,
            );
            if read.is_none() {
                unread.push(path);
            }
            read
        };
        let catalog_source = read(catalog, &mut sources, &mut diagnostics);
        let tenants_source = read(tenants, &mut sources, &mut diagnostics);
        if let (Some(catalog_source), Some(tenants_source)) = (catalog_source, tenants_source) {
            let text = |id| sources.file(id).map_or("", |file| file.text.as_str());
            let (catalog_text, tenants_text) = (text(catalog_source), text(tenants_source));
            let cached = cache.and_then(|cache| cache.get(catalog_text, tenants_text));
            let data = match cached {
                Some(data) => Some(data),
                None => {
                    let (data, data_diagnostics) =
                        data::load(catalog_source, tenants_source, &sources);
                    let clean = data_diagnostics.is_empty();
                    diagnostics.extend(data_diagnostics);
                    let data = data.map(Arc::new);
                    if let (Some(cache), Some(data), true) = (cache, &data, clean) {
                        cache.put(catalog_text, tenants_text, data.clone());
                    }
                    data
                }
            };
            if let Some(mut data) = data {
                let check = |data: &Data| {
                    check::Checker::run(
                        source,
                        &parsed.file,
                        &parsed.broken_names,
                        syntax_errors,
                        data,
                    )
                };
                let (mut check_diagnostics, mut program) = check(&data);
                // Data read without positions is read again with them when
                // a diagnostic points into it.
                let points_into_data = |diagnostic: &Diagnostic| {
                    diagnostic
                        .primary
                        .iter()
                        .chain(&diagnostic.secondary)
                        .any(|label| {
                            label.source == catalog_source || label.source == tenants_source
                        })
                };
                if !data.located
                    && check_diagnostics.iter().any(points_into_data)
                    && let (Some(located), _) = data::load_reading(
                        catalog_source,
                        tenants_source,
                        &sources,
                        data::Reading::WithPositions,
                    )
                {
                    data = Arc::new(located);
                    (check_diagnostics, program) = check(&data);
                }
                diagnostics.extend(check_diagnostics);
                checked = Some((data, program));
            }
        }
    } else if header.is_none() && !syntax_errors {
        // Without a header there is no data to check names against; report
        // the missing header once, with the syntax problems.
        diagnostics.push(
            Diagnostic::new(codes::MISSING_SECTION, "the file has no `policy` header")
                .at(source, Span::new(0, 0), "expected at the start")
                .help("start the file with `policy NAME { catalog \"FILE\" tenants \"FILE\" }`"),
        );
    }

    let has_errors = diagnostics
        .iter()
        .any(|d| d.severity() == crate::diagnostics::Severity::Error);
    let policy = match (has_errors, checked) {
        (false, Some((data, program))) => Some(CheckedPolicy {
            name,
            source,
            program,
            data,
        }),
        _ => None,
    };
    let mut report = finish(sources, diagnostics, policy);
    report.unread = unread;
    report
}

/// Parses and checks policy text against data already loaded, ignoring the
/// data files its header names. Used by the fuzz targets and tests that vary
/// the policy over one data set.
pub fn check_text_with_data(
    sources: &mut SourceMap,
    name: &str,
    text: &str,
    data: &Data,
) -> Vec<Diagnostic> {
    let source = sources.add(name, text);
    let parsed = parse::parse(source, text);
    let syntax_errors = parsed
        .diagnostics
        .iter()
        .any(|d| d.severity() == crate::diagnostics::Severity::Error);
    let mut diagnostics = parsed.diagnostics;
    diagnostics.extend(
        check::Checker::run(
            source,
            &parsed.file,
            &parsed.broken_names,
            syntax_errors,
            data,
        )
        .0,
    );
    diagnostics
}

fn finish(
    sources: SourceMap,
    diagnostics: Vec<Diagnostic>,
    policy: Option<CheckedPolicy>,
) -> CheckReport {
    let mut all = Diagnostics::new();
    all.extend(diagnostics);
    all.sort();
    CheckReport {
        sources,
        diagnostics: all,
        policy,
        unread: Vec::new(),
    }
}
