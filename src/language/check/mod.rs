//! The checker: resolves every name of a policy against its data schema,
//! type-checks every expression in the place it appears, and reports
//! conflicts, missing parts and rules that can never apply.

mod env;
mod expr;
mod outcomes;
mod types;

pub use env::{Root, RootTypes};
pub use types::{EnumTy, RecordTy, Ty};

use crate::data::Data;
use crate::data::schema::Schema;
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::language::ast::*;
use crate::source::{SourceId, Span};
use env::{Builtins, OUTCOME, Place, Roots};
use expr::{Scope, Usage, constant_bool};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A `let` or `merge` definition and what checking it found.
struct Definition<'a> {
    kind: DefinitionKind<'a>,
    name: &'a Ident,
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
    Done(Ty, Usage),
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

pub struct Checker<'a> {
    source: SourceId,
    data: &'a Data,
    roots: RootTypes,
    input_ty: Ty,
    inputs: Vec<InputInfo<'a>>,
    definitions: Vec<Definition<'a>>,
    broken_names: HashSet<String>,
    errors: HashMap<String, &'a ErrorDecl>,
    raised: HashMap<String, Vec<(RaiseKind, Span)>>,
    /// Input names read anywhere (`input.NAME`).
    input_reads: HashSet<String>,
    /// Sort names some `use sort` selector can choose.
    selectable_sorts: HashSet<String>,
    usage: Usage,
    diagnostics: Vec<Diagnostic>,
}

