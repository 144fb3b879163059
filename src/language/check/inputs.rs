//! Request inputs: the body fields and headers a client may send to steer
//! routing, their types, shorthands and errors.

use super::env::{self, Place, Root, Roots};
use super::expr::{self, Scope};
use super::types::{EnumTy, RecordTy, Ty};
use super::{Checker, InputInfo, RaiseKind};
use crate::diagnostics::{Diagnostic, codes, suggest};
use crate::language::ast::*;
use crate::language::ir::{self, ErrorRef, InputType};
use crate::source::Span;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

const TYPE_NAMES: [&str; 7] = [
    "bool", "number", "int", "string", "duration", "provider", "model",
];

impl<'a> Checker<'a> {
    /// The checker's type and the evaluator's parsing type of an input.
    fn input_type(
        &mut self,
        ty: &TypeExpr,
        source: InputSource,
        all: &[&'a InputDecl],
    ) -> (Ty, InputType) {
        self.input_type_of(ty, source, all, "")
    }

    /// `self_name` is the input being declared, never suggested for its own `like`.
    fn input_type_of(
        &mut self,
        ty: &TypeExpr,
        source: InputSource,
        all: &[&'a InputDecl],
        self_name: &str,
    ) -> (Ty, InputType) {
        let unknown = || (Ty::Unknown, InputType::String);
        match &ty.kind {
            TypeExprKind::Named(name) => match name.name.as_str() {
                "bool" => (Ty::Bool, InputType::Bool),
                "number" => (Ty::Number, InputType::Number),
                "int" => (
                    Ty::Number,
                    InputType::Int {
                        low: f64::MIN,
                        high: f64::MAX,
                    },
                ),
                "string" => (Ty::String, InputType::String),
                "provider" => (Ty::String, InputType::Provider),
                "model" => (Ty::String, InputType::Model),
                "duration" => (Ty::Duration, InputType::Duration),
                other => match self.schema().enum_by_name(other) {
                    Some(id) => {
                        let ty = env::attr_type_ty(
                            &crate::data::schema::AttrType::Enum(id),
                            self.schema(),
                        );
                        match &ty {
                            Ty::Enum(e) => {
                                let e = e.clone();
                                (ty, InputType::Enum(e))
                            }
                            _ => unknown(),
                        }
                    }
                    None => {
                        let mut known: Vec<String> =
                            TYPE_NAMES.iter().map(|s| s.to_string()).collect();
                        known.extend(self.schema().enums.iter().map(|e| e.name.clone()));
                        let help = suggest(other, known.iter().map(String::as_str))
                            .map(|close| format!("did you mean {close}?"))
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
                        unknown()
                    }
                },
            },
            TypeExprKind::List(inner) => {
                let (ty, input) = self.input_type(inner, source, all);
                (Ty::List(Box::new(ty)), InputType::List(Box::new(input)))
            }
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
                let (ty, input) = self.input_type(inner, source, all);
                // A header is split at its commas into single values, each read
                // as plain text: a list or object item could never be read, so
                // every value sent would be refused as malformed. (An object
                // written inline is already refused in a header.)
                let item_kind = match &input {
                    InputType::List(_) | InputType::Csv(_) => Some((
                        "a list",
                        "`list<list<T>>` and send the header as JSON (`[[\"a\", \"b\"], [\"c\"]]`)",
                    )),
                    InputType::Object(_) if !matches!(inner.kind, TypeExprKind::Object(_)) => {
                        Some((
                            "an object",
                            "`list<T>` and send the header as a JSON array of objects",
                        ))
                    }
                    _ => None,
                };
                if let Some((item_kind, nested)) = item_kind {
                    self.error_at(
                        codes::UNKNOWN_TYPE,
                        inner.span,
                        format!("a `csv<T>` item is a single value, not {item_kind}"),
                        &format!("{item_kind} in a comma-separated header"),
                        Some(format!(
                            "write `csv<string>` or another single type; for {item_kind} per item, declare {nested}"
                        )),
                    );
                }
                (Ty::List(Box::new(ty)), InputType::Csv(Box::new(input)))
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
                let mut input_fields = Vec::new();
                for field in fields {
                    if !seen.insert(field.name.name.clone()) {
                        self.error_at(
                            codes::DUPLICATE_DEFINITION,
                            field.name.span,
                            format!("field `{}` is declared twice", field.name.name),
                            "declared again",
                            Some(format!(
                                "an object has one `{}` field; remove one, or rename it",
                                field.name.name
                            )),
                        );
                        continue;
                    }
                    let (ty, input) = self.input_type(&field.ty, InputSource::Body, all);
                    record_fields.push((field.name.name.clone(), ty.optional()));
                    input_fields.push((Arc::from(field.name.name.as_str()), input));
                }
                (
                    Ty::Record(Arc::new(RecordTy {
                        name: String::from("input"),
                        fields: record_fields,
                    })),
                    InputType::Object(input_fields),
                )
            }
            TypeExprKind::Enum(members) => {
                let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
                let e = EnumTy::new(&format!("one of [{}]", names.join(", ")), &names, false);
                (Ty::Enum(e.clone()), InputType::Enum(e))
            }
            TypeExprKind::IntRange { low, high } => (
                Ty::Number,
                InputType::Int {
                    low: *low,
                    high: *high,
                },
            ),
            TypeExprKind::Like(other) => match all.iter().find(|decl| decl.name.name == other.name)
            {
                Some(decl) if !matches!(decl.ty.kind, TypeExprKind::Like(_)) => {
                    // Report problems of the named type where it is declared only.
                    let before = self.diagnostics.len();
                    let result = self.input_type(&decl.ty, InputSource::Body, &[]);
                    self.diagnostics.truncate(before);
                    result
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
                    unknown()
                }
                None => {
                    let help = suggest(
                        &other.name,
                        all.iter()
                            .map(|d| d.name.name.as_str())
                            .filter(|name| *name != self_name),
                    )
                    .map(|close| format!("did you mean {close}?"))
                    .or_else(|| {
                        Some(String::from(
                            "`like` names another input declared in this policy",
                        ))
                    });
                    self.error_at(
                        codes::UNKNOWN_NAME,
                        other.span,
                        format!("there is no input `{}`", other.name),
                        "unknown input",
                        help,
                    );
                    unknown()
                }
            },
        }
    }

    pub(super) fn declare_inputs(&mut self, file: &'a PolicyFile) {
        let decls: Vec<&'a InputDecl> = file
            .items
            .iter()
            .filter_map(|item| match item {
                Item::Input(decl) => Some(&**decl),
                _ => None,
            })
            .collect();
        let mut names: HashMap<&str, Span> = HashMap::new();
        let mut fields: HashMap<(InputSource, String), Span> = HashMap::new();
        for decl in &decls {
            if let Some(first) = names.get(decl.name.name.as_str()) {
                let first = *first;
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_DEFINITION,
                        format!("input `{}` is declared twice", decl.name.name),
                    )
                    .at(source, decl.name.span, "declared again here")
                    .also(source, first, "first declared here")
                    .help("rename one of them"),
                );
                continue;
            }
            names.insert(&decl.name.name, decl.name.span);
            let field_key = (decl.source, decl.source_name.value.to_ascii_lowercase());
            if let Some(first) = fields.get(&field_key) {
                let first = *first;
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(
                        codes::DUPLICATE_DEFINITION,
                        format!("two inputs read `{}`", decl.source_name.value),
                    )
                    .at(source, decl.source_name.span, "read again here")
                    .also(source, first, "first read here")
                    .help("one input per body field or header"),
                );
            } else {
                fields.insert(field_key, decl.source_name.span);
            }
            if let Some((problem, help)) = unreadable(decl.source, &decl.source_name.value) {
                self.error_at(
                    codes::RESERVED_INPUT,
                    decl.source_name.span,
                    problem,
                    "read here",
                    Some(help),
                );
            }
            let (ty, input_type) =
                self.input_type_of(&decl.ty, decl.source, &decls, &decl.name.name);
            let malformed = match &decl.malformed_error {
                Some(error) => self.raise(error, RaiseKind::BeforeAttempt),
                None => {
                    self.error_at(
                        codes::MISSING_INPUT_ERROR,
                        decl.name.span,
                        format!(
                            "input `{}` does not say which error a malformed value gets",
                            decl.name.name
                        ),
                        "no `malformed error`",
                        Some(String::from("add `malformed error NAME` after its type")),
                    );
                    ErrorRef::Declared(usize::MAX)
                }
            };
            let invalid = match &decl.invalid_error {
                Some(error) => self.raise(error, RaiseKind::BeforeAttempt),
                None => malformed,
            };
            let unknown = match &decl.unknown_error {
                Some(error) => self.raise(error, RaiseKind::BeforeAttempt),
                None => malformed,
            };

