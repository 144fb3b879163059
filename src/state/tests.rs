#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use super::*;
use crate::evaluate::health::Stats;

fn state() -> (Arc<ManualClock>, Arc<InProcess>) {
    let clock = Arc::new(ManualClock::default());
    let state = InProcess::new(clock.clone());
    (clock, state)
}

fn keys(provider: &str) -> CandidateKeys {
    CandidateKeys {
        provider: ScopeKey::Provider(Arc::from(provider)),
        route: ScopeKey::Route(Arc::from("m"), Arc::from(provider)),
        credential: ScopeKey::Credential(Arc::from(provider), Arc::from("c")),
    }
}

const DAY: u64 = 86_400_000;

#[test]
fn a_pause_ends_and_the_longer_of_two_wins() {
    let (clock, state) = state();
    let candidate = keys("p");
    state.pause(&candidate.route, clock.now_ms(), 5_000);
    state.pause(&candidate.provider, clock.now_ms(), 2_000);
    assert_eq!(
        state.candidate_health(&candidate, None, DAY).paused_for_ms,
        Some(5_000)
    );
    state.pause(&candidate.route, clock.now_ms(), 1_000);
    assert_eq!(
        state.candidate_health(&candidate, None, DAY).paused_for_ms,
        Some(5_000)
    );
    clock.advance(4_999);
    assert_eq!(
        state.candidate_health(&candidate, None, DAY).paused_for_ms,
        Some(1)
    );
    clock.advance(1);
    assert_eq!(
        state.candidate_health(&candidate, None, DAY).paused_for_ms,
        None
    );
    // Other providers were never paused.
    assert_eq!(
        state.candidate_health(&keys("q"), None, DAY).paused_for_ms,
        None
    );
}

#[test]
fn a_pause_counts_from_the_failure_not_from_when_it_is_applied() {
    let (clock, state) = state();
    let candidate = keys("p");
    let failed_ms = clock.now_ms();
    clock.advance(1_500);
    state.pause(&candidate.provider, failed_ms, 5_000);
    assert_eq!(
        state.candidate_health(&candidate, None, DAY).paused_for_ms,
        Some(3_500)
    );
}

#[test]
fn penalties_grow_by_the_factor_up_to_the_max_and_reset() {
    let (clock, state) = state();
    let candidate = keys("p");
    let schedule = PenaltySchedule {
        base_ms: 1_000,
        factor: 3.0,
        max_ms: 5_000,
        reset_ms: 60_000,
    };
    state.penalize(&candidate.provider, clock.now_ms(), &schedule);
    let health = state.candidate_health(&candidate, None, DAY);
    assert!(health.penalized);
    assert_eq!(health.strikes, 1);
    clock.advance(1_000);
    assert!(!state.candidate_health(&candidate, None, DAY).penalized);

    // A second failure within `reset`: 3 s; a third: 9 s capped at 5 s.
    state.penalize(&candidate.provider, clock.now_ms(), &schedule);
    clock.advance(2_999);
    assert!(state.candidate_health(&candidate, None, DAY).penalized);
    clock.advance(1);
    assert!(!state.candidate_health(&candidate, None, DAY).penalized);
    state.penalize(&candidate.provider, clock.now_ms(), &schedule);
    assert_eq!(state.candidate_health(&candidate, None, DAY).strikes, 3);
    clock.advance(4_999);
    assert!(state.candidate_health(&candidate, None, DAY).penalized);
    clock.advance(1);
    assert!(!state.candidate_health(&candidate, None, DAY).penalized);

    // After `reset` without a failure the count starts again, and reads
    // so before the next failure too (the last was 5 s ago).
    clock.advance(54_999);
    assert_eq!(state.candidate_health(&candidate, None, DAY).strikes, 3);
    clock.advance(1);
    assert_eq!(state.candidate_health(&candidate, None, DAY).strikes, 0);
    state.penalize(&candidate.provider, clock.now_ms(), &schedule);
    assert_eq!(state.candidate_health(&candidate, None, DAY).strikes, 1);
}

