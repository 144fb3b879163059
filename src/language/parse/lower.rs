//! Lowers pest parse trees into the syntax tree: one small function per rule.
//! Literal problems (a malformed duration, an impossible status pattern) are
//! reported here and the offending node is dropped, so parsing continues.

use super::{PolicyParser, Rule};
use crate::data::schema::MAX_DURATION_MS;
use crate::diagnostics::{Diagnostic, codes};
use crate::language::ast::*;
use crate::source::{SourceId, Span};
use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use std::sync::LazyLock;

/// Longest chain of prefix operators or operands in one expression level; a
/// bound keeps the recursive lowering and checking far from the stack limit.
const MAX_EXPRESSION_PARTS: usize = 256;

/// Deepest nesting of expressions (`if` inside `if`, calls inside calls …)
/// and longest `error … if … else` chain accepted. Brackets are limited
/// before parsing; these nest without them. Every later stage walks the
/// syntax tree recursively, so its depth must stay bounded.
const MAX_EXPRESSION_DEPTH: usize = 64;

static PRATT: LazyLock<PrattParser<Rule>> = LazyLock::new(|| {
    PrattParser::new()
        .op(Op::infix(Rule::op_implies, Assoc::Right))
        .op(Op::infix(Rule::op_or, Assoc::Left))
        .op(Op::infix(Rule::op_and, Assoc::Left))
        .op(Op::prefix(Rule::op_not))
        .op(Op::infix(Rule::op_eq, Assoc::Left)
            | Op::infix(Rule::op_ne, Assoc::Left)
            | Op::infix(Rule::op_lt, Assoc::Left)
            | Op::infix(Rule::op_le, Assoc::Left)
            | Op::infix(Rule::op_gt, Assoc::Left)
            | Op::infix(Rule::op_ge, Assoc::Left)
            | Op::infix(Rule::op_in, Assoc::Left)
            | Op::infix(Rule::op_not_in, Assoc::Left))
        .op(Op::infix(Rule::op_add, Assoc::Left) | Op::infix(Rule::op_sub, Assoc::Left))
        .op(Op::infix(Rule::op_mul, Assoc::Left) | Op::infix(Rule::op_div, Assoc::Left))
        .op(Op::prefix(Rule::op_neg))
});

/// Turns pairs into AST nodes, shifting spans by `offset` (the position of the
/// parsed chunk in its file) and collecting literal diagnostics.
pub struct Lowerer {
    pub source: SourceId,
    pub offset: usize,
    pub diagnostics: std::cell::RefCell<Vec<Diagnostic>>,
    /// Names whose definitions were dropped for a bad literal.
    pub broken_names: std::cell::RefCell<Vec<String>>,
    /// How deep the expression being lowered is nested.
    depth: std::cell::Cell<usize>,
    /// Whether a too-deep expression was reported (once is enough).
    reported_depth: std::cell::Cell<bool>,
}

fn is_keyword(rule: Rule) -> bool {
    format!("{rule:?}").starts_with("kw_")
}