const LET_PLACE: Place = Place::candidate_set("a `let` definition");
const PASSTHROUGH: &str = "passthrough";

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
    /// Checks a parsed policy against its data. Returns every diagnostic.
    pub fn run(
        source: SourceId,
        file: &'a PolicyFile,
        broken_names: &[String],
        data: &'a Data,
    ) -> Vec<Diagnostic> {
        let builtins = Builtins::new();
        let roots = RootTypes::new(&data.schema, &builtins);
        let mut checker = Checker {
            source,
            data,
            roots,
            input_ty: Ty::Unknown,
            inputs: Vec::new(),
            definitions: Vec::new(),
            broken_names: broken_names.iter().cloned().collect(),
            errors: HashMap::new(),
            raised: HashMap::new(),
            input_reads: HashSet::new(),
            selectable_sorts: HashSet::new(),
            usage: Usage::default(),
            diagnostics: Vec::new(),
        };
        checker.sections(file);
        checker.declarations(file);
        checker.declare_inputs(file);
        for item in &file.items {
            checker.item(item, file);
        }
        checker.remaining_definitions();
        checker.error_declarations();
        checker.structure(file);
        checker.unused(file);
        checker.diagnostics
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
                            "second `{}` here".replace("{}", keyword).as_str(),
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
                let source = checker.source;
                checker.diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_DEFINITION,
                        format!("{what} `{}` is defined twice", ident.name),
                    )
                    .at(source, ident.span, "defined again here")
                    .also(source, *first, "first defined here")
                    .help("rename one of them"),
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
                Item::Let(decl) if claim(self, &decl.name, "`let`") => {
                    self.definitions.push(Definition {
                        kind: DefinitionKind::Let(decl),
                        name: &decl.name,
                        state: DefinitionState::Unchecked,
                        used: false,
                    });
                }
                Item::Merge(block) => {
                    for merge in &block.merges {
                        if claim(self, &merge.name, "merge") {
                            self.definitions.push(Definition {
                                kind: DefinitionKind::Merge(merge),
                                name: &merge.name,
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
                                Some(String::from("`error passthrough` returns the provider's own answer; choose another name")),
                            );
                        } else if let Some(first) = self.errors.get(&error.name.name) {
                            let source = self.source;
                            self.diagnostics.push(
                                Diagnostic::new(
                                    codes::DUPLICATE_DEFINITION,
                                    format!("error `{}` is declared twice", error.name.name),
                                )
                                .at(source, error.name.span, "declared again here")
                                .also(source, first.name.span, "first declared here")
                                .help("error codes are unique; rename one"),
                            );
                        } else {
                            self.errors.insert(error.name.name.clone(), error);
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
                    let source = self.source;
                    self.diagnostics.push(
                        Diagnostic::new(
                            codes::DUPLICATE_DEFINITION,
                            format!("sort `{}` is declared twice", sort.name.name),
                        )
                        .at(source, sort.name.span, "declared again here")
                        .also(source, *first, "first declared here")
                        .help("rename one of them"),
                    );
                } else {
                    sorts.insert(&sort.name.name, sort.name.span);
                }
            }
        }
    }

    /// The type of a `let` or merge, checking it on first use.
    fn let_type(&mut self, name: &str) -> Option<(Ty, Usage)> {
        let index = self.definitions.iter().position(|d| d.name.name == name)?;
        let definition = self.definitions.get_mut(index)?;
        definition.used = true;
        match definition.state.clone() {
            DefinitionState::Done(ty, usage) => Some((ty, usage)),
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
                    definition.state = DefinitionState::Done(Ty::Unknown, Usage::default());
                }
                Some((Ty::Unknown, Usage::default()))
            }
            DefinitionState::Unchecked => {
                definition.state = DefinitionState::Checking;
                let (ty, usage) = match definition.kind {
                    DefinitionKind::Let(decl) => {
                        self.check_expr(&decl.value, &LET_PLACE, &Scope::default())
                    }
                    DefinitionKind::Merge(decl) => self.merge(decl),
                };
                if let Some(definition) = self.definitions.get_mut(index)
                    && !matches!(definition.state, DefinitionState::Done(..))
                {
                    definition.state = DefinitionState::Done(ty.clone(), usage);
                }
                Some((ty, usage))
            }
        }
    }

    fn remaining_definitions(&mut self) {
        let names: Vec<String> = self
            .definitions
            .iter()
            .filter(|d| matches!(d.state, DefinitionState::Unchecked))
            .map(|d| d.name.name.clone())
            .collect();
        for name in names {
            let used_before = self
                .definitions
                .iter()
                .find(|d| d.name.name == name)
                .is_some_and(|d| d.used);
            self.let_type(&name);
            if let Some(definition) = self.definitions.iter_mut().find(|d| d.name.name == name) {
                definition.used = used_before;
            }
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
            .filter(|d| matches!(&d.state, DefinitionState::Done(_, usage) if usage.candidate))
            .map(|d| d.name.name.clone())
            .collect()
    }

    fn merge(&mut self, decl: &MergeDecl) -> (Ty, Usage) {
        let place = Place::request("a `merge`");
        let (request, usage_a) = self.check_expr(&decl.request, &place, &Scope::default());
        let (default, usage_b) = self.check_expr(&decl.default, &place, &Scope::default());
        let mut usage = usage_a;
        usage.merge(usage_b);
        if let Some(strict) = &decl.strict {
            self.raise(strict, RaiseKind::BeforeAttempt);
        }
        let optional = request.is_optional() && default.is_optional();
        let (a, b) = (request.required().clone(), default.required().clone());
        let bad = |checker: &mut Self, what: &str| {
            checker.error_at(
                codes::BAD_MERGE,
                decl.op_span,
                format!("`{}` merges {what}, found {request} and {default}", decl.op.name()),
                "this merge",
                Some(String::from(
                    "intersect and union merge lists, min and max numbers or ordered values, all and any booleans, first anything",
                )),
            );
            (Ty::Unknown, usage)
        };
        let merged = match decl.op {
            MergeOp::Intersect | MergeOp::Union => match (&a, &b) {
                (Ty::List(_) | Ty::Unknown, Ty::List(_) | Ty::Unknown) => types::unify(&a, &b),
                _ => return bad(self, "two lists"),
            },
            MergeOp::Min | MergeOp::Max => {
                if a.is_ordered()
                    && b.is_ordered()
                    && !matches!(a, Ty::Bool | Ty::String)
                    && !matches!(b, Ty::Bool | Ty::String)
                {
                    types::unify(&a, &b)
                } else {
                    return bad(self, "numbers, durations, dates or ordered enumerations");
                }
            }
            MergeOp::All | MergeOp::Any => match (&a, &b) {
                (Ty::Bool | Ty::Unknown, Ty::Bool | Ty::Unknown) => Some(Ty::Bool),
                _ => return bad(self, "booleans"),
            },
            MergeOp::First => types::unify(&a, &b),
        };
        match merged {
            Some(ty) => (if optional { ty.optional() } else { ty }, usage),
            None => bad(self, "two values of one type"),
        }
    }

    /// Records that an error is raised at a place; reports unknown names.
    fn raise(&mut self, ident: &Ident, kind: RaiseKind) {
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
            return;
        }
        if self.broken_names.contains(&ident.name) {
            return;
        }
        if !self.errors.contains_key(&ident.name) {
            let help = suggest(&ident.name, self.errors.keys().map(String::as_str))
                .map(|close| format!("did you mean `{close}`?"))
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
            return;
        }
        self.raised
            .entry(ident.name.clone())
            .or_default()
            .push((kind, ident.span));
    }

    // ------------------------------------------------------------------ inputs

    fn input_type(&mut self, ty: &TypeExpr, source: InputSource, all: &[&'a InputDecl]) -> Ty {
        match &ty.kind {
            TypeExprKind::Named(name) => match name.name.as_str() {
                "bool" => Ty::Bool,
                "number" | "int" => Ty::Number,
                "string" | "provider" | "model" => Ty::String,
                "duration" => Ty::Duration,
                other => match self.schema().enum_by_name(other) {
                    Some(id) => {
                        env::attr_type_ty(&crate::data::schema::AttrType::Enum(id), self.schema())
                    }
                    None => {
                        let mut known: Vec<String> = [
                            "bool", "number", "int", "string", "duration", "provider", "model",
                        ]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                        known.extend(self.schema().enums.iter().map(|e| e.name.clone()));
                        let help = suggest(other, known.iter().map(String::as_str))
                            .map(|close| format!("did you mean `{close}`?"))
                            .unwrap_or_else(|| {
                                String::from("input types are bool, number, int, string, duration, provider, model, an enumeration from the data, list<T>, csv<T>, one of [...], int A..B, { field: T } and like NAME")
                            });
                        self.error_at(
                            codes::UNKNOWN_TYPE,
                            name.span,
                            format!("`{other}` is not a type"),
                            "unknown type",
                            Some(help),
                        );
                        Ty::Unknown
                    }
                },
            },
            TypeExprKind::List(inner) => Ty::List(Box::new(self.input_type(inner, source, all))),
            TypeExprKind::Csv(inner) => {
                if source == InputSource::Body {
                    self.error_at(
                        codes::UNKNOWN_TYPE,
                        ty.span,
                        String::from("`csv<T>` reads comma-separated header values"),
                        "in a body input",
                        Some(String::from("body fields are JSON: use `list<T>`")),
                    );
                }
                Ty::List(Box::new(self.input_type(inner, source, all)))
            }
            TypeExprKind::Object(fields) => {
                if source == InputSource::Header {
                    self.error_at(
                        codes::UNKNOWN_TYPE,
                        ty.span,
                        String::from("a header cannot hold an object"),
                        "object in a header input",
                        Some(String::from(
                            "use `like NAME` to read a header as JSON of another input's shape",
                        )),
                    );
                }
                let mut seen = HashSet::new();
                let mut record_fields = Vec::new();
                for field in fields {
                    if !seen.insert(field.name.name.clone()) {
                        self.error_at(
                            codes::DUPLICATE_DEFINITION,
                            field.name.span,
                            format!("field `{}` is declared twice", field.name.name),
                            "declared again",
                            None,
                        );
                        continue;
                    }
                    let ty = self
                        .input_type(&field.ty, InputSource::Body, all)
                        .optional();
                    record_fields.push((field.name.name.clone(), ty));
                }
                let fields = record_fields;
                Ty::Record(Arc::new(RecordTy {
                    name: String::from("input"),
                    fields,
                }))
            }
            TypeExprKind::Enum(members) => {
                let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
                Ty::Enum(EnumTy::new(
                    &format!("one of [{}]", names.join(", ")),
                    &names,
                    false,
                ))
            }
            TypeExprKind::IntRange { .. } => Ty::Number,
            TypeExprKind::Like(other) => match all.iter().find(|decl| decl.name.name == other.name)
            {
                Some(decl) if !matches!(decl.ty.kind, TypeExprKind::Like(_)) => {
                    self.input_type(&decl.ty, InputSource::Body, &[])
                }
                Some(_) => {
                    self.error_at(
                        codes::UNKNOWN_TYPE,
                        other.span,
                        format!(
                            "`like {}` names an input that is itself `like` another",
                            other.name
                        ),
                        "chained `like`",
                        Some(String::from("name the input that declares the shape")),
                    );
                    Ty::Unknown
                }
                None => {
                    let help = suggest(&other.name, all.iter().map(|d| d.name.name.as_str()))
                        .map(|close| format!("did you mean `{close}`?"));
                    self.error_at(
                        codes::UNKNOWN_NAME,
                        other.span,
                        format!("there is no input `{}`", other.name),
                        "unknown input",
                        help,
                    );
                    Ty::Unknown
                }
            },
        }
    }

    fn declare_inputs(&mut self, file: &'a PolicyFile) {
        let decls: Vec<&'a InputDecl> = file
            .items
            .iter()
            .filter_map(|item| match item {
                Item::Input(decl) => Some(decl),
                _ => None,
            })
            .collect();
        let mut names: HashMap<&str, Span> = HashMap::new();
        let mut fields: HashMap<(InputSource, String), Span> = HashMap::new();
        for decl in &decls {
            if let Some(first) = names.get(decl.name.name.as_str()) {
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_DEFINITION,
                        format!("input `{}` is declared twice", decl.name.name),
                    )
                    .at(source, decl.name.span, "declared again here")
                    .also(source, *first, "first declared here")
                    .help("rename one of them"),
                );
                continue;
            }
            names.insert(&decl.name.name, decl.name.span);
            let field_key = (decl.source, decl.source_name.value.to_ascii_lowercase());
            if let Some(first) = fields.get(&field_key) {
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_DEFINITION,
                        format!("two inputs read `{}`", decl.source_name.value),
                    )
                    .at(source, decl.source_name.span, "read again here")
                    .also(source, *first, "first read here")
                    .help("one input per body field or header"),
                );
            } else {
                fields.insert(field_key, decl.source_name.span);
            }
            let ty = self.input_type(&decl.ty, decl.source, &decls);
            match &decl.malformed_error {
                Some(error) => self.raise(error, RaiseKind::BeforeAttempt),
                None => self.error_at(
                    codes::MISSING_INPUT_ERROR,
                    decl.name.span,
                    format!(
                        "input `{}` does not say which error a malformed value gets",
                        decl.name.name
                    ),
                    "no `malformed error`",
                    Some(String::from("add `malformed error NAME` after its type")),
                ),
            }
            if let Some(error) = &decl.unknown_error {
                self.raise(error, RaiseKind::BeforeAttempt);
            }
            if let Some(shorthand) = &decl.shorthand {
                self.shorthand(decl, shorthand, &ty, &decls);
            }
            self.inputs.push(InputInfo {
                decl,
                ty,
                used: false,
            });
        }
        let fields = self
            .inputs
            .iter()
            .map(|input| (input.decl.name.name.clone(), input.ty.clone().optional()))
            .collect();
        self.input_ty = Ty::Record(Arc::new(RecordTy {
            name: String::from("input"),
            fields,
        }));
    }

    fn shorthand(
        &mut self,
        decl: &InputDecl,
        shorthand: &Shorthand,
        object: &Ty,
        all: &[&'a InputDecl],
    ) {
        let it = self.input_type(&shorthand.ty, decl.source, all);
        if matches!(it, Ty::Record(_)) {
            self.error_at(
                codes::TYPE_MISMATCH,
                shorthand.ty.span,
                String::from("a shorthand reads a single value, not an object"),
                "object type",
                None,
            );
        }
        let place = Place::only("an input's shorthand", Roots::of(&[Root::It]));
        let scope = Scope {
            it: Some(it),
            ..Scope::default()
        };
        let (value, _) = self.check_expr(&shorthand.value, &place, &scope);
        let (Ty::Record(target), Ty::Record(written)) = (object, &value) else {
            if !value.is_unknown() && !object.is_unknown() {
                self.error_at(
                    codes::TYPE_MISMATCH,
                    shorthand.value.span,
                    format!("the shorthand gives {value}, but the input is {object}"),
                    "does not match the input",
                    Some(String::from(
                        "a shorthand of an object input is an object literal of its fields",
                    )),
                );
            }
            return;
        };
        let ExprKind::Object(literal_fields) = &shorthand.value.kind else {
            return;
        };
        for ((name, actual), (ident, expr)) in written.fields.iter().zip(literal_fields) {
            match target.field(name) {
                Some(expected) => self.require_type(expr, actual, expected),
                None => {
                    let help = suggest(name, target.fields.iter().map(|(f, _)| f.as_str()))
                        .map(|close| format!("did you mean `{close}`?"));
                    self.error_at(
                        codes::UNKNOWN_ATTRIBUTE,
                        ident.span,
                        format!("input `{}` has no field `{name}`", decl.name.name),
                        "unknown field",
                        help,
                    );
                }
            }
        }
    }

    // ------------------------------------------------------------------ items

    fn condition(&mut self, expr: &Expr, place: &Place, scope: &Scope) -> Usage {
        let usage = self.expect(expr, &Ty::Bool, place, scope);
        if let Some(value) = constant_bool(expr) {
            self.error_at(
                codes::CONSTANT_CONDITION,
                expr.span,
                format!("this condition is always {value}"),
                "constant",
                Some(String::from("a rule whose condition never changes either always or never applies; remove it or fix the condition")),
            );
        }
        usage
    }

    fn sort_keys(&mut self, keys: &[SortKey], place: &Place) {
        for key in keys {
            let (ty, _) = self.check_expr(&key.expr, place, &Scope::default());
            if !ty.is_ordered() {
                self.error_at(
                    codes::NOT_ORDERED,
                    key.expr.span,
                    format!("a sort key must be orderable, found {ty}"),
                    "cannot sort by this",
                    Some(String::from(
                        "sort by numbers, durations, dates, strings, booleans or ordered enumerations",
                    )),
                );
            }
        }
    }

    fn item(&mut self, item: &'a Item, file: &'a PolicyFile) {
        let scope = Scope::default();
        match item {
            Item::Policy(_) | Item::Errors(_) | Item::Input(_) => {}
            Item::Models(block) => self.models(block),
            Item::Validate(block) => {
                let place = Place::request("a `validate` rule");
                for rule in &block.rules {
                    self.condition(&rule.condition, &place, &scope);
                    self.raise(&rule.error, RaiseKind::BeforeAttempt);
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
                }
            }
            Item::Merge(block) => {
                for merge in &block.merges {
                    let used = self
                        .definitions
                        .iter()
                        .find(|d| d.name.name == merge.name.name)
                        .is_some_and(|d| d.used);
                    self.let_type(&merge.name.name);
                    if let Some(definition) = self
                        .definitions
                        .iter_mut()
                        .find(|d| d.name.name == merge.name.name)
                    {
                        definition.used = used;
                    }
                }
            }
            Item::Let(_) | Item::Sort(_) => {
                if let Item::Sort(sort) = item {
                    self.sort_keys(&sort.keys, &Place::candidate_set("a sort key"));
                }
            }
            Item::Eligibility(block) => {
                let place = Place::candidate_set("an eligibility step");
                for step in &block.steps {
                    match step {
                        Step::Require {
                            condition, error, ..
                        } => {
                            self.condition(condition, &place, &scope);
                            self.raise(error, RaiseKind::BeforeAttempt);
                        }
                        Step::PreferExclusively { condition, .. } => {
                            self.condition(condition, &place, &scope);
                        }
                    }
                }
            }
            Item::Order(block) => self.order(block, file),
            Item::Balance(balance) => {
                let place = Place::candidate_set("a balance strategy");
                if let Some(when) = &balance.when {
                    self.condition(when, &Place::request("a `balance` condition"), &scope);
                }
                match &balance.strategy {
                    Strategy::Weighted(weight) => {
                        self.expect(weight, &Ty::Number, &place, &scope);
                    }
                    Strategy::Share {
                        key,
                        tolerance,
                        among,
                    } => {
                        self.sort_keys(std::slice::from_ref(key), &place);
                        let (ty, _) = self.check_expr(&key.expr, &place, &scope);
                        if !matches!(ty.required(), Ty::Number | Ty::Duration | Ty::Unknown) {
                            self.error_at(
                                codes::TYPE_MISMATCH,
                                key.expr.span,
                                format!("`share` compares numbers or durations, found {ty}"),
                                "not a score",
                                None,
                            );
                        }
                        if !(0.0..=10.0).contains(tolerance) {
                            self.error_at(
                                codes::BAD_LITERAL,
                                balance.strategy_span,
                                String::from("the share tolerance must be between 0% and 1000%"),
                                "this tolerance",
                                None,
                            );
                        }
                        for expr in among {
                            self.check_expr(expr, &place, &scope);
                        }
                    }
                    Strategy::Random | Strategy::RoundRobin | Strategy::LeastBusy => {}
                }
            }
            Item::Failover(block) => self.failover(block),
            Item::Health(block) => {
                let place = Place::request("`health`");
                let mut penalty_seen = None;
                let mut window_seen = None;
                for statement in &block.statements {
                    match statement {
                        HealthStmt::Penalty(penalty) => {
                            self.once(&mut penalty_seen, penalty.keyword, "penalty");
                            self.expect(&penalty.base, &Ty::Duration, &place, &scope);
                            self.expect(&penalty.factor, &Ty::Number, &place, &scope);
                            self.expect(&penalty.max, &Ty::Duration, &place, &scope);
                            self.expect(&penalty.reset, &Ty::Duration, &place, &scope);
                        }
                        HealthStmt::Window { keyword, window } => {
                            self.once(&mut window_seen, *keyword, "window");
                            self.expect(window, &Ty::Duration, &place, &scope);
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
                            self.expect(limit, &Ty::Duration, &place, &scope);
                        }
                        CapacityStmt::Error { keyword, error } => {
                            self.once(&mut error_seen, *keyword, "error");
                            self.raise(error, RaiseKind::Exhausted);
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
                    self.expect(&timeout.value, &Ty::Duration, &place, &scope);
                }
            }
            Item::Stream(block) => {
                for statement in &block.statements {
                    match statement {
                        StreamStmt::HoldHeaders { limit, .. } => {
                            self.expect(
                                limit,
                                &Ty::Duration,
                                &Place::candidate("`hold_headers`"),
                                &scope,
                            );
                        }
                        StreamStmt::LateComment { text, .. } => {
                            let place = Place::request("`late_comment`")
                                .with_roots(Roots::of(&[Root::Served]));
                            self.expect(text, &Ty::String.optional(), &place, &scope);
                        }
                    }
                }
            }
            Item::Headers(block) => {
                let place = Place::request("a response header").with_roots(Roots::of(&[
                    Root::Served,
                    Root::Attempts,
                    Root::Elapsed,
                ]));
                self.fields(&block.fields, &place, true);
            }
            Item::Listing(block) => {
                self.fields(
                    &block.fields,
                    &Place::candidate_set("a listing field"),
                    false,
                );
            }
        }
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

    fn fields(&mut self, fields: &[FieldValue], place: &Place, headers: bool) {
        let mut seen: HashMap<String, Span> = HashMap::new();
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
                seen.insert(key, field.name.span);
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
            let (ty, _) = self.check_expr(&field.value, place, &Scope::default());
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
        }
    }

    fn models(&mut self, block: &'a ModelsBlock) {
        let scope = Scope::default();
        let mut sources_seen = None;
        let mut credentials_seen = None;
        let mut unknown_error_seen = None;
        let mut one_seen = None;
        for statement in &block.statements {
            match statement {
                ModelsStmt::Sources { keyword, sources } => {
                    self.once(&mut sources_seen, *keyword, "from");
                    let place = Place::request("`from` in `models`");
                    for source in sources {
                        let (ty, _) = self.check_expr(source, &place, &scope);
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
                                None,
                            );
                        }
                    }
                }
                ModelsStmt::Pin(_) => {}
                ModelsStmt::Credentials {
                    keyword,
                    mode,
                    error,
                } => {
                    self.once(&mut credentials_seen, *keyword, "credentials");
                    if let CredentialMode::One(keys) = mode {
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
                        self.sort_keys(keys, &place);
                    }
                    self.raise(error, RaiseKind::BeforeAttempt);
                }
                ModelsStmt::UnknownServe {
                    condition, keys, ..
                } => {
                    let place = Place::only(
                        "`unknown serve`",
                        Roots::of(&[Root::Request, Root::Provider, Root::Deployment, Root::Input]),
                    );
                    self.condition(condition, &place, &scope);
                    self.sort_keys(keys, &place);
                }
                ModelsStmt::UnknownError { keyword, error } => {
                    self.once(&mut unknown_error_seen, *keyword, "unknown error");
                    self.raise(error, RaiseKind::BeforeAttempt);
                }
                ModelsStmt::OneProviderPerModel { span } => {
                    self.once(&mut one_seen, *span, "one provider per model");
                    self.one_provider_per_model(*span);
                }
            }
        }
        if credentials_seen.is_none() {
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
        if unknown_error_seen.is_none() {
            self.error_at(
                codes::MISSING_SECTION,
                block.keyword,
                String::from("`models` does not say which error an unknown model gets"),
                "no `unknown error`",
                Some(String::from("add `unknown error NAME`")),
            );
        }
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
                OrderStmt::By(key) => self.sort_keys(std::slice::from_ref(key), &place),
                OrderStmt::UseSort { selector, .. } => {
                    let (ty, _) = self.check_expr(
                        selector,
                        &Place::request("a sort selector"),
                        &Scope::default(),
                    );
                    let declared: Vec<&str> = file
                        .items
                        .iter()
                        .filter_map(|item| match item {
                            Item::Sort(sort) => Some(sort.name.name.as_str()),
                            _ => None,
                        })
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
                                if !declared.contains(&member.as_str()) {
                                    let help = suggest(member, declared.iter().copied())
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
                }
            }
        }
    }

    fn failover(&mut self, block: &'a FailoverBlock) {
        let scope = Scope::default();
        let mut attempts_seen = None;
        let mut reorder_seen = None;
        let mut budget_seen = None;
        for statement in &block.statements {
            match statement {
                FailoverStmt::Attempts { keyword, limit } => {
                    self.once(&mut attempts_seen, *keyword, "attempts");
                    self.expect(limit, &Ty::Number, &Place::request("`attempts`"), &scope);
                    if let ExprKind::Literal(Literal::Number(n)) = limit.kind
                        && (n < 1.0 || n.fract() != 0.0)
                    {
                        self.error_at(
                            codes::BAD_ATTEMPTS,
                            limit.span,
                            format!("`{n}` attempts is not a positive whole number"),
                            "this limit",
                            Some(String::from(
                                "one attempt means no failover; write at least 1",
                            )),
                        );
                    }
                }
                FailoverStmt::Reorder { keyword, keys } => {
                    self.once(&mut reorder_seen, *keyword, "reorder");
                    self.sort_keys(keys, &Place::candidate("`reorder`"));
                }
                FailoverStmt::Keep { condition, .. } => {
                    let place = Place::candidate("a `keep` constraint")
                        .with_roots(Roots::of(&[Root::Prev, Root::First]));
                    self.condition(condition, &place, &scope);
                }
                FailoverStmt::Budget {
                    keyword,
                    limit,
                    error,
                } => {
                    self.once(&mut budget_seen, *keyword, "budget");
                    self.expect(limit, &Ty::Duration, &Place::request("`budget`"), &scope);
                    self.raise(error, RaiseKind::Exhausted);
                }
                FailoverStmt::On(rule) => {
                    self.outcome_rule(rule, budget_seen.is_some() || has_budget(block))
                }
            }
        }
        if attempts_seen.is_none() {
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
    }

    fn outcome_rule(&mut self, rule: &'a OutcomeRule, budget: bool) {
        let place = Place::candidate("an `on` rule").with_roots(OUTCOME);
        let when_usage = match &rule.when {
            Some(when) => self.condition(when, &place, &Scope::default()),
            None => Usage::default(),
        };
        // What `when` proves holds for the rule's consequences.
        let scope = Scope {
            facts: expr::Facts::from_condition(rule.when.as_ref()),
            ..Scope::default()
        };
        let mut actions = Vec::new();
        let mut errors = 0;
        let mut pauses: Vec<HealthScope> = Vec::new();
        let mut penalties: Vec<HealthScope> = Vec::new();
        for consequence in &rule.consequences {
            match consequence {
                Consequence::Next { span } | Consequence::Stop { span } => actions.push(*span),
                Consequence::Retry { span, after } => {
                    actions.push(*span);
                    if let Some(after) = after {
                        self.expect(after, &Ty::Duration, &place, &scope);
                    }
                    if !(budget || when_usage.retries || when_usage.elapsed) {
                        self.error_at(
                            codes::UNBOUNDED_RETRY,
                            *span,
                            String::from("this `retry` has no bound and could repeat forever"),
                            "unbounded retry",
                            Some(String::from(
                                "limit it with a condition such as `when retries < 2`, or give `failover` a `budget`",
                            )),
                        );
                    }
                }
                Consequence::Pause {
                    span,
                    scope: health_scope,
                    duration,
                } => {
                    if pauses.contains(health_scope) {
                        self.error_at(
                            codes::BAD_CONSEQUENCE,
                            *span,
                            String::from("this rule pauses the same scope twice"),
                            "again",
                            None,
                        );
                    }
                    pauses.push(*health_scope);
                    self.expect(duration, &Ty::Duration, &place, &scope);
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
                            None,
                        );
                    }
                    penalties.push(*health_scope);
                }
                Consequence::Error(choice) => {
                    errors += 1;
                    let mut current = Some(choice);
                    while let Some(choice) = current {
                        self.raise(&choice.error, RaiseKind::Outcome);
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
                        current = match &choice.otherwise {
                            Some((condition, rest)) => {
                                self.condition(condition, &place, &scope);
                                Some(rest)
                            }
                            None => None,
                        };
                    }
                }
            }
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
    }

    // ------------------------------------------------------------------ errors

    fn error_declarations(&mut self) {
        let mut declared: Vec<&'a ErrorDecl> = self.errors.values().copied().collect();
        declared.sort_by_key(|decl| decl.name.span.start);
        for decl in declared {
            let sites = self
                .raised
                .get(&decl.name.name)
                .cloned()
                .unwrap_or_default();
            if sites.is_empty() {
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
            let mut usage = self.expect(&decl.status, &Ty::Number, &place, &scope);
            usage.merge(self.expect(&decl.message, &Ty::String, &place, &scope));
            if let Some(retry_after) = &decl.retry_after {
                usage.merge(self.expect(retry_after, &Ty::Duration.optional(), &place, &scope));
            }
            if let Some(error_type) = &decl.error_type {
                usage.merge(self.expect(error_type, &Ty::String.optional(), &place, &scope));
            }
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
            if let ExprKind::Literal(Literal::Number(status)) = decl.status.kind
                && !(400.0..=599.0).contains(&status)
            {
                self.error_at(
                    codes::TYPE_MISMATCH,
                    decl.status.span,
                    format!("`{status}` is not an error status"),
                    "not 4xx or 5xx",
                    Some(String::from("errors answer with a status from 400 to 599")),
                );
            }
        }
    }

    // ------------------------------------------------------------------ structure

    fn structure(&mut self, file: &'a PolicyFile) {
        let has = |keyword: &str| file.items.iter().any(|item| item.keyword() == keyword);
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
        let has_penalty = file.items.iter().any(|item| match item {
            Item::Health(block) => block
                .statements
                .iter()
                .any(|s| matches!(s, HealthStmt::Penalty(_))),
            _ => false,
        });
        if penalizes && !has_penalty {
            let span = file
                .items
                .iter()
                .find_map(|item| match item {
                    Item::Failover(block) => Some(block.keyword),
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
        let capacity_error = file.items.iter().any(|item| match item {
            Item::Capacity(block) => block
                .statements
                .iter()
                .any(|s| matches!(s, CapacityStmt::Error { .. })),
            _ => false,
        });
        if let Some(at) = limited
            && !capacity_error
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
    }

    fn unused(&mut self, file: &PolicyFile) {
        let mut unused: Vec<(Span, String)> = self
            .definitions
            .iter()
            .filter(|d| !d.used)
            .map(|d| (d.name.span, format!("`{}` is never used", d.name.name)))
            .collect();
        let input_refs = self.input_references();
        for input in &mut self.inputs {
            input.used = input_refs.contains(&input.decl.name.name);
        }
        unused.extend(self.inputs.iter().filter(|input| !input.used).map(|input| {
            (
                input.decl.name.span,
                format!("input `{}` is never used", input.decl.name.name),
            )
        }));
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

    /// Input names referenced anywhere, recorded while checking paths.
    fn input_references(&self) -> HashSet<String> {
        self.input_reads.clone()
    }
}

fn has_budget(block: &FailoverBlock) -> bool {
    block
        .statements
        .iter()
        .any(|s| matches!(s, FailoverStmt::Budget { .. }))
}
