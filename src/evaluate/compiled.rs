//! Terms compiled once per snapshot. The eligibility steps, what the request
//! settles of them, and the sort keys of `order` and `reorder` become trees
//! of small nodes, each made for its kind of term when the snapshot is
//! built, so a request pays for what a term does and not for finding out
//! what it is: a node is one indirect call, with no match over every kind of
//! term and no frame of the whole interpreter. Only what a request computes
//! once stays interpreted: its request-only parts, and a catalog part for a
//! candidate the catalog does not describe.
//!
//! Where a term's structure shows its values are numbers or booleans
//! ([`Shape`]), its node computes with `f64` and `bool` and hands them on
//! through [`Operand::number`] and [`Operand::boolean`], with no value
//! built, matched or dropped on the way.
//!
//! Functions and operators mean the same in both forms: the interpreter's
//! calls, arithmetic and comparisons are written once, over
//! [`Operand`], and the few plain nodes are checked against them (this
//! module's property test). `evaluate_traced` interprets the staged terms
//! themselves, and the property tests and the `request` fuzz target check
//! that it decides as `evaluate` does.

use super::machine::{Focus, Machine, Operand, arithmetic, holds, is_comparison, rounded};
use super::order::{Direction, Plain};
use super::shape::{Shape, Shapes};
use super::{Caller, Endpoint, RequestState};
use crate::compile::{Guard, Snapshot, endpoint_member, kind_member, wire_member};
use crate::language::ast::{Aggregate, BinaryOp};
use crate::language::check::EnumTy;
use crate::language::ir::{Function, OrderPart, Program, Read, SortKeySpec, Term, TermKind, Who};
use crate::value::Value;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

type Node = Box<dyn Operand>;

/// The staged program's per-candidate terms, compiled.
pub struct Compiled {
    /// Per eligibility step, its condition.
    pub steps: Vec<Node>,
    /// Per eligibility step, what the request alone settles of it.
    pub guards: Vec<Guard<Node>>,
    /// Per eligibility step whose guard reads only the caller (tenant,
    /// workspace, key), what it settles for each key of the tenants file.
    settled_by_key: Vec<Option<Box<[Option<bool>]>>>,
    /// Per eligibility step that reads only the catalog and the endpoint
    /// called, its truth for each endpoint (in [`Endpoint::ALL`]'s order)
    /// and catalog row: `rows` answers per endpoint.
    settled_by_endpoint: Vec<Option<Box<[bool]>>>,
    /// Per definition, its body.
    pub lets: Vec<Node>,
    pub order: Order,
    pub reorder: KeyList,
    /// The runs of catalog-only sort keys that the snapshot ranks, in the
    /// order of their rank slots.
    pub rankings: Vec<Ranking>,
}

/// Sort keys as written, and, when two or more catalog-only keys follow one
/// another, the same order with each such run replaced by one key: the
/// run's precomputed rank among all the catalog's routes and credentials.
/// A request compares one number where it would compare the run's values
/// key by key; it sorts by the ranks when every candidate is in the catalog.
pub struct KeyList {
    pub keys: Vec<Key>,
    ranked: Option<RankedKeys>,
}

struct RankedKeys {
    keys: Vec<Key>,
    /// The rankings these keys read.
    rankings: Vec<usize>,
}

impl KeyList {
    /// The keys to sort by: ranked when `in_catalog` (every candidate has
    /// precomputed rows) and a ranking applies.
    pub fn for_candidates(&self, in_catalog: bool) -> &[Key] {
        match &self.ranked {
            Some(ranked) if in_catalog => &ranked.keys,
            _ => &self.keys,
        }
    }
}

/// A run of catalog-only sort keys: their static slots and directions.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    pub slots: Vec<usize>,
    pub directions: Vec<Direction>,
}

/// A sort key, compiled.
pub struct Key {
    code: Node,
    /// What its values can be, so that numbers and booleans are read
    /// plainly.
    shape: Shape,
    pub descending: bool,
    pub nulls_first: bool,
}

impl Key {
    fn of(spec: &SortKeySpec, shapes: &Shapes) -> Key {
        Key {
            code: compile(&spec.term, shapes),
            shape: shapes.of_term(&spec.term),
            descending: spec.descending,
            nulls_first: spec.nulls_first,
        }
    }

    pub fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        self.code.value(machine, focus)
    }

    /// The value read plainly, when the key's shape allows.
    pub fn plain(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<Plain> {
        Some(match self.shape {
            Shape::Absent => Plain::Absent,
            Shape::Number => self
                .code
                .number(machine, focus)
                .map_or(Plain::Absent, Plain::Number),
            Shape::Boolean => self
                .code
                .boolean(machine, focus)
                .map_or(Plain::Absent, Plain::Bool),
            Shape::Any => return None,
        })
    }
}

