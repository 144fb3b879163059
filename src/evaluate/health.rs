//! What the evaluator knows about providers' recent behaviour: an input,
//! never something it looks up itself. The proxy builds these views from its
//! health and capacity state; `explain` and policy tests from files.

use super::Candidate;
use crate::diagnostics::did_you_mean;

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

/// `base × factor^step`, at most `max`, in milliseconds: how a backoff
/// and a penalty grow. A zero base times an overflowed factor is NaN, which
/// is no time here rather than the maximum.
pub fn grown_ms(base_ms: u64, factor: f64, step: i32, max_ms: u64) -> f64 {
    let grown = base_ms as f64 * factor.powi(step);
    if grown.is_nan() {
        0.0
    } else {
        grown.min(max_ms as f64)
    }
}

/// The `health { penalty … }` schedule: a failure penalizes for `base`; each
/// further failure within `reset` multiplies that by `factor`, up to `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PenaltySchedule {
    pub base_ms: u64,
    pub factor: f64,
    pub max_ms: u64,
    pub reset_ms: u64,
}

impl Default for PenaltySchedule {
    /// Used when a policy penalizes without declaring a schedule.
    fn default() -> Self {
        PenaltySchedule {
            base_ms: 30_000,
            factor: 2.0,
            max_ms: 300_000,
            reset_ms: 600_000,
        }
    }
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

/// The candidates' health, asked of the view the first time a term reads
/// it, for every candidate at once (so all reads see one moment). A policy
/// whose decision never reads health, measurements or capacity costs the
/// proxy's state no lookups and no locks.
pub struct AskedHealth<'a> {
    view: &'a dyn HealthView,
    candidates: &'a [Candidate],
    health: std::cell::OnceCell<Vec<CandidateHealth>>,
}

impl<'a> AskedHealth<'a> {
    pub fn new(view: &'a dyn HealthView, candidates: &'a [Candidate]) -> AskedHealth<'a> {
        AskedHealth {
            view,
            candidates,
            health: std::cell::OnceCell::new(),
        }
    }

    /// Each candidate's health, in the candidates' order.
    pub fn all(&self) -> &[CandidateHealth] {
        self.health.get_or_init(|| {
            self.candidates
                .iter()
                .map(|candidate| self.view.health(candidate))
                .collect()
        })
    }
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

/// What is wrong with a written health entry, and which entry (from 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthProblem {
    pub entry: usize,
    pub message: String,
}

impl std::fmt::Display for HealthProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "health entry {}: {}", self.entry + 1, self.message)
    }
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
    ) -> Result<HealthTable<'s>, HealthProblem> {
        let duration = |text: &Option<String>, what: &str| -> Result<Option<u64>, String> {
            match text {
                None => Ok(None),
                Some(text) => crate::data::schema::parse_duration(text)
                    .map(Some)
                    .ok_or_else(|| {
                        format!(
                            "`{what}: {text}` {}",
                            crate::data::schema::why_not_a_duration(text)
                        )
                    }),
            }
        };
        let catalog = &snapshot.data.catalog;
        let mut table = Vec::new();
        for (index, entry) in entries.iter().enumerate() {
            let problem = |message: String| HealthProblem {
                entry: index,
                message,
            };
            // An entry that names nothing would match no candidate, and a
            // case using it would pass without testing anything.
            let Some(provider) = catalog
                .providers
                .iter()
                .position(|p| p.id == entry.provider)
            else {
                let hint = did_you_mean(
                    &entry.provider,
                    catalog.providers.iter().map(|p| p.id.as_str()),
                );
                return Err(problem(format!(
                    "no provider has the id `{}`{hint}",
                    entry.provider
                )));
            };
            let credentials = catalog.providers.get(provider).map(|p| &p.credentials);
            if let Some(credential) = &entry.credential
                && credentials.is_none_or(|all| all.iter().all(|c| &c.id != credential))
            {
                let hint = did_you_mean(
                    credential,
                    credentials.into_iter().flatten().map(|c| c.id.as_str()),
                );
                return Err(problem(format!(
                    "provider `{}` has no credential `{credential}`{hint}",
                    entry.provider
                )));
            }
            if let Some(model) = &entry.model
                && !catalog.models.iter().any(|m| {
                    &m.id == model && m.routes.iter().any(|route| route.provider == provider)
                })
            {
                let served = catalog
                    .models
                    .iter()
                    .filter(|m| m.routes.iter().any(|route| route.provider == provider))
                    .map(|m| m.id.as_str());
                let hint = did_you_mean(model, served);
                return Err(problem(format!(
                    "provider `{}` serves no catalog model `{model}`{hint}",
                    entry.provider
                )));
            }
            if entry
                .stats
                .success_rate
                .is_some_and(|rate| !(0.0..=1.0).contains(&rate))
            {
                return Err(problem(String::from(
                    "`stats.success_rate` is a share of the samples, from 0 to 1",
                )));
            }
            if entry
                .stats
                .throughput
                .is_some_and(|rate| !rate.is_finite() || rate < 0.0)
            {
                return Err(problem(String::from(
                    "`stats.throughput` is tokens per second, a number 0 or more",
                )));
            }
            // A pause that lasts no time has passed, as the proxy sees it.
            let paused_for_ms = duration(&entry.paused_for, "paused_for")
                .map_err(problem)?
                .filter(|ms| *ms > 0);
            let health = CandidateHealth {
                paused_for_ms,
                penalized: entry.penalized,
                strikes: entry.strikes,
                stats: entry.stats.clone(),
                full: entry.full,
                in_flight: entry.in_flight,
                free_in_ms: duration(&entry.free_in, "free_in").map_err(problem)?,
            };
            table.push((entry.clone(), health));
        }
        Ok(HealthTable {
            snapshot,
            entries: table,
        })
    }
}

