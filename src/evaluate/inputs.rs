//! Reading the request's routing inputs: declared body fields and headers,
//! checked against their types. A value of the wrong shape gets the input's
//! `malformed` error; an unknown field of an object or a number out of its
//! range, its `invalid` error; a provider or model name the catalog does not
//! know, its `unknown` error.

use crate::compile::{ModelName, Snapshot};
use crate::data::schema::parse_duration;
use crate::language::ir::{ErrorRef, InputSourceKind, InputSpec, InputType};
use crate::value::{EnumMember, Value};
use serde_json::Value as Json;
use std::sync::Arc;

/// Why an input was refused: the error to answer with, and what was wrong
/// (for the trace).
#[derive(Debug, Clone, PartialEq)]
pub struct InputProblem {
    pub error: ErrorRef,
    pub detail: String,
}

enum Problem {
    Malformed(String),
    Invalid(String),
    Unknown(String),
}

impl Problem {
    /// The same problem, said of an object's field.
    fn in_field(self, name: &str) -> Problem {
        match self {
            Problem::Malformed(detail) => Problem::Malformed(format!("`{name}`: {detail}")),
            Problem::Invalid(detail) => Problem::Invalid(format!("`{name}`: {detail}")),
            Problem::Unknown(detail) => Problem::Unknown(format!("`{name}`: {detail}")),
        }
    }
}