/// The keys `order` sorts by.
pub enum Order {
    /// The same for every request: no `use sort`.
    Fixed(KeyList),
    /// Some chosen per request.
    Parts(Vec<Part>),
}

pub enum Part {
    By(Key),
    UseSort {
        selector: Term,
        sorts: Vec<(String, KeyList)>,
    },
}

/// The keys a request sorts by.
pub enum Keys<'c> {
    Fixed(&'c [Key]),
    Chosen(Vec<&'c Key>),
}

impl Compiled {
    /// Compiles the staged program, whose catalog-only parts take
    /// `static_slots` slots of the snapshot's static table; the rankings
    /// take the slots after them.
    pub fn of(program: &Program, guards: &[Guard], static_slots: usize) -> Compiled {
        let shapes = &Shapes::of(program);
        let mut rankings = Rankings {
            first_slot: static_slots,
            runs: Vec::new(),
            shapes,
        };
        let fixed = program
            .order
            .iter()
            .all(|part| matches!(part, OrderPart::By(_)));
        let order = if fixed {
            let specs: Vec<SortKeySpec> = program
                .order
                .iter()
                .filter_map(|part| match part {
                    OrderPart::By(spec) => Some(spec.clone()),
                    OrderPart::UseSort { .. } => None,
                })
                .collect();
            Order::Fixed(rankings.key_list(&specs))
        } else {
            Order::Parts(
                program
                    .order
                    .iter()
                    .map(|part| match part {
                        OrderPart::By(spec) => Part::By(Key::of(spec, shapes)),
                        OrderPart::UseSort { selector, sorts } => Part::UseSort {
                            selector: selector.clone(),
                            sorts: sorts
                                .iter()
                                .map(|(name, keys)| (name.clone(), rankings.key_list(keys)))
                                .collect(),
                        },
                    })
                    .collect(),
            )
        };
        Compiled {
            steps: program
                .steps
                .iter()
                .map(|step| compile(&step.condition, shapes))
                .collect(),
            guards: guards
                .iter()
                .map(|guard| guard.map(&mut |term| compile(term, shapes)))
                .collect(),
            settled_by_key: Vec::new(),
            settled_by_endpoint: Vec::new(),
            lets: program
                .lets
                .iter()
                .map(|spec| compile(&spec.term, shapes))
                .collect(),
            order,
            reorder: rankings.key_list(&program.failover.reorder),
            rankings: rankings.runs,
        }
    }

    /// Stops using the rankings the snapshot could not rank (`usable`
    /// false at their index): their keys' values do not order totally.
    pub fn keep_usable_rankings(&mut self, usable: &[bool]) {
        let mut lists: Vec<&mut KeyList> = vec![&mut self.reorder];
        match &mut self.order {
            Order::Fixed(list) => lists.push(list),
            Order::Parts(parts) => {
                for part in parts {
                    if let Part::UseSort { sorts, .. } = part {
                        lists.extend(sorts.iter_mut().map(|(_, list)| list));
                    }
                }
            }
        }
        for list in lists {
            let unusable = list.ranked.as_ref().is_some_and(|ranked| {
                ranked
                    .rankings
                    .iter()
                    .any(|index| !usable.get(*index).copied().unwrap_or(false))
            });
            if unusable {
                list.ranked = None;
            }
        }
    }

    /// Step `step`'s truth when the request alone settles it, the same for
    /// every candidate, as [`Machine::settled`] finds it.
    pub fn settled(&self, step: usize, machine: &mut Machine<'_>) -> Option<bool> {
        if let Some(settled) = self.settled_for_key(step, machine) {
            return settled;
        }
        self.guards
            .get(step)
            .and_then(|guard| machine.settled(guard))
    }

    /// Looked up for the caller's key, when the step has a table and the
    /// caller is the key's own tenant and workspace.
    fn settled_for_key(&self, step: usize, machine: &Machine<'_>) -> Option<Option<bool>> {
        let table = self.settled_by_key.get(step)?.as_deref()?;
        let caller = machine.request.caller;
        let index = caller.key?;
        let key = machine.snapshot.data.tenants.keys.get(index)?;
        if key.tenant != caller.tenant || key.workspace != caller.workspace {
            return None;
        }
        table.get(index).copied()
    }

    /// Settles, once per key, the steps whose guards read only the caller:
    /// a request then looks the answer up instead of asking the guard.
    /// Costs a byte per step and key, bounded by the tenants file.
    pub fn settle_per_key(snapshot: &Snapshot) -> Vec<Option<Box<[Option<bool>]>>> {
        let keys = &snapshot.data.tenants.keys;
        snapshot
            .guards
            .iter()
            .map(|guard| {
                let parts = guard.parts();
                if parts.is_empty() || !parts.into_iter().all(reads_only_caller) {
                    return None;
                }
                let settled = keys
                    .iter()
                    .enumerate()
                    .map(|(index, key)| {
                        let mut request = RequestState::placeholder();
                        request.caller = Caller {
                            tenant: key.tenant,
                            workspace: key.workspace,
                            key: Some(index),
                        };
                        Machine::new(snapshot, &request, &[], &[]).settled(guard)
                    })
                    .collect();
                Some(settled)
            })
            .collect()
    }

    pub fn set_settled_by_key(&mut self, table: Vec<Option<Box<[Option<bool>]>>>) {
        self.settled_by_key = table;
    }

    pub fn set_settled_by_endpoint(&mut self, table: Vec<Option<Box<[bool]>>>) {
        self.settled_by_endpoint = table;
    }

    /// Step `step`'s truth for each catalog row when `endpoint` is called,
    /// if the step reads only the catalog and the endpoint.
    pub fn settled_by_endpoint(
        &self,
        step: usize,
        endpoint: Endpoint,
        rows: usize,
    ) -> Option<&[bool]> {
        let table = self.settled_by_endpoint.get(step)?.as_deref()?;
        let at = Endpoint::ALL.iter().position(|e| *e == endpoint)? * rows;
        table.get(at..at + rows)
    }

    /// The keys `order` applies for this request, as
    /// [`super::order::order_keys`] chooses them.
    /// `in_catalog` as [`KeyList::for_candidates`] takes it.
    pub fn order_keys(&self, machine: &mut Machine<'_>, in_catalog: bool) -> Keys<'_> {
        let parts = match &self.order {
            Order::Fixed(list) => return Keys::Fixed(list.for_candidates(in_catalog)),
            Order::Parts(parts) => parts,
        };
        let mut keys = Vec::with_capacity(parts.len());
        for part in parts {
            match part {
                Part::By(key) => keys.push(key),
                Part::UseSort { selector, sorts } => {
                    let chosen = machine.eval(selector, &Focus::default());
                    let name = chosen.as_str().unwrap_or("");
                    if let Some((_, sort_keys)) =
                        sorts.iter().find(|(sort_name, _)| sort_name == name)
                    {
                        keys.extend(sort_keys.for_candidates(in_catalog));
                    }
                }
            }
        }
        Keys::Chosen(keys)
    }
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled")
            .field("steps", &self.steps.len())
            .field("lets", &self.lets.len())
            .field("reorder", &self.reorder.keys.len())
            .field("rankings", &self.rankings.len())
            .finish_non_exhaustive()
    }
}

/// The rankings found while compiling the sort keys.
struct Rankings<'s> {
    /// The static slot of the first ranking.
    first_slot: usize,
    runs: Vec<Ranking>,
    shapes: &'s Shapes,
}