#[test]
fn a_zero_base_never_penalizes_however_many_strikes() {
    let (clock, state) = state();
    let candidate = keys("p");
    let schedule = PenaltySchedule {
        base_ms: 0,
        factor: 2.0,
        max_ms: 300_000,
        reset_ms: 60_000,
    };
    // Past 2^1024 the factor overflows to infinity; 0 × ∞ is not the max.
    for _ in 0..1_100 {
        state.penalize(&candidate.provider, clock.now_ms(), &schedule);
    }
    clock.advance(1);
    assert!(!state.candidate_health(&candidate, None, DAY).penalized);
}

#[test]
fn routes_measured_long_ago_or_beyond_the_bound_are_swept() {
    let (clock, state) = state();
    // Routes of made-up model ids, as an `unknown serve` tier keys them.
    let routes: Vec<ScopeKey> = (0..70_000).map(|n| keys(&format!("p{n}")).route).collect();
    for route in &routes {
        clock.advance(1);
        state.record(route, Sample::default(), DAY);
    }
    let measured = state.measured_routes();
    assert!(
        measured <= 65_536 + 4_096,
        "{measured} routes kept after the sweeps"
    );
    // The most recent are kept; a window that ended drops them all.
    let last = keys("p69999");
    assert_eq!(state.candidate_health(&last, None, DAY).stats.samples, 1);
    clock.advance(DAY + 1);
    for _ in 0..4_096 {
        state.record(&last.route, Sample::default(), DAY);
    }
    assert_eq!(state.measured_routes(), 1);
}

#[test]
fn stats_cover_the_window_only() {
    let (clock, state) = state();
    let candidate = keys("p");
    let ok = Sample {
        success: true,
        ttft_ms: Some(100),
        latency_ms: Some(400),
        throughput: Some(50.0),
    };
    state.record(&candidate.route, ok, 60_000);
    clock.advance(10_000);
    state.record(&candidate.route, Sample::default(), 60_000);
    state.record(
        &candidate.route,
        Sample {
            ttft_ms: Some(300),
            latency_ms: Some(600),
            throughput: Some(70.0),
            ..ok
        },
        60_000,
    );
    let stats = state.candidate_health(&candidate, None, 60_000).stats;
    assert_eq!(stats.samples, 3);
    assert_eq!(stats.success_rate, Some(2.0 / 3.0));
    assert_eq!(stats.ttft_ms, Some(200));
    assert_eq!(stats.latency_ms, Some(500));
    assert_eq!(stats.throughput, Some(60.0));
    // The first sample falls out of a 5 s window.
    let stats = state.candidate_health(&candidate, None, 5_000).stats;
    assert_eq!(stats.samples, 2);
    assert_eq!(stats.success_rate, Some(0.5));
}

#[test]
fn concurrency_limits_admit_until_full_and_permits_give_room_back() {
    let (_clock, state) = state();
    let limits = Some(CapacityLimits {
        concurrent: Some(2),
        window: None,
    });
    let first = state.try_acquire("p", limits, None).unwrap();
    let second = state.try_acquire("p", limits, None).unwrap();
    assert!(state.try_acquire("p", limits, None).is_none());
    let health = state.candidate_health(&keys("p"), limits, DAY);
    assert!(health.full);
    assert_eq!(health.in_flight, 2);
    assert_eq!(health.free_in_ms, None);
    drop(first);
    assert!(!state.candidate_health(&keys("p"), limits, DAY).full);
    drop(second);
    assert_eq!(state.in_flight_total(), 0);
}