impl<'s> HealthTable<'s> {
    /// [`HealthTable::new`], for health a person wrote down: an entry that
    /// sets no state, with no later entry for its provider, is the same as
    /// no entry, and a test case using it would pass without testing it, so
    /// it is refused too. (Before a later entry, it keeps what it names
    /// healthy: the first entry that matches a candidate applies.)
    pub fn written(
        snapshot: &'s crate::compile::Snapshot,
        entries: &[HealthEntry],
    ) -> Result<HealthTable<'s>, HealthProblem> {
        let table = HealthTable::new(snapshot, entries)?;
        // Written down, `paused_for: 0s` means a pause the proxy never
        // holds: a case using it would test nothing.
        let no_time = entries.iter().position(|entry| {
            entry
                .paused_for
                .as_deref()
                .and_then(crate::data::schema::parse_duration)
                == Some(0)
        });
        if let Some(entry) = no_time {
            return Err(HealthProblem {
                entry,
                message: String::from(
                    "`paused_for: 0s` is a pause that has already ended; \
                     leave `paused_for` out for a provider that is not paused",
                ),
            });
        }
        let idle = table
            .entries
            .iter()
            .enumerate()
            .find(|(index, (entry, health))| {
                *health == CandidateHealth::default()
                    && !table
                        .entries
                        .iter()
                        .skip(index + 1)
                        .any(|(later, _)| later.provider == entry.provider)
            });
        if let Some((index, (entry, _))) = idle {
            return Err(HealthProblem {
                entry: index,
                message: format!(
                    "the entry for provider `{}` sets no state: give it `paused_for`, \
                     `penalized`, `strikes`, `full`, `in_flight`, `free_in` or `stats`",
                    entry.provider
                ),
            });
        }
        Ok(table)
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

/// The `health` section's settings, which depend on nothing per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthSettings {
    pub penalty: PenaltySchedule,
    /// How far back `stats.*` reach.
    pub stats_window_ms: u64,
}

/// The default `health { window }`.
const DEFAULT_STATS_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            penalty: PenaltySchedule::default(),
            stats_window_ms: DEFAULT_STATS_WINDOW_MS,
        }
    }
}

impl HealthSettings {
    pub fn of(snapshot: &crate::compile::Snapshot) -> HealthSettings {
        let request = super::RequestState::placeholder();
        let mut machine = super::machine::Machine::new(snapshot, &request, &[], &[]);
        let focus = &super::machine::Focus::default();
        let program = &snapshot.program;
        let mut duration =
            |term: &crate::language::ir::Term| machine.eval(term, focus).as_duration();
        let defaults = PenaltySchedule::default();
        let penalty = match &program.penalty {
            Some(spec) => PenaltySchedule {
                base_ms: duration(&spec.base).unwrap_or(defaults.base_ms),
                max_ms: duration(&spec.max).unwrap_or(defaults.max_ms),
                reset_ms: duration(&spec.reset).unwrap_or(defaults.reset_ms),
                factor: machine
                    .eval(&spec.factor, focus)
                    .as_number()
                    .filter(|factor| factor.is_finite())
                    .unwrap_or(defaults.factor),
            },
            None => defaults,
        };
        let stats_window_ms = program
            .stats_window
            .as_ref()
            .and_then(|term| machine.eval(term, focus).as_duration())
            .unwrap_or(DEFAULT_STATS_WINDOW_MS);
        HealthSettings {
            penalty,
            stats_window_ms,
        }
    }
}
