//! A provider's failed answer → the redaction of the credential it may echo
//! (`proxy::without_secret`) and the reading of its error object
//! (`proxy::outcome_facts`). Needs the library's `server` feature:
//! `cargo fuzz run --features server provider_error ...`.
//!
//! Input format: byte 0 is the secret's length (12 to 75), the next bytes
//! its characters (each mapped onto the letters, digits and `-_/+.` keys are
//! made of); byte after it the answer's status (400 + the byte); the rest
//! is the body.
//!
//! Besides crashes, the target checks what the proxy promises: the redacted
//! body holds the secret neither as written nor in any string of its JSON
//! tree (what a client reads), the tree of a JSON body read again after
//! decoding a string that is itself JSON included; and the error message
//! read from the redacted body holds it neither.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use switchyard::proxy::{outcome_facts, without_secret};

const KEY_CHARACTERS: &[u8] =
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_/+.";

/// Whether any string of `value` (keys too) holds `secret`, reading a string
/// that is JSON as JSON again, as a client may.
fn holds(value: &Value, secret: &str, depth: usize) -> bool {
    match value {
        Value::String(text) => {
            text.contains(secret)
                || (depth < 2
                    && serde_json::from_str::<Value>(text)
                        .is_ok_and(|inner| holds(&inner, secret, depth + 1)))
        }
        Value::Array(items) => items.iter().any(|item| holds(item, secret, depth)),
        Value::Object(members) => members
            .iter()
            .any(|(key, item)| key.contains(secret) || holds(item, secret, depth)),
        _ => false,
    }
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&length, rest)) = bytes.split_first() else {
        return;
    };
    let length = 12 + usize::from(length) % 64;
    if rest.len() < length + 1 {
        return;
    }
    let (secret, rest) = rest.split_at(length);
    let secret: String = secret
        .iter()
        .map(|byte| char::from(KEY_CHARACTERS[usize::from(*byte) % KEY_CHARACTERS.len()]))
        .collect();
    let (status, body) = rest.split_first().unwrap_or((&0, &[]));
    let status = 400 + u16::from(*status);
    let redacted = without_secret(Bytes::copy_from_slice(body), &secret);
    assert!(
        memchr::memmem::find(&redacted, secret.as_bytes()).is_none(),
        "the secret is still written out"
    );
    if let Ok(tree) = serde_json::from_slice::<Value>(&redacted) {
        assert!(!holds(&tree, &secret, 0), "a client reads the secret in the JSON");
    }
    let facts = outcome_facts(
        status,
        &http::HeaderMap::new(),
        &redacted,
        std::time::SystemTime::UNIX_EPOCH,
    );
    assert!(
        !facts
            .error_message
            .as_deref()
            .is_some_and(|message| message.contains(secret.as_str())),
        "the error's message holds the secret"
    );
});
