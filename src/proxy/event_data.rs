//! What the proxy reads of a streamed event's data, read without building
//! a JSON tree: the members that classify the event and its usage. A tree
//! of every event cost some 13k instructions per event, most of it
//! allocating the content's strings, which nothing reads. Values are
//! checked in full all the same (invalid JSON is malformed), and a member
//! given twice counts by its last value, as in a tree
//! (`Event::read_by_tree` is the reference).

use super::wire::{ChoiceSet, reason_given};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use std::borrow::Cow;
use std::fmt;

/// The members of an event's data object that `Event::meaning` reads.
#[derive(Debug, Default)]
pub struct EventData {
    /// `type`, when it is a string.
    pub event_type: Option<String>,
    /// `error` is there and not null.
    pub error: bool,
    /// The choices of the `choices` list with a finish reason given.
    pub finished_choices: ChoiceSet,
    /// The choices of the `choices` list with output in their `delta` or
    /// `text`.
    pub output_choices: ChoiceSet,
    /// `delta` is an object with a `stop_reason` given.
    pub delta_stopped: bool,
    /// The usage figures of `usage`, and of the `usage` member of
    /// `message` (Anthropic), of `response` (Responses) and of `x_groq`
    /// (Groq's last chunk, when the request did not ask for usage).
    pub usage: Option<(u64, u64)>,
    pub message_usage: Option<(u64, u64)>,
    pub response_usage: Option<(u64, u64)>,
    pub groq_usage: Option<(u64, u64)>,
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
    "type", "error", "choices", "delta", "usage", "message", "response", "x_groq",
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
                Some(2) => {
                    (data.finished_choices, data.output_choices) =
                        members.next_value_seed(Choices)?;
                }
                Some(3) => {
                    data.delta_stopped =
                        members.next_value_seed(MemberTest::Reason(&["stop_reason"]))?;
                }
                Some(4) => data.usage = members.next_value_seed(UsageFigures::Here)?,
                Some(5) => {
                    data.message_usage = members.next_value_seed(UsageFigures::InUsageMember)?
                }
                Some(6) => {
                    data.response_usage = members.next_value_seed(UsageFigures::InUsageMember)?
                }
                Some(7) => {
                    data.groq_usage = members.next_value_seed(UsageFigures::InUsageMember)?
                }
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

/// Whether an object has the member `name` (a one-name list) with a
/// reason given (see `wire::reason_given`; the last one, when given
/// twice); other members are checked and skipped.
fn has_reason<'de, A: MapAccess<'de>>(
    mut members: A,
    name: &'static [&'static str],
) -> Result<bool, A::Error> {
    let mut found = false;
    while let Some(member) = members.next_key_seed(NameIn(name))? {
        if member.is_some() {
            found = reason_given(&members.next_value::<Json>()?);
        } else {
            members.next_value::<IgnoredAny>()?;
        }
    }
    Ok(found)
}

/// Reads any JSON value, answering `$value` for all but the shapes a
/// reading looks into (and those it defines itself).
macro_rules! other_values_are {
    ($type:ty, $value:expr) => {
        other_values_are!(@one visit_bool, bool, $type, $value);
        other_values_are!(@one visit_i64, i64, $type, $value);
        other_values_are!(@one visit_u64, u64, $type, $value);
        other_values_are!(@one visit_f64, f64, $type, $value);
        other_values_are!(@one visit_str, &str, $type, $value);
        fn visit_unit<E: serde::de::Error>(self) -> Result<$type, E> {
            Ok($value)
        }
    };
    (@one $name:ident, $input:ty, $type:ty, $value:expr) => {
        fn $name<E: serde::de::Error>(self, _: $input) -> Result<$type, E> {
            Ok($value)
        }
    };
}

/// Usage figures, (input, output) tokens, as `wire::usage_figures` reads
/// them from a tree: OpenAI's `prompt_tokens`/`completion_tokens`, else
/// `input_tokens`/`output_tokens`, each counted only as a whole number;
/// `None` when neither figure is there or the value is not an object.
pub enum UsageFigures {
    /// The value is the `usage` object.
    Here,
    /// The value is an object (Anthropic's message, a Responses response)
    /// whose `usage` member holds them.
    InUsageMember,
}

impl<'de> DeserializeSeed<'de> for UsageFigures {
    type Value = Option<(u64, u64)>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<(u64, u64)>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UsageFigures {
    type Value = Option<(u64, u64)>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    other_values_are!(Option<(u64, u64)>, None);

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Self::Value, A::Error> {
        const FIGURES: &[&str] = &[
            "prompt_tokens",
            "input_tokens",
            "completion_tokens",
            "output_tokens",
        ];
        if let UsageFigures::InUsageMember = self {
            let mut usage = None;
            while let Some(member) = members.next_key_seed(NameIn(&["usage"]))? {
                if member.is_some() {
                    usage = members.next_value_seed(UsageFigures::Here)?;
                } else {
                    members.next_value::<IgnoredAny>()?;
                }
            }
            return Ok(usage);
        }
        let mut figures = [None; 4];
        while let Some(member) = members.next_key_seed(NameIn(FIGURES))? {
            match member.and_then(|at| figures.get_mut(at)) {
                Some(figure) => *figure = members.next_value_seed(WholeNumber)?,
                None => {
                    members.next_value::<IgnoredAny>()?;
                }
            }
        }
        let [prompt, input, completion, output] = figures;
        let (input, output) = (prompt.or(input), completion.or(output));
        Ok(
            (input.is_some() || output.is_some())
                .then(|| (input.unwrap_or(0), output.unwrap_or(0))),
        )
    }
}

/// `choices`: of a list, the choices with a finish reason given, and
/// those with output, by their `index`.
struct Choices;

impl<'de> DeserializeSeed<'de> for Choices {
    type Value = (ChoiceSet, ChoiceSet);

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<(ChoiceSet, ChoiceSet), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choices {
    type Value = (ChoiceSet, ChoiceSet);

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    other_values_are!((ChoiceSet, ChoiceSet), Default::default());

    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut choices: A,
    ) -> Result<(ChoiceSet, ChoiceSet), A::Error> {
        let (mut finished, mut output) = (ChoiceSet::default(), ChoiceSet::default());
        let mut place: u64 = 0;
        while let Some(choice) = choices.next_element_seed(Choice { place })? {
            if let Some(choice) = choice {
                if choice.finished {
                    finished.add(choice.index);
                }
                if choice.output {
                    output.add(choice.index);
                }
            }
            place = place.saturating_add(1);
        }
        Ok((finished, output))
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut members: A,
    ) -> Result<(ChoiceSet, ChoiceSet), A::Error> {
        while members.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Default::default())
    }
}

