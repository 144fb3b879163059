//! Name resolution and type checking of expressions, elaborating each into
//! its resolved [`Term`].

use super::Checker;
use super::env::{Place, Root};
use super::types::{EnumTy, RecordTy, Ty, enums_compatible, fits, unify};
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::language::ast::*;
use crate::language::ir::{DefRef, Function, PriceField, Read, Term, TermKind, Who};
use crate::source::Span;
use crate::value::{EnumMember, Value};
use std::sync::Arc;

/// What an expression read, so callers can tell whether it depends on the
/// candidate, needs a candidate set, or bounds a retry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub candidate: bool,
    pub aggregate: bool,
    pub retries: bool,
    pub elapsed: bool,
    /// Where the expression first reads the provider's answer.
    pub upstream_at: Option<Span>,
}

impl Usage {
    pub fn merge(&mut self, other: Usage) {
        self.candidate |= other.candidate;
        self.aggregate |= other.aggregate;
        self.retries |= other.retries;
        self.elapsed |= other.elapsed;
        self.upstream_at = self.upstream_at.or(other.upstream_at);
    }
}

/// Paths known to be present here (`present(x) and x > 1` narrows `x`).
#[derive(Debug, Clone, Default)]
pub struct Facts(Vec<String>);

impl Facts {
    /// What an `on` rule's outcome patterns prove: a rule that names only
    /// statuses and status classes runs on an answer, which always has a
    /// status, so its `when` and consequences may read `upstream.status` as
    /// present. A rule that also names `timeout`, `reset`, ... proves nothing.
    pub fn from_outcomes(outcomes: &[OutcomePattern]) -> Facts {
        let only_statuses = !outcomes.is_empty()
            && outcomes
                .iter()
                .all(|pattern| matches!(pattern.kind, OutcomeKind::Status { .. }));
        if only_statuses {
            Facts(vec![String::from("upstream.status")])
        } else {
            Facts::default()
        }
    }

    /// These facts and what `condition` proves besides.
    pub fn and_condition(&self, condition: Option<&Expr>) -> Facts {
        self.with(condition.map(facts_if_true).unwrap_or_default())
    }

    fn with(&self, more: Vec<String>) -> Facts {
        let mut facts = self.0.clone();
        facts.extend(more);
        Facts(facts)
    }

    fn knows(&self, path: &str) -> bool {
        self.0.iter().any(|known| known == path)
    }

    /// The facts that still hold inside an aggregate, where a candidate's
    /// fields and definitions name each candidate in turn: those about the
    /// request, the caller and the data.
    fn outside_candidates(&self, candidate_lets: &[String]) -> Facts {
        let about_candidates = |path: &str| {
            let head = path.split('.').next().unwrap_or(path);
            Root::from_name(head).is_some_and(Root::is_candidate)
                || candidate_lets.iter().any(|name| name == head)
        };
        Facts(
            self.0
                .iter()
                .filter(|path| !about_candidates(path))
                .cloned()
                .collect(),
        )
    }
}

/// Where an expression sits, beyond its place.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub facts: Facts,
    pub in_aggregate: bool,
    /// The type of `it` inside an input's shorthand.
    pub it: Option<Ty>,
}

const FUNCTIONS: &[&str] = &[
    "min",
    "max",
    "clamp",
    "coalesce",
    "present",
    "empty",
    "len",
    "intersects",
    "subset",
    "index_of",
    "contains",
    "starts_with",
    "lower",
    "seconds",
    "backoff",
];

const CANDIDATE_FIELDS: [&str; 8] = [
    "model",
    "provider",
    "route",
    "credential",
    "health",
    "stats",
    "capacity",
    "requested",
];

fn facts_if_true(expr: &Expr) -> Vec<String> {
    match &expr.kind {
        ExprKind::Call(name, args) if name.name == "present" => {
            args.first().and_then(Expr::path_text).into_iter().collect()
        }
        ExprKind::Binary(BinaryOp::Ne, lhs, rhs) => null_comparison(lhs, rhs),
        ExprKind::Binary(BinaryOp::And, lhs, rhs) => {
            let mut facts = facts_if_true(lhs);
            facts.extend(facts_if_true(rhs));
            facts
        }
        ExprKind::Unary(UnaryOp::Not, inner) => facts_if_false(inner),
        _ => Vec::new(),
    }
}

fn facts_if_false(expr: &Expr) -> Vec<String> {
    match &expr.kind {
        ExprKind::Binary(BinaryOp::Eq, lhs, rhs) => null_comparison(lhs, rhs),
        ExprKind::Binary(BinaryOp::Or, lhs, rhs) => {
            let mut facts = facts_if_false(lhs);
            facts.extend(facts_if_false(rhs));
            facts
        }
        ExprKind::Unary(UnaryOp::Not, inner) => facts_if_true(inner),
        _ => Vec::new(),
    }
}

fn null_comparison(lhs: &Expr, rhs: &Expr) -> Vec<String> {
    let is_null = |e: &Expr| matches!(e.kind, ExprKind::Literal(Literal::Null));
    match (is_null(lhs), is_null(rhs)) {
        (false, true) => lhs.path_text().into_iter().collect(),
        (true, false) => rhs.path_text().into_iter().collect(),
        _ => Vec::new(),
    }
}

/// The value of a number built only from literals, if it has one.
pub fn constant_number(expr: &Expr) -> Option<f64> {
    let value = match &expr.kind {
        ExprKind::Literal(Literal::Number(n) | Literal::Percent(n)) => *n,
        ExprKind::Unary(UnaryOp::Negate, inner) => -constant_number(inner)?,
        ExprKind::Binary(op, lhs, rhs) => {
            let (a, b) = (constant_number(lhs)?, constant_number(rhs)?);
            let exact = match op {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::Div if b != 0.0 => a / b,
                _ => return None,
            };
            // As the evaluator keeps arithmetic: to nine decimal places.
            (exact * 1e9).round() / 1e9
        }
        _ => return None,
    };
    value.is_finite().then_some(value)
}

/// The value of a duration literal, in milliseconds.
pub fn constant_duration(expr: &Expr) -> Option<u64> {
    match expr.kind {
        ExprKind::Literal(Literal::Duration(ms)) => Some(ms),
        _ => None,
    }
}

/// The value of a condition built only from literals, if it has one.
pub fn constant_bool(expr: &Expr) -> Option<bool> {
    match &expr.kind {
        ExprKind::Literal(Literal::Bool(b)) => Some(*b),
        ExprKind::Binary(
            op @ (BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge),
            lhs,
            rhs,
        ) => {
            let (a, b) = (constant_number(lhs)?, constant_number(rhs)?);
            Some(compare(*op, a, b))
        }
        ExprKind::Unary(UnaryOp::Not, inner) => constant_bool(inner).map(|b| !b),
        ExprKind::Binary(op @ (BinaryOp::And | BinaryOp::Or | BinaryOp::Implies), lhs, rhs) => {
            connective(*op, constant_bool(lhs), constant_bool(rhs))
        }
        _ => None,
    }
}

/// The numbers written as constants among what `expr` can come out as:
/// itself, or the branches of an `if`. (Not a `coalesce`'s fallback, which a
/// guard around it may keep from ever being the result.)
pub fn constant_results(expr: &Expr) -> Vec<(f64, Span)> {
    if let Some(value) = constant_number(expr) {
        return vec![(value, expr.span)];
    }
    match &expr.kind {
        ExprKind::If(_, then, otherwise) => {
            let mut results = constant_results(then);
            results.extend(constant_results(otherwise));
            results
        }
        _ => Vec::new(),
    }
}

/// What a bare name or an input stands for, for [`stops_retrying`].
pub enum Named<'e> {
    /// A `let`: its value.
    Let(&'e Expr),
    /// A `merge`: its operator, the request's side and the default.
    Merge(MergeOp, &'e Expr, &'e Expr),
    /// An input whose type bounds it (`int A..B`).
    BoundedInput,
    /// A setting or attribute an entry may leave out: not required, and
    /// with no default.
    MayBeAbsent,
}

/// Looks names up for [`stops_retrying`]: a bare name (a `let` or a
/// `merge`), or `input.NAME` (as `input.NAME`).
pub type NameLookup<'e> = dyn Fn(&str) -> Option<Named<'e>> + 'e;

/// Whether a rule's `when` stops a `retry`: once `retries` and `elapsed`
/// have grown past any bound, it must be false whatever every other value
/// is (the provider's answer, the request's inputs, the catalog's data).
/// `retries < 2 or upstream.status == 503` is not: a provider that keeps
/// answering 503 is retried forever.
pub fn stops_retrying(condition: &Expr, names: &NameLookup<'_>) -> bool {
    Limits { names, depth: 0 }.truth(condition) == Some(false)
}

/// Whether a `budget` bounds the retries: a duration that is present and
/// that no client sets (a division may come out absent, and an absent
/// budget limits nothing).
pub fn bounds_time(budget: &Expr, names: &NameLookup<'_>) -> bool {
    matches!(
        Limits { names, depth: 0 }.number(budget),
        InTheLimit::Constant(_) | InTheLimit::Finite { present: true }
    )
}

/// A number once `retries` and `elapsed` have grown past any bound.
#[derive(Debug, Clone, Copy, PartialEq)]
enum InTheLimit {
    /// Built from literals only.
    Constant(f64),
    /// Set by the operator (the catalog, the tenants file, defaults), by a
    /// type's range, or a provider's status: finite whatever it is, or
    /// absent (a division by zero).
    Finite { present: bool },
    /// Bounded above, or absent, but not below (`min(input.n, 3)`).
    UpperBounded,
    /// Never negative, but with no upper bound: a provider's `Retry-After`.
    NonNegative,
    /// Larger than any finite number (`retries`, `elapsed`, and sums with
    /// them); absent if built with something that may be.
    Unbounded { present: bool },
    /// Anything at all, a client's number among them.
    Unknown,
}

