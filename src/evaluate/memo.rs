//! Plans remembered per caller, model name, endpoint and inputs.
//!
//! Some policies make a request's plan from nothing but its caller (tenant,
//! workspace and key), the model name it asks for, the endpoint it calls,
//! some of its inputs and the snapshot's data: their candidates,
//! eligibility steps, order and failover limits read no health,
//! measurement, capacity or other part of the request. Such a plan depends
//! on those alone, so a snapshot makes it once: the first request with
//! given values decides as usual, and the snapshot keeps the plan for the
//! requests after it. A reload builds a new snapshot, and with it an empty
//! memo. Inputs, `validate` rules and merges still run per request, before
//! the memo is asked, and a refusal is never remembered. A balance may
//! apply only as its `when` says; a plan that one balanced (it drew on the
//! request's seed) is not remembered either.
//!
//! The memo holds at most [`MEMO_BYTES`] of plans and keys and starts over
//! when full, and a plan whose key and candidates would take more than
//! [`MAX_PLAN_BYTES`] (a long input, some 700 candidates) is not kept:
//! requests that vary what it is keyed on cannot grow it further.

use super::compiled::reads_only;
use super::{Caller, Candidate, Endpoint, Plan, RequestState};
use crate::language::ir::{CredentialSpec, OrderPart, Program, Read, SortKeySpec, Term, TermKind};
use crate::source::Span;
use crate::value::Value;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};

/// What the remembered plans and their keys may take, by
/// [`PlanKey::weight`] and the candidates' size: some 4,000 plans of eight
/// candidates.
const MEMO_BYTES: usize = 4 << 20;

/// A plan heavier than this is made afresh each time.
const MAX_PLAN_BYTES: usize = MEMO_BYTES / 64;

/// The snapshot's remembered plans, none for a policy whose plans read
/// more than a [`PlanKey`] holds.
pub struct PlanMemo {
    /// The inputs plans read, by index, if plans are remembered.
    inputs: Option<Box<[usize]>>,
    /// If they are not, the first term found to read more than a key holds.
    made_afresh_by: Option<Span>,
    /// Seeds the keys' hashes, per snapshot.
    hashing: foldhash::fast::RandomState,
    plans: RwLock<Plans>,
}

#[derive(Default)]
struct Plans {
    /// By their key's hash: a request is looked up by its own parts, so a
    /// recall makes no key (no text shared, no inputs copied).
    by_hash: foldhash::HashMap<u64, Vec<(PlanKey, RememberedPlan)>>,
    len: usize,
    bytes: usize,
}

/// What a remembered plan was made for.
struct PlanKey {
    caller: Caller,
    endpoint: Endpoint,
    model: Arc<str>,
    /// The values of the inputs plans read, in [`PlanMemo::inputs`]' order.
    inputs: Box<[Value]>,
}

/// A plan without its request state, which is the request's own.
pub struct RememberedPlan {
    pub candidates: Box<[Candidate]>,
    pub attempts: usize,
    pub budget_ms: Option<u64>,
    pub capacity_wait_ms: u64,
}

/// What an input the request did not send reads as.
const ABSENT: Value = Value::Null;

impl PlanMemo {
    /// An empty memo, which remembers plans if `program`'s depend only on
    /// what a [`PlanKey`] holds.
    pub fn for_program(program: &Program) -> PlanMemo {
        let (inputs, made_afresh_by) = match inputs_plans_read(program) {
            Ok(inputs) => (Some(inputs), None),
            Err(reader) => (None, reader),
        };
        PlanMemo {
            inputs,
            made_afresh_by,
            hashing: foldhash::fast::RandomState::default(),
            plans: RwLock::new(Plans::default()),
        }
    }

    /// Whether this snapshot remembers plans at all.
    pub fn applies(&self) -> bool {
        self.inputs.is_some()
    }

    /// Where plans are not remembered, the first term found that reads
    /// more than a key holds (a step, a sort key, a definition's body).
    pub fn made_afresh_by(&self) -> Option<Span> {
        self.made_afresh_by
    }