impl Rankings<'_> {
    /// Compiles sort keys, with a ranked form when they hold a run of two
    /// or more catalog-only keys.
    fn key_list(&mut self, specs: &[SortKeySpec]) -> KeyList {
        let keys = specs
            .iter()
            .map(|spec| Key::of(spec, self.shapes))
            .collect();
        let mut ranked = RankedKeys {
            keys: Vec::new(),
            rankings: Vec::new(),
        };
        let mut rest = specs;
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .take_while(|spec| matches!(spec.term.kind, TermKind::Static(..)))
                .count();
            if run < 2 {
                ranked.keys.push(Key::of(first, self.shapes));
                rest = rest.get(1..).unwrap_or_default();
                continue;
            }
            let (run_specs, after) = rest.split_at(run);
            let ranking = Ranking {
                slots: run_specs
                    .iter()
                    .filter_map(|spec| match spec.term.kind {
                        TermKind::Static(slot, _) => Some(slot),
                        _ => None,
                    })
                    .collect(),
                directions: run_specs
                    .iter()
                    .map(|spec| Direction {
                        descending: spec.descending,
                        nulls_first: spec.nulls_first,
                    })
                    .collect(),
            };
            let index = match self.runs.iter().position(|known| *known == ranking) {
                Some(index) => index,
                None => {
                    self.runs.push(ranking);
                    self.runs.len() - 1
                }
            };
            // Ranks are present for every row in the catalog, and a
            // candidate outside it never sorts by them.
            let absent = Term::new(TermKind::Const(Value::Null), first.term.span);
            ranked.keys.push(Key {
                code: Box::new(Precomputed {
                    slot: self.first_slot + index,
                    inner: absent,
                }),
                // Ranks are numbers.
                shape: Shape::Number,
                descending: false,
                nulls_first: false,
            });
            ranked.rankings.push(index);
            rest = after;
        }
        KeyList {
            keys,
            ranked: (!ranked.rankings.is_empty()).then_some(ranked),
        }
    }
}

