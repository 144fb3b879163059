//! Staging: splits the terms evaluated per candidate by what they depend on.
//!
//! A part that reads only the catalog (a provider's attributes, a route's
//! price, a model's kind …) has one value per route and credential: it is
//! computed once per snapshot and looked up per candidate. A part that reads
//! only the request (the key, the tenant, inputs, merges …) has one value per
//! request: it is computed the first time a candidate needs it. What is left
//! — health, the candidate set, failover state, and terms that mix a
//! candidate with the caller — is interpreted per candidate as before.

use crate::language::ast::BinaryOp;
use crate::language::ir::{LetSpec, OrderPart, Program, Read, SortKeySpec, Term, TermKind, Who};

/// What a term's value depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Deps {
    request: bool,
    catalog: bool,
    /// Health, the candidate set, other candidates, execution state.
    live: bool,
}

impl Deps {
    const NONE: Deps = Deps {
        request: false,
        catalog: false,
        live: false,
    };
    const REQUEST: Deps = Deps {
        request: true,
        catalog: false,
        live: false,
    };
    const CATALOG: Deps = Deps {
        request: false,
        catalog: true,
        live: false,
    };
    const LIVE: Deps = Deps {
        request: false,
        catalog: false,
        live: true,
    };

    fn union(self, other: Deps) -> Deps {
        Deps {
            request: self.request || other.request,
            catalog: self.catalog || other.catalog,
            live: self.live || other.live,
        }
    }

    fn only_catalog(self) -> bool {
        self.catalog && !self.request && !self.live
    }

    fn only_request(self) -> bool {
        self.request && !self.catalog && !self.live
    }
}

fn read_deps(read: &Read, one_requested_id: bool) -> Deps {
    use Read::*;
    match read {
        // One requested id: every candidate shares how it resolved.
        RequestedKind | RequestedId if one_requested_id => Deps::REQUEST,
        ModelId | ModelKind | ModelAliases | ModelAttr(_) | ProviderId | ProviderName
        | ProviderAliases | ProviderFormat | ProviderEndpoints | ProviderPriority
        | ProviderListed | ProviderAttr(_) | RoutePrice(_) | RouteCapabilities | RouteAttr(_)
        | CredentialId | CredentialAttr(_) => Deps::CATALOG,
        DeploymentAttr(_) => Deps::NONE,
        RequestId
        | RequestModel
        | RequestPinned
        | RequestEndpoint
        | RequestWire
        | RequestKind
        | RequestStream
        | RequestParameters
        | RequestEstimatedTokens
        | Input(..)
        | TenantId
        | TenantAttr(_)
        | WorkspaceId
        | WorkspaceAttr(_)
        | KeyId
        | KeyAttr(_)
        | Setting(_) => Deps::REQUEST,
        // Ownership depends on the caller; the upstream name and the
        // requested id on how the request resolved.
        CredentialOwned | RouteUpstreamModel | RequestedIndex | RequestedKind | RequestedId => {
            Deps::REQUEST.union(Deps::CATALOG)
        }
        _ => Deps::LIVE,
    }
}

/// What the request alone settles of an eligibility condition: its
/// connectives over the parts that read only the request. When those decide
/// the condition, it is the same for every candidate and is not asked per
/// candidate. (`T` is what a request part is: a term, or the evaluator's
/// compiled form of it.)
#[derive(Debug, Clone, PartialEq)]
pub enum Guard<T = Term> {
    /// Depends on the candidate.
    Open,
    /// Reads only the request: its truth holds for every candidate.
    Request(T),
    And(Box<Guard<T>>, Box<Guard<T>>),
    Or(Box<Guard<T>>, Box<Guard<T>>),
    Implies(Box<Guard<T>>, Box<Guard<T>>),
}

impl<T> Guard<T> {
    /// Its request parts, left to right.
    pub fn parts(&self) -> Vec<&T> {
        match self {
            Guard::Open => Vec::new(),
            Guard::Request(part) => vec![part],
            Guard::And(lhs, rhs) | Guard::Or(lhs, rhs) | Guard::Implies(lhs, rhs) => {
                let mut parts = lhs.parts();
                parts.extend(rhs.parts());
                parts
            }
        }
    }

