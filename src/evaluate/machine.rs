//! The term interpreter: evaluates the program's expressions for a request,
//! a candidate, a set of candidates and, during execution, an attempt's
//! outcome. Pure: everything it reads is in its inputs.

use super::health::{AskedHealth, CandidateHealth};
use super::{Candidate, RequestState};
use crate::compile::{
    Guard, Snapshot, endpoint_member, kind_member, resolution_member, wire_member,
};
use crate::language::ast::{Aggregate, BinaryOp};
use crate::language::check::EnumTy;
use crate::language::ir::{Function, PriceField, Read, Term, TermKind, Who};
use crate::value::{EnumMember, Value};
use std::borrow::Cow;
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

/// What evaluates to a value for a focus: a term, interpreted, or a term
/// compiled once per snapshot ([`super::compiled`]). The interpreter's calls,
/// arithmetic and connectives are written once over it, so both forms give
/// every function and operator the same meaning.
pub(crate) trait Operand: Send + Sync {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value>;

    /// Whether the value is `true`.
    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        matches!(*self.value(machine, focus), Value::Bool(true))
    }

    /// The value if it is a boolean. Compiled nodes whose terms are
    /// booleans by their shape answer without building a value.
    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        match *self.value(machine, focus) {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value if it is a number; likewise for numbers by shape.
    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        self.value(machine, focus).as_number()
    }
}

impl Operand for Term {
    #[inline]
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        machine.eval_ref(self, focus)
    }

    #[inline]
    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        machine.truth(self, focus)
    }
}

impl<T: Operand + ?Sized> Operand for Box<T> {
    #[inline]
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        (**self).value(machine, focus)
    }

    #[inline]
    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        (**self).truth(machine, focus)
    }

    #[inline]
    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        (**self).boolean(machine, focus)
    }

    #[inline]
    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        (**self).number(machine, focus)
    }
}

/// Evaluation state for one request: the request, its candidates, their
/// health, caches of definitions, and (during execution) the outcome.
pub struct Machine<'a> {
    pub snapshot: &'a Snapshot,
    pub request: &'a RequestState,
    pub candidates: &'a [Candidate],
    pub health: Health<'a>,
    /// The candidate set aggregates range over.
    pub set: Vec<usize>,
    pub outcome: Option<&'a OutcomeFacts>,
    pub progress: Progress,
    pub free_in_ms: Option<u64>,
    /// The value of `it` in an input's shorthand.
    pub shorthand: Option<Value>,
    /// Whether the response is a provider's successful answer (for headers).
    pub succeeded: bool,
    /// Cached values, one allocation for every cache: the request-level
    /// definitions, the merges, the staged program's request-only parts,
    /// then per candidate the definitions that depend on the candidate but
    /// not on the set, then per candidate those that use aggregates, then
    /// the set-wide definitions (these two cleared when the set changes);
    /// [`crate::compile::LetSlots`] places each
    /// definition in its group. Allocated on the first value stored: many
    /// machines never store one.
    cache: Vec<Option<Value>>,
    cache_len: usize,
    /// Aggregates computed for a group of candidates, by their slot and the
    /// values that define the group (in `group_keys`); cleared when the
    /// set changes.
    groups: Vec<Group>,
    group_keys: Vec<Value>,
    merges_at: usize,
    hoisted_at: usize,
    candidate_lets_at: usize,
    set_lets_at: usize,
    set_wide_lets_at: usize,
    depth: usize,
}

/// The candidates' health: given (execution, `explain`, tests), or asked of
/// the health view when first read.
#[derive(Clone, Copy)]
pub enum Health<'a> {
    Given(&'a [CandidateHealth]),
    Asked(&'a AskedHealth<'a>),
}

impl<'a> Health<'a> {
    /// A candidate's health, `None` for an index past the candidates.
    pub fn of(self, candidate: usize) -> Option<&'a CandidateHealth> {
        match self {
            Health::Given(all) => all.get(candidate),
            Health::Asked(asked) => asked.all().get(candidate),
        }
    }
}

