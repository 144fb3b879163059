//! Plans remembered per caller, requested name and endpoint.
//!
//! Some policies make a request's plan from nothing but its caller (tenant,
//! workspace and key), the model name it asks for, the endpoint it calls
//! and the snapshot's data: their candidates, eligibility steps, order and
//! failover limits read no body member, input, merge, health, measurement
//! or capacity, and they balance nothing. Such a plan is work that depends
//! only on data, which a snapshot does once: the first request of each
//! (caller, name, endpoint) decides as usual, and the snapshot keeps the
//! plan for the requests after it. A reload builds a new snapshot, and with
//! it an empty memo. Everything that does read the request (its inputs,
//! `validate` rules, merges) is still decided per request, before the memo
//! is asked.
//!
//! Only names the catalog knows are remembered, so what clients send cannot
//! grow the memo past keys × catalog names × endpoints; it holds at most
//! [`CAPACITY`] plans besides, and starts over when full.

use super::compiled::reads_only;
use super::{Caller, Candidate, Endpoint};
use crate::compile::ModelName;
use crate::language::ir::{CredentialSpec, OrderPart, Program, Read, SortKeySpec, Term, TermKind};
use std::fmt;
use std::sync::RwLock;

/// At most this many plans are kept (a plan of eight candidates takes
/// under 1 KB).
const CAPACITY: usize = 4096;

/// The snapshot's remembered plans, empty for a policy whose plans read
/// more than the key.
pub struct PlanMemo {
    applies: bool,
    plans: RwLock<foldhash::HashMap<PlanKey, RememberedPlan>>,
}

/// What a remembered plan was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanKey {
    caller: Caller,
    endpoint: Endpoint,
    /// The catalog's entry for the name asked for, by address: each name
    /// the catalog knows has its own entry, fixed for the snapshot's life.
    /// An id and an alias of one model are two names (each candidate keeps
    /// the name it was asked by), and so two keys.
    name: usize,
}

/// A plan without its request state, which is the request's own.
pub struct RememberedPlan {
    pub candidates: Box<[Candidate]>,
    pub attempts: usize,
    pub budget_ms: Option<u64>,
    pub capacity_wait_ms: u64,
}

impl PlanMemo {
    /// An empty memo, which remembers plans if `program`'s depend only on
    /// the key.
    pub fn for_program(program: &Program) -> PlanMemo {
        PlanMemo {
            applies: plans_depend_only_on_key(program),
            plans: RwLock::new(foldhash::HashMap::default()),
        }
    }

    /// Whether this snapshot remembers plans at all.
    pub fn applies(&self) -> bool {
        self.applies
    }

    /// The key for a request of a name the catalog knows, if plans are
    /// remembered.
    pub fn key(&self, caller: Caller, endpoint: Endpoint, name: &ModelName) -> Option<PlanKey> {
        self.applies.then(|| PlanKey {
            caller,
            endpoint,
            name: std::ptr::from_ref(name).addr(),
        })
    }

    /// `read` applied to the plan remembered for `key`, if there is one.
    pub fn recall<T>(&self, key: &PlanKey, read: impl FnOnce(&RememberedPlan) -> T) -> Option<T> {
        // A poisoned lock only means some request panicked while holding
        // it; deciding afresh is always right.
        let plans = self.plans.read().ok()?;
        plans.get(key).map(read)
    }

    /// Keeps the plan made for `key`.
    pub fn remember(&self, key: PlanKey, plan: RememberedPlan) {
        let Ok(mut plans) = self.plans.write() else {
            return;
        };
        if plans.len() >= CAPACITY && !plans.contains_key(&key) {
            plans.clear();
        }
        plans.insert(key, plan);
    }

    /// How many plans are remembered.
    pub fn len(&self) -> usize {
        self.plans.read().map_or(0, |plans| plans.len())
    }
}

impl fmt::Debug for PlanMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanMemo")
            .field("applies", &self.applies)
            .field("plans", &self.len())
            .finish()
    }
}

/// Whether every term that makes a plan reads only what a [`PlanKey`]
/// fixes: the caller, the name asked for, the endpoint and the snapshot's
/// data. The requested ids must be the body's `model` alone, and nothing
/// may balance (it draws on the request's seed).
fn plans_depend_only_on_key(program: &Program) -> bool {
    let term = |term: &Term| reads_only_key(program, term);
    let keys = |keys: &[SortKeySpec]| keys.iter().all(|key| term(&key.term));
    let models = &program.models;
    models.requests_one_id()
        && match &models.credentials {
            CredentialSpec::Each => true,
            CredentialSpec::One(credential_keys) => keys(credential_keys),
        }
        && program.steps.iter().all(|step| term(&step.condition))
        && program.order.iter().all(|part| match part {
            OrderPart::By(key) => term(&key.term),
            OrderPart::UseSort { selector, sorts } => {
                term(selector) && sorts.iter().all(|(_, sort)| keys(sort))
            }
        })
        && program.balance.is_empty()
        && keys(&program.failover.reorder)
        && term(&program.failover.attempts)
        && program
            .failover
            .budget
            .as_ref()
            .is_none_or(|(limit, _)| term(limit))
        && program.capacity_wait.as_ref().is_none_or(term)
}