    /// The same guard with each request part mapped.
    pub fn map<U>(&self, part: &mut impl FnMut(&T) -> U) -> Guard<U> {
        match self {
            Guard::Open => Guard::Open,
            Guard::Request(term) => Guard::Request(part(term)),
            Guard::And(lhs, rhs) => Guard::And(Box::new(lhs.map(part)), Box::new(rhs.map(part))),
            Guard::Or(lhs, rhs) => Guard::Or(Box::new(lhs.map(part)), Box::new(rhs.map(part))),
            Guard::Implies(lhs, rhs) => {
                Guard::Implies(Box::new(lhs.map(part)), Box::new(rhs.map(part)))
            }
        }
    }
}

/// The staged program and what the snapshot must precompute for it.
pub struct Staged {
    pub program: Program,
    /// Per eligibility step, what the request alone settles of it.
    pub guards: Vec<Guard>,
    /// Per eligibility step, whether its condition is the same for every
    /// candidate of a set (it reads the set only through aggregates), so it
    /// is asked once per set.
    pub once_per_set: Vec<bool>,
    /// Catalog-only terms, by slot: evaluated for every route and credential.
    pub statics: Vec<Term>,
    /// How many request-only slots a request may fill.
    pub hoisted: usize,
}

struct Stager<'p> {
    /// The definitions as checked, for what each depends on.
    lets: &'p [LetSpec],
    /// [`crate::language::ir::ModelsSpec::requests_one_id`].
    one_requested_id: bool,
    let_deps: Vec<Option<Deps>>,
    /// Per definition, whether it reads the candidate it is asked for;
    /// `None` until looked at.
    let_focus: Vec<Option<bool>>,
    statics: Vec<Term>,
    hoisted: Vec<Term>,
    grouped: Vec<Term>,
}

/// Stages the terms evaluated per candidate: candidate definitions,
/// eligibility steps, sort keys and the constraints between attempts.
pub fn stage(original: &Program) -> Staged {
    let mut stager = Stager {
        lets: &original.lets,
        one_requested_id: original.models.requests_one_id(),
        let_deps: vec![None; original.lets.len()],
        let_focus: vec![None; original.lets.len()],
        statics: Vec::new(),
        hoisted: Vec::new(),
        grouped: Vec::new(),
    };
    let mut program = original.clone();
    for (index, spec) in program.lets.iter_mut().enumerate() {
        // A definition that reads the candidate only for what every
        // candidate shares (`requested.kind` when one id is requested) is
        // worked out once per request.
        let deps = stager.let_deps(index);
        if spec.candidate && !deps.catalog && !deps.live {
            spec.candidate = false;
        }
        if spec.candidate {
            spec.term = stager.stage(&spec.term);
        }
    }
    for step in &mut program.steps {
        step.condition = stager.stage(&step.condition);
    }
    for part in &mut program.order {
        match part {
            OrderPart::By(key) => stager.stage_key(key),
            OrderPart::UseSort { sorts, .. } => {
                for (_, keys) in sorts {
                    keys.iter_mut().for_each(|key| stager.stage_key(key));
                }
            }
        }
    }
    for key in &mut program.failover.reorder {
        stager.stage_key(key);
    }
    for keep in &mut program.failover.keep {
        *keep = stager.stage(keep);
    }
    let guards = program
        .steps
        .iter()
        .map(|step| {
            let mut budget = GUARD_TERMS;
            stager.guard(&step.condition, &program.lets, 0, &mut budget)
        })
        .collect();
    let once_per_set = program
        .steps
        .iter()
        .map(|step| !stager.reads_focus(&step.condition))
        .collect();
    Staged {
        program,
        guards,
        once_per_set,
        statics: stager.statics,
        hoisted: stager.hoisted.len(),
    }
}

/// A step's guard looks at no more terms than this. Definitions that use
/// one another more than once would otherwise make it as large as the
/// terms they stand for, written out: 2^40 for a chain of 40 that each use
/// the one before twice. Where the budget ends the guard is open, which is
/// always right: a request then settles less of the step, and its
/// candidates are asked.
const GUARD_TERMS: usize = 4096;

