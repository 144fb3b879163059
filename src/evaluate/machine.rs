//! The term interpreter: evaluates the program's expressions for a request,
//! a candidate, a set of candidates and, during execution, an attempt's
//! outcome. Pure: everything it reads is in its inputs.

use super::health::CandidateHealth;
use super::{Candidate, RequestState, ResolutionKind};
use crate::compile::Snapshot;
use crate::language::ast::{Aggregate, BinaryOp};
use crate::language::ir::{Function, PriceField, Read, Term, TermKind, Who};
use crate::value::{EnumMember, Value};
use std::cmp::Ordering;
use std::sync::Arc;

/// An attempt's outcome as `on` rules, their errors and headers read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutcomeFacts {
    pub status: Option<u16>,
    pub retry_after_ms: Option<u64>,
    pub error_code: Option<Arc<str>>,
    pub error_type: Option<Arc<str>>,
    pub error_message: Option<Arc<str>>,
}

/// Counters of the request's execution so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// The number of the attempt just made (1-based), or 0 before any.
    pub attempt: u32,
    /// Distinct candidates tried so far.
    pub attempts: u32,
    /// Retries the `on` rule being evaluated has made so far in the request
    /// (`react` sets it per rule).
    pub retries: u32,
    pub elapsed_ms: u64,
    /// A uniform sample in [0, 1) for `backoff` jitter.
    pub jitter: f64,
}

/// Which candidates a term looks at.
#[derive(Debug, Clone, Copy, Default)]
pub struct Focus {
    pub current: Option<usize>,
    /// The candidate being scored, inside an aggregate.
    pub scored: Option<usize>,
    pub prev: Option<usize>,
    pub first: Option<usize>,
    pub served: Option<usize>,
}

impl Focus {
    pub fn on(candidate: usize) -> Focus {
        Focus {
            current: Some(candidate),
            ..Focus::default()
        }
    }
}

/// Evaluation state for one request: the request, its candidates, their
/// health, caches of definitions, and (during execution) the outcome.
pub struct Machine<'a> {
    pub snapshot: &'a Snapshot,
    pub request: &'a RequestState,
    pub candidates: &'a [Candidate],
    pub health: &'a [CandidateHealth],
    /// The candidate set aggregates range over.
    pub set: Vec<usize>,
    pub outcome: Option<&'a OutcomeFacts>,
    pub progress: Progress,
    pub free_in_ms: Option<u64>,
    /// The value of `it` in an input's shorthand.
    pub shorthand: Option<Value>,
    /// Whether the response is a provider's successful answer (for headers).
    pub succeeded: bool,
    request_lets: Vec<Option<Value>>,
    /// Per candidate and definition (`candidate * lets + let`), values of
    /// definitions that depend on the candidate but not on the set.
    candidate_lets: Vec<Option<Value>>,
    /// Same, for definitions that use aggregates; cleared when the set changes.
    set_lets: Vec<Option<Value>>,
    lets: usize,
    merges: Vec<Option<Value>>,
    /// Values of the staged program's request-only parts.
    hoisted: Vec<Option<Value>>,
    depth: usize,
}

/// Deepest nesting of definitions; a checked program
/// stays far below it, so hitting it means a cycle the checker missed.
const MAX_DEPTH: usize = 256;