            // `like NAME` takes NAME's shorthand too, so both read the same values.
            let shorthand_decl = decl.shorthand.as_ref().or_else(|| match &decl.ty.kind {
                TypeExprKind::Like(other) => decls
                    .iter()
                    .find(|d| d.name.name == other.name)
                    .and_then(|d| d.shorthand.as_ref()),
                _ => None,
            });
            let before = self.diagnostics.len();
            let shorthand =
                shorthand_decl.map(|shorthand| self.shorthand(decl, shorthand, &ty, &decls));
            if decl.shorthand.is_none() {
                // Problems of a borrowed shorthand are reported where it is written.
                self.diagnostics.truncate(before);
            }
            self.inputs.push(InputInfo {
                decl,
                ty,
                used: false,
            });
            self.program.inputs.push(ir::InputSpec {
                name: decl.name.name.clone(),
                source: match decl.source {
                    InputSource::Body => ir::InputSourceKind::Body,
                    InputSource::Header => ir::InputSourceKind::Header,
                },
                field: match decl.source {
                    InputSource::Body => decl.source_name.value.clone(),
                    InputSource::Header => decl.source_name.value.to_ascii_lowercase(),
                },
                ty: input_type,
                shorthand,
                malformed,
                invalid,
                unknown,
                unless: None,
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
        // Once every input is declared, so that a definition the condition
        // uses is checked with the inputs it may name (and refused for them).
        // `self.inputs` and the program's inputs hold the declarations kept
        // (not a second one of a name), in the same order.
        let kept: Vec<&'a InputDecl> = self.inputs.iter().map(|input| input.decl).collect();
        for (index, decl) in kept.into_iter().enumerate() {
            let Some(condition) = &decl.unless else {
                continue;
            };
            let unless = self.unless_condition(condition);
            if let Some(spec) = self.program.inputs.get_mut(index) {
                spec.unless = Some(unless);
            }
        }
    }

    /// An input's `unless`: asked before any input is read, so it may read
    /// the request and its caller only.
    fn unless_condition(&mut self, condition: &Expr) -> ir::Term {
        let place = Place::only(
            "an input's `unless`",
            Roots::of(&[
                Root::Request,
                Root::Tenant,
                Root::Workspace,
                Root::Key,
                Root::Deployment,
            ]),
        );
        let term = self
            .expect(condition, &Ty::Bool, &place, &Scope::default())
            .1;
        if self.reads_request_state(&term, &mut HashSet::new()) {
            self.error_at(
                codes::NOT_IN_SCOPE,
                condition.span,
                String::from(
                    "an input's `unless` is asked before any input is read, but this condition reads an input, a merge or a setting through a definition",
                ),
                "reads what is not known yet",
                Some(String::from(
                    "write the condition with `request`, `tenant`, `workspace`, `key` and `deployment` only",
                )),
            );
        }
        term
    }

    /// Whether a term reads an input, a merge or a setting, looking through
    /// definitions (each once): what an input's `unless` cannot know yet.
    fn reads_request_state(&self, term: &ir::Term, seen: &mut HashSet<usize>) -> bool {
        use ir::TermKind;
        match &term.kind {
            TermKind::Read(ir::Read::Input(..) | ir::Read::Setting(_)) | TermKind::Merge(_) => true,
            TermKind::Let(index) => {
                seen.insert(*index)
                    && self
                        .program
                        .lets
                        .get(*index)
                        .and_then(Option::as_ref)
                        .is_some_and(|spec| self.reads_request_state(&spec.term, seen))
            }
            TermKind::Const(_) | TermKind::Read(_) => false,
            TermKind::At(_, inner)
            | TermKind::Not(inner)
            | TermKind::Negate(inner)
            | TermKind::Field(inner, _)
            | TermKind::ToEnum(_, inner)
            | TermKind::Static(_, inner)
            | TermKind::Hoisted(_, inner) => self.reads_request_state(inner, seen),
            TermKind::Binary(_, lhs, rhs) => {
                self.reads_request_state(lhs, seen) || self.reads_request_state(rhs, seen)
            }
            TermKind::If(condition, then, otherwise) => {
                self.reads_request_state(condition, seen)
                    || self.reads_request_state(then, seen)
                    || self.reads_request_state(otherwise, seen)
            }
            TermKind::Call(_, items) | TermKind::List(items) => items
                .iter()
                .any(|item| self.reads_request_state(item, seen)),
            TermKind::Record(fields) => fields
                .iter()
                .any(|(_, item)| self.reads_request_state(item, seen)),
            TermKind::Aggregate(_, value, filter) => {
                self.reads_request_state(value, seen)
                    || filter
                        .as_deref()
                        .is_some_and(|filter| self.reads_request_state(filter, seen))
            }
            TermKind::Grouped(_, scored, inner) => {
                scored
                    .iter()
                    .any(|item| self.reads_request_state(item, seen))
                    || self.reads_request_state(inner, seen)
            }
        }
    }

    fn shorthand(
        &mut self,
        decl: &InputDecl,
        shorthand: &Shorthand,
        object: &Ty,
        all: &[&'a InputDecl],
    ) -> (InputType, ir::Term) {
        let (it, it_input) = self.input_type(&shorthand.ty, decl.source, all);
        if matches!(it, Ty::Record(_)) {
            self.error_at(
                codes::TYPE_MISMATCH,
                shorthand.ty.span,
                String::from("a shorthand reads a single value, not an object"),
                "object type",
                Some(String::from("give the shorthand a single type, such as `shorthand provider => { only: [it] }`; the object type is the input's own")),
            );
        }
        let place = Place::only("an input's shorthand", Roots::of(&[Root::It]));
        let scope = Scope {
            it: Some(it),
            ..Scope::default()
        };
        let (value, _, term) = self.check_expr(&shorthand.value, &place, &scope);
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
            return (it_input, term);
        };
        if let ExprKind::Object(literal_fields) = &shorthand.value.kind {
            // A number written for a field of a range must be in it: the
            // expansion is read as a written object, and every request
            // using the shorthand would be refused.
            let declared = match &decl.ty.kind {
                TypeExprKind::Object(fields) => fields.as_slice(),
                _ => &[],
            };
            for (ident, expr) in literal_fields {
                let range = declared.iter().find_map(|field| match field.ty.kind {
                    TypeExprKind::IntRange { low, high } if field.name.name == ident.name => {
                        Some((low, high))
                    }
                    _ => None,
                });
                if let (Some((low, high)), Some(number)) = (range, expr::constant_number(expr))
                    && (number.fract() != 0.0 || number < low || number > high)
                {
                    self.error_at(
                        codes::TYPE_MISMATCH,
                        expr.span,
                        format!("`{number}` is outside `{}`'s range", ident.name),
                        "out of range",
                        Some(format!("write a whole number from {low} to {high}")),
                    );
                }
            }
            for ((name, actual), (ident, expr)) in written.fields.iter().zip(literal_fields) {
                match target.field(name) {
                    // Read as a written object is: an enumeration's member
                    // by its name.
                    Some(expected) if matches!(actual.required(), Ty::String) => {
                        match expected.required() {
                            Ty::Enum(members) => self.enum_literal(members, expr),
                            _ => self.require_type(expr, actual, expected),
                        }
                    }
                    Some(expected) => self.require_type(expr, actual, expected),
                    None => {
                        let help = suggest(name, target.fields.iter().map(|(f, _)| f.as_str()))
                            .map(|close| format!("did you mean {close}?"))
                            .or_else(|| {
                                let fields: Vec<&str> =
                                    target.fields.iter().map(|(f, _)| f.as_str()).collect();
                                Some(format!(
                                    "input `{}` has: {}",
                                    decl.name.name,
                                    fields.join(", ")
                                ))
                            });
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
        (it_input, term)
    }
}

/// Why an input cannot read this body field or header: the proxy reads or
/// sends it itself (an input is removed from the request before it goes
/// upstream), or no request can carry it. The problem and a hint.
fn unreadable(source: InputSource, field: &str) -> Option<(String, String)> {
    let owned = |what: &str, instead: &str| {
        Some((
            format!("an input cannot read `{field}`: {what}"),
            String::from(instead),
        ))
    };
    match source {
        InputSource::Body => match field {
            "" => owned("a body field has a name", "name the body field"),
            "model" => owned(
                "the proxy reads it and sends the upstream model's name in it",
                "read the requested model as `request.model`",
            ),
            "stream" => owned(
                "the proxy reads it and the provider needs it",
                "read it as `request.stream`",
            ),
            _ => None,
        },
        InputSource::Header => {
            let lower = field.to_ascii_lowercase();
            if field.is_empty() || !field.bytes().all(is_token_byte) {
                owned(
                    "it is not a header name",
                    "a header name is letters, digits and `!#$%&'*+-.^_`|~`, with no spaces or colons",
                )
            } else if ["authorization", "x-api-key"].contains(&lower.as_str()) {
                owned(
                    "it carries the caller's key, which the proxy checks and never forwards",
                    "read who calls through `key`, `tenant` and `workspace`",
                )
            } else if [
                "host",
                "content-length",
                "content-type",
                "transfer-encoding",
                "connection",
                "expect",
            ]
            .contains(&lower.as_str())
            {
                owned(
                    "the HTTP layer reads and writes it",
                    "send routing hints in a header of their own",
                )
            } else {
                None
            }
        }
    }
}

/// Whether a byte may be part of an HTTP header name (RFC 9110's `token`).
fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}
