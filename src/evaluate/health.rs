//! What the evaluator knows about providers' recent behaviour: an input,
//! never something it looks up itself. The proxy builds these views from its
//! health and capacity state; `explain` and policy tests from files.

use super::Candidate;

/// Measurements of a candidate over the policy's health window.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
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

/// Health written down, for `explain --health` and policy test cases: each
/// entry applies to the candidates of a provider, optionally narrowed to
/// one credential or model.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthEntry {
    pub provider: String,
    #[serde(default)]
    pub credential: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// Paused for this long, as a duration such as `30s`.
    #[serde(default)]
    pub paused_for: Option<String>,
    #[serde(default)]
    pub penalized: bool,
    #[serde(default)]
    pub strikes: u32,
    #[serde(default)]
    pub full: bool,
    #[serde(default)]
    pub in_flight: u32,
    #[serde(default)]
    pub free_in: Option<String>,
    #[serde(default)]
    pub stats: Stats,
}

/// A fixed health table; candidates no entry names are healthy.
pub struct HealthTable<'s> {
    snapshot: &'s crate::compile::Snapshot,
    entries: Vec<(HealthEntry, CandidateHealth)>,
}

impl<'s> HealthTable<'s> {
    /// Builds a table, or says which entry is wrong.
    pub fn new(
        snapshot: &'s crate::compile::Snapshot,
        entries: &[HealthEntry],
    ) -> Result<HealthTable<'s>, String> {
        let duration = |text: &Option<String>, what: &str| -> Result<Option<u64>, String> {
            match text {
                None => Ok(None),
                Some(text) => crate::data::schema::parse_duration(text)
                    .map(Some)
                    .ok_or_else(|| format!("`{what}: {text}` is not a duration such as `30s`")),
            }
        };
        let mut table = Vec::new();
        for entry in entries {
            if snapshot
                .data
                .catalog
                .providers
                .iter()
                .all(|p| p.id != entry.provider)
            {
                return Err(format!("no provider has the id `{}`", entry.provider));
            }
            let health = CandidateHealth {
                paused_for_ms: duration(&entry.paused_for, "paused_for")?,
                penalized: entry.penalized,
                strikes: entry.strikes,
                stats: entry.stats.clone(),
                full: entry.full,
                in_flight: entry.in_flight,
                free_in_ms: duration(&entry.free_in, "free_in")?,
            };
            table.push((entry.clone(), health));
        }
        Ok(HealthTable {
            snapshot,
            entries: table,
        })
    }
}

impl HealthView for HealthTable<'_> {
    fn health(&self, candidate: &Candidate) -> CandidateHealth {
        let provider = self.snapshot.provider(candidate.provider);
        let credential = self
            .snapshot
            .credential(candidate.provider, candidate.credential);
        let model = candidate
            .model
            .and_then(|m| self.snapshot.data.catalog.models.get(m))
            .map(|m| m.id.as_str());
        self.entries
            .iter()
            .find(|(entry, _)| {
                provider.is_some_and(|p| p.id == entry.provider)
                    && entry
                        .credential
                        .as_ref()
                        .is_none_or(|id| credential.is_some_and(|c| &c.id == id))
                    && entry.model.as_deref().is_none_or(|id| model == Some(id))
            })
            .map(|(_, health)| health.clone())
            .unwrap_or_default()
    }
}
