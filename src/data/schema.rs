//! Attribute schemas: the declared, typed fields that data files carry and
//! that policies reference by name (`provider.region`, `key.residency`).

use crate::source::Span;
use crate::value::Value;
use std::sync::Arc;

/// An enumeration declared in a data file, such as privacy tiers. Members are
/// ordered as declared, weakest first, so `route.tier >= "private"` works.
#[derive(Debug, Clone, PartialEq)]
pub struct EnumDef {
    pub name: String,
    pub members: Vec<String>,
}

impl EnumDef {
    pub fn index_of(&self, member: &str) -> Option<usize> {
        self.members.iter().position(|m| m == member)
    }
}

/// Index into [`Schema::enums`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnumId(pub usize);

/// The type of a data attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrType {
    Bool,
    Number,
    String,
    Duration,
    Date,
    Enum(EnumId),
    /// A provider name or alias from the catalog.
    Provider,
    /// A model id from the catalog.
    Model,
    List(Box<AttrType>),
}

/// Deepest `list<list<…>>` a schema may declare: values, their checks and
/// the policy's types all nest as deep.
pub const MAX_LIST_NESTING: usize = 8;

impl AttrType {
    /// Parses a type as written in a schema: `string`, `list<provider>`, `tier`.
    /// Lists nest at most [`MAX_LIST_NESTING`] deep.
    pub fn parse(text: &str, enums: &[EnumDef]) -> Option<AttrType> {
        let mut text = text.trim();
        let mut lists = 0;
        while let Some(inner) = text
            .strip_prefix("list<")
            .and_then(|rest| rest.strip_suffix('>'))
        {
            lists += 1;
            if lists > MAX_LIST_NESTING {
                return None;
            }
            text = inner.trim();
        }
        let mut ty = AttrType::element(text, enums)?;
        for _ in 0..lists {
            ty = AttrType::List(Box::new(ty));
        }
        Some(ty)
    }

    fn element(text: &str, enums: &[EnumDef]) -> Option<AttrType> {
        Some(match text {
            "bool" => AttrType::Bool,
            "number" => AttrType::Number,
            "string" => AttrType::String,
            "duration" => AttrType::Duration,
            "date" => AttrType::Date,
            "provider" => AttrType::Provider,
            "model" => AttrType::Model,
            other => AttrType::Enum(EnumId(enums.iter().position(|e| e.name == other)?)),
        })
    }

    /// Type names a schema may use, for "did you mean" suggestions.
    pub fn builtin_names() -> &'static [&'static str] {
        &[
            "bool",
            "number",
            "string",
            "duration",
            "date",
            "provider",
            "model",
            "list<string>",
        ]
    }

    pub fn describe(&self, enums: &[EnumDef]) -> String {
        match self {
            AttrType::Bool => "bool".into(),
            AttrType::Number => "number".into(),
            AttrType::String => "string".into(),
            AttrType::Duration => "duration".into(),
            AttrType::Date => "date".into(),
            AttrType::Provider => "provider".into(),
            AttrType::Model => "model".into(),
            AttrType::Enum(id) => enums
                .get(id.0)
                .map_or_else(|| "enum".into(), |e| e.name.clone()),
            AttrType::List(inner) => format!("list<{}>", inner.describe(enums)),
        }
    }
}

/// One declared attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct AttrDecl {
    pub name: String,
    pub ty: AttrType,
    /// The value an entry that omits the attribute gets. Booleans default to
    /// `false` and lists to empty; other types without a default are absent.
    pub default: Option<Value>,
    /// Every entry must set it.
    pub required: bool,
    pub span: Span,
}

impl AttrDecl {
    /// Whether every entry has a value for this attribute.
    pub fn always_present(&self) -> bool {
        self.required
            || self.default.is_some()
            || matches!(self.ty, AttrType::Bool | AttrType::List(_))
    }

    /// The value for an entry that does not set the attribute.
    pub fn fallback(&self) -> Option<Value> {
        self.default.clone().or(match self.ty {
            AttrType::Bool => Some(Value::Bool(false)),
            AttrType::List(_) => Some(Value::List(Arc::from(Vec::new()))),
            _ => None,
        })
    }
}

/// The attributes declared for one kind of entry.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttrTable {
    /// Shared: validation holds a table while it reports through the
    /// validator, once per entry of a catalog that may have 10,000.
    pub entries: Arc<Vec<AttrDecl>>,
}

impl AttrTable {
    pub fn get(&self, name: &str) -> Option<&AttrDecl> {
        self.entries.iter().find(|entry| entry.name == name)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|entry| entry.name == name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|entry| entry.name.as_str())
    }
}

/// Every kind of entry that carries declared attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subject {
    Provider,
    Route,
    Model,
    Credential,
    Deployment,
    Tenant,
    Workspace,
    Key,
    Setting,
}

impl Subject {
    pub fn name(self) -> &'static str {
        match self {
            Subject::Provider => "provider",
            Subject::Route => "route",
            Subject::Model => "model",
            Subject::Credential => "credential",
            Subject::Deployment => "deployment",
            Subject::Tenant => "tenant",
            Subject::Workspace => "workspace",
            Subject::Key => "key",
            Subject::Setting => "setting",
        }
    }
}

/// All declared types and attributes of a catalog and its tenants.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schema {
    pub enums: Vec<EnumDef>,
    pub provider: AttrTable,
    pub route: AttrTable,
    pub model: AttrTable,
    pub credential: AttrTable,
    pub deployment: AttrTable,
    pub tenant: AttrTable,
    pub workspace: AttrTable,
    pub key: AttrTable,
    /// Layered defaults (`defaults.x` in policies).
    pub settings: AttrTable,
    /// Attributes whose declaration was refused (a type that does not
    /// exist): a policy reading one gets no error of its own, as the data's
    /// error already says what to fix.
    pub refused: Vec<(Subject, String)>,
}