impl Stager<'_> {
    /// What the request settles of `term`, looking through definitions
    /// (`depth` of them so far) into their staged bodies in `lets`, at no
    /// more than `budget` terms.
    fn guard(&mut self, term: &Term, lets: &[LetSpec], depth: usize, budget: &mut usize) -> Guard {
        let Some(left) = budget.checked_sub(1) else {
            return Guard::Open;
        };
        *budget = left;
        let deps = self.deps(term);
        if !deps.catalog && !deps.live {
            // Settling asks a request part once per request, so it asks the
            // part itself, not through the slot the staged step caches it
            // in: when the step is settled nothing reads that slot again,
            // and storing into it cost a clone and, for many requests, the
            // machine's whole cache. (A step not settled fills the slot on
            // its first candidate, as before.)
            return Guard::Request(match &term.kind {
                TermKind::Hoisted(_, inner) => (**inner).clone(),
                _ => term.clone(),
            });
        }
        let (op, lhs, rhs) = match &term.kind {
            TermKind::Binary(op, lhs, rhs) => (op, lhs, rhs),
            // A definition is true exactly when its body is: a step that
            // reads one is settled as the body would be. More definitions
            // deep than there are means a cycle, which the checker refuses.
            TermKind::Let(index) => {
                return match lets.get(*index) {
                    Some(spec) if depth < lets.len() => {
                        self.guard(&spec.term, lets, depth + 1, budget)
                    }
                    _ => Guard::Open,
                };
            }
            _ => return Guard::Open,
        };
        let connective = match op {
            BinaryOp::And => Guard::And,
            BinaryOp::Or => Guard::Or,
            BinaryOp::Implies => Guard::Implies,
            _ => return Guard::Open,
        };
        match (
            self.guard(lhs, lets, depth, budget),
            self.guard(rhs, lets, depth, budget),
        ) {
            (Guard::Open, Guard::Open) => Guard::Open,
            (lhs, rhs) => connective(Box::new(lhs), Box::new(rhs)),
        }
    }

    fn stage_key(&mut self, key: &mut SortKeySpec) {
        key.term = self.stage(&key.term);
    }

    fn deps(&mut self, term: &Term) -> Deps {
        match &term.kind {
            TermKind::Const(_) => Deps::NONE,
            TermKind::Read(read) => read_deps(read, self.one_requested_id),
            TermKind::At(..) | TermKind::Aggregate(..) | TermKind::Grouped(..) => Deps::LIVE,
            TermKind::Static(..) => Deps::CATALOG,
            TermKind::Hoisted(..) | TermKind::Merge(_) => Deps::REQUEST,
            TermKind::Let(index) => self.let_deps(*index),
            TermKind::Not(inner)
            | TermKind::Negate(inner)
            | TermKind::Field(inner, _)
            | TermKind::ToEnum(_, inner) => self.deps(inner),
            TermKind::Binary(_, lhs, rhs) => self.deps(lhs).union(self.deps(rhs)),
            TermKind::If(condition, then, otherwise) => self
                .deps(condition)
                .union(self.deps(then))
                .union(self.deps(otherwise)),
            TermKind::Call(_, items) | TermKind::List(items) => items
                .iter()
                .fold(Deps::NONE, |deps, item| deps.union(self.deps(item))),
            TermKind::Record(fields) => fields
                .iter()
                .fold(Deps::NONE, |deps, (_, item)| deps.union(self.deps(item))),
        }
    }

    /// Whether `term` may differ between the candidates it is asked for: it
    /// reads the candidate outside aggregates, or an aggregate reads it as
    /// `self`. Definitions are looked at once each, as checked.
    fn reads_focus(&mut self, term: &Term) -> bool {
        match &term.kind {
            TermKind::Const(_) | TermKind::Hoisted(..) | TermKind::Merge(_) => false,
            TermKind::Read(read) => {
                let deps = read_deps(read, self.one_requested_id);
                deps.catalog || deps.live
            }
            TermKind::Static(..) | TermKind::At(..) => true,
            TermKind::Grouped(_, scored, _) => !scored.is_empty(),
            TermKind::Aggregate(_, value, filter) => {
                let mut scored = Vec::new();
                let reads_only_scored_terms = scored_reads(value, &mut scored)
                    && filter
                        .as_deref()
                        .is_none_or(|filter| scored_reads(filter, &mut scored));
                !reads_only_scored_terms || !scored.is_empty()
            }
            TermKind::Let(index) => self.let_reads_focus(*index),
            TermKind::Not(inner)
            | TermKind::Negate(inner)
            | TermKind::Field(inner, _)
            | TermKind::ToEnum(_, inner) => self.reads_focus(inner),
            TermKind::Binary(_, lhs, rhs) => self.reads_focus(lhs) || self.reads_focus(rhs),
            TermKind::If(condition, then, otherwise) => {
                self.reads_focus(condition) || self.reads_focus(then) || self.reads_focus(otherwise)
            }
            TermKind::Call(_, items) | TermKind::List(items) => {
                items.iter().any(|item| self.reads_focus(item))
            }
            TermKind::Record(fields) => fields.iter().any(|(_, item)| self.reads_focus(item)),
        }
    }

    fn let_reads_focus(&mut self, index: usize) -> bool {
        self.per_definition(
            index,
            true,
            |stager| &mut stager.let_focus,
            Self::reads_focus,
        )
    }

    fn let_deps(&mut self, index: usize) -> Deps {
        self.per_definition(index, Deps::LIVE, |stager| &mut stager.let_deps, Self::deps)
    }

    /// A fact about definition `index`, worked out once from its body by
    /// `walk` and kept in the memo `memo` picks. While the body is looked at
    /// the fact reads `cautious`, so a cycle (which the checker refuses)
    /// stays cautious; so does a definition that does not exist.
    fn per_definition<T: Copy>(
        &mut self,
        index: usize,
        cautious: T,
        memo: fn(&mut Self) -> &mut Vec<Option<T>>,
        walk: fn(&mut Self, &Term) -> T,
    ) -> T {
        match memo(self).get(index) {
            Some(Some(known)) => return *known,
            Some(None) => {}
            None => return cautious,
        }
        if let Some(slot) = memo(self).get_mut(index) {
            *slot = Some(cautious);
        }
        let lets = self.lets;
        let fact = stacker::maybe_grow(
            crate::language::check::STACK_RED_ZONE,
            crate::language::check::STACK_SEGMENT,
            || {
                lets.get(index)
                    .map_or(cautious, |spec| walk(self, &spec.term))
            },
        );
        if let Some(slot) = memo(self).get_mut(index) {
            *slot = Some(fact);
        }
        fact
    }

    fn stage(&mut self, term: &Term) -> Term {
        let deps = self.deps(term);
        if deps.only_catalog() && !matches!(term.kind, TermKind::Const(_)) {
            let slot = slot_of(&mut self.statics, term);
            return Term::new(TermKind::Static(slot, Box::new(term.clone())), term.span);
        }
        // Reads, definitions and merges are already cheap or cached.
        let worth_hoisting = !matches!(
            term.kind,
            TermKind::Const(_) | TermKind::Read(_) | TermKind::Let(_) | TermKind::Merge(_)
        );
        if deps.only_request() && worth_hoisting {
            let slot = slot_of(&mut self.hoisted, term);
            return Term::new(TermKind::Hoisted(slot, Box::new(term.clone())), term.span);
        }
        let mut boxed = |inner: &Term| Box::new(self.stage(inner));
        let kind = match &term.kind {
            TermKind::Not(inner) => TermKind::Not(boxed(inner)),
            TermKind::Negate(inner) => TermKind::Negate(boxed(inner)),
            TermKind::Field(inner, name) => TermKind::Field(boxed(inner), name.clone()),
            TermKind::ToEnum(target, inner) => TermKind::ToEnum(target.clone(), boxed(inner)),
            TermKind::Binary(op, lhs, rhs) => TermKind::Binary(*op, boxed(lhs), boxed(rhs)),
            TermKind::If(condition, then, otherwise) => {
                TermKind::If(boxed(condition), boxed(then), boxed(otherwise))
            }
            TermKind::Call(function, args) => {
                TermKind::Call(*function, args.iter().map(|arg| self.stage(arg)).collect())
            }
            TermKind::List(items) => {
                TermKind::List(items.iter().map(|item| self.stage(item)).collect())
            }
            TermKind::Record(fields) => TermKind::Record(
                fields
                    .iter()
                    .map(|(name, item)| (name.clone(), self.stage(item)))
                    .collect(),
            ),
            TermKind::Aggregate(_, value, filter) => {
                let mut by = Vec::new();
                let groupable = scored_reads(value, &mut by)
                    && filter
                        .as_deref()
                        .is_none_or(|filter| scored_reads(filter, &mut by));
                if !groupable {
                    return term.clone();
                }
                let slot = slot_of(&mut self.grouped, term);
                TermKind::Grouped(slot, by, Box::new(term.clone()))
            }
            // A candidate definition that is one read is read in place: the
            // read costs no more than a cached value and saves caching it.
            TermKind::Let(index) => match self.lets.get(*index) {
                Some(LetSpec {
                    candidate: true,
                    term:
                        Term {
                            kind: TermKind::Read(read),
                            ..
                        },
                    ..
                }) => TermKind::Read(read.clone()),
                _ => term.kind.clone(),
            },
            // Candidate switches and aggregates look at other candidates
            // with the same terms; they stay as written.
            other => other.clone(),
        };
        Term::new(kind, term.span)
    }
}

