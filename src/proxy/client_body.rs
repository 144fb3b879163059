//! A client's request body, read once: its top-level members as the client
//! wrote them, and as a JSON tree only the members the evaluator reads. The
//! rest (the conversation: `messages`, `input`, tools' results) is checked
//! to be JSON but never becomes a tree; it goes on to the provider as
//! written.

use crate::evaluate::NOT_AN_OBJECT;
use crate::json_text::write_json_string;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::error::Category;
use serde_json::value::RawValue;
use serde_json::{Map, Value as Json};
use std::borrow::Cow;
use std::collections::HashSet;

/// A body that is one JSON object.
pub struct ClientBody<'a> {
    /// The object's members in the order written, repeated keys included:
    /// the key unescaped, the value as its text.
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
}

const UTF8_BYTE_ORDER_MARK: &[u8] = b"\xEF\xBB\xBF";

/// Up to this many members, a repeated key is found by comparing each key
/// with those after it; past it, with a set.
const FEW_MEMBERS: usize = 32;

impl<'a> ClientBody<'a> {
    /// The members of `bytes` as one JSON object; otherwise why it is not
    /// one, for the client: where the JSON breaks, or that it is some other
    /// JSON value. A UTF-8 byte-order mark before the object is passed over,
    /// as RFC 8259 allows a reader to (some clients on Windows write one);
    /// it does not go on to the provider, which gets the members.
    pub fn read(bytes: &'a [u8]) -> Result<ClientBody<'a>, String> {
        let bytes = bytes.strip_prefix(UTF8_BYTE_ORDER_MARK).unwrap_or(bytes);
        serde_json::from_slice(bytes).map_err(|error| match error.classify() {
            Category::Data => NOT_AN_OBJECT.to_string(),
            Category::Syntax | Category::Eof | Category::Io => {
                format!("the request body is not valid JSON: {error}")
            }
        })
    }

    /// The members `read` accepts as a JSON object; of a repeated key the
    /// last, as in a tree. An error when one of them does not make a tree
    /// (a number out of range, a lone surrogate): the body is then
    /// malformed for the policy, as if no member made a tree.
    pub fn tree(&self, read: impl Fn(&str) -> bool) -> Result<Json, String> {
        let mut object = Map::new();
        for (key, value) in &self.members {
            if read(key) {
                let value: Json = serde_json::from_str(value.get()).map_err(|error| {
                    // The error's position is within the member's value.
                    format!("the request body's `{key}` is out of range or not valid text: {error} of its value")
                })?;
                object.insert(key.to_string(), value);
            }
        }
        Ok(Json::Object(object))
    }

    /// The members `dropped` does not name, joined by commas: the text
    /// between an object's braces. Values go as the client wrote them; of a
    /// repeated key only the last, the one the policy read.
    pub fn members_but(&self, dropped: impl Fn(&str) -> bool) -> Vec<u8> {
        let superseded = self.superseded();
        let capacity = self
            .members
            .iter()
            .map(|(key, value)| key.len() + value.get().len() + 4);
        let mut out = String::with_capacity(capacity.sum());
        for (index, (key, value)) in self.members.iter().enumerate() {
            if dropped(key) || superseded.as_ref().is_some_and(|set| set.contains(&index)) {
                continue;
            }
            if !out.is_empty() {
                out.push(',');
            }
            // Writing into a String cannot fail.
            let _ = write_json_string(&mut out, key);
            out.push(':');
            out.push_str(value.get());
        }
        out.into_bytes()
    }

    /// The value of member `key` as written; of a repeated key the last.
    pub fn member(&self, key: &str) -> Option<&'a RawValue> {
        self.members
            .iter()
            .rev()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    }

    /// The members a later one with the same key replaces; `None` when no
    /// key repeats (the usual case, found without allocating).
    fn superseded(&self) -> Option<HashSet<usize>> {
        let repeats_later = |index: usize, key: &str| {
            self.members
                .iter()
                .skip(index + 1)
                .any(|(later, _)| later == key)
        };
        if self.members.len() <= FEW_MEMBERS {
            let superseded: HashSet<usize> = self
                .members
                .iter()
                .enumerate()
                .filter(|(index, (key, _))| repeats_later(*index, key))
                .map(|(index, _)| index)
                .collect();
            return (!superseded.is_empty()).then_some(superseded);
        }
        let mut seen = HashSet::with_capacity(self.members.len());
        let superseded: HashSet<usize> = self
            .members
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, (key, _))| !seen.insert(key.as_ref()))
            .map(|(index, _)| index)
            .collect();
        (!superseded.is_empty()).then_some(superseded)
    }
}