/// Bare names followed through `let`s and `merge`s, at most this deep.
const MAX_NAME_DEPTH: usize = 32;

struct Limits<'n, 'e> {
    names: &'n NameLookup<'e>,
    depth: usize,
}

impl Limits<'_, '_> {
    fn number(&mut self, expr: &Expr) -> InTheLimit {
        use InTheLimit::{Constant, Finite, NonNegative, Unbounded, Unknown, UpperBounded};
        if let Some(value) = constant_number(expr) {
            return Constant(value);
        }
        let finite = |x: InTheLimit| matches!(x, Constant(_) | Finite { .. });
        let present = |x: InTheLimit| {
            matches!(
                x,
                Constant(_) | Finite { present: true } | Unbounded { present: true }
            )
        };
        match &expr.kind {
            ExprKind::Literal(Literal::Duration(ms)) => Constant(*ms as f64),
            ExprKind::Path(path) => {
                let names: Vec<&str> = path.iter().map(|p| p.name.as_str()).collect();
                match names[..] {
                    // `attempt` counts every try, a retry's too.
                    ["retries"] | ["elapsed"] | ["attempt"] => Unbounded { present: true },
                    [
                        "defaults" | "tenant" | "workspace" | "key" | "provider" | "route"
                        | "model" | "credential" | "deployment",
                        ..,
                    ] => match (self.names)(&names.join(".")) {
                        Some(Named::MayBeAbsent) => Finite { present: false },
                        _ => Finite { present: true },
                    },
                    ["upstream", "status"] => Finite { present: true },
                    ["upstream", "retry_after"] => NonNegative,
                    ["input", name, ..] => match (self.names)(&format!("input.{name}")) {
                        Some(Named::BoundedInput) => Finite { present: true },
                        _ => Unknown,
                    },
                    [name] => self.named(name),
                    _ => Unknown,
                }
            }
            ExprKind::Unary(UnaryOp::Negate, inner) => match self.number(inner) {
                Finite { present } => Finite { present },
                _ => Unknown,
            },
            ExprKind::Binary(op, lhs, rhs) => {
                let (a, b) = (self.number(lhs), self.number(rhs));
                let both = present(a) && present(b);
                match op {
                    BinaryOp::Add => match (a, b) {
                        (Unbounded { .. }, other) | (other, Unbounded { .. })
                            if finite(other) || matches!(other, NonNegative | Unbounded { .. }) =>
                        {
                            Unbounded { present: both }
                        }
                        _ if finite(a) && finite(b) => Finite { present: both },
                        _ => Unknown,
                    },
                    BinaryOp::Sub => match (a, b) {
                        (Unbounded { .. }, other) if finite(other) => Unbounded { present: both },
                        _ if finite(a) && finite(b) => Finite { present: both },
                        _ => Unknown,
                    },
                    BinaryOp::Mul => match (a, b) {
                        (Unbounded { .. }, Constant(c)) | (Constant(c), Unbounded { .. })
                            if c > 0.0 =>
                        {
                            Unbounded { present: both }
                        }
                        _ if finite(a) && finite(b) => Finite { present: both },
                        _ => Unknown,
                    },
                    BinaryOp::Div => match (a, b) {
                        (Unbounded { .. }, Constant(c)) if c > 0.0 => Unbounded { present: both },
                        (Finite { present }, Constant(c)) if c != 0.0 => Finite { present },
                        // A divisor that may be zero gives a value that may
                        // be absent.
                        _ if finite(a) && finite(b) => Finite { present: false },
                        _ => Unknown,
                    },
                    _ => Unknown,
                }
            }
            ExprKind::If(_, then, otherwise) => {
                let (a, b) = (self.number(then), self.number(otherwise));
                match (a, b) {
                    _ if finite(a) && finite(b) => Finite {
                        present: present(a) && present(b),
                    },
                    (Unbounded { present: p }, Unbounded { present: q }) => {
                        Unbounded { present: p && q }
                    }
                    _ => Unknown,
                }
            }
            ExprKind::Call(function, arguments) => {
                let values: Vec<InTheLimit> = arguments.iter().map(|a| self.number(a)).collect();
                match function.name.as_str() {
                    "seconds" => values.first().copied().unwrap_or(Unknown),
                    "min" => {
                        if !values.is_empty() && values.iter().all(|v| finite(*v)) {
                            Finite {
                                present: values.iter().all(|v| present(*v)),
                            }
                        } else if values.iter().any(|v| {
                            // An absent argument bounds nothing: the others decide.
                            (finite(*v) && present(*v)) || matches!(v, UpperBounded)
                        }) {
                            UpperBounded
                        } else {
                            Unknown
                        }
                    }
                    "max" => {
                        if !values.is_empty() && values.iter().all(|v| finite(*v)) {
                            Finite {
                                present: values.iter().all(|v| present(*v)),
                            }
                        } else {
                            Unknown
                        }
                    }
                    // The first present argument: finite if all are, present
                    // if any is.
                    "coalesce" => {
                        if !values.is_empty() && values.iter().all(|v| finite(*v)) {
                            Finite {
                                present: values.iter().any(|v| present(*v)),
                            }
                        } else if values
                            .iter()
                            .all(|v| finite(*v) || matches!(v, NonNegative))
                        {
                            NonNegative
                        } else if values
                            .iter()
                            .all(|v| finite(*v) || matches!(v, UpperBounded))
                        {
                            UpperBounded
                        } else {
                            Unknown
                        }
                    }
                    _ => Unknown,
                }
            }
            _ => Unknown,
        }
    }

    /// A `let` or `merge` by its name.
    fn named(&mut self, name: &str) -> InTheLimit {
        use InTheLimit::{Constant, Finite, Unknown, UpperBounded};
        if self.depth >= MAX_NAME_DEPTH {
            return Unknown;
        }
        self.depth += 1;
        let value = match (self.names)(name) {
            Some(Named::Let(value)) => self.number(value),
            Some(Named::Merge(op, request, default)) => {
                let (request, default) = (self.number(request), self.number(default));
                let finite = |x: InTheLimit| matches!(x, Constant(_) | Finite { .. });
                let present = |x: InTheLimit| matches!(x, Constant(_) | Finite { present: true });
                match op {
                    // The smaller, or the side that is set: below a finite
                    // default whatever the request asks, or the request's
                    // own value when the default is absent — so a default
                    // that may be absent bounds nothing.
                    MergeOp::Min if finite(request) && finite(default) => Finite {
                        present: present(request) || present(default),
                    },
                    MergeOp::Min
                        if (finite(request) && present(request))
                            || (finite(default) && present(default)) =>
                    {
                        UpperBounded
                    }
                    MergeOp::Max | MergeOp::First if finite(request) && finite(default) => {
                        Finite { present: true }
                    }
                    _ => Unknown,
                }
            }
            Some(Named::BoundedInput | Named::MayBeAbsent) | None => Unknown,
        };
        self.depth -= 1;
        value
    }

    /// The truth of a condition in the limit, if every value of everything
    /// else gives the same; `None` if it may hold.
    fn truth(&mut self, expr: &Expr) -> Option<bool> {
        use InTheLimit::{Constant, Finite, Unbounded, UpperBounded};
        match &expr.kind {
            ExprKind::Literal(Literal::Bool(b)) => Some(*b),
            ExprKind::Unary(UnaryOp::Not, inner) => self.truth(inner).map(|b| !b),
            ExprKind::If(_, then, otherwise) => {
                let (a, b) = (self.truth(then), self.truth(otherwise));
                if a == b { a } else { None }
            }
            ExprKind::Path(path) if path.len() == 1 => {
                match path.first().and_then(|name| (self.names)(&name.name)) {
                    Some(Named::Let(value)) if self.depth < MAX_NAME_DEPTH => {
                        self.depth += 1;
                        let truth = self.truth(value);
                        self.depth -= 1;
                        truth
                    }
                    _ => None,
                }
            }
            ExprKind::Binary(op @ (BinaryOp::And | BinaryOp::Or | BinaryOp::Implies), lhs, rhs) => {
                let (l, r) = (self.truth(lhs), self.truth(rhs));
                connective(*op, l, r)
            }
            ExprKind::Binary(BinaryOp::In, lhs, rhs) => {
                let ExprKind::List(items) = &rhs.kind else {
                    return None;
                };
                let value = self.number(lhs);
                let bounded = items
                    .iter()
                    .all(|item| matches!(self.number(item), Constant(_) | Finite { .. }));
                (matches!(value, Unbounded { .. }) && bounded).then_some(false)
            }
            ExprKind::Binary(
                op @ (BinaryOp::Eq
                | BinaryOp::Ne
                | BinaryOp::Lt
                | BinaryOp::Le
                | BinaryOp::Gt
                | BinaryOp::Ge),
                lhs,
                rhs,
            ) => {
                let (a, b) = (self.number(lhs), self.number(rhs));
                // Written with the unbounded side on the left.
                let (op, a, b) = match (a, b) {
                    (_, Unbounded { .. }) if !matches!(a, Unbounded { .. }) => {
                        (mirrored(*op), b, a)
                    }
                    _ => (*op, a, b),
                };
                match (a, b) {
                    (Constant(x), Constant(y)) => Some(compare(op, x, y)),
                    // Beyond every value the other side can take, or absent:
                    // a comparison with an absent value is false.
                    (Unbounded { present }, Constant(_) | Finite { .. } | UpperBounded) => match op
                    {
                        BinaryOp::Lt | BinaryOp::Le | BinaryOp::Eq => Some(false),
                        _ if present && matches!(b, Constant(_) | Finite { present: true }) => {
                            Some(true)
                        }
                        _ => None,
                    },
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// The enumeration whose members a string compared with a value of this
/// type must be: the type's own, or its items' for a list of members.
fn enum_or_list_of_enum(ty: &Ty) -> Option<Arc<EnumTy>> {
    match ty.required() {
        Ty::Enum(e) => Some(Arc::clone(e)),
        Ty::List(item) => match item.required() {
            Ty::Enum(e) => Some(Arc::clone(e)),
            _ => None,
        },
        _ => None,
    }
}

/// Two numbers compared by `op`, one of `==`, `!=`, `<`, `<=`, `>`, `>=`.
fn compare(op: BinaryOp, a: f64, b: f64) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        _ => a >= b,
    }
}

/// `and`, `or` or `implies` of two truths that may be unknown (`None`):
/// known whenever one side settles it.
fn connective(op: BinaryOp, l: Option<bool>, r: Option<bool>) -> Option<bool> {
    match op {
        BinaryOp::And => match (l, r) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        },
        BinaryOp::Or => match (l, r) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), Some(false)) => Some(false),
            _ => None,
        },
        _ => match (l, r) {
            (Some(false), _) | (_, Some(true)) => Some(true),
            (Some(true), Some(false)) => Some(false),
            _ => None,
        },
    }
}

