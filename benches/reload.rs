//! How long a reload takes: checking and compiling the policy and its data,
//! the path every live reload runs, for the shipped Noirdoc catalog (the
//! baseline) and for generated catalogs of 1,000 and 10,000 routes. Two
//! cases: `data`, where the data files changed and are read again (until
//! the new snapshot is built; `data+free` adds freeing a snapshot, as a
//! reload frees the one it replaced after the swap), and `policy`, where
//! only the policy changed and the reloader reuses the data it read last
//! time. The generated catalogs are JSON text, which the JSON
//! reader takes; `noirdoc-10000-yaml` is the same catalog made to go through
//! the YAML reader.
//!
//! Run: `cargo bench --bench reload`. BENCHMARKS.md records a run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard::compile::{AllSecrets, compile_report};
use switchyard::language::check_file;
use switchyard::proxy::{Options, Proxy};
use switchyard::reload::{Outcome, Reloader};
use switchyard::state::{InProcess, SystemClock};

fn reloader(policy: &Path) -> Arc<Reloader> {
    let (snapshot, sources) = match compile_report(check_file(policy), &AllSecrets) {
        Ok(compiled) => compiled,
        Err(report) => panic!(
            "{} does not check: {:#?}",
            policy.display(),
            report.diagnostics
        ),
    };
    let proxy = Proxy::new(
        Arc::new(snapshot),
        InProcess::new(Arc::new(SystemClock::new())),
        Options::default(),
    );
    Reloader::new(proxy, policy.to_path_buf(), &sources, Arc::new(AllSecrets))
}

/// A copy of a generated policy whose catalog the YAML reader reads: the
/// generated catalog is JSON text, which the JSON reader takes; a comment
/// line before it keeps it YAML, but no longer JSON.
fn read_as_yaml(policy: &Path) -> PathBuf {
    let from = policy.parent().unwrap();
    let to = from.with_file_name(format!(
        "{}-yaml",
        from.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&to).unwrap();
    for file in ["policy.policy", "tenants.yaml"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
    let catalog = std::fs::read_to_string(from.join("catalog.yaml")).unwrap();
    std::fs::write(
        to.join("catalog.yaml"),
        format!("# read as YAML\n{catalog}"),
    )
    .unwrap();
    to.join("policy.policy")
}

fn benchmarks(c: &mut Criterion) {
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies/noirdoc.policy");
    let mut group = c.benchmark_group("reload");
    group.sample_size(20);
    for (name, policy) in [
        (String::from("noirdoc-shipped"), shipped),
        (
            String::from("noirdoc-1000"),
            common::generate_policy("noirdoc", 1_000),
        ),
        (
            String::from("noirdoc-10000"),
            common::generate_policy("noirdoc", 10_000),
        ),
        (
            String::from("noirdoc-10000-yaml"),
            read_as_yaml(&common::generate_policy("noirdoc", 10_000)),
        ),
    ] {
        // Until the new snapshot could serve; the one it replaces is freed
        // after the swap, which `data+free` adds (as freeing this one).
        group.bench_function(format!("{name}/data"), |b| {
            b.iter_with_large_drop(|| compile_report(check_file(&policy), &AllSecrets))
        });
        group.bench_function(format!("{name}/data+free"), |b| {
            b.iter(|| compile_report(check_file(&policy), &AllSecrets).is_ok())
        });
        let reloader = reloader(&policy);
        // Unchanged files still go through the whole check and compile; the
        // first reload fills the data cache.
        assert_eq!(reloader.reload(), Outcome::Unchanged);
        group.bench_function(format!("{name}/policy"), |b| b.iter(|| reloader.reload()));
    }
    group.finish();
}

criterion_group!(reloads, benchmarks);
criterion_main!(reloads);
