//! Health and capacity state: pauses, penalties, measurements and requests
//! in flight, kept by stable ids (provider, route and credential ids) so that
//! they survive reloads.
//!
//! The evaluator never reads this directly: the proxy takes a [`StateView`]
//! of it at one moment and passes that as the decision's health input.
//! [`InProcess`] keeps everything in this process; a store shared between
//! replicas would implement the same operations.

mod capacity;
mod clock;
mod health;

pub use capacity::{Permit, Ticket};
pub use clock::{Clock, ManualClock, SystemClock, Timer};
pub use health::Sample;

use crate::compile::Snapshot;
use crate::data::CapacityLimits;
use crate::evaluate::Candidate;
use crate::evaluate::health::{CandidateHealth, HealthView, PenaltySchedule};
use crate::language::ast::HealthScope;
use crate::sync::lock;
use crate::value::Value;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a pause or penalty applies to, by ids that stay the same when the
/// policy or catalog is reloaded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeKey {
    Provider(Arc<str>),
    /// A model's route through a provider: (model id, provider id). For a
    /// model the catalog does not know, the requested id.
    Route(Arc<str>, Arc<str>),
    /// (provider id, credential id).
    Credential(Arc<str>, Arc<str>),
}

impl ScopeKey {
    pub fn provider(&self) -> &str {
        match self {
            ScopeKey::Provider(provider)
            | ScopeKey::Route(_, provider)
            | ScopeKey::Credential(provider, _) => provider,
        }
    }

    /// What a `pause` or `penalize` of `scope` names for a candidate: its
    /// route or credential, or for `provider` every catalog provider of the
    /// candidate's provider's name, as its regions and variants share one
    /// name (and one account).
    pub fn named_by(
        snapshot: &Snapshot,
        candidate: &Candidate,
        scope: HealthScope,
    ) -> Vec<ScopeKey> {
        let keys = CandidateKeys::of(snapshot, candidate);
        match scope {
            HealthScope::Route => vec![keys.route],
            HealthScope::Credential => vec![keys.credential],
            HealthScope::Provider => {
                let name = snapshot.interned.provider_name.get(candidate.provider);
                let namesakes: Vec<ScopeKey> = snapshot
                    .interned
                    .provider_name
                    .iter()
                    .zip(&snapshot.interned.provider_id)
                    .filter(|(other, _)| Some(*other) == name)
                    .filter_map(|(_, id)| shared_text(Some(id)).map(ScopeKey::Provider))
                    .collect();
                if namesakes.is_empty() {
                    vec![keys.provider]
                } else {
                    namesakes
                }
            }
        }
    }
}

impl std::fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScopeKey::Provider(provider) => write!(f, "provider {provider}"),
            ScopeKey::Route(model, provider) => write!(f, "route {provider}/{model}"),
            ScopeKey::Credential(provider, credential) => {
                write!(f, "credential {provider}/{credential}")
            }
        }
    }
}

/// The three scopes a candidate belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateKeys {
    pub provider: ScopeKey,
    pub route: ScopeKey,
    pub credential: ScopeKey,
}

impl CandidateKeys {
    pub fn of(snapshot: &Snapshot, candidate: &Candidate) -> CandidateKeys {
        // The snapshot's interned ids: shared, not copied per request.
        let interned = &snapshot.interned;
        let unknown = || Arc::from("?");
        let provider_id =
            shared_text(interned.provider_id.get(candidate.provider)).unwrap_or_else(unknown);
        let model_id = candidate
            .model
            .and_then(|m| shared_text(interned.model_id.get(m)))
            .unwrap_or_else(|| candidate.requested.id.clone());
        let credential_id = shared_text(
            interned
                .credential_id
                .get(candidate.provider)
                .and_then(|credentials| credentials.get(candidate.credential)),
        )
        .unwrap_or_else(unknown);
        CandidateKeys {
            route: ScopeKey::Route(model_id, provider_id.clone()),
            credential: ScopeKey::Credential(provider_id.clone(), credential_id),
            provider: ScopeKey::Provider(provider_id),
        }
    }

    fn all(&self) -> [&ScopeKey; 3] {
        [&self.provider, &self.route, &self.credential]
    }
}

fn shared_text(value: Option<&Value>) -> Option<Arc<str>> {
    match value {
        Some(Value::String(text)) => Some(text.clone()),
        _ => None,
    }
}

/// The state of one proxy process.
pub struct InProcess {
    clock: Arc<dyn Clock>,
    health: Mutex<health::HealthTables>,
    capacity: Mutex<capacity::CapacityTables>,
    /// Round-robin counters by catalog model id (`""` for the rest); only
    /// model ids of the catalogs loaded so far are keys, so the table stays
    /// small.
    rotations: Mutex<foldhash::HashMap<Arc<str>, u64>>,
}

impl InProcess {
    pub fn new(clock: Arc<dyn Clock>) -> Arc<InProcess> {
        Arc::new(InProcess {
            clock,
            health: Mutex::new(health::HealthTables::default()),
            capacity: Mutex::new(capacity::CapacityTables::default()),
            rotations: Mutex::default(),
        })
    }