/// Collects into `by` what an aggregate's value or filter reads of the
/// candidate it scores (the `X` of each `scored.X`); `false` when it depends
/// on more than those and the candidates it ranges over: another candidate
/// (`prev`, `first`, `served`) or a nested aggregate. Definitions see only
/// their own candidate, so they depend on nothing else.
fn scored_reads(term: &Term, by: &mut Vec<Term>) -> bool {
    match &term.kind {
        TermKind::At(Who::Scored, inner) => {
            if !reads_one_candidate(inner) {
                return false;
            }
            if !by.contains(inner) {
                by.push((**inner).clone());
            }
            true
        }
        TermKind::At(..) | TermKind::Aggregate(..) | TermKind::Grouped(..) => false,
        TermKind::Const(_)
        | TermKind::Read(_)
        | TermKind::Let(_)
        | TermKind::Merge(_)
        | TermKind::Static(..)
        | TermKind::Hoisted(..) => true,
        TermKind::Not(inner)
        | TermKind::Negate(inner)
        | TermKind::Field(inner, _)
        | TermKind::ToEnum(_, inner) => scored_reads(inner, by),
        TermKind::Binary(_, lhs, rhs) => scored_reads(lhs, by) && scored_reads(rhs, by),
        TermKind::If(condition, then, otherwise) => {
            scored_reads(condition, by) && scored_reads(then, by) && scored_reads(otherwise, by)
        }
        TermKind::Call(_, items) | TermKind::List(items) => {
            items.iter().all(|item| scored_reads(item, by))
        }
        TermKind::Record(fields) => fields.iter().all(|(_, item)| scored_reads(item, by)),
    }
}

