//! What the evaluator knows about providers' recent behaviour: an input,
//! never something it looks up itself. The proxy builds these views from its
//! health and capacity state; `explain` and policy tests from files.

use super::Candidate;

/// Measurements of a candidate over the policy's health window.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stats {
    pub samples: u32,
    pub success_rate: Option<f64>,
    /// Time to first token, milliseconds.
    pub ttft_ms: Option<u64>,
    /// Whole-request latency, milliseconds.
    pub latency_ms: Option<u64>,
    /// Output tokens per second.
    pub throughput: Option<f64>,
}

/// One candidate's health at the moment of the decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CandidateHealth {
    /// Paused (skipped) by a `pause` effect until this many milliseconds from now.
    pub paused_for_ms: Option<u64>,
    /// Penalized (tried after healthy ones) after recent failures.
    pub penalized: bool,
    /// Recent failures counted by the penalty schedule.
    pub strikes: u32,
    pub stats: Stats,
    /// At a capacity limit now.
    pub full: bool,
    /// Requests in flight to the candidate's provider.
    pub in_flight: u32,
    /// When full: milliseconds until it is expected to have room, if known.
    pub free_in_ms: Option<u64>,
}

impl CandidateHealth {
    pub fn paused(&self) -> bool {
        self.paused_for_ms.is_some()
    }

    /// Skipped by the proxy for now: paused or full.
    pub fn unavailable(&self) -> bool {
        self.paused() || self.full
    }

    /// Milliseconds until it can be tried again, if known.
    pub fn available_in_ms(&self) -> Option<u64> {
        match (self.paused_for_ms, self.full) {
            (Some(paused), true) => Some(paused.max(self.free_in_ms.unwrap_or(paused))),
            (Some(paused), false) => Some(paused),
            (None, true) => self.free_in_ms,
            (None, false) => Some(0),
        }
    }
}

/// Health of every candidate, as of one moment.
pub trait HealthView {
    fn health(&self, candidate: &Candidate) -> CandidateHealth;
}

/// Every candidate healthy, free and unmeasured.
pub struct Healthy;

impl HealthView for Healthy {
    fn health(&self, _candidate: &Candidate) -> CandidateHealth {
        CandidateHealth::default()
    }
}
