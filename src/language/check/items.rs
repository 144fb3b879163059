//! Checking the sections of a policy, and elaborating each into its part of
//! the program.

use super::env::{OUTCOME, Place, Root, Roots};
use super::expr::{self, Scope, Usage, constant_bool};
use super::types::Ty;
use super::{Checker, PASSTHROUGH, RaiseKind};
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::language::ast::*;
use crate::language::ir::{self, ErrorRef, Term, TermKind};
use crate::source::Span;
use crate::value::Value;
use std::collections::HashMap;

/// Response headers that frame the message or its connection, which the
/// proxy and its HTTP library set from what is actually sent.
const FRAMING_HEADERS: [&str; 9] = [
    "content-length",
    "transfer-encoding",
    "content-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

/// The `budget` of a failover block, if it has one.
fn budget_of(block: &FailoverBlock) -> Option<&Expr> {
    block.statements.iter().find_map(|s| match s {
        FailoverStmt::Budget { limit, .. } => Some(limit),
        _ => None,
    })
}

impl<'a> Checker<'a> {
    fn condition(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> (Usage, Term) {
        let (usage, term) = self.expect(expr, &Ty::Bool, place, scope);
        if let Some(value) = constant_bool(expr) {
            self.error_at(
                codes::CONSTANT_CONDITION,
                expr.span,
                format!("this condition is always {value}"),
                "constant",
                Some(String::from(
                    "a rule whose condition never changes either always or never applies; remove it or fix the condition",
                )),
            );
        }
        (usage, term)
    }

    fn sort_keys(&mut self, keys: &[SortKey], place: &Place) -> Vec<ir::SortKeySpec> {
        keys.iter()
            .map(|key| {
                let (ty, _, term) = self.check_expr(&key.expr, place, &Scope::default());
                if !ty.is_ordered() {
                    self.error_at(
                        codes::NOT_ORDERED,
                        key.expr.span,
                        format!("a sort key must be orderable, found {ty}"),
                        "cannot sort by this",
                        Some(String::from("sort by numbers, durations, dates, strings, booleans or ordered enumerations")),
                    );
                }
                ir::SortKeySpec {
                    term,
                    descending: key.descending,
                    nulls_first: key.nulls_first,
                }
            })
            .collect()
    }

    /// Reports a statement that may appear once in its block.
    fn once(&mut self, seen: &mut Option<Span>, span: Span, what: &str) {
        match seen {
            Some(first) => {
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(codes::DUPLICATE_SECTION, format!("`{what}` is given twice"))
                        .at(source, span, "given again here")
                        .also(source, *first, "first given here")
                        .help("keep one of them"),
                );
            }
            None => *seen = Some(span),
        }
    }

    pub(super) fn item(&mut self, item: &'a Item, file: &'a PolicyFile) {
        let scope = Scope::default();
        match item {
            Item::Policy(_) | Item::Errors(_) | Item::Input(_) | Item::Let(_) => {}
            Item::Models(block) => self.models(block),
            Item::Validate(block) => {
                let place = Place::request("a `validate` rule");
                for rule in &block.rules {
                    let (_, condition) = self.condition(&rule.condition, &place, &scope);
                    let error = self.raise(&rule.error, RaiseKind::BeforeAttempt);
                    self.program.rejects.push(ir::Reject {
                        condition,
                        error,
                        span: rule.keyword,
                    });
                }
                let mut seen = None;
                for body in &block.malformed_body {
                    self.once(&mut seen, body.keyword, "malformed body");
                    self.program.malformed_body =
                        Some(self.raise(&body.error, RaiseKind::BeforeAttempt));
                }
            }
            Item::Defaults(block) => {
                let mut seen: Vec<(Level, bool)> = Vec::new();
                for layer in &block.layers {
                    if seen.contains(&(layer.level, layer.per_model)) {
                        self.error_at(
                            codes::BAD_LAYERS,
                            layer.span,
                            String::from("this layer is listed twice"),
                            "repeated",
                            Some(String::from("list each layer once, most specific first")),
                        );
                    }
                    seen.push((layer.level, layer.per_model));
                    self.program.layers.push(ir::LayerSpec {
                        level: layer.level,
                        per_model: layer.per_model,
                    });
                }
            }
            Item::Merge(block) => {
                for merge in &block.merges {
                    self.check_quietly(&merge.name.name);
                }
            }
            Item::Sort(sort) => {
                self.sort_keys(&sort.keys, &Place::candidate_set("a sort key"));
            }
            Item::Eligibility(block) => {
                let place = Place::candidate_set("an eligibility step");
                for step in &block.steps {
                    let spec = match step {
                        Step::Require {
                            keyword,
                            condition,
                            error,
                        } => {
                            let (_, term) = self.condition(condition, &place, &scope);
                            ir::StepSpec {
                                kind: ir::StepKind::Require(
                                    self.raise(error, RaiseKind::BeforeAttempt),
                                ),
                                condition: term,
                                span: *keyword,
                            }
                        }
                        Step::PreferExclusively { keyword, condition } => {
                            let (_, term) = self.condition(condition, &place, &scope);
                            ir::StepSpec {
                                kind: ir::StepKind::PreferExclusively,
                                condition: term,
                                span: *keyword,
                            }
                        }
                    };
                    self.program.steps.push(spec);
                }
            }
            Item::Order(block) => self.order(block, file),
            Item::Balance(balance) => self.balance(balance),
            Item::Failover(block) => self.failover(block),
            Item::Health(block) => {
                let place = Place::request("`health`");
                let mut penalty_seen = None;
                let mut window_seen = None;
                for statement in &block.statements {
                    match statement {
                        HealthStmt::Penalty(penalty) => {
                            self.once(&mut penalty_seen, penalty.keyword, "penalty");
                            let (_, base) =
                                self.expect(&penalty.base, &Ty::Duration, &place, &scope);
                            let (_, factor) =
                                self.expect(&penalty.factor, &Ty::Number, &place, &scope);
                            let (_, max) = self.expect(&penalty.max, &Ty::Duration, &place, &scope);
                            let (_, reset) =
                                self.expect(&penalty.reset, &Ty::Duration, &place, &scope);
                            self.penalty_schedule(penalty);
                            self.program.penalty = Some(ir::PenaltySpec {
                                base,
                                factor,
                                max,
                                reset,
                            });
                        }
                        HealthStmt::Window { keyword, window } => {
                            self.once(&mut window_seen, *keyword, "window");
                            let (_, term) = self.expect(window, &Ty::Duration, &place, &scope);
                            self.program.stats_window = Some(term);
                        }
                    }
                }
            }
            Item::Capacity(block) => {
                let place = Place::request("`capacity`");
                let mut wait_seen = None;
                let mut error_seen = None;
                for statement in &block.statements {
                    match statement {
                        CapacityStmt::Wait { keyword, limit } => {
                            self.once(&mut wait_seen, *keyword, "wait");
                            let (_, term) = self.expect(limit, &Ty::Duration, &place, &scope);
                            self.program.capacity_wait = Some(term);
                        }
                        CapacityStmt::Error { keyword, error } => {
                            self.once(&mut error_seen, *keyword, "error");
                            self.program.capacity_error =
                                Some(self.raise(error, RaiseKind::Exhausted));
                        }
                    }
                }
            }
            Item::Timeouts(block) => {
                let place = Place::candidate("a timeout");
                let mut seen: HashMap<TimeoutKind, Span> = HashMap::new();
                for timeout in &block.timeouts {
                    if let Some(first) = seen.get(&timeout.kind) {
                        let source = self.source;
                        self.diagnostics.push(
                            Diagnostic::new(
                                codes::DUPLICATE_SECTION,
                                format!("timeout `{}` is set twice", timeout.kind.name()),
                            )
                            .at(source, timeout.kind_span, "set again here")
                            .also(source, *first, "first set here")
                            .help("keep one of them"),
                        );
                    } else {
                        seen.insert(timeout.kind, timeout.kind_span);
                    }
                    let (_, term) = self.expect(&timeout.value, &Ty::Duration, &place, &scope);
                    // No wait is ever that short: every attempt would fail
                    // as soon as it began, or race its own first byte.
                    if expr::constant_duration(&timeout.value) == Some(0) {
                        self.error_at(
                            codes::ZERO_TIMEOUT,
                            timeout.value.span,
                            format!("the `{}` timeout is no time at all", timeout.kind.name()),
                            "no time",
                            Some(String::from(
                                "give the longest wait that is still fine, such as `30s`, or leave the timeout out for its default",
                            )),
                        );
                    }
                    self.program.timeouts.push((timeout.kind, term));
                }
            }
            Item::Stream(block) => {
                // A second statement would silently replace the first.
                let mut hold_headers_seen = None;
                let mut late_comment_seen = None;
                let mut after_commit_seen = None;
                for statement in &block.statements {
                    match statement {
                        StreamStmt::HoldHeaders { keyword, limit } => {
                            self.once(&mut hold_headers_seen, *keyword, "hold_headers");
                            let (_, term) = self.expect(
                                limit,
                                &Ty::Duration,
                                &Place::candidate("`hold_headers`"),
                                &scope,
                            );
                            self.program.hold_headers = Some(term);
                        }
                        StreamStmt::LateComment { keyword, text } => {
                            self.once(&mut late_comment_seen, *keyword, "late_comment");
                            let place = Place::request("`late_comment`")
                                .with_roots(Roots::of(&[Root::Served]));
                            let (_, term) =
                                self.expect(text, &Ty::String.optional(), &place, &scope);
                            self.program.late_comment = Some(term);
                        }
                        StreamStmt::AfterCommit { keyword, limit } => {
                            self.once(&mut after_commit_seen, *keyword, "after_commit");
                            // Absent is meaningful: no limit but `idle`.
                            let (_, term) = self.expect(
                                limit,
                                &Ty::Duration.optional(),
                                &Place::candidate("`after_commit`"),
                                &scope,
                            );
                            self.program.after_commit = Some(term);
                        }
                    }
                }
            }
            Item::Headers(block) => {
                let place = Place::request("a response header").with_roots(Roots::of(&[
                    Root::Served,
                    Root::Attempts,
                    Root::Elapsed,
                    Root::Succeeded,
                ]));
                self.program.headers = self.fields(&block.fields, &place, true);
            }
            Item::Listing(block) => {
                self.program.listing = self.fields(
                    &block.fields,
                    &Place::candidate_set("a listing field"),
                    false,
                );
            }
        }
    }

    fn balance(&mut self, balance: &'a BalanceDecl) {
        let scope = Scope::default();
        let place = Place::candidate_set("a balance strategy");
        let when = balance.when.as_ref().map(|when| {
            self.condition(when, &Place::request("a `balance` condition"), &scope)
                .1
        });
        let strategy = match &balance.strategy {
            Strategy::Weighted(weight) => {
                ir::StrategySpec::Weighted(self.expect(weight, &Ty::Number, &place, &scope).1)
            }
            Strategy::Share {
                key,
                tolerance,
                among,
            } => {
                let keys = self.sort_keys(std::slice::from_ref(key), &place);
                let (ty, _, _) = self.check_expr(&key.expr, &place, &scope);
                if !matches!(ty.required(), Ty::Number | Ty::Duration | Ty::Unknown) {
                    self.error_at(
                        codes::TYPE_MISMATCH,
                        key.expr.span,
                        format!("`share` compares numbers or durations, found {ty}"),
                        "not a score",
                        Some(String::from("share by a number or duration per candidate (a price, a latency, a `let` score); to keep candidates that differ in this value apart, add it to `among`")),
                    );
                }
                if !(0.0..=10.0).contains(tolerance) {
                    self.error_at(
                        codes::BAD_LITERAL,
                        balance.strategy_span,
                        String::from("the share tolerance must be between 0% and 1000%"),
                        "this tolerance",
                        Some(String::from("candidates within this share of the best score take turns; 10% is typical")),
                    );
                }
                let among = among
                    .iter()
                    .map(|expr| self.check_expr(expr, &place, &scope).2)
                    .collect();
                match keys.into_iter().next() {
                    Some(key) => ir::StrategySpec::Share {
                        key,
                        tolerance: *tolerance,
                        among,
                    },
                    None => ir::StrategySpec::Random,
                }
            }
            Strategy::Random => ir::StrategySpec::Random,
            Strategy::RoundRobin => ir::StrategySpec::RoundRobin,
            Strategy::LeastBusy => ir::StrategySpec::LeastBusy,
        };
        self.program.balance.push(ir::BalanceSpec {
            when,
            strategy,
            span: balance.keyword,
        });
    }

    fn fields(
        &mut self,
        fields: &[FieldValue],
        place: &Place,
        headers: bool,
    ) -> Vec<ir::FieldSpec> {
        let mut seen: HashMap<String, Span> = HashMap::new();
        let mut specs = Vec::new();
        for field in fields {
            let name = &field.name.value;
            let key = name.to_ascii_lowercase();
            if let Some(first) = seen.get(&key) {
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(codes::DUPLICATE_HEADER, format!("`{name}` is set twice"))
                        .at(source, field.name.span, "set again here")
                        .also(source, *first, "first set here")
                        .help("keep one of them; use `if ... then ... else` to choose a value"),
                );
            } else {
                seen.insert(key.clone(), field.name.span);
            }
            let valid_name = !name.is_empty()
                && if headers {
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                } else {
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && !matches!(name.as_str(), "id" | "object")
                };
            if !valid_name {
                let what = if headers {
                    "header names are letters, digits and `-`"
                } else {
                    "listing fields are letters, digits and `_`, and cannot be `id` or `object`"
                };
                self.error_at(
                    codes::BAD_HEADER_VALUE,
                    field.name.span,
                    format!("`{name}` cannot be used here"),
                    "invalid name",
                    Some(what.to_string()),
                );
            }
            // Headers that frame the message or its connection: hyper and
            // the proxy set them from what is sent, and a policy's value
            // would contradict the body (a client reading a wrong length).
            if headers && valid_name && FRAMING_HEADERS.contains(&key.as_str()) {
                self.error_at(
                    codes::BAD_HEADER_VALUE,
                    field.name.span,
                    format!("`{name}` is set by the proxy from the response itself"),
                    "framing header",
                    Some(format!(
                        "a policy cannot set {}; remove this line",
                        FRAMING_HEADERS.join(", ")
                    )),
                );
            }
            let (ty, _, term) = self.check_expr(&field.value, place, &Scope::default());
            if headers
                && let TermKind::Const(Value::String(text)) = &term.kind
                && text.chars().any(|c| c.is_control() && c != '\t')
            {
                self.error_at(
                    codes::BAD_HEADER_VALUE,
                    field.value.span,
                    String::from("a header value cannot hold a line break or control character"),
                    "not sendable",
                    Some(String::from(
                        "write the value on one line, without control characters",
                    )),
                );
            }
            let listing_list =
                !headers && matches!(ty.required(), Ty::List(inner) if inner.is_scalar());
            if !ty.is_scalar() && !listing_list {
                self.error_at(
                    codes::BAD_HEADER_VALUE,
                    field.value.span,
                    format!("{ty} cannot be written as text"),
                    "not a text value",
                    Some(String::from("headers take strings, numbers, booleans, durations and enumeration members; an absent value leaves the header out")),
                );
            }
            specs.push(ir::FieldSpec {
                name: if headers { key } else { name.clone() },
                term,
            });
        }
        specs
    }

    fn models(&mut self, block: &'a ModelsBlock) {
        let scope = Scope::default();
        let mut sources_seen = None;
        let mut credentials_seen = None;
        let mut unknown_error_seen = None;
        let mut one_seen = None;
        let mut spec = ir::ModelsSpec {
            sources: Vec::new(),
            pins: Vec::new(),
            credentials: ir::CredentialSpec::Each,
            credentials_error: ErrorRef::Declared(usize::MAX),
            unknown_serve: Vec::new(),
            unknown_error: ErrorRef::Declared(usize::MAX),
        };
        for statement in &block.statements {
            match statement {
                ModelsStmt::Sources { keyword, sources } => {
                    self.once(&mut sources_seen, *keyword, "from");
                    let place = Place::request("`from` in `models`");
                    for source in sources {
                        let (ty, _, term) = self.check_expr(source, &place, &scope);
                        if !matches!(ty.required(), Ty::String | Ty::Unknown)
                            && !matches!(ty.required(), Ty::List(inner) if matches!(**inner, Ty::String | Ty::Unknown))
                        {
                            self.error_at(
                                codes::TYPE_MISMATCH,
                                source.span,
                                format!(
                                    "model ids come from strings or lists of strings, found {ty}"
                                ),
                                "not a model id",
                                Some(String::from("give a model id as a string (`\"gpt-4o\"`) or a list of strings, such as `request.model`")),
                            );
                        }
                        spec.sources.push(term);
                    }
                }
                ModelsStmt::Pin(pin) => spec.pins.push(ir::PinSpec {
                    target: pin.target,
                    prefix: pin.prefix.clone(),
                    separator: pin.separator.clone(),
                }),
                ModelsStmt::Credentials {
                    keyword,
                    mode,
                    error,
                } => {
                    self.once(&mut credentials_seen, *keyword, "credentials");
                    spec.credentials = match mode {
                        CredentialMode::Each => ir::CredentialSpec::Each,
                        CredentialMode::One(keys) => {
                            let place = Place::only(
                                "`credentials`",
                                Roots::of(&[
                                    Root::Credential,
                                    Root::Provider,
                                    Root::Tenant,
                                    Root::Workspace,
                                    Root::Key,
                                ]),
                            );
                            ir::CredentialSpec::One(self.sort_keys(keys, &place))
                        }
                    };
                    spec.credentials_error = self.raise(error, RaiseKind::BeforeAttempt);
                }
                ModelsStmt::UnknownServe {
                    condition, keys, ..
                } => {
                    let place = Place::only(
                        "`unknown serve`",
                        Roots::of(&[Root::Request, Root::Provider, Root::Deployment, Root::Input]),
                    );
                    // `where true` is how a tier says "any provider": the
                    // syntax asks for a condition. Only `false` is a mistake.
                    let (_, condition) = if constant_bool(condition) == Some(true) {
                        self.expect(condition, &Ty::Bool, &place, &scope)
                    } else {
                        self.condition(condition, &place, &scope)
                    };
                    let keys = self.sort_keys(keys, &place);
                    spec.unknown_serve
                        .push(ir::UnknownServe { condition, keys });
                }
                ModelsStmt::UnknownError { keyword, error } => {
                    self.once(&mut unknown_error_seen, *keyword, "unknown error");
                    spec.unknown_error = self.raise(error, RaiseKind::BeforeAttempt);
                }
                ModelsStmt::OneProviderPerModel { span } => {
                    self.once(&mut one_seen, *span, "one provider per model");
                    self.one_provider_per_model(*span);
                }
            }
        }
        if spec.sources.is_empty() {
            spec.sources
                .push(Term::read(ir::Read::RequestModel, block.keyword));
        }
        if credentials_seen.is_none() && !self.incomplete {
            self.error_at(
                codes::MISSING_SECTION,
                block.keyword,
                String::from("`models` does not say which credential each route uses"),
                "no `credentials` statement",
                Some(String::from(
                    "add `credentials one by credential.owned desc else ERROR` (or `credentials each else ERROR`)",
                )),
            );
        }
        if unknown_error_seen.is_none() && !self.incomplete {
            self.error_at(
                codes::MISSING_SECTION,
                block.keyword,
                String::from("`models` does not say which error an unknown model gets"),
                "no `unknown error`",
                Some(String::from("add `unknown error NAME`")),
            );
        }
        self.program.models = Some(spec);
    }

    fn one_provider_per_model(&mut self, statement: Span) {
        let catalog = &self.data.catalog;
        let mut found = Vec::new();
        for model in &catalog.models {
            let mut providers: Vec<usize> =
                model.routes.iter().map(|route| route.provider).collect();
            providers.sort_unstable();
            providers.dedup();
            if providers.len() > 1 {
                let names: Vec<String> = providers
                    .iter()
                    .filter_map(|index| catalog.providers.get(*index))
                    .map(|provider| format!("`{}`", provider.id))
                    .collect();
                found.push((model.id.clone(), model.at, names));
            }
        }
        for (id, at, names) in found {
            let source = self.source;
            self.diagnostics.push(
                Diagnostic::new(
                    codes::MODEL_ON_TWO_PROVIDERS,
                    format!("model `{id}` is routed to {}", names.join(" and ")),
                )
                .at(at.source, at.span, "this model")
                .also(
                    source,
                    statement,
                    "the policy allows one provider per model",
                )
                .help("keep one route for the model, or drop `one provider per model`"),
            );
        }
    }

    fn order(&mut self, block: &'a OrderBlock, file: &'a PolicyFile) {
        let place = Place::candidate_set("a sort key");
        for statement in &block.statements {
            match statement {
                OrderStmt::By(key) => {
                    let keys = self.sort_keys(std::slice::from_ref(key), &place);
                    self.program
                        .order
                        .extend(keys.into_iter().map(ir::OrderPart::By));
                }
                OrderStmt::UseSort { selector, .. } => {
                    let (ty, _, term) = self.check_expr(
                        selector,
                        &Place::request("a sort selector"),
                        &Scope::default(),
                    );
                    let declared: Vec<&'a SortDecl> = file
                        .items
                        .iter()
                        .filter_map(|item| match item {
                            Item::Sort(sort) => Some(sort),
                            _ => None,
                        })
                        .collect();
                    let names: Vec<&str> = declared
                        .iter()
                        .map(|sort| sort.name.name.as_str())
                        .collect();
                    match ty.required() {
                        Ty::Unknown => {}
                        Ty::Enum(e) => {
                            self.selectable_sorts.extend(e.members.iter().cloned());
                            if ty.is_optional() {
                                self.error_at(
                                    codes::MAYBE_ABSENT,
                                    selector.span,
                                    String::from("the sort selector may be absent"),
                                    "may be absent",
                                    Some(String::from(
                                        "give it a fallback: `coalesce(x, \"name\")`",
                                    )),
                                );
                            }
                            for member in e.members.iter() {
                                if !names.contains(&member.as_str())
                                    && !self.broken_names.contains(member)
                                {
                                    let help = suggest(member, names.iter().copied())
                                        .map(|close| format!("did you mean to name the sort `{close}` `{member}`?"))
                                        .unwrap_or_else(|| format!("declare `sort {member} {{ by ... }}`"));
                                    self.error_at(
                                        codes::UNKNOWN_SORT,
                                        selector.span,
                                        format!("the selector can choose `{member}`, but no sort has that name"),
                                        "selects a sort",
                                        Some(help),
                                    );
                                }
                            }
                        }
                        other => {
                            self.error_at(
                                codes::TYPE_MISMATCH,
                                selector.span,
                                format!("a sort selector must be an enumeration whose members name sorts, found {other}"),
                                "not an enumeration",
                                Some(String::from("select with an input or setting declared as an enumeration")),
                            );
                        }
                    }
                    // The sorts' keys, checked where the sorts are declared;
                    // elaborated again here without repeating diagnostics.
                    let before = self.diagnostics.len();
                    let sorts = declared
                        .iter()
                        .map(|sort| (sort.name.name.clone(), self.sort_keys(&sort.keys, &place)))
                        .collect();
                    self.diagnostics.truncate(before);
                    self.program.order.push(ir::OrderPart::UseSort {
                        selector: term,
                        sorts,
                    });
                }
            }
        }
    }

    /// A schedule written with literals must make sense as written: the
    /// proxy would otherwise quietly treat a factor below 1 as 1 and a `max`
    /// below `base` as the length of every penalty.
    fn penalty_schedule(&mut self, penalty: &PenaltyDecl) {
        if let Some(factor) = expr::constant_number(&penalty.factor)
            && factor < 1.0
        {
            self.error_at(
                codes::BAD_SCHEDULE,
                penalty.factor.span,
                format!("a penalty `factor` of {factor} would shorten penalties"),
                "this factor",
                Some(String::from(
                    "each further failure multiplies the penalty by the factor; write 1 or more",
                )),
            );
        }
        if let (Some(base), Some(max)) = (
            expr::constant_duration(&penalty.base),
            expr::constant_duration(&penalty.max),
        ) && max < base
        {
            self.error_at(
                codes::BAD_SCHEDULE,
                penalty.max.span,
                String::from("a penalty's `max` is shorter than its `base`"),
                "this maximum",
                Some(String::from(
                    "`max` caps the penalty as it grows from `base`; make it at least `base`",
                )),
            );
        }
    }

    fn failover(&mut self, block: &'a FailoverBlock) {
        let scope = Scope::default();
        let mut attempts_seen = None;
        let mut reorder_seen = None;
        let mut budget_seen = None;
        let mut spec = ir::FailoverSpec {
            attempts: Term::constant(crate::value::Value::Number(1.0), block.keyword),
            reorder: Vec::new(),
            keep: Vec::new(),
            budget: None,
            rules: Vec::new(),
        };
        for statement in &block.statements {
            match statement {
                FailoverStmt::Attempts { keyword, limit } => {
                    self.once(&mut attempts_seen, *keyword, "attempts");
                    spec.attempts = self
                        .expect(limit, &Ty::Number, &Place::request("`attempts`"), &scope)
                        .1;
                    if let Some(n) = expr::constant_number(limit)
                        && (n < 1.0 || n.fract() != 0.0)
                    {
                        self.error_at(
                            codes::BAD_ATTEMPTS,
                            limit.span,
                            format!("`{n}` attempts is not a positive whole number"),
                            "this limit",
                            Some(String::from(if n < 1.0 {
                                "one attempt means no failover; write at least 1"
                            } else {
                                "attempts are counted whole: write 1, 2, 3, ..."
                            })),
                        );
                    }
                }
                FailoverStmt::Reorder { keyword, keys } => {
                    self.once(&mut reorder_seen, *keyword, "reorder");
                    spec.reorder = self.sort_keys(keys, &Place::candidate("`reorder`"));
                }
                FailoverStmt::Keep { condition, .. } => {
                    // `upstream` is what the previous attempt's failure
                    // said (absent before any attempt, as `explain` walks).
                    let place = Place::candidate("a `keep` constraint").with_roots(Roots::of(&[
                        Root::Prev,
                        Root::First,
                        Root::Upstream,
                    ]));
                    spec.keep.push(self.condition(condition, &place, &scope).1);
                }
                FailoverStmt::Budget {
                    keyword,
                    limit,
                    error,
                } => {
                    self.once(&mut budget_seen, *keyword, "budget");
                    let (_, limit) =
                        self.expect(limit, &Ty::Duration, &Place::request("`budget`"), &scope);
                    spec.budget = Some((limit, self.raise(error, RaiseKind::Exhausted)));
                }
                FailoverStmt::On(rule) => {
                    let budget = budget_of(block)
                        .map(|budget| expr::bounds_time(budget, &|name| self.named(name)));
                    let rule = self.outcome_rule(rule, budget);
                    spec.rules.push(rule);
                }
            }
        }
        if attempts_seen.is_none() && !self.incomplete {
            self.error_at(
                codes::MISSING_SECTION,
                block.keyword,
                String::from("`failover` does not limit the attempts"),
                "no `attempts`",
                Some(String::from(
                    "add `attempts N`: how many providers a request may try",
                )),
            );
        }
        self.coverage(block);
        self.program.failover = Some(spec);
    }

    /// `budget`: whether the failover block has a budget, and if so whether
    /// it bounds the retries (present, and not set by a client).
    fn outcome_rule(&mut self, rule: &'a OutcomeRule, budget: Option<bool>) -> ir::RuleSpec {
        let place = Place::candidate("an `on` rule").with_roots(OUTCOME);
        let outcome_facts = expr::Facts::from_outcomes(&rule.outcomes);
        let when_scope = Scope {
            facts: outcome_facts.clone(),
            ..Scope::default()
        };
        let (when_usage, when) = match &rule.when {
            Some(when) => {
                let (usage, term) = self.condition(when, &place, &when_scope);
                (usage, Some(term))
            }
            None => (Usage::default(), None),
        };
        // What the outcomes and `when` prove hold for the rule's consequences.
        let scope = Scope {
            facts: outcome_facts.and_condition(rule.when.as_ref()),
            ..Scope::default()
        };
        let mut actions = Vec::new();
        let mut action = ir::Action::Stop;
        let mut errors = 0;
        let mut error = None;
        let mut pauses = Vec::new();
        let mut penalties: Vec<HealthScope> = Vec::new();
        for consequence in &rule.consequences {
            match consequence {
                Consequence::Next { span } => {
                    actions.push(*span);
                    action = ir::Action::Next;
                }
                Consequence::Stop { span } => {
                    actions.push(*span);
                    action = ir::Action::Stop;
                }
                Consequence::Retry { span, after } => {
                    actions.push(*span);
                    let after = after
                        .as_ref()
                        .map(|after| self.expect(after, &Ty::Duration, &place, &scope).1);
                    action = ir::Action::Retry(after);
                    let bounded = rule
                        .when
                        .as_ref()
                        .is_some_and(|when| expr::stops_retrying(when, &|name| self.named(name)));
                    if budget != Some(true) && !bounded {
                        let budget_help = match budget {
                            Some(_) => {
                                "; the failover's `budget` does not bound it: a client sets it, or it may be absent (a division)"
                            }
                            None => ", or give `failover` a `budget`",
                        };
                        let reads_a_bound = when_usage.retries || when_usage.elapsed;
                        match rule.when.as_ref().filter(|_| reads_a_bound) {
                            Some(when) => self.error_at(
                                codes::UNBOUNDED_RETRY,
                                when.span,
                                String::from(
                                    "this `retry`'s condition can hold however many retries there have been",
                                ),
                                "true for some answers however large `retries` and `elapsed` grow",
                                Some(format!(
                                    "the condition must be false, whatever else holds, once `retries` or `elapsed` passes a limit set in the policy or its data: add `and retries < 2` (parenthesise an `or`: `(A or B) and retries < 2`){budget_help}",
                                )),
                            ),
                            None => self.error_at(
                                codes::UNBOUNDED_RETRY,
                                *span,
                                String::from("this `retry` has no bound and could repeat forever"),
                                "unbounded retry",
                                Some(format!(
                                    "limit it with a condition such as `when retries < 2`{budget_help}",
                                )),
                            ),
                        }
                    }
                }
                Consequence::Pause {
                    span,
                    scope: health_scope,
                    duration,
                } => {
                    if pauses.iter().any(|(s, _)| s == health_scope) {
                        self.error_at(
                            codes::BAD_CONSEQUENCE,
                            *span,
                            String::from("this rule pauses the same scope twice"),
                            "again",
                            Some(String::from("pause each scope once per rule; keep the pause with the duration you mean")),
                        );
                    }
                    let (_, term) = self.expect(duration, &Ty::Duration, &place, &scope);
                    pauses.push((*health_scope, term));
                }
                Consequence::Penalize {
                    span,
                    scope: health_scope,
                } => {
                    if penalties.contains(health_scope) {
                        self.error_at(
                            codes::BAD_CONSEQUENCE,
                            *span,
                            String::from("this rule penalizes the same scope twice"),
                            "again",
                            Some(String::from("keep one `penalize` per scope")),
                        );
                    }
                    penalties.push(*health_scope);
                }
                Consequence::Error(choice) => {
                    errors += 1;
                    error = Some(self.error_choice(rule, choice, &place, &scope));
                }
            }
        }
        let fails_over = rule
            .consequences
            .iter()
            .any(|c| matches!(c, Consequence::Next { .. } | Consequence::Retry { .. }));
        if let Some(broken) = rule
            .outcomes
            .iter()
            .find(|o| o.kind == OutcomeKind::StreamBroken)
            && fails_over
        {
            self.error_at(
                codes::BAD_CONSEQUENCE,
                broken.span,
                String::from("a broken stream cannot fail over: bytes already reached the client"),
                "already committed",
                Some(String::from(
                    "give `stream_broken` a rule of its own that says `stop`",
                )),
            );
        }
        let ends_request = rule
            .consequences
            .iter()
            .any(|c| matches!(c, Consequence::Next { .. } | Consequence::Stop { .. }));
        if actions.len() == 1 && errors == 0 && ends_request {
            self.error_at(
                codes::BAD_CONSEQUENCE,
                rule.keyword,
                String::from("this rule can end the request but names no error"),
                "no `error`",
                Some(String::from(
                    "add `error NAME` (or `error passthrough` for statuses): it is what the client gets when this is the last attempt",
                )),
            );
        }
        if actions.len() != 1 || errors > 1 {
            let message = if actions.is_empty() {
                String::from("this rule does not say what happens next")
            } else if actions.len() > 1 {
                String::from("this rule says more than once what happens next")
            } else {
                String::from("this rule names more than one error")
            };
            self.error_at(
                codes::BAD_CONSEQUENCE,
                rule.keyword,
                message,
                "this rule",
                Some(String::from(
                    "give exactly one of `next`, `stop` or `retry`, and at most one `error`",
                )),
            );
        }
        ir::RuleSpec {
            outcomes: rule.outcomes.iter().map(|outcome| outcome.kind).collect(),
            when,
            action,
            pauses,
            penalties,
            error,
            span: rule.keyword,
        }
    }

    fn error_choice(
        &mut self,
        rule: &OutcomeRule,
        choice: &ErrorChoice,
        place: &Place,
        scope: &Scope,
    ) -> ir::ErrorChoiceSpec {
        let reference = self.raise(&choice.error, RaiseKind::Outcome);
        let statuses_only = rule
            .outcomes
            .iter()
            .all(|o| matches!(o.kind, OutcomeKind::Status { .. }));
        if choice.error.name == PASSTHROUGH && !statuses_only {
            self.error_at(
                codes::BAD_CONSEQUENCE,
                choice.error.span,
                String::from("`passthrough` needs a provider's answer, but this rule also takes outcomes without one"),
                "no answer to pass through",
                Some(String::from(
                    "use `passthrough` in rules for statuses only; give timeouts, connection errors and broken streams an error of their own",
                )),
            );
        }
        match &choice.otherwise {
            Some((condition, rest)) => {
                let (_, condition) = self.condition(condition, place, scope);
                let rest = self.error_choice(rule, rest, place, scope);
                ir::ErrorChoiceSpec::Conditional(condition, reference, Box::new(rest))
            }
            None => ir::ErrorChoiceSpec::Fixed(reference),
        }
    }
}
