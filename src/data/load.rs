//! Reads the catalog and tenants files, checks them against their schemas and
//! each other, and builds the validated [`Data`]. Every problem is reported
//! with its file, line and column; loading goes on past problems so one run
//! shows them all.

use super::model::*;
use super::schema::*;
use super::yaml::*;
use crate::diagnostics::{Code, Diagnostic, codes, io_reason, suggest};
use crate::source::{MAX_FILE_BYTES, SourceId, SourceMap, Span, read_text, refuse_special_file};
use crate::value::{EnumMember, Value};
use foldhash::{HashMap, HashSet};
use serde_saphyr::{Location, Spanned};
use std::path::Path;
use std::sync::Arc;

/// Whether a file is read once, or again at every reload of the policy
/// that is served.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ReadWhen {
    Once,
    AtEveryReload,
}

/// Reads a file into the source map, or reports why it could not.
pub fn read_source(
    path: &Path,
    shown_as: &str,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
    referenced_at: Option<(SourceId, Span)>,
    when: ReadWhen,
) -> Option<SourceId> {
    // A pipe in the place of a file read at every reload would hang them
    // all.
    let read = match when {
        ReadWhen::AtEveryReload => {
            refuse_special_file(path).and_then(|()| read_text(path, MAX_FILE_BYTES))
        }
        ReadWhen::Once => read_text(path, MAX_FILE_BYTES),
    };
    match read {
        Ok(text) => Some(sources.add(shown_as, text)),
        Err(error) => {
            let mut diagnostic = Diagnostic::new(
                codes::READ_FAILED,
                format!("cannot read `{shown_as}`: {}", io_reason(&error)),
            );
            let help = if error.kind() == std::io::ErrorKind::InvalidData {
                "save the file as UTF-8 text"
            } else if error.kind() == std::io::ErrorKind::FileTooLarge {
                "check the path: policies and data files are at most 64 MiB"
            } else if when == ReadWhen::AtEveryReload
                && error.kind() == std::io::ErrorKind::InvalidInput
            {
                "a served policy and its data files are read again at every reload: give a regular file"
            } else if referenced_at.is_some() {
                "check the path; data paths are relative to the policy file"
            } else {
                "check the path"
            };
            diagnostic = match referenced_at {
                Some((source, span)) => diagnostic.at(source, span, "named here"),
                None => diagnostic.about_file(shown_as),
            };
            diagnostics.push(diagnostic.help(help));
            None
        }
    }
}

/// Longest line accepted in a data file: the YAML reader slows down on very
/// long flow-style lines.
const MAX_LINE_BYTES: usize = 256 * 1024;

/// Largest data file accepted; catalogs of 10,000 routes are well below it.
const MAX_DATA_BYTES: usize = 64 * 1024 * 1024;

/// Converts a YAML location into a byte span of the file.
fn span_at(sources: &SourceMap, source: SourceId, location: &Location) -> Span {
    let Some(file) = sources.file(source) else {
        return Span::default();
    };
    if location.line() == 0 {
        return Span::default();
    }
    // Parsed from a string, the location knows its bytes: no need to walk
    // the line (which, on a long flow line, made every value cost the line).
    let span = location.span();
    if let (Some(offset), Some(length)) = (span.byte_offset(), span.byte_len())
        && let (Ok(start), Ok(length)) = (usize::try_from(offset), usize::try_from(length))
        && file.text.is_char_boundary(start)
        && file
            .text
            .is_char_boundary(start.saturating_add(length.max(1)).min(file.text.len()))
    {
        let end = start.saturating_add(length.max(1)).min(file.text.len());
        // A value never spans past its line in our spans.
        let end = file
            .text
            .get(start..end)
            .and_then(|text| text.find('\n'))
            .map_or(end, |newline| start + newline);
        return Span::new(start, end.max(start));
    }
    let line = usize::try_from(location.line()).unwrap_or(usize::MAX);
    let column = usize::try_from(location.column()).unwrap_or(usize::MAX);
    let start = file.offset_of(line, column);
    let length = usize::try_from(location.span().len()).unwrap_or(0).max(1);
    let end = file.text.get(start..).map_or(start, |rest| {
        start
            + rest
                .char_indices()
                .take_while(|(_, c)| *c != '\n')
                .nth(length)
                .map_or_else(|| rest.find('\n').unwrap_or(rest.len()), |(at, _)| at)
    });
    Span::new(start, end.max(start))
}

/// How the data files are read. A position for every value is what makes
/// YAML slow to read (about 12 MB/s), and positions matter only when
/// something is reported; a file written as JSON (a subset of YAML, and what
/// tools that generate large catalogs write) is read over ten times faster by a
/// JSON reader, without positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// JSON text through the JSON reader; anything else as YAML.
    JsonFast,
    /// Every file through the YAML reader, with positions.
    WithPositions,
}

/// A data file read into its raw form, and whether its values know where
/// they were written.
struct Parsed<T> {
    raw: T,
    located: bool,
}

