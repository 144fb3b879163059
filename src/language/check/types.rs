//! Types of policy expressions.

use std::fmt;
use std::sync::Arc;

/// An enumeration type: declared in data (ordered, weakest first), one of the
/// built-in ones (`request.wire`), or written inline in an input schema.
#[derive(Debug, Clone, PartialEq)]
pub struct EnumTy {
    pub name: String,
    pub members: Arc<[String]>,
    pub ordered: bool,
}

impl EnumTy {
    pub fn new(name: &str, members: &[&str], ordered: bool) -> Arc<EnumTy> {
        Arc::new(EnumTy {
            name: name.to_string(),
            members: members.iter().map(|m| m.to_string()).collect(),
            ordered,
        })
    }

    pub fn has(&self, member: &str) -> bool {
        self.members.iter().any(|m| m == member)
    }
}

/// A record: the fields of a root such as `provider` or of a nested value.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordTy {
    /// How messages name it: "provider", "route.price".
    pub name: String,
    pub fields: Vec<(String, Ty)>,
}

impl RecordTy {
    pub fn field(&self, name: &str) -> Option<&Ty> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, ty)| ty)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    Bool,
    Number,
    String,
    Duration,
    Date,
    Enum(Arc<EnumTy>),
    List(Box<Ty>),
    Record(Arc<RecordTy>),
    /// A routing candidate (`prev`, `first`, `served`, `self`).
    Candidate,
    /// The literal `null`.
    Null,
    Optional(Box<Ty>),
    /// The type of something already reported as wrong; it fits everywhere so
    /// one mistake is reported once.
    Unknown,
}

impl Ty {
    pub fn optional(self) -> Ty {
        match self {
            Ty::Optional(_) | Ty::Null | Ty::Unknown => self,
            other => Ty::Optional(Box::new(other)),
        }
    }

    pub fn is_optional(&self) -> bool {
        matches!(self, Ty::Optional(_) | Ty::Null)
    }

    /// The type without its optionality.
    pub fn required(&self) -> &Ty {
        match self {
            Ty::Optional(inner) => inner,
            other => other,
        }
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self.required(), Ty::Unknown)
    }

    /// Whether values of this type can be sorted and compared with `<`.
    pub fn is_ordered(&self) -> bool {
        match self.required() {
            Ty::Number | Ty::Duration | Ty::Date | Ty::String | Ty::Bool | Ty::Unknown => true,
            Ty::Enum(e) => e.ordered,
            _ => false,
        }
    }

    /// Whether a value of this type can be written into a header or listing.
    pub fn is_scalar(&self) -> bool {
        matches!(
            self.required(),
            Ty::Bool
                | Ty::Number
                | Ty::String
                | Ty::Duration
                | Ty::Date
                | Ty::Enum(_)
                | Ty::Unknown
                | Ty::Null
        )
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Bool => write!(f, "bool"),
            Ty::Number => write!(f, "number"),
            Ty::String => write!(f, "string"),
            Ty::Duration => write!(f, "duration"),
            Ty::Date => write!(f, "date"),
            Ty::Enum(e) => write!(f, "{}", e.name),
            Ty::List(inner) => write!(f, "list<{inner}>"),
            Ty::Record(record) => write!(f, "{}", record.name),
            Ty::Candidate => write!(f, "candidate"),
            Ty::Null => write!(f, "null"),
            Ty::Optional(inner) => write!(f, "{inner}?"),
            Ty::Unknown => write!(f, "unknown"),
        }
    }
}

/// Whether two enumeration types can be compared: the same declared type, or
/// member sets of which one contains the other (inline enums in inputs are
/// subsets of the data's enums they merge with).
pub fn enums_compatible(a: &EnumTy, b: &EnumTy) -> bool {
    if a.name == b.name && a.members == b.members {
        return true;
    }
    let a_in_b = a.members.iter().all(|m| b.has(m));
    let b_in_a = b.members.iter().all(|m| a.has(m));
    (a_in_b || b_in_a) && !(a.ordered && b.ordered)
}

/// The common type of two values that flow to the same place (both branches
/// of `if`, list items, `coalesce` arguments), or `None` when they differ.
pub fn unify(a: &Ty, b: &Ty) -> Option<Ty> {
    match (a, b) {
        (Ty::Unknown, other) | (other, Ty::Unknown) => Some(other.clone()),
        (Ty::Null, Ty::Null) => Some(Ty::Null),
        (Ty::Null, other) | (other, Ty::Null) => Some(other.clone().optional()),
        (Ty::Optional(x), Ty::Optional(y)) => unify(x, y).map(Ty::optional),
        (Ty::Optional(x), other) | (other, Ty::Optional(x)) => unify(x, other).map(Ty::optional),
        (Ty::List(x), Ty::List(y)) => unify(x, y).map(|inner| Ty::List(Box::new(inner))),
        (Ty::Enum(x), Ty::Enum(y)) => {
            if !enums_compatible(x, y) {
                return None;
            }
            // The wider of the two, preferring an ordered (declared) one.
            let x_wider = y.members.iter().all(|m| x.has(m));
            Some(if x.ordered || (x_wider && !y.ordered) {
                a.clone()
            } else {
                b.clone()
            })
        }
        // A string flowing together with an enumeration is taken as one of its
        // members; literals are checked where they are written.
        (Ty::Enum(_), Ty::String) => Some(a.clone()),
        (Ty::String, Ty::Enum(_)) => Some(b.clone()),
        (Ty::Record(x), Ty::Record(y)) if x == y => Some(a.clone()),
        _ if a == b => Some(a.clone()),
        _ => None,
    }
}

/// Whether a value of type `actual` may go where `expected` is required.
pub fn fits(actual: &Ty, expected: &Ty) -> bool {
    match (actual, expected) {
        (Ty::Unknown, _) | (_, Ty::Unknown) => true,
        (Ty::Null, Ty::Optional(_)) => true,
        (Ty::Optional(x), Ty::Optional(y)) => fits(x, y),
        (_, Ty::Optional(y)) => fits(actual, y),
        (Ty::Optional(_) | Ty::Null, _) => false,
        (Ty::List(x), Ty::List(y)) => fits(x, y),
        (Ty::Enum(x), Ty::Enum(y)) => enums_compatible(x, y),
        (Ty::Enum(_), Ty::String) => true,
        _ => actual == expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_optional_unify() {
        assert_eq!(
            unify(&Ty::Null, &Ty::Number),
            Some(Ty::Optional(Box::new(Ty::Number)))
        );
        assert_eq!(
            unify(&Ty::Number, &Ty::Number.optional()),
            Some(Ty::Number.optional())
        );
        assert_eq!(unify(&Ty::Number, &Ty::String), None);
        assert_eq!(
            unify(
                &Ty::List(Box::new(Ty::Unknown)),
                &Ty::List(Box::new(Ty::String))
            ),
            Some(Ty::List(Box::new(Ty::String)))
        );
    }

    #[test]
    fn inline_enums_fit_declared_ones_that_contain_them() {
        let declared = EnumTy::new("sort", &["default", "price", "privacy"], true);
        let inline = EnumTy::new("one of [price, privacy]", &["price", "privacy"], false);
        assert!(fits(&Ty::Enum(inline.clone()), &Ty::Enum(declared.clone())));
        assert_eq!(
            unify(&Ty::Enum(inline), &Ty::Enum(declared.clone())),
            Some(Ty::Enum(declared))
        );
    }

    #[test]
    fn optional_does_not_fit_required() {
        assert!(!fits(&Ty::Number.optional(), &Ty::Number));
        assert!(fits(&Ty::Number, &Ty::Number.optional()));
    }
}
