//! Pauses, penalties and measurements per scope.

use super::ScopeKey;
use crate::evaluate::health::{CandidateHealth, PenaltySchedule, Stats, grown_ms};
// Keyed by catalog ids, and by ids a client sends only where a policy's
// `unknown serve` tier routes them: those entries are swept (below), and a
// fast hash is enough for maps looked up several times per request.
use foldhash::HashMap;
use std::collections::VecDeque;

/// One attempt's measurements.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    pub success: bool,
    pub ttft_ms: Option<u64>,
    pub latency_ms: Option<u64>,
    /// Output tokens per second, when the provider reported usage.
    pub throughput: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Penalty {
    strikes: u32,
    until_ms: u64,
    last_failure_ms: u64,
    /// Until when the strikes count: `reset` after the last failure.
    strikes_until_ms: u64,
}

impl Penalty {
    fn strikes_at(&self, now_ms: u64) -> u32 {
        if self.strikes_until_ms > now_ms {
            self.strikes
        } else {
            0
        }
    }

    /// Whether it says nothing any more: not penalizing, no strikes.
    fn spent(&self, now_ms: u64) -> bool {
        self.until_ms <= now_ms && self.strikes_at(now_ms) == 0
    }
}

/// Every this many measurements, entries that say nothing any more are
/// dropped, and the routes measured are cut to [`MAX_MEASURED_ROUTES`].
const SWEEP_EVERY: u32 = 4096;

/// Routes with measurements kept at most. A route of an `unknown serve`
/// tier is keyed by the id a client sent; without a bound, made-up ids
/// would grow memory for as long as the stats window.
const MAX_MEASURED_ROUTES: usize = 65_536;

/// Measurements kept per route: enough for the statistics, bounded so a
/// busy route cannot grow memory without limit.
const MAX_SAMPLES: usize = 1024;

/// Throughput is summed in millionths of a token per second, so that the
/// running totals stay exact however many samples come and go.
const THROUGHPUT_UNITS: f64 = 1e6;
/// Above any real provider; keeps 1,024 samples' sum far from overflow.
const MAX_THROUGHPUT: f64 = 1e9;

/// A route's measurements in the window, oldest first, with their running
/// totals: every decision reads the statistics of its candidates, so they
/// cost O(1), not a pass over the samples.
#[derive(Default)]
struct Measurements {
    samples: VecDeque<(u64, Sample)>,
    totals: Totals,
}

/// Sums of the samples in the window; means are taken over successes.
#[derive(Default, Clone, Copy)]
struct Totals {
    samples: u32,
    successes: u32,
    ttft_ms: u64,
    ttft_count: u32,
    latency_ms: u64,
    latency_count: u32,
    throughput_units: u64,
    throughput_count: u32,
}

impl Totals {
    fn add(&mut self, sample: &Sample) {
        self.samples += 1;
        if !sample.success {
            return;
        }
        self.successes += 1;
        if let Some(ms) = sample.ttft_ms {
            self.ttft_ms += ms;
            self.ttft_count += 1;
        }
        if let Some(ms) = sample.latency_ms {
            self.latency_ms += ms;
            self.latency_count += 1;
        }
        if let Some(units) = throughput_units(sample) {
            self.throughput_units += units;
            self.throughput_count += 1;
        }
    }

    /// Takes out a sample `add` put in.
    fn remove(&mut self, sample: &Sample) {
        self.samples -= 1;
        if !sample.success {
            return;
        }
        self.successes -= 1;
        if let Some(ms) = sample.ttft_ms {
            self.ttft_ms -= ms;
            self.ttft_count -= 1;
        }
        if let Some(ms) = sample.latency_ms {
            self.latency_ms -= ms;
            self.latency_count -= 1;
        }
        if let Some(units) = throughput_units(sample) {
            self.throughput_units -= units;
            self.throughput_count -= 1;
        }
    }

    fn stats(&self) -> Stats {
        let mean = |sum: u64, count: u32| (count > 0).then(|| sum / u64::from(count));
        Stats {
            samples: self.samples,
            success_rate: (self.samples > 0)
                .then(|| f64::from(self.successes) / f64::from(self.samples)),
            ttft_ms: mean(self.ttft_ms, self.ttft_count),
            latency_ms: mean(self.latency_ms, self.latency_count),
            throughput: (self.throughput_count > 0).then(|| {
                self.throughput_units as f64 / f64::from(self.throughput_count) / THROUGHPUT_UNITS
            }),
        }
    }
}

fn throughput_units(sample: &Sample) -> Option<u64> {
    sample
        .throughput
        .filter(|tokens_per_second| tokens_per_second.is_finite())
        .map(|tokens_per_second| {
            (tokens_per_second.clamp(0.0, MAX_THROUGHPUT) * THROUGHPUT_UNITS).round() as u64
        })
}

#[derive(Default)]
pub(super) struct HealthTables {
    paused_until: HashMap<ScopeKey, u64>,
    penalties: HashMap<ScopeKey, Penalty>,
    measurements: HashMap<ScopeKey, Measurements>,
    /// Measurements recorded since the last sweep.
    recorded: u32,
}