fn parse_data<T: serde::de::DeserializeOwned>(
    sources: &SourceMap,
    source: SourceId,
    diagnostics: &mut Vec<Diagnostic>,
    reading: Reading,
) -> Option<Parsed<T>> {
    let text = sources.file(source).map_or("", |file| file.text.as_str());
    if text.len() > MAX_DATA_BYTES {
        diagnostics.push(
            Diagnostic::new(codes::DATA_SCHEMA, "this data file is larger than 64 MiB")
                .at(source, Span::new(0, 0), "in this file")
                .help("split the catalog or remove unused entries"),
        );
        return None;
    }
    // Only a file that is JSON from its first character: JSON that does not
    // fit the schema is read again as YAML, whose errors have positions.
    let mut json_error = None;
    if reading == Reading::JsonFast && text.trim_start().starts_with('{') {
        match serde_json::from_str::<T>(text) {
            Ok(raw) => {
                return Some(Parsed {
                    raw,
                    located: false,
                });
            }
            Err(error) => json_error = Some(error),
        }
    }
    // The YAML reader slows down on very long lines; the JSON reader does
    // not. One pass over the bytes.
    if let Some(index) = text
        .as_bytes()
        .split(|byte| *byte == b'\n')
        .position(|line| line.len() > MAX_LINE_BYTES)
    {
        let file = sources.file(source);
        // Compact JSON cannot be read as YAML: its own reader's error,
        // placed by line and column, says what is wrong, not the line's length.
        if let Some(error) = json_error {
            // The JSON reader counts a column in bytes.
            let at = file.map_or(0, |f| {
                let mut at = f
                    .offset_of(error.line(), 1)
                    .saturating_add(error.column().saturating_sub(1))
                    .min(f.text.len());
                while !f.text.is_char_boundary(at) {
                    at -= 1;
                }
                at
            });
            diagnostics.push(schema_diagnostic(
                YamlError::of_text(&error.to_string()),
                source,
                Span::new(at, at + 1),
            ));
            return None;
        }
        let start = file.map_or(0, |f| f.offset_of(index + 1, 1));
        diagnostics.push(
            Diagnostic::new(codes::DATA_SCHEMA, format!("line {} is longer than 256 KiB", index + 1))
                .at(source, Span::new(start, start + 1), "this line")
                .help("very long flow-style lines are slow to read; write the data in block style, one entry per line"),
        );
        return None;
    }
    match serde_saphyr::from_str_with_options::<T>(text, yaml_options()) {
        Ok(raw) => Some(Parsed { raw, located: true }),
        Err(error) => {
            let mut read = YamlError::of(&error);
            let tab = tab_place(&error, text).and_then(|(line, column)| {
                sources
                    .file(source)
                    .map(|file| file.offset_of(line, column))
            });
            let span = match tab {
                Some(at) => {
                    read.message = String::from(TAB_IN_INDENTATION);
                    Span::new(at, at + 1)
                }
                // A required list is missed at the file's end, where it was
                // cut off, not at the mapping's start where the reader
                // places it.
                None if missing_list(&read.message).is_some() => {
                    let end = text.trim_end().len();
                    Span::new(end, end)
                }
                None => error.location().map_or_else(Span::default, |location| {
                    span_at(sources, source, &location)
                }),
            };
            diagnostics.push(schema_diagnostic(read, source, span));
            None
        }
    }
}

/// A data file that does not fit its schema, at `span`: an unknown field
/// with the fields allowed there, anything else with where the forms are.
fn schema_diagnostic(read: YamlError, source: SourceId, span: Span) -> Diagnostic {
    let (code, help) = match &read.unknown_field {
        Some(unknown) => {
            let help = unknown
                .suggestion()
                .map(|close| format!("did you mean {close}?"))
                .unwrap_or_else(|| {
                    format!(
                        "the fields allowed here are: {}",
                        unknown.allowed.join(", ")
                    )
                });
            (codes::DATA_UNKNOWN_FIELD, help)
        }
        None => match missing_list(&read.message) {
            // Why it is required (a file without it is most often one
            // caught half written) and how to say there are none.
            Some(list) => (
                codes::DATA_SCHEMA,
                format!(
                    "a data file without its `{list}` is most often one caught half written, \
                     so it is refused rather than served; write `{list}: []` for none"
                ),
            ),
            None => (
                codes::DATA_SCHEMA,
                String::from("see docs/data.md for the form of each data file"),
            ),
        },
    };
    let label = if missing_list(&read.message).is_some() {
        "the file ends without it"
    } else {
        "here"
    };
    Diagnostic::new(code, read.message)
        .at(source, span, label)
        .help(help)
}

/// The data file's required list a schema error says is missing, if any.
fn missing_list(message: &str) -> Option<&'static str> {
    ["providers", "models", "tenants"]
        .into_iter()
        .find(|list| message == format!("missing field `{list}`"))
}

/// How data files are read: budgets that fit catalogs of tens of thousands
/// of routes (the input is at most 64 MiB) while alias expansion stays
/// bounded, and only `true` and `false` as booleans (so `no`, Norway's
/// country code, stays a string).
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 20_000_000;
    budget.max_events = 80_000_000;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.strict_booleans = true;
    // A number's range is checked where it is read, with a message about
    // the field (`.nan` is no priority), not the reader's.
    options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::PassThrough;
    options
}

/// Validation state shared by the catalog and tenants passes.
pub(super) struct Validator<'a> {
    sources: &'a SourceMap,
    pub(super) diagnostics: Vec<Diagnostic>,
    schema: Schema,
    /// Provider public names, aliases and ids (lowercase) → canonical name.
    provider_names: HashMap<String, String>,
    model_ids: Vec<String>,
    /// Attributes whose declaration was refused, so entries setting them
    /// are not reported again.
    refused_attributes: Vec<(Subject, String)>,
}

impl<'a> Validator<'a> {
    pub(super) fn span<T>(&self, source: SourceId, value: &Spanned<T>) -> Span {
        span_at(self.sources, source, &value.referenced)
    }