    /// `read` applied to the plan remembered for `request` (its inputs
    /// parsed), if there is one.
    pub fn recall<T>(
        &self,
        request: &RequestState,
        read: impl FnOnce(&RememberedPlan) -> T,
    ) -> Option<T> {
        let inputs = self.inputs.as_deref()?;
        let hash = self.hash(request, inputs);
        // A poisoned lock only means some request panicked while holding
        // it; deciding afresh is always right.
        let plans = self.plans.read().ok()?;
        let (_, plan) = plans
            .by_hash
            .get(&hash)?
            .iter()
            .find(|(key, _)| key.is_for(request, inputs))?;
        Some(read(plan))
    }

    /// Keeps `plan`, made for its request.
    pub fn remember(&self, plan: &Plan) {
        let Some(inputs) = self.inputs.as_deref() else {
            return;
        };
        let request = &plan.request;
        let weight = PlanKey::weight(request, inputs)
            + std::mem::size_of_val(plan.candidates.as_slice())
            + std::mem::size_of::<RememberedPlan>();
        if weight > MAX_PLAN_BYTES {
            return;
        }
        let hash = self.hash(request, inputs);
        let Ok(mut plans) = self.plans.write() else {
            return;
        };
        // Another request made the same plan meanwhile: one is enough.
        let known = plans
            .by_hash
            .get(&hash)
            .is_some_and(|bucket| bucket.iter().any(|(key, _)| key.is_for(request, inputs)));
        if known {
            return;
        }
        if plans.bytes + weight > MEMO_BYTES {
            *plans = Plans::default();
        }
        let remembered = RememberedPlan {
            candidates: plan.candidates.as_slice().into(),
            attempts: plan.attempts,
            budget_ms: plan.budget_ms,
            capacity_wait_ms: plan.capacity_wait_ms,
        };
        let key = PlanKey::of(request, inputs);
        plans
            .by_hash
            .entry(hash)
            .or_default()
            .push((key, remembered));
        plans.len += 1;
        plans.bytes += weight;
    }

    /// How many plans are remembered.
    pub fn len(&self) -> usize {
        self.plans.read().map_or(0, |plans| plans.len)
    }

    /// The hash of the key `request` has: alike for requests whose keys
    /// are, as [`Value::identical`] values hash alike.
    fn hash(&self, request: &RequestState, inputs: &[usize]) -> u64 {
        let mut hasher = self.hashing.build_hasher();
        request.caller.hash(&mut hasher);
        request.endpoint.hash(&mut hasher);
        request.model.hash(&mut hasher);
        for index in inputs {
            hash_value(request.inputs.get(*index).unwrap_or(&ABSENT), &mut hasher);
        }
        hasher.finish()
    }
}

impl PlanKey {
    /// What the key of `request` takes, its values' text included.
    fn weight(request: &RequestState, inputs: &[usize]) -> usize {
        std::mem::size_of::<PlanKey>()
            + request.model.len()
            + inputs
                .iter()
                .map(|index| value_weight(request.inputs.get(*index).unwrap_or(&ABSENT)))
                .sum::<usize>()
    }

    fn of(request: &RequestState, inputs: &[usize]) -> PlanKey {
        PlanKey {
            caller: request.caller,
            endpoint: request.endpoint,
            model: request.model.clone(),
            inputs: inputs
                .iter()
                .map(|index| request.inputs.get(*index).unwrap_or(&ABSENT).clone())
                .collect(),
        }
    }

    /// Whether `request` has this key. Inputs compare as identical values,
    /// not as a policy compares them: an enumeration member equals its
    /// name's text there, but a term may tell them apart.
    fn is_for(&self, request: &RequestState, inputs: &[usize]) -> bool {
        self.caller == request.caller
            && self.endpoint == request.endpoint
            && self.model == request.model
            && self.inputs.len() == inputs.len()
            && self.inputs.iter().zip(inputs).all(|(value, index)| {
                value.identical(request.inputs.get(*index).unwrap_or(&ABSENT))
            })
    }
}

impl fmt::Debug for PlanMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanMemo")
            .field("inputs", &self.inputs)
            .field("plans", &self.len())
            .finish()
    }
}