/// The meaningful children of a pair: keyword tokens are dropped.
fn parts(pair: Pair<'_, Rule>) -> Vec<Pair<'_, Rule>> {
    pair.into_inner()
        .filter(|child| !is_keyword(child.as_rule()))
        .collect()
}

/// A node the grammar guarantees but that is absent: a bug in this module, not
/// in the user's input, reported as a syntax error rather than a panic.
fn missing(what: &str) -> String {
    format!("internal parser error: expected {what}")
}

impl Lowerer {
    pub fn new(source: SourceId, offset: usize) -> Lowerer {
        Lowerer {
            source,
            offset,
            diagnostics: std::cell::RefCell::new(Vec::new()),
            broken_names: std::cell::RefCell::new(Vec::new()),
            depth: std::cell::Cell::new(0),
            reported_depth: std::cell::Cell::new(false),
        }
    }

    /// Runs `lower` one level deeper, or reports (once) that `span` nests
    /// too deeply and gives up on it.
    fn deeper<T>(&self, span: Span, lower: impl FnOnce() -> Option<T>) -> Option<T> {
        if self.depth.get() >= MAX_EXPRESSION_DEPTH {
            if !self.reported_depth.replace(true) {
                self.error(
                    codes::TOO_DEEP,
                    span,
                    format!("this nests more than {MAX_EXPRESSION_DEPTH} levels deep"),
                    "too deep here",
                    "split it into `let` definitions",
                );
            }
            return None;
        }
        self.depth.set(self.depth.get() + 1);
        let lowered = lower();
        self.depth.set(self.depth.get() - 1);
        lowered
    }

    /// A pair's span without the whitespace a trailing optional part may
    /// have consumed, so underlines stop at the last token.
    fn span(&self, pair: &Pair<'_, Rule>) -> Span {
        let span = pair.as_span();
        let length = pair.as_str().trim_end().len();
        Span::new(
            span.start() + self.offset,
            span.start() + length + self.offset,
        )
    }

    /// The span of a statement's first token (its keyword), or the whole
    /// statement's when it has no inner parts.
    fn keyword_span(&self, pair: &Pair<'_, Rule>, statement: Span) -> Span {
        pair.clone()
            .into_inner()
            .next()
            .map_or(statement, |first| self.span(&first))
    }

    fn error(&self, code: codes::Code, span: Span, message: String, label: &str, help: &str) {
        let mut diagnostic = Diagnostic::new(code, message).at(self.source, span, label);
        if !help.is_empty() {
            diagnostic = diagnostic.help(help);
        }
        self.diagnostics.borrow_mut().push(diagnostic);
    }

    fn internal(&self, span: Span, what: &str) {
        self.error(codes::SYNTAX, span, missing(what), "here", "");
    }

    fn next<'i>(
        &self,
        iter: &mut std::vec::IntoIter<Pair<'i, Rule>>,
        at: Span,
        what: &str,
    ) -> Option<Pair<'i, Rule>> {
        let next = iter.next();
        if next.is_none() {
            self.internal(at, what);
        }
        next
    }

    // -------------------------------------------------------------- items

    pub fn file(&self, pair: Pair<'_, Rule>) -> PolicyFile {
        let items = pair
            .into_inner()
            .filter(|child| child.as_rule() != Rule::EOI)
            .filter_map(|child| self.item(child))
            .collect();
        PolicyFile { items }
    }

    /// Lowers the single item inside an `item_only` parse.
    pub fn item_only(&self, pair: Pair<'_, Rule>) -> Option<Item> {
        let item = pair
            .into_inner()
            .find(|child| child.as_rule() != Rule::EOI)?;
        self.item(item)
    }

    pub fn item(&self, pair: Pair<'_, Rule>) -> Option<Item> {
        let keyword = pair
            .clone()
            .into_inner()
            .next()
            .map_or_else(|| self.span(&pair), |first| self.span(&first));
        let span = self.span(&pair);
        let rule = pair.as_rule();
        let children = parts(pair);
        Some(match rule {
            Rule::policy_decl => {
                let mut iter = children.into_iter();
                let name = self.ident(self.next(&mut iter, span, "a policy name")?);
                let settings = iter.filter_map(|p| self.policy_setting(p)).collect();
                Item::Policy(PolicyDecl {
                    keyword,
                    name,
                    settings,
                })
            }
            Rule::models_block => Item::Models(ModelsBlock {
                keyword,
                statements: children
                    .into_iter()
                    .filter_map(|p| self.models_stmt(p))
                    .collect(),
            }),
            Rule::input_decl => Item::Input(Box::new(self.input_decl(keyword, span, children)?)),
            Rule::validate_block => {
                let mut block = ValidateBlock {
                    keyword,
                    rules: Vec::new(),
                    malformed_body: Vec::new(),
                };
                for statement in children.into_iter().filter_map(|p| self.validate_stmt(p)) {
                    match statement {
                        ValidateStmt::Reject(rule) => block.rules.push(rule),
                        ValidateStmt::MalformedBody(body) => block.malformed_body.push(body),
                    }
                }
                Item::Validate(block)
            }
            Rule::defaults_block => Item::Defaults(DefaultsBlock {
                keyword,
                layers: children
                    .into_iter()
                    .flat_map(|p| self.layers_stmt(p))
                    .collect(),
            }),
            Rule::merge_block => Item::Merge(MergeBlock {
                keyword,
                merges: children
                    .into_iter()
                    .filter_map(|p| self.merge_stmt(p))
                    .collect(),
            }),
            Rule::let_decl => {
                let mut iter = children.into_iter();
                let name = self.ident(self.next(&mut iter, span, "a name")?);
                let Some(value) = self
                    .next(&mut iter, span, "an expression")
                    .and_then(|p| self.expr(p))
                else {
                    self.broken_names.borrow_mut().push(name.name);
                    return None;
                };
                Item::Let(LetDecl {
                    keyword,
                    name,
                    value,
                })
            }
            Rule::eligibility_block => Item::Eligibility(EligibilityBlock {
                keyword,
                steps: children
                    .into_iter()
                    .filter_map(|p| self.eligibility_stmt(p))
                    .collect(),
            }),
            Rule::order_block => Item::Order(OrderBlock {
                keyword,
                statements: children
                    .into_iter()
                    .filter_map(|p| self.order_stmt(p))
                    .collect(),
            }),
            Rule::sort_decl => {
                let mut iter = children.into_iter();
                let name = self.ident(self.next(&mut iter, span, "a sort name")?);
                let keys = iter.filter_map(|p| self.by_stmt(p)).collect();
                Item::Sort(SortDecl {
                    keyword,
                    name,
                    keys,
                })
            }
            Rule::balance_decl => Item::Balance(self.balance_decl(keyword, span, children)?),
            Rule::failover_block => Item::Failover(FailoverBlock {
                keyword,
                statements: children
                    .into_iter()
                    .filter_map(|p| self.failover_stmt(p))
                    .collect(),
            }),
            Rule::health_block => Item::Health(HealthBlock {
                keyword,
                statements: children
                    .into_iter()
                    .filter_map(|p| self.health_stmt(p))
                    .collect(),
            }),
            Rule::capacity_block => Item::Capacity(CapacityBlock {
                keyword,
                statements: children
                    .into_iter()
                    .filter_map(|p| self.capacity_stmt(p))
                    .collect(),
            }),
            Rule::timeouts_block => Item::Timeouts(TimeoutsBlock {
                keyword,
                timeouts: children
                    .into_iter()
                    .filter_map(|p| self.timeout_stmt(p))
                    .collect(),
            }),
            Rule::stream_block => Item::Stream(StreamBlock {
                keyword,
                statements: children
                    .into_iter()
                    .filter_map(|p| self.stream_stmt(p))
                    .collect(),
            }),
            Rule::errors_block => Item::Errors(ErrorsBlock {
                keyword,
                errors: children
                    .into_iter()
                    .filter_map(|p| self.error_decl(p))
                    .collect(),
            }),
            Rule::headers_block => Item::Headers(HeadersBlock {
                keyword,
                fields: children
                    .into_iter()
                    .filter_map(|p| self.field_value(p))
                    .collect(),
            }),
            Rule::listing_block => Item::Listing(ListingBlock {
                keyword,
                fields: children
                    .into_iter()
                    .filter_map(|p| self.field_value(p))
                    .collect(),
            }),
            _ => {
                self.internal(span, "a section");
                return None;
            }
        })
    }

    /// Lowers one statement parsed on its own during error recovery, by the
    /// block kind it belongs to.
    pub fn statement(&self, block: BlockKind, pair: Pair<'_, Rule>) -> Option<Statement> {
        let inner = pair
            .into_inner()
            .find(|child| child.as_rule() != Rule::EOI)?;
        Some(match block {
            BlockKind::Policy => Statement::Policy(self.policy_setting(inner)?),
            BlockKind::Models => Statement::Models(self.models_stmt(inner)?),
            BlockKind::Validate => Statement::Validate(self.validate_stmt(inner)?),
            BlockKind::Defaults => Statement::Layers(self.layers_stmt(inner)),
            BlockKind::Merge => Statement::Merge(self.merge_stmt(inner)?),
            BlockKind::Eligibility => Statement::Eligibility(self.eligibility_stmt(inner)?),
            BlockKind::Order => Statement::Order(self.order_stmt(inner)?),
            BlockKind::Sort => Statement::SortKey(self.by_stmt(inner)?),
            BlockKind::Failover => Statement::Failover(self.failover_stmt(inner)?),
            BlockKind::Health => Statement::Health(self.health_stmt(inner)?),
            BlockKind::Capacity => Statement::Capacity(self.capacity_stmt(inner)?),
            BlockKind::Timeouts => Statement::Timeout(self.timeout_stmt(inner)?),
            BlockKind::Stream => Statement::Stream(self.stream_stmt(inner)?),
            BlockKind::Errors => Statement::Error(self.error_decl(inner)?),
            BlockKind::Headers | BlockKind::Listing => Statement::Field(self.field_value(inner)?),
        })
    }

    fn policy_setting(&self, pair: Pair<'_, Rule>) -> Option<PolicySetting> {
        let span = self.span(&pair);
        let mut inner = pair.into_inner();
        let kind_pair = inner.next()?;
        let kind_span = self.span(&kind_pair);
        let kind = match kind_pair.as_rule() {
            Rule::kw_catalog => DataFileKind::Catalog,
            Rule::kw_tenants => DataFileKind::Tenants,
            _ => {
                self.internal(span, "`catalog` or `tenants`");
                return None;
            }
        };
        let path = self.string(inner.next()?);
        Some(PolicySetting {
            kind,
            kind_span,
            path,
        })
    }

    // -------------------------------------------------------------- candidates

    fn models_stmt(&self, pair: Pair<'_, Rule>) -> Option<ModelsStmt> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        let rule = pair.as_rule();
        let children = parts(pair);
        match rule {
            Rule::source_stmt => Some(ModelsStmt::Sources {
                keyword,
                sources: children.into_iter().filter_map(|p| self.expr(p)).collect(),
            }),
            Rule::pin_stmt => {
                let template = self.string(children.into_iter().next()?);
                self.pin_template(template).map(ModelsStmt::Pin)
            }
            Rule::credentials_stmt => {
                let mut iter = children.into_iter();
                let mode_pair = self.next(&mut iter, span, "a credential mode")?;
                let mode = match mode_pair.as_rule() {
                    Rule::credentials_each => CredentialMode::Each,
                    _ => {
                        let keys = parts(mode_pair).into_iter().next()?;
                        CredentialMode::One(self.sort_keys(keys))
                    }
                };
                let error = self.ident(self.next(&mut iter, span, "an error name")?);
                Some(ModelsStmt::Credentials {
                    keyword,
                    mode,
                    error,
                })
            }
            Rule::unknown_stmt => {
                let inner = children.into_iter().next()?;
                match inner.as_rule() {
                    Rule::unknown_serve => {
                        let mut iter = parts(inner).into_iter();
                        let condition = self.expr(self.next(&mut iter, span, "a condition")?)?;
                        let keys = iter.next().map(|p| self.sort_keys(p)).unwrap_or_default();
                        Some(ModelsStmt::UnknownServe {
                            keyword,
                            condition,
                            keys,
                        })
                    }
                    _ => {
                        let error = self.ident(parts(inner).into_iter().next()?);
                        Some(ModelsStmt::UnknownError { keyword, error })
                    }
                }
            }
            Rule::one_provider_stmt => Some(ModelsStmt::OneProviderPerModel { span }),
            _ => {
                self.internal(span, "a `models` statement");
                None
            }
        }
    }

    fn pin_template(&self, template: StringLit) -> Option<PinTemplate> {
        let text = template.value.as_str();
        let bad = |this: &Lowerer, why: &str| {
            this.error(
                codes::BAD_PIN_TEMPLATE,
                template.span,
                format!("pin template `{text}` is not usable: {why}"),
                "this template",
                "write it as a prefix, `{provider}` or `{credential}`, a separator, then `{model}`, as in \"{provider}:{model}\" or \"@{credential}/{model}\"",
            );
            None
        };
        let (target, placeholder) = if text.contains("{provider}") {
            (PinTarget::Provider, "{provider}")
        } else if text.contains("{credential}") {
            (PinTarget::Credential, "{credential}")
        } else {
            return bad(self, "it names neither `{provider}` nor `{credential}`");
        };
        let Some((prefix, rest)) = text.split_once(placeholder) else {
            return bad(self, "the target placeholder is missing");
        };
        let Some(separator) = rest.strip_suffix("{model}") else {
            return bad(self, "it must end with `{model}`");
        };
        if separator.is_empty() || separator.contains('{') || prefix.contains('{') {
            return bad(
                self,
                "it needs a separator between the target and `{model}` and no other placeholder",
            );
        }
        Some(PinTemplate {
            span: template.span,
            text: template.value.clone(),
            target,
            prefix: prefix.to_string(),
            separator: separator.to_string(),
        })
    }

    // -------------------------------------------------------------- inputs

    fn input_decl(
        &self,
        keyword: Span,
        span: Span,
        children: Vec<Pair<'_, Rule>>,
    ) -> Option<InputDecl> {
        let mut iter = children.into_iter();
        let name = self.ident(self.next(&mut iter, span, "an input name")?);
        let result = self.input_rest(keyword, span, name.clone(), iter);
        if result.is_none() {
            self.broken_names.borrow_mut().push(name.name);
        }
        result
    }

    fn input_rest(
        &self,
        keyword: Span,
        span: Span,
        name: Ident,
        mut iter: std::vec::IntoIter<Pair<'_, Rule>>,
    ) -> Option<InputDecl> {
        let source_pair = self.next(&mut iter, span, "an input source")?;
        let mut source_inner = source_pair.into_inner();
        let source = match source_inner.next().map(|p| p.as_rule()) {
            Some(Rule::kw_header) => InputSource::Header,
            _ => InputSource::Body,
        };
        let source_name = self.string(source_inner.next()?);
        let ty = self.type_expr(self.next(&mut iter, span, "a type")?)?;
        let mut decl = InputDecl {
            keyword,
            name,
            source,
            source_name,
            ty,
            shorthand: None,
            malformed_error: None,
            invalid_error: None,
            unknown_error: None,
            unless: None,
        };
        let mut first_given: Vec<(Rule, Span)> = Vec::new();
        for clause in iter {
            let clause_span = self.span(&clause);
            let rule = clause.as_rule();
            if let Some((_, first)) = first_given.iter().find(|(given, _)| *given == rule) {
                self.clause_twice(&decl, rule, clause_span, *first);
                continue;
            }
            first_given.push((rule, clause_span));
            match rule {
                Rule::shorthand_clause => {
                    let mut inner = parts(clause).into_iter();
                    let ty = self.type_expr(self.next(&mut inner, clause_span, "a type")?)?;
                    let value = self.expr(self.next(&mut inner, clause_span, "a value")?)?;
                    decl.shorthand = Some(Shorthand {
                        span: clause_span,
                        ty,
                        value,
                    });
                }
                Rule::malformed_clause => {
                    decl.malformed_error = parts(clause).into_iter().next().map(|p| self.ident(p));
                }
                Rule::invalid_clause => {
                    decl.invalid_error = parts(clause).into_iter().next().map(|p| self.ident(p));
                }
                Rule::unknown_ref_clause => {
                    decl.unknown_error = parts(clause).into_iter().next().map(|p| self.ident(p));
                }
                Rule::unless_clause => {
                    let mut inner = parts(clause).into_iter();
                    decl.unless =
                        Some(self.expr(self.next(&mut inner, clause_span, "a condition")?)?);
                }
                _ => self.internal(clause_span, "an input clause"),
            }
        }
        Some(decl)
    }

    /// A clause an input has once, given again: the second would silently
    /// replace the first.
    fn clause_twice(&self, decl: &InputDecl, rule: Rule, again: Span, first: Span) {
        let clause = match rule {
            Rule::shorthand_clause => "shorthand",
            Rule::malformed_clause => "malformed error",
            Rule::invalid_clause => "invalid error",
            Rule::unknown_ref_clause => "unknown error",
            Rule::unless_clause => "unless",
            _ => "clause",
        };
        self.given_twice(
            format!("input `{}` has `{clause}` twice", decl.name.name),
            format!("an input has one `{clause}` clause; keep the one you mean"),
            again,
            first,
        );
    }

    /// E0501 for a clause given a second time, at `again`, after `first`.
    fn given_twice(&self, message: String, help: String, again: Span, first: Span) {
        let diagnostic = Diagnostic::new(codes::DUPLICATE_SECTION, message)
            .at(self.source, again, "given again here")
            .also(self.source, first, "first given here")
            .help(help);
        self.diagnostics.borrow_mut().push(diagnostic);
    }

    fn type_expr(&self, pair: Pair<'_, Rule>) -> Option<TypeExpr> {
        let span = self.span(&pair);
        let rule = pair.as_rule();
        let children = parts(pair);
        let kind = match rule {
            Rule::named_type => TypeExprKind::Named(self.ident(children.into_iter().next()?)),
            Rule::list_type => {
                TypeExprKind::List(Box::new(self.type_expr(children.into_iter().next()?)?))
            }
            Rule::csv_type => {
                TypeExprKind::Csv(Box::new(self.type_expr(children.into_iter().next()?)?))
            }
            Rule::object_type => TypeExprKind::Object(
                children
                    .into_iter()
                    .filter_map(|field| {
                        let mut inner = field.into_inner();
                        let name = self.ident(inner.next()?);
                        let ty = self.type_expr(inner.next()?)?;
                        Some(FieldDecl { name, ty })
                    })
                    .collect(),
            ),
            Rule::enum_type => {
                TypeExprKind::Enum(children.into_iter().map(|p| self.ident(p)).collect())
            }
            Rule::int_range => {
                let mut iter = children.into_iter();
                let low = self.number_value(self.next(&mut iter, span, "a number")?)?;
                let high = self.number_value(self.next(&mut iter, span, "a number")?)?;
                if low > high || low.fract() != 0.0 || high.fract() != 0.0 {
                    self.error(
                        codes::BAD_LITERAL,
                        span,
                        format!("`int {low}..{high}` is not a range of whole numbers"),
                        "this range",
                        "write the smaller whole number first, as in `int 1..3`",
                    );
                    return None;
                }
                TypeExprKind::IntRange { low, high }
            }
            Rule::like_type => TypeExprKind::Like(self.ident(children.into_iter().next()?)),
            _ => {
                self.internal(span, "a type");
                return None;
            }
        };
        Some(TypeExpr { kind, span })
    }

    fn validate_stmt(&self, pair: Pair<'_, Rule>) -> Option<ValidateStmt> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        if pair.as_rule() == Rule::malformed_body_stmt {
            let error = self.ident(parts(pair).into_iter().next()?);
            return Some(ValidateStmt::MalformedBody(MalformedBody {
                keyword,
                error,
            }));
        }
        let mut iter = parts(pair).into_iter();
        let condition = self.expr(self.next(&mut iter, span, "a condition")?)?;
        let error = self.ident(self.next(&mut iter, span, "an error name")?);
        Some(ValidateStmt::Reject(RejectRule {
            keyword,
            condition,
            error,
        }))
    }

    // -------------------------------------------------------------- defaults and merges

    fn layers_stmt(&self, pair: Pair<'_, Rule>) -> Vec<LayerRef> {
        parts(pair)
            .into_iter()
            .filter_map(|layer| {
                let span = self.span(&layer);
                let mut inner = layer.into_inner();
                let level = match inner.next()?.as_rule() {
                    Rule::kw_key => Level::Key,
                    Rule::kw_workspace => Level::Workspace,
                    _ => Level::Tenant,
                };
                let per_model = inner.next().is_some();
                Some(LayerRef {
                    level,
                    per_model,
                    span,
                })
            })
            .collect()
    }

    fn merge_stmt(&self, pair: Pair<'_, Rule>) -> Option<MergeDecl> {
        let span = self.span(&pair);
        let mut iter = parts(pair).into_iter();
        let name = self.ident(self.next(&mut iter, span, "a name")?);
        let broken =
            |this: &Self, name: &Ident| this.broken_names.borrow_mut().push(name.name.clone());
        let result = self.merge_rest(name.clone(), iter);
        if result.is_none() {
            broken(self, &name);
        }
        result
    }

    fn merge_rest(
        &self,
        name: Ident,
        mut iter: std::vec::IntoIter<Pair<'_, Rule>>,
    ) -> Option<MergeDecl> {
        let span = name.span;
        let op_pair = self.next(&mut iter, span, "a merge operator")?;
        let op_span = self.span(&op_pair);
        let op = match op_pair.as_str() {
            "intersect" => MergeOp::Intersect,
            "union" => MergeOp::Union,
            "min" => MergeOp::Min,
            "max" => MergeOp::Max,
            "all" => MergeOp::All,
            "any" => MergeOp::Any,
            _ => MergeOp::First,
        };
        let request = self.expr(self.next(&mut iter, span, "the request value")?)?;
        let default = self.expr(self.next(&mut iter, span, "the default value")?)?;
        let strict = iter
            .next()
            .and_then(|clause| parts(clause).into_iter().next())
            .map(|p| self.ident(p));
        Some(MergeDecl {
            name,
            op,
            op_span,
            request,
            default,
            strict,
        })
    }

    // -------------------------------------------------------------- eligibility and order

    fn eligibility_stmt(&self, pair: Pair<'_, Rule>) -> Option<Step> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        let rule = pair.as_rule();
        let mut iter = parts(pair).into_iter();
        let condition = self.expr(self.next(&mut iter, span, "a condition")?)?;
        match rule {
            Rule::require_stmt => {
                let error = self.ident(self.next(&mut iter, span, "an error name")?);
                Some(Step::Require {
                    keyword,
                    condition,
                    error,
                })
            }
            _ => Some(Step::PreferExclusively { keyword, condition }),
        }
    }

    fn order_stmt(&self, pair: Pair<'_, Rule>) -> Option<OrderStmt> {
        let span = self.span(&pair);
        match pair.as_rule() {
            Rule::by_stmt => self.by_stmt(pair).map(OrderStmt::By),
            _ => {
                let keyword = self.keyword_span(&pair, span);
                let selector = self.expr(parts(pair).into_iter().next()?)?;
                Some(OrderStmt::UseSort { keyword, selector })
            }
        }
    }

    fn by_stmt(&self, pair: Pair<'_, Rule>) -> Option<SortKey> {
        self.sort_key(parts(pair).into_iter().next()?)
    }

    fn sort_keys(&self, pair: Pair<'_, Rule>) -> Vec<SortKey> {
        pair.into_inner()
            .filter_map(|key| self.sort_key(key))
            .collect()
    }

    fn sort_key(&self, pair: Pair<'_, Rule>) -> Option<SortKey> {
        let mut inner = pair.into_inner();
        let expr = self.expr(inner.next()?)?;
        let mut key = SortKey {
            expr,
            descending: false,
            nulls_first: false,
        };
        for modifier in inner {
            match modifier.as_rule() {
                Rule::direction => key.descending = modifier.as_str() == "desc",
                Rule::nulls_clause => {
                    key.nulls_first = modifier
                        .into_inner()
                        .any(|p| p.as_rule() == Rule::nulls_position && p.as_str() == "first");
                }
                _ => {}
            }
        }
        Some(key)
    }

    fn balance_decl(
        &self,
        keyword: Span,
        span: Span,
        children: Vec<Pair<'_, Rule>>,
    ) -> Option<BalanceDecl> {
        let mut iter = children.into_iter();
        let strategy_pair = self.next(&mut iter, span, "a strategy")?;
        let strategy_span = self.span(&strategy_pair);
        let strategy = match strategy_pair.as_rule() {
            Rule::simple_strategy => match strategy_pair.as_str() {
                "random" => Strategy::Random,
                "round_robin" => Strategy::RoundRobin,
                _ => Strategy::LeastBusy,
            },
            Rule::weighted_strategy => {
                Strategy::Weighted(self.expr(parts(strategy_pair).into_iter().next()?)?)
            }
            _ => {
                let mut inner = parts(strategy_pair).into_iter();
                let key = self.sort_key(self.next(&mut inner, strategy_span, "a sort key")?)?;
                let tolerance =
                    self.percent_value(self.next(&mut inner, strategy_span, "a percentage")?)?;
                let among = inner.filter_map(|p| self.expr(p)).collect();
                Strategy::Share {
                    key,
                    tolerance,
                    among,
                }
            }
        };
        let when = iter.next().and_then(|p| self.expr(p));
        Some(BalanceDecl {
            keyword,
            strategy,
            strategy_span,
            when,
        })
    }

    // -------------------------------------------------------------- failover

    fn failover_stmt(&self, pair: Pair<'_, Rule>) -> Option<FailoverStmt> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        let rule = pair.as_rule();
        let mut iter = parts(pair).into_iter();
        match rule {
            Rule::attempts_stmt => Some(FailoverStmt::Attempts {
                keyword,
                limit: self.expr(self.next(&mut iter, span, "a limit")?)?,
            }),
            Rule::reorder_stmt => Some(FailoverStmt::Reorder {
                keyword,
                keys: self.sort_keys(self.next(&mut iter, span, "sort keys")?),
            }),
            Rule::keep_stmt => Some(FailoverStmt::Keep {
                keyword,
                condition: self.expr(self.next(&mut iter, span, "a condition")?)?,
            }),
            Rule::budget_stmt => {
                let limit = self.expr(self.next(&mut iter, span, "a limit")?)?;
                let error = self.ident(self.next(&mut iter, span, "an error name")?);
                Some(FailoverStmt::Budget {
                    keyword,
                    limit,
                    error,
                })
            }
            Rule::on_stmt => {
                let outcomes_pair = self.next(&mut iter, span, "outcomes")?;
                let outcomes = outcomes_pair
                    .into_inner()
                    .filter_map(|p| self.outcome(p))
                    .collect();
                let mut when = None;
                let mut consequences = Vec::new();
                for part in iter {
                    if part.as_rule() == Rule::expr {
                        when = self.expr(part);
                    } else if let Some(consequence) = self.consequence(part) {
                        consequences.push(consequence);
                    }
                }
                Some(FailoverStmt::On(OutcomeRule {
                    keyword,
                    outcomes,
                    when,
                    consequences,
                }))
            }
            _ => {
                self.internal(span, "a `failover` statement");
                None
            }
        }
    }

    fn outcome(&self, pair: Pair<'_, Rule>) -> Option<OutcomePattern> {
        let span = self.span(&pair);
        let text = pair.as_str();
        let kind = match pair.as_rule() {
            Rule::status_pattern => {
                let Some(kind) = status_range(text) else {
                    self.error(
                        codes::BAD_STATUS_PATTERN,
                        span,
                        format!("`{text}` is not an HTTP status or status class"),
                        "not a status",
                        "write a status from 100 to 599 such as `429`, or a class such as `5xx` or `40x`",
                    );
                    return None;
                };
                kind
            }
            _ => match text {
                "any" => OutcomeKind::Any,
                "connect_error" => OutcomeKind::ConnectError,
                "reset" => OutcomeKind::Reset,
                "timeout" => OutcomeKind::Timeout,
                "first_token_timeout" => OutcomeKind::FirstTokenTimeout,
                "malformed" => OutcomeKind::Malformed,
                _ => OutcomeKind::StreamBroken,
            },
        };
        Some(OutcomePattern { kind, span })
    }

    fn consequence(&self, pair: Pair<'_, Rule>) -> Option<Consequence> {
        let span = self.span(&pair);
        let rule = pair.as_rule();
        let children = parts(pair);
        Some(match rule {
            Rule::next_action => Consequence::Next { span },
            Rule::stop_action => Consequence::Stop { span },
            Rule::retry_action => Consequence::Retry {
                span,
                after: children.into_iter().next().and_then(|p| self.expr(p)),
            },
            Rule::pause_effect => {
                let mut iter = children.into_iter();
                let scope = scope_of(self.next(&mut iter, span, "a scope")?.as_str());
                let duration = self.expr(self.next(&mut iter, span, "a duration")?)?;
                Consequence::Pause {
                    span,
                    scope,
                    duration,
                }
            }
            Rule::penalize_effect => Consequence::Penalize {
                span,
                scope: scope_of(children.into_iter().next()?.as_str()),
            },
            Rule::error_effect => {
                Consequence::Error(self.error_choice(children.into_iter().next()?)?)
            }
            _ => {
                self.internal(span, "a consequence");
                return None;
            }
        })
    }

    fn error_choice(&self, pair: Pair<'_, Rule>) -> Option<ErrorChoice> {
        let span = self.span(&pair);
        self.deeper(span, || {
            let mut iter = parts(pair).into_iter();
            let error = self.ident(self.next(&mut iter, span, "an error name")?);
            let otherwise = match (iter.next(), iter.next()) {
                (Some(condition), Some(rest)) => {
                    Some((self.expr(condition)?, Box::new(self.error_choice(rest)?)))
                }
                _ => None,
            };
            Some(ErrorChoice { error, otherwise })
        })
    }

    // -------------------------------------------------------------- health, capacity, timeouts, streams

    fn health_stmt(&self, pair: Pair<'_, Rule>) -> Option<HealthStmt> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        let rule = pair.as_rule();
        let mut iter = parts(pair).into_iter();
        match rule {
            Rule::penalty_stmt => {
                let base = self.expr(self.next(&mut iter, span, "a base duration")?)?;
                let factor = self.expr(self.next(&mut iter, span, "a factor")?)?;
                let max = self.expr(self.next(&mut iter, span, "a maximum")?)?;
                let reset = self.expr(self.next(&mut iter, span, "a reset duration")?)?;
                Some(HealthStmt::Penalty(Box::new(PenaltyDecl {
                    keyword,
                    base,
                    factor,
                    max,
                    reset,
                })))
            }
            _ => Some(HealthStmt::Window {
                keyword,
                window: self.expr(self.next(&mut iter, span, "a duration")?)?,
            }),
        }
    }

    fn capacity_stmt(&self, pair: Pair<'_, Rule>) -> Option<CapacityStmt> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        let rule = pair.as_rule();
        let mut iter = parts(pair).into_iter();
        match rule {
            Rule::wait_stmt => Some(CapacityStmt::Wait {
                keyword,
                limit: self.expr(self.next(&mut iter, span, "a duration")?)?,
            }),
            _ => Some(CapacityStmt::Error {
                keyword,
                error: self.ident(self.next(&mut iter, span, "an error name")?),
            }),
        }
    }

    fn timeout_stmt(&self, pair: Pair<'_, Rule>) -> Option<TimeoutDecl> {
        let span = self.span(&pair);
        let mut iter = parts(pair).into_iter();
        let kind_pair = self.next(&mut iter, span, "a timeout name")?;
        let kind_span = self.span(&kind_pair);
        let kind = match kind_pair.as_str() {
            "connect" => TimeoutKind::Connect,
            "headers" => TimeoutKind::Headers,
            "first_token" => TimeoutKind::FirstToken,
            "idle" => TimeoutKind::Idle,
            _ => TimeoutKind::Attempt,
        };
        let value = self.expr(self.next(&mut iter, span, "a duration")?)?;
        Some(TimeoutDecl {
            kind,
            kind_span,
            value,
        })
    }

    fn stream_stmt(&self, pair: Pair<'_, Rule>) -> Option<StreamStmt> {
        let span = self.span(&pair);
        let keyword = self.keyword_span(&pair, span);
        let rule = pair.as_rule();
        let value = self.expr(parts(pair).into_iter().next()?)?;
        Some(match rule {
            Rule::hold_headers_stmt => StreamStmt::HoldHeaders {
                keyword,
                limit: value,
            },
            Rule::after_commit_stmt => StreamStmt::AfterCommit {
                keyword,
                limit: value,
            },
            _ => StreamStmt::LateComment {
                keyword,
                text: value,
            },
        })
    }

    // -------------------------------------------------------------- errors and fields

    fn error_decl(&self, pair: Pair<'_, Rule>) -> Option<ErrorDecl> {
        let span = self.span(&pair);
        let mut iter = parts(pair).into_iter();
        let name = self.ident(self.next(&mut iter, span, "an error name")?);
        let status = self
            .next(&mut iter, span, "a status")
            .and_then(|p| self.expr(p));
        let message = self
            .next(&mut iter, span, "a message")
            .and_then(|p| self.expr(p));
        let (Some(status), Some(message)) = (status, message) else {
            self.broken_names.borrow_mut().push(name.name);
            return None;
        };
        let mut decl = ErrorDecl {
            name,
            status,
            message,
            retry_after: None,
            should_retry: None,
            error_type: None,
        };
        let mut given_at: [Option<Span>; 3] = [None; 3];
        for option in iter {
            let option_span = self.span(&option);
            let mut inner = option.into_inner();
            let Some(which) = inner.next() else { continue };
            let (slot, clause) = match which.as_rule() {
                Rule::kw_retry_after => (0, "retry_after"),
                Rule::kw_should_retry => (1, "should_retry"),
                _ => (2, "type"),
            };
            let Some(given) = given_at.get_mut(slot) else {
                continue;
            };
            if let Some(first) = *given {
                self.error_option_twice(&decl, clause, option_span, first);
                continue;
            }
            *given = Some(option_span);
            let Some(value) = inner.next().and_then(|p| self.expr(p)) else {
                continue;
            };
            *match slot {
                0 => &mut decl.retry_after,
                1 => &mut decl.should_retry,
                _ => &mut decl.error_type,
            } = Some(value);
        }
        Some(decl)
    }

    /// An error's `retry_after`, `should_retry` or `type` given again: the
    /// second would silently replace the first.
    fn error_option_twice(&self, decl: &ErrorDecl, clause: &str, again: Span, first: Span) {
        self.given_twice(
            format!("error `{}` has `{clause}` twice", decl.name.name),
            format!("an error has one `{clause}`; keep the one you mean"),
            again,
            first,
        );
    }

    fn field_value(&self, pair: Pair<'_, Rule>) -> Option<FieldValue> {
        let mut iter = pair.into_inner();
        let name = self.string(iter.next()?);
        let value = self.expr(iter.next()?)?;
        Some(FieldValue { name, value })
    }

    // -------------------------------------------------------------- expressions

    pub fn expr(&self, pair: Pair<'_, Rule>) -> Option<Expr> {
        let span = self.span(&pair);
        let inner = pair.into_inner();
        if inner.len() > MAX_EXPRESSION_PARTS {
            self.error(
                codes::TOO_DEEP,
                span,
                format!(
                    "this expression chains more than {} operands",
                    MAX_EXPRESSION_PARTS / 2
                ),
                "this expression",
                "split it into `let` definitions; a chain of `x == a or x == b …` is `x in [a, b, …]`",
            );
            return None;
        }
        self.deeper(span, || self.pratt(inner))
    }

    fn pratt(&self, pairs: Pairs<'_, Rule>) -> Option<Expr> {
        let offset = self.offset;
        let shift = |pair: &Pair<'_, Rule>| {
            let span = pair.as_span();
            Span::new(span.start() + offset, span.end() + offset)
        };
        PRATT
            .map_primary(|primary| self.primary(primary))
            .map_prefix(|op, operand| {
                let operand = operand?;
                let op_span = shift(&op);
                let op = match op.as_rule() {
                    Rule::op_not => UnaryOp::Not,
                    _ => UnaryOp::Negate,
                };
                Some(Expr {
                    span: op_span.to(operand.span),
                    kind: ExprKind::Unary(op, Box::new(operand)),
                })
            })
            .map_infix(|lhs, op, rhs| {
                let (lhs, rhs) = (lhs?, rhs?);
                let op = match op.as_rule() {
                    Rule::op_implies => BinaryOp::Implies,
                    Rule::op_or => BinaryOp::Or,
                    Rule::op_and => BinaryOp::And,
                    Rule::op_eq => BinaryOp::Eq,
                    Rule::op_ne => BinaryOp::Ne,
                    Rule::op_lt => BinaryOp::Lt,
                    Rule::op_le => BinaryOp::Le,
                    Rule::op_gt => BinaryOp::Gt,
                    Rule::op_ge => BinaryOp::Ge,
                    Rule::op_in => BinaryOp::In,
                    Rule::op_not_in => BinaryOp::NotIn,
                    Rule::op_add => BinaryOp::Add,
                    Rule::op_sub => BinaryOp::Sub,
                    Rule::op_mul => BinaryOp::Mul,
                    _ => BinaryOp::Div,
                };
                Some(Expr {
                    span: lhs.span.to(rhs.span),
                    kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                })
            })
            .parse(pairs)
    }

    fn primary(&self, pair: Pair<'_, Rule>) -> Option<Expr> {
        let span = self.span(&pair);
        let rule = pair.as_rule();
        let kind = match rule {
            Rule::paren => {
                let inner = pair.into_inner().next()?;
                let mut bracketed = self.expr(inner)?;
                bracketed.span = span;
                return Some(bracketed);
            }
            Rule::path => ExprKind::Path(pair.into_inner().map(|p| self.ident(p)).collect()),
            Rule::if_expr => {
                let mut iter = parts(pair).into_iter();
                let condition = self.expr(self.next(&mut iter, span, "a condition")?)?;
                let then = self.expr(self.next(&mut iter, span, "a value")?)?;
                let otherwise = self.expr(self.next(&mut iter, span, "a value")?)?;
                ExprKind::If(Box::new(condition), Box::new(then), Box::new(otherwise))
            }
            Rule::aggregate => {
                let mut iter = parts(pair).into_iter();
                let function_pair = self.next(&mut iter, span, "an aggregate")?;
                let function_span = self.span(&function_pair);
                let function = match function_pair.as_str() {
                    "min_of" => Aggregate::MinOf,
                    "max_of" => Aggregate::MaxOf,
                    "avg_of" => Aggregate::AvgOf,
                    "count_of" => Aggregate::CountOf,
                    "all_of" => Aggregate::AllOf,
                    "any_of" => Aggregate::AnyOf,
                    _ => Aggregate::ListOf,
                };
                let value = self.expr(self.next(&mut iter, span, "a value")?)?;
                let filter = match iter.next() {
                    Some(filter) => Some(Box::new(self.expr(filter)?)),
                    None => None,
                };
                ExprKind::Aggregate {
                    function,
                    function_span,
                    value: Box::new(value),
                    filter,
                }
            }
            Rule::call => {
                let mut iter = pair.into_inner();
                let name = self.ident(iter.next()?);
                let args = iter.map(|p| self.expr(p)).collect::<Option<Vec<_>>>()?;
                ExprKind::Call(name, args)
            }
            Rule::list_lit => ExprKind::List(
                pair.into_inner()
                    .map(|p| self.expr(p))
                    .collect::<Option<Vec<_>>>()?,
            ),
            Rule::object_lit => ExprKind::Object(
                pair.into_inner()
                    .map(|field| {
                        let mut inner = field.into_inner();
                        let name = self.ident(inner.next()?);
                        let value = self.expr(inner.next()?)?;
                        Some((name, value))
                    })
                    .collect::<Option<Vec<_>>>()?,
            ),
            Rule::duration => ExprKind::Literal(Literal::Duration(self.duration_value(&pair)?)),
            Rule::percent => ExprKind::Literal(Literal::Percent(self.percent_value(pair)?)),
            Rule::number => ExprKind::Literal(Literal::Number(self.number_value(pair)?)),
            Rule::string => ExprKind::Literal(Literal::String(self.string(pair).value)),
            Rule::boolean => ExprKind::Literal(Literal::Bool(pair.as_str() == "true")),
            Rule::null => ExprKind::Literal(Literal::Null),
            _ => {
                self.internal(span, "an expression");
                return None;
            }
        };
        Some(Expr { kind, span })
    }

    // -------------------------------------------------------------- tokens

    fn ident(&self, pair: Pair<'_, Rule>) -> Ident {
        Ident {
            name: pair.as_str().to_string(),
            span: self.span(&pair),
        }
    }

    fn string(&self, pair: Pair<'_, Rule>) -> StringLit {
        let span = self.span(&pair);
        let raw = pair.into_inner().next().map_or("", |inner| inner.as_str());
        let mut value = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => value.push('\n'),
                    Some('t') => value.push('\t'),
                    Some(other) => value.push(other),
                    None => {}
                }
            } else {
                value.push(c);
            }
        }
        StringLit { value, span }
    }

    fn number_value(&self, pair: Pair<'_, Rule>) -> Option<f64> {
        let span = self.span(&pair);
        let text = pair.as_str();
        match text.parse::<f64>() {
            Ok(value) if value.is_finite() && value <= 1e15 => Some(value),
            _ => {
                self.error(
                    codes::BAD_LITERAL,
                    span,
                    format!("`{text}` is too large"),
                    "this number",
                    "numbers in policies are at most 1000000000000000 (10 to the 15th), written out in digits",
                );
                None
            }
        }
    }

    fn percent_value(&self, pair: Pair<'_, Rule>) -> Option<f64> {
        let span = self.span(&pair);
        let text = pair.as_str();
        match text.trim_end_matches('%').parse::<f64>() {
            Ok(value) if value.is_finite() && value <= 1e6 => Some(value / 100.0),
            _ => {
                self.error(
                    codes::BAD_LITERAL,
                    span,
                    format!("`{text}` is not a usable percentage"),
                    "this percentage",
                    "write a percentage such as `10%`",
                );
                None
            }
        }
    }

    fn duration_value(&self, pair: &Pair<'_, Rule>) -> Option<u64> {
        let span = self.span(pair);
        let text = pair.as_str();
        let split = text
            .find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let scale = match unit {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            _ => 86_400_000.0,
        };
        let millis = number.parse::<f64>().ok().map(|value| value * scale);
        match millis {
            Some(ms) if ms.is_finite() && ms.fract() == 0.0 && ms <= MAX_DURATION_MS as f64 => {
                Some(ms as u64)
            }
            Some(ms) if ms.is_finite() && ms.fract() != 0.0 => {
                self.error(
                    codes::BAD_LITERAL,
                    span,
                    format!("`{text}` is not a whole number of milliseconds"),
                    "this duration",
                    "durations are counted in whole milliseconds; write it in `ms`",
                );
                None
            }
            _ => {
                self.error(
                    codes::BAD_LITERAL,
                    span,
                    format!("`{text}` is longer than a year"),
                    "this duration",
                    "durations in policies are at most `365d`",
                );
                None
            }
        }
    }
}