    pub(super) fn report(
        &mut self,
        code: Code,
        source: SourceId,
        span: Span,
        message: String,
        label: &str,
        help: Option<String>,
    ) {
        self.diagnostics.push(
            Diagnostic::new(code, message)
                .at(source, span, label)
                .help_opt(help),
        );
    }

    // ---------------------------------------------------------- schema

    fn declare_enums(&mut self, source: SourceId, enums: &SpannedMap<Vec<Spanned<String>>>) {
        for (name, members) in &enums.0 {
            let span = self.span(source, name);
            if self.schema.enum_by_name(&name.value).is_some()
                || AttrType::builtin_names().contains(&name.value.as_str())
            {
                self.report(
                    codes::DUPLICATE_ID,
                    source,
                    span,
                    format!("enumeration `{}` is declared twice", name.value),
                    "declared again here",
                    Some(String::from(
                        "enumerations share one namespace across the catalog and tenants files",
                    )),
                );
                continue;
            }
            let mut seen = HashSet::default();
            let mut list = Vec::new();
            for member in members {
                if !seen.insert(member.value.clone()) {
                    let span = self.span(source, member);
                    self.report(
                        codes::DUPLICATE_ID,
                        source,
                        span,
                        format!(
                            "`{}` appears twice in enumeration `{}`",
                            member.value, name.value
                        ),
                        "again here",
                        Some(String::from(
                            "an enumeration lists each member once; remove one",
                        )),
                    );
                }
                list.push(member.value.clone());
            }
            if list.is_empty() {
                self.report(
                    codes::DATA_SCHEMA,
                    source,
                    span,
                    format!("enumeration `{}` has no members", name.value),
                    "empty",
                    Some(String::from(
                        "list its members, weakest first, as in `tier: [low, high]`",
                    )),
                );
            }
            self.schema.enums.push(EnumDef {
                name: name.value.clone(),
                members: list,
            });
        }
    }

    fn declare_attributes(
        &mut self,
        source: SourceId,
        subject: Subject,
        specs: &AttrSpecs,
        builtins: &[&str],
    ) {
        for (name, spec) in &specs.0 {
            let name_span = self.span(source, name);
            if builtins.contains(&name.value.as_str()) {
                self.report(
                    codes::DUPLICATE_ID,
                    source,
                    name_span,
                    format!(
                        "`{}` is a built-in field of {}s and cannot be declared again",
                        name.value,
                        subject.name()
                    ),
                    "already built in",
                    Some(String::from("choose another name for this attribute")),
                );
                continue;
            }
            if self.schema.table(subject).get(&name.value).is_some() {
                self.report(
                    codes::DUPLICATE_ID,
                    source,
                    name_span,
                    format!(
                        "attribute `{}` of {}s is declared twice",
                        name.value,
                        subject.name()
                    ),
                    "declared again here",
                    None,
                );
                continue;
            }
            let ty_span = if spec.value.ty.referenced.line() == 0 {
                self.span(source, spec)
            } else {
                self.span(source, &spec.value.ty)
            };
            let Some(ty) = AttrType::parse(&spec.value.ty.value, &self.schema.enums) else {
                let known: Vec<String> = AttrType::builtin_names()
                    .iter()
                    .map(|s| s.to_string())
                    .chain(self.schema.enums.iter().map(|e| e.name.clone()))
                    .collect();
                let help = suggest(&spec.value.ty.value, known.iter().map(String::as_str))
                    .map(|close| format!("did you mean {close}?"))
                    .unwrap_or_else(|| {
                        String::from("types are bool, number, string, duration, date, provider, model, list<T>, or an enumeration declared under `enums`")
                    });
                self.report(
                    codes::BAD_SCHEMA_TYPE,
                    source,
                    ty_span,
                    format!("`{}` is not a type", spec.value.ty.value),
                    "unknown type",
                    Some(help),
                );
                self.refused_attributes.push((subject, name.value.clone()));
                continue;
            };
            let default = spec
                .value
                .default
                .as_ref()
                .and_then(|raw| self.convert(source, raw, &ty, &name.value));
            Arc::make_mut(&mut self.schema.table_mut(subject).entries).push(AttrDecl {
                name: name.value.clone(),
                ty,
                default,
                required: spec.value.required,
                span: name_span,
            });
        }
    }

    // ---------------------------------------------------------- values

    /// Whether an attribute's declaration was refused.
    fn refused(&self, subject: Subject, name: &str) -> bool {
        self.refused_attributes
            .iter()
            .any(|(refused_subject, refused)| *refused_subject == subject && refused == name)
    }