#[test]
fn window_limits_say_when_room_returns() {
    let (clock, state) = state();
    let limits = Some(CapacityLimits {
        concurrent: None,
        window: Some((2, 10_000)),
    });
    drop(state.try_acquire("p", limits, None).unwrap());
    clock.advance(3_000);
    drop(state.try_acquire("p", limits, None).unwrap());
    assert!(state.try_acquire("p", limits, None).is_none());
    let health = state.candidate_health(&keys("p"), limits, DAY);
    assert!(health.full);
    assert_eq!(health.free_in_ms, Some(7_000));
    clock.advance(7_000);
    assert!(state.try_acquire("p", limits, None).is_some());
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let (_clock, state) = state();
    let limits = Some(CapacityLimits {
        concurrent: Some(1),
        window: None,
    });
    let busy = state.try_acquire("p", limits, None).unwrap();
    let first = state.enqueue(HashSet::from([Arc::from("p")]));
    let second = state.enqueue(HashSet::from([Arc::from("p")]));
    drop(busy);
    // Room is back, but it is the first waiter's: neither the second nor a
    // newcomer may take it.
    assert!(state.try_acquire("p", limits, Some(&second)).is_none());
    assert!(state.try_acquire("p", limits, None).is_none());
    assert!(state.candidate_health(&keys("p"), limits, DAY).full);
    let permit = state.try_acquire("p", limits, Some(&first)).unwrap();
    drop(first);
    drop(permit);
    assert!(state.try_acquire("p", limits, Some(&second)).is_some());
}

#[test]
fn waiters_only_hold_back_the_providers_they_wait_for() {
    let (_clock, state) = state();
    let _waiting = state.enqueue(HashSet::from([Arc::from("p")]));
    assert!(state.try_acquire("q", None, None).is_some());
    assert!(state.try_acquire("p", None, None).is_none());
}

#[test]
fn only_earlier_waiters_for_the_same_provider_come_first() {
    let (_clock, state) = state();
    let set = |names: &[&str]| names.iter().map(|n| Arc::from(*n)).collect::<HashSet<_>>();
    let first = state.enqueue(set(&["p"]));
    let second = state.enqueue(set(&["p", "q"]));
    let third = state.enqueue(set(&["q"]));
    // The first waiter has `p` to itself; the second waits behind it for
    // `p` but is first for `q`; the third is behind the second for `q`.
    assert!(state.has_room("p", None, Some(&first)));
    assert!(!state.has_room("p", None, Some(&second)));
    assert!(state.has_room("q", None, Some(&second)));
    assert!(!state.has_room("q", None, Some(&third)));
    // The second lets `q` go: the third is first for it now.
    state.wait_for(&second, set(&["p"]));
    assert!(state.has_room("q", None, Some(&third)));
    // The first leaves: the second is first for `p`.
    drop(first);
    assert!(state.has_room("p", None, Some(&second)));
    assert!(!state.has_room("p", None, None), "newcomers queue behind");
    drop(second);
    drop(third);
    assert!(state.has_room("p", None, None) && state.has_room("q", None, None));
}

/// Whether `ticket`'s holder has been woken since it last listened.
fn woken(ticket: &Ticket) -> bool {
    use futures_util::FutureExt;
    ticket.room_may_have_appeared().now_or_never().is_some()
}

#[test]
fn room_wakes_only_the_waiter_first_in_line_for_it() {
    let (_clock, state) = state();
    let set = |names: &[&str]| names.iter().map(|n| Arc::from(*n)).collect::<HashSet<_>>();
    let limits = Some(CapacityLimits {
        concurrent: Some(1),
        window: None,
    });
    let busy_p = state.try_acquire("p", limits, None).unwrap();
    let busy_q = state.try_acquire("q", limits, None).unwrap();
    let first = state.enqueue(set(&["p"]));
    let second = state.enqueue(set(&["p", "q"]));
    let third = state.enqueue(set(&["q"]));

    // Room at `p` is the first's: it alone is woken.
    drop(busy_p);
    assert!(woken(&first));
    assert!(!woken(&second) && !woken(&third));
    // Room at `q` is the second's (first in line there).
    drop(busy_q);
    assert!(woken(&second));
    assert!(!woken(&first) && !woken(&third));
    // The second lets `q` go: the third is first for it now, and looks.
    state.wait_for(&second, set(&["p"]));
    assert!(woken(&third));
    assert!(!woken(&first) && !woken(&second));
    // The first leaves: the second is first for `p`, and looks.
    drop(first);
    assert!(woken(&second));
    assert!(!woken(&third));
    // A reload wakes everyone: limits may have changed anywhere.
    state.retain_providers(&HashSet::from(["p", "q"]));
    assert!(woken(&second) && woken(&third));
}