/// What a choice says of itself.
struct ChoiceFacts {
    /// Its `index` (its place when it has none), `None` when that is not a
    /// whole number.
    index: Option<u64>,
    /// A `finish_reason` is given.
    finished: bool,
    /// Its `delta` (chat) or `text` (completions) holds output.
    output: bool,
}

/// A choice, at `place` in its list: `None` unless it is an object.
struct Choice {
    place: u64,
}

impl<'de> DeserializeSeed<'de> for Choice {
    type Value = Option<ChoiceFacts>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<ChoiceFacts>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choice {
    type Value = Option<ChoiceFacts>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    other_values_are!(Option<ChoiceFacts>, None);

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Option<ChoiceFacts>, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Option<ChoiceFacts>, A::Error> {
        let mut facts = ChoiceFacts {
            index: Some(self.place),
            finished: false,
            output: false,
        };
        let (mut delta_output, mut text_output) = (false, false);
        while let Some(member) =
            members.next_key_seed(NameIn(&["finish_reason", "index", "delta", "text"]))?
        {
            match member {
                Some(0) => facts.finished = reason_given(&members.next_value::<Json>()?),
                Some(1) => facts.index = members.next_value_seed(WholeNumber)?,
                Some(2) => delta_output = members.next_value_seed(MemberTest::Output)?,
                Some(3) => text_output = members.next_value_seed(HasOutput)?,
                _ => {
                    members.next_value::<IgnoredAny>()?;
                }
            }
        }
        facts.output = delta_output || text_output;
        Ok(Some(facts))
    }
}

/// Whether an object's members (but `skipped`) hold output, each member
/// by its last value, as in a tree.
fn members_hold_output<'de, A: MapAccess<'de>>(
    mut members: A,
    skipped: Option<&str>,
) -> Result<bool, A::Error> {
    // Members seldom repeat: those seen, with whether they hold output.
    let mut seen: Vec<(Cow<'de, str>, bool)> = Vec::new();
    while let Some(name) = members.next_key_seed(MemberName)? {
        let output = if skipped == Some(name.as_ref()) {
            members.next_value::<IgnoredAny>()?;
            false
        } else {
            members.next_value_seed(HasOutput)?
        };
        match seen.iter_mut().find(|(known, _)| *known == name) {
            Some(entry) => entry.1 = output,
            None => seen.push((name, output)),
        }
    }
    Ok(seen.iter().any(|(_, output)| *output))
}

/// An object key, borrowed from the text where it has no escapes.
struct MemberName;

impl<'de> DeserializeSeed<'de> for MemberName {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cow<'de, str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberName {
    type Value = Cow<'de, str>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, key: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(key))
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(key.to_string()))
    }
}

/// Whether a value holds output: a text that is not empty, or a list or
/// object holding one. Numbers and booleans (a tool call's `index`, a
/// token id) are not output. Checked in full, not kept
/// (`wire::has_output` is the reference).
struct HasOutput;

impl<'de> DeserializeSeed<'de> for HasOutput {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for HasOutput {
    type Value = bool;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

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

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<bool, E> {
        Ok(!text.is_empty())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<bool, A::Error> {
        let mut output = false;
        while let Some(item) = items.next_element_seed(HasOutput)? {
            output |= item;
        }
        Ok(output)
    }

    fn visit_map<A: MapAccess<'de>>(self, members: A) -> Result<bool, A::Error> {
        members_hold_output(members, None)
    }
}

/// Any value: the whole number it is, if it is one that fits in a `u64`.
struct WholeNumber;

impl<'de> DeserializeSeed<'de> for WholeNumber {
    type Value = Option<u64>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<u64>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WholeNumber {
    type Value = Option<u64>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_u64<E: serde::de::Error>(self, number: u64) -> Result<Option<u64>, E> {
        Ok(Some(number))
    }
    // Negative: serde_json reads a number that fits in a `u64` as one.
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Option<u64>, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Option<u64>, A::Error> {
        while members.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// Any value: for an object, whether its members pass the test; `false`
/// for any other value. Checked in full, not kept.
enum MemberTest {
    /// It has the member (a one-name list) with a finish or stop reason
    /// given (see `wire::reason_given`).
    Reason(&'static [&'static str]),
    /// A member other than `role` holds output (a chat choice's `delta`;
    /// see [`HasOutput`]).
    Output,
}

impl<'de> DeserializeSeed<'de> for MemberTest {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MemberTest {
    type Value = bool;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    other_values_are!(bool, false);

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<bool, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, members: A) -> Result<bool, A::Error> {
        match self {
            MemberTest::Reason(name) => has_reason(members, name),
            MemberTest::Output => members_hold_output(members, Some("role")),
        }
    }
}