impl Schema {
    pub fn table(&self, subject: Subject) -> &AttrTable {
        match subject {
            Subject::Provider => &self.provider,
            Subject::Route => &self.route,
            Subject::Model => &self.model,
            Subject::Credential => &self.credential,
            Subject::Deployment => &self.deployment,
            Subject::Tenant => &self.tenant,
            Subject::Workspace => &self.workspace,
            Subject::Key => &self.key,
            Subject::Setting => &self.settings,
        }
    }

    pub fn table_mut(&mut self, subject: Subject) -> &mut AttrTable {
        match subject {
            Subject::Provider => &mut self.provider,
            Subject::Route => &mut self.route,
            Subject::Model => &mut self.model,
            Subject::Credential => &mut self.credential,
            Subject::Deployment => &mut self.deployment,
            Subject::Tenant => &mut self.tenant,
            Subject::Workspace => &mut self.workspace,
            Subject::Key => &mut self.key,
            Subject::Setting => &mut self.settings,
        }
    }

    pub fn enum_def(&self, id: EnumId) -> Option<&EnumDef> {
        self.enums.get(id.0)
    }

    pub fn enum_by_name(&self, name: &str) -> Option<EnumId> {
        self.enums.iter().position(|e| e.name == name).map(EnumId)
    }
}

/// Parses `YYYY-MM-DD` into days since 1970-01-01.
pub fn parse_date(text: &str) -> Option<i64> {
    let mut parts = text.split('-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: i64 = parts.next()?.parse().ok()?;
    let day: i64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || !(1..=12).contains(&month) || !(1000..=9999).contains(&year) {
        return None;
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let days_in_month = *month_days.get(usize::try_from(month - 1).ok()?)?;
    if !(1..=days_in_month).contains(&day) {
        return None;
    }
    // Days from civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    Some(era * 146_097 + day_of_era - 719_468)
}

/// Formats days since 1970-01-01 as `YYYY-MM-DD`.
pub fn format_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// The longest duration anything accepts, in milliseconds: a year. It
/// bounds every timeout and pause a policy or data file can set, and what a
/// provider's `Retry-After` asks for.
pub const MAX_DURATION_MS: u64 = 31_536_000_000;

/// The milliseconds `text` writes as a number and a unit, whatever their
/// range.
fn written_millis(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    Some(value * scale)
}

/// Parses a duration as data files write it: `250ms`, `10s`, `5m`, `1h`, `1d`.
pub fn parse_duration(text: &str) -> Option<u64> {
    let millis = written_millis(text)?;
    (millis.is_finite()
        && millis >= 0.0
        && millis.fract() == 0.0
        && millis <= MAX_DURATION_MS as f64)
        .then_some(millis as u64)
}

/// A duration as data files write it, in the largest unit that holds it
/// whole: `31s`, `1500ms`, `2h`.
pub fn duration_text(ms: u64) -> String {
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (size, unit) in units {
        if ms > 0 && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Why `text` is not a duration [`parse_duration`] takes, to follow its
/// quote in a message: too long, not whole milliseconds, or not one at all.
pub fn why_not_a_duration(text: &str) -> &'static str {
    match written_millis(text) {
        Some(millis) if millis > MAX_DURATION_MS as f64 => {
            "is longer than a year, the longest duration"
        }
        Some(millis) if millis >= 0.0 && millis.fract() != 0.0 => {
            "is not a whole number of milliseconds"
        }
        _ => "is not a duration; write it like `250ms`, `2s`, `5m`, `1h` or `1d`",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_is_written_in_the_largest_unit_that_holds_it_whole() {
        for (ms, text) in [
            (31_000, "31s"),
            (1_500, "1500ms"),
            (7_200_000, "2h"),
            (90_000, "90s"),
            (0, "0ms"),
        ] {
            assert_eq!(duration_text(ms), text);
            assert_eq!(parse_duration(text), Some(ms));
        }
    }

    #[test]
    fn a_duration_that_is_refused_says_why() {
        assert_eq!(parse_duration("365d"), Some(31_536_000_000));
        assert_eq!(parse_duration("366d"), None);
        assert_eq!(
            why_not_a_duration("366d"),
            "is longer than a year, the longest duration"
        );
        assert_eq!(
            why_not_a_duration("1.5ms"),
            "is not a whole number of milliseconds"
        );
        for text in ["20", "2x", "-1s", "s", ""] {
            assert!(
                why_not_a_duration(text).starts_with("is not a duration"),
                "{text}"
            );
        }
    }

    #[test]
    fn types_parse_with_enums_and_lists() {
        let enums = vec![EnumDef {
            name: "tier".into(),
            members: vec!["low".into(), "high".into()],
        }];
        assert_eq!(
            AttrType::parse("list<provider>", &enums),
            Some(AttrType::List(Box::new(AttrType::Provider)))
        );
        assert_eq!(
            AttrType::parse("tier", &enums),
            Some(AttrType::Enum(EnumId(0)))
        );
        assert_eq!(AttrType::parse("lsit<string>", &enums), None);
    }

    #[test]
    fn dates_round_trip() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(
            parse_date("2024-02-29").map(format_date).as_deref(),
            Some("2024-02-29")
        );
        assert_eq!(parse_date("2023-02-29"), None);
        assert_eq!(parse_date("2024-13-01"), None);
        assert!(parse_date("2024-03-01") > parse_date("2024-02-29"));
    }

    #[test]
    fn durations_parse_in_whole_milliseconds() {
        assert_eq!(parse_duration("10s"), Some(10_000));
        assert_eq!(parse_duration("1.5m"), Some(90_000));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("-1s"), None);
    }
}
