//! Values: what data attributes hold and what policy expressions compute.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// A member of an enumeration: its name, and its rank in the declared order
/// (weakest first) that ordered comparisons use.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EnumMember {
    pub rank: u32,
    pub name: Arc<str>,
}

#[derive(Debug, Clone, Default)]
pub enum Value {
    /// Absent: an attribute not set, an input not sent, a field a provider
    /// did not send.
    #[default]
    Null,
    Bool(bool),
    Number(f64),
    String(Arc<str>),
    /// Milliseconds.
    Duration(u64),
    /// Days since 1970-01-01.
    Date(i64),
    Enum(EnumMember),
    List(Arc<[Value]>),
    Record(Arc<[(Arc<str>, Value)]>),
}

impl Value {
    /// Whether two values are the same value of the same kind, all the way
    /// down, so a term reading one behaves exactly as it does reading the
    /// other. Stricter than `==`, which is equality as policies see it (an
    /// enumeration member equals its name's text there, and `0` equals
    /// `-0`).
    pub fn identical(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Number(a), Value::Number(b)) => a.to_bits() == b.to_bits(),
            (Value::String(a), Value::String(b)) => a == b,
            (Value::Duration(a), Value::Duration(b)) => a == b,
            (Value::Date(a), Value::Date(b)) => a == b,
            (Value::Enum(a), Value::Enum(b)) => a == b,
            (Value::List(a), Value::List(b)) => {
                a.len() == b.len() && a.iter().zip(b.iter()).all(|(a, b)| a.identical(b))
            }
            (Value::Record(a), Value::Record(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b.iter())
                        .all(|((a_name, a), (b_name, b))| a_name == b_name && a.identical(b))
            }
            _ => false,
        }
    }

    pub fn string(text: &str) -> Value {
        Value::String(Arc::from(text))
    }

    /// The value in a JSON document (a listing): durations and dates as
    /// their text, enumeration members as their names.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as Json;
        match self {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            // Whole numbers print without a fraction.
            Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e15 => Json::from(*n as i64),
            Value::Number(n) => serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number),
            Value::String(text) => Json::String(text.to_string()),
            Value::Enum(member) => Json::String(member.name.to_string()),
            Value::Duration(_) | Value::Date(_) => Json::String(self.to_string()),
            Value::List(items) => Json::Array(items.iter().map(Value::to_json).collect()),
            Value::Record(fields) => Json::Object(
                fields
                    .iter()
                    .map(|(name, value)| (name.to_string(), value.to_json()))
                    .collect(),
            ),
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_number(&self) -> Option<f64> {
        match self {
            Value::Number(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_duration(&self) -> Option<u64> {
        match self {
            Value::Duration(ms) => Some(*ms),
            _ => None,
        }
    }

    /// The text of a string or an enumeration member.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            Value::Enum(member) => Some(&member.name),
            _ => None,
        }
    }

    /// List items; an absent list is empty.
    pub fn items(&self) -> &[Value] {
        match self {
            Value::List(items) => items,
            _ => &[],
        }
    }

    pub fn field(&self, name: &str) -> &Value {
        match self {
            Value::Record(fields) => fields
                .iter()
                .find(|(field, _)| &**field == name)
                .map_or(&Value::Null, |(_, value)| value),
            _ => &Value::Null,
        }
    }

    /// Orders two present values of one type; `None` when they are not
    /// comparable (different types, or absent).
    pub fn compare(&self, other: &Value) -> Option<Ordering> {
        match (self, other) {
            (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
            (Value::Number(a), Value::Number(b)) => a.partial_cmp(b),
            (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
            (Value::Duration(a), Value::Duration(b)) => Some(a.cmp(b)),
            (Value::Date(a), Value::Date(b)) => Some(a.cmp(b)),
            (Value::Enum(a), Value::Enum(b)) => Some(a.rank.cmp(&b.rank)),
            _ => None,
        }
    }
}

impl PartialEq for Value {
    /// Equality as policies see it: an enumeration member equals the string
    /// of its name; numbers compare by value.
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Number(a), Value::Number(b)) => a == b,
            (Value::Duration(a), Value::Duration(b)) => a == b,
            (Value::Date(a), Value::Date(b)) => a == b,
            // Members read from the catalog and the request share their
            // names' text, so most equal ones are the same text.
            (Value::Enum(a), Value::Enum(b)) => Arc::ptr_eq(&a.name, &b.name) || a.name == b.name,
            (Value::String(a), Value::Enum(b)) | (Value::Enum(b), Value::String(a)) => *a == b.name,
            (Value::String(a), Value::String(b)) => a == b,
            (Value::List(a), Value::List(b)) => a == b,
            (Value::Record(a), Value::Record(b)) => {
                // Field order does not matter; absent fields equal null ones.
                let covers = |x: &[(Arc<str>, Value)], y: &Value| {
                    x.iter().all(|(name, value)| y.field(name) == value)
                };
                covers(a, other) && covers(b, self)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Value {
    /// Text for headers, listings and traces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => write!(f, "null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Number(n) => {
                if n.fract() == 0.0 && n.abs() < 1e15 {
                    write!(f, "{}", *n as i64)
                } else if n.abs() >= 1e21 {
                    // As JSON writers show it, not as 31 digits of which
                    // all but 17 are noise.
                    write!(f, "{n:e}")
                } else {
                    write!(f, "{n}")
                }
            }
            Value::String(s) => write!(f, "{s}"),
            Value::Duration(ms) => {
                if ms % 1000 == 0 {
                    write!(f, "{}s", ms / 1000)
                } else {
                    write!(f, "{ms}ms")
                }
            }
            Value::Date(days) => write!(f, "{}", crate::data::schema::format_date(*days)),
            Value::Enum(member) => write!(f, "{}", member.name),
            Value::List(items) => {
                write!(f, "[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{item}")?;
                }
                write!(f, "]")
            }
            Value::Record(fields) => {
                write!(f, "{{")?;
                for (i, (name, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{name}: {value}")?;
                }
                write!(f, "}}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(rank: u32, name: &str) -> Value {
        Value::Enum(EnumMember {
            rank,
            name: Arc::from(name),
        })
    }

    #[test]
    fn enumeration_members_compare_by_rank_and_equal_their_names() {
        assert_eq!(
            member(1, "private").compare(&member(2, "tee")),
            Some(Ordering::Less)
        );
        assert_eq!(member(1, "private"), Value::string("private"));
        assert_ne!(member(1, "private"), Value::string("tee"));
    }

    #[test]
    fn records_compare_by_fields() {
        let a = Value::Record(Arc::from(vec![(Arc::from("only"), Value::Bool(true))]));
        let b = Value::Record(Arc::from(vec![
            (Arc::from("x"), Value::Null),
            (Arc::from("only"), Value::Bool(true)),
        ]));
        assert_eq!(a, b);
    }

    #[test]
    fn numbers_print_without_needless_decimals() {
        assert_eq!(Value::Number(3.0).to_string(), "3");
        assert_eq!(Value::Number(0.5).to_string(), "0.5");
        assert_eq!(Value::Number(1e15 * 1e15).to_string(), "1e30");
        assert_eq!(Value::Number(-2.5e21).to_string(), "-2.5e21");
        assert_eq!(Value::Duration(10_000).to_string(), "10s");
    }
}