/// Whether a term reads nothing but the caller's tenant, workspace and key
/// (and constants): its value is known per key.
fn reads_only_caller(term: &Term) -> bool {
    reads_only(term, &|term| match &term.kind {
        TermKind::Read(read) => Some(matches!(
            read,
            Read::TenantId
                | Read::TenantAttr(_)
                | Read::WorkspaceId
                | Read::WorkspaceAttr(_)
                | Read::KeyId
                | Read::KeyAttr(_)
                | Read::DeploymentAttr(_)
        )),
        _ => None,
    })
}

/// Whether a term reads nothing but the catalog's precomputed parts and the
/// endpoint called (and constants): its value is known per endpoint and
/// catalog row.
pub(crate) fn reads_only_catalog_and_endpoint(term: &Term) -> bool {
    reads_only(term, &|term| match &term.kind {
        TermKind::Read(read) => Some(matches!(
            read,
            Read::RequestKind | Read::RequestWire | Read::RequestEndpoint
        )),
        TermKind::Static(..) => Some(true),
        TermKind::Hoisted(_, inner) => Some(reads_only_catalog_and_endpoint(inner)),
        _ => None,
    })
}

/// Whether a term reads only what `leaf` allows: `leaf` answers for the
/// kinds of term it knows, and the rest are looked through. Definitions,
/// merges and the staged parts may read the request; candidate switches
/// and aggregates read candidates: those are refused unless `leaf` says.
pub(crate) fn reads_only(term: &Term, leaf: &dyn Fn(&Term) -> Option<bool>) -> bool {
    if let Some(answer) = leaf(term) {
        return answer;
    }
    let all = |items: &[Term]| items.iter().all(|item| reads_only(item, leaf));
    match &term.kind {
        TermKind::Const(_) => true,
        TermKind::Not(inner)
        | TermKind::Negate(inner)
        | TermKind::Field(inner, _)
        | TermKind::ToEnum(_, inner) => reads_only(inner, leaf),
        TermKind::Binary(_, lhs, rhs) => reads_only(lhs, leaf) && reads_only(rhs, leaf),
        TermKind::If(condition, then, otherwise) => {
            reads_only(condition, leaf) && reads_only(then, leaf) && reads_only(otherwise, leaf)
        }
        // `backoff` reads the execution's retries and jitter.
        TermKind::Call(function, args) => *function != Function::Backoff && all(args),
        TermKind::List(items) => all(items),
        TermKind::Record(fields) => fields.iter().all(|(_, item)| reads_only(item, leaf)),
        TermKind::Read(_)
        | TermKind::Let(_)
        | TermKind::Merge(_)
        | TermKind::Static(..)
        | TermKind::Hoisted(..)
        | TermKind::Grouped(..)
        | TermKind::At(..)
        | TermKind::Aggregate(..) => false,
    }
}