/// Whether `term` reads only what a [`PlanKey`] fixes (definitions looked
/// through). Aggregates and reads of other candidates read the candidate
/// set, which the same key makes the same.
fn reads_only_key(program: &Program, term: &Term) -> bool {
    let recurse = |inner: &Term| reads_only_key(program, inner);
    reads_only(term, &|kind| match kind {
        TermKind::Read(read) => Some(read_is_fixed_by_key(read)),
        TermKind::Static(..) => Some(true),
        TermKind::Hoisted(_, inner) | TermKind::At(_, inner) => Some(recurse(inner)),
        TermKind::Let(index) => Some(
            program
                .lets
                .get(*index)
                .is_some_and(|spec| recurse(&spec.term)),
        ),
        TermKind::Aggregate(_, scored, filter) => {
            Some(recurse(scored) && filter.as_deref().is_none_or(recurse))
        }
        TermKind::Grouped(_, parts, aggregate) => {
            Some(parts.iter().all(recurse) && recurse(aggregate))
        }
        TermKind::Merge(_) => Some(false),
        _ => None,
    })
}

/// Whether a read's value is the same for every request with one key. Every
/// read is named, so a new one must be placed here.
fn read_is_fixed_by_key(read: &Read) -> bool {
    match read {
        // The name asked for, the endpoint, and the settings its caller's
        // layers give that name.
        Read::RequestModel
        | Read::RequestEndpoint
        | Read::RequestWire
        | Read::RequestKind
        | Read::Setting(_) => true,
        Read::TenantId
        | Read::TenantAttr(_)
        | Read::WorkspaceId
        | Read::WorkspaceAttr(_)
        | Read::KeyId
        | Read::KeyAttr(_)
        | Read::DeploymentAttr(_) => true,
        Read::ModelId
        | Read::ModelKind
        | Read::ModelAliases
        | Read::ModelAttr(_)
        | Read::ProviderId
        | Read::ProviderName
        | Read::ProviderAliases
        | Read::ProviderFormat
        | Read::ProviderPriority
        | Read::ProviderListed
        | Read::ProviderAttr(_)
        | Read::RouteUpstreamModel
        | Read::RoutePrice(_)
        | Read::RouteCapabilities
        | Read::RouteAttr(_)
        | Read::CredentialId
        | Read::CredentialOwned
        | Read::CredentialAttr(_)
        | Read::RequestedIndex
        | Read::RequestedKind
        | Read::RequestedId => true,
        Read::RequestId
        | Read::RequestStream
        | Read::RequestParameters
        | Read::RequestEstimatedTokens
        | Read::Input(..)
        | Read::ShorthandValue => false,
        Read::HealthPaused
        | Read::HealthPenalized
        | Read::HealthStrikes
        | Read::StatsSamples
        | Read::StatsSuccessRate
        | Read::StatsTtft
        | Read::StatsLatency
        | Read::StatsThroughput
        | Read::CapacityFull
        | Read::CapacityInFlight => false,
        Read::UpstreamStatus
        | Read::UpstreamRetryAfter
        | Read::UpstreamErrorCode
        | Read::UpstreamErrorType
        | Read::UpstreamErrorMessage
        | Read::Attempt
        | Read::Attempts
        | Read::Retries
        | Read::Elapsed
        | Read::FreeIn
        | Read::Succeeded => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn memo(applies: bool) -> PlanMemo {
        PlanMemo {
            applies,
            plans: RwLock::new(foldhash::HashMap::default()),
        }
    }

    fn plan(attempts: usize) -> RememberedPlan {
        RememberedPlan {
            candidates: Box::new([]),
            attempts,
            budget_ms: None,
            capacity_wait_ms: 0,
        }
    }

    fn caller(key: usize) -> Caller {
        Caller {
            tenant: 0,
            workspace: 0,
            key: Some(key),
        }
    }

    #[test]
    fn a_plan_is_recalled_only_for_its_own_caller_name_and_endpoint() {
        let memo = memo(true);
        // Two names for one model, as a model's id and an alias are.
        let (id, alias) = (ModelName::Model(0), ModelName::Model(0));
        let key = |who, endpoint, name| memo.key(caller(who), endpoint, name).unwrap();
        memo.remember(key(1, Endpoint::ChatCompletions, &id), plan(3));
        let attempts = |key: PlanKey| memo.recall(&key, |plan| plan.attempts);
        assert_eq!(attempts(key(1, Endpoint::ChatCompletions, &id)), Some(3));
        assert_eq!(attempts(key(2, Endpoint::ChatCompletions, &id)), None);
        assert_eq!(attempts(key(1, Endpoint::Messages, &id)), None);
        assert_eq!(attempts(key(1, Endpoint::ChatCompletions, &alias)), None);
    }

    #[test]
    fn a_full_memo_starts_over() {
        let memo = memo(true);
        let name = ModelName::Model(0);
        let key = |who| {
            memo.key(caller(who), Endpoint::ChatCompletions, &name)
                .unwrap()
        };
        for who in 0..CAPACITY {
            memo.remember(key(who), plan(1));
        }
        assert_eq!(memo.len(), CAPACITY);
        // Remembering a plan again keeps the others.
        memo.remember(key(0), plan(2));
        assert_eq!(memo.len(), CAPACITY);
        memo.remember(key(CAPACITY), plan(1));
        assert_eq!(memo.len(), 1);
    }

    #[test]
    fn a_memo_that_does_not_apply_makes_no_keys() {
        let name = ModelName::Model(0);
        let key = memo(false).key(caller(0), Endpoint::ChatCompletions, &name);
        assert!(key.is_none());
    }
}
