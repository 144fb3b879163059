//! The checker: resolves every name of a policy against its data schema,
//! type-checks every expression in the place it appears, and reports
//! conflicts, missing parts and rules that can never apply. A clean policy
//! comes out elaborated as an [`ir::Program`](crate::language::ir::Program).

mod env;
mod expr;
mod inputs;
mod items;
mod outcomes;
mod types;

pub use env::{Root, RootTypes};
pub use types::{EnumTy, RecordTy, Ty};

use crate::data::Data;
use crate::data::schema::Schema;
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::language::ast::*;
use crate::language::ir::{self, DefRef, ErrorRef, Program, Term};
use crate::source::{SourceId, Span};
use env::{Builtins, Place, Roots};
use expr::{Scope, Usage};
use std::collections::{HashMap, HashSet};

/// A `let` or `merge` definition and what checking it found.
struct Definition<'a> {
    kind: DefinitionKind<'a>,
    name: &'a Ident,
    reference: DefRef,
    state: DefinitionState,
    used: bool,
}

enum DefinitionKind<'a> {
    Let(&'a LetDecl),
    Merge(&'a MergeDecl),
}

#[derive(Clone)]
enum DefinitionState {
    Unchecked,
    Checking,
    /// Checked: its type, what it reads, and how deep the chain of
    /// definitions it stands on goes (1 for one that uses none).
    Done(Ty, Usage, usize),
}

/// Where an error can be raised, which decides what its declaration may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RaiseKind {
    /// Before any provider is tried: validation, merges, eligibility, models.
    BeforeAttempt,
    /// After a provider answered: `on` rules.
    Outcome,
    /// When no provider had capacity, or the time budget ran out.
    Exhausted,
}

struct InputInfo<'a> {
    decl: &'a InputDecl,
    ty: Ty,
    used: bool,
}

/// Deepest chain of definitions using definitions that is accepted,
/// whatever order they are written in; the evaluator allows a little more
/// (`machine::MAX_DEPTH`), so a checked policy never reaches its limit.
const MAX_DEFINITION_DEPTH: usize = 200;

/// Below this much stack left, a definition's check continues on a new
/// segment of `STACK_SEGMENT` bytes.
pub const STACK_RED_ZONE: usize = 256 * 1024;
pub const STACK_SEGMENT: usize = 4 * 1024 * 1024;

pub struct Checker<'a> {
    source: SourceId,
    data: &'a Data,
    roots: RootTypes,
    input_ty: Ty,
    inputs: Vec<InputInfo<'a>>,
    definitions: Vec<Definition<'a>>,
    /// Definition names → their index in `definitions`.
    definition_index: HashMap<String, usize>,
    /// How many definitions are being checked, each inside the one before.
    definition_depth: usize,
    /// The deepest chain of definitions the definition being checked has
    /// used so far: a definition checked earlier counts with its whole
    /// chain, so the limit does not depend on the order of the file.
    deepest_used: usize,
    /// A definition was refused as too deep before its uses were read, so
    /// some definitions seem unused that are not.
    definitions_cut_short: bool,
    broken_names: HashSet<String>,
    /// Declared errors in file order; their index is their `ErrorRef`.
    errors: Vec<&'a ErrorDecl>,
    raised: HashMap<String, Vec<(RaiseKind, Span)>>,
    /// Input names read anywhere (`input.NAME`).
    input_reads: HashSet<String>,
    /// Sort names some `use sort` selector can choose.
    selectable_sorts: HashSet<String>,
    usage: Usage,
    diagnostics: Vec<Diagnostic>,
    /// Some statements did not parse: what seems missing may be in them.
    incomplete: bool,
    program: Parts,
}