/// The comparison with its sides swapped: `a < b` is `b > a`.
fn mirrored(op: BinaryOp) -> BinaryOp {
    match op {
        BinaryOp::Lt => BinaryOp::Gt,
        BinaryOp::Le => BinaryOp::Ge,
        BinaryOp::Gt => BinaryOp::Lt,
        BinaryOp::Ge => BinaryOp::Le,
        other => other,
    }
}

/// A placeholder for an expression that did not check; the program it would
/// be part of is never used.
fn broken(span: Span) -> (Ty, Term) {
    (Ty::Unknown, Term::constant(Value::Null, span))
}

fn boxed(term: Term) -> Box<Term> {
    Box::new(term)
}

/// Converts a value of type `from` flowing to type `to`: strings and members
/// of another enumeration become members of the target enumeration, so
/// ordered comparisons use its ranks.
pub fn coerce(term: Term, from: &Ty, to: &Ty) -> Term {
    let Ty::Enum(target) = to.required() else {
        return term;
    };
    let same = matches!(from.required(), Ty::Enum(source) if source.members == target.members);
    if same || !matches!(from.required(), Ty::String | Ty::Enum(_)) {
        return term;
    }
    let span = term.span;
    if let TermKind::Const(Value::String(text)) = &term.kind
        && let Some(rank) = target.members.iter().position(|m| **m == **text)
    {
        return Term::constant(
            Value::Enum(EnumMember {
                rank: u32::try_from(rank).unwrap_or(u32::MAX),
                name: text.clone(),
            }),
            span,
        );
    }
    Term::new(TermKind::ToEnum(target.clone(), boxed(term)), span)
}