fn scope_of(text: &str) -> HealthScope {
    match text {
        "route" => HealthScope::Route,
        "credential" => HealthScope::Credential,
        _ => HealthScope::Provider,
    }
}

/// `429` → 429..=429, `5xx` → 500..=599, `40x` → 400..=409.
fn status_range(text: &str) -> Option<OutcomeKind> {
    let bytes = text.as_bytes();
    let first = bytes.first()?;
    if !(b'1'..=b'5').contains(first) {
        return None;
    }
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    let wildcards = text.len() - digits.len();
    if text[digits.len()..].chars().any(|c| c != 'x') {
        return None;
    }
    let base: u16 = digits.parse().ok()?;
    let scale = 10u16.pow(u32::try_from(wildcards).ok()?);
    let low = base * scale;
    Some(OutcomeKind::Status {
        low,
        high: low + scale - 1,
    })
}

/// A statement of `validate`.
#[derive(Debug)]
pub enum ValidateStmt {
    Reject(RejectRule),
    MalformedBody(MalformedBody),
}

/// Which block a statement parsed during recovery belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Policy,
    Models,
    Validate,
    Defaults,
    Merge,
    Eligibility,
    Order,
    Sort,
    Failover,
    Health,
    Capacity,
    Timeouts,
    Stream,
    Errors,
    Headers,
    Listing,
}