/// A raw input: a JSON body field, or a header's text.
pub enum Raw<'a> {
    Json(&'a Json),
    Text(&'a str),
}

/// Parses one input's raw value (or `None` when the request does not carry
/// it). A body field sent as `null` is absent, as it is within an object.
pub fn parse_input(
    snapshot: &Snapshot,
    spec: &InputSpec,
    raw: Option<Raw<'_>>,
    expand_shorthand: &mut dyn FnMut(&InputSpec, Value) -> Value,
) -> Result<Value, InputProblem> {
    let raw = match raw {
        None | Some(Raw::Json(Json::Null)) => return Ok(Value::Null),
        Some(raw) => raw,
    };
    let problem = |problem: Problem| {
        let (error, detail) = match problem {
            Problem::Malformed(detail) => (spec.malformed, detail),
            Problem::Invalid(detail) => (spec.invalid, detail),
            Problem::Unknown(detail) => (spec.unknown, detail),
        };
        InputProblem {
            error,
            detail: format!("`{}`: {detail}", spec.name),
        }
    };
    // A header holding a structured input carries it as JSON, or, for one
    // with a shorthand, the shorthand's plain value (`x-provider: beta`).
    let parsed_json;
    let raw = match (raw, spec.source, &spec.ty) {
        (Raw::Text(text), InputSourceKind::Header, InputType::Object(_) | InputType::List(_)) => {
            match serde_json::from_str::<Json>(text) {
                Ok(json)
                    if spec.shorthand.is_none()
                        || json.is_object()
                        || json.is_array()
                        || json.is_string() =>
                {
                    parsed_json = json;
                    Raw::Json(&parsed_json)
                }
                // The shorthand's plain value, also when it reads as a JSON
                // number, boolean or null (`1`, `2024`, `null`).
                _ if spec.shorthand.is_some() => Raw::Text(text),
                _ => return Err(problem(Problem::Malformed(String::from("not valid JSON")))),
            }
        }
        (raw, _, _) => raw,
    };
    if let Some((shorthand_type, _)) = &spec.shorthand {
        let is_object = matches!(raw, Raw::Json(Json::Object(_)));
        if !is_object {
            let value = parse(snapshot, shorthand_type, &raw).map_err(problem)?;
            // What the shorthand makes is read as if the client had written
            // it: each field to its type, a number within its range, an
            // enumeration's member by its name.
            let expanded = expand_shorthand(spec, value).to_json();
            return parse(snapshot, &spec.ty, &Raw::Json(&expanded)).map_err(problem);
        }
    }
    parse(snapshot, &spec.ty, &raw).map_err(problem)
}

fn parse(snapshot: &Snapshot, ty: &InputType, raw: &Raw<'_>) -> Result<Value, Problem> {
    let malformed = |what: &str| Problem::Malformed(format!("expected {what}"));
    match ty {
        InputType::Bool => match raw {
            Raw::Json(Json::Bool(b)) => Ok(Value::Bool(*b)),
            Raw::Text(text) => match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Ok(Value::Bool(true)),
                "false" | "0" | "no" => Ok(Value::Bool(false)),
                _ => Err(malformed("true or false")),
            },
            _ => Err(malformed("true or false")),
        },
        InputType::Number | InputType::Int { .. } => {
            let number = match raw {
                Raw::Json(Json::Number(n)) => n.as_f64(),
                Raw::Text(text) => text.trim().parse::<f64>().ok(),
                _ => None,
            }
            .filter(|n| n.is_finite())
            .ok_or_else(|| malformed("a number"))?;
            if let InputType::Int { low, high } = ty
                && (number.fract() != 0.0 || number < *low || number > *high)
            {
                return Err(Problem::Invalid(format!(
                    "a whole number from {} to {}, found {number}",
                    Value::Number(*low),
                    Value::Number(*high)
                )));
            }
            Ok(Value::Number(number))
        }
        InputType::String => text_of(raw)
            .map(Value::string)
            .ok_or_else(|| malformed("a string")),
        InputType::Duration => text_of(raw)
            .and_then(parse_duration)
            .map(Value::Duration)
            .ok_or_else(|| malformed("a duration such as \"10s\"")),
        InputType::Provider => {
            let name = text_of(raw).ok_or_else(|| malformed("a provider name"))?;
            let name = name.trim();
            match snapshot.provider_called(name) {
                Some(value) => Ok(value.clone()),
                None if !snapshot.providers_named(name).is_empty() => {
                    Err(Problem::Unknown(format!(
                        "no provider is named `{name}` (a provider's id; requests name providers by name or alias)"
                    )))
                }
                None => Err(Problem::Unknown(format!("no provider is named `{name}`"))),
            }
        }
        InputType::Model => {
            let id = text_of(raw).ok_or_else(|| malformed("a model id"))?;
            // An alias of one model is that model's id, as `model.id`
            // reads it; one of several stays the alias, which `from`
            // expands into its models.
            match snapshot.model_named(id) {
                Some(ModelName::Model(index)) => snapshot
                    .data
                    .catalog
                    .models
                    .get(*index)
                    .map(|model| Value::string(&model.id))
                    .ok_or_else(|| Problem::Unknown(format!("no model has the id `{id}`"))),
                Some(ModelName::Alias(_)) => Ok(Value::string(id)),
                None => Err(Problem::Unknown(format!("no model has the id `{id}`"))),
            }
        }
        InputType::Enum(e) => {
            let name = text_of(raw)
                .ok_or_else(|| malformed(&format!("one of {}", e.members.join(", "))))?;
            let rank = e
                .members
                .iter()
                .position(|member| member == name)
                .ok_or_else(|| {
                    Problem::Invalid(format!("expected one of {}", e.members.join(", ")))
                })?;
            Ok(Value::Enum(EnumMember {
                rank: u32::try_from(rank).unwrap_or(u32::MAX),
                name: Arc::from(name),
            }))
        }
        InputType::List(item) => match raw {
            Raw::Json(Json::Array(items)) => {
                // Collected straight into the shared list: the array's
                // length is known, so that is one allocation where a
                // vector of results was two. The first problem is kept.
                let mut problem = None;
                let values: Arc<[Value]> = items
                    .iter()
                    .map(|item_raw| {
                        parse(snapshot, item, &Raw::Json(item_raw)).unwrap_or_else(|found| {
                            problem.get_or_insert(found);
                            Value::Null
                        })
                    })
                    .collect();
                match problem {
                    Some(problem) => Err(problem),
                    None => Ok(Value::List(values)),
                }
            }
            _ => Err(malformed("a list")),
        },
        InputType::Csv(item) => {
            let text = text_of(raw).ok_or_else(|| malformed("a comma-separated list"))?;
            // A header that lists nothing (empty, blank, or commas alone)
            // was as good as not sent.
            if text.split(',').all(|part| part.trim().is_empty()) {
                return Ok(Value::Null);
            }
            let values = text
                .split(',')
                .map(str::trim)
                .filter(|part| !part.is_empty())
                .map(|part| parse(snapshot, item, &Raw::Text(part)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::List(Arc::from(values)))
        }
        InputType::Object(fields) => {
            let Raw::Json(Json::Object(object)) = raw else {
                return Err(malformed("an object"));
            };
            if let Some(unknown) = object
                .keys()
                .find(|key| !fields.iter().any(|(name, _)| **name == ***key))
            {
                let known: Vec<&str> = fields.iter().map(|(name, _)| &**name).collect();
                return Err(Problem::Invalid(format!(
                    "unknown field `{unknown}`; the fields are {}",
                    known.join(", ")
                )));
            }
            let mut values = Vec::new();
            for (name, field_type) in fields {
                let value = match object.get(&**name) {
                    None | Some(Json::Null) => Value::Null,
                    Some(field_raw) => parse(snapshot, field_type, &Raw::Json(field_raw))
                        .map_err(|problem| problem.in_field(name))?,
                };
                values.push((name.clone(), value));
            }
            Ok(Value::Record(Arc::from(values)))
        }
    }
}

fn text_of<'a>(raw: &'a Raw<'_>) -> Option<&'a str> {
    match raw {
        Raw::Json(Json::String(s)) => Some(s.as_str()),
        Raw::Text(text) => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate::execution::error_name;
    use crate::evaluate::tests::shipped;

    /// AnonRouter's `provider` input read from a raw value: its value, or
    /// the name of the error it answers with and the problem's detail.
    fn provider_input(raw: Json) -> Result<Value, (String, String)> {
        let snapshot = shipped("anonrouter");
        let spec = snapshot
            .program
            .inputs
            .iter()
            .find(|spec| spec.name == "provider")
            .expect("anonrouter declares `provider`");
        parse_input(&snapshot, spec, Some(Raw::Json(&raw)), &mut |_, value| {
            value
        })
        .map_err(|problem| (error_name(&snapshot, problem.error), problem.detail))
    }

    /// The error AnonRouter's `provider` input answers a raw value with.
    fn error_for(raw: Json) -> Option<String> {
        provider_input(raw).err().map(|(error, _)| error)
    }

    #[test]
    fn wrong_shapes_refused_values_and_unknown_names_get_their_own_errors() {
        use serde_json::json;
        for malformed in [json!(42), json!(["venice"]), json!({"only": "venice"})] {
            assert_eq!(
                error_for(malformed.clone()).as_deref(),
                Some("invalid_provider_policy"),
                "{malformed}"
            );
        }
        for invalid in [
            json!({"orders": ["venice"]}),
            json!({"max_attempts": 4}),
            json!({"max_attempts": 2.5}),
            json!({"sort": "default"}),
        ] {
            assert_eq!(
                error_for(invalid.clone()).as_deref(),
                Some("invalid_request"),
                "{invalid}"
            );
        }
        assert_eq!(
            error_for(json!({"only": ["fireworks"]})).as_deref(),
            Some("invalid_provider_policy")
        );
        assert_eq!(
            error_for(json!({"only": ["venice"], "max_attempts": 3})),
            None
        );
    }

    /// The value of AnonRouter's `provider` input for a raw value, or the
    /// problem's detail.
    fn value_of(raw: Json) -> Result<Value, String> {
        provider_input(raw).map_err(|(_, detail)| detail)
    }

    #[test]
    fn a_provider_is_named_by_its_name_or_alias_never_by_an_id_that_is_no_name() {
        use serde_json::json;
        // NEAR AI's two regions are the catalog's near-ai-us and near-ai-eu,
        // both named near-ai, with the alias `other`.
        for (public, name) in [
            ("near-ai", "near-ai"),
            ("NEAR-AI", "near-ai"),
            ("other", "near-ai"),
            (" venice ", "venice"),
        ] {
            let only = value_of(json!({"only": [public]})).expect("a provider's name");
            let only = format!("{only:?}");
            assert!(only.contains(&format!("{name:?}")), "{public}: {only}");
        }
        for region in ["near-ai-us", "near-ai-eu", "NEAR-AI-EU"] {
            let detail = value_of(json!({"only": [region]})).expect_err("a region's id");
            assert!(detail.contains("a provider's id"), "{region}: {detail}");
        }
        let detail = value_of(json!("nobody")).expect_err("no such provider");
        assert!(!detail.contains("a provider's id"), "{detail}");
    }
}
