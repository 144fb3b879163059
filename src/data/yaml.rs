//! The data files exactly as written: closed serde structures whose every
//! value keeps its line and column. Validation in `catalog` and `tenants`
//! turns them into the typed model the checker and evaluator use.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

/// A mapping whose keys keep their positions, in file order.
#[derive(Debug, Clone)]
pub struct SpannedMap<V>(pub Vec<(Spanned<String>, V)>);

impl<V> Default for SpannedMap<V> {
    fn default() -> Self {
        SpannedMap(Vec::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for SpannedMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = SpannedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut entries: Vec<(Spanned<String>, V)> = Vec::new();
                // The YAML reader refuses a repeated key itself; JSON's
                // would keep both, and one of them would be read silently.
                let mut keys = std::collections::HashSet::new();
                while let Some((key, value)) = access.next_entry::<Spanned<String>, V>()? {
                    if !keys.insert(key.value.clone()) {
                        return Err(de::Error::custom(format_args!(
                            "duplicate mapping key: {}",
                            key.value
                        )));
                    }
                    entries.push((key, value));
                }
                Ok(SpannedMap(entries))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(SpannedMap(Vec::new()))
            }
        }
        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

/// A YAML library error read into its parts: the message without the
/// " at line N, column M" the library appends (callers show the position
/// themselves), and for an unknown field, the field and those allowed there.
pub struct YamlError {
    pub message: String,
    pub unknown_field: Option<UnknownField>,
}

pub struct UnknownField {
    pub field: String,
    pub allowed: Vec<String>,
}

impl YamlError {
    pub fn of(error: &serde_saphyr::Error) -> YamlError {
        YamlError::of_text(&error.without_snippet().to_string())
    }

    /// A reader's error message (YAML's or JSON's: both end in where).
    pub fn of_text(plain: &str) -> YamlError {
        // What follows the position is the library's; the position itself
        // is shown by the caller, and for an alias where it was used too.
        let message = without_trailing_position(plain);
        let message = message
            .strip_suffix(')')
            .and_then(|rest| rest.rsplit_once(" (used"))
            .filter(|(_, used)| is_position(used.trim_start_matches(" at line ")))
            .map_or(message, |(before, _)| before);
        YamlError {
            unknown_field: UnknownField::of(message),
            message: for_writers(message),
        }
    }
}

/// A problem in a file a command reads: where, when known (line and
/// column, from 1), and what. Shown as `FILE:LINE:COL: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProblem {
    pub file: String,
    pub place: Option<(usize, usize)>,
    pub message: String,
}

/// Where `spanned` begins in its file: line and column, from 1.
pub(crate) fn place_of<T>(spanned: &Spanned<T>) -> Option<(usize, usize)> {
    let whole = |n: u64| usize::try_from(n).ok();
    Some((
        whole(spanned.referenced.line())?,
        whole(spanned.referenced.column())?,
    ))
}

impl FileProblem {
    pub fn at(file: &str, place: Option<(usize, usize)>, message: impl fmt::Display) -> Self {
        FileProblem {
            file: file.to_string(),
            place,
            message: message.to_string(),
        }
    }
}