const USUAL_GROUPS: usize = 8;

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
        let groups = &snapshot.let_slots;
        let merges_at = groups.request;
        let hoisted_at = merges_at + snapshot.program.merges.len();
        let candidate_lets_at = hoisted_at + snapshot.hoisted;
        let set_lets_at = candidate_lets_at + groups.candidate * candidates.len();
        let set_wide_lets_at = set_lets_at + groups.set * candidates.len();
        Machine {
            snapshot,
            request,
            candidates,
            health: Health::Given(health),
            set: (0..candidates.len()).collect(),
            outcome: None,
            progress: Progress::default(),
            free_in_ms: None,
            shorthand: None,
            succeeded: false,
            cache: Vec::new(),
            cache_len: set_wide_lets_at + groups.set_wide,
            groups: Vec::new(),
            group_keys: Vec::new(),
            merges_at,
            hoisted_at,
            candidate_lets_at,
            set_lets_at,
            set_wide_lets_at,
            depth: 0,
        }
    }

    /// Sets the candidates aggregates range over.
    pub fn set_candidates(&mut self, set: &[usize]) {
        if set != self.set.as_slice() {
            self.set.clear();
            self.set.extend_from_slice(set);
            if let Some(set_lets) = self.cache.get_mut(self.set_lets_at..) {
                set_lets.iter_mut().for_each(|slot| *slot = None);
            }
            self.groups.clear();
            self.group_keys.clear();
        }
    }

    pub fn truth(&mut self, term: &Term, focus: &Focus) -> bool {
        // Connectives decide on their operands' truth without building values.
        match &term.kind {
            TermKind::Binary(BinaryOp::And, lhs, rhs) => {
                self.truth(lhs, focus) && self.truth(rhs, focus)
            }
            TermKind::Binary(BinaryOp::Or, lhs, rhs) => {
                self.truth(lhs, focus) || self.truth(rhs, focus)
            }
            TermKind::Binary(BinaryOp::Implies, lhs, rhs) => {
                !self.truth(lhs, focus) || self.truth(rhs, focus)
            }
            // So do comparisons and negations: no value is built and dropped.
            TermKind::Binary(op, lhs, rhs) if is_comparison(*op) => {
                let a = self.eval_ref(lhs, focus);
                let b = self.eval_ref(rhs, focus);
                holds(*op, &a, &b)
            }
            TermKind::Not(inner) => matches!(*self.eval_ref(inner, focus), Value::Bool(false)),
            _ => matches!(*self.eval_ref(term, focus), Value::Bool(true)),
        }
    }

    /// A condition's truth when the request alone settles it, the same for
    /// every candidate; `None` when it depends on the candidate.
    pub fn settled<T: Operand>(&mut self, guard: &Guard<T>) -> Option<bool> {
        match guard {
            Guard::Open => None,
            Guard::Request(part) => Some(part.truth(self, &Focus::default())),
            Guard::And(lhs, rhs) => match (self.settled(lhs), self.settled(rhs)) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
            Guard::Or(lhs, rhs) => match (self.settled(lhs), self.settled(rhs)) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
            Guard::Implies(lhs, rhs) => match (self.settled(lhs), self.settled(rhs)) {
                (Some(false), _) | (_, Some(true)) => Some(true),
                (Some(true), Some(false)) => Some(false),
                _ => None,
            },
        }
    }

    pub fn eval(&mut self, term: &Term, focus: &Focus) -> Value {
        self.eval_ref(term, focus).into_owned()
    }

    /// Evaluates a term to a value borrowed from the term, the snapshot or
    /// the request where it is one of theirs, so reading it costs no copy
    /// and no reference count. Inlined, so a caller reads a leaf without a
    /// call; the interpreter proper, `eval_node`, stays out of line.
    #[inline]
    pub fn eval_ref<'t>(&mut self, term: &'t Term, focus: &Focus) -> Cow<'t, Value>
    where
        'a: 't,
    {
        // The leaves most terms end in are read here, in the caller, without
        // entering the interpreter.
        match &term.kind {
            TermKind::Const(value) => Cow::Borrowed(value),
            TermKind::Static(slot, inner) => match self.precomputed(*slot, focus) {
                Some(value) => Cow::Borrowed(value),
                None => self.eval_node(inner, focus),
            },
            // So are the definitions, which need no frame of the
            // interpreter's own.
            TermKind::Let(index) => Cow::Owned(self.definition(*index, focus, false)),
            _ => self.eval_node(term, focus),
        }
    }

    /// Definition `index`'s value for this focus: cached, or evaluated
    /// (its compiled body, if `compiled`) and cached.
    #[inline(never)]
    pub(crate) fn definition(&mut self, index: usize, focus: &Focus, compiled: bool) -> Value {
        let slot = self.let_slot(index, focus);
        if let Some(value) = slot.and_then(|slot| self.cached(slot)) {
            return value.clone();
        }
        self.let_uncached(index, slot, focus, compiled)
    }

    /// What `read` makes of definition `index`'s value for this focus,
    /// without copying a cached value.
    pub(crate) fn definition_read<R>(
        &mut self,
        index: usize,
        focus: &Focus,
        read: impl FnOnce(&Value) -> R,
    ) -> R {
        let slot = self.let_slot(index, focus);
        if let Some(value) = slot.and_then(|slot| self.cached(slot)) {
            return read(value);
        }
        read(&self.let_uncached(index, slot, focus, true))
    }

    /// A catalog-only part's value for the focused candidate, when the
    /// catalog describes it.
    pub(crate) fn precomputed(&self, slot: usize, focus: &Focus) -> Option<&'a Value> {
        let snapshot: &'a Snapshot = self.snapshot;
        let row = self.candidates.get(focus.current?)?.static_row?;
        snapshot.statics.get(row, slot)
    }

    #[inline(never)]
    fn eval_node<'t>(&mut self, term: &'t Term, focus: &Focus) -> Cow<'t, Value>
    where
        'a: 't,
    {
        match &term.kind {
            // The leaves `eval_ref` answers itself.
            TermKind::Const(_) | TermKind::Static(..) | TermKind::Let(_) => {
                self.eval_ref(term, focus)
            }
            TermKind::Read(read) => self.read(read, focus),
            TermKind::Binary(op, lhs, rhs) => Cow::Owned(self.binary(*op, lhs, rhs, focus)),
            TermKind::Hoisted(slot, inner) => Cow::Owned(self.hoisted(*slot, inner)),
            TermKind::Not(inner) => Cow::Owned(match *self.eval_ref(inner, focus) {
                Value::Bool(b) => Value::Bool(!b),
                _ => Value::Null,
            }),
            TermKind::If(condition, then, otherwise) => {
                if self.truth(condition, focus) {
                    self.eval_ref(then, focus)
                } else {
                    self.eval_ref(otherwise, focus)
                }
            }
            TermKind::Call(function, args) => self.call(*function, args, focus),
            TermKind::Field(base, name) => match self.eval_ref(base, focus) {
                Cow::Borrowed(value) => Cow::Borrowed(value.field(name)),
                Cow::Owned(value) => Cow::Owned(value.field(name).clone()),
            },
            _ => Cow::Owned(self.eval_rare(term, focus)),
        }
    }

    /// The kinds of term that candidate steps and sort keys seldom use,
    /// apart so the common ones stay small.
    #[inline(never)]
    fn eval_rare(&mut self, term: &Term, focus: &Focus) -> Value {
        match &term.kind {
            TermKind::At(who, inner) => self.at(*who, &**inner, focus),
            TermKind::Merge(index) => self.merge_value(*index),
            TermKind::Grouped(slot, by, aggregate) => self.grouped(*slot, by, &**aggregate, focus),
            TermKind::Negate(inner) => self.negate(&**inner, focus),
            TermKind::Aggregate(function, value, filter) => {
                self.aggregate(*function, &**value, filter.as_deref(), focus)
            }
            TermKind::List(items) => self.list(items, focus),
            TermKind::Record(fields) => self.record(fields, focus),
            TermKind::ToEnum(target, inner) => self.enum_member(target, &**inner, focus),
            TermKind::Const(_)
            | TermKind::Read(_)
            | TermKind::Let(_)
            | TermKind::Binary(..)
            | TermKind::Static(..)
            | TermKind::Hoisted(..)
            | TermKind::Not(_)
            | TermKind::If(..)
            | TermKind::Call(..)
            | TermKind::Field(..) => self.eval_ref(term, focus).into_owned(),
        }
    }

    /// An aggregate that depends on the candidate it scores only through
    /// `by`: computed once for each group of candidates with the same values
    /// of `by`.
    pub(crate) fn negate<A: Operand + ?Sized>(&mut self, inner: &A, focus: &Focus) -> Value {
        match *inner.value(self, focus) {
            Value::Number(n) => Value::Number(-n),
            _ => Value::Null,
        }
    }

    pub(crate) fn list<A: Operand>(&mut self, items: &[A], focus: &Focus) -> Value {
        let values: Vec<Value> = items
            .iter()
            .map(|item| item.value(self, focus).into_owned())
            .collect();
        Value::List(Arc::from(values))
    }

    pub(crate) fn record<A: Operand>(&mut self, fields: &[(Arc<str>, A)], focus: &Focus) -> Value {
        let values: Vec<(Arc<str>, Value)> = fields
            .iter()
            .map(|(name, item)| (name.clone(), item.value(self, focus).into_owned()))
            .collect();
        Value::Record(Arc::from(values))
    }

    /// A string as a member of `target` (absent if it is none).
    pub(crate) fn enum_member<A: Operand + ?Sized>(
        &mut self,
        target: &EnumTy,
        inner: &A,
        focus: &Focus,
    ) -> Value {
        match inner.value(self, focus).into_owned() {
            Value::String(text) => to_member(&target.members, text),
            Value::Enum(member) => to_member(&target.members, member.name),
            _ => Value::Null,
        }
    }

    /// `inner` read for another candidate than the focused one.
    pub(crate) fn at<A: Operand + ?Sized>(&mut self, who: Who, inner: &A, focus: &Focus) -> Value {
        let target = match who {
            Who::Prev => focus.prev,
            Who::First => focus.first,
            Who::Served => focus.served,
            Who::Scored => focus.scored,
        };
        match target {
            Some(candidate) => inner
                .value(
                    self,
                    &Focus {
                        current: Some(candidate),
                        scored: None,
                        ..*focus
                    },
                )
                .into_owned(),
            None => Value::Null,
        }
    }

    pub(crate) fn grouped<A: Operand>(
        &mut self,
        slot: usize,
        by: &[A],
        aggregate: &A,
        focus: &Focus,
    ) -> Value {
        let Some(current) = focus.current else {
            return aggregate.value(self, focus).into_owned();
        };
        if self.groups.is_empty() {
            // One allocation each for the few groups a decision forms.
            self.groups.reserve(USUAL_GROUPS);
            self.group_keys.reserve(USUAL_GROUPS * by.len());
        }
        let start = self.group_keys.len();
        for term in by {
            let value = term.value(self, &Focus::on(current)).into_owned();
            self.group_keys.push(value);
        }
        let end = self.group_keys.len();
        let (known, key) = self.group_keys.split_at(start);
        let found = self.groups.iter().find(|group| {
            group.slot == slot
                && known.get(group.keys.clone()).is_some_and(|keys| {
                    keys.len() == key.len() && keys.iter().zip(key).all(|(a, b)| same(a, b))
                })
        });
        if let Some(group) = found {
            let value = group.value.clone();
            self.group_keys.truncate(start);
            return value;
        }
        let value = aggregate.value(self, focus).into_owned();
        self.groups.push(Group {
            slot,
            keys: start..end,
            value: value.clone(),
        });
        value
    }

    /// A definition not cached yet: evaluated on a stack that can grow.
    #[inline(never)]
    fn let_uncached(
        &mut self,
        index: usize,
        slot: Option<usize>,
        focus: &Focus,
        compiled: bool,
    ) -> Value {
        // Terms are finite trees; only definitions can recur.
        self.depth += 1;
        let value = if self.depth > MAX_DEPTH {
            Value::Null
        } else {
            stacker::maybe_grow(
                crate::language::check::STACK_RED_ZONE,
                crate::language::check::STACK_SEGMENT,
                || self.let_value(index, slot, focus, compiled),
            )
        };
        self.depth -= 1;
        value
    }

    /// The value of `merge` number `index`, computed once per request.
    pub fn merge(&mut self, index: usize) -> Value {
        self.merge_value(index)
    }

    fn cached(&self, slot: usize) -> Option<&Value> {
        self.cache.get(slot)?.as_ref()
    }

    fn store(&mut self, slot: usize, value: &Value) {
        if self.cache.is_empty() {
            self.cache.resize_with(self.cache_len, || None);
        }
        if let Some(cached) = self.cache.get_mut(slot) {
            *cached = Some(value.clone());
        }
    }

    /// Where a definition's value is cached for this focus; `None` for a
    /// candidate definition without one of this machine's candidates.
    fn let_slot(&self, index: usize, focus: &Focus) -> Option<usize> {
        let spec = self.snapshot.program.lets.get(index)?;
        let groups = &self.snapshot.let_slots;
        let slot = groups.slot(index)?;
        if !spec.candidate {
            return Some(if spec.aggregate {
                self.set_wide_lets_at + slot
            } else {
                slot
            });
        }
        let candidate = focus.current.filter(|c| *c < self.candidates.len())?;
        Some(if spec.aggregate {
            self.set_lets_at + candidate * groups.set + slot
        } else {
            self.candidate_lets_at + candidate * groups.candidate + slot
        })
    }

    /// Evaluates definition `index` and caches it in `slot`, where
    /// [`Machine::let_slot`] found no value.
    fn let_value(
        &mut self,
        index: usize,
        slot: Option<usize>,
        focus: &Focus,
        compiled: bool,
    ) -> Value {
        let snapshot: &'a Snapshot = self.snapshot;
        let Some(spec) = snapshot.program.lets.get(index) else {
            return Value::Null;
        };
        let focus = match (spec.candidate, focus.current) {
            (false, _) => &Focus::default(),
            (true, Some(candidate)) => &Focus::on(candidate),
            (true, None) => return Value::Null,
        };
        let value = match snapshot.compiled.lets.get(index).filter(|_| compiled) {
            Some(body) => body.value(self, focus).into_owned(),
            None => self.eval(&spec.term, focus),
        };
        if let Some(slot) = slot {
            self.store(slot, &value);
        }
        value
    }

    fn merge_value(&mut self, index: usize) -> Value {
        // Once the request's merges are known, they are its own.
        if let Some(value) = self.request.merges.get(index) {
            return value.clone();
        }
        let slot = self.merges_at + index;
        if let Some(value) = self.cached(slot) {
            return value.clone();
        }
        let Some(spec) = self.snapshot.program.merges.get(index) else {
            return Value::Null;
        };
        let request = self.eval(&spec.request, &Focus::default());
        let default = self.eval(&spec.default, &Focus::default());
        let value = super::merge::combine(spec.op, &request, &default);
        self.store(slot, &value);
        value
    }

    /// A request-only part's value, computed on its first use in the request.
    pub(crate) fn hoisted(&mut self, slot: usize, inner: &Term) -> Value {
        let slot = self.hoisted_at + slot;
        if let Some(value) = self.cached(slot) {
            return value.clone();
        }
        let value = self.eval(inner, &Focus::default());
        self.store(slot, &value);
        value
    }

    pub(crate) fn binary<A: Operand>(
        &mut self,
        op: BinaryOp,
        lhs: &A,
        rhs: &A,
        focus: &Focus,
    ) -> Value {
        match op {
            BinaryOp::And => return Value::Bool(lhs.truth(self, focus) && rhs.truth(self, focus)),
            BinaryOp::Or => return Value::Bool(lhs.truth(self, focus) || rhs.truth(self, focus)),
            BinaryOp::Implies => {
                return Value::Bool(!lhs.truth(self, focus) || rhs.truth(self, focus));
            }
            _ => {}
        }
        let a = lhs.value(self, focus);
        let b = rhs.value(self, focus);
        if is_comparison(op) {
            return Value::Bool(holds(op, &a, &b));
        }
        arithmetic(op, &a, &b)
    }

    fn arg<'t, A: Operand>(&mut self, args: &'t [A], index: usize, focus: &Focus) -> Cow<'t, Value>
    where
        'a: 't,
    {
        match args.get(index) {
            Some(arg) => arg.value(self, focus),
            None => Cow::Owned(Value::Null),
        }
    }

    pub(crate) fn call<'t, A: Operand>(
        &mut self,
        function: Function,
        args: &'t [A],
        focus: &Focus,
    ) -> Cow<'t, Value>
    where
        'a: 't,
    {
        let value = match function {
            // `coalesce` stops at the first present value.
            Function::Coalesce => {
                for arg in args {
                    let value = arg.value(self, focus);
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
                let mut best: Cow<'t, Value> = Cow::Owned(Value::Null);
                for arg in args {
                    let value = arg.value(self, focus);
                    if !value.is_null() && (best.is_null() || value.compare(&best) == Some(want)) {
                        best = value;
                    }
                }
                return best;
            }
            Function::Clamp => {
                let value = self.arg(args, 0, focus);
                if value.is_null() {
                    return value;
                }
                let low = self.arg(args, 1, focus);
                if value.compare(&low) == Some(Ordering::Less) {
                    return low;
                }
                let high = self.arg(args, 2, focus);
                if value.compare(&high) == Some(Ordering::Greater) {
                    return high;
                }
                return value;
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
                    .position(|candidate| *candidate == *item)
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
            Function::Seconds => match *self.arg(args, 0, focus) {
                Value::Duration(ms) => Value::Number(ms as f64 / 1000.0),
                _ => Value::Null,
            },
            Function::Backoff => self.backoff(args, focus),
        };
        Cow::Owned(value)
    }

    fn backoff<A: Operand>(&mut self, args: &[A], focus: &Focus) -> Value {
        let (
            Value::Duration(base),
            Value::Number(factor),
            Value::Duration(max),
            Value::Number(jitter),
        ) = (
            self.arg(args, 0, focus).into_owned(),
            self.arg(args, 1, focus).into_owned(),
            self.arg(args, 2, focus).into_owned(),
            self.arg(args, 3, focus).into_owned(),
        )
        else {
            return Value::Null;
        };
        // The step reached: the rule's retries unless the policy counts
        // another way (every retry of the request, say).
        let step = match args.get(4) {
            Some(_) => match self.arg(args, 4, focus).as_ref() {
                Value::Number(step) => step.max(0.0).floor().min(f64::from(i32::MAX)) as i32,
                _ => return Value::Null,
            },
            None => i32::try_from(self.progress.retries).unwrap_or(i32::MAX),
        };
        let full = super::health::grown_ms(base, factor.max(0.0), step, max);
        let jitter = jitter.clamp(0.0, 1.0);
        // A `jitter` share of the wait is random, the rest fixed.
        duration(full * (1.0 - jitter) + full * jitter * self.progress.jitter.clamp(0.0, 1.0))
    }

    pub(crate) fn aggregate<A: Operand>(
        &mut self,
        function: Aggregate,
        value: &A,
        filter: Option<&A>,
        focus: &Focus,
    ) -> Value {
        let want = if function == Aggregate::MinOf {
            Ordering::Less
        } else {
            Ordering::Greater
        };
        let mut list = Vec::new();
        let mut best = Value::Null;
        // True values (`count_of`), or present ones (`avg_of`).
        let mut count = 0usize;
        let mut first_is_duration = None;
        // Float sums start at -0.0, as `Iterator::sum` does.
        let (mut sum, mut sum_ms) = (-0.0_f64, -0.0_f64);
        // The set does not change while a term is evaluated.
        for position in 0..self.set.len() {
            let Some(&member) = self.set.get(position) else {
                break;
            };
            let inner = Focus {
                current: Some(member),
                scored: focus.current,
                ..*focus
            };
            if let Some(filter) = filter
                && !filter.truth(self, &inner)
            {
                continue;
            }
            // Counts and quantifiers ask only for truth, which compiled
            // nodes give without building a value.
            if matches!(
                function,
                Aggregate::CountOf | Aggregate::AllOf | Aggregate::AnyOf
            ) {
                let truth = value.truth(self, &inner);
                match function {
                    // Terms are pure: the first value that decides ends the walk.
                    Aggregate::AllOf if !truth => return Value::Bool(false),
                    Aggregate::AnyOf if truth => return Value::Bool(true),
                    _ => count += usize::from(truth),
                }
                continue;
            }
            let value = value.value(self, &inner);
            match function {
                Aggregate::CountOf | Aggregate::AllOf | Aggregate::AnyOf => {}
                Aggregate::ListOf => list.push(value.into_owned()),
                Aggregate::MinOf | Aggregate::MaxOf => {
                    if !value.is_null() && (best.is_null() || value.compare(&best) == Some(want)) {
                        best = value.into_owned();
                    }
                }
                Aggregate::AvgOf => {
                    if !value.is_null() {
                        count += 1;
                        first_is_duration.get_or_insert(matches!(*value, Value::Duration(_)));
                        if let Some(ms) = value.as_duration() {
                            sum_ms += ms as f64;
                        }
                        if let Some(n) = value.as_number() {
                            sum += n;
                        }
                    }
                }
            }
        }
        match function {
            Aggregate::CountOf => Value::Number(count as f64),
            Aggregate::AllOf => Value::Bool(true),
            Aggregate::AnyOf => Value::Bool(false),
            Aggregate::ListOf => Value::List(Arc::from(list)),
            Aggregate::MinOf | Aggregate::MaxOf => best,
            Aggregate::AvgOf => match first_is_duration {
                None => Value::Null,
                Some(true) => duration(sum_ms / count as f64),
                Some(false) => number(sum / count as f64),
            },
        }
    }

    pub(crate) fn read(&mut self, read: &Read, focus: &Focus) -> Cow<'a, Value> {
        let request: &'a RequestState = self.request;
        let snapshot: &'a Snapshot = self.snapshot;
        let data = &snapshot.data;
        let tenants = &data.tenants;
        let value = match read {
            Read::RequestId => Value::String(request.id.clone()),
            Read::RequestModel => Value::String(request.model.clone()),
            Read::RequestPinned => Value::Bool(
                super::candidates::match_pin(snapshot, &request.model, request.caller.tenant)
                    .is_some(),
            ),
            Read::RequestEndpoint => return Cow::Borrowed(endpoint_member(request.endpoint)),
            Read::RequestWire => return Cow::Borrowed(wire_member(request.endpoint.wire())),
            Read::RequestKind => return Cow::Borrowed(kind_member(request.endpoint.kind())),
            Read::RequestStream => Value::Bool(request.stream),
            Read::RequestParameters => Value::List(request.parameters.clone()),
            Read::RequestEstimatedTokens => Value::Number(request.estimated_tokens),
            Read::Input(index, path) => {
                if *index == usize::MAX {
                    let fields: Vec<(Arc<str>, Value)> = self
                        .snapshot
                        .program
                        .inputs
                        .iter()
                        .zip(request.inputs.iter())
                        .map(|(spec, value)| (Arc::from(spec.name.as_str()), value.clone()))
                        .collect();
                    return Cow::Owned(Value::Record(Arc::from(fields)));
                }
                let value = request.inputs.get(*index).unwrap_or(&Value::Null);
                return Cow::Borrowed(path.iter().fold(value, |value, field| value.field(field)));
            }
            Read::TenantId => tenants
                .tenants
                .get(request.caller.tenant)
                .map_or(Value::Null, |tenant| Value::string(&tenant.id)),
            Read::TenantAttr(index) => {
                return borrowed(
                    tenants
                        .tenants
                        .get(request.caller.tenant)
                        .and_then(|tenant| tenant.attributes.get(*index)),
                );
            }
            Read::WorkspaceId => self
                .workspace()
                .map_or(Value::Null, |workspace| Value::string(&workspace.id)),
            Read::WorkspaceAttr(index) => {
                return borrowed(
                    self.workspace()
                        .and_then(|workspace| workspace.attributes.get(*index)),
                );
            }
            Read::KeyId => request
                .caller
                .key
                .and_then(|key| tenants.keys.get(key))
                .map_or(Value::Null, |key| Value::string(&key.id)),
            Read::KeyAttr(index) => {
                match request.caller.key.and_then(|key| tenants.keys.get(key)) {
                    Some(key) => return borrowed(key.attributes.get(*index)),
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
            Read::Setting(index) => return borrowed(request.settings.get(*index)),
            Read::DeploymentAttr(index) => return borrowed(snapshot.deployment.get(*index)),
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
            candidate_read => {
                return match focus.current {
                    Some(candidate) => self.read_candidate(candidate_read, candidate),
                    None => self.read_unfocused(candidate_read),
                };
            }
        };
        Cow::Owned(value)
    }

    fn workspace(&self) -> Option<&'a crate::data::Workspace> {
        let tenants = &self.snapshot.data.tenants;
        tenants
            .tenants
            .get(self.request.caller.tenant)?
            .workspaces
            .get(self.request.caller.workspace)
    }

    /// A read of a candidate with none in focus: null, but for what every
    /// candidate shares when the request asks for one id, which the
    /// staging treats as known per request.
    pub(crate) fn read_unfocused(&self, read: &Read) -> Cow<'a, Value> {
        let shared = matches!(read, Read::RequestedKind | Read::RequestedId)
            && self.snapshot.program.models.requests_one_id();
        if shared && !self.candidates.is_empty() {
            return self.read_candidate(read, 0);
        }
        Cow::Owned(Value::Null)
    }

    #[inline(never)]
    pub(crate) fn read_candidate(&self, read: &Read, index: usize) -> Cow<'a, Value> {
        let candidates: &'a [Candidate] = self.candidates;
        let snapshot: &'a Snapshot = self.snapshot;
        let Some(candidate) = candidates.get(index) else {
            return Cow::Owned(Value::Null);
        };
        let catalog = &snapshot.data.catalog;
        let interned = &snapshot.interned;
        // Looked up by the reads that need them, not ahead of every read.
        let model = || candidate.model.and_then(|m| catalog.models.get(m));
        let route = || model().and_then(|m| candidate.route.and_then(|r| m.routes.get(r)));
        let provider = || catalog.providers.get(candidate.provider);
        let credential = || provider().and_then(|p| p.credentials.get(candidate.credential));
        let health = || self.health.of(index);
        let from = |values: &'a Vec<Value>, at: Option<usize>| -> Cow<'a, Value> {
            borrowed(at.and_then(|i| values.get(i)))
        };
        let value = match read {
            Read::ModelId => match candidate.model {
                Some(model) => return from(&interned.model_id, Some(model)),
                None => Value::String(candidate.requested.id.clone()),
            },
            Read::ModelKind => match candidate.model {
                Some(model) => return from(&interned.model_kind, Some(model)),
                None => return Cow::Borrowed(kind_member(self.request.endpoint.kind())),
            },
            Read::ModelAliases => match candidate.model {
                Some(model) => return from(&interned.model_aliases, Some(model)),
                None => Value::List(Arc::from(Vec::new())),
            },
            Read::ModelAttr(attr) => match model() {
                Some(model) => return borrowed(model.attributes.get(*attr)),
                None => self.fallback(&self.snapshot.data.schema.model, *attr),
            },
            Read::ProviderId => return from(&interned.provider_id, Some(candidate.provider)),
            Read::ProviderName => return from(&interned.provider_name, Some(candidate.provider)),
            Read::ProviderAliases => {
                return from(&interned.provider_aliases, Some(candidate.provider));
            }
            Read::ProviderFormat => {
                return from(&interned.provider_format, Some(candidate.provider));
            }
            Read::ProviderEndpoints => {
                return from(&interned.provider_endpoints, Some(candidate.provider));
            }
            Read::ProviderPriority => provider().map_or(Value::Null, |p| Value::Number(p.priority)),
            Read::ProviderListed => provider()
                .and_then(|p| p.listed)
                .map_or(Value::Null, Value::Date),
            Read::ProviderAttr(attr) => {
                return borrowed(provider().and_then(|p| p.attributes.get(*attr)));
            }
            Read::RouteUpstreamModel => Value::String(candidate.upstream_model(snapshot).clone()),
            Read::RoutePrice(field) => {
                let price = route().map(|r| r.price).unwrap_or_default();
                let value = match field {
                    PriceField::Input => price.input,
                    PriceField::Output => price.output,
                    PriceField::CacheRead => price.cache_read,
                    PriceField::CacheWrite => price.cache_write,
                };
                value.map_or(Value::Null, Value::Number)
            }
            Read::RouteCapabilities => {
                match candidate.model.zip(candidate.route).and_then(|(m, r)| {
                    interned
                        .route_capabilities
                        .get(m)
                        .and_then(|routes| routes.get(r))
                }) {
                    Some(capabilities) => return Cow::Borrowed(capabilities),
                    None => Value::List(Arc::from(Vec::new())),
                }
            }
            Read::RouteAttr(attr) => match route() {
                Some(route) => return borrowed(route.attributes.get(*attr)),
                None => self.fallback(&self.snapshot.data.schema.route, *attr),
            },
            Read::CredentialId => {
                return borrowed(
                    interned
                        .credential_id
                        .get(candidate.provider)
                        .and_then(|ids| ids.get(candidate.credential)),
                );
            }
            Read::CredentialOwned => Value::Bool(
                interned
                    .credential_owner
                    .get(candidate.provider)
                    .and_then(|owners| owners.get(candidate.credential))
                    .is_some_and(|owner| owner.is(self.request.caller.tenant)),
            ),
            Read::CredentialAttr(attr) => {
                return borrowed(credential().and_then(|c| c.attributes.get(*attr)));
            }
            Read::HealthPaused => Value::Bool(health().is_some_and(CandidateHealth::paused)),
            Read::HealthPenalized => Value::Bool(health().is_some_and(|h| h.penalized)),
            Read::HealthStrikes => Value::Number(f64::from(health().map_or(0, |h| h.strikes))),
            Read::StatsSamples => Value::Number(f64::from(health().map_or(0, |h| h.stats.samples))),
            Read::StatsSuccessRate => health()
                .and_then(|h| h.stats.success_rate)
                .map_or(Value::Null, Value::Number),
            Read::StatsTtft => health()
                .and_then(|h| h.stats.ttft_ms)
                .map_or(Value::Null, Value::Duration),
            Read::StatsLatency => health()
                .and_then(|h| h.stats.latency_ms)
                .map_or(Value::Null, Value::Duration),
            Read::StatsThroughput => health()
                .and_then(|h| h.stats.throughput)
                .map_or(Value::Null, Value::Number),
            Read::CapacityFull => Value::Bool(health().is_some_and(|h| h.full)),
            Read::CapacityInFlight => Value::Number(f64::from(health().map_or(0, |h| h.in_flight))),
            Read::RequestedIndex => Value::Number(candidate.requested.index as f64),
            Read::RequestedKind => {
                return Cow::Borrowed(resolution_member(candidate.requested.kind));
            }
            Read::RequestedId => Value::String(candidate.requested.id.clone()),
            _ => Value::Null,
        };
        Cow::Owned(value)
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

/// An aggregate's value for one group of candidates.
struct Group {
    slot: usize,
    /// Where the values that define the group are in `Machine::group_keys`.
    keys: std::ops::Range<usize>,
    value: Value,
}

/// Whether two values are [`Value::identical`]. Lists and records are never
/// taken as the same: groups are not formed on them.
fn same(a: &Value, b: &Value) -> bool {
    !matches!(a, Value::List(_) | Value::Record(_)) && a.identical(b)
}

fn to_member(members: &[String], name: Arc<str>) -> Value {
    match members.iter().position(|m| **m == *name) {
        Some(rank) => Value::Enum(EnumMember {
            rank: u32::try_from(rank).unwrap_or(u32::MAX),
            name,
        }),
        None => Value::Null,
    }
}

pub(crate) fn is_comparison(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::In
            | BinaryOp::NotIn
    )
}