/// The elaborated program as it is assembled, section by section.
#[derive(Default)]
struct Parts {
    inputs: Vec<ir::InputSpec>,
    rejects: Vec<ir::Reject>,
    malformed_body: Option<ErrorRef>,
    layers: Vec<ir::LayerSpec>,
    lets: Vec<Option<ir::LetSpec>>,
    merges: Vec<Option<ir::MergeSpec>>,
    models: Option<ir::ModelsSpec>,
    steps: Vec<ir::StepSpec>,
    order: Vec<ir::OrderPart>,
    balance: Vec<ir::BalanceSpec>,
    failover: Option<ir::FailoverSpec>,
    penalty: Option<ir::PenaltySpec>,
    stats_window: Option<Term>,
    capacity_wait: Option<Term>,
    capacity_error: Option<ErrorRef>,
    timeouts: Vec<(TimeoutKind, Term)>,
    hold_headers: Option<Term>,
    late_comment: Option<Term>,
    after_commit: Option<Term>,
    errors: Vec<ir::ErrorSpec>,
    headers: Vec<ir::FieldSpec>,
    listing: Vec<ir::FieldSpec>,
}

const LET_PLACE: Place = Place::candidate_set("a `let` definition");
const PASSTHROUGH: &str = "passthrough";

/// The layers `defaults.NAME` consults when a policy does not say.
const DEFAULT_LAYERS: [(Level, bool); 6] = [
    (Level::Key, true),
    (Level::Key, false),
    (Level::Workspace, true),
    (Level::Workspace, false),
    (Level::Tenant, true),
    (Level::Tenant, false),
];

/// Sections that may appear at most once.
const SINGLE_SECTIONS: &[&str] = &[
    "policy",
    "models",
    "validate",
    "defaults",
    "merge",
    "eligibility",
    "order",
    "failover",
    "health",
    "capacity",
    "timeouts",
    "stream",
    "errors",
    "headers",
    "listing",
];