/// Whether a term reads only the candidate it is evaluated for (and the
/// request): no candidate switch, no aggregate.
fn reads_one_candidate(term: &Term) -> bool {
    let mut by = Vec::new();
    scored_reads(term, &mut by) && by.is_empty()
}

/// The slot of an equal term already staged, or a new one.
fn slot_of(slots: &mut Vec<Term>, term: &Term) -> usize {
    match slots.iter().position(|staged| staged == term) {
        Some(slot) => slot,
        None => {
            slots.push(term.clone());
            slots.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::language::ast::BinaryOp;
    use crate::source::Span;
    use crate::value::Value;

    fn read(read: Read) -> Term {
        Term::read(read, Span::default())
    }

    fn binary(op: BinaryOp, lhs: Term, rhs: Term) -> Term {
        Term::new(
            TermKind::Binary(op, Box::new(lhs), Box::new(rhs)),
            Span::default(),
        )
    }

    fn stager() -> Stager<'static> {
        Stager {
            lets: &[],
            one_requested_id: false,
            let_deps: Vec::new(),
            let_focus: Vec::new(),
            statics: Vec::new(),
            hoisted: Vec::new(),
            grouped: Vec::new(),
        }
    }

    #[test]
    fn a_condition_that_reads_the_set_only_through_aggregates_is_the_same_for_all() {
        let mut stager = stager();
        let cheap = binary(BinaryOp::Eq, read(Read::ModelId), read(Read::RequestModel));
        // any price below the scored candidate's own: differs per candidate.
        let below_scored = aggregate(binary(
            BinaryOp::Lt,
            read(Read::RoutePrice(crate::language::ir::PriceField::Input)),
            at(
                Who::Scored,
                read(Read::RoutePrice(crate::language::ir::PriceField::Input)),
            ),
        ));
        // The set alone, staged or not, and with request parts around it.
        for set_wide in [
            aggregate(cheap.clone()),
            stager.stage(&aggregate(cheap.clone())),
        ] {
            assert!(!stager.reads_focus(&set_wide), "{set_wide:?}");
            let with_request = binary(BinaryOp::Or, read(Read::RequestStream), set_wide);
            assert!(!stager.reads_focus(&with_request));
        }
        for per_candidate in [
            cheap.clone(),
            below_scored.clone(),
            stager.stage(&below_scored),
            binary(
                BinaryOp::And,
                aggregate(cheap.clone()),
                read(Read::ProviderId),
            ),
            at(Who::First, read(Read::ModelId)),
        ] {
            assert!(stager.reads_focus(&per_candidate), "{per_candidate:?}");
        }
        // Through definitions: one over the set, one of the candidate.
        let definition = |term: Term| LetSpec {
            name: String::from("d"),
            term,
            candidate: true,
            aggregate: true,
        };
        let lets = [definition(aggregate(cheap.clone())), definition(cheap)];
        let mut with_lets = Stager {
            lets: &lets,
            let_focus: vec![None; lets.len()],
            ..super::tests::stager()
        };
        assert!(!with_lets.reads_focus(&Term::new(TermKind::Let(0), Span::default())));
        assert!(with_lets.reads_focus(&Term::new(TermKind::Let(1), Span::default())));
    }

    #[test]
    fn candidate_definitions_that_are_one_read_are_read_in_place() {
        let definition = |term: Term| LetSpec {
            name: String::from("d"),
            term,
            candidate: true,
            aggregate: false,
        };
        let lets = [
            definition(read(Read::CredentialOwned)),
            definition(Term::new(
                TermKind::Not(Box::new(read(Read::CredentialOwned))),
                Span::default(),
            )),
        ];
        let mut stager = Stager {
            lets: &lets,
            let_deps: vec![None; lets.len()],
            ..stager()
        };
        let own = Term::new(TermKind::Let(0), Span::default());
        assert_eq!(
            stager.stage(&own).kind,
            TermKind::Read(Read::CredentialOwned)
        );
        let other = Term::new(TermKind::Let(1), Span::default());
        assert_eq!(stager.stage(&other).kind, TermKind::Let(1));
    }

    #[test]
    fn catalog_parts_become_static_and_request_parts_hoisted() {
        let mut stager = stager();
        // (3 * route.price.input > 1) and (len(key.regions) > 0) and health.paused
        let price = binary(
            BinaryOp::Gt,
            binary(
                BinaryOp::Mul,
                Term::constant(Value::Number(3.0), Span::default()),
                read(Read::RoutePrice(crate::language::ir::PriceField::Input)),
            ),
            Term::constant(Value::Number(1.0), Span::default()),
        );
        let key = binary(
            BinaryOp::Gt,
            Term::new(
                TermKind::Call(
                    crate::language::ir::Function::Len,
                    vec![read(Read::KeyAttr(0))],
                ),
                Span::default(),
            ),
            Term::constant(Value::Number(0.0), Span::default()),
        );
        let term = binary(
            BinaryOp::And,
            binary(BinaryOp::And, price.clone(), key.clone()),
            read(Read::HealthPaused),
        );
        let staged = stager.stage(&term);
        let TermKind::Binary(_, left, right) = staged.kind else {
            panic!("the conjunction stays");
        };
        assert_eq!(right.kind, TermKind::Read(Read::HealthPaused));
        let TermKind::Binary(_, static_part, hoisted_part) = left.kind else {
            panic!("the inner conjunction stays");
        };
        assert_eq!(
            static_part.kind,
            TermKind::Static(0, Box::new(price.clone()))
        );
        assert_eq!(hoisted_part.kind, TermKind::Hoisted(0, Box::new(key)));
        assert_eq!(stager.statics, vec![price]);
    }

    #[test]
    fn how_the_one_requested_id_resolved_is_a_request_part() {
        let pinned = binary(
            BinaryOp::Eq,
            read(Read::RequestedKind),
            Term::constant(Value::string("pin"), Span::default()),
        );
        let step = binary(BinaryOp::Or, pinned.clone(), read(Read::CredentialOwned));
        let mut one = Stager {
            one_requested_id: true,
            ..stager()
        };
        assert_eq!(
            one.stage(&pinned).kind,
            TermKind::Hoisted(0, Box::new(pinned.clone()))
        );
        let mut budget = GUARD_TERMS;
        assert_eq!(
            one.guard(&step, &[], 0, &mut budget),
            Guard::Or(
                Box::new(Guard::Request(pinned.clone())),
                Box::new(Guard::Open)
            )
        );
        // A guard out of terms to look at is open where it stopped.
        let mut budget = 1;
        assert_eq!(one.guard(&step, &[], 0, &mut budget), Guard::Open);
        // Several requested ids: each candidate has its own.
        let mut several = stager();
        assert_eq!(several.stage(&pinned), pinned);
        let mut budget = GUARD_TERMS;
        assert_eq!(several.guard(&step, &[], 0, &mut budget), Guard::Open);
    }

    #[test]
    fn ownership_and_lone_reads_stay_interpreted() {
        let mut stager = stager();
        let owned = read(Read::CredentialOwned);
        assert_eq!(stager.stage(&owned), owned);
        let key = read(Read::KeyAttr(0));
        assert_eq!(stager.stage(&key), key);
        assert!(stager.statics.is_empty() && stager.hoisted.is_empty());
    }

    fn aggregate(filter: Term) -> Term {
        Term::new(
            TermKind::Aggregate(
                crate::language::ast::Aggregate::MinOf,
                Box::new(read(Read::RoutePrice(
                    crate::language::ir::PriceField::Input,
                ))),
                Some(Box::new(filter)),
            ),
            Span::default(),
        )
    }

    fn at(who: Who, inner: Term) -> Term {
        Term::new(TermKind::At(who, Box::new(inner)), Span::default())
    }

    #[test]
    fn aggregates_over_the_scored_candidates_group_by_what_they_read_of_it() {
        let mut stager = stager();
        // min_of(route.price.input if model.id == scored.model.id)
        let same_model = aggregate(binary(
            BinaryOp::Eq,
            read(Read::ModelId),
            at(Who::Scored, read(Read::ModelId)),
        ));
        let staged = stager.stage(&same_model);
        assert_eq!(
            staged.kind,
            TermKind::Grouped(0, vec![read(Read::ModelId)], Box::new(same_model))
        );
        // One that reads another candidate than the scored one is not grouped.
        let after_prev = aggregate(binary(
            BinaryOp::Eq,
            read(Read::ModelId),
            at(Who::Prev, read(Read::ModelId)),
        ));
        assert_eq!(stager.stage(&after_prev), after_prev);
    }

    #[test]
    fn equal_terms_share_a_slot() {
        let mut stager = stager();
        let priority = read(Read::ProviderPriority);
        let first = stager.stage(&priority);
        let second = stager.stage(&priority);
        assert_eq!(first, second);
        assert_eq!(stager.statics.len(), 1);
    }
}