/// An arithmetic operator's value; absent for operands it does not take.
pub(crate) fn arithmetic(op: BinaryOp, a: &Value, b: &Value) -> Value {
    match (op, a, b) {
        (BinaryOp::Add, Value::Number(x), Value::Number(y)) => number(x + y),
        (BinaryOp::Add, Value::Duration(x), Value::Duration(y)) => {
            Value::Duration(x.saturating_add(*y))
        }
        (BinaryOp::Add, Value::String(x), Value::String(y)) => {
            Value::String(Arc::from(format!("{x}{y}")))
        }
        (BinaryOp::Sub, Value::Number(x), Value::Number(y)) => number(x - y),
        (BinaryOp::Sub, Value::Duration(x), Value::Duration(y)) => {
            Value::Duration(x.saturating_sub(*y))
        }
        (BinaryOp::Mul, Value::Number(x), Value::Number(y)) => number(x * y),
        (BinaryOp::Mul, Value::Number(n), Value::Duration(d))
        | (BinaryOp::Mul, Value::Duration(d), Value::Number(n)) => duration(*d as f64 * n),
        (BinaryOp::Div, Value::Number(x), Value::Number(y)) if *y != 0.0 => number(x / y),
        (BinaryOp::Div, Value::Duration(d), Value::Number(n)) if *n != 0.0 => {
            duration(*d as f64 / n)
        }
        (BinaryOp::Div, Value::Duration(x), Value::Duration(y)) if *y != 0 => {
            number(*x as f64 / *y as f64)
        }
        _ => Value::Null,
    }
}