impl<'a> Machine<'a> {
    pub fn new(
        snapshot: &'a Snapshot,
        request: &'a RequestState,
        candidates: &'a [Candidate],
        health: &'a [CandidateHealth],
    ) -> Machine<'a> {
        let lets = snapshot.program.lets.len();
        Machine {
            snapshot,
            request,
            candidates,
            health,
            set: (0..candidates.len()).collect(),
            outcome: None,
            progress: Progress::default(),
            free_in_ms: None,
            shorthand: None,
            succeeded: false,
            request_lets: vec![None; lets],
            candidate_lets: vec![None; lets * candidates.len()],
            set_lets: vec![None; lets * candidates.len()],
            lets,
            merges: request.merges.iter().cloned().map(Some).collect(),
            hoisted: vec![None; snapshot.hoisted],
            depth: 0,
        }
    }

    /// Sets the candidates aggregates range over.
    pub fn set_candidates(&mut self, set: &[usize]) {
        if set != self.set.as_slice() {
            self.set.clear();
            self.set.extend_from_slice(set);
            self.set_lets.iter_mut().for_each(|slot| *slot = None);
        }
    }

    pub fn truth(&mut self, term: &Term, focus: Focus) -> bool {
        matches!(self.eval(term, focus), Value::Bool(true))
    }

    pub fn eval(&mut self, term: &Term, focus: Focus) -> Value {
        match &term.kind {
            TermKind::Const(value) => value.clone(),
            TermKind::Read(read) => self.read(read, focus),
            TermKind::At(who, inner) => {
                let target = match who {
                    Who::Prev => focus.prev,
                    Who::First => focus.first,
                    Who::Served => focus.served,
                    Who::Scored => focus.scored,
                };
                match target {
                    Some(candidate) => self.eval(
                        inner,
                        Focus {
                            current: Some(candidate),
                            scored: None,
                            ..focus
                        },
                    ),
                    None => Value::Null,
                }
            }
            TermKind::Let(index) => {
                // Terms are finite trees; only definitions can recur.
                self.depth += 1;
                let value = if self.depth > MAX_DEPTH {
                    Value::Null
                } else {
                    stacker::maybe_grow(
                        crate::language::check::STACK_RED_ZONE,
                        crate::language::check::STACK_SEGMENT,
                        || self.let_value(*index, focus),
                    )
                };
                self.depth -= 1;
                value
            }
            TermKind::Merge(index) => self.merge_value(*index),
            TermKind::Not(inner) => match self.eval(inner, focus) {
                Value::Bool(b) => Value::Bool(!b),
                _ => Value::Null,
            },
            TermKind::Negate(inner) => match self.eval(inner, focus) {
                Value::Number(n) => Value::Number(-n),
                _ => Value::Null,
            },
            TermKind::Binary(op, lhs, rhs) => self.binary(*op, lhs, rhs, focus),
            TermKind::If(condition, then, otherwise) => {
                if self.truth(condition, focus) {
                    self.eval(then, focus)
                } else {
                    self.eval(otherwise, focus)
                }
            }
            TermKind::Call(function, args) => self.call(*function, args, focus),
            TermKind::Aggregate(function, value, filter) => {
                self.aggregate(*function, value, filter.as_deref(), focus)
            }
            TermKind::List(items) => {
                let values: Vec<Value> = items.iter().map(|item| self.eval(item, focus)).collect();
                Value::List(Arc::from(values))
            }
            TermKind::Record(fields) => {
                let values: Vec<(Arc<str>, Value)> = fields
                    .iter()
                    .map(|(name, term)| (name.clone(), self.eval(term, focus)))
                    .collect();
                Value::Record(Arc::from(values))
            }
            TermKind::Field(base, name) => self.eval(base, focus).field(name).clone(),
            TermKind::ToEnum(target, inner) => match self.eval(inner, focus) {
                Value::String(text) => to_member(&target.members, text),
                Value::Enum(member) => to_member(&target.members, member.name),
                _ => Value::Null,
            },
            TermKind::Static(slot, inner) => {
                let precomputed = focus.current.and_then(|current| {
                    let candidate = self.candidates.get(current)?;
                    self.snapshot.statics.get(
                        candidate.model,
                        candidate.route,
                        candidate.credential,
                        *slot,
                    )
                });
                match precomputed {
                    Some(value) => value.clone(),
                    None => self.eval(inner, focus),
                }
            }
            TermKind::Hoisted(slot, inner) => {
                if let Some(Some(value)) = self.hoisted.get(*slot) {
                    return value.clone();
                }
                let value = self.eval(inner, Focus::default());
                if let Some(cached) = self.hoisted.get_mut(*slot) {
                    *cached = Some(value.clone());
                }
                value
            }
        }
    }

    fn let_value(&mut self, index: usize, focus: Focus) -> Value {
        let Some(spec) = self.snapshot.program.lets.get(index) else {
            return Value::Null;
        };
        let term = &spec.term;
        if !spec.candidate {
            if let Some(Some(value)) = self.request_lets.get(index) {
                return value.clone();
            }
            let value = self.eval(term, Focus::default());
            if let Some(slot) = self.request_lets.get_mut(index) {
                *slot = Some(value.clone());
            }
            return value;
        }
        let Some(candidate) = focus.current else {
            return Value::Null;
        };
        let aggregate = spec.aggregate;
        let cache = if aggregate {
            &self.set_lets
        } else {
            &self.candidate_lets
        };
        let slot = candidate * self.lets + index;
        if let Some(Some(value)) = cache.get(slot) {
            return value.clone();
        }
        let value = self.eval(term, Focus::on(candidate));
        let cache = if aggregate {
            &mut self.set_lets
        } else {
            &mut self.candidate_lets
        };
        if let Some(cached) = cache.get_mut(slot) {
            *cached = Some(value.clone());
        }
        value
    }

    fn merge_value(&mut self, index: usize) -> Value {
        if let Some(Some(value)) = self.merges.get(index) {
            return value.clone();
        }
        let Some(spec) = self.snapshot.program.merges.get(index) else {
            return Value::Null;
        };
        let request = self.eval(&spec.request, Focus::default());
        let default = self.eval(&spec.default, Focus::default());
        let value = super::merge::combine(spec.op, &request, &default);
        if let Some(slot) = self.merges.get_mut(index) {
            *slot = Some(value.clone());
        }
        value
    }

    fn binary(&mut self, op: BinaryOp, lhs: &Term, rhs: &Term, focus: Focus) -> Value {
        match op {
            BinaryOp::And => return Value::Bool(self.truth(lhs, focus) && self.truth(rhs, focus)),
            BinaryOp::Or => return Value::Bool(self.truth(lhs, focus) || self.truth(rhs, focus)),
            BinaryOp::Implies => {
                return Value::Bool(!self.truth(lhs, focus) || self.truth(rhs, focus));
            }
            _ => {}
        }
        let a = self.eval(lhs, focus);
        let b = self.eval(rhs, focus);
        match op {
            BinaryOp::Eq => Value::Bool(a == b),
            BinaryOp::Ne => Value::Bool(a != b),
            BinaryOp::Lt => Value::Bool(a.compare(&b) == Some(Ordering::Less)),
            BinaryOp::Le => Value::Bool(matches!(
                a.compare(&b),
                Some(Ordering::Less | Ordering::Equal)
            )),
            BinaryOp::Gt => Value::Bool(a.compare(&b) == Some(Ordering::Greater)),
            BinaryOp::Ge => Value::Bool(matches!(
                a.compare(&b),
                Some(Ordering::Greater | Ordering::Equal)
            )),
            BinaryOp::In => Value::Bool(b.items().contains(&a)),
            BinaryOp::NotIn => Value::Bool(!b.items().contains(&a)),
            BinaryOp::Add => match (a, b) {
                (Value::Number(x), Value::Number(y)) => number(x + y),
                (Value::Duration(x), Value::Duration(y)) => Value::Duration(x.saturating_add(y)),
                (Value::String(x), Value::String(y)) => Value::String(Arc::from(format!("{x}{y}"))),
                _ => Value::Null,
            },
            BinaryOp::Sub => match (a, b) {
                (Value::Number(x), Value::Number(y)) => number(x - y),
                (Value::Duration(x), Value::Duration(y)) => Value::Duration(x.saturating_sub(y)),
                _ => Value::Null,
            },
            BinaryOp::Mul => match (a, b) {
                (Value::Number(x), Value::Number(y)) => number(x * y),
                (Value::Number(n), Value::Duration(d)) | (Value::Duration(d), Value::Number(n)) => {
                    duration(d as f64 * n)
                }
                _ => Value::Null,
            },
            BinaryOp::Div => match (a, b) {
                (Value::Number(x), Value::Number(y)) if y != 0.0 => number(x / y),
                (Value::Duration(d), Value::Number(n)) if n != 0.0 => duration(d as f64 / n),
                (Value::Duration(x), Value::Duration(y)) if y != 0 => number(x as f64 / y as f64),
                _ => Value::Null,
            },
            BinaryOp::And | BinaryOp::Or | BinaryOp::Implies => Value::Null,
        }
    }

    fn arg(&mut self, args: &[Term], index: usize, focus: Focus) -> Value {
        match args.get(index) {
            Some(term) => self.eval(term, focus),
            None => Value::Null,
        }
    }

    fn call(&mut self, function: Function, args: &[Term], focus: Focus) -> Value {
        match function {
            // `coalesce` stops at the first present value.
            Function::Coalesce => {
                for arg in args {
                    let value = self.eval(arg, focus);
                    if !value.is_null() {
                        return value;
                    }
                }
                Value::Null
            }
            Function::Min | Function::Max => {
                let want = if function == Function::Min {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
                let mut best = Value::Null;
                for arg in args {
                    let value = self.eval(arg, focus);
                    if !value.is_null() && (best.is_null() || value.compare(&best) == Some(want)) {
                        best = value;
                    }
                }
                best
            }
            Function::Clamp => {
                let value = self.arg(args, 0, focus);
                if value.is_null() {
                    return Value::Null;
                }
                let low = self.arg(args, 1, focus);
                if value.compare(&low) == Some(Ordering::Less) {
                    return low;
                }
                let high = self.arg(args, 2, focus);
                if value.compare(&high) == Some(Ordering::Greater) {
                    high
                } else {
                    value
                }
            }
            Function::Present => Value::Bool(!self.arg(args, 0, focus).is_null()),
            Function::Empty => Value::Bool(self.arg(args, 0, focus).items().is_empty()),
            Function::Len => Value::Number(self.arg(args, 0, focus).items().len() as f64),
            Function::Intersects => {
                let (a, b) = (self.arg(args, 0, focus), self.arg(args, 1, focus));
                Value::Bool(a.items().iter().any(|item| b.items().contains(item)))
            }
            Function::Subset => {
                let (a, b) = (self.arg(args, 0, focus), self.arg(args, 1, focus));
                Value::Bool(a.items().iter().all(|item| b.items().contains(item)))
            }
            Function::IndexOf => {
                let (list, item) = (self.arg(args, 0, focus), self.arg(args, 1, focus));
                list.items()
                    .iter()
                    .position(|candidate| *candidate == item)
                    .map_or(Value::Null, |index| Value::Number(index as f64))
            }
            Function::Contains | Function::StartsWith => {
                let (a, b) = (self.arg(args, 0, focus), self.arg(args, 1, focus));
                match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) if function == Function::Contains => {
                        Value::Bool(a.contains(b))
                    }
                    (Some(a), Some(b)) => Value::Bool(a.starts_with(b)),
                    _ => Value::Bool(false),
                }
            }
            Function::Lower => match self.arg(args, 0, focus).as_str() {
                Some(text) => Value::String(Arc::from(text.to_lowercase())),
                None => Value::Null,
            },
            Function::Seconds => match self.arg(args, 0, focus) {
                Value::Duration(ms) => Value::Number(ms as f64 / 1000.0),
                _ => Value::Null,
            },
            Function::Backoff => {
                let (
                    Value::Duration(base),
                    Value::Number(factor),
                    Value::Duration(max),
                    Value::Number(jitter),
                ) = (
                    self.arg(args, 0, focus),
                    self.arg(args, 1, focus),
                    self.arg(args, 2, focus),
                    self.arg(args, 3, focus),
                )
                else {
                    return Value::Null;
                };
                let retries = i32::try_from(self.progress.retries).unwrap_or(i32::MAX);
                let full = (base as f64 * factor.max(0.0).powi(retries)).min(max as f64);
                let jitter = jitter.clamp(0.0, 1.0);
                // A `jitter` share of the wait is random, the rest fixed.
                duration(
                    full * (1.0 - jitter) + full * jitter * self.progress.jitter.clamp(0.0, 1.0),
                )
            }
        }
    }

    fn aggregate(
        &mut self,
        function: Aggregate,
        value: &Term,
        filter: Option<&Term>,
        focus: Focus,
    ) -> Value {
        let members = self.set.clone();
        let mut values = Vec::new();
        for member in members {
            let inner = Focus {
                current: Some(member),
                scored: focus.current,
                ..focus
            };
            if let Some(filter) = filter
                && !self.truth(filter, inner)
            {
                continue;
            }
            values.push(self.eval(value, inner));
        }
        match function {
            Aggregate::CountOf => Value::Number(
                values
                    .iter()
                    .filter(|v| matches!(v, Value::Bool(true)))
                    .count() as f64,
            ),
            Aggregate::AllOf => Value::Bool(values.iter().all(|v| matches!(v, Value::Bool(true)))),
            Aggregate::AnyOf => Value::Bool(values.iter().any(|v| matches!(v, Value::Bool(true)))),
            Aggregate::ListOf => Value::List(Arc::from(values)),
            Aggregate::MinOf | Aggregate::MaxOf => {
                let want = if function == Aggregate::MinOf {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
                values
                    .into_iter()
                    .filter(|v| !v.is_null())
                    .fold(Value::Null, |best, value| {
                        if best.is_null() || value.compare(&best) == Some(want) {
                            value
                        } else {
                            best
                        }
                    })
            }
            Aggregate::AvgOf => {
                let present: Vec<&Value> = values.iter().filter(|v| !v.is_null()).collect();
                if present.is_empty() {
                    return Value::Null;
                }
                let count = present.len() as f64;
                match present.first() {
                    Some(Value::Duration(_)) => {
                        let sum: f64 = present
                            .iter()
                            .filter_map(|v| v.as_duration())
                            .map(|ms| ms as f64)
                            .sum();
                        duration(sum / count)
                    }
                    _ => {
                        let sum: f64 = present.iter().filter_map(|v| v.as_number()).sum();
                        number(sum / count)
                    }
                }
            }
        }
    }

    fn read(&mut self, read: &Read, focus: Focus) -> Value {
        let request = self.request;
        let data = &self.snapshot.data;
        let tenants = &data.tenants;
        match read {
            Read::RequestId => Value::String(request.id.clone()),
            Read::RequestModel => Value::String(request.model.clone()),
            Read::RequestEndpoint => builtin(request.endpoint.name()),
            Read::RequestWire => builtin(request.endpoint.wire().name()),
            Read::RequestKind => builtin(request.endpoint.kind().name()),
            Read::RequestStream => Value::Bool(request.stream),
            Read::RequestParameters => Value::List(request.parameters.clone()),
            Read::RequestEstimatedTokens => Value::Number(request.estimated_tokens),
            Read::Input(index, path) => {
                let value = if *index == usize::MAX {
                    let fields: Vec<(Arc<str>, Value)> = self
                        .snapshot
                        .program
                        .inputs
                        .iter()
                        .zip(request.inputs.iter())
                        .map(|(spec, value)| (Arc::from(spec.name.as_str()), value.clone()))
                        .collect();
                    return Value::Record(Arc::from(fields));
                } else {
                    request.inputs.get(*index).cloned().unwrap_or(Value::Null)
                };
                path.iter()
                    .fold(value, |value, field| value.field(field).clone())
            }
            Read::TenantId => tenants
                .tenants
                .get(request.caller.tenant)
                .map_or(Value::Null, |tenant| Value::string(&tenant.id)),
            Read::TenantAttr(index) => tenants
                .tenants
                .get(request.caller.tenant)
                .and_then(|tenant| tenant.attributes.get(*index))
                .cloned()
                .unwrap_or(Value::Null),
            Read::WorkspaceId => self
                .workspace()
                .map_or(Value::Null, |workspace| Value::string(&workspace.id)),
            Read::WorkspaceAttr(index) => self
                .workspace()
                .and_then(|workspace| workspace.attributes.get(*index))
                .cloned()
                .unwrap_or(Value::Null),
            Read::KeyId => request
                .caller
                .key
                .and_then(|key| tenants.keys.get(key))
                .map_or(Value::Null, |key| Value::string(&key.id)),
            Read::KeyAttr(index) => {
                match request.caller.key.and_then(|key| tenants.keys.get(key)) {
                    Some(key) => key.attributes.get(*index).cloned().unwrap_or(Value::Null),
                    // Without a key (`explain --tenant`), a key attribute is its default.
                    None => data
                        .schema
                        .key
                        .entries
                        .get(*index)
                        .and_then(|decl| decl.fallback())
                        .unwrap_or(Value::Null),
                }
            }
            Read::Setting(index) => request.settings.get(*index).cloned().unwrap_or(Value::Null),
            Read::DeploymentAttr(index) => self
                .snapshot
                .deployment
                .get(*index)
                .cloned()
                .unwrap_or(Value::Null),
            Read::Attempt => Value::Number(f64::from(self.progress.attempt)),
            Read::Attempts => Value::Number(f64::from(self.progress.attempts)),
            Read::Retries => Value::Number(f64::from(self.progress.retries)),
            Read::Elapsed => Value::Duration(self.progress.elapsed_ms),
            Read::FreeIn => self.free_in_ms.map_or(Value::Null, Value::Duration),
            Read::ShorthandValue => self.shorthand.clone().unwrap_or(Value::Null),
            Read::Succeeded => Value::Bool(self.succeeded),
            Read::UpstreamStatus => self
                .outcome
                .and_then(|o| o.status)
                .map_or(Value::Null, |s| Value::Number(f64::from(s))),
            Read::UpstreamRetryAfter => self
                .outcome
                .and_then(|o| o.retry_after_ms)
                .map_or(Value::Null, Value::Duration),
            Read::UpstreamErrorCode => text(self.outcome.and_then(|o| o.error_code.clone())),
            Read::UpstreamErrorType => text(self.outcome.and_then(|o| o.error_type.clone())),
            Read::UpstreamErrorMessage => text(self.outcome.and_then(|o| o.error_message.clone())),
            candidate_read => match focus.current {
                Some(candidate) => self.read_candidate(candidate_read, candidate),
                None => Value::Null,
            },
        }
    }

    fn workspace(&self) -> Option<&'a crate::data::Workspace> {
        let tenants = &self.snapshot.data.tenants;
        tenants
            .tenants
            .get(self.request.caller.tenant)?
            .workspaces
            .get(self.request.caller.workspace)
    }

    fn read_candidate(&self, read: &Read, index: usize) -> Value {
        let Some(candidate) = self.candidates.get(index) else {
            return Value::Null;
        };
        let catalog = &self.snapshot.data.catalog;
        let interned = &self.snapshot.interned;
        let model = candidate.model.and_then(|m| catalog.models.get(m));
        let route = model.and_then(|m| candidate.route.and_then(|r| m.routes.get(r)));
        let provider = catalog.providers.get(candidate.provider);
        let credential = provider.and_then(|p| p.credentials.get(candidate.credential));
        let health = self.health.get(index);
        let from = |values: &Vec<Value>, at: Option<usize>| {
            at.and_then(|i| values.get(i))
                .cloned()
                .unwrap_or(Value::Null)
        };
        match read {
            Read::ModelId => match candidate.model {
                Some(model) => from(&interned.model_id, Some(model)),
                None => Value::String(candidate.requested.id.clone()),
            },
            Read::ModelKind => match candidate.model {
                Some(model) => from(&interned.model_kind, Some(model)),
                None => builtin(self.request.endpoint.kind().name()),
            },
            Read::ModelAliases => match candidate.model {
                Some(model) => from(&interned.model_aliases, Some(model)),
                None => Value::List(Arc::from(Vec::new())),
            },
            Read::ModelAttr(attr) => match model {
                Some(model) => model.attributes.get(*attr).cloned().unwrap_or(Value::Null),
                None => self.fallback(&self.snapshot.data.schema.model, *attr),
            },
            Read::ProviderId => from(&interned.provider_id, Some(candidate.provider)),
            Read::ProviderName => from(&interned.provider_name, Some(candidate.provider)),
            Read::ProviderAliases => from(&interned.provider_aliases, Some(candidate.provider)),
            Read::ProviderFormat => from(&interned.provider_format, Some(candidate.provider)),
            Read::ProviderPriority => provider.map_or(Value::Null, |p| Value::Number(p.priority)),
            Read::ProviderListed => provider
                .and_then(|p| p.listed)
                .map_or(Value::Null, Value::Date),
            Read::ProviderAttr(attr) => provider
                .and_then(|p| p.attributes.get(*attr))
                .cloned()
                .unwrap_or(Value::Null),
            Read::RouteUpstreamModel => Value::String(candidate.upstream_model.clone()),
            Read::RoutePrice(field) => {
                let price = route.map(|r| r.price).unwrap_or_default();
                let value = match field {
                    PriceField::Input => price.input,
                    PriceField::Output => price.output,
                    PriceField::CacheRead => price.cache_read,
                    PriceField::CacheWrite => price.cache_write,
                };
                value.map_or(Value::Null, Value::Number)
            }
            Read::RouteCapabilities => candidate
                .model
                .zip(candidate.route)
                .and_then(|(m, r)| {
                    interned
                        .route_capabilities
                        .get(m)
                        .and_then(|routes| routes.get(r))
                })
                .cloned()
                .unwrap_or_else(|| Value::List(Arc::from(Vec::new()))),
            Read::RouteAttr(attr) => match route {
                Some(route) => route.attributes.get(*attr).cloned().unwrap_or(Value::Null),
                None => self.fallback(&self.snapshot.data.schema.route, *attr),
            },
            Read::CredentialId => interned
                .credential_id
                .get(candidate.provider)
                .and_then(|ids| ids.get(candidate.credential))
                .cloned()
                .unwrap_or(Value::Null),
            Read::CredentialOwned => Value::Bool(credential.is_some_and(|c| {
                let tenant = self
                    .snapshot
                    .data
                    .tenants
                    .tenants
                    .get(self.request.caller.tenant);
                c.tenant
                    .as_deref()
                    .is_some_and(|owner| tenant.is_some_and(|t| t.id == owner))
            })),
            Read::CredentialAttr(attr) => credential
                .and_then(|c| c.attributes.get(*attr))
                .cloned()
                .unwrap_or(Value::Null),
            Read::HealthPaused => Value::Bool(health.is_some_and(CandidateHealth::paused)),
            Read::HealthPenalized => Value::Bool(health.is_some_and(|h| h.penalized)),
            Read::HealthStrikes => Value::Number(f64::from(health.map_or(0, |h| h.strikes))),
            Read::StatsSamples => Value::Number(f64::from(health.map_or(0, |h| h.stats.samples))),
            Read::StatsSuccessRate => health
                .and_then(|h| h.stats.success_rate)
                .map_or(Value::Null, Value::Number),
            Read::StatsTtft => health
                .and_then(|h| h.stats.ttft_ms)
                .map_or(Value::Null, Value::Duration),
            Read::StatsLatency => health
                .and_then(|h| h.stats.latency_ms)
                .map_or(Value::Null, Value::Duration),
            Read::StatsThroughput => health
                .and_then(|h| h.stats.throughput)
                .map_or(Value::Null, Value::Number),
            Read::CapacityFull => Value::Bool(health.is_some_and(|h| h.full)),
            Read::CapacityInFlight => Value::Number(f64::from(health.map_or(0, |h| h.in_flight))),
            Read::RequestedIndex => Value::Number(candidate.requested.index as f64),
            Read::RequestedKind => builtin(match candidate.requested.kind {
                ResolutionKind::Bare => "bare",
                ResolutionKind::Alias => "alias",
                ResolutionKind::Pin => "pin",
                ResolutionKind::Unknown => "unknown",
            }),
            Read::RequestedId => Value::String(candidate.requested.id.clone()),
            _ => Value::Null,
        }
    }

    /// An attribute of a model or route the catalog does not describe (an
    /// unknown model served by a fallback provider): its declared fallback.
    fn fallback(&self, table: &crate::data::schema::AttrTable, index: usize) -> Value {
        table
            .entries
            .get(index)
            .and_then(|decl| decl.fallback())
            .unwrap_or(Value::Null)
    }
}

use crate::compile::builtin_member as builtin;

fn to_member(members: &[String], name: Arc<str>) -> Value {
    match members.iter().position(|m| **m == *name) {
        Some(rank) => Value::Enum(EnumMember {
            rank: u32::try_from(rank).unwrap_or(u32::MAX),
            name,
        }),
        None => Value::Null,
    }
}

fn text(value: Option<Arc<str>>) -> Value {
    value.map_or(Value::Null, Value::String)
}

/// Arithmetic results are kept to nine decimal places, so prices that are
/// equal on paper compare equal (3 × 0.20 + 0.60 == 3 × 0.25 + 0.45).
fn number(n: f64) -> Value {
    if !n.is_finite() {
        return Value::Null;
    }
    let rounded = (n * 1e9).round() / 1e9;
    Value::Number(if rounded.is_finite() { rounded } else { n })
}

/// A duration from fractional milliseconds: rounded, at least zero.
fn duration(ms: f64) -> Value {
    if ms.is_finite() {
        Value::Duration(ms.max(0.0).round().min(u64::MAX as f64) as u64)
    } else {
        Value::Null
    }
}
