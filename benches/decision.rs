//! Decisions per second for each reference policy on generated catalogs of
//! 1,000 and 10,000 routes, and the Noirdoc rules written by hand in plain
//! Rust over the same snapshot: the native baseline, measured in the same run.
//! A snapshot remembers the plans of policies whose plans depend only on the
//! caller, model and endpoint (Noirdoc, noeta), so for those `POLICY/N`
//! measures a remembered plan and `POLICY-afresh/N` one made every time.
//!
//! Run: `cargo bench --bench decision`. BENCHMARKS.md records a run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use common::decisions::{NativeNoirdoc, caller, context, generate, request};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use switchyard::evaluate::health::Healthy;
use switchyard::evaluate::{evaluate, evaluate_afresh};

mod common;

fn benchmarks(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for routes in [1_000, 10_000] {
        for policy in ["noirdoc", "anonrouter", "noeta", "ngrok", "ai-setu"] {
            let snapshot = generate(policy, routes);
            let (key, endpoint, body, headers) = request(policy);
            let context = context(&snapshot, key, endpoint, &body, &headers);
            assert!(
                evaluate(&snapshot, &context, &Healthy).result.is_ok(),
                "{policy} refuses its benchmark request"
            );
            group.bench_function(format!("{policy}/{routes}"), |b| {
                b.iter(|| {
                    black_box(evaluate(
                        black_box(&snapshot),
                        black_box(&context),
                        &Healthy,
                    ))
                });
            });
            if snapshot.remembered_plans().is_some() {
                group.bench_function(format!("{policy}-afresh/{routes}"), |b| {
                    b.iter(|| {
                        black_box(evaluate_afresh(
                            black_box(&snapshot),
                            black_box(&context),
                            &Healthy,
                        ))
                    });
                });
            }
            if policy == "noirdoc" {
                let native = NativeNoirdoc::new(&snapshot);
                let caller = caller(&snapshot, key);
                let interpreted: Vec<(usize, usize)> = evaluate(&snapshot, &context, &Healthy)
                    .result
                    .unwrap()
                    .candidates
                    .iter()
                    .map(|c| (c.provider, c.credential))
                    .collect();
                let by_hand: Vec<(usize, usize)> = native
                    .decide(&snapshot, caller, "qwen3.8-27b", endpoint)
                    .unwrap()
                    .iter()
                    .map(|c| (c.provider, c.credential))
                    .collect();
                assert_eq!(
                    interpreted, by_hand,
                    "the native baseline must decide as the policy does"
                );
                group.bench_function(format!("noirdoc-native/{routes}"), |b| {
                    b.iter(|| {
                        black_box(native.decide(
                            black_box(&snapshot),
                            caller,
                            black_box("qwen3.8-27b"),
                            endpoint,
                        ))
                    });
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, benchmarks);
criterion_main!(benches);