/// A term's compiled form. Where the operands' shapes show an operator's
/// operands are numbers or booleans, its node computes with them plainly
/// ([`Shape`]).
fn compile(term: &Term, shapes: &Shapes) -> Node {
    let compile = |term: &Term| compile(term, shapes);
    match &term.kind {
        TermKind::Const(value) => Box::new(Constant(value.clone())),
        TermKind::Static(slot, inner) => Box::new(Precomputed {
            slot: *slot,
            inner: (**inner).clone(),
        }),
        TermKind::Hoisted(slot, inner) => Box::new(Hoisted {
            slot: *slot,
            inner: (**inner).clone(),
        }),
        TermKind::Let(index) => Box::new(Definition(*index)),
        TermKind::Read(Read::CredentialOwned) => Box::new(CredentialOwned),
        TermKind::Read(read) if read.is_candidate() => Box::new(CandidateRead(read.clone())),
        TermKind::Read(Read::RequestKind) => Box::new(RequestMember(|request| {
            kind_member(request.endpoint.kind())
        })),
        TermKind::Read(Read::RequestWire) => Box::new(RequestMember(|request| {
            wire_member(request.endpoint.wire())
        })),
        TermKind::Read(Read::RequestEndpoint) => {
            Box::new(RequestMember(|request| endpoint_member(request.endpoint)))
        }
        TermKind::Read(read) => Box::new(RequestRead(read.clone())),
        TermKind::Not(inner) => Box::new(Not(compile(inner))),
        TermKind::Binary(op, lhs_term, rhs_term) => {
            let (lhs, rhs) = (compile(lhs_term), compile(rhs_term));
            let shape = |term: &Term| shapes.of_term(term);
            let both = |test: fn(Shape) -> bool| test(shape(lhs_term)) && test(shape(rhs_term));
            // Comparisons but membership, whose right side is a list.
            let ordering = is_comparison(*op) && !matches!(op, BinaryOp::In | BinaryOp::NotIn);
            let plain = if both(Shape::numeric) {
                Some(Shape::Number)
            } else if both(Shape::boolean) {
                Some(Shape::Boolean)
            } else {
                None
            };
            match op {
                BinaryOp::And => Box::new(And(lhs, rhs)),
                BinaryOp::Or => Box::new(Or(lhs, rhs)),
                BinaryOp::Implies => Box::new(Implies(lhs, rhs)),
                op if let Some(operands) = plain.filter(|_| ordering) => Box::new(ComparePlain {
                    op: *op,
                    operands,
                    lhs,
                    rhs,
                }),
                op if is_comparison(*op) => Box::new(Compare { op: *op, lhs, rhs }),
                op if both(Shape::numeric) => Box::new(NumberArithmetic { op: *op, lhs, rhs }),
                op => Box::new(Arithmetic { op: *op, lhs, rhs }),
            }
        }
        TermKind::If(condition, then, otherwise) => Box::new(If {
            condition: compile(condition),
            then: compile(then),
            otherwise: compile(otherwise),
        }),
        TermKind::Call(function @ (Function::Coalesce | Function::Min | Function::Max), args)
            if args.iter().all(|arg| shapes.of_term(arg).numeric()) =>
        {
            Box::new(NumberCall {
                function: *function,
                args: args.iter().map(compile).collect(),
            })
        }
        TermKind::Call(function, args) => Box::new(Call {
            function: *function,
            args: args.iter().map(compile).collect(),
        }),
        TermKind::Field(base, name) => Box::new(Field {
            base: compile(base),
            name: name.clone(),
        }),
        TermKind::At(who, inner) => Box::new(At {
            who: *who,
            inner: compile(inner),
        }),
        TermKind::Grouped(slot, by, aggregate) => Box::new(Grouped {
            slot: *slot,
            by: by.iter().map(compile).collect(),
            aggregate: compile(aggregate),
        }),
        TermKind::Aggregate(function, value, filter) => Box::new(AggregateOf {
            function: *function,
            value: compile(value),
            filter: filter.as_deref().map(compile),
        }),
        TermKind::Merge(index) => Box::new(Merge(*index)),
        TermKind::Negate(inner) => Box::new(Negate(compile(inner))),
        TermKind::List(items) => Box::new(List(items.iter().map(compile).collect())),
        TermKind::Record(fields) => Box::new(Record(
            fields
                .iter()
                .map(|(name, item)| (name.clone(), compile(item)))
                .collect(),
        )),
        TermKind::ToEnum(target, inner) => Box::new(ToEnum {
            target: target.clone(),
            inner: compile(inner),
        }),
    }
}

struct Constant(Value);

impl Operand for Constant {
    fn value<'t, 'a: 't>(&'t self, _: &mut Machine<'a>, _: &Focus) -> Cow<'t, Value> {
        Cow::Borrowed(&self.0)
    }

    fn truth(&self, _: &mut Machine<'_>, _: &Focus) -> bool {
        matches!(self.0, Value::Bool(true))
    }

    fn boolean(&self, _: &mut Machine<'_>, _: &Focus) -> Option<bool> {
        match self.0 {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    fn number(&self, _: &mut Machine<'_>, _: &Focus) -> Option<f64> {
        self.0.as_number()
    }
}

/// A catalog-only part, read from the snapshot's table; evaluated for a
/// candidate the catalog does not describe.
struct Precomputed {
    slot: usize,
    inner: Term,
}

impl Operand for Precomputed {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        match machine.precomputed(self.slot, focus) {
            Some(value) => Cow::Borrowed(value),
            None => machine.eval_ref(&self.inner, focus),
        }
    }

    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        match machine.precomputed(self.slot, focus) {
            Some(value) => value.as_number(),
            None => machine.eval_ref(&self.inner, focus).as_number(),
        }
    }
}

/// A request-only part, computed on its first use in the request.
struct Hoisted {
    slot: usize,
    inner: Term,
}

impl Operand for Hoisted {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, _: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.hoisted(self.slot, &self.inner))
    }
}

/// A definition, its body compiled too.
struct Definition(usize);

impl Operand for Definition {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.definition(self.0, focus, true))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        machine.definition_read(self.0, focus, |value| matches!(value, Value::Bool(true)))
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        machine.definition_read(self.0, focus, |value| match value {
            Value::Bool(b) => Some(*b),
            _ => None,
        })
    }

    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        machine.definition_read(self.0, focus, Value::as_number)
    }
}

/// A read of the focused candidate.
struct CandidateRead(Read);

impl Operand for CandidateRead {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        match focus.current {
            Some(candidate) => machine.read_candidate(&self.0, candidate),
            None => machine.read_unfocused(&self.0),
        }
    }
}