impl Checker<'_> {
    fn diag(&mut self, diagnostic: Diagnostic) {
        self.diagnostics.push(diagnostic);
    }

    fn err(
        &mut self,
        code: codes::Code,
        span: Span,
        message: String,
        label: &str,
        help: Option<String>,
    ) {
        let source = self.source;
        self.diag(
            Diagnostic::new(code, message)
                .at(source, span, label)
                .help_opt(help),
        );
    }

    /// Checks an expression; returns its type, what it read, and its term.
    pub fn check_expr(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> (Ty, Usage, Term) {
        let saved = std::mem::take(&mut self.usage);
        let (ty, term) = self.expr(expr, place, scope);
        let usage = std::mem::replace(&mut self.usage, saved);
        self.usage.merge(usage);
        (ty, usage, term)
    }

    /// Checks that an expression has the expected type.
    pub fn expect(
        &mut self,
        expr: &Expr,
        expected: &Ty,
        place: &Place,
        scope: &Scope,
    ) -> (Usage, Term) {
        let (ty, usage, term) = self.check_expr(expr, place, scope);
        self.require_type(expr, &ty, expected);
        (usage, coerce(term, &ty, expected))
    }

    pub fn require_type(&mut self, expr: &Expr, actual: &Ty, expected: &Ty) {
        if fits(actual, expected) {
            if let (Ty::Enum(e), _) | (_, Ty::Enum(e)) = (actual.required(), expected.required()) {
                self.enum_literal(e, expr);
            }
            return;
        }
        if actual.is_optional() && fits(actual.required(), expected) {
            self.maybe_absent(expr, actual);
            return;
        }
        self.err(
            codes::TYPE_MISMATCH,
            expr.span,
            format!("expected {expected}, found {actual}"),
            &format!("this is {actual}"),
            type_hint(actual, expected),
        );
    }

    /// Whether the data refused the declaration of attribute `name` of
    /// the record `prefix` ends in (`provider`, `first.route`, `defaults`).
    fn refused_attribute(&self, prefix: &str, name: &str) -> bool {
        let record = prefix.rsplit('.').next().unwrap_or(prefix);
        let subject = if record == "defaults" {
            "setting"
        } else {
            record
        };
        self.data
            .schema
            .refused
            .iter()
            .any(|(refused, attribute)| refused.name() == subject && attribute == name)
    }

    fn maybe_absent(&mut self, expr: &Expr, ty: &Ty) {
        let what = expr
            .path_text()
            .map_or_else(|| String::from("this value"), |path| format!("`{path}`"));
        self.err(
            codes::MAYBE_ABSENT,
            expr.span,
            format!("{what} may be absent here"),
            &format!("this is {ty}"),
            Some(String::from(
                "give a fallback with `coalesce(x, fallback)`, or test `present(x)` first",
            )),
        );
    }

    /// A string literal compared with an enumeration must be one of its
    /// members: written alone, in a list, or as what an `if` or a
    /// `coalesce` may give.
    pub(super) fn enum_literal(&mut self, enum_ty: &EnumTy, expr: &Expr) {
        fn literals<'e>(expr: &'e Expr, found: &mut Vec<(&'e str, Span)>) {
            match &expr.kind {
                ExprKind::Literal(Literal::String(s)) => found.push((s.as_str(), expr.span)),
                ExprKind::List(items) => {
                    for item in items {
                        if let ExprKind::Literal(Literal::String(s)) = &item.kind {
                            found.push((s.as_str(), item.span));
                        }
                    }
                }
                ExprKind::If(_, then, otherwise) => {
                    literals(then, found);
                    literals(otherwise, found);
                }
                ExprKind::Call(function, arguments) if function.name == "coalesce" => {
                    for argument in arguments {
                        literals(argument, found);
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        literals(expr, &mut found);
        for (text, span) in found {
            if !enum_ty.has(text) {
                let help = suggest(text, enum_ty.members.iter().map(String::as_str))
                    .map(|close| format!("did you mean \"{close}\"?"))
                    .or_else(|| {
                        Some(format!(
                            "the members of `{}` are: {}",
                            enum_ty.name,
                            enum_ty.members.join(", ")
                        ))
                    });
                self.err(
                    codes::UNKNOWN_ENUM_MEMBER,
                    span,
                    format!("`{}` has no member \"{text}\"", enum_ty.name),
                    "not a member",
                    help,
                );
            }
        }
    }

    fn expr(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> (Ty, Term) {
        // A definition's expression nests a few hundred levels at most, but
        // definitions using definitions nest those again, and an
        // unoptimised build's frames are large: every level makes sure of
        // its stack, not only each definition.
        stacker::maybe_grow(super::STACK_RED_ZONE, super::STACK_SEGMENT, || {
            self.expr_here(expr, place, scope)
        })
    }

    fn expr_here(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> (Ty, Term) {
        let span = expr.span;
        match &expr.kind {
            ExprKind::Literal(literal) => {
                let (ty, value) = match literal {
                    Literal::Bool(b) => (Ty::Bool, Value::Bool(*b)),
                    Literal::Number(n) | Literal::Percent(n) => (Ty::Number, Value::Number(*n)),
                    Literal::Duration(ms) => (Ty::Duration, Value::Duration(*ms)),
                    Literal::String(s) => (Ty::String, Value::string(s)),
                    Literal::Null => (Ty::Null, Value::Null),
                };
                (ty, Term::constant(value, span))
            }
            ExprKind::Path(segments) => self.path(segments, expr, place, scope),
            ExprKind::List(items) => {
                let mut item_ty = Ty::Unknown;
                let mut parts = Vec::new();
                for item in items {
                    let (ty, term) = self.expr(item, place, scope);
                    match unify(&item_ty, &ty) {
                        Some(unified) => item_ty = unified,
                        None => {
                            self.err(
                                codes::TYPE_MISMATCH,
                                item.span,
                                format!("list items must have one type; this is {ty}, earlier ones are {item_ty}"),
                                "different type",
                                Some(format!("make every item {item_ty} like the ones before it, or write two lists")),
                            );
                        }
                    }
                    parts.push((ty, term));
                }
                let terms = parts
                    .into_iter()
                    .map(|(ty, term)| coerce(term, &ty, &item_ty))
                    .collect();
                (
                    Ty::List(Box::new(item_ty)),
                    Term::new(TermKind::List(terms), span),
                )
            }
            ExprKind::Object(fields) => {
                if scope.it.is_none() {
                    self.err(
                        codes::TYPE_MISMATCH,
                        span,
                        String::from("object values can only be written in an input's `shorthand`"),
                        "object here",
                        Some(String::from("outside `shorthand T => { field: EXPR }`, give each value its own `let` or write it where it is used")),
                    );
                    return broken(span);
                }
                let mut types = Vec::new();
                let mut terms = Vec::new();
                for (name, value) in fields {
                    let (ty, term) = self.expr(value, place, scope);
                    types.push((name.name.clone(), ty));
                    terms.push((Arc::from(name.name.as_str()), term));
                }
                (
                    Ty::Record(Arc::new(RecordTy {
                        name: String::from("shorthand"),
                        fields: types,
                    })),
                    Term::new(TermKind::Record(terms), span),
                )
            }
            ExprKind::Unary(op, operand) => {
                let (ty, term) = self.expr(operand, place, scope);
                match op {
                    UnaryOp::Not => {
                        self.require_type(operand, &ty, &Ty::Bool);
                        (Ty::Bool, Term::new(TermKind::Not(boxed(term)), span))
                    }
                    UnaryOp::Negate => match ty.required() {
                        Ty::Number | Ty::Unknown => {
                            (ty, Term::new(TermKind::Negate(boxed(term)), span))
                        }
                        Ty::Duration => {
                            self.err(
                                codes::BAD_OPERANDS,
                                expr.span,
                                String::from("`-` is not defined for duration"),
                                "a negative duration",
                                Some(String::from(
                                    "durations are never negative; a difference of durations stops at 0",
                                )),
                            );
                            broken(expr.span)
                        }
                        _ => self.bad_operands(expr, "-", &ty, None),
                    },
                }
            }
            ExprKind::Binary(op, lhs, rhs) => self.binary(*op, lhs, rhs, expr, place, scope),
            ExprKind::If(condition, then, otherwise) => {
                let (cond_ty, cond) = self.expr(condition, place, scope);
                self.require_type(condition, &cond_ty, &Ty::Bool);
                let then_scope = Scope {
                    facts: scope.facts.with(facts_if_true(condition)),
                    ..scope.clone()
                };
                let else_scope = Scope {
                    facts: scope.facts.with(facts_if_false(condition)),
                    ..scope.clone()
                };
                let (a, then_term) = self.expr(then, place, &then_scope);
                let (b, else_term) = self.expr(otherwise, place, &else_scope);
                match unify(&a, &b) {
                    Some(ty) => {
                        if let Ty::Enum(e) = ty.required() {
                            let e = e.clone();
                            self.enum_literal(&e, then);
                            self.enum_literal(&e, otherwise);
                        }
                        let then_term = coerce(then_term, &a, &ty);
                        let else_term = coerce(else_term, &b, &ty);
                        let term = Term::new(
                            TermKind::If(boxed(cond), boxed(then_term), boxed(else_term)),
                            span,
                        );
                        (ty, term)
                    }
                    None => {
                        self.err(
                            codes::TYPE_MISMATCH,
                            otherwise.span,
                            format!("both branches of `if` must have one type; `then` is {a}, `else` is {b}"),
                            &format!("this is {b}"),
                            type_hint(&b, &a),
                        );
                        broken(span)
                    }
                }
            }
            ExprKind::Call(name, args) => self.call(name, args, expr, place, scope),
            ExprKind::Aggregate {
                function,
                function_span,
                value,
                filter,
            } => self.aggregate(
                *function,
                *function_span,
                value,
                filter.as_deref(),
                expr,
                place,
                scope,
            ),
        }
    }

    fn bad_operands(&mut self, expr: &Expr, op: &str, lhs: &Ty, rhs: Option<&Ty>) -> (Ty, Term) {
        let message = match rhs {
            Some(rhs) => format!("`{op}` is not defined for {lhs} and {rhs}"),
            None => format!("`{op}` is not defined for {lhs}"),
        };
        let is_list = |ty: &Ty| matches!(ty.required(), Ty::List(_));
        let list_and_value = rhs.is_some_and(|rhs| is_list(lhs) != is_list(rhs));
        let help = match op {
            "==" | "!=" if list_and_value => {
                "to ask whether a list holds a value, write `VALUE in LIST` (or `not in`)"
            }
            "==" | "!=" => {
                "`==` and `!=` compare values of one type (an absent value with anything); see the type rules in docs/language.md"
            }
            "<" | "<=" | ">" | ">=" => {
                "order comparisons take two numbers, two durations, two dates, two strings or two members of one enumeration; see the type rules in docs/language.md"
            }
            "in" | "not in" => {
                "`in` looks for a value in a list of values of its type; see the type rules in docs/language.md"
            }
            "+" | "-" | "*" | "/" => {
                "arithmetic works on numbers and durations, `+` also joins strings; see the type rules in docs/language.md"
            }
            _ => "see the function's arguments and the type rules in docs/language.md",
        };
        self.err(
            codes::BAD_OPERANDS,
            expr.span,
            message,
            "here",
            Some(String::from(help)),
        );
        broken(expr.span)
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        lhs: &Expr,
        rhs: &Expr,
        expr: &Expr,
        place: &Place,
        scope: &Scope,
    ) -> (Ty, Term) {
        let span = expr.span;
        let (lhs_ty, lhs_term) = self.expr(lhs, place, scope);
        let rhs_scope = match op {
            BinaryOp::And | BinaryOp::Implies => Scope {
                facts: scope.facts.with(facts_if_true(lhs)),
                ..scope.clone()
            },
            BinaryOp::Or => Scope {
                facts: scope.facts.with(facts_if_false(lhs)),
                ..scope.clone()
            },
            _ => scope.clone(),
        };
        let (rhs_ty, rhs_term) = self.expr(rhs, place, &rhs_scope);
        let term = |l: Term, r: Term| Term::new(TermKind::Binary(op, boxed(l), boxed(r)), span);
        match op {
            BinaryOp::And | BinaryOp::Or | BinaryOp::Implies => {
                self.require_type(lhs, &lhs_ty, &Ty::Bool);
                self.require_type(rhs, &rhs_ty, &Ty::Bool);
                (Ty::Bool, term(lhs_term, rhs_term))
            }
            BinaryOp::Eq | BinaryOp::Ne => {
                if unify(&lhs_ty, &rhs_ty).is_none() {
                    return self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty));
                }
                self.enum_pair(&lhs_ty, rhs, &rhs_ty, lhs);
                (Ty::Bool, term(lhs_term, rhs_term))
            }
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                for (side, ty) in [(lhs, &lhs_ty), (rhs, &rhs_ty)] {
                    if ty.is_optional() {
                        self.maybe_absent(side, ty);
                        return broken(span);
                    }
                }
                let comparable = match (lhs_ty.required(), rhs_ty.required()) {
                    (Ty::Unknown, _) | (_, Ty::Unknown) => true,
                    (Ty::Enum(a), Ty::Enum(b)) => {
                        a.ordered && b.ordered && enums_compatible(a, b) || a == b && a.ordered
                    }
                    (Ty::Enum(e), Ty::String) | (Ty::String, Ty::Enum(e)) => e.ordered,
                    (a, b) => {
                        a == b && matches!(a, Ty::Number | Ty::Duration | Ty::Date | Ty::String)
                    }
                };
                if comparable {
                    self.enum_pair(&lhs_ty, rhs, &rhs_ty, lhs);
                    // Order a string against the enumeration's ranks.
                    let lhs_term = coerce(lhs_term, &lhs_ty, &rhs_ty);
                    let rhs_term = coerce(rhs_term, &rhs_ty, &lhs_ty);
                    return (Ty::Bool, term(lhs_term, rhs_term));
                }
                if let (Ty::Enum(e), _) | (_, Ty::Enum(e)) = (lhs_ty.required(), rhs_ty.required())
                    && !e.ordered
                {
                    // Inline `one of [...]` enumerations and built-in ones have no order.
                    let help = if e.name.starts_with("one of") {
                        "declare the enumeration under `enums:` in a data file, weakest member first, and use its name as the input's type"
                    } else {
                        "compare its members with `==`, `!=` or `in`"
                    };
                    self.err(
                        codes::NOT_ORDERED,
                        span,
                        format!(
                            "`{}` has no order, so `{}` cannot compare it",
                            e.name,
                            op.symbol()
                        ),
                        "compared by order",
                        Some(String::from(help)),
                    );
                    return broken(span);
                }
                // Two values of one type that has no order (conditions,
                // lists, records): the type is the problem, not the pair.
                if lhs_ty.required() == rhs_ty.required()
                    && matches!(lhs_ty.required(), Ty::Bool | Ty::List(_) | Ty::Record(_))
                {
                    self.err(
                        codes::NOT_ORDERED,
                        span,
                        format!("{} has no order, so `{}` cannot compare it", lhs_ty.required(), op.symbol()),
                        "compared by order",
                        Some(String::from(
                            "compare with `==` or `!=`; order comparisons take numbers, durations, dates, strings or members of an ordered enumeration",
                        )),
                    );
                    return broken(span);
                }
                self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty))
            }
            BinaryOp::In | BinaryOp::NotIn => {
                if lhs_ty.is_optional() {
                    self.maybe_absent(lhs, &lhs_ty);
                    return broken(span);
                }
                match rhs_ty.required() {
                    Ty::List(item) => {
                        if unify(&lhs_ty, item).is_none() {
                            return self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty));
                        }
                        // `"private" in key.tiers` as well as `provider.tier in ["private"]`.
                        self.enum_pair(&lhs_ty, rhs, &rhs_ty, lhs);
                    }
                    Ty::Unknown => {}
                    _ => {
                        self.err(
                            codes::BAD_OPERANDS,
                            rhs.span,
                            format!(
                                "`{}` needs a list on its right, found {rhs_ty}",
                                op.symbol()
                            ),
                            "not a list",
                            Some(format!(
                                "write a list on the right (`x {} [a, b]`), or compare one value with `==`",
                                op.symbol()
                            )),
                        );
                        return broken(span);
                    }
                }
                (Ty::Bool, term(lhs_term, rhs_term))
            }
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => {
                let optional = lhs_ty.is_optional() || rhs_ty.is_optional();
                let result = match (op, lhs_ty.required(), rhs_ty.required()) {
                    (_, Ty::Unknown, _) | (_, _, Ty::Unknown) => Ty::Unknown,
                    (_, Ty::Number, Ty::Number) => Ty::Number,
                    (BinaryOp::Add | BinaryOp::Sub, Ty::Duration, Ty::Duration) => Ty::Duration,
                    (BinaryOp::Add, Ty::String, Ty::String) => Ty::String,
                    (BinaryOp::Mul, Ty::Number, Ty::Duration)
                    | (BinaryOp::Mul | BinaryOp::Div, Ty::Duration, Ty::Number) => Ty::Duration,
                    (BinaryOp::Div, Ty::Duration, Ty::Duration) => Ty::Number,
                    _ => return self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty)),
                };
                let ty = if optional { result.optional() } else { result };
                (ty, term(lhs_term, rhs_term))
            }
        }
    }

    /// For an enumeration, or a list of its members, compared with a
    /// literal, checks the literal's member: `key.tiers == ["privat"]` would
    /// otherwise be silently never true.
    fn enum_pair(&mut self, lhs_ty: &Ty, rhs: &Expr, rhs_ty: &Ty, lhs: &Expr) {
        if let Some(e) = enum_or_list_of_enum(lhs_ty) {
            self.enum_literal(&e, rhs);
        }
        if let Some(e) = enum_or_list_of_enum(rhs_ty) {
            self.enum_literal(&e, lhs);
        }
    }

    fn path(
        &mut self,
        segments: &[Ident],
        expr: &Expr,
        place: &Place,
        scope: &Scope,
    ) -> (Ty, Term) {
        let span = expr.span;
        let Some(first) = segments.first() else {
            return broken(span);
        };
        enum Head {
            Definition(DefRef),
            Root(Root),
            Scored,
        }
        let (mut ty, head) = if first.name == "self" && scope.in_aggregate {
            (Ty::Candidate, Head::Scored)
        } else if first.name == "self" {
            self.err(
                codes::AGGREGATE_MISUSE,
                first.span,
                String::from("`self` only exists inside an aggregate such as `min_of(...)`"),
                "outside an aggregate",
                Some(String::from(
                    "outside aggregates, read the candidate's fields directly",
                )),
            );
            return broken(span);
        } else if let Some((ty, definition)) = self.named_value(first, place, scope) {
            (ty, Head::Definition(definition))
        } else if let Some(root) = Root::from_name(&first.name) {
            if root == Root::Input
                && let Some(field) = segments.get(1)
            {
                self.input_reads.insert(field.name.clone());
            }
            match self.root(root, first, place, scope) {
                Some(ty) => (ty, Head::Root(root)),
                None => return broken(span),
            }
        } else if self.broken_names.contains(&first.name) {
            return broken(span);
        } else {
            let mut known: Vec<String> = self.value_names();
            known.extend(
                Root::ALL
                    .iter()
                    .filter(|root| {
                        place.roots.contains(**root) || (scope.in_aggregate && root.is_candidate())
                    })
                    .map(|root| root.name().to_string()),
            );
            let help = suggest(&first.name, known.iter().map(String::as_str))
                .map(|close| format!("did you mean {close}?"));
            self.err(
                codes::UNKNOWN_NAME,
                first.span,
                format!("`{}` is not defined", first.name),
                "unknown name",
                help.or_else(|| {
                    Some(String::from(
                        "names are `let` and `merge` definitions or roots such as `request`, `provider`, `route`",
                    ))
                }),
            );
            return broken(span);
        };

        // Type the rest of the path, remembering a candidate's `let` members.
        let path_start = first.span.start;
        let mut optional = false;
        let mut candidate_let: Option<(usize, usize)> = None;
        for (index, segment) in segments.iter().enumerate().skip(1) {
            if ty.is_optional() {
                optional = true;
            }
            let prefix: Vec<&str> = segments
                .iter()
                .take(index)
                .map(|s| s.name.as_str())
                .collect();
            let prefix = prefix.join(".");
            ty = match ty.required().clone() {
                Ty::Unknown => return broken(span),
                Ty::Record(record) => match record.field(&segment.name) {
                    Some(field) => field.clone(),
                    // The data refused its declaration and said why.
                    None if self.refused_attribute(&prefix, &segment.name) => {
                        return broken(span);
                    }
                    None => {
                        let help = suggest(
                            &segment.name,
                            record.fields.iter().map(|(f, _)| f.as_str()),
                        )
                        .map(|close| format!("did you mean {prefix}.{close}?"))
                        .or_else(|| {
                            let fields: Vec<&str> =
                                record.fields.iter().map(|(f, _)| f.as_str()).collect();
                            let name = &segment.name;
                            Some(match (fields.is_empty(), declared_where(&prefix, name)) {
                                (true, Some(place)) => format!(
                                    "nothing is declared for `{prefix}`; add `{name}` {place}"
                                ),
                                (false, Some(place)) => format!(
                                    "`{prefix}` has: {}; add others {place}",
                                    fields.join(", ")
                                ),
                                (_, None) => format!("`{prefix}` has: {}", fields.join(", ")),
                            })
                        });
                        self.err(
                            codes::UNKNOWN_ATTRIBUTE,
                            Span::new(path_start, segment.span.end),
                            format!("`{prefix}` has no attribute `{}`", segment.name),
                            &format!("not an attribute of `{prefix}`"),
                            help,
                        );
                        return broken(span);
                    }
                },
                Ty::Candidate => match self.candidate_member(segment, place) {
                    Some((ty, let_index)) => {
                        if let Some(let_index) = let_index {
                            candidate_let = Some((index, let_index));
                        }
                        ty
                    }
                    None => {
                        let mut fields: Vec<String> =
                            CANDIDATE_FIELDS.iter().map(|s| s.to_string()).collect();
                        fields.extend(self.candidate_let_names());
                        let help = suggest(&segment.name, fields.iter().map(String::as_str))
                            .map(|close| format!("did you mean {prefix}.{close}?"))
                            .or_else(|| Some(format!("a candidate has: {}", fields.join(", "))));
                        self.err(
                            codes::UNKNOWN_ATTRIBUTE,
                            Span::new(path_start, segment.span.end),
                            format!("a candidate has no attribute `{}`", segment.name),
                            "not an attribute of a candidate",
                            help,
                        );
                        return broken(span);
                    }
                },
                other => {
                    self.err(
                        codes::UNKNOWN_ATTRIBUTE,
                        Span::new(path_start, segment.span.end),
                        format!("`{prefix}` is {other} and has no attributes"),
                        "no attributes here",
                        Some(format!(
                            "use `{prefix}` itself, without `.{}`",
                            segment.name
                        )),
                    );
                    return broken(span);
                }
            };
        }
        if optional {
            ty = ty.optional();
        }
        if let Some(path) = expr.path_text()
            && scope.facts.knows(&path)
        {
            ty = ty.required().clone();
        }

        let names: Vec<&str> = segments.iter().map(|s| s.name.as_str()).collect();
        let term = match head {
            Head::Definition(definition) => {
                let base = match definition {
                    DefRef::Let(index) => Term::new(TermKind::Let(index), span),
                    DefRef::Merge(index) => Term::new(TermKind::Merge(index), span),
                };
                fields_of(base, names.get(1..).unwrap_or(&[]), span)
            }
            Head::Scored => self.candidate_term(Who::Scored, &names, candidate_let, span),
            Head::Root(Root::Prev) => self.candidate_term(Who::Prev, &names, candidate_let, span),
            Head::Root(Root::First) => self.candidate_term(Who::First, &names, candidate_let, span),
            Head::Root(Root::Served) => {
                self.candidate_term(Who::Served, &names, candidate_let, span)
            }
            Head::Root(root) => self.root_term(root, names.get(1..).unwrap_or(&[]), span),
        };
        (ty, term)
    }

    /// `prev.x.y`, `first.own`, `served.provider.name`, `self.cost`.
    fn candidate_term(
        &self,
        who: Who,
        names: &[&str],
        candidate_let: Option<(usize, usize)>,
        span: Span,
    ) -> Term {
        let inner = match (names.get(1), candidate_let) {
            // The candidate itself: present when there is one.
            (None, _) => Term::constant(Value::Bool(true), span),
            (Some(_), Some((_, let_index))) => fields_of(
                Term::new(TermKind::Let(let_index), span),
                names.get(2..).unwrap_or(&[]),
                span,
            ),
            (Some(root_name), None) => match Root::from_name(root_name) {
                Some(root) => self.root_term(root, names.get(2..).unwrap_or(&[]), span),
                None => Term::constant(Value::Null, span),
            },
        };
        Term::new(TermKind::At(who, boxed(inner)), span)
    }

    /// What `root.fields...` reads.
    fn root_term(&self, root: Root, fields: &[&str], span: Span) -> Term {
        let read = |read: Read| Term::read(read, span);
        let schema = &self.data.schema;
        let attr = |table: &crate::data::schema::AttrTable, name: &str| table.index_of(name);
        let first = fields.first().copied();
        let rest = fields.get(1..).unwrap_or(&[]);
        let Some(field) = first else {
            return self.whole_record(root, span);
        };
        let term = match root {
            Root::Request => match field {
                "id" => read(Read::RequestId),
                "model" => read(Read::RequestModel),
                "pinned" => read(Read::RequestPinned),
                "endpoint" => read(Read::RequestEndpoint),
                "wire" => read(Read::RequestWire),
                "kind" => read(Read::RequestKind),
                "stream" => read(Read::RequestStream),
                "estimated_tokens" => read(Read::RequestEstimatedTokens),
                _ => read(Read::RequestParameters),
            },
            Root::Input => {
                let index = self
                    .inputs
                    .iter()
                    .position(|input| input.decl.name.name == field)
                    .unwrap_or(0);
                return read(Read::Input(
                    index,
                    rest.iter().map(|name| Arc::from(*name)).collect(),
                ));
            }
            Root::Tenant => match field {
                "id" => read(Read::TenantId),
                name => read(Read::TenantAttr(attr(&schema.tenant, name).unwrap_or(0))),
            },
            Root::Workspace => match field {
                "id" => read(Read::WorkspaceId),
                name => read(Read::WorkspaceAttr(
                    attr(&schema.workspace, name).unwrap_or(0),
                )),
            },
            Root::Key => match field {
                "id" => read(Read::KeyId),
                name => read(Read::KeyAttr(attr(&schema.key, name).unwrap_or(0))),
            },
            Root::Defaults => read(Read::Setting(attr(&schema.settings, field).unwrap_or(0))),
            Root::Deployment => read(Read::DeploymentAttr(
                attr(&schema.deployment, field).unwrap_or(0),
            )),
            Root::Model => match field {
                "id" => read(Read::ModelId),
                "kind" => read(Read::ModelKind),
                "aliases" => read(Read::ModelAliases),
                name => read(Read::ModelAttr(attr(&schema.model, name).unwrap_or(0))),
            },
            Root::Provider => match field {
                "id" => read(Read::ProviderId),
                "name" => read(Read::ProviderName),
                "aliases" => read(Read::ProviderAliases),
                "format" => read(Read::ProviderFormat),
                "endpoints" => read(Read::ProviderEndpoints),
                "priority" => read(Read::ProviderPriority),
                "listed" => read(Read::ProviderListed),
                name => read(Read::ProviderAttr(
                    attr(&schema.provider, name).unwrap_or(0),
                )),
            },
            Root::Route => match field {
                "upstream_model" => read(Read::RouteUpstreamModel),
                "price" => {
                    let price = |f: PriceField| read(Read::RoutePrice(f));
                    return match rest.first().copied() {
                        Some("input") => price(PriceField::Input),
                        Some("output") => price(PriceField::Output),
                        Some("cache_read") => price(PriceField::CacheRead),
                        Some("cache_write") => price(PriceField::CacheWrite),
                        _ => Term::new(
                            TermKind::Record(vec![
                                (Arc::from("input"), price(PriceField::Input)),
                                (Arc::from("output"), price(PriceField::Output)),
                                (Arc::from("cache_read"), price(PriceField::CacheRead)),
                                (Arc::from("cache_write"), price(PriceField::CacheWrite)),
                            ]),
                            span,
                        ),
                    };
                }
                "capabilities" => read(Read::RouteCapabilities),
                name => read(Read::RouteAttr(attr(&schema.route, name).unwrap_or(0))),
            },
            Root::Credential => match field {
                "id" => read(Read::CredentialId),
                "owned" => read(Read::CredentialOwned),
                name => read(Read::CredentialAttr(
                    attr(&schema.credential, name).unwrap_or(0),
                )),
            },
            Root::Health => match field {
                "paused" => read(Read::HealthPaused),
                "penalized" => read(Read::HealthPenalized),
                _ => read(Read::HealthStrikes),
            },
            Root::Stats => match field {
                "samples" => read(Read::StatsSamples),
                "success_rate" => read(Read::StatsSuccessRate),
                "ttft" => read(Read::StatsTtft),
                "latency" => read(Read::StatsLatency),
                _ => read(Read::StatsThroughput),
            },
            Root::Capacity => match field {
                "full" => read(Read::CapacityFull),
                _ => read(Read::CapacityInFlight),
            },
            Root::Requested => match field {
                "index" => read(Read::RequestedIndex),
                "kind" => read(Read::RequestedKind),
                _ => read(Read::RequestedId),
            },
            Root::Upstream => match field {
                "status" => read(Read::UpstreamStatus),
                "retry_after" => read(Read::UpstreamRetryAfter),
                _ => {
                    let error = |r: Read| read(r);
                    return match rest.first().copied() {
                        Some("code") => error(Read::UpstreamErrorCode),
                        Some("type") => error(Read::UpstreamErrorType),
                        Some("message") => error(Read::UpstreamErrorMessage),
                        _ => Term::new(
                            TermKind::Record(vec![
                                (Arc::from("code"), error(Read::UpstreamErrorCode)),
                                (Arc::from("type"), error(Read::UpstreamErrorType)),
                                (Arc::from("message"), error(Read::UpstreamErrorMessage)),
                            ]),
                            span,
                        ),
                    };
                }
            },
            // Scalar roots have no fields; `check` refused such paths.
            _ => return Term::constant(Value::Null, span),
        };
        fields_of(term, rest, span)
    }

    /// A root used as a whole value: a record of all its fields, or the
    /// scalar it is.
    fn whole_record(&self, root: Root, span: Span) -> Term {
        let read = |read: Read| Term::read(read, span);
        match root {
            Root::Attempt => read(Read::Attempt),
            Root::Attempts => read(Read::Attempts),
            Root::Retries => read(Read::Retries),
            Root::Elapsed => read(Read::Elapsed),
            Root::FreeIn => read(Read::FreeIn),
            Root::It => read(Read::ShorthandValue),
            Root::Succeeded => read(Read::Succeeded),
            Root::Input => read(Read::Input(usize::MAX, Vec::new())),
            Root::Prev | Root::First | Root::Served => Term::constant(Value::Bool(true), span),
            _ => {
                let record_ty = match root {
                    Root::Request => &self.roots.request,
                    Root::Tenant => &self.roots.tenant,
                    Root::Workspace => &self.roots.workspace,
                    Root::Key => &self.roots.key,
                    Root::Defaults => &self.roots.defaults,
                    Root::Deployment => &self.roots.deployment,
                    Root::Model => &self.roots.model,
                    Root::Provider => &self.roots.provider,
                    Root::Route => &self.roots.route,
                    Root::Credential => &self.roots.credential,
                    Root::Health => &self.roots.health,
                    Root::Stats => &self.roots.stats,
                    Root::Capacity => &self.roots.capacity,
                    Root::Requested => &self.roots.requested,
                    _ => &self.roots.upstream,
                };
                let Ty::Record(record) = record_ty else {
                    return Term::constant(Value::Null, span);
                };
                let fields = record
                    .fields
                    .iter()
                    .map(|(name, _)| {
                        (
                            Arc::from(name.as_str()),
                            self.root_term(root, &[name.as_str()], span),
                        )
                    })
                    .collect();
                Term::new(TermKind::Record(fields), span)
            }
        }
    }

    /// A root's type, if this place may read it.
    fn root(&mut self, root: Root, ident: &Ident, place: &Place, scope: &Scope) -> Option<Ty> {
        let allowed = place.roots.contains(root)
            || (scope.in_aggregate && root.is_candidate())
            || (root == Root::It && scope.it.is_some());
        if !allowed {
            self.err(
                codes::NOT_IN_SCOPE,
                ident.span,
                format!("`{}` is not available in {}", root.name(), place.name),
                "not available here",
                Some(format!(
                    "`{}` can be used in {}",
                    root.name(),
                    root.available_in()
                )),
            );
            return None;
        }
        if root.is_candidate() {
            self.usage.candidate = true;
        }
        match root {
            Root::Retries => self.usage.retries = true,
            Root::Elapsed => self.usage.elapsed = true,
            Root::Upstream | Root::Attempt => {
                self.usage.upstream_at = self.usage.upstream_at.or(Some(ident.span));
            }
            _ => {}
        }
        let types = &self.roots;
        Some(match root {
            Root::Request => types.request.clone(),
            Root::Input => self.input_ty.clone(),
            Root::Tenant => types.tenant.clone(),
            Root::Workspace => types.workspace.clone(),
            Root::Key => types.key.clone(),
            Root::Defaults => types.defaults.clone(),
            Root::Deployment => types.deployment.clone(),
            Root::Model => types.model.clone(),
            Root::Provider => types.provider.clone(),
            Root::Route => types.route.clone(),
            Root::Credential => types.credential.clone(),
            Root::Health => types.health.clone(),
            Root::Stats => types.stats.clone(),
            Root::Capacity => types.capacity.clone(),
            Root::Requested => types.requested.clone(),
            Root::Upstream => types.upstream.clone(),
            Root::Prev | Root::First => Ty::Candidate,
            Root::Served => Ty::Candidate.optional(),
            Root::Attempt | Root::Attempts | Root::Retries => Ty::Number,
            Root::Elapsed => Ty::Duration,
            Root::FreeIn => Ty::Duration.optional(),
            Root::It => scope.it.clone().unwrap_or(Ty::Unknown),
            Root::Succeeded => Ty::Bool,
        })
    }

    /// A field of a candidate value: a candidate root, or a `let` that
    /// depends on the candidate (with its index).
    fn candidate_member(&mut self, segment: &Ident, place: &Place) -> Option<(Ty, Option<usize>)> {
        if let Some(ty) = self.roots.candidate_field(&segment.name) {
            return Some((ty.clone(), None));
        }
        let (ty, usage, definition) = self.let_type(&segment.name)?;
        let DefRef::Let(index) = definition else {
            return None;
        };
        if !usage.candidate {
            return None;
        }
        if usage.aggregate && !place.aggregates {
            self.err(
                codes::AGGREGATE_MISUSE,
                segment.span,
                format!(
                    "`{}` uses an aggregate, which needs a candidate set",
                    segment.name
                ),
                "no candidate set here",
                Some(String::from(
                    "aggregates are available in eligibility, order, sorts, balance and listing",
                )),
            );
        }
        Some((ty, Some(index)))
    }

    /// A `let` or `merge` name used as a value.
    fn named_value(&mut self, ident: &Ident, place: &Place, scope: &Scope) -> Option<(Ty, DefRef)> {
        let (ty, usage, definition) = self.let_type(&ident.name)?;
        if usage.candidate && !place.candidate_lets && !scope.in_aggregate {
            self.err(
                codes::NOT_IN_SCOPE,
                ident.span,
                format!("`{}` depends on the candidate and is not available in {}", ident.name, place.name),
                "depends on the candidate",
                Some(String::from(
                    "definitions that read `provider`, `route`, `model` or other candidate fields can be used where a candidate is looked at",
                )),
            );
            return Some((Ty::Unknown, definition));
        }
        if usage.aggregate && !place.aggregates {
            self.err(
                codes::AGGREGATE_MISUSE,
                ident.span,
                format!(
                    "`{}` uses an aggregate, which needs a candidate set",
                    ident.name
                ),
                "no candidate set here",
                Some(String::from(
                    "aggregates are available in eligibility, order, sorts, balance and listing",
                )),
            );
            return Some((Ty::Unknown, definition));
        }
        self.usage.merge(usage);
        Some((ty, definition))
    }

    fn call(
        &mut self,
        name: &Ident,
        args: &[Expr],
        expr: &Expr,
        place: &Place,
        scope: &Scope,
    ) -> (Ty, Term) {
        let span = expr.span;
        let arity = |this: &mut Self, expected: &str| {
            this.err(
                codes::ARGUMENT_COUNT,
                span,
                format!("`{}` takes {expected}, found {}", name.name, args.len()),
                "this call",
                Some(String::from(
                    "docs/language.md lists every function with its arguments",
                )),
            );
            broken(span)
        };
        let checked: Vec<(Ty, Term)> = args
            .iter()
            .map(|arg| self.expr(arg, place, scope))
            .collect();
        let types: Vec<Ty> = checked.iter().map(|(ty, _)| ty.clone()).collect();
        let Some(function) = Function::by_name(&name.name) else {
            let help = suggest(&name.name, FUNCTIONS.iter().copied())
                .map(|close| format!("did you mean {close}?"))
                .or_else(|| Some(format!("the functions are: {}", FUNCTIONS.join(", "))));
            self.err(
                codes::UNKNOWN_FUNCTION,
                name.span,
                format!("there is no function `{}`", name.name),
                "unknown function",
                help,
            );
            return broken(span);
        };
        // Arguments converted to the result type where values flow through.
        let build = |ty: Ty, coerce_to: Option<&Ty>, checked: Vec<(Ty, Term)>| {
            let terms = checked
                .into_iter()
                .map(|(arg_ty, term)| match coerce_to {
                    Some(target) => coerce(term, &arg_ty, target),
                    None => term,
                })
                .collect();
            (ty, Term::new(TermKind::Call(function, terms), span))
        };
        match function {
            Function::Min | Function::Max => {
                if args.len() < 2 {
                    return arity(self, "two or more values");
                }
                let mut result = Ty::Unknown;
                for (arg, ty) in args.iter().zip(&types) {
                    match unify(result.required(), ty.required()) {
                        Some(unified) => result = unified,
                        None => return self.bad_operands(expr, &name.name, &result, Some(ty)),
                    }
                    // Strings are allowed only as members of an enumeration.
                    if !ty.is_ordered() || matches!(ty.required(), Ty::Bool) {
                        self.err(
                            codes::TYPE_MISMATCH,
                            arg.span,
                            format!("`{}` compares numbers, durations, dates or ordered enumerations, found {ty}", name.name),
                            "cannot be ordered this way",
                            Some(if matches!(ty.required(), Ty::Bool) {
                                String::from("for booleans, `a and b` is true when both are (the minimum) and `a or b` when either is (the maximum)")
                            } else {
                                format!("give `{}` numbers, durations, dates or members of one enumeration", name.name)
                            }),
                        );
                        return broken(span);
                    }
                }
                if matches!(result.required(), Ty::String) {
                    self.err(
                        codes::TYPE_MISMATCH,
                        span,
                        format!("`{}` compares numbers, durations, dates or ordered enumerations, found string", name.name),
                        "cannot be ordered this way",
                        Some(format!("`{}` takes strings only as members of an enumeration it compares them with (`{}(provider.tier, \"standard\")`); to pick one of two strings write `if COND then \"a\" else \"b\"`", name.name, name.name)),
                    );
                    return broken(span);
                }
                if let Ty::Enum(e) = result.required() {
                    let e = e.clone();
                    for arg in args {
                        self.enum_literal(&e, arg);
                    }
                }
                let ty = if types.iter().all(Ty::is_optional) {
                    result.clone().optional()
                } else {
                    result.clone()
                };
                build(ty, Some(&result), checked)
            }
            Function::Clamp => {
                if args.len() != 3 {
                    return arity(self, "three values: the value, the lowest and the highest");
                }
                let value = types.first().cloned().unwrap_or(Ty::Unknown);
                if !matches!(value.required(), Ty::Number | Ty::Duration | Ty::Unknown) {
                    return self.bad_operands(expr, "clamp", &value, None);
                }
                for (arg, ty) in args.iter().zip(&types).skip(1) {
                    self.require_type(arg, ty, value.required());
                }
                build(value, None, checked)
            }
            Function::Coalesce => {
                if args.len() < 2 {
                    return arity(self, "two or more values");
                }
                let mut result = Ty::Unknown;
                for (index, (arg, ty)) in args.iter().zip(&types).enumerate() {
                    match unify(result.required(), ty.required()) {
                        Some(unified) => result = unified,
                        None => {
                            self.err(
                                codes::TYPE_MISMATCH,
                                arg.span,
                                format!("`coalesce` values must have one type; this is {ty}, earlier ones are {result}"),
                                "different type",
                                type_hint(ty, &result),
                            );
                            return broken(span);
                        }
                    }
                    if index + 1 == args.len() && ty.is_optional() {
                        result = result.optional();
                    }
                }
                if let Ty::Enum(e) = result.required() {
                    let e = e.clone();
                    for arg in args {
                        self.enum_literal(&e, arg);
                    }
                }
                let target = result.clone();
                build(result, Some(&target), checked)
            }
            Function::Present => {
                if args.len() != 1 {
                    return arity(self, "one value");
                }
                build(Ty::Bool, None, checked)
            }
            Function::Empty | Function::Len => {
                if args.len() != 1 {
                    return arity(self, "one list");
                }
                if let (Some(arg), Some(ty)) = (args.first(), types.first()) {
                    self.require_list(arg, ty);
                }
                let ty = if function == Function::Len {
                    Ty::Number
                } else {
                    Ty::Bool
                };
                build(ty, None, checked)
            }
            Function::Intersects | Function::Subset => {
                if args.len() != 2 {
                    return arity(self, "two lists");
                }
                for (arg, ty) in args.iter().zip(&types) {
                    self.require_list(arg, ty);
                }
                if let (Some(a), Some(b)) = (types.first(), types.get(1))
                    && unify(a.required(), b.required()).is_none()
                {
                    return self.bad_operands(expr, &name.name, a, Some(b));
                }
                if let ([a, b], [a_ty, b_ty]) = (args, types.as_slice()) {
                    self.enum_pair(a_ty, b, b_ty, a);
                }
                build(Ty::Bool, None, checked)
            }
            Function::IndexOf => {
                if args.len() != 2 {
                    return arity(self, "a list and a value");
                }
                if let (Some(arg), Some(ty)) = (args.first(), types.first()) {
                    self.require_list(arg, ty);
                }
                if let (Some(arg), Some(ty)) = (args.get(1), types.get(1))
                    && ty.is_optional()
                {
                    self.maybe_absent(arg, ty);
                }
                if let ([list, value], [list_ty, value_ty]) = (args, types.as_slice()) {
                    self.enum_pair(list_ty, value, value_ty, list);
                }
                build(Ty::Number.optional(), None, checked)
            }
            Function::Contains | Function::StartsWith => {
                if args.len() != 2 {
                    return arity(self, "two strings");
                }
                for (arg, ty) in args.iter().zip(&types) {
                    self.require_type(arg, ty, &Ty::String);
                }
                build(Ty::Bool, None, checked)
            }
            Function::Lower => {
                if args.len() != 1 {
                    return arity(self, "one string");
                }
                if let (Some(arg), Some(ty)) = (args.first(), types.first()) {
                    self.require_type(arg, ty, &Ty::String);
                }
                build(Ty::String, None, checked)
            }
            Function::Seconds => {
                if args.len() != 1 {
                    return arity(self, "one duration");
                }
                let ty = types.first().cloned().unwrap_or(Ty::Unknown);
                if !matches!(ty.required(), Ty::Duration | Ty::Unknown) {
                    return self.bad_operands(expr, "seconds", &ty, None);
                }
                let result = if ty.is_optional() {
                    Ty::Number.optional()
                } else {
                    Ty::Number
                };
                build(result, None, checked)
            }
            Function::Backoff => {
                if !(4..=5).contains(&args.len()) {
                    return arity(
                        self,
                        "four values: base, factor, maximum and jitter, and optionally the step it has reached (the rule's `retries` unless given)",
                    );
                }
                if !place.roots.contains(Root::Retries) {
                    self.err(
                        codes::NOT_IN_SCOPE,
                        name.span,
                        format!("`backoff` is not available in {}", place.name),
                        "not available here",
                        Some(String::from("`backoff` grows with the retries of a request; use it in `retry after`")),
                    );
                }
                self.usage.retries = true;
                let expected = [
                    Ty::Duration,
                    Ty::Number,
                    Ty::Duration,
                    Ty::Number,
                    Ty::Number,
                ];
                for ((arg, ty), expected) in args.iter().zip(&types).zip(expected.iter()) {
                    self.require_type(arg, ty, expected);
                }
                build(Ty::Duration, None, checked)
            }
        }
    }

    /// Lists may be absent (an absent list behaves as empty in list functions).
    fn require_list(&mut self, arg: &Expr, ty: &Ty) {
        if !matches!(ty.required(), Ty::List(_) | Ty::Unknown) {
            self.err(
                codes::TYPE_MISMATCH,
                arg.span,
                format!("expected a list, found {ty}"),
                "not a list",
                Some(String::from(
                    "pass a list, such as `[\"a\", \"b\"]` or a `list<...>` attribute or input; an absent list counts as empty",
                )),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn aggregate(
        &mut self,
        function: Aggregate,
        function_span: Span,
        value: &Expr,
        filter: Option<&Expr>,
        expr: &Expr,
        place: &Place,
        scope: &Scope,
    ) -> (Ty, Term) {
        let span = expr.span;
        if !place.aggregates || scope.in_aggregate {
            let why = if scope.in_aggregate {
                String::from("aggregates cannot be nested")
            } else {
                format!(
                    "`{}` needs a set of candidates, and {} has none",
                    function.name(),
                    place.name
                )
            };
            self.err(
                codes::AGGREGATE_MISUSE,
                function_span,
                why,
                "aggregate here",
                Some(String::from(
                    "aggregates are available in eligibility, order, sorts, balance and listing",
                )),
            );
            return broken(span);
        }
        self.usage.aggregate = true;
        let outside = scope.facts.outside_candidates(&self.candidate_let_names());
        let inner = Scope {
            in_aggregate: true,
            facts: match filter {
                Some(filter) => outside.with(facts_if_true(filter)),
                None => outside.clone(),
            },
            it: None,
        };
        let filter_term = match filter {
            Some(filter) => {
                let filter_scope = Scope {
                    in_aggregate: true,
                    facts: outside.clone(),
                    it: None,
                };
                let (ty, term) = self.expr(filter, place, &filter_scope);
                self.require_type(filter, &ty, &Ty::Bool);
                Some(boxed(term))
            }
            None => None,
        };
        let (ty, value_term) = self.expr(value, place, &inner);
        let term = Term::new(
            TermKind::Aggregate(function, boxed(value_term), filter_term),
            span,
        );
        match function {
            Aggregate::AllOf | Aggregate::AnyOf | Aggregate::CountOf => {
                self.require_type(value, &ty, &Ty::Bool);
                let result = if function == Aggregate::CountOf {
                    Ty::Number
                } else {
                    Ty::Bool
                };
                (result, term)
            }
            Aggregate::ListOf => (Ty::List(Box::new(ty.required().clone())), term),
            Aggregate::MinOf | Aggregate::MaxOf | Aggregate::AvgOf => {
                let ok = match function {
                    Aggregate::AvgOf => {
                        matches!(ty.required(), Ty::Number | Ty::Duration | Ty::Unknown)
                    }
                    _ => ty.is_ordered() && !matches!(ty.required(), Ty::Bool),
                };
                if !ok {
                    self.err(
                        codes::TYPE_MISMATCH,
                        value.span,
                        match function {
                            Aggregate::AvgOf => {
                                format!("`avg_of` needs numbers or durations, found {ty}")
                            }
                            _ => format!(
                                "`{}` needs numbers, durations or another ordered value, found {ty}",
                                function.name()
                            ),
                        },
                        "cannot aggregate this",
                        Some(match (function, ty.required()) {
                            (_, Ty::Bool) => String::from(
                                "for a condition, `all_of(C)` holds when it does for every candidate and `any_of(C)` when it does for one",
                            ),
                            (Aggregate::AvgOf, _) => String::from(
                                "`avg_of` averages a number or a duration per candidate",
                            ),
                            _ => format!(
                                "give `{}` a number, duration, date or enumeration member per candidate",
                                function.name()
                            ),
                        }),
                    );
                    return broken(span);
                }
                // No candidate, or none with a value, gives no value.
                (ty.required().clone().optional(), term)
            }
        }
    }
}

/// `base.f1.f2...` as field accesses on a record value.
fn fields_of(base: Term, fields: &[&str], span: Span) -> Term {
    fields.iter().fold(base, |term, field| {
        Term::new(TermKind::Field(boxed(term), Arc::from(*field)), span)
    })
}

/// A hint for a type mismatch.
fn type_hint(actual: &Ty, expected: &Ty) -> Option<String> {
    match (actual.required(), expected.required()) {
        (Ty::Number, Ty::Duration) => Some(String::from(
            "write durations with a unit, such as `10s` or `500ms`",
        )),
        (Ty::String, Ty::Duration) => Some(String::from(
            "a duration is written with a unit and without quotes, such as `10s` or `500ms`",
        )),
        (Ty::Duration, Ty::Number) => {
            Some(String::from("`seconds(d)` turns a duration into a number"))
        }
        (Ty::String, Ty::Bool) | (Ty::Number, Ty::Bool) => Some(String::from(
            "conditions must be true or false; compare with `==` or `>`",
        )),
        (Ty::String, Ty::Number) => Some(String::from(
            "a number is written without quotes, such as `3`",
        )),
        (Ty::Number | Ty::Bool, Ty::String) => Some(String::from(
            "text is written in double quotes, such as `\"503\"`",
        )),
        _ => Some(format!(
            "this place takes {expected}; every branch of an `if` and every argument of a `coalesce` must be one too"
        )),
    }
}

/// Where a root's attributes are declared, for a hint when one is missing:
/// what a policy may read is not all written in the policy.
fn declared_where(root: &str, name: &str) -> Option<String> {
    Some(match root {
        "defaults" => String::from("under `settings:` in the tenants file"),
        "input" => format!("as `input {name} from body \"FIELD\" : TYPE`"),
        "deployment" | "provider" | "route" | "model" | "credential" => {
            format!("under `attributes:` `{root}:` in the catalog")
        }
        "tenant" | "workspace" | "key" => {
            format!("under `attributes:` `{root}:` in the tenants file")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::source::SourceMap;

    fn stops(condition: &str) -> bool {
        let source = SourceMap::default().add("condition", condition);
        let (expr, problems) = crate::language::parse::parse_expression(source, condition);
        assert!(problems.is_empty(), "{condition}: {problems:?}");
        stops_retrying(&expr.unwrap(), &|_| None)
    }

    fn parsed(text: &str) -> Expr {
        let source = SourceMap::default().add("expression", text);
        crate::language::parse::parse_expression(source, text)
            .0
            .unwrap()
    }

    #[test]
    fn names_are_followed_to_what_they_stand_for() {
        let limit = parsed("3");
        let ceiling = (parsed("input.n"), parsed("defaults.max_retries"));
        let chosen = (parsed("input.n"), parsed("input.m"));
        let loose = (parsed("input.n"), parsed("defaults.unset"));
        let lookup = |name: &str| match name {
            "limit" => Some(Named::Let(&limit)),
            "ceiling" => Some(Named::Merge(MergeOp::Min, &ceiling.0, &ceiling.1)),
            "chosen" => Some(Named::Merge(MergeOp::First, &chosen.0, &chosen.1)),
            "input.bounded" => Some(Named::BoundedInput),
            "defaults.unset" => Some(Named::MayBeAbsent),
            "loose" => Some(Named::Merge(MergeOp::Min, &loose.0, &loose.1)),
            _ => None,
        };
        let stops = |text: &str| stops_retrying(&parsed(text), &lookup);
        assert!(stops("retries < limit"));
        assert!(stops("retries < ceiling"));
        // A setting with no default bounds nothing where no layer sets it.
        assert!(!stops("present(loose) and retries < loose"));
        assert!(!stops(
            "present(input.n) and retries < min(input.n, defaults.unset)"
        ));
        assert!(stops("retries < min(input.n, coalesce(defaults.unset, 3))"));
        assert!(stops("retries < input.bounded"));
        assert!(!stops("retries < chosen"), "the client chooses it");
        assert!(!stops("retries < input.n"));
        let bounds = |text: &str| bounds_time(&parsed(text), &lookup);
        assert!(bounds("30s"));
        assert!(bounds("defaults.retry_window"));
        assert!(!bounds("coalesce(input.budget, 10s)"), "the client sets it");
        assert!(!bounds("10s / 0"), "absent");
        assert!(
            !bounds("defaults.retry_window / defaults.max_retries"),
            "may be absent"
        );
    }

    #[test]
    fn a_retry_stops_only_if_its_condition_turns_false_for_good() {
        for bounded in [
            "retries < 3",
            "retries <= 2 and upstream.status == 503",
            "(retries < 2 or upstream.status == 503) and retries < 4",
            "elapsed < 30s",
            "not (retries >= 3)",
            "retries + 1 < 4",
            "2 * retries < 4",
            "elapsed - 1s < 2s",
            "elapsed < defaults.total_timeout",
            "3 > retries",
            "present(upstream.retry_after) and retries < 2",
            "present(upstream.retry_after) and elapsed + upstream.retry_after < 30s",
            "elapsed + coalesce(upstream.retry_after, 1s) <= 30s",
            "retries < coalesce(defaults.max_retries, 3)",
            "if present(defaults.max_retries) then retries < defaults.max_retries else retries < 2",
            "retries < deployment.max_retries",
            "seconds(elapsed) < 30",
            "retries in [0, 1, 2]",
            "attempt <= 3",
            "retries < min(input.n, 3)",
        ] {
            assert!(stops(bounded), "{bounded} is bounded");
        }
        for unbounded in [
            "retries >= 0",
            "retries != 5",
            "present(retries)",
            "retries * 0 < 1",
            "elapsed > 1s",
            "retries < 2 or upstream.status == 503",
            "retries < 2 or true",
            "retries < 3 implies upstream.status == 503",
            "min(retries, 5) < 10",
            "retries < input.max_retries",
            "retries - input.offset < 3",
            "upstream.status == 503",
            "retries < coalesce(input.n, 3)",
            "elapsed < upstream.retry_after",
            "retries + input.offset < 3",
            "attempts < 3",
        ] {
            assert!(!stops(unbounded), "{unbounded} is unbounded");
        }
    }
}