/// So that callers can pass it on as any error (`?` into `Box<dyn Error>`,
/// `io::Error::other`), as the sim's documented example does.
impl std::error::Error for FileProblem {}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.place {
            Some((line, column)) => write!(f, "{}:{line}:{column}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

fn whole(number: u64) -> usize {
    usize::try_from(number).unwrap_or(usize::MAX)
}

/// What a tab in a line's indentation is called.
pub const TAB_IN_INDENTATION: &str = "a tab in the indentation; YAML indents with spaces only";

/// For an error about a tab, the line and column (from 1) of the tab in
/// `text`: the reader names the scalar it was reading when it met the tab,
/// which may begin lines before, so the tab is the first in a line's
/// indentation from there. Blank and comment lines may hold tabs.
pub fn tab_place(error: &serde_saphyr::Error, text: &str) -> Option<(usize, usize)> {
    let message = error.without_snippet().to_string();
    if !(message.contains("found a tab") || message.contains("tabs disallowed")) {
        return None;
    }
    let from = error.location().map(|location| whole(location.line()))?;
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find_map(|(index, line)| {
            let content = line.trim_start_matches([' ', '\t']);
            if content.is_empty() || content.starts_with('#') {
                return None;
            }
            let indentation = line.get(..line.len() - content.len())?;
            indentation.find('\t').map(|at| (index + 1, at + 1))
        })
}

/// A YAML or schema error in `text`; an unknown field gets a suggestion or
/// the list of fields allowed where it is.
pub fn yaml_error(file: &str, text: &str, error: &serde_saphyr::Error) -> FileProblem {
    let read = YamlError::of(error);
    let message = match &read.unknown_field {
        Some(unknown) => match unknown.suggestion() {
            Some(close) => format!(
                "`{}` is not a field here; did you mean `{close}`?",
                unknown.field
            ),
            None => format!(
                "`{}` is not a field here; the fields are {}",
                unknown.field,
                unknown
                    .allowed
                    .iter()
                    .map(|name| format!("`{name}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        None => read.message,
    };
    let place = error
        .location()
        .filter(|location| location.line() > 0)
        .map(|location| (whole(location.line()), whole(location.column())));
    if let Some(tab) = tab_place(error, text) {
        return FileProblem::at(file, Some(tab), TAB_IN_INDENTATION);
    }
    // The library quotes what it read (a field's name, a duplicate key):
    // a key pasted there is masked, as every diagnostic masks it.
    FileProblem::at(file, place, crate::diagnostics::redact::redact(&message))
}

/// serde's "invalid type: sequence, expected a number" as "expected a
/// number, found a list".
fn invalid_type_for_writers(message: &str) -> Option<String> {
    let (found, expected) = message
        .strip_prefix("invalid type: ")?
        .split_once(", expected ")?;
    let found = match found {
        "sequence" => "a list",
        "map" => "a mapping",
        "unit value" | "null" => "nothing",
        other => other,
    };
    Some(format!("expected {expected}, found {found}"))
}

/// `message` without a final " at line N, column M" (YAML's) or
/// " at line N column M" (JSON's); a position inside it stays.
fn without_trailing_position(message: &str) -> &str {
    match message.rsplit_once(" at line ") {
        Some((before, position)) if is_position(position) => before,
        _ => message,
    }
}

/// `N, column M` or `N column M`.
fn is_position(text: &str) -> bool {
    let number = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    text.split_once(", column ")
        .or_else(|| text.split_once(" column "))
        .is_some_and(|(line, column)| number(line) && number(column))
}

/// The YAML library's message as someone writing the file needs it: what
/// was expected in their terms, without the advice the library gives to
/// the Rust code calling it ("use Option<String>", "set
/// DuplicateKeyPolicy in Options").
fn for_writers(message: &str) -> String {
    let message = [", set DuplicateKeyPolicy", "; use "]
        .iter()
        .fold(message, |message, advice| {
            message
                .split_once(advice)
                .map_or(message, |(before, _)| before)
        });
    let plain = match message {
        "expected mapping start" => "expected a mapping (`name: value` entries)",
        "expected sequence start" => "expected a list (`[a, b]`, or `- a` lines)",
        "multiple YAML documents detected" => {
            "the file holds more than one YAML document; remove the `---` that starts the next"
        }
        "cannot deserialize null into string" => "expected a string, found nothing",
        "expected string scalar" => "expected a single value, found a list or a mapping",
        // The budget's depth, or the reader's own limit before it.
        message
            if message == "recursion limit exceeded"
                || message.starts_with("budget breached: Depth") =>
        {
            "the file nests mappings and lists deeper than a data file may (64 levels)"
        }
        message if message.starts_with("budget breached") => {
            "the file's aliases expand to more than a data file may hold; write the repeated values out"
        }
        message if message.starts_with("invalid boolean") => "expected `true` or `false`",
        message if message.starts_with("invalid floating point") => "expected a number",
        message
            if message
                .strip_prefix("invalid i")
                .is_some_and(|bits| bits.parse::<u8>().is_ok()) =>
        {
            "expected a whole number"
        }
        message if message.starts_with("invalid type: ") => {
            return invalid_type_for_writers(message).unwrap_or_else(|| message.to_string());
        }
        message => {
            // The reader says the same of a negative number and of one too
            // large for the field: the message gives the range.
            let unsigned_bits = message
                .strip_prefix("invalid u")
                .and_then(|bits| bits.parse::<u32>().ok())
                .filter(|bits| (1..=64).contains(bits));
            if let Some(bits) = unsigned_bits {
                let largest = u64::MAX >> (64 - bits);
                return format!("expected a whole number from 0 to {largest}");
            }
            message
        }
    };
    lowercase_first(plain)
}

impl UnknownField {
    /// Reads serde's "unknown field `x`, expected one of `a`, `b`" (or
    /// "expected `a`" when only one field is allowed).
    fn of(message: &str) -> Option<UnknownField> {
        let rest = message.strip_prefix("unknown field `")?;
        let (field, rest) = rest.split_once('`')?;
        let allowed = match rest.split_once("expected one of ") {
            Some((_, list)) => list
                .split(',')
                .map(|name| name.trim().trim_matches('`').to_string())
                .filter(|name| !name.is_empty())
                .collect(),
            None => rest
                .split_once("expected `")
                .and_then(|(_, rest)| rest.split('`').next())
                .map(|name| vec![name.to_string()])
                .unwrap_or_default(),
        };
        Some(UnknownField {
            field: field.to_string(),
            allowed,
        })
    }

    /// The allowed field closest to the one written, if one is close.
    pub fn suggestion(&self) -> Option<&str> {
        crate::diagnostics::suggest(&self.field, self.allowed.iter().map(String::as_str))
    }
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_lowercase().chain(chars).collect()
    })
}

/// Any YAML value, for attributes whose type the schema decides.
#[derive(Debug, Clone)]
pub enum RawValue {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    List(Vec<Spanned<RawValue>>),
    Map,
}

impl RawValue {
    pub fn kind(&self) -> &'static str {
        match self {
            RawValue::Null => "nothing",
            RawValue::Bool(_) => "a boolean",
            RawValue::Number(n) if !n.is_finite() => "a number that is not finite (`.nan`, `.inf`)",
            RawValue::Number(_) => "a number",
            RawValue::String(_) => "a string",
            RawValue::List(_) => "a list",
            RawValue::Map => "a mapping",
        }
    }
}

impl<'de> Deserialize<'de> for RawValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = RawValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<RawValue, E> {
                Ok(RawValue::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<RawValue, E> {
                Ok(RawValue::Number(v as f64))
            }
            fn visit_u64<E>(self, v: u64) -> Result<RawValue, E> {
                Ok(RawValue::Number(v as f64))
            }
            fn visit_f64<E>(self, v: f64) -> Result<RawValue, E> {
                Ok(RawValue::Number(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<RawValue, E> {
                Ok(RawValue::String(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<RawValue, E> {
                Ok(RawValue::Null)
            }
            fn visit_none<E>(self) -> Result<RawValue, E> {
                Ok(RawValue::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<RawValue, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = access.next_element()? {
                    items.push(item);
                }
                Ok(RawValue::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<RawValue, A::Error> {
                while access
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(RawValue::Map)
            }
        }
        deserializer.deserialize_any(ValueVisitor)
    }
}

/// An attribute declaration: `region: string` or
/// `managed: {type: bool, default: true}`.
#[derive(Debug, Clone)]
pub struct RawAttrSpec {
    pub ty: Spanned<String>,
    pub default: Option<Spanned<RawValue>>,
    pub required: bool,
}

impl<'de> Deserialize<'de> for RawAttrSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpecVisitor;
        impl<'de> Visitor<'de> for SpecVisitor {
            type Value = RawAttrSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a type such as `string`, or a mapping with `type`, `default` and `required`",
                )
            }
            fn visit_str<E>(self, v: &str) -> Result<RawAttrSpec, E> {
                Ok(RawAttrSpec {
                    ty: Spanned::new(
                        v.to_string(),
                        serde_saphyr::Location::UNKNOWN,
                        serde_saphyr::Location::UNKNOWN,
                    ),
                    default: None,
                    required: false,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<RawAttrSpec, A::Error> {
                let mut ty = None;
                let mut default = None;
                let mut required = false;
                while let Some(key) = access.next_key::<String>()? {
                    match key.as_str() {
                        "type" => ty = Some(access.next_value::<Spanned<String>>()?),
                        "default" => default = Some(access.next_value::<Spanned<RawValue>>()?),
                        "required" => required = access.next_value::<bool>()?,
                        other => {
                            return Err(de::Error::unknown_field(
                                other,
                                &["type", "default", "required"],
                            ));
                        }
                    }
                }
                let ty = ty.ok_or_else(|| de::Error::missing_field("type"))?;
                Ok(RawAttrSpec {
                    ty,
                    default,
                    required,
                })
            }
        }
        deserializer.deserialize_any(SpecVisitor)
    }
}

/// Attribute declarations per kind of entry.
pub type AttrSpecs = SpannedMap<Spanned<RawAttrSpec>>;
/// Attribute values of one entry.
pub type AttrValues = SpannedMap<Spanned<RawValue>>;

// ------------------------------------------------------------------ catalog

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCatalog {
    #[serde(default)]
    pub enums: SpannedMap<Vec<Spanned<String>>>,
    #[serde(default)]
    pub attributes: RawCatalogSchema,
    #[serde(default)]
    pub deployment: AttrValues,
    /// Required, as the tenants file's `tenants` are: a catalog cut off
    /// before its models (written half, providers first) would otherwise be
    /// served and answer every request `unknown model`.
    pub providers: Vec<Spanned<RawProvider>>,
    pub models: Vec<Spanned<RawModel>>,
    #[serde(default)]
    pub aliases: SpannedMap<Spanned<RawValue>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCatalogSchema {
    #[serde(default)]
    pub provider: AttrSpecs,
    #[serde(default)]
    pub route: AttrSpecs,
    #[serde(default)]
    pub model: AttrSpecs,
    #[serde(default)]
    pub credential: AttrSpecs,
    #[serde(default)]
    pub deployment: AttrSpecs,
}

/// A number written as one: `7`, not `"7"`. YAML's typed reading takes a
/// quoted number too, where a declared `number` attribute and a JSON data
/// file refuse it; read through this, the catalog's own numbers agree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plain<T>(pub T);

/// What a [`Plain`] number may be.
pub trait PlainNumber: Sized {
    /// As the error says it: "expected {EXPECTED}".
    const EXPECTED: &'static str;
    fn from_u64(n: u64) -> Option<Self>;
    fn from_i64(n: i64) -> Option<Self>;
    fn from_f64(n: f64) -> Option<Self>;
}

impl PlainNumber for f64 {
    const EXPECTED: &'static str = "a number";
    fn from_u64(n: u64) -> Option<f64> {
        Some(n as f64)
    }
    fn from_i64(n: i64) -> Option<f64> {
        Some(n as f64)
    }
    fn from_f64(n: f64) -> Option<f64> {
        Some(n)
    }
}

impl PlainNumber for u32 {
    const EXPECTED: &'static str = "a whole number from 0 to 4294967295";
    fn from_u64(n: u64) -> Option<u32> {
        u32::try_from(n).ok()
    }
    fn from_i64(n: i64) -> Option<u32> {
        u32::try_from(n).ok()
    }
    fn from_f64(_: f64) -> Option<u32> {
        None
    }
}

impl<'de, T: PlainNumber> serde::Deserialize<'de> for Plain<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<T>(std::marker::PhantomData<T>);
        impl<T: PlainNumber> Visitor<T> {
            fn or_fail<E: de::Error>(
                n: Option<T>,
                written: impl fmt::Display,
            ) -> Result<Plain<T>, E> {
                n.map(Plain)
                    .ok_or_else(|| E::custom(format!("expected {}, found {written}", T::EXPECTED)))
            }
        }
        impl<T: PlainNumber> de::Visitor<'_> for Visitor<T> {
            type Value = Plain<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(T::EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Plain<T>, E> {
                Self::or_fail(T::from_u64(n), n)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Plain<T>, E> {
                Self::or_fail(T::from_i64(n), n)
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Plain<T>, E> {
                // `{:?}` shows `4.0` as written, not `4`.
                Self::or_fail(T::from_f64(n), format_args!("{n:?}"))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Plain<T>, E> {
                let advice = if text.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                    "; write a number without quotes"
                } else {
                    ""
                };
                Err(E::custom(format!(
                    "expected {}, found the text \"{text}\"{advice}",
                    T::EXPECTED
                )))
            }
        }
        deserializer.deserialize_any(Visitor(std::marker::PhantomData))
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProvider {
    pub id: Spanned<String>,
    pub name: Option<Spanned<String>>,
    #[serde(default)]
    pub aliases: Vec<Spanned<String>>,
    pub format: Spanned<String>,
    pub endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    pub base_url: Spanned<String>,
    pub priority: Option<Spanned<Plain<f64>>>,
    pub listed: Option<Spanned<String>>,
    pub capacity: Option<Spanned<RawCapacity>>,
    #[serde(default)]
    pub credentials: Vec<Spanned<RawCredential>>,
    #[serde(default)]
    pub attributes: AttrValues,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCapacity {
    pub concurrent: Option<Spanned<Plain<u32>>>,
    pub requests: Option<Spanned<Plain<u32>>>,
    pub window: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    pub id: Spanned<String>,
    pub key: Spanned<String>,
    pub tenant: Option<Spanned<String>>,
    #[serde(default)]
    pub attributes: AttrValues,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub id: Spanned<String>,
    pub kind: Spanned<String>,
    #[serde(default)]
    pub aliases: Vec<Spanned<String>>,
    #[serde(default)]
    pub attributes: AttrValues,
    #[serde(default)]
    pub routes: Vec<Spanned<RawRoute>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub provider: Spanned<String>,
    pub upstream: Option<Spanned<String>>,
    pub price: Option<Spanned<RawPrice>>,
    #[serde(default)]
    pub capabilities: Vec<Spanned<String>>,
    #[serde(default)]
    pub attributes: AttrValues,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    pub input: Option<Spanned<Plain<f64>>>,
    pub output: Option<Spanned<Plain<f64>>>,
    pub cache_read: Option<Spanned<Plain<f64>>>,
    pub cache_write: Option<Spanned<Plain<f64>>>,
}

// ------------------------------------------------------------------ tenants

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenants {
    #[serde(default)]
    pub enums: SpannedMap<Vec<Spanned<String>>>,
    #[serde(default)]
    pub attributes: RawTenantSchema,
    #[serde(default)]
    pub settings: AttrSpecs,
    /// Required: a file cut off before its tenants (written half) would
    /// otherwise turn every key away; `tenants: []` says there are none.
    pub tenants: Vec<Spanned<RawTenant>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenantSchema {
    #[serde(default)]
    pub tenant: AttrSpecs,
    #[serde(default)]
    pub workspace: AttrSpecs,
    #[serde(default)]
    pub key: AttrSpecs,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    pub id: Spanned<String>,
    #[serde(default)]
    pub attributes: AttrValues,
    #[serde(default)]
    pub settings: AttrValues,
    #[serde(default)]
    pub model_settings: SpannedMap<AttrValues>,
    #[serde(default)]
    pub workspaces: Vec<Spanned<RawWorkspace>>,
    #[serde(default)]
    pub keys: Vec<Spanned<RawKey>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkspace {
    pub id: Spanned<String>,
    #[serde(default)]
    pub attributes: AttrValues,
    #[serde(default)]
    pub settings: AttrValues,
    #[serde(default)]
    pub model_settings: SpannedMap<AttrValues>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    pub id: Spanned<String>,
    pub sha256: Spanned<String>,
    pub workspace: Option<Spanned<String>>,
    #[serde(default)]
    pub attributes: AttrValues,
    #[serde(default)]
    pub settings: AttrValues,
    #[serde(default)]
    pub model_settings: SpannedMap<AttrValues>,
}

#[cfg(test)]
mod tests {
    use super::{TAB_IN_INDENTATION, YamlError, for_writers, yaml_error};

    #[test]
    fn a_tab_in_the_indentation_is_shown_where_it_is() {
        type Entry = std::collections::BTreeMap<String, String>;
        // The reader names the scalar before the tab, on the line above.
        let text = "- name: a\n\tvalue: b\n";
        let error = serde_saphyr::from_str::<Vec<Entry>>(text).unwrap_err();
        let problem = yaml_error("f.yaml", text, &error);
        assert_eq!(problem.place, Some((2, 1)), "{problem}");
        assert_eq!(problem.message, TAB_IN_INDENTATION);
        // Tabs the reader allows (between a key and its value, on a blank
        // line, before a comment) are passed over.
        let text = "- name:\ta\n\t\n\t# note\n\tvalue: b\n";
        let error = serde_saphyr::from_str::<Vec<Entry>>(text).unwrap_err();
        let problem = yaml_error("f.yaml", text, &error);
        assert_eq!(problem.place, Some((4, 1)), "{problem}");
        assert_eq!(problem.message, TAB_IN_INDENTATION);
        // An error about something else keeps the reader's place.
        let text = "- name:\ta\n  value: [\n";
        let error = serde_saphyr::from_str::<Vec<Entry>>(text).unwrap_err();
        assert_ne!(
            yaml_error("f.yaml", text, &error).message,
            TAB_IN_INDENTATION
        );
    }

    #[test]
    fn a_catalog_number_is_a_number_as_written() {
        let read = |text: &str| {
            serde_saphyr::from_str::<super::Plain<f64>>(text)
                .map(|n| n.0)
                .map_err(|error| YamlError::of(&error).message)
        };
        assert_eq!(read("7"), Ok(7.0));
        assert_eq!(read("-0.5"), Ok(-0.5));
        assert_eq!(
            read("\"7\""),
            Err(String::from(
                "expected a number, found the text \"7\"; write a number without quotes"
            ))
        );
        assert_eq!(
            read("high"),
            Err(String::from("expected a number, found the text \"high\""))
        );
        let whole = |text: &str| {
            serde_saphyr::from_str::<super::Plain<u32>>(text)
                .map(|n| n.0)
                .map_err(|error| YamlError::of(&error).message)
        };
        assert_eq!(whole("4"), Ok(4));
        assert_eq!(
            whole("4.0"),
            Err(String::from(
                "expected a whole number from 0 to 4294967295, found 4.0"
            ))
        );
        assert_eq!(
            whole("-1"),
            Err(String::from(
                "expected a whole number from 0 to 4294967295, found -1"
            ))
        );
    }

    #[test]
    fn a_message_loses_its_trailing_position_only() {
        for (library, writer) in [
            (
                "missing field `id` at line 3, column 5",
                "missing field `id`",
            ),
            (
                "unknown variant `x` at line 1 column 20",
                "unknown variant `x`",
            ),
            // An alias: where its anchor is stays, where it was used goes.
            (
                "expected string scalar (defined at line 30, column 20) (used at line 42, column 13) at line 42, column 13",
                "expected string scalar (defined at line 30, column 20)",
            ),
            ("a name at line breaks", "a name at line breaks"),
        ] {
            assert_eq!(YamlError::of_text(library).message, writer);
        }
    }

    #[test]
    fn library_messages_read_as_what_the_writer_must_fix() {
        for (library, writer) in [
            (
                "cannot deserialize null into string; use Option<String>",
                "expected a string, found nothing",
            ),
            (
                "duplicate mapping key: tenants, set DuplicateKeyPolicy in Options if acceptable",
                "duplicate mapping key: tenants",
            ),
            (
                "invalid u32",
                "expected a whole number from 0 to 4294967295",
            ),
            (
                "invalid u64",
                "expected a whole number from 0 to 18446744073709551615",
            ),
            (
                "invalid boolean (strict mode expects true/false)",
                "expected `true` or `false`",
            ),
            ("Missing field `output`", "missing field `output`"),
            ("invalid floating point number", "expected a number"),
            ("invalid i64", "expected a whole number"),
            (
                "budget breached: RecordedAnchorEvents { recorded_anchor_events: 1000001 }",
                "the file's aliases expand to more than a data file may hold; write the repeated values out",
            ),
            (
                "recursion limit exceeded",
                "the file nests mappings and lists deeper than a data file may (64 levels)",
            ),
            (
                "budget breached: Depth { depth: 65 }",
                "the file nests mappings and lists deeper than a data file may (64 levels)",
            ),
        ] {
            assert_eq!(for_writers(library), writer);
        }
    }
}