impl<'a> Checker<'a> {
    /// Checks a parsed policy against its data. Returns every diagnostic,
    /// and the elaborated program (meaningful only when there is no error).
    /// With `incomplete`, some statements did not parse, so findings of
    /// things never used or never produced are left out.
    pub fn run(
        source: SourceId,
        file: &'a PolicyFile,
        broken_names: &[String],
        incomplete: bool,
        data: &'a Data,
    ) -> (Vec<Diagnostic>, Program) {
        let builtins = Builtins::new();
        let roots = RootTypes::new(&data.schema, &builtins);
        let mut checker = Checker {
            source,
            data,
            roots,
            input_ty: Ty::Unknown,
            inputs: Vec::new(),
            definitions: Vec::new(),
            definition_index: HashMap::new(),
            definition_depth: 0,
            deepest_used: 0,
            definitions_cut_short: false,
            broken_names: broken_names.iter().cloned().collect(),
            errors: Vec::new(),
            raised: HashMap::new(),
            input_reads: HashSet::new(),
            selectable_sorts: HashSet::new(),
            usage: Usage::default(),
            diagnostics: Vec::new(),
            incomplete,
            program: Parts::default(),
        };
        checker.sections(file);
        checker.declarations(file);
        checker.declare_inputs(file);
        // Every definition is checked once, up front, so its diagnostics are
        // reported once whatever place uses it first.
        checker.check_definitions();
        for item in &file.items {
            checker.item(item, file);
        }
        checker.error_declarations(incomplete);
        checker.structure(file, incomplete);
        if !incomplete {
            checker.unused(file);
        }
        let name = file
            .items
            .iter()
            .find_map(|item| match item {
                Item::Policy(policy) => Some(policy.name.name.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let program = checker.program.finish(name);
        (checker.diagnostics, program)
    }

    fn schema(&self) -> &Schema {
        &self.data.schema
    }

    fn error_at(
        &mut self,
        code: codes::Code,
        span: Span,
        message: String,
        label: &str,
        help: Option<String>,
    ) {
        let source = self.source;
        self.diagnostics.push(
            Diagnostic::new(code, message)
                .at(source, span, label)
                .help_opt(help),
        );
    }

    /// Reports a name given twice with both places; `verb` is "defined" or
    /// "declared", as the message says.
    fn twice(&mut self, code: codes::Code, message: String, again: Span, first: Span, help: &str) {
        let verb = if message.contains("declared") {
            "declared"
        } else {
            "defined"
        };
        let source = self.source;
        self.diagnostics.push(
            Diagnostic::new(code, message)
                .at(source, again, format!("{verb} again here"))
                .also(source, first, format!("first {verb} here"))
                .help(help),
        );
    }

    // ------------------------------------------------------------------ sections and declarations

    fn sections(&mut self, file: &PolicyFile) {
        let mut first_seen: HashMap<&str, Span> = HashMap::new();
        for item in &file.items {
            let keyword = item.keyword();
            if !SINGLE_SECTIONS.contains(&keyword) {
                continue;
            }
            match first_seen.get(keyword) {
                Some(first) => {
                    let source = self.source;
                    self.diagnostics.push(
                        Diagnostic::new(
                            codes::DUPLICATE_SECTION,
                            format!("`{keyword}` appears twice"),
                        )
                        .at(
                            source,
                            item.keyword_span(),
                            format!("second `{keyword}` here"),
                        )
                        .also(source, *first, "first one here")
                        .help(format!(
                            "a policy has one `{keyword}` section; merge the two"
                        )),
                    );
                }
                None => {
                    first_seen.insert(keyword, item.keyword_span());
                }
            }
        }
    }

    fn declarations(&mut self, file: &'a PolicyFile) {
        let mut names: HashMap<String, Span> = HashMap::new();
        let mut claim = |checker: &mut Checker<'a>, ident: &Ident, what: &str| -> bool {
            if let Some(first) = names.get(&ident.name) {
                checker.twice(
                    codes::DUPLICATE_DEFINITION,
                    format!("{what} `{}` is defined twice", ident.name),
                    ident.span,
                    *first,
                    "rename one of them",
                );
                false
            } else if Root::from_name(&ident.name).is_some() || ident.name == "self" {
                checker.error_at(
                    codes::DUPLICATE_DEFINITION,
                    ident.span,
                    format!("`{}` is a built-in name", ident.name),
                    "already means something",
                    Some(String::from("choose another name")),
                );
                false
            } else {
                names.insert(ident.name.clone(), ident.span);
                true
            }
        };
        for item in &file.items {
            match item {
                Item::Let(decl) if claim(self, &decl.name, "let") => {
                    let index = self.program.lets.len();
                    self.program.lets.push(None);
                    self.definition_index
                        .insert(decl.name.name.clone(), self.definitions.len());
                    self.definitions.push(Definition {
                        kind: DefinitionKind::Let(decl),
                        name: &decl.name,
                        reference: DefRef::Let(index),
                        state: DefinitionState::Unchecked,
                        used: false,
                    });
                }
                Item::Merge(block) => {
                    for merge in &block.merges {
                        if claim(self, &merge.name, "merge") {
                            let index = self.program.merges.len();
                            self.program.merges.push(None);
                            self.definition_index
                                .insert(merge.name.name.clone(), self.definitions.len());
                            self.definitions.push(Definition {
                                kind: DefinitionKind::Merge(merge),
                                name: &merge.name,
                                reference: DefRef::Merge(index),
                                state: DefinitionState::Unchecked,
                                used: false,
                            });
                        }
                    }
                }
                Item::Errors(block) => {
                    for error in &block.errors {
                        if error.name.name == PASSTHROUGH {
                            self.error_at(
                                codes::DUPLICATE_DEFINITION,
                                error.name.span,
                                String::from("`passthrough` is a built-in error"),
                                "reserved",
                                Some(String::from(
                                    "`error passthrough` returns the provider's own answer; choose another name",
                                )),
                            );
                        } else if let Some(first) =
                            self.errors.iter().find(|e| e.name.name == error.name.name)
                        {
                            let first = first.name.span;
                            self.twice(
                                codes::DUPLICATE_DEFINITION,
                                format!("error `{}` is declared twice", error.name.name),
                                error.name.span,
                                first,
                                "error codes are unique; rename one",
                            );
                        } else {
                            self.errors.push(error);
                        }
                    }
                }
                _ => {}
            }
        }
        let mut sorts: HashMap<&str, Span> = HashMap::new();
        for item in &file.items {
            if let Item::Sort(sort) = item {
                if let Some(first) = sorts.get(sort.name.name.as_str()) {
                    let first = *first;
                    self.twice(
                        codes::DUPLICATE_DEFINITION,
                        format!("sort `{}` is declared twice", sort.name.name),
                        sort.name.span,
                        first,
                        "rename one of them",
                    );
                } else {
                    sorts.insert(&sort.name.name, sort.name.span);
                }
            }
        }
    }

    /// What a name stands for, for telling whether a `retry` or a
    /// `budget` is bounded: a `let`'s or `merge`'s expressions, and whether
    /// `input.NAME` has a bounded type.
    fn named(&self, name: &str) -> Option<expr::Named<'a>> {
        if let Some((root, attribute)) = name.split_once('.') {
            let schema = &self.data.schema;
            let table = match root {
                "defaults" => Some(&schema.settings),
                "tenant" => Some(&schema.tenant),
                "workspace" => Some(&schema.workspace),
                "key" => Some(&schema.key),
                "provider" => Some(&schema.provider),
                "route" => Some(&schema.route),
                "model" => Some(&schema.model),
                "credential" => Some(&schema.credential),
                "deployment" => Some(&schema.deployment),
                _ => None,
            };
            if let Some(decl) = table.and_then(|table| table.get(attribute)) {
                return (!decl.required && decl.default.is_none())
                    .then_some(expr::Named::MayBeAbsent);
            }
        }
        if let Some(input) = name.strip_prefix("input.") {
            let info = self.inputs.iter().find(|i| i.decl.name.name == input)?;
            return matches!(info.decl.ty.kind, TypeExprKind::IntRange { .. })
                .then_some(expr::Named::BoundedInput);
        }
        let definition = self.definitions.get(*self.definition_index.get(name)?)?;
        Some(match definition.kind {
            DefinitionKind::Let(decl) => expr::Named::Let(&decl.value),
            DefinitionKind::Merge(decl) => {
                expr::Named::Merge(decl.op, &decl.request, &decl.default)
            }
        })
    }

    /// The type of a `let` or merge, checking it on first use.
    fn let_type(&mut self, name: &str) -> Option<(Ty, Usage, DefRef)> {
        let index = *self.definition_index.get(name)?;
        let definition = self.definitions.get_mut(index)?;
        definition.used = true;
        let reference = definition.reference;
        match definition.state.clone() {
            DefinitionState::Done(ty, usage, depth) => {
                self.deepest_used = self.deepest_used.max(depth);
                Some((ty, usage, reference))
            }
            DefinitionState::Checking => {
                let span = definition.name.span;
                self.error_at(
                    codes::CYCLIC_DEFINITION,
                    span,
                    format!("`{name}` is defined in terms of itself"),
                    "part of a cycle",
                    Some(String::from(
                        "break the cycle: a definition may only use definitions that do not use it",
                    )),
                );
                if let Some(definition) = self.definitions.get_mut(index) {
                    definition.state = DefinitionState::Done(Ty::Unknown, Usage::default(), 0);
                }
                Some((Ty::Unknown, Usage::default(), reference))
            }
            DefinitionState::Unchecked if self.definition_depth >= MAX_DEFINITION_DEPTH => {
                definition.state = DefinitionState::Done(Ty::Unknown, Usage::default(), 0);
                let span = definition.name.span;
                self.definitions_cut_short = true;
                self.definition_too_deep(span);
                Some((Ty::Unknown, Usage::default(), reference))
            }
            DefinitionState::Unchecked => {
                definition.state = DefinitionState::Checking;
                let span = definition.name.span;
                self.definition_depth += 1;
                let used_before = std::mem::take(&mut self.deepest_used);
                let (ty, usage) = match definition.kind {
                    DefinitionKind::Let(decl) => {
                        let (ty, usage, term) =
                            stacker::maybe_grow(STACK_RED_ZONE, STACK_SEGMENT, || {
                                self.check_expr(&decl.value, &LET_PLACE, &Scope::default())
                            });
                        if let DefRef::Let(slot) = reference
                            && let Some(entry) = self.program.lets.get_mut(slot)
                        {
                            *entry = Some(ir::LetSpec {
                                name: name.to_string(),
                                term,
                                candidate: usage.candidate,
                                aggregate: usage.aggregate,
                            });
                        }
                        (ty, usage)
                    }
                    DefinitionKind::Merge(decl) => {
                        let (ty, usage, spec) =
                            stacker::maybe_grow(STACK_RED_ZONE, STACK_SEGMENT, || self.merge(decl));
                        if let DefRef::Merge(slot) = reference
                            && let Some(entry) = self.program.merges.get_mut(slot)
                        {
                            *entry = Some(spec);
                        }
                        (ty, usage)
                    }
                };
                self.definition_depth -= 1;
                let mut depth = self.deepest_used.saturating_add(1);
                if depth > MAX_DEFINITION_DEPTH {
                    self.definition_too_deep(span);
                    // Reported once, here: what uses it is not too deep.
                    depth = 0;
                }
                self.deepest_used = used_before.max(depth);
                if let Some(definition) = self.definitions.get_mut(index)
                    && !matches!(definition.state, DefinitionState::Done(..))
                {
                    definition.state = DefinitionState::Done(ty.clone(), usage, depth);
                }
                Some((ty, usage, reference))
            }
        }
    }

    fn definition_too_deep(&mut self, span: Span) {
        self.error_at(
            codes::TOO_DEEP,
            span,
            format!("definitions use one another more than {MAX_DEFINITION_DEPTH} deep here"),
            "too deep here",
            Some(String::from(
                "a definition may use definitions that use definitions, but not this deep; flatten the chain",
            )),
        );
    }

    /// Checks every definition not checked yet, without counting that as a use.
    fn check_definitions(&mut self) {
        let names: Vec<String> = self
            .definitions
            .iter()
            .filter(|d| matches!(d.state, DefinitionState::Unchecked))
            .map(|d| d.name.name.clone())
            .collect();
        for name in names {
            self.check_quietly(&name);
        }
    }

    fn check_quietly(&mut self, name: &str) {
        let Some(&index) = self.definition_index.get(name) else {
            return;
        };
        let used_before = self.definitions.get(index).is_some_and(|d| d.used);
        self.let_type(name);
        if let Some(definition) = self.definitions.get_mut(index) {
            definition.used = used_before;
        }
    }

    /// Names `let` and `merge` define, for suggestions.
    fn value_names(&self) -> Vec<String> {
        self.definitions
            .iter()
            .map(|d| d.name.name.clone())
            .collect()
    }

    /// `let` definitions that depend on the candidate, for suggestions.
    fn candidate_let_names(&self) -> Vec<String> {
        self.definitions
            .iter()
            .filter(|d| matches!(&d.state, DefinitionState::Done(_, usage, _) if usage.candidate))
            .map(|d| d.name.name.clone())
            .collect()
    }

    fn merge(&mut self, decl: &MergeDecl) -> (Ty, Usage, ir::MergeSpec) {
        let place = Place::request("a `merge`");
        let (request, usage_a, request_term) =
            self.check_expr(&decl.request, &place, &Scope::default());
        let (default, usage_b, default_term) =
            self.check_expr(&decl.default, &place, &Scope::default());
        let mut usage = usage_a;
        usage.merge(usage_b);
        let strict = decl
            .strict
            .as_ref()
            .map(|strict| self.raise(strict, RaiseKind::BeforeAttempt));
        let optional = request.is_optional() && default.is_optional();
        let (a, b) = (request.required().clone(), default.required().clone());
        let merged = match decl.op {
            MergeOp::Intersect | MergeOp::Union => match (&a, &b) {
                (Ty::List(_) | Ty::Unknown, Ty::List(_) | Ty::Unknown) => {
                    types::unify(&a, &b).ok_or("two lists")
                }
                _ => Err("two lists"),
            },
            MergeOp::Min | MergeOp::Max => {
                let orderable = |t: &Ty| t.is_ordered() && !matches!(t, Ty::Bool | Ty::String);
                if orderable(&a) && orderable(&b) {
                    types::unify(&a, &b).ok_or("two values of one type")
                } else {
                    Err("numbers, durations, dates or ordered enumerations")
                }
            }
            MergeOp::All | MergeOp::Any => match (&a, &b) {
                (Ty::Bool | Ty::Unknown, Ty::Bool | Ty::Unknown) => Ok(Ty::Bool),
                _ => Err("booleans"),
            },
            MergeOp::First => types::unify(&a, &b).ok_or("two values of one type"),
        };
        let ty = match merged {
            Ok(ty) => {
                if optional {
                    ty.optional()
                } else {
                    ty
                }
            }
            Err(what) => {
                self.error_at(
                    codes::BAD_MERGE,
                    decl.op_span,
                    format!("`{}` merges {what}, found {request} and {default}", decl.op.name()),
                    "this merge",
                    Some(String::from(
                        "intersect and union merge lists, min and max numbers or ordered values, all and any booleans, first anything",
                    )),
                );
                Ty::Unknown
            }
        };
        let spec = ir::MergeSpec {
            name: decl.name.name.clone(),
            op: decl.op,
            request: expr::coerce(request_term, &request, &ty),
            default: expr::coerce(default_term, &default, &ty),
            strict,
        };
        (ty, usage, spec)
    }

    /// Records that an error is raised at a place; reports unknown names.
    fn raise(&mut self, ident: &Ident, kind: RaiseKind) -> ErrorRef {
        // Placeholder for an error already reported: the program is not used.
        let unknown = ErrorRef::Declared(usize::MAX);
        if ident.name == PASSTHROUGH {
            if kind != RaiseKind::Outcome {
                self.error_at(
                    codes::UNKNOWN_ERROR,
                    ident.span,
                    String::from("`passthrough` can only answer with a provider's response"),
                    "no provider answered here",
                    Some(String::from(
                        "use `error passthrough` in `on` rules; declare an error for this place",
                    )),
                );
            }
            return ErrorRef::Passthrough;
        }
        if self.broken_names.contains(&ident.name) {
            return unknown;
        }
        let Some(index) = self.errors.iter().position(|e| e.name.name == ident.name) else {
            let help = suggest(
                &ident.name,
                self.errors.iter().map(|e| e.name.name.as_str()),
            )
            .map(|close| format!("did you mean {close}?"))
            .unwrap_or_else(|| {
                format!(
                    "declare it in `errors`: `{} = STATUS, \"message\"`",
                    ident.name
                )
            });
            self.error_at(
                codes::UNKNOWN_ERROR,
                ident.span,
                format!("error `{}` is not declared", ident.name),
                "unknown error",
                Some(help),
            );
            return unknown;
        };
        self.raised
            .entry(ident.name.clone())
            .or_default()
            .push((kind, ident.span));
        ErrorRef::Declared(index)
    }

    // ------------------------------------------------------------------ errors

    fn error_declarations(&mut self, incomplete: bool) {
        for decl in self.errors.clone() {
            let sites = self
                .raised
                .get(&decl.name.name)
                .cloned()
                .unwrap_or_default();
            if sites.is_empty() && !incomplete {
                self.error_at(
                    codes::UNREACHABLE_ERROR,
                    decl.name.span,
                    format!("error `{}` is never produced", decl.name.name),
                    "no rule raises it",
                    Some(String::from(
                        "raise it from a step, rule or statement, or remove it",
                    )),
                );
            }
            let place = Place::request("an error declaration").with_roots(Roots::of(&[
                Root::Served,
                Root::Attempts,
                Root::Elapsed,
                Root::FreeIn,
                Root::Upstream,
                Root::Attempt,
            ]));
            let scope = Scope::default();
            let (mut usage, status) = self.expect(&decl.status, &Ty::Number, &place, &scope);
            let (message_usage, message) = self.expect(&decl.message, &Ty::String, &place, &scope);
            usage.merge(message_usage);
            let retry_after = decl.retry_after.as_ref().map(|retry_after| {
                let (u, term) = self.expect(retry_after, &Ty::Duration.optional(), &place, &scope);
                usage.merge(u);
                term
            });
            let should_retry = decl.should_retry.as_ref().map(|should_retry| {
                let (u, term) = self.expect(should_retry, &Ty::Bool.optional(), &place, &scope);
                usage.merge(u);
                term
            });
            let error_type = decl.error_type.as_ref().map(|error_type| {
                let (u, term) = self.expect(error_type, &Ty::String.optional(), &place, &scope);
                usage.merge(u);
                term
            });
            if let (Some(read), Some((_, site))) = (
                usage.upstream_at,
                sites.iter().find(|(kind, _)| *kind != RaiseKind::Outcome),
            ) {
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(
                        codes::UPSTREAM_BEFORE_ATTEMPT,
                        format!(
                            "error `{}` reads the provider's answer, but is raised where no provider has answered",
                            decl.name.name
                        ),
                    )
                    .at(source, read, "reads the provider's answer")
                    .also(source, *site, "raised here, before any attempt")
                    .help("give that place an error of its own, or read `upstream` only in errors raised by `on` rules"),
                );
            }
            for (status, span) in expr::constant_results(&decl.status) {
                if !(400.0..=599.0).contains(&status) || status.fract() != 0.0 {
                    self.error_at(
                        codes::TYPE_MISMATCH,
                        span,
                        format!("`{status}` is not an error status"),
                        "not a whole number from 400 to 599",
                        Some(String::from(
                            "errors answer with a status from 400 to 599, such as `503`",
                        )),
                    );
                }
            }
            self.program.errors.push(ir::ErrorSpec {
                name: decl.name.name.clone(),
                status,
                message,
                retry_after,
                should_retry,
                error_type,
            });
        }
    }

