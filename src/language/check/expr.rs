//! Name resolution and type checking of expressions.

use super::Checker;
use super::env::{Place, Root};
use super::types::{EnumTy, Ty, enums_compatible, fits, unify};
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::language::ast::*;
use crate::source::Span;
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
    /// What a rule's `when` condition proves for the rule's consequences.
    pub fn from_condition(condition: Option<&Expr>) -> Facts {
        Facts(condition.map(facts_if_true).unwrap_or_default())
    }

    fn with(&self, more: Vec<String>) -> Facts {
        let mut facts = self.0.clone();
        facts.extend(more);
        Facts(facts)
    }

    fn knows(&self, path: &str) -> bool {
        self.0.iter().any(|known| known == path)
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

/// The value of a condition built only from literals, if it has one.
pub fn constant_bool(expr: &Expr) -> Option<bool> {
    match &expr.kind {
        ExprKind::Literal(Literal::Bool(b)) => Some(*b),
        ExprKind::Unary(UnaryOp::Not, inner) => constant_bool(inner).map(|b| !b),
        ExprKind::Binary(op @ (BinaryOp::And | BinaryOp::Or | BinaryOp::Implies), lhs, rhs) => {
            let (l, r) = (constant_bool(lhs), constant_bool(rhs));
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
        _ => None,
    }
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

    /// Checks an expression and returns its type and what it read.
    pub fn check_expr(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> (Ty, Usage) {
        let saved = std::mem::take(&mut self.usage);
        let ty = self.expr(expr, place, scope);
        let usage = std::mem::replace(&mut self.usage, saved);
        self.usage.merge(usage);
        (ty, usage)
    }

    /// Checks that an expression has the expected type.
    pub fn expect(&mut self, expr: &Expr, expected: &Ty, place: &Place, scope: &Scope) -> Usage {
        let (ty, usage) = self.check_expr(expr, place, scope);
        self.require_type(expr, &ty, expected);
        usage
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

    /// A string literal compared with an enumeration must be one of its members.
    fn enum_literal(&mut self, enum_ty: &EnumTy, expr: &Expr) {
        let literals: Vec<(&str, Span)> = match &expr.kind {
            ExprKind::Literal(Literal::String(s)) => vec![(s.as_str(), expr.span)],
            ExprKind::List(items) => items
                .iter()
                .filter_map(|item| match &item.kind {
                    ExprKind::Literal(Literal::String(s)) => Some((s.as_str(), item.span)),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        for (text, span) in literals {
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

    fn expr(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> Ty {
        match &expr.kind {
            ExprKind::Literal(literal) => match literal {
                Literal::Bool(_) => Ty::Bool,
                Literal::Number(_) | Literal::Percent(_) => Ty::Number,
                Literal::Duration(_) => Ty::Duration,
                Literal::String(_) => Ty::String,
                Literal::Null => Ty::Null,
            },
            ExprKind::Path(segments) => self.path(segments, expr, place, scope),
            ExprKind::List(items) => {
                let mut item_ty = Ty::Unknown;
                for item in items {
                    let ty = self.expr(item, place, scope);
                    match unify(&item_ty, &ty) {
                        Some(unified) => item_ty = unified,
                        None => {
                            self.err(
                                codes::TYPE_MISMATCH,
                                item.span,
                                format!("list items must have one type; this is {ty}, earlier ones are {item_ty}"),
                                "different type",
                                None,
                            );
                        }
                    }
                }
                Ty::List(Box::new(item_ty))
            }
            ExprKind::Object(fields) => {
                if scope.it.is_none() {
                    self.err(
                        codes::TYPE_MISMATCH,
                        expr.span,
                        String::from("object values can only be written in an input's `shorthand`"),
                        "object here",
                        None,
                    );
                    return Ty::Unknown;
                }
                let fields = fields
                    .iter()
                    .map(|(name, value)| (name.name.clone(), self.expr(value, place, scope)))
                    .collect();
                Ty::Record(Arc::new(super::types::RecordTy {
                    name: String::from("shorthand"),
                    fields,
                }))
            }
            ExprKind::Unary(op, operand) => {
                let ty = self.expr(operand, place, scope);
                match op {
                    UnaryOp::Not => {
                        self.require_type(operand, &ty, &Ty::Bool);
                        Ty::Bool
                    }
                    UnaryOp::Negate => match ty.required() {
                        Ty::Number | Ty::Duration | Ty::Unknown => ty,
                        _ => self.bad_operands(expr, "-", &ty, None),
                    },
                }
            }
            ExprKind::Binary(op, lhs, rhs) => self.binary(*op, lhs, rhs, expr, place, scope),
            ExprKind::If(condition, then, otherwise) => {
                let cond_ty = self.expr(condition, place, scope);
                self.require_type(condition, &cond_ty, &Ty::Bool);
                let then_scope = Scope {
                    facts: scope.facts.with(facts_if_true(condition)),
                    ..scope.clone()
                };
                let else_scope = Scope {
                    facts: scope.facts.with(facts_if_false(condition)),
                    ..scope.clone()
                };
                let a = self.expr(then, place, &then_scope);
                let b = self.expr(otherwise, place, &else_scope);
                match unify(&a, &b) {
                    Some(ty) => {
                        if let Ty::Enum(e) = ty.required() {
                            let e = e.clone();
                            self.enum_literal(&e, then);
                            self.enum_literal(&e, otherwise);
                        }
                        ty
                    }
                    None => {
                        self.err(
                            codes::TYPE_MISMATCH,
                            otherwise.span,
                            format!("both branches of `if` must have one type; `then` is {a}, `else` is {b}"),
                            &format!("this is {b}"),
                            None,
                        );
                        Ty::Unknown
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
                place,
                scope,
            ),
        }
    }

    fn bad_operands(&mut self, expr: &Expr, op: &str, lhs: &Ty, rhs: Option<&Ty>) -> Ty {
        let message = match rhs {
            Some(rhs) => format!("`{op}` is not defined for {lhs} and {rhs}"),
            None => format!("`{op}` is not defined for {lhs}"),
        };
        self.err(
            codes::BAD_OPERANDS,
            expr.span,
            message,
            "here",
            Some(String::from(
                "arithmetic works on numbers and durations, `+` also joins strings; see the type rules in docs/language.md",
            )),
        );
        Ty::Unknown
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        lhs: &Expr,
        rhs: &Expr,
        expr: &Expr,
        place: &Place,
        scope: &Scope,
    ) -> Ty {
        let lhs_ty = self.expr(lhs, place, scope);
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
        let rhs_ty = self.expr(rhs, place, &rhs_scope);
        match op {
            BinaryOp::And | BinaryOp::Or | BinaryOp::Implies => {
                self.require_type(lhs, &lhs_ty, &Ty::Bool);
                self.require_type(rhs, &rhs_ty, &Ty::Bool);
                Ty::Bool
            }
            BinaryOp::Eq | BinaryOp::Ne => {
                if unify(&lhs_ty, &rhs_ty).is_none() {
                    self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty));
                } else {
                    self.enum_pair(&lhs_ty, rhs, &rhs_ty, lhs);
                }
                Ty::Bool
            }
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                for (side, ty) in [(lhs, &lhs_ty), (rhs, &rhs_ty)] {
                    if ty.is_optional() {
                        self.maybe_absent(side, ty);
                        return Ty::Bool;
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
                } else if let (Ty::Enum(e), _) | (_, Ty::Enum(e)) =
                    (lhs_ty.required(), rhs_ty.required())
                {
                    if !e.ordered {
                        self.err(
                            codes::NOT_ORDERED,
                            expr.span,
                            format!("`{}` has no order, so `{}` cannot compare it", e.name, op.symbol()),
                            "compared by order",
                            Some(String::from(
                                "declare the enumeration under `enums:` in a data file, weakest member first, to give it an order",
                            )),
                        );
                    } else {
                        self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty));
                    }
                } else {
                    self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty));
                }
                Ty::Bool
            }
            BinaryOp::In | BinaryOp::NotIn => {
                if lhs_ty.is_optional() {
                    self.maybe_absent(lhs, &lhs_ty);
                    return Ty::Bool;
                }
                match rhs_ty.required() {
                    Ty::List(item) => {
                        if unify(&lhs_ty, item).is_none() {
                            self.bad_operands(expr, op.symbol(), &lhs_ty, Some(&rhs_ty));
                        } else if let Ty::Enum(e) = lhs_ty.required() {
                            self.enum_literal(&e.clone(), rhs);
                        }
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
                            None,
                        );
                    }
                }
                Ty::Bool
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
                if optional { result.optional() } else { result }
            }
        }
    }

    /// For an enumeration compared with a literal, checks the literal's member.
    fn enum_pair(&mut self, lhs_ty: &Ty, rhs: &Expr, rhs_ty: &Ty, lhs: &Expr) {
        if let Ty::Enum(e) = lhs_ty.required() {
            self.enum_literal(&e.clone(), rhs);
        }
        if let Ty::Enum(e) = rhs_ty.required() {
            self.enum_literal(&e.clone(), lhs);
        }
    }

    fn path(&mut self, segments: &[Ident], expr: &Expr, place: &Place, scope: &Scope) -> Ty {
        let Some(first) = segments.first() else {
            return Ty::Unknown;
        };
        let mut ty = if first.name == "self" && scope.in_aggregate {
            Ty::Candidate
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
            return Ty::Unknown;
        } else if let Some(ty) = self.named_value(first, place, scope) {
            ty
        } else if let Some(root) = Root::from_name(&first.name) {
            if root == Root::Input
                && let Some(field) = segments.get(1)
            {
                self.input_reads.insert(field.name.clone());
            }
            match self.root(root, first, place, scope) {
                Some(ty) => ty,
                None => return Ty::Unknown,
            }
        } else if self.broken_names.contains(&first.name) {
            return Ty::Unknown;
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
                help.or_else(|| Some(String::from("names are `let` and `merge` definitions or roots such as `request`, `provider`, `route`"))),
            );
            return Ty::Unknown;
        };

        let path_start = first.span.start;
        let mut optional = false;
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
                Ty::Unknown => return Ty::Unknown,
                Ty::Record(record) => match record.field(&segment.name) {
                    Some(field) => field.clone(),
                    None => {
                        let help =
                            suggest(&segment.name, record.fields.iter().map(|(f, _)| f.as_str()))
                                .map(|close| format!("did you mean {prefix}.{close}?"))
                                .or_else(|| {
                                    Some(format!(
                                        "`{prefix}` has: {}",
                                        record
                                            .fields
                                            .iter()
                                            .map(|(f, _)| f.as_str())
                                            .collect::<Vec<_>>()
                                            .join(", ")
                                    ))
                                });
                        self.err(
                            codes::UNKNOWN_ATTRIBUTE,
                            expr.span.to(segment.span).with_start(path_start),
                            format!("`{prefix}` has no attribute `{}`", segment.name),
                            &format!("not an attribute of `{prefix}`"),
                            help,
                        );
                        return Ty::Unknown;
                    }
                },
                Ty::Candidate => match self.candidate_member(segment, place) {
                    Some(ty) => ty,
                    None => {
                        let mut fields: Vec<String> = [
                            "model",
                            "provider",
                            "route",
                            "credential",
                            "health",
                            "stats",
                            "capacity",
                            "requested",
                        ]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                        fields.extend(self.candidate_let_names());
                        let help = suggest(&segment.name, fields.iter().map(String::as_str))
                            .map(|close| format!("did you mean {prefix}.{close}?"));
                        self.err(
                            codes::UNKNOWN_ATTRIBUTE,
                            segment.span.with_start(path_start),
                            format!("a candidate has no attribute `{}`", segment.name),
                            "not an attribute of a candidate",
                            help,
                        );
                        return Ty::Unknown;
                    }
                },
                other => {
                    self.err(
                        codes::UNKNOWN_ATTRIBUTE,
                        segment.span.with_start(path_start),
                        format!("`{prefix}` is {other} and has no attributes"),
                        "no attributes here",
                        None,
                    );
                    return Ty::Unknown;
                }
            };
        }
        if optional {
            ty = ty.optional();
        }
        if let Some(path) = expr.path_text()
            && scope.facts.knows(&path)
        {
            return ty.required().clone();
        }
        ty
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
        })
    }

    /// A field of a candidate value: a candidate root, or a `let` that
    /// depends on the candidate.
    fn candidate_member(&mut self, segment: &Ident, place: &Place) -> Option<Ty> {
        if let Some(ty) = self.roots.candidate_field(&segment.name) {
            return Some(ty.clone());
        }
        let (ty, usage) = self.let_type(&segment.name)?;
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
        Some(ty)
    }

    /// A `let` or `merge` name used as a value.
    fn named_value(&mut self, ident: &Ident, place: &Place, scope: &Scope) -> Option<Ty> {
        let (ty, usage) = self.let_type(&ident.name)?;
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
            return Some(Ty::Unknown);
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
            return Some(Ty::Unknown);
        }
        self.usage.merge(usage);
        Some(ty)
    }

    fn call(
        &mut self,
        name: &Ident,
        args: &[Expr],
        expr: &Expr,
        place: &Place,
        scope: &Scope,
    ) -> Ty {
        let arity = |this: &mut Self, expected: &str| {
            this.err(
                codes::ARGUMENT_COUNT,
                expr.span,
                format!("`{}` takes {expected}, found {}", name.name, args.len()),
                "this call",
                None,
            );
            Ty::Unknown
        };
        let types: Vec<Ty> = args
            .iter()
            .map(|arg| self.expr(arg, place, scope))
            .collect();
        match name.name.as_str() {
            "min" | "max" => {
                if args.len() < 2 {
                    return arity(self, "two or more values");
                }
                let mut result = Ty::Unknown;
                for (arg, ty) in args.iter().zip(&types) {
                    if !ty.is_ordered() || matches!(ty.required(), Ty::Bool | Ty::String) {
                        self.err(
                            codes::TYPE_MISMATCH,
                            arg.span,
                            format!("`{}` compares numbers, durations, dates or ordered enumerations, found {ty}", name.name),
                            "cannot be ordered this way",
                            None,
                        );
                        return Ty::Unknown;
                    }
                    match unify(result.required(), ty.required()) {
                        Some(unified) => result = unified,
                        None => return self.bad_operands(expr, &name.name, &result, Some(ty)),
                    }
                }
                if types.iter().all(Ty::is_optional) {
                    result.optional()
                } else {
                    result
                }
            }
            "clamp" => {
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
                value
            }
            "coalesce" => {
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
                                None,
                            );
                            return Ty::Unknown;
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
                result
            }
            "present" => {
                if args.len() != 1 {
                    return arity(self, "one value");
                }
                Ty::Bool
            }
            "empty" | "len" => {
                if args.len() != 1 {
                    return arity(self, "one list");
                }
                if let (Some(arg), Some(ty)) = (args.first(), types.first()) {
                    self.require_list(arg, ty);
                }
                if name.name == "len" {
                    Ty::Number
                } else {
                    Ty::Bool
                }
            }
            "intersects" | "subset" => {
                if args.len() != 2 {
                    return arity(self, "two lists");
                }
                for (arg, ty) in args.iter().zip(&types) {
                    self.require_list(arg, ty);
                }
                if let (Some(a), Some(b)) = (types.first(), types.get(1))
                    && unify(a.required(), b.required()).is_none()
                {
                    self.bad_operands(expr, &name.name, a, Some(b));
                }
                Ty::Bool
            }
            "index_of" => {
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
                Ty::Number.optional()
            }
            "contains" | "starts_with" => {
                if args.len() != 2 {
                    return arity(self, "two strings");
                }
                for (arg, ty) in args.iter().zip(&types) {
                    self.require_type(arg, ty, &Ty::String);
                }
                Ty::Bool
            }
            "lower" => {
                if args.len() != 1 {
                    return arity(self, "one string");
                }
                if let (Some(arg), Some(ty)) = (args.first(), types.first()) {
                    self.require_type(arg, ty, &Ty::String);
                }
                Ty::String
            }
            "seconds" => {
                if args.len() != 1 {
                    return arity(self, "one duration");
                }
                let ty = types.first().cloned().unwrap_or(Ty::Unknown);
                if !matches!(ty.required(), Ty::Duration | Ty::Unknown) {
                    return self.bad_operands(expr, "seconds", &ty, None);
                }
                if ty.is_optional() {
                    Ty::Number.optional()
                } else {
                    Ty::Number
                }
            }
            "backoff" => {
                if args.len() != 4 {
                    return arity(self, "four values: base, factor, maximum and jitter");
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
                let expected = [Ty::Duration, Ty::Number, Ty::Duration, Ty::Number];
                for ((arg, ty), expected) in args.iter().zip(&types).zip(expected.iter()) {
                    self.require_type(arg, ty, expected);
                }
                Ty::Duration
            }
            _ => {
                let help = suggest(&name.name, FUNCTIONS.iter().copied())
                    .map(|close| format!("did you mean `{close}`?"))
                    .or_else(|| Some(format!("the functions are: {}", FUNCTIONS.join(", "))));
                self.err(
                    codes::UNKNOWN_FUNCTION,
                    name.span,
                    format!("there is no function `{}`", name.name),
                    "unknown function",
                    help,
                );
                Ty::Unknown
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
                None,
            );
        }
    }

    fn aggregate(
        &mut self,
        function: Aggregate,
        function_span: Span,
        value: &Expr,
        filter: Option<&Expr>,
        place: &Place,
        scope: &Scope,
    ) -> Ty {
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
            return Ty::Unknown;
        }
        self.usage.aggregate = true;
        let inner = Scope {
            in_aggregate: true,
            facts: match filter {
                Some(filter) => scope.facts.with(facts_if_true(filter)),
                None => scope.facts.clone(),
            },
            it: None,
        };
        if let Some(filter) = filter {
            let filter_scope = Scope {
                in_aggregate: true,
                facts: scope.facts.clone(),
                it: None,
            };
            let ty = self.expr(filter, place, &filter_scope);
            self.require_type(filter, &ty, &Ty::Bool);
        }
        let ty = self.expr(value, place, &inner);
        match function {
            Aggregate::AllOf | Aggregate::AnyOf | Aggregate::CountOf => {
                self.require_type(value, &ty, &Ty::Bool);
                if function == Aggregate::CountOf {
                    Ty::Number
                } else {
                    Ty::Bool
                }
            }
            Aggregate::ListOf => Ty::List(Box::new(ty.required().clone())),
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
                        format!(
                            "`{}` needs numbers, durations or another ordered value, found {ty}",
                            function.name()
                        ),
                        "cannot aggregate this",
                        None,
                    );
                    return Ty::Unknown;
                }
                // No candidate, or none with a value, gives no value.
                ty.required().clone().optional()
            }
        }
    }
}

trait WithStart {
    fn with_start(self, start: usize) -> Span;
}

impl WithStart for Span {
    fn with_start(self, start: usize) -> Span {
        Span::new(start.min(self.end), self.end)
    }
}

/// A hint for a type mismatch.
fn type_hint(actual: &Ty, expected: &Ty) -> Option<String> {
    match (actual.required(), expected.required()) {
        (Ty::Number, Ty::Duration) => Some(String::from(
            "write durations with a unit, such as `10s` or `500ms`",
        )),
        (Ty::Duration, Ty::Number) => {
            Some(String::from("`seconds(d)` turns a duration into a number"))
        }
        (Ty::String, Ty::Bool) | (Ty::Number, Ty::Bool) => Some(String::from(
            "conditions must be true or false; compare with `==` or `>`",
        )),
        _ => None,
    }
}