/// A statement lowered on its own during recovery.
#[derive(Debug)]
pub enum Statement {
    Policy(PolicySetting),
    Models(ModelsStmt),
    Validate(ValidateStmt),
    Layers(Vec<LayerRef>),
    Merge(MergeDecl),
    Eligibility(Step),
    Order(OrderStmt),
    SortKey(SortKey),
    Failover(FailoverStmt),
    Health(HealthStmt),
    Capacity(CapacityStmt),
    Timeout(TimeoutDecl),
    Stream(StreamStmt),
    Error(ErrorDecl),
    Field(FieldValue),
}

impl BlockKind {
    pub fn of_keyword(keyword: &str) -> Option<BlockKind> {
        Some(match keyword {
            "policy" => BlockKind::Policy,
            "models" => BlockKind::Models,
            "validate" => BlockKind::Validate,
            "defaults" => BlockKind::Defaults,
            "merge" => BlockKind::Merge,
            "eligibility" => BlockKind::Eligibility,
            "order" => BlockKind::Order,
            "sort" => BlockKind::Sort,
            "failover" => BlockKind::Failover,
            "health" => BlockKind::Health,
            "capacity" => BlockKind::Capacity,
            "timeouts" => BlockKind::Timeouts,
            "stream" => BlockKind::Stream,
            "errors" => BlockKind::Errors,
            "headers" => BlockKind::Headers,
            "listing" => BlockKind::Listing,
            _ => return None,
        })
    }