/// `credential.owned`: a step, a sort key or a definition may read it per
/// candidate, so its truth is found without [`Machine::read_candidate`]'s
/// match over every read and without building a value.
struct CredentialOwned;

impl CredentialOwned {
    /// Absent without a candidate in focus, as [`Machine::read_candidate`]
    /// reads it.
    fn of(machine: &Machine<'_>, focus: &Focus) -> Option<bool> {
        let candidate = machine.candidates.get(focus.current?)?;
        Some(
            machine
                .snapshot
                .interned
                .credential_owner
                .get(candidate.provider)
                .and_then(|owners| owners.get(candidate.credential))
                .is_some_and(|owner| owner.is(machine.request.caller.tenant)),
        )
    }
}

impl Operand for CredentialOwned {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(CredentialOwned::of(machine, focus).map_or(Value::Null, Value::Bool))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        CredentialOwned::of(machine, focus).unwrap_or(false)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        CredentialOwned::of(machine, focus)
    }
}

/// The request's endpoint, wire format or kind: read per candidate where a
/// condition compares a candidate's with it, so the member is borrowed
/// directly rather than through [`Machine::read`]'s match over every read.
struct RequestMember(fn(&RequestState) -> &'static Value);

impl Operand for RequestMember {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, _: &Focus) -> Cow<'t, Value> {
        Cow::Borrowed((self.0)(machine.request))
    }
}

/// Any other read: the request, the caller, the state of the execution.
struct RequestRead(Read);

impl Operand for RequestRead {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        machine.read(&self.0, focus)
    }
}

struct Not(Node);

impl Operand for Not {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(match *self.0.value(machine, focus) {
            Value::Bool(b) => Value::Bool(!b),
            _ => Value::Null,
        })
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        self.0.boolean(machine, focus) == Some(false)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        self.0.boolean(machine, focus).map(|b| !b)
    }
}

struct And(Node, Node);

impl Operand for And {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(Value::Bool(self.truth(machine, focus)))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        self.0.truth(machine, focus) && self.1.truth(machine, focus)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        Some(self.truth(machine, focus))
    }
}

struct Or(Node, Node);

impl Operand for Or {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(Value::Bool(self.truth(machine, focus)))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        self.0.truth(machine, focus) || self.1.truth(machine, focus)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        Some(self.truth(machine, focus))
    }
}

struct Implies(Node, Node);

impl Operand for Implies {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(Value::Bool(self.truth(machine, focus)))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        !self.0.truth(machine, focus) || self.1.truth(machine, focus)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        Some(self.truth(machine, focus))
    }
}

struct Compare {
    op: BinaryOp,
    lhs: Node,
    rhs: Node,
}

impl Operand for Compare {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(Value::Bool(self.truth(machine, focus)))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        let a = self.lhs.value(machine, focus);
        let b = self.rhs.value(machine, focus);
        holds(self.op, &a, &b)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        Some(self.truth(machine, focus))
    }
}

struct Arithmetic {
    op: BinaryOp,
    lhs: Node,
    rhs: Node,
}

impl Operand for Arithmetic {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        let a = self.lhs.value(machine, focus);
        let b = self.rhs.value(machine, focus);
        Cow::Owned(arithmetic(self.op, &a, &b))
    }
}

/// A comparison of two numbers or two booleans (either maybe absent), as
/// `operands` says: `==` and `!=` as for any values, the orderings only
/// between two present ones.
struct ComparePlain {
    op: BinaryOp,
    operands: Shape,
    lhs: Node,
    rhs: Node,
}

impl Operand for ComparePlain {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(Value::Bool(self.truth(machine, focus)))
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        if self.operands == Shape::Boolean {
            let a = self.lhs.boolean(machine, focus);
            let b = self.rhs.boolean(machine, focus);
            return ordered(self.op, a, b, |a, b| Some(a.cmp(b)));
        }
        let a = self.lhs.number(machine, focus);
        let b = self.rhs.number(machine, focus);
        ordered(self.op, a, b, |a, b| a.partial_cmp(b))
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        Some(self.truth(machine, focus))
    }
}

/// Whether `op` holds between two values of one plain type, as [`holds`]
/// decides it for the values: absent equals only absent, and orders
/// nothing.
fn ordered<T: PartialEq>(
    op: BinaryOp,
    a: Option<T>,
    b: Option<T>,
    compare: impl Fn(&T, &T) -> Option<Ordering>,
) -> bool {
    let ordering = || match (&a, &b) {
        (Some(a), Some(b)) => compare(a, b),
        _ => None,
    };
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => ordering() == Some(Ordering::Less),
        BinaryOp::Le => matches!(ordering(), Some(Ordering::Less | Ordering::Equal)),
        BinaryOp::Gt => ordering() == Some(Ordering::Greater),
        BinaryOp::Ge => matches!(ordering(), Some(Ordering::Greater | Ordering::Equal)),
        _ => false,
    }
}

