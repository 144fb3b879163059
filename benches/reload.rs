//! How long a reload takes: checking and compiling the policy and its data,
//! the path every live reload runs, for the shipped Noirdoc catalog (the
//! baseline) and for generated catalogs of 1,000 and 10,000 routes. Two
//! cases: `data`, where the data files changed and are read again, and
//! `policy`, where only the policy changed and the reloader reuses the data
//! it read last time.
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
    ] {
        group.bench_function(format!("{name}/data"), |b| {
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