impl HealthTables {
    pub fn pause(&mut self, scope: &ScopeKey, now_ms: u64, for_ms: u64) {
        let until = now_ms.saturating_add(for_ms);
        let entry = self.paused_until.entry(scope.clone()).or_insert(until);
        *entry = (*entry).max(until);
    }

    pub fn penalize(&mut self, scope: &ScopeKey, now_ms: u64, schedule: &PenaltySchedule) {
        let strikes = match self.penalties.get(scope) {
            Some(penalty) if now_ms.saturating_sub(penalty.last_failure_ms) < schedule.reset_ms => {
                penalty.strikes.saturating_add(1)
            }
            _ => 1,
        };
        let exponent = i32::try_from(strikes.saturating_sub(1)).unwrap_or(i32::MAX);
        let length = grown_ms(
            schedule.base_ms,
            schedule.factor.max(1.0),
            exponent,
            schedule.max_ms,
        );
        self.penalties.insert(
            scope.clone(),
            Penalty {
                strikes,
                until_ms: now_ms.saturating_add(length as u64),
                last_failure_ms: now_ms,
                strikes_until_ms: now_ms.saturating_add(schedule.reset_ms),
            },
        );
    }

    pub fn paused(&self, scope: &ScopeKey, now_ms: u64) -> bool {
        self.paused_until
            .get(scope)
            .is_some_and(|until| *until > now_ms)
    }

    /// Records a route's measurements; `stats_window_ms` is how far back
    /// statistics reach, beyond which a sweep drops them.
    pub fn record(&mut self, route: &ScopeKey, now_ms: u64, sample: Sample, stats_window_ms: u64) {
        self.recorded += 1;
        if self.recorded >= SWEEP_EVERY {
            self.recorded = 0;
            self.sweep(now_ms, stats_window_ms);
        }
        let measurements = self.measurements.entry(route.clone()).or_default();
        if measurements.samples.len() >= MAX_SAMPLES
            && let Some((_, oldest)) = measurements.samples.pop_front()
        {
            measurements.totals.remove(&oldest);
        }
        measurements.totals.add(&sample);
        measurements.samples.push_back((now_ms, sample));
    }

    pub fn candidate(
        &mut self,
        scopes: [&ScopeKey; 3],
        route: &ScopeKey,
        now_ms: u64,
        stats_window_ms: u64,
    ) -> CandidateHealth {
        let mut health = CandidateHealth::default();
        for scope in scopes {
            if let Some(until) = self.paused_until.get(scope).copied() {
                if until > now_ms {
                    let left = until - now_ms;
                    health.paused_for_ms = Some(health.paused_for_ms.map_or(left, |p| p.max(left)));
                } else {
                    self.paused_until.remove(scope);
                }
            }
            if let Some(penalty) = self.penalties.get(scope) {
                if penalty.until_ms > now_ms {
                    health.penalized = true;
                }
                // "The count resets when `reset` passes without a failure."
                health.strikes = health.strikes.max(penalty.strikes_at(now_ms));
            }
        }
        if let Some(measurements) = self.measurements.get_mut(route) {
            while let Some((at, oldest)) = measurements.samples.front()
                && at.saturating_add(stats_window_ms) < now_ms
            {
                measurements.totals.remove(oldest);
                measurements.samples.pop_front();
            }
            health.stats = measurements.totals.stats();
        }
        health
    }

    /// Drops what says nothing any more: pauses and penalties that ended,
    /// measurements all older than the stats window; then, past
    /// [`MAX_MEASURED_ROUTES`], the routes measured least recently.
    fn sweep(&mut self, now_ms: u64, stats_window_ms: u64) {
        self.paused_until.retain(|_, until| *until > now_ms);
        self.penalties.retain(|_, penalty| !penalty.spent(now_ms));
        let newest =
            |measurements: &Measurements| measurements.samples.back().map_or(0, |(at, _)| *at);
        self.measurements.retain(|_, measurements| {
            newest(measurements).saturating_add(stats_window_ms) >= now_ms
        });
        if self.measurements.len() > MAX_MEASURED_ROUTES {
            // The `excess` least recently measured go (and any measured in
            // the same millisecond as the last of them).
            let mut ages: Vec<u64> = self.measurements.values().map(newest).collect();
            let excess = self.measurements.len() - MAX_MEASURED_ROUTES;
            let (_, cut, _) = ages.select_nth_unstable(excess - 1);
            let cut = *cut;
            self.measurements
                .retain(|_, measurements| newest(measurements) > cut);
        }
    }

    #[cfg(test)]
    pub fn measured_routes(&self) -> usize {
        self.measurements.len()
    }

    pub fn retain(&mut self, keep: impl Fn(&ScopeKey) -> bool) {
        self.paused_until.retain(|scope, _| keep(scope));
        self.penalties.retain(|scope, _| keep(scope));
        self.measurements.retain(|scope, _| keep(scope));
    }
}
