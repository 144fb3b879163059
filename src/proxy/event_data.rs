//! What the proxy reads of a streamed event's data, read without building
//! a JSON tree: the members that classify the event and its usage. A tree
//! of every event cost some 13k instructions per event, most of it
//! allocating the content's strings, which nothing reads. Values are
//! checked in full all the same (invalid JSON is malformed), and a member
//! given twice counts by its last value, as in a tree
//! (`Event::meaning_by_tree` is the reference).

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use std::fmt;

/// The members of an event's data object that `Event::meaning` reads.
#[derive(Debug, Default)]
pub struct EventData {
    /// `type`, when it is a string.
    pub event_type: Option<String>,
    /// `error` is there and not null.
    pub error: bool,
    /// `choices` is a list with a choice whose `finish_reason` is not null.
    pub finished_choice: bool,
    /// `delta` is an object whose `stop_reason` is not null.
    pub delta_stopped: bool,
    /// The values of `usage`, `message` and `response`, for the usage they
    /// report.
    pub usage: Option<Json>,
    pub message: Option<Json>,
    pub response: Option<Json>,
}

impl EventData {
    /// `None` when `text` is not a JSON object.
    pub fn read(text: &str) -> Option<EventData> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let data = deserializer.deserialize_map(EventMembers).ok()?;
        deserializer.end().ok()?;
        Some(data)
    }
}

/// The names of the members read, by position in this list.
const EVENT_MEMBERS: &[&str] = &[
    "type", "error", "choices", "delta", "usage", "message", "response",
];

struct EventMembers;

impl<'de> Visitor<'de> for EventMembers {
    type Value = EventData;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<EventData, A::Error> {
        let mut data = EventData::default();
        while let Some(member) = members.next_key_seed(NameIn(EVENT_MEMBERS))? {
            match member {
                Some(0) => {
                    data.event_type = match members.next_value::<Json>()? {
                        Json::String(text) => Some(text),
                        _ => None,
                    };
                }
                Some(1) => data.error = !members.next_value::<Json>()?.is_null(),
                Some(2) => data.finished_choice = members.next_value_seed(Choices)?,
                Some(3) => {
                    data.delta_stopped =
                        members.next_value_seed(NonNullMember(&["stop_reason"]))?;
                }
                Some(4) => data.usage = Some(members.next_value()?),
                Some(5) => data.message = Some(members.next_value()?),
                Some(6) => data.response = Some(members.next_value()?),
                _ => {
                    members.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(data)
    }
}

/// An object key: its position in the list, if it is one of the names;
/// compared as read, without copying it.
pub struct NameIn(pub &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for NameIn {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for NameIn {
    type Value = Option<usize>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|name| *name == key))
    }
}

/// Whether an object has the member `name` (a one-name list) with a value
/// that is not null (the last one, when given twice); other members are
/// checked and skipped.
fn has_non_null<'de, A: MapAccess<'de>>(
    mut members: A,
    name: &'static [&'static str],
) -> Result<bool, A::Error> {
    let mut found = false;
    while let Some(member) = members.next_key_seed(NameIn(name))? {
        if member.is_some() {
            found = !members.next_value::<Json>()?.is_null();
        } else {
            members.next_value::<IgnoredAny>()?;
        }
    }
    Ok(found)
}

/// Reads any JSON value, answering `false` for all but the shapes a
/// reading looks into.
macro_rules! other_values_are_false {
    () => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
    };
}

/// `choices`: a list with a choice whose `finish_reason` is not null.
struct Choices;

impl<'de> DeserializeSeed<'de> for Choices {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choices {
    type Value = bool;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    other_values_are_false!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut choices: A) -> Result<bool, A::Error> {
        let mut finished = false;
        while let Some(reason) = choices.next_element_seed(NonNullMember(&["finish_reason"]))? {
            finished |= reason;
        }
        Ok(finished)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<bool, A::Error> {
        while members.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// Any value: `true` when it is an object with the member (a one-name
/// list) not null.
struct NonNullMember(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for NonNullMember {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NonNullMember {
    type Value = bool;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    other_values_are_false!();

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<bool, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, members: A) -> Result<bool, A::Error> {
        has_non_null(members, self.0)
    }
}