/// What a copy of `value` takes, its text and items included.
fn value_weight(value: &Value) -> usize {
    std::mem::size_of::<Value>()
        + match value {
            Value::String(text) => text.len(),
            Value::Enum(member) => member.name.len(),
            Value::List(items) => items.iter().map(value_weight).sum(),
            Value::Record(fields) => fields
                .iter()
                .map(|(name, field)| name.len() + value_weight(field))
                .sum(),
            Value::Null
            | Value::Bool(_)
            | Value::Number(_)
            | Value::Duration(_)
            | Value::Date(_) => 0,
        }
}

/// Hashes a value so that [`Value::identical`] values hash alike.
fn hash_value<H: Hasher>(value: &Value, state: &mut H) {
    std::mem::discriminant(value).hash(state);
    match value {
        Value::Null => {}
        Value::Bool(b) => b.hash(state),
        Value::Number(n) => n.to_bits().hash(state),
        Value::String(text) => text.hash(state),
        Value::Duration(ms) => ms.hash(state),
        Value::Date(days) => days.hash(state),
        Value::Enum(member) => member.hash(state),
        Value::List(items) => {
            items.len().hash(state);
            for item in items.iter() {
                hash_value(item, state);
            }
        }
        Value::Record(fields) => {
            fields.len().hash(state);
            for (name, field) in fields.iter() {
                name.hash(state);
                hash_value(field, state);
            }
        }
    }
}

/// The inputs that the terms making a plan read (sorted), if those terms
/// read nothing but what a [`PlanKey`] holds and the snapshot's data;
/// otherwise the first term found to read more, if it is known. A balance
/// must say `when`, by such terms alone.
fn inputs_plans_read(program: &Program) -> Result<Box<[usize]>, Option<Span>> {
    let reads = KeyReads {
        program,
        first_reader: Cell::new(None),
        inputs: RefCell::new(Vec::new()),
        lets: RefCell::new(vec![None; program.lets.len()]),
        merges: RefCell::new(vec![None; program.merges.len()]),
    };
    let term = |term: &Term| reads.only_key(term);
    let keys = |keys: &[SortKeySpec]| keys.iter().all(|key| term(&key.term));
    let models = &program.models;
    let fixed = models.sources.iter().all(term)
        && match &models.credentials {
            CredentialSpec::Each => true,
            CredentialSpec::One(credential_keys) => keys(credential_keys),
        }
        && models
            .unknown_serve
            .iter()
            .all(|tier| term(&tier.condition) && keys(&tier.keys))
        && program.steps.iter().all(|step| term(&step.condition))
        && program.order.iter().all(|part| match part {
            OrderPart::By(key) => term(&key.term),
            OrderPart::UseSort { selector, sorts } => {
                term(selector) && sorts.iter().all(|(_, sort)| keys(sort))
            }
        })
        && program.balance.iter().all(|balance| match &balance.when {
            Some(when) => term(when),
            None => {
                reads.found_reader(balance.span);
                false
            }
        })
        && keys(&program.failover.reorder)
        && term(&program.failover.attempts)
        && program
            .failover
            .budget
            .as_ref()
            .is_none_or(|(limit, _)| term(limit))
        && program.capacity_wait.as_ref().is_none_or(term);
    if !fixed {
        return Err(reads.first_reader.get());
    }
    let mut inputs = reads.inputs.into_inner();
    inputs.sort_unstable();
    inputs.dedup();
    Ok(inputs.into_boxed_slice())
}

/// Finds out which terms read only what a [`PlanKey`] holds, and the
/// inputs they read.
struct KeyReads<'p> {
    program: &'p Program,
    /// The innermost term first found to read more than a key holds.
    first_reader: Cell<Option<Span>>,
    inputs: RefCell<Vec<usize>>,
    /// Per definition and merge, the answer once known: a definition used
    /// in many places (or by many others) is looked through once.
    lets: RefCell<Vec<Option<bool>>>,
    merges: RefCell<Vec<Option<bool>>>,
}