impl<'de> Deserialize<'de> for ClientBody<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = ClientBody<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ClientBody<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Key(key)) = map.next_key()? {
                    let value: &'de RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(ClientBody { members })
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// An object's key, borrowed from the body unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("an object key")
            }

            fn visit_borrowed_str<E: serde::de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_string())))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// The members sent on but `model` and `provider`, read back as an
    /// object.
    fn sent(body: &str) -> Map<String, Json> {
        let members = ClientBody::read(body.as_bytes())
            .unwrap()
            .members_but(|key| key == "model" || key == "provider");
        serde_json::from_slice(&[&b"{"[..], &members, b"}"].concat()).unwrap()
    }

    #[test]
    fn the_body_goes_on_as_the_policy_read_it() {
        let bodies = [
            r#"{}"#,
            r#" { "model" : "m" } "#,
            r#"{"model":"m","stream":true,"n":-1.5e3,"x":null,"y":false}"#,
            "{\n  \"messages\": [ {\"role\": \"user\", \"content\": \"a } ] \\\" , {\"} ],\n  \"model\": \"m\",\t\"temperature\":0.2 ,\"provider\":{\"only\":[\"x\",{}]}}",
            // Repeated and escaped keys: what the tree reads goes on.
            r#"{"stream":false,"model":"m","stream":true}"#,
            r#"{"str\u0065am":true,"model":"m","provider":1}"#,
            r#"{"model":"m","pr\u006fvider":{"only":[]},"top_p":1}"#,
            r#"{"a\"b":1,"tab\there":2,"nul\u0000\u001f\b\f\n\r\\é":3}"#,
        ];
        for body in bodies {
            let mut expected: Map<String, Json> = serde_json::from_str(body).unwrap();
            expected.remove("model");
            expected.remove("provider");
            assert_eq!(sent(body), expected, "{body}");
        }
    }

    #[test]
    fn values_are_copied_as_written() {
        let body = br#"{"stream": false, "model":"m", "messages": [{"role": "user"}] }"#;
        let members = ClientBody::read(body)
            .unwrap()
            .members_but(|key| key == "model");
        assert_eq!(
            members,
            br#""stream":false,"messages":[{"role": "user"}]"#.to_vec()
        );
    }

    #[test]
    fn only_objects_are_bodies() {
        for not_an_object in [
            &b"[1]"[..],
            b"\"text\"",
            b"{\"a\":1",
            b"{} {}",
            b"",
            b"{\"a\":}",
        ] {
            assert!(ClientBody::read(not_an_object).is_err());
        }
    }

    #[test]
    fn a_byte_order_mark_before_the_object_is_passed_over() {
        let body = ClientBody::read(b"\xEF\xBB\xBF{\"model\":\"m\",\"n\":1}").unwrap();
        assert_eq!(body.members_but(|_| false), br#""model":"m","n":1"#);
        // Only before the object: one inside a string is the string's.
        let body = ClientBody::read(b"{\"model\":\"\xEF\xBB\xBFm\"}").unwrap();
        assert_eq!(
            body.tree(|_| true).unwrap(),
            serde_json::json!({"model": "\u{feff}m"})
        );
        // One mark only, and not after whitespace.
        assert!(ClientBody::read(b"\xEF\xBB\xBF\xEF\xBB\xBF{}").is_err());
        assert!(ClientBody::read(b" \xEF\xBB\xBF{}").is_err());
    }

    #[test]
    fn the_tree_holds_only_what_is_read() {
        let body = ClientBody::read(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"stream":true}"#,
        )
        .unwrap();
        let tree = body.tree(|key| key == "model" || key == "stream").unwrap();
        assert_eq!(tree, serde_json::json!({"model": "m", "stream": true}));
    }

    #[test]
    fn a_read_member_that_makes_no_tree_makes_the_body_malformed() {
        // serde_json's tree refuses numbers out of range and lone
        // surrogates; a member nobody reads goes on as written.
        let body = ClientBody::read(br#"{"model":"m","n":1e400,"t":"\ud800"}"#).unwrap();
        assert!(body.tree(|key| key == "n").is_err());
        assert!(body.tree(|key| key == "t").is_err());
        assert_eq!(
            body.tree(|key| key == "model"),
            Ok(serde_json::json!({"model": "m"}))
        );
        assert_eq!(
            body.members_but(|key| key == "model"),
            br#""n":1e400,"t":"\ud800""#.to_vec()
        );
    }

    #[test]
    fn a_key_repeated_late_in_a_large_body_is_still_noticed() {
        // Up to the body limit a client can send millions of members: keys
        // are compared through a set, not each with all the others.
        let mut body = String::from("{");
        for index in 0..200_000 {
            body.push_str(&format!("\"k{index}\":{index},"));
        }
        body.push_str("\"model\":\"m\"}");
        let members = ClientBody::read(body.as_bytes())
            .unwrap()
            .members_but(|key| key == "model");
        assert_eq!(members.len(), body.len() - 2 - ",\"model\":\"m\"".len());

        let repeated = body.replacen("\"model\":\"m\"", "\"k0\":\"last\"", 1);
        let members = ClientBody::read(repeated.as_bytes())
            .unwrap()
            .members_but(|_| false);
        let sent: Map<String, Json> =
            serde_json::from_slice(&[&b"{"[..], &members, b"}"].concat()).unwrap();
        assert_eq!(sent.len(), 200_000);
        assert_eq!(sent["k0"], "last");
        assert!(!members.starts_with(b"\"k0\":0,"));
    }
}