/// Arithmetic on two numbers (or absent values), as [`arithmetic`] does it.
struct NumberArithmetic {
    op: BinaryOp,
    lhs: Node,
    rhs: Node,
}

impl Operand for NumberArithmetic {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(
            self.number(machine, focus)
                .map_or(Value::Null, Value::Number),
        )
    }

    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        let a = self.lhs.number(machine, focus)?;
        let b = self.rhs.number(machine, focus)?;
        rounded(match self.op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div if b != 0.0 => a / b,
            _ => return None,
        })
    }
}

struct If {
    condition: Node,
    then: Node,
    otherwise: Node,
}

impl If {
    fn branch(&self, machine: &mut Machine<'_>, focus: &Focus) -> &Node {
        if self.condition.truth(machine, focus) {
            &self.then
        } else {
            &self.otherwise
        }
    }
}

impl Operand for If {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        self.branch(machine, focus).value(machine, focus)
    }

    fn truth(&self, machine: &mut Machine<'_>, focus: &Focus) -> bool {
        self.branch(machine, focus).truth(machine, focus)
    }

    fn boolean(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<bool> {
        self.branch(machine, focus).boolean(machine, focus)
    }

    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        self.branch(machine, focus).number(machine, focus)
    }
}

struct Call {
    function: Function,
    args: Vec<Node>,
}

impl Operand for Call {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        machine.call(self.function, &self.args, focus)
    }
}

/// `coalesce`, `min` or `max` of numbers (or absent values), as
/// [`Machine::call`] computes them.
struct NumberCall {
    function: Function,
    args: Vec<Node>,
}

impl Operand for NumberCall {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(
            self.number(machine, focus)
                .map_or(Value::Null, Value::Number),
        )
    }

    fn number(&self, machine: &mut Machine<'_>, focus: &Focus) -> Option<f64> {
        let want = match self.function {
            Function::Min => Ordering::Less,
            Function::Max => Ordering::Greater,
            // `coalesce` stops at the first present value.
            _ => return self.args.iter().find_map(|arg| arg.number(machine, focus)),
        };
        let mut best: Option<f64> = None;
        for arg in &self.args {
            if let Some(n) = arg.number(machine, focus)
                && best.is_none_or(|best| n.partial_cmp(&best) == Some(want))
            {
                best = Some(n);
            }
        }
        best
    }
}

struct Field {
    base: Node,
    name: Arc<str>,
}

impl Operand for Field {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        match self.base.value(machine, focus) {
            Cow::Borrowed(value) => Cow::Borrowed(value.field(&self.name)),
            Cow::Owned(value) => Cow::Owned(value.field(&self.name).clone()),
        }
    }
}

/// A read of another candidate than the focused one.
struct At {
    who: Who,
    inner: Node,
}

impl Operand for At {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.at(self.who, &self.inner, focus))
    }
}

/// An aggregate computed once per group of candidates (see
/// [`TermKind::Grouped`]).
struct Grouped {
    slot: usize,
    by: Vec<Node>,
    aggregate: Node,
}

impl Operand for Grouped {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.grouped(self.slot, &self.by, &self.aggregate, focus))
    }
}

struct AggregateOf {
    function: Aggregate,
    value: Node,
    filter: Option<Node>,
}

impl Operand for AggregateOf {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.aggregate(self.function, &self.value, self.filter.as_ref(), focus))
    }
}

/// A merge's value: the request's own once its merges are known.
struct Merge(usize);

impl Operand for Merge {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, _: &Focus) -> Cow<'t, Value> {
        let request: &'a RequestState = machine.request;
        match request.merges.get(self.0) {
            Some(value) => Cow::Borrowed(value),
            None => Cow::Owned(machine.merge(self.0)),
        }
    }
}

struct Negate(Node);

impl Operand for Negate {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.negate(&self.0, focus))
    }
}

struct List(Vec<Node>);

impl Operand for List {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.list(&self.0, focus))
    }
}

struct Record(Vec<(Arc<str>, Node)>);

impl Operand for Record {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.record(&self.0, focus))
    }
}

struct ToEnum {
    target: Arc<EnumTy>,
    inner: Node,
}

