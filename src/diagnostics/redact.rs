//! Keeps what looks like an API key out of what diagnostics print. A key
//! pasted into a data file in the wrong place (an unknown field, a broken
//! line of YAML) is quoted by the diagnostic about that place; the quote,
//! and any message that repeats a value, must not carry it to a terminal or
//! a CI log.

use std::borrow::Cow;

/// How the API keys of common providers begin.
const PREFIXES: [&str; 8] = [
    "sk-", "sk_live_", "AKIA", "ghp_", "xoxb-", "xoxp-", "AIza", "gsk_",
];

/// Shorter strings with these prefixes are ordinary words and ids.
const MIN_LEN: usize = 16;

/// Whether a whole value looks like an API key.
pub fn looks_like_secret(text: &str) -> bool {
    secret_prefix(text).is_some()
}

/// Stricter, for names and ids, where a word may begin like a key by
/// chance (`sk-hynix-research` is a company): after the prefix, 16
/// characters or more of letters, digits, `-` and `_`, mixing letters and
/// digits as generated keys do.
pub fn looks_like_generated_key(text: &str) -> bool {
    let Some(rest) = secret_prefix(text).and_then(|prefix| text.get(prefix.len()..)) else {
        return false;
    };
    rest.len() >= 16
        && rest.chars().any(|c| c.is_ascii_digit())
        && rest.chars().any(|c| c.is_ascii_alphabetic())
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The prefix of a value that looks like an API key.
fn secret_prefix(text: &str) -> Option<&'static str> {
    if text.len() < MIN_LEN {
        return None;
    }
    PREFIXES
        .iter()
        .copied()
        .find(|prefix| text.starts_with(prefix))
}

/// `text` with every word that looks like an API key masked after its
/// prefix (`sk-proj-AbC…` becomes `sk-*****…`). A word is a run of ASCII
/// letters, digits, `-` and `_`; masking keeps its length, so carets under a
/// quoted line still point where they did.
pub fn redact(text: &str) -> Cow<'_, str> {
    // No word in it is long enough (the proxy masks every model id it logs).
    if text.len() < MIN_LEN {
        return Cow::Borrowed(text);
    }
    let mut masked: Option<Vec<u8>> = None;
    let mut word_start = None;
    // A space after the end closes the last word.
    for (index, byte) in text.bytes().chain([b' ']).enumerate() {
        match (is_word_byte(byte), word_start) {
            (true, None) => word_start = Some(index),
            (false, Some(start)) => {
                word_start = None;
                let word = text.get(start..index).unwrap_or("");
                if let Some(prefix) = secret_prefix(word) {
                    let copy = masked.get_or_insert_with(|| text.as_bytes().to_vec());
                    if let Some(rest) = copy.get_mut(start + prefix.len()..index) {
                        rest.fill(b'*');
                    }
                }
            }
            _ => {}
        }
    }
    match masked {
        // Only ASCII word bytes were replaced, by ASCII: still UTF-8.
        Some(copy) => Cow::Owned(String::from_utf8(copy).unwrap_or_default()),
        None => Cow::Borrowed(text),
    }
}

fn is_word_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_begin_like_keys_are_not_taken_for_generated_keys() {
        for name in [
            "sk-hynix-research",
            "sk-acme-production",
            "sk-telecom-research-lab",
        ] {
            assert!(!looks_like_generated_key(name), "{name}");
        }
        for key in [
            "sk-proj-4fQ2nX8vLp0aZ7tR1mK9wB3c",
            "AKIAIOSFODNN7EXAMPLE2",
            // Groq's keys.
            "gsk_8Yf3kLq0Zt2WbX9nPc4VdR7mJh1sAe6u",
        ] {
            assert!(looks_like_generated_key(key), "{key}");
        }
    }

    #[test]
    fn masks_key_like_words_and_keeps_their_length() {
        let key = "sk-proj-AbCdEf0123456789AbCdEf";
        let line = format!("    api_key: {key}, region: eu");
        let masked = redact(&line);
        assert_eq!(masked.len(), line.len());
        assert_eq!(
            masked,
            format!("    api_key: sk-{}, region: eu", "*".repeat(key.len() - 3))
        );
        assert_eq!(
            redact("id: \"AKIAIOSFODNN7EXAMPLE\""),
            "id: \"AKIA****************\""
        );
    }

    #[test]
    fn leaves_short_and_embedded_words_alone() {
        for text in [
            "sk-short",
            "task-0123456789abcdef",
            "provider: openai-sk-east",
            "ünïcode sk- ✓",
            "",
        ] {
            assert!(matches!(redact(text), Cow::Borrowed(_)), "{text}");
        }
    }
}