impl KeyReads<'_> {
    /// Whether `term` reads only what a [`PlanKey`] holds, definitions and
    /// merges looked through; records the inputs it reads. Aggregates and
    /// reads of other candidates read the candidate set, which the same key
    /// makes the same.
    fn only_key(&self, term: &Term) -> bool {
        // Definitions may use definitions in a long chain.
        let only = stacker::maybe_grow(
            crate::language::check::STACK_RED_ZONE,
            crate::language::check::STACK_SEGMENT,
            || reads_only(term, &|term| self.leaf(term)),
        );
        if !only {
            self.found_reader(term.span);
        }
        only
    }

    fn found_reader(&self, span: Span) {
        if self.first_reader.get().is_none() {
            self.first_reader.set(Some(span));
        }
    }

    fn leaf(&self, term: &Term) -> Option<bool> {
        let recurse = |inner: &Term| self.only_key(inner);
        match &term.kind {
            TermKind::Read(Read::Input(index, _)) => {
                let mut inputs = self.inputs.borrow_mut();
                if *index < self.program.inputs.len() {
                    inputs.push(*index);
                } else {
                    // `input` itself: a record of every input.
                    inputs.extend(0..self.program.inputs.len());
                }
                Some(true)
            }
            TermKind::Read(read) => {
                let fixed = read_is_fixed_by_key(read);
                if !fixed {
                    // The read itself, not the statement around it.
                    self.found_reader(term.span);
                }
                Some(fixed)
            }
            TermKind::Static(..) => Some(true),
            TermKind::Hoisted(_, inner) | TermKind::At(_, inner) => Some(recurse(inner)),
            TermKind::Let(index) => Some(self.once(&self.lets, *index, || {
                self.program
                    .lets
                    .get(*index)
                    .is_some_and(|spec| recurse(&spec.term))
            })),
            TermKind::Merge(index) => Some(self.once(&self.merges, *index, || {
                self.program
                    .merges
                    .get(*index)
                    .is_some_and(|spec| recurse(&spec.request) && recurse(&spec.default))
            })),
            TermKind::Aggregate(_, scored, filter) => {
                Some(recurse(scored) && filter.as_deref().is_none_or(recurse))
            }
            TermKind::Grouped(_, parts, aggregate) => {
                Some(parts.iter().all(recurse) && recurse(aggregate))
            }
            _ => None,
        }
    }

    /// `answer`'s value for entry `index` of `known`, found once (the inputs
    /// it reads are recorded the first time).
    fn once(
        &self,
        known: &RefCell<Vec<Option<bool>>>,
        index: usize,
        answer: impl FnOnce() -> bool,
    ) -> bool {
        if let Some(Some(known)) = known.borrow().get(index) {
            return *known;
        }
        let found = answer();
        if let Some(slot) = known.borrow_mut().get_mut(index) {
            *slot = Some(found);
        }
        found
    }
}