    /// Converts a raw value to its declared type, reporting a mismatch.
    fn convert(
        &mut self,
        source: SourceId,
        raw: &Spanned<RawValue>,
        ty: &AttrType,
        attribute: &str,
    ) -> Option<Value> {
        let span = self.span(source, raw);
        let mismatch = |this: &mut Self, help: Option<String>| {
            let describe = ty.describe(&this.schema.enums);
            this.report(
                codes::ATTRIBUTE_TYPE,
                source,
                span,
                format!(
                    "`{attribute}` must be {describe}, found {}",
                    raw.value.kind()
                ),
                "wrong type",
                help.or_else(|| Some(format!("write {} here", example_of(ty)))),
            );
            None
        };
        match (ty, &raw.value) {
            (AttrType::Bool, RawValue::Bool(b)) => Some(Value::Bool(*b)),
            (AttrType::Number, RawValue::Number(n)) if n.is_finite() => Some(Value::Number(*n)),
            (AttrType::String, RawValue::String(s)) => {
                self.check_not_secret(source, span, attribute, s);
                Some(Value::String(Arc::from(s.as_str())))
            }
            (AttrType::Duration, RawValue::String(s)) => match parse_duration(s) {
                Some(ms) => Some(Value::Duration(ms)),
                None => mismatch(
                    self,
                    Some(String::from(
                        "write a duration such as `10s`, `500ms` or `5m`",
                    )),
                ),
            },
            (AttrType::Date, RawValue::String(s)) => match parse_date(s) {
                Some(days) => Some(Value::Date(days)),
                None => mismatch(self, Some(String::from("write a date as `YYYY-MM-DD`"))),
            },
            (AttrType::Enum(id), RawValue::String(s)) => {
                let def = self.schema.enum_def(*id)?;
                match def.index_of(s) {
                    Some(index) => Some(Value::Enum(EnumMember {
                        rank: u32::try_from(index).unwrap_or(u32::MAX),
                        name: Arc::from(s.as_str()),
                    })),
                    None => {
                        let help = suggest(s, def.members.iter().map(String::as_str))
                            .map(|close| format!("did you mean {close}?"))
                            .unwrap_or_else(|| {
                                format!("members of `{}`: {}", def.name, def.members.join(", "))
                            });
                        self.report(
                            codes::ATTRIBUTE_TYPE,
                            source,
                            span,
                            format!("`{s}` is not a member of `{}`", def.name),
                            "unknown member",
                            Some(help),
                        );
                        None
                    }
                }
            }
            (AttrType::Provider, RawValue::String(s)) => {
                match self.provider_names.get(&s.to_ascii_lowercase()) {
                    Some(name) => Some(Value::String(Arc::from(name.as_str()))),
                    None => {
                        let names: Vec<&str> =
                            self.provider_names.values().map(String::as_str).collect();
                        let help = suggest(s, names)
                            .map(|close| format!("did you mean {close}?"))
                            .or_else(|| Some(String::from(UNKNOWN_PROVIDER_HELP)));
                        self.report(
                            codes::UNKNOWN_REFERENCE,
                            source,
                            span,
                            format!("no provider is named `{s}`"),
                            "unknown provider",
                            help,
                        );
                        None
                    }
                }
            }
            (AttrType::Model, RawValue::String(s)) => {
                if self.model_ids.iter().any(|id| id == s) {
                    Some(Value::String(Arc::from(s.as_str())))
                } else {
                    let help = suggest(s, self.model_ids.iter().map(String::as_str))
                        .map(|close| format!("did you mean {close}?"))
                        .or_else(|| Some(String::from(UNKNOWN_MODEL_HELP)));
                    self.report(
                        codes::UNKNOWN_REFERENCE,
                        source,
                        span,
                        format!("no model has the id `{s}`"),
                        "unknown model",
                        help,
                    );
                    None
                }
            }
            (AttrType::List(inner), RawValue::List(items)) => {
                let converted: Vec<Value> = items
                    .iter()
                    .filter_map(|item| self.convert(source, item, inner, attribute))
                    .collect();
                Some(Value::List(Arc::from(converted)))
            }
            _ => mismatch(self, None),
        }
    }

    /// Declared attribute values of one entry, in schema order.
    pub(super) fn attributes(
        &mut self,
        source: SourceId,
        subject: Subject,
        values: &AttrValues,
        owner: (&dyn std::fmt::Display, Span),
    ) -> Attributes {
        let table = self.schema.table(subject).clone();
        let mut out: Vec<Option<Value>> = table.entries.iter().map(AttrDecl::fallback).collect();
        let mut seen = vec![false; table.entries.len()];
        for (name, raw) in &values.0 {
            let span = self.span(source, name);
            if self.refused(subject, &name.value) {
                continue;
            }
            let Some(index) = table.index_of(&name.value) else {
                let help = suggest(&name.value, table.names())
                    .map(|close| format!("did you mean {close}?"))
                    .unwrap_or_else(|| {
                        format!(
                            "declare it under `attributes: {}:` with its type",
                            subject.name()
                        )
                    });
                self.report(
                    codes::UNDECLARED_ATTRIBUTE,
                    source,
                    span,
                    format!(
                        "{} attribute `{}` is not declared",
                        subject.name(),
                        name.value
                    ),
                    "not in the schema",
                    Some(help),
                );
                continue;
            };
            match seen.get_mut(index) {
                Some(seen) if !*seen => *seen = true,
                _ => continue,
            }
            let Some(decl) = table.entries.get(index) else {
                continue;
            };
            if let Some(value) = self.convert(source, raw, &decl.ty, &name.value)
                && let Some(slot) = out.get_mut(index)
            {
                *slot = Some(value);
            }
        }
        for ((decl, value), seen) in table.entries.iter().zip(&out).zip(&seen) {
            // An attribute set to a refused value was reported already.
            if decl.required && value.is_none() && !seen {
                let (owner_name, owner_span) = owner;
                self.report(
                    codes::UNDECLARED_ATTRIBUTE,
                    source,
                    owner_span,
                    format!(
                        "{} `{owner_name}` does not set the required attribute `{}`",
                        subject.name(),
                        decl.name
                    ),
                    "attribute missing",
                    Some(format!("add `{}: ...` under its `attributes`", decl.name)),
                );
            }
        }
        Attributes(out)
    }