#[test]
fn removed_providers_lose_their_state() {
    let (clock, state) = state();
    state.pause(&keys("gone").provider, clock.now_ms(), 60_000);
    state.pause(&keys("kept").provider, clock.now_ms(), 60_000);
    state.retain_providers(&HashSet::from(["kept"]));
    assert!(
        state
            .candidate_health(&keys("gone"), None, DAY)
            .paused_for_ms
            .is_none()
    );
    assert!(
        state
            .candidate_health(&keys("kept"), None, DAY)
            .paused_for_ms
            .is_some()
    );
}

/// The statistics a pass over the samples in the window gives, as the
/// running totals must.
fn recomputed(samples: &[Sample]) -> Stats {
    let successes: Vec<&Sample> = samples.iter().filter(|s| s.success).collect();
    let mean = |values: Vec<u64>| {
        (!values.is_empty()).then(|| values.iter().sum::<u64>() / values.len() as u64)
    };
    let throughputs: Vec<f64> = successes.iter().filter_map(|s| s.throughput).collect();
    Stats {
        samples: u32::try_from(samples.len()).unwrap(),
        success_rate: (!samples.is_empty()).then(|| successes.len() as f64 / samples.len() as f64),
        ttft_ms: mean(successes.iter().filter_map(|s| s.ttft_ms).collect()),
        latency_ms: mean(successes.iter().filter_map(|s| s.latency_ms).collect()),
        throughput: (!throughputs.is_empty())
            .then(|| throughputs.iter().sum::<f64>() / throughputs.len() as f64),
    }
}

fn any_sample() -> impl proptest::strategy::Strategy<Value = Sample> {
    use proptest::prelude::*;
    (
        any::<bool>(),
        proptest::option::of(0u64..100_000),
        proptest::option::of(0u64..600_000),
        proptest::option::of(0.0f64..5_000.0),
    )
        .prop_map(|(success, ttft_ms, latency_ms, throughput)| Sample {
            success,
            ttft_ms,
            latency_ms,
            throughput,
        })
}

proptest::proptest! {
    // Each case records up to 1,200 samples (past the per-route bound).
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// Samples recorded at increasing times, some falling out of the window
    /// or past the per-route bound: the running totals say what a pass over
    /// the samples left in the window says (throughput to a millionth).
    #[test]
    fn running_totals_match_a_pass_over_the_window(
        steps in proptest::collection::vec((0u64..200, any_sample()), 0..1_200),
        window in 1u64..60_000,
    ) {
        let (clock, state) = state();
        let candidate = keys("p");
        let mut kept: std::collections::VecDeque<(u64, Sample)> = Default::default();
        for (wait, sample) in steps {
            clock.advance(wait);
            state.record(&candidate.route, sample, window);
            kept.push_back((clock.now_ms(), sample));
            if kept.len() > 1024 {
                kept.pop_front();
            }
            let now = clock.now_ms();
            kept.retain(|(at, _)| at + window >= now);
            let samples: Vec<Sample> = kept.iter().map(|(_, s)| *s).collect();
            let expected = recomputed(&samples);
            let got = state.candidate_health(&candidate, None, window).stats;
            proptest::prop_assert_eq!(got.samples, expected.samples);
            proptest::prop_assert_eq!(got.success_rate, expected.success_rate);
            proptest::prop_assert_eq!(got.ttft_ms, expected.ttft_ms);
            proptest::prop_assert_eq!(got.latency_ms, expected.latency_ms);
            match (got.throughput, expected.throughput) {
                (Some(got), Some(expected)) => {
                    proptest::prop_assert!((got - expected).abs() < 1e-6, "{got} vs {expected}")
                }
                (got, expected) => proptest::prop_assert_eq!(got, expected),
            }
        }
    }
}

#[test]
fn each_model_has_its_own_round_robin_counter() {
    let (_, state) = state();
    assert_eq!(state.next_rotation("a"), 0);
    assert_eq!(state.next_rotation("a"), 1);
    assert_eq!(state.next_rotation("b"), 0);
    assert_eq!(state.next_rotation(""), 0);
    assert_eq!(state.next_rotation("a"), 2);
    assert_eq!(state.next_rotation("b"), 1);
}
