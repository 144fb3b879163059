//! Runs one reference policy's benchmark decision a given number of times,
//! for counting instructions (callgrind), where criterion's timing loop
//! would be in the way. The cost of `COUNT` decisions is the count of a run
//! with `COUNT` less that of a run with 0 (which builds the same snapshot):
//!
//!     cargo build --release --example decide
//!     valgrind --tool=callgrind target/release/examples/decide noirdoc 1000 2000
//!     valgrind --tool=callgrind target/release/examples/decide noirdoc 1000 0
//!
//! `noirdoc-native` runs the Noirdoc rules written by hand instead, and
//! `POLICY-afresh` makes every plan afresh where the snapshot would
//! remember it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use common::decisions::{NativeNoirdoc, context, generate, request};
use std::hint::black_box;
use switchyard::evaluate::health::Healthy;
use switchyard::evaluate::{evaluate, evaluate_afresh};

#[path = "common/mod.rs"]
mod common;

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let [name, routes, count] = arguments.as_slice() else {
        eprintln!("usage: decide POLICY|POLICY-afresh|noirdoc-native ROUTES COUNT");
        std::process::exit(2);
    };
    let routes: usize = routes.parse().expect("ROUTES is a number");
    let count: usize = count.parse().expect("COUNT is a number");
    let native = name == "noirdoc-native";
    let (policy, afresh) = match name.strip_suffix("-afresh") {
        Some(policy) => (policy, true),
        None if native => ("noirdoc", false),
        None => (name.as_str(), false),
    };
    let snapshot = generate(policy, routes);
    let (key, endpoint, body, headers) = request(policy);
    let context = context(&snapshot, key, endpoint, &body, &headers);
    if native {
        let rules = NativeNoirdoc::new(&snapshot);
        let model = body["model"].as_str().unwrap();
        for _ in 0..count {
            black_box(rules.decide(
                black_box(&snapshot),
                context.caller,
                black_box(model),
                endpoint,
            ))
            .unwrap();
        }
    } else {
        let decide = if afresh { evaluate_afresh } else { evaluate };
        for _ in 0..count {
            assert!(
                black_box(decide(black_box(&snapshot), black_box(&context), &Healthy))
                    .result
                    .is_ok()
            );
        }
    }
}
