//! Pauses, penalties and measurements per scope.

use super::ScopeKey;
use crate::evaluate::health::{CandidateHealth, PenaltySchedule, Stats};
use std::collections::{HashMap, VecDeque};

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
}

/// Measurements kept per route: enough for the statistics, bounded so a
/// busy route cannot grow memory without limit.
const MAX_SAMPLES: usize = 1024;

#[derive(Default)]
pub(super) struct HealthTables {
    paused_until: HashMap<ScopeKey, u64>,
    penalties: HashMap<ScopeKey, Penalty>,
    samples: HashMap<ScopeKey, VecDeque<(u64, Sample)>>,
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
        let length = (schedule.base_ms as f64 * schedule.factor.max(1.0).powi(exponent))
            .min(schedule.max_ms as f64);
        self.penalties.insert(
            scope.clone(),
            Penalty {
                strikes,
                until_ms: now_ms.saturating_add(length as u64),
                last_failure_ms: now_ms,
            },
        );
    }

    pub fn record(&mut self, route: &ScopeKey, now_ms: u64, sample: Sample) {
        let samples = self.samples.entry(route.clone()).or_default();
        if samples.len() >= MAX_SAMPLES {
            samples.pop_front();
        }
        samples.push_back((now_ms, sample));
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
                health.strikes = health.strikes.max(penalty.strikes);
            }
        }
        if let Some(samples) = self.samples.get_mut(route) {
            while samples
                .front()
                .is_some_and(|(at, _)| at.saturating_add(stats_window_ms) < now_ms)
            {
                samples.pop_front();
            }
            health.stats = stats(samples.iter().map(|(_, sample)| sample));
        }
        health
    }

    pub fn retain(&mut self, keep: impl Fn(&ScopeKey) -> bool) {
        self.paused_until.retain(|scope, _| keep(scope));
        self.penalties.retain(|scope, _| keep(scope));
        self.samples.retain(|scope, _| keep(scope));
    }
}

fn stats<'a>(samples: impl Iterator<Item = &'a Sample>) -> Stats {
    let mut count = 0u32;
    let mut successes = 0u32;
    let mut ttft = Vec::new();
    let mut latency = Vec::new();
    let mut throughput = Vec::new();
    for sample in samples {
        count += 1;
        if sample.success {
            successes += 1;
            ttft.extend(sample.ttft_ms);
            latency.extend(sample.latency_ms);
            throughput.extend(sample.throughput);
        }
    }
    let mean_ms = |values: &[u64]| {
        (!values.is_empty()).then(|| values.iter().sum::<u64>() / values.len() as u64)
    };
    Stats {
        samples: count,
        success_rate: (count > 0).then(|| f64::from(successes) / f64::from(count)),
        ttft_ms: mean_ms(&ttft),
        latency_ms: mean_ms(&latency),
        throughput: (!throughput.is_empty())
            .then(|| throughput.iter().sum::<f64>() / throughput.len() as f64),
    }
}