impl Operand for ToEnum {
    fn value<'t, 'a: 't>(&'t self, machine: &mut Machine<'a>, focus: &Focus) -> Cow<'t, Value> {
        Cow::Owned(machine.enum_member(&self.target, &self.inner, focus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{AllSecrets, compile_file};
    use crate::evaluate::Candidate;
    use crate::language::ir::PriceField;
    use crate::source::Span;
    use proptest::prelude::*;

    fn constant(value: Value) -> Term {
        Term::constant(value, Span::default())
    }

    fn leaf() -> impl Strategy<Value = Term> {
        let constants = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-4i32..5).prop_map(|n| Value::Number(f64::from(n) / 2.0)),
            Just(Value::Number(1e300)),
            Just(Value::Number(f64::NAN)),
            Just(Value::Duration(1500)),
            Just(Value::string("x")),
        ]
        .prop_map(constant);
        // Reads of the focused candidate (prices may be absent), and the
        // Noirdoc policy's definitions (`own`, `priced`, `weighted_price`).
        let reads = proptest::sample::select(vec![
            TermKind::Read(Read::RoutePrice(PriceField::Input)),
            TermKind::Read(Read::RoutePrice(PriceField::CacheRead)),
            TermKind::Read(Read::ProviderPriority),
            TermKind::Read(Read::CredentialOwned),
            TermKind::Read(Read::HealthPenalized),
            TermKind::Read(Read::StatsSuccessRate),
            TermKind::Read(Read::StatsTtft),
            TermKind::Let(0),
            TermKind::Let(1),
            TermKind::Let(2),
        ])
        .prop_map(|kind| Term::new(kind, Span::default()));
        prop_oneof![3 => constants, 1 => reads]
    }

    fn operator() -> impl Strategy<Value = BinaryOp> {
        proptest::sample::select(vec![
            BinaryOp::And,
            BinaryOp::Or,
            BinaryOp::Implies,
            BinaryOp::Eq,
            BinaryOp::Ne,
            BinaryOp::Lt,
            BinaryOp::Le,
            BinaryOp::Gt,
            BinaryOp::Ge,
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
        ])
    }

    fn function() -> impl Strategy<Value = Function> {
        proptest::sample::select(vec![
            Function::Coalesce,
            Function::Min,
            Function::Max,
            Function::Clamp,
            Function::Present,
        ])
    }

    /// Terms over numbers, booleans and absent values, with a few values of
    /// other types mixed in, so nodes of every shape meet each other.
    fn term() -> impl Strategy<Value = Term> {
        let node = |kind| Term::new(kind, Span::default());
        leaf().prop_recursive(5, 48, 3, move |inner| {
            prop_oneof![
                (operator(), inner.clone(), inner.clone()).prop_map(move |(op, a, b)| node(
                    TermKind::Binary(op, Box::new(a), Box::new(b))
                )),
                (inner.clone(), inner.clone(), inner.clone()).prop_map(move |(c, t, e)| node(
                    TermKind::If(Box::new(c), Box::new(t), Box::new(e))
                )),
                inner
                    .clone()
                    .prop_map(move |a| node(TermKind::Not(Box::new(a)))),
                inner
                    .clone()
                    .prop_map(move |a| node(TermKind::Negate(Box::new(a)))),
                (function(), proptest::collection::vec(inner, 1..4))
                    .prop_map(move |(function, args)| node(TermKind::Call(function, args))),
            ]
        })
    }

    static SNAPSHOT: std::sync::LazyLock<Snapshot> = std::sync::LazyLock::new(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/noirdoc.policy");
        compile_file(&path, &AllSecrets).expect("noirdoc compiles")
    });

    /// Every route of the catalog's first model with its first credential,
    /// each with its row of precomputed parts.
    fn candidates(snapshot: &Snapshot) -> Vec<Candidate> {
        let routes = &snapshot.data.catalog.models[0].routes;
        routes
            .iter()
            .enumerate()
            .map(|(index, route)| Candidate {
                static_row: snapshot
                    .statics
                    .row(Some(0), Some(index), 0)
                    .map(|first| snapshot.statics.credential_row(first, 0)),
                ..Candidate::of_route(0, index, route, 0)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn compiled_terms_mean_what_the_interpreter_does(
            term in term(),
            on in proptest::option::of(0usize..8),
        ) {
            let snapshot = &*SNAPSHOT;
            let candidates = candidates(snapshot);
            let request = RequestState::placeholder();
            let mut machine = Machine::new(snapshot, &request, &candidates, &[]);
            let focus = Focus {
                current: on.map(|on| on % candidates.len()),
                ..Focus::default()
            };
            let node = compile(&term, &Shapes::of(&snapshot.program));
            let expected = machine.eval(&term, &focus);
            // NaN is unequal to itself: values compare as written out.
            let got = node.value(&mut machine, &focus);
            prop_assert_eq!(format!("{got:?}"), format!("{expected:?}"));
            prop_assert_eq!(
                node.number(&mut machine, &focus).map(f64::to_bits),
                expected.as_number().map(f64::to_bits)
            );
            let boolean = match expected {
                Value::Bool(b) => Some(b),
                _ => None,
            };
            prop_assert_eq!(node.boolean(&mut machine, &focus), boolean);
            prop_assert_eq!(node.truth(&mut machine, &focus), boolean == Some(true));
        }
    }
}