/// Whether a read's value is the same for every request with one key. Every
/// read is named, so a new one must be placed here.
fn read_is_fixed_by_key(read: &Read) -> bool {
    match read {
        // The name asked for, the endpoint, the inputs plans read, and the
        // settings the caller's layers give that name.
        Read::Input(..)
        | Read::RequestModel
        | Read::RequestPinned
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
        | Read::ProviderEndpoints
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

    fn memo() -> PlanMemo {
        PlanMemo {
            inputs: Some(Box::new([0])),
            made_afresh_by: None,
            hashing: foldhash::fast::RandomState::default(),
            plans: RwLock::new(Plans::default()),
        }
    }

    fn plan(request: RequestState, attempts: usize) -> Plan {
        Plan {
            request,
            candidates: Vec::new(),
            attempts,
            budget_ms: None,
            capacity_wait_ms: 0,
        }
    }

    fn request(key: usize, endpoint: Endpoint, model: &str, input: Value) -> RequestState {
        let mut request = RequestState::placeholder();
        request.caller = Caller {
            tenant: 0,
            workspace: 0,
            key: Some(key),
        };
        request.endpoint = endpoint;
        request.model = Arc::from(model);
        request.inputs = vec![input];
        request
    }

    fn list(items: &[&str]) -> Value {
        Value::List(items.iter().map(|item| Value::string(item)).collect())
    }

    #[test]
    fn a_plan_is_recalled_only_for_its_own_caller_name_endpoint_and_inputs() {
        let memo = memo();
        let chat = Endpoint::ChatCompletions;
        memo.remember(&plan(request(1, chat, "m", list(&["a", "b"])), 3));
        let attempts = |request: RequestState| memo.recall(&request, |plan| plan.attempts);
        assert_eq!(attempts(request(1, chat, "m", list(&["a", "b"]))), Some(3));
        assert_eq!(attempts(request(2, chat, "m", list(&["a", "b"]))), None);
        let messages = Endpoint::Messages;
        assert_eq!(attempts(request(1, messages, "m", list(&["a", "b"]))), None);
        assert_eq!(attempts(request(1, chat, "n", list(&["a", "b"]))), None);
        assert_eq!(attempts(request(1, chat, "m", list(&["b", "a"]))), None);
        assert_eq!(attempts(request(1, chat, "m", Value::Null)), None);
        // An input the request did not send reads as absent.
        let mut unsent = request(1, chat, "m", Value::Null);
        unsent.inputs.clear();
        memo.remember(&plan(unsent, 4));
        assert_eq!(attempts(request(1, chat, "m", Value::Null)), Some(4));
    }

    #[test]
    fn values_equal_to_a_policy_but_not_identical_are_other_keys() {
        let member = Value::Enum(crate::value::EnumMember {
            rank: 0,
            name: Arc::from("eu"),
        });
        assert_eq!(member, Value::string("eu"));
        assert!(!member.identical(&Value::string("eu")));
        assert!(!Value::Number(0.0).identical(&Value::Number(-0.0)));
        assert!(member.identical(&member.clone()));
        let memo = memo();
        let chat = Endpoint::ChatCompletions;
        memo.remember(&plan(request(1, chat, "m", member), 3));
        let recalled = memo.recall(&request(1, chat, "m", Value::string("eu")), |plan| {
            plan.attempts
        });
        assert_eq!(recalled, None);
    }

    #[test]
    fn a_plan_made_again_is_kept_once_and_a_full_memo_starts_over() {
        let memo = memo();
        let remember = |who, attempts| {
            let request = request(who, Endpoint::ChatCompletions, "m", Value::Null);
            memo.remember(&plan(request, attempts));
        };
        let attempts = |who| {
            let request = request(who, Endpoint::ChatCompletions, "m", Value::Null);
            memo.recall(&request, |plan| plan.attempts)
        };
        let bytes = || memo.plans.read().unwrap().bytes;
        remember(0, 1);
        remember(1, 3);
        let two = bytes();
        // A plan made again (by a request that raced another) is not kept
        // twice; the one remembered is the same plan.
        remember(0, 2);
        assert_eq!((memo.len(), bytes()), (2, two));
        assert_eq!((attempts(0), attempts(1)), (Some(1), Some(3)));
        let mut who = 2;
        while memo.len() == who {
            remember(who, 1);
            who += 1;
        }
        // The plan that did not fit is the only one left.
        let full = who - 1;
        assert_eq!(memo.len(), 1);
        assert_eq!((attempts(0), attempts(full)), (None, Some(1)));
        assert!(full > 1000, "{full} plans filled {MEMO_BYTES} bytes");
        assert!(bytes() <= MAX_PLAN_BYTES);
    }

    #[test]
    fn a_plan_keyed_on_a_long_input_is_not_kept() {
        let memo = memo();
        let long = Value::string(&"x".repeat(MAX_PLAN_BYTES));
        let request = request(0, Endpoint::ChatCompletions, "m", long);
        memo.remember(&plan(request.clone(), 1));
        assert_eq!(memo.len(), 0);
        assert_eq!(memo.recall(&request, |plan| plan.attempts), None);
    }

    #[test]
    fn a_memo_that_does_not_apply_remembers_nothing() {
        let memo = PlanMemo {
            inputs: None,
            ..memo()
        };
        let request = request(0, Endpoint::ChatCompletions, "m", Value::Null);
        memo.remember(&plan(request.clone(), 1));
        assert_eq!(memo.len(), 0);
        assert_eq!(memo.recall(&request, |plan| plan.attempts), None);
    }
}