    /// Settings set at one layer: `None` where the layer leaves a setting to
    /// the next one.
    fn settings(&mut self, source: SourceId, values: &AttrValues) -> Attributes {
        let table = self.schema.settings.clone();
        let mut out: Vec<Option<Value>> = vec![None; table.entries.len()];
        for (name, raw) in &values.0 {
            let span = self.span(source, name);
            if self.refused(Subject::Setting, &name.value) {
                continue;
            }
            let Some(index) = table.index_of(&name.value) else {
                let help = suggest(&name.value, table.names())
                    .map(|close| format!("did you mean {close}?"))
                    .unwrap_or_else(|| {
                        String::from("declare it under the top-level `settings:` with its type")
                    });
                self.report(
                    codes::UNDECLARED_ATTRIBUTE,
                    source,
                    span,
                    format!("setting `{}` is not declared", name.value),
                    "not in the schema",
                    Some(help),
                );
                continue;
            };
            let Some(decl) = table.entries.get(index) else {
                continue;
            };
            if let Some(value) = self.convert(source, raw, &decl.ty, &name.value)
                && let Some(slot) = out.get_mut(index)
            {
                *slot = Some(value);
            }
        }
        Attributes(out)
    }

    pub(super) fn settings_layer(
        &mut self,
        source: SourceId,
        all: &AttrValues,
        per_model: &SpannedMap<AttrValues>,
    ) -> SettingsLayer {
        let all_models = self.settings(source, all);
        let mut layer = SettingsLayer {
            all_models,
            per_model: Vec::new(),
        };
        for (model, values) in &per_model.0 {
            if !self.model_ids.iter().any(|id| id == &model.value) {
                let span = self.span(source, model);
                let help = suggest(&model.value, self.model_ids.iter().map(String::as_str))
                    .map(|close| format!("did you mean {close}?"))
                    .or_else(|| Some(String::from(UNKNOWN_MODEL_HELP)));
                self.report(
                    codes::UNKNOWN_REFERENCE,
                    source,
                    span,
                    format!("no model has the id `{}`", model.value),
                    "unknown model",
                    help,
                );
                continue;
            }
            let settings = self.settings(source, values);
            layer.per_model.push((model.value.clone(), settings));
        }
        layer
    }

    /// Refuses strings that look like a credential pasted into data.
    pub(super) fn check_not_secret(
        &mut self,
        source: SourceId,
        span: Span,
        field: &str,
        text: &str,
    ) {
        if crate::diagnostics::redact::looks_like_secret(text) {
            self.diagnostics
                .push(secret_diagnostic(source, span, field));
        }
    }

    /// Refuses a name (an id, alias or upstream model) that looks like a
    /// credential: no secret belongs there, by reference or otherwise.
    /// An id or name ends up in requests, headers, logs and metrics: it is
    /// some text, without a control character, and holds no secret.
    pub(super) fn check_name(&mut self, source: SourceId, span: Span, field: &str, text: &str) {
        if text.is_empty() {
            self.report(
                codes::DATA_SCHEMA,
                source,
                span,
                format!("`{field}` is empty"),
                "no name",
                Some(String::from(
                    "ids and names are what requests, logs and metrics call things by; write one",
                )),
            );
        } else if text.chars().any(char::is_control) {
            self.report(
                codes::DATA_SCHEMA,
                source,
                span,
                format!("`{field}` holds a control character"),
                "not plain text",
                Some(String::from(
                    "ids and names travel in headers and log lines, which cannot carry one; remove it",
                )),
            );
        } else if crate::diagnostics::redact::looks_like_generated_key(text) {
            let mut diagnostic = secret_diagnostic(source, span, field);
            diagnostic.help = Some(String::from(
                "a name does not hold a secret: write what it names here, and rotate the exposed key",
            ));
            self.diagnostics.push(diagnostic);
        }
    }
}

/// What a value of a type looks like in YAML, for help lines.
fn example_of(ty: &AttrType) -> &'static str {
    match ty {
        AttrType::Bool => "`true` or `false`",
        AttrType::Number => "a number",
        AttrType::String => "a string",
        AttrType::Duration => "a duration such as `10s`",
        AttrType::Date => "a date such as `2024-03-01`",
        AttrType::Enum(_) => "one of the enumeration's members",
        AttrType::Provider => "a provider id",
        AttrType::Model => "a model id",
        AttrType::List(_) => "a list such as `[a, b]`",
    }
}

/// A diagnostic about a secret in a data file; it names the place but never
/// quotes the line, so the secret does not reach terminals or CI logs.
pub(super) fn secret_diagnostic(source: SourceId, span: Span, field: &str) -> Diagnostic {
    let mut diagnostic = Diagnostic::new(
        codes::LITERAL_SECRET,
        format!("`{field}` holds what looks like a literal secret"),
    )
    .at(source, span, "secret value")
    .help(
        "only a credential's `key` reads a secret, as `key: ${NAME}` with NAME in the environment; \
         remove it from here, and rotate the exposed key",
    );
    diagnostic.quote_source = false;
    diagnostic
}

/// Checks for duplicate ids, reporting each repeat.
pub(super) fn unique<'v>(
    validator: &mut Validator<'_>,
    source: SourceId,
    what: &str,
    ids: impl IntoIterator<Item = &'v Spanned<String>>,
) {
    let mut seen: HashMap<&str, Span> = HashMap::default();
    for id in ids {
        let span = validator.span(source, id);
        if let Some(first) = seen.get(id.value.as_str()) {
            let first = *first;
            validator.diagnostics.push(
                Diagnostic::new(
                    codes::DUPLICATE_ID,
                    format!("{what} `{}` is defined twice", id.value),
                )
                .at(source, span, "defined again here")
                .also(source, first, "first defined here")
                .help(format!("{what} ids must be unique; rename or remove one")),
            );
        } else {
            seen.insert(&id.value, span);
        }
    }
}