    // ------------------------------------------------------------------ structure

    /// Sections and statements the policy needs. With `incomplete`, the
    /// part that did not parse may be the one that seems missing: only the
    /// syntax error is reported for it.
    fn structure(&mut self, file: &'a PolicyFile, incomplete: bool) {
        let has =
            |keyword: &str| incomplete || file.items.iter().any(|item| item.keyword() == keyword);
        let end = Span::new(0, 0);
        if !has("models") {
            self.error_at(
                codes::MISSING_SECTION,
                end,
                String::from("the policy has no `models` section"),
                "expected in this file",
                Some(String::from(
                    "add `models { credentials one by credential.owned desc else ERROR  unknown error ERROR }`",
                )),
            );
        }
        if !has("failover") {
            self.error_at(
                codes::MISSING_SECTION,
                end,
                String::from("the policy has no `failover` section"),
                "expected in this file",
                Some(String::from(
                    "add `failover { attempts N  on any => stop, error ERROR }`",
                )),
            );
        }
        let penalizes = file.items.iter().any(|item| match item {
            Item::Failover(block) => block.statements.iter().any(|s| {
                matches!(s, FailoverStmt::On(rule) if rule.consequences.iter().any(|c| matches!(c, Consequence::Penalize { .. })))
            }),
            _ => false,
        });
        if penalizes && self.program.penalty.is_none() && !incomplete {
            // The first `penalize`.
            let span = file
                .items
                .iter()
                .filter_map(|item| match item {
                    Item::Failover(block) => Some(block),
                    _ => None,
                })
                .flat_map(|block| &block.statements)
                .filter_map(|statement| match statement {
                    FailoverStmt::On(rule) => Some(&rule.consequences),
                    _ => None,
                })
                .flatten()
                .find_map(|consequence| match consequence {
                    Consequence::Penalize { span, .. } => Some(*span),
                    _ => None,
                })
                .unwrap_or(end);
            self.error_at(
                codes::MISSING_SECTION,
                span,
                String::from("rules penalize candidates, but there is no penalty schedule"),
                "penalizes here",
                Some(String::from(
                    "add `health { penalty base 30s factor 2 max 5m reset 10m }`",
                )),
            );
        }
        let limited = self
            .data
            .catalog
            .providers
            .iter()
            .find(|provider| provider.capacity.is_some())
            .map(|provider| provider.at);
        if let Some(at) = limited
            && self.program.capacity_error.is_none()
            && !incomplete
        {
            self.diagnostics.push(
                Diagnostic::new(
                    codes::MISSING_SECTION,
                    "providers have capacity limits, but the policy names no error for when all are full",
                )
                .at(at.source, at.span, "this provider has limits")
                .help("add `capacity { wait 10s  error NAME }` to the policy"),
            );
        }
        if self.program.layers.is_empty() {
            self.program.layers = DEFAULT_LAYERS
                .iter()
                .map(|(level, per_model)| ir::LayerSpec {
                    level: *level,
                    per_model: *per_model,
                })
                .collect();
        }
    }