/// Whether a comparison holds between two values.
pub(crate) fn holds(op: BinaryOp, a: &Value, b: &Value) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a.compare(b) == Some(Ordering::Less),
        BinaryOp::Le => matches!(a.compare(b), Some(Ordering::Less | Ordering::Equal)),
        BinaryOp::Gt => a.compare(b) == Some(Ordering::Greater),
        BinaryOp::Ge => matches!(a.compare(b), Some(Ordering::Greater | Ordering::Equal)),
        BinaryOp::In => b.items().contains(a),
        BinaryOp::NotIn => !b.items().contains(a),
        // Not comparisons: `is_comparison` keeps them from being asked.
        BinaryOp::Implies
        | BinaryOp::Or
        | BinaryOp::And
        | BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div => false,
    }
}

/// A value read from the snapshot or the request; absent when it is not there.
fn borrowed(value: Option<&Value>) -> Cow<'_, Value> {
    value.map_or(Cow::Owned(Value::Null), Cow::Borrowed)
}

fn text(value: Option<Arc<str>>) -> Value {
    value.map_or(Value::Null, Value::String)
}

/// Arithmetic results are kept to nine decimal places, so prices that are
/// equal on paper compare equal (3 × 0.20 + 0.60 == 3 × 0.25 + 0.45).
fn number(n: f64) -> Value {
    rounded(n).map_or(Value::Null, Value::Number)
}

/// An arithmetic result as [`number`] keeps it; absent if not finite.
pub(crate) fn rounded(n: f64) -> Option<f64> {
    if !n.is_finite() {
        return None;
    }
    let rounded = (n * 1e9).round() / 1e9;
    Some(if rounded.is_finite() { rounded } else { n })
}

/// A duration from fractional milliseconds: rounded, at least zero.
fn duration(ms: f64) -> Value {
    if ms.is_finite() {
        Value::Duration(ms.max(0.0).round().min(u64::MAX as f64) as u64)
    } else {
        Value::Null
    }
}