const PROVIDER_BUILTINS: &[&str] = &[
    "id",
    "name",
    "aliases",
    "format",
    "endpoints",
    "base_url",
    "priority",
    "listed",
    "capacity",
    "credentials",
];
const ROUTE_BUILTINS: &[&str] = &["provider", "upstream_model", "price", "capabilities"];
const MODEL_BUILTINS: &[&str] = &["id", "kind", "aliases", "routes"];
const CREDENTIAL_BUILTINS: &[&str] = &["id", "owned", "tenant", "key"];
const TENANT_BUILTINS: &[&str] = &["id"];

/// The help for a model id the catalog does not have, when no id is close.
pub(super) const UNKNOWN_MODEL_HELP: &str =
    "a model is named by its `id` in the catalog's `models` list";

/// The help for a provider name the catalog does not have, when none is close.
const UNKNOWN_PROVIDER_HELP: &str = "a provider is named by its `id`, its `name` or one of its `aliases` in the catalog's `providers` list";

/// The environment variable named by a `${NAME}` reference.
pub(super) fn env_reference(text: &str) -> Option<&str> {
    let name = text.strip_prefix("${")?.strip_suffix('}')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'))
    .then_some(name)
}

/// Loads a catalog and tenants given as text (for tests and fuzzing).
pub fn load_texts(
    catalog: &str,
    tenants: &str,
    sources: &mut SourceMap,
) -> (Option<Data>, Vec<Diagnostic>) {
    let catalog_source = sources.add("catalog.yaml", catalog);
    let tenants_source = sources.add("tenants.yaml", tenants);
    load(catalog_source, tenants_source, sources)
}

/// Loads and validates a catalog and its tenants. The data comes back
/// whenever both files are well-formed YAML of the right shape, even if some
/// entries were refused, so the policy can still be checked against the
/// schema; the diagnostics say what was wrong.
///
/// A file written as JSON is read without positions ([`Reading::JsonFast`]);
/// when that read has something to report, both files are read again with
/// positions, so every diagnostic points at its line.
pub fn load(
    catalog_source: SourceId,
    tenants_source: SourceId,
    sources: &SourceMap,
) -> (Option<Data>, Vec<Diagnostic>) {
    let (data, diagnostics) =
        load_reading(catalog_source, tenants_source, sources, Reading::JsonFast);
    let unlocated = data.as_ref().is_some_and(|data| !data.located);
    if unlocated && !diagnostics.is_empty() {
        let located = load_reading(
            catalog_source,
            tenants_source,
            sources,
            Reading::WithPositions,
        );
        // A JSON file the YAML reader refuses (a line too long for it) keeps
        // its diagnostics without positions.
        if located.0.is_some() {
            return located;
        }
    }
    (data, diagnostics)
}