    fn unused(&mut self, file: &PolicyFile) {
        // Whether a definition is used is not known past one refused as too
        // deep; that error is the one to fix first.
        let cut_short = self.definitions_cut_short;
        let mut unused: Vec<(Span, String)> = self
            .definitions
            .iter()
            .filter(|d| !d.used && !cut_short)
            .map(|d| (d.name.span, format!("`{}` is never used", d.name.name)))
            .collect();
        for input in &mut self.inputs {
            input.used = self.input_reads.contains(&input.decl.name.name);
        }
        unused.extend(
            self.inputs
                .iter()
                .filter(|input| !input.used && !cut_short)
                .map(|input| {
                    (
                        input.decl.name.span,
                        format!("input `{}` is never used", input.decl.name.name),
                    )
                }),
        );
        for item in &file.items {
            if let Item::Sort(sort) = item
                && !self.selectable_sorts.contains(&sort.name.name)
            {
                unused.push((
                    sort.name.span,
                    format!("sort `{}` can never be selected", sort.name.name),
                ));
            }
        }
        unused.sort_by_key(|(span, _)| span.start);
        for (span, message) in unused {
            self.error_at(
                codes::UNUSED_DEFINITION,
                span,
                message,
                "unused",
                Some(String::from("use it or remove it")),
            );
        }
    }
}