    /// The round-robin counter of `model` (see
    /// [`crate::evaluate::round_robin_model`]), then advanced: each model's
    /// requests take turns whatever else the proxy serves.
    pub fn next_rotation(&self, model: &str) -> u64 {
        let mut rotations = lock(&self.rotations);
        if let Some(counter) = rotations.get_mut(model) {
            let turn = *counter;
            *counter = turn.wrapping_add(1);
            return turn;
        }
        rotations.insert(Arc::from(model), 1);
        0
    }

    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    fn health(&self) -> MutexGuard<'_, health::HealthTables> {
        // A panic while holding the lock cannot leave the tables half
        // updated in a way that matters more than losing them; keep serving.
        lock(&self.health)
    }

    fn capacity(&self) -> MutexGuard<'_, capacity::CapacityTables> {
        lock(&self.capacity)
    }

    /// Skips the scope for `for_ms` from `since_ms` on the clock (a longer
    /// pause wins).
    pub fn pause(&self, scope: &ScopeKey, since_ms: u64, for_ms: u64) {
        self.health().pause(scope, since_ms, for_ms);
    }

    /// Counts a failure seen at `failed_ms` against the scope under the
    /// policy's schedule.
    pub fn penalize(&self, scope: &ScopeKey, failed_ms: u64, schedule: &PenaltySchedule) {
        self.health().penalize(scope, failed_ms, schedule);
    }

    /// How many routes have measurements kept.
    #[cfg(test)]
    pub fn measured_routes(&self) -> usize {
        self.health().measured_routes()
    }

    /// Records an attempt's measurements for the route; statistics reach
    /// `stats_window_ms` back.
    pub fn record(&self, route: &ScopeKey, sample: Sample, stats_window_ms: u64) {
        let now = self.clock.now_ms();
        self.health().record(route, now, sample, stats_window_ms);
    }

    /// One candidate's health now, under the provider's limits.
    pub fn candidate_health(
        &self,
        keys: &CandidateKeys,
        limits: Option<CapacityLimits>,
        stats_window_ms: u64,
    ) -> CandidateHealth {
        let now = self.clock.now_ms();
        let mut health = self
            .health()
            .candidate(keys.all(), &keys.route, now, stats_window_ms);
        let room = self
            .capacity()
            .room(keys.provider.provider(), limits, now, None);
        health.in_flight = room.in_flight;
        health.full = !room.available;
        health.free_in_ms = room.free_in_ms;
        health
    }

    /// Takes room at the provider for one attempt, unless it is full or an
    /// earlier waiter in the queue is waiting for it.
    pub fn try_acquire(
        self: &Arc<Self>,
        provider: &str,
        limits: Option<CapacityLimits>,
        ticket: Option<&Ticket>,
    ) -> Option<Permit> {
        let now = self.clock.now_ms();
        let acquired = self
            .capacity()
            .acquire(provider, limits, now, ticket.map(Ticket::number));
        acquired.then(|| Permit::new(self.clone(), provider))
    }

    /// Whether the holder of `ticket` (or a request not waiting) could take
    /// room at the provider now.
    pub fn has_room(
        &self,
        provider: &str,
        limits: Option<CapacityLimits>,
        ticket: Option<&Ticket>,
    ) -> bool {
        let now = self.clock.now_ms();
        self.capacity()
            .room(provider, limits, now, ticket.map(Ticket::number))
            .available
    }

    /// Whether this one scope is paused now.
    pub fn scope_paused(&self, scope: &ScopeKey) -> bool {
        let now = self.clock.now_ms();
        self.health().paused(scope, now)
    }

    /// Changes which providers a waiting request waits for room at. One it
    /// no longer waits for may have room for the next in line: it looks.
    pub fn wait_for(&self, ticket: &Ticket, providers: HashSet<Arc<str>>) {
        self.capacity().wait_for(ticket.number(), providers);
    }

    /// Joins the queue of requests waiting for room at these providers.
    pub fn enqueue(self: &Arc<Self>, providers: HashSet<Arc<str>>) -> Ticket {
        let waiter = self.capacity().enqueue(providers);
        Ticket::new(self.clone(), waiter)
    }

    fn release(&self, provider: &str) {
        self.capacity().release(provider);
    }

    fn dequeue(&self, number: u64) {
        self.capacity().dequeue(number);
    }

    /// Forgets state of providers no longer in the catalog (after a reload).
    pub fn retain_providers(&self, providers: &HashSet<&str>) {
        self.health()
            .retain(|scope| providers.contains(scope.provider()));
        self.capacity().retain(providers);
    }

    /// Requests in flight to any provider.
    pub fn in_flight_total(&self) -> u32 {
        self.capacity().in_flight_total()
    }
}

/// Capacity limits as the live policy has them, for a request whose own
/// snapshot a reload may have replaced since it began.
pub trait LiveLimits: Send + Sync {
    /// The limits of `snapshot`'s provider `provider`, as live now.
    fn limits(&self, snapshot: &Snapshot, provider: usize) -> Option<CapacityLimits>;
}

/// The state at one moment, as the evaluator's health input.
pub struct StateView<'a> {
    pub state: &'a InProcess,
    pub snapshot: &'a Snapshot,
    /// Where limits are read live; `None` reads `snapshot`'s (a request
    /// being decided, whose snapshot is the live one).
    pub live_limits: Option<&'a dyn LiveLimits>,
}

impl HealthView for StateView<'_> {
    fn health(&self, candidate: &Candidate) -> CandidateHealth {
        let keys = CandidateKeys::of(self.snapshot, candidate);
        let limits = match self.live_limits {
            Some(live) => live.limits(self.snapshot, candidate.provider),
            None => self
                .snapshot
                .provider(candidate.provider)
                .and_then(|p| p.capacity),
        };
        self.state
            .candidate_health(&keys, limits, self.snapshot.health.stats_window_ms)
    }
}

#[cfg(test)]
mod tests;