/// Loads the data files as [`load`] does, read the given way.
pub fn load_reading(
    catalog_source: SourceId,
    tenants_source: SourceId,
    sources: &SourceMap,
    reading: Reading,
) -> (Option<Data>, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    // A catalog of nothing but comments and blank lines: every declaration
    // the policy reads would be reported missing, one by one, instead. A
    // tenants file like it is most often one caught half written (a
    // truncating editor or generator), and served it would revoke every
    // key at once; `tenants: []` says on purpose that there are none.
    let is_blank = |source: SourceId| {
        sources
            .file(source)
            .map_or("", |file| file.text.as_str())
            .lines()
            .all(|line| {
                let line = line.trim();
                line.is_empty() || line.starts_with('#') || line == "---"
            })
    };
    let blank_files = [
        (
            catalog_source,
            "the catalog is empty",
            "a catalog lists `providers` and `models`; see docs/data.md",
        ),
        (
            tenants_source,
            "the tenants file is empty",
            "a tenants file lists `tenants` and their keys (see docs/data.md); \
             write `tenants: []` for a deployment with none",
        ),
    ];
    for (source, message, help) in blank_files {
        if is_blank(source) {
            diagnostics.push(
                Diagnostic::new(codes::DATA_SCHEMA, message)
                    .at(source, Span::new(0, 0), "nothing here")
                    .help(help),
            );
        }
    }
    if !diagnostics.is_empty() {
        return (None, diagnostics);
    }
    let catalog: Option<Parsed<RawCatalog>> =
        parse_data(sources, catalog_source, &mut diagnostics, reading);
    let tenants: Option<Parsed<RawTenants>> =
        parse_data(sources, tenants_source, &mut diagnostics, reading);
    let (Some(catalog), Some(tenants)) = (catalog, tenants) else {
        return (None, diagnostics);
    };
    let located = catalog.located && tenants.located;
    let (raw_catalog, raw_tenants) = (catalog.raw, tenants.raw);

    let mut validator = Validator {
        sources,
        diagnostics,
        schema: Schema::default(),
        provider_names: HashMap::default(),
        model_ids: Vec::new(),
        refused_attributes: Vec::new(),
    };
    let v = &mut validator;

    v.declare_enums(catalog_source, &raw_catalog.enums);
    v.declare_enums(tenants_source, &raw_tenants.enums);

    // Names first, so attribute values of type `provider` and `model` resolve.
    // Each word a request, a data file or a pin may name a provider by means
    // one provider name: a word of two would mean one provider in a request
    // and another in a data file or a pin.
    let mut first_use: HashMap<String, Span> = HashMap::default();
    let mut ids = HashSet::default();
    for provider in &raw_catalog.providers {
        let p = &provider.value;
        if !ids.insert(p.id.value.as_str()) {
            // A repeated id is E0204's.
            continue;
        }
        let name = p.name.as_ref().map_or(&p.id.value, |n| &n.value).clone();
        for word in std::iter::once(&p.id)
            .chain(p.name.iter())
            .chain(p.aliases.iter())
        {
            let key = word.value.to_ascii_lowercase();
            let span = v.span(catalog_source, word);
            match v.provider_names.get(&key) {
                Some(other) if *other != name => {
                    let mut diagnostic = Diagnostic::new(
                        codes::AMBIGUOUS_PROVIDER_NAME,
                        format!(
                            "`{}` would name providers `{other}` and `{name}`",
                            word.value
                        ),
                    )
                    .at(catalog_source, span, "names another provider here");
                    if let Some(first) = first_use.get(&key) {
                        diagnostic = diagnostic.also(catalog_source, *first, "first named here");
                    }
                    v.diagnostics.push(diagnostic.help(String::from(
                        "an id, name or alias (ignoring case) must mean providers of one name: \
                         rename one, or give the providers the same name",
                    )));
                }
                Some(_) => {}
                None => {
                    v.provider_names.insert(key.clone(), name.clone());
                    first_use.insert(key, span);
                }
            }
        }
    }
    v.model_ids = raw_catalog
        .models
        .iter()
        .map(|m| m.value.id.value.clone())
        .collect();

    let c = &raw_catalog.attributes;
    v.declare_attributes(
        catalog_source,
        Subject::Provider,
        &c.provider,
        PROVIDER_BUILTINS,
    );
    v.declare_attributes(catalog_source, Subject::Route, &c.route, ROUTE_BUILTINS);
    v.declare_attributes(catalog_source, Subject::Model, &c.model, MODEL_BUILTINS);
    v.declare_attributes(
        catalog_source,
        Subject::Credential,
        &c.credential,
        CREDENTIAL_BUILTINS,
    );
    v.declare_attributes(catalog_source, Subject::Deployment, &c.deployment, &[]);
    let t = &raw_tenants.attributes;
    v.declare_attributes(tenants_source, Subject::Tenant, &t.tenant, TENANT_BUILTINS);
    v.declare_attributes(
        tenants_source,
        Subject::Workspace,
        &t.workspace,
        TENANT_BUILTINS,
    );
    v.declare_attributes(tenants_source, Subject::Key, &t.key, TENANT_BUILTINS);
    v.declare_attributes(tenants_source, Subject::Setting, &raw_tenants.settings, &[]);

    let catalog = super::catalog::validate(v, catalog_source, &raw_catalog);
    let tenants = super::tenants::validate(
        v,
        tenants_source,
        &raw_tenants,
        &raw_catalog,
        catalog_source,
    );

    let diagnostics = std::mem::take(&mut v.diagnostics);
    let mut schema = std::mem::take(&mut v.schema);
    schema.refused = std::mem::take(&mut v.refused_attributes);
    (
        Some(Data {
            schema,
            catalog,
            tenants,
            located,
        }),
        diagnostics,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A YAML data file written again as JSON, the way a generator would.
    fn as_json(yaml: &str) -> String {
        let value: serde_json::Value =
            serde_saphyr::from_str_with_options(yaml, yaml_options()).expect("shipped YAML");
        serde_json::to_string_pretty(&value).expect("JSON")
    }

    /// Debug text of loaded data without the parts that say where values
    /// were written.
    fn without_positions(data: &Data) -> String {
        let text = format!("{data:?}");
        let mut kept = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find("span: Span {") {
            kept.push_str(&rest[..at]);
            rest = rest[at..].split_once('}').map_or("", |(_, after)| after);
        }
        kept.push_str(rest);
        kept.replace("located: false", "located: true")
    }

    fn load_both(
        catalog: &str,
        tenants: &str,
        reading: Reading,
    ) -> (Option<Data>, Vec<Diagnostic>) {
        let mut sources = SourceMap::new();
        let catalog = sources.add("catalog", catalog);
        let tenants = sources.add("tenants", tenants);
        load_reading(catalog, tenants, &sources, reading)
    }

    #[test]
    fn an_empty_capacity_declares_no_limit() {
        let catalog = "providers:\n  - id: a\n    format: openai\n    \
                       base_url: http://127.0.0.1:1/v1\n    capacity: {}\n\
                       models: []\n";
        let (data, diagnostics) = load_both(catalog, "tenants: []\n", Reading::WithPositions);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        let data = data.expect("the data loads");
        assert_eq!(data.catalog.providers[0].capacity, None);
    }

    #[test]
    fn a_provider_serves_the_endpoints_of_its_format_unless_named() {
        let catalog = "providers:\n  \
                       - {id: a, format: anthropic, base_url: \"http://127.0.0.1:1/v1\"}\n  \
                       - {id: o, format: openai, base_url: \"http://127.0.0.1:1/v1\"}\n  \
                       - id: both\n    format: anthropic\n    \
                       endpoints: [chat_completions, messages, chat_completions]\n    \
                       base_url: http://127.0.0.1:1/v1\n\
                       models: []\n";
        let (data, diagnostics) = load_both(catalog, "tenants: []\n", Reading::WithPositions);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        let data = data.expect("the data loads");
        let [anthropic, openai, both] = &data.catalog.providers[..] else {
            panic!("three providers");
        };
        assert_eq!(anthropic.endpoints, [Endpoint::Messages]);
        assert_eq!(
            openai.endpoints,
            [
                Endpoint::ChatCompletions,
                Endpoint::Completions,
                Endpoint::Embeddings,
                Endpoint::Responses
            ]
        );
        assert_eq!(both.format, WireFormat::Anthropic);
        assert_eq!(
            both.endpoints,
            [Endpoint::ChatCompletions, Endpoint::Messages]
        );
        assert!(both.serves(Endpoint::ChatCompletions) && !both.serves(Endpoint::Responses));
    }

    #[test]
    fn a_provider_serving_no_endpoint_is_refused() {
        let catalog = "providers:\n  - id: a\n    format: openai\n    endpoints: []\n    \
                       base_url: http://127.0.0.1:1/v1\nmodels: []\n";
        let (_, diagnostics) = load_both(catalog, "tenants: []\n", Reading::WithPositions);
        assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
        assert!(diagnostics[0].message.contains("at least one endpoint"));
    }

    #[test]
    fn json_data_reads_fast_into_the_same_data_as_yaml() {
        let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let mut compared = 0;
        for entry in std::fs::read_dir(&policies).expect("policies/") {
            let dir = entry.expect("entry").path();
            let (Ok(catalog), Ok(tenants)) = (
                std::fs::read_to_string(dir.join("catalog.yaml")),
                std::fs::read_to_string(dir.join("tenants.yaml")),
            ) else {
                continue;
            };
            // The same text through both readers (the conversion sorts keys,
            // and the order of declarations is kept).
            let (catalog, tenants) = (as_json(&catalog), as_json(&tenants));
            let (from_yaml, yaml_diagnostics) =
                load_both(&catalog, &tenants, Reading::WithPositions);
            let (from_json, json_diagnostics) = load_both(&catalog, &tenants, Reading::JsonFast);
            let (from_yaml, from_json) =
                (from_yaml.expect("YAML data"), from_json.expect("JSON data"));
            assert!(yaml_diagnostics.is_empty() && json_diagnostics.is_empty());
            assert!(from_yaml.located);
            assert!(!from_json.located, "{} was not read as JSON", dir.display());
            assert_eq!(without_positions(&from_yaml), without_positions(&from_json));
            compared += 1;
        }
        assert_eq!(compared, 5, "one data directory per reference policy");
    }

    #[test]
    fn json_with_a_mistake_is_read_again_with_positions() {
        let catalog = "{\n  \"providers\": [\n    {\"id\": \"a\", \"format\": \"openai\", \"base_url\": \"http://127.0.0.1:1/v1\", \"priority\": \"high\"}\n  ]\n}\n";
        let mut sources = SourceMap::new();
        let catalog = sources.add("catalog", catalog);
        let tenants = sources.add("tenants", "{}");
        let (_, diagnostics) = load(catalog, tenants, &sources);
        let label = diagnostics
            .first()
            .and_then(|diagnostic| diagnostic.primary.as_ref())
            .expect("a located diagnostic");
        let file = sources.file(catalog).expect("catalog");
        assert_eq!(file.line_col(label.span.start).0, 3);
    }

    #[test]
    fn yaml_flow_style_that_is_not_json_is_read_as_yaml() {
        let (data, diagnostics) = load_both(
            "{providers: [], models: []}",
            "{tenants: []}",
            Reading::JsonFast,
        );
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        assert!(data.expect("data").located);
    }

    #[test]
    fn compact_json_too_long_for_yaml_says_what_is_wrong_where() {
        // One line of over 256 KiB, which only the JSON reader takes: its
        // own error, at its column, and not the line's length.
        let providers: Vec<String> = (0..3000)
            .map(|n| {
                format!(
                    "{{\"id\":\"p{n}\",\"format\":\"openai\",\"base_url\":\"http://127.0.0.1:1/v1\",\
                     \"credentials\":[{{\"id\":\"p{n}-key\",\"key\":\"${{P_KEY}}\"}}]}}"
                )
            })
            .collect();
        let mut catalog = format!("{{\"providers\":[{}],\"models\":[]}}", providers.join(","));
        // Text outside ASCII before the mistake: the caret still lands on it.
        catalog = catalog.replacen(
            "\"id\":\"p0\"",
            "\"id\":\"p0\",\"name\":\"Zürich-Zentrum\"",
            1,
        );
        let typo = catalog.rfind("\"format\"").expect("a provider");
        catalog.replace_range(typo..typo + 8, "\"formatt\"");
        assert!(catalog.len() > MAX_LINE_BYTES);
        let (_, diagnostics) = load_both(&catalog, "{\"tenants\":[]}", Reading::JsonFast);
        let [diagnostic] = diagnostics.as_slice() else {
            panic!("{diagnostics:?}")
        };
        assert_eq!(diagnostic.code.id, codes::DATA_UNKNOWN_FIELD.id);
        assert!(
            diagnostic.message.contains("`formatt`"),
            "{}",
            diagnostic.message
        );
        let label = diagnostic.primary.as_ref().expect("located");
        // At the field name's closing quote, where the JSON reader stopped.
        assert_eq!(label.span.start, typo + "\"formatt\"".len() - 1);
    }
}