    /// The grammar rule that parses one statement of this block.
    pub fn statement_rule(self) -> Rule {
        match self {
            BlockKind::Policy => Rule::policy_setting_only,
            BlockKind::Models => Rule::models_stmt_only,
            BlockKind::Validate => Rule::validate_stmt_only,
            BlockKind::Defaults => Rule::layers_stmt_only,
            BlockKind::Merge => Rule::merge_stmt_only,
            BlockKind::Eligibility => Rule::eligibility_stmt_only,
            BlockKind::Order => Rule::order_stmt_only,
            BlockKind::Sort => Rule::by_stmt_only,
            BlockKind::Failover => Rule::failover_stmt_only,
            BlockKind::Health => Rule::health_stmt_only,
            BlockKind::Capacity => Rule::capacity_stmt_only,
            BlockKind::Timeouts => Rule::timeout_stmt_only,
            BlockKind::Stream => Rule::stream_stmt_only,
            BlockKind::Errors => Rule::error_decl_only,
            BlockKind::Headers | BlockKind::Listing => Rule::header_decl_only,
        }
    }

    /// The words that begin a statement of this block; `None` for blocks whose
    /// statements begin with a name or string followed by `=`.
    pub fn statement_keywords(self) -> Option<&'static [&'static str]> {
        Some(match self {
            BlockKind::Policy => &["catalog", "tenants"],
            BlockKind::Models => &["from", "pin", "credentials", "unknown", "one"],
            BlockKind::Validate => &["reject", "malformed"],
            BlockKind::Defaults => &["layers"],
            BlockKind::Eligibility => &["require", "prefer"],
            BlockKind::Order => &["by", "use"],
            BlockKind::Sort => &["by"],
            BlockKind::Failover => &["attempts", "reorder", "keep", "budget", "on"],
            BlockKind::Health => &["penalty", "window"],
            BlockKind::Capacity => &["wait", "error"],
            BlockKind::Timeouts => &["connect", "headers", "first_token", "idle", "attempt"],
            BlockKind::Stream => &["hold_headers", "late_comment", "after_commit"],
            BlockKind::Merge | BlockKind::Errors | BlockKind::Headers | BlockKind::Listing => {
                return None;
            }
        })
    }
}

/// Used by tests and the fuzz target: parse an expression on its own.
pub fn parse_expression(source: SourceId, text: &str) -> (Option<Expr>, Vec<Diagnostic>) {
    use pest::Parser;
    let lowerer = Lowerer::new(source, 0);
    match PolicyParser::parse(Rule::expr_only, text) {
        Ok(mut pairs) => {
            let expr = pairs
                .next()
                .and_then(|only| only.into_inner().next())
                .and_then(|pair| lowerer.expr(pair));
            (expr, lowerer.diagnostics.into_inner())
        }
        Err(error) => (
            None,
            vec![super::errors::syntax_error(source, (0, true), text, &error)],
        ),
    }
}