impl Parts {
    /// The program; absent required parts get placeholders, which only occur
    /// when the checker reported errors and the program is discarded.
    fn finish(self, name: String) -> Program {
        let placeholder = || Term::constant(crate::value::Value::Null, Span::default());
        let missing = ErrorRef::Declared(usize::MAX);
        Program {
            name,
            inputs: self.inputs,
            rejects: self.rejects,
            malformed_body: self.malformed_body,
            layers: self.layers,
            merges: self.merges.into_iter().flatten().collect(),
            lets: self.lets.into_iter().flatten().collect(),
            models: self.models.unwrap_or(ir::ModelsSpec {
                sources: Vec::new(),
                pins: Vec::new(),
                credentials: ir::CredentialSpec::Each,
                credentials_error: missing,
                unknown_serve: Vec::new(),
                unknown_error: missing,
            }),
            steps: self.steps,
            order: self.order,
            balance: self.balance,
            failover: self.failover.unwrap_or(ir::FailoverSpec {
                attempts: placeholder(),
                reorder: Vec::new(),
                keep: Vec::new(),
                budget: None,
                rules: Vec::new(),
            }),
            penalty: self.penalty,
            stats_window: self.stats_window,
            capacity_wait: self.capacity_wait,
            capacity_error: self.capacity_error,
            timeouts: self.timeouts,
            hold_headers: self.hold_headers,
            late_comment: self.late_comment,
            after_commit: self.after_commit,
            errors: self.errors,
            headers: self.headers,
            listing: self.listing,
        }
    }
}
