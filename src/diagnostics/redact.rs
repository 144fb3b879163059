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

/// Where a key begins in `word`, and its prefix: at the word's start, or
/// right after a `-` or `_` inside it.
fn key_in_word(word: &str) -> Option<(usize, &'static str)> {
    let after_separators = word
        .bytes()
        .enumerate()
        .filter(|(_, byte)| matches!(byte, b'-' | b'_'))
        .map(|(at, _)| at + 1);
    std::iter::once(0)
        .chain(after_separators)
        .find_map(|at| Some((at, secret_prefix(word.get(at..)?)?)))
}

/// `text` with every word that looks like an API key masked after its
/// prefix (`sk-proj-AbC…` becomes `sk-*****…`), and every word that holds
/// one after a `-` or `_` (`trace-sk-proj-AbC…`). A word is a run of ASCII
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
                if let Some((at, prefix)) = key_in_word(word) {
                    let copy = masked.get_or_insert_with(|| text.as_bytes().to_vec());
                    if let Some(rest) = copy.get_mut(start + at + prefix.len()..index) {
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

/// `text` as a terminal may show it: [`redact`]ed, and with each control
/// character but a line break or tab written as an escape (`\u{1b}`), so
/// that a name quoted from a file cannot move the cursor or recolour the
/// screen.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    let redacted = redact(text);
    if !redacted
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return redacted;
    }
    Cow::Owned(
        redacted
            .chars()
            .map(|c| {
                if c.is_control() && c != '\n' && c != '\t' {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// A data file's quoted `text` with the value of every `key` field masked
/// (its length kept) unless it is a `${NAME}` reference: a credential's key
/// written out where the reference belongs is a secret whatever its shape,
/// and a broken line quotes it before the refusal of literal keys could
/// see it. Also masks words that look like API keys ([`redact`]).
pub fn redact_data_line(text: &str) -> Cow<'_, str> {
    let masked_keys = mask_key_values(text);
    match redact(&masked_keys) {
        Cow::Borrowed(_) => masked_keys,
        Cow::Owned(owned) => Cow::Owned(owned),
    }
}

fn mask_key_values(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut masked: Option<Vec<u8>> = None;
    let mut from = 0;
    while let Some(found) = text.get(from..).and_then(|rest| rest.find("key")) {
        let at = from + found;
        from = at + 3;
        // `key` as a field's whole name: `key:`, `"key":`, `{key: `, not
        // `api_key:` or `keys:`.
        let before = at.checked_sub(1).and_then(|i| bytes.get(i)).copied();
        if before.is_some_and(|byte| !b" \t{,\"'".contains(&byte)) {
            continue;
        }
        let mut value = from;
        if matches!(bytes.get(value), Some(b'"' | b'\'')) {
            value += 1;
        }
        while bytes.get(value) == Some(&b' ') {
            value += 1;
        }
        if bytes.get(value) != Some(&b':') {
            continue;
        }
        value += 1;
        while matches!(bytes.get(value), Some(b' ' | b'\t')) {
            value += 1;
        }
        let quoted = matches!(bytes.get(value), Some(b'"' | b'\''));
        if quoted {
            value += 1;
        }
        if is_whole_reference(text.get(value..).unwrap_or_default(), quoted) {
            continue;
        }
        let end = (value..bytes.len())
            .find(|&i| match bytes.get(i) {
                Some(b'"' | b'\'') => quoted,
                // A quoted value left open ends with its line, as the
                // excerpt may hold several.
                Some(b'\r' | b'\n') => true,
                Some(b',' | b'}') => !quoted,
                Some(b'#') => !quoted && i > 0 && bytes.get(i - 1) == Some(&b' '),
                _ => false,
            })
            .unwrap_or(bytes.len());
        let end = if quoted {
            end
        } else {
            value + text.get(value..end).map_or(0, |v| v.trim_end().len())
        };
        if end > value {
            let copy = masked.get_or_insert_with(|| bytes.to_vec());
            // Every byte, so that a masked character of several bytes
            // leaves no half behind; the caret columns stay where they were
            // for ASCII, which keys are.
            if let Some(secret) = copy.get_mut(value..end) {
                secret.fill(b'*');
            }
        }
        from = end.max(from);
    }
    match masked {
        Some(copy) => Cow::Owned(String::from_utf8(copy).unwrap_or_default()),
        None => Cow::Borrowed(text),
    }
}

/// Whether a value (from its start to the line's end) is a whole `${NAME}`
/// reference, which holds no secret; `${` with a secret after it does.
fn is_whole_reference(value: &str, quoted: bool) -> bool {
    let Some((name, after)) = value
        .strip_prefix("${")
        .and_then(|rest| rest.split_once('}'))
    else {
        return false;
    };
    let name_is_plain = !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
    let ends_there = match after.bytes().next() {
        None => true,
        Some(b'"' | b'\'') => quoted,
        Some(b',' | b'}' | b' ' | b'\t' | b'\r' | b'\n') => !quoted,
        Some(_) => false,
    };
    name_is_plain && ends_there
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
    fn masks_a_key_held_inside_a_word_after_a_separator() {
        assert_eq!(
            redact("foo-sk-proj-AbCdEf0123456789xyzABC"),
            format!("foo-sk-{}", "*".repeat(27))
        );
        assert_eq!(
            redact("trace_gsk_AbCdEf0123456789xyz"),
            format!("trace_gsk_{}", "*".repeat(19))
        );
        // A prefix inside a word, not after a separator, is a word.
        assert_eq!(redact("task0123456789abcdef"), "task0123456789abcdef");
        assert_eq!(redact("desk-lamp"), "desk-lamp");
    }

    #[test]
    fn masks_a_literal_key_field_in_a_data_line_whatever_its_shape() {
        let secret = "Zq8mPpL2vX9rT4wNbK7sY3cD6fH1jG5a";
        let stars = "*".repeat(secret.len());
        for (line, masked) in [
            (
                format!("      - {{id: alpha-key, key: {secret}}}}}"),
                format!("      - {{id: alpha-key, key: {stars}}}}}"),
            ),
            (
                format!("        key: \"{secret}\"  # pasted"),
                format!("        key: \"{stars}\"  # pasted"),
            ),
            (
                format!("{{\"id\": \"k\", \"key\": \"{secret}\"}}"),
                format!("{{\"id\": \"k\", \"key\": \"{stars}\"}}"),
            ),
        ] {
            assert_eq!(redact_data_line(&line), masked);
        }
        // A quoted value left open is masked to its line's end only.
        assert_eq!(
            redact_data_line(&format!("  key: \"{secret}\n  id: \"a\"")),
            format!("  key: \"{stars}\n  id: \"a\"")
        );
        // A reference that is not one, whole, hides nothing.
        for line in [
            "  - {id: a, key: \"${hunter2hunter2\", bogus: 1}",
            "  key: \"${A}hunter2hunter2\"",
            "  key: \"${hunter2 hunter2}\"",
        ] {
            assert!(redact_data_line(line).contains("*****"), "{line}");
        }
        // References, and fields that only end or begin in `key`, stay.
        for line in [
            "      - {id: a, key: \"${ALPHA_KEY}\"}",
            "    key: ${ALPHA_KEY}",
            "    api_key: visible",
            "    keys: [a, b]",
            "    monkey: business",
        ] {
            assert!(matches!(redact_data_line(line), Cow::Borrowed(_)), "{line}");
        }
    }

    #[test]
    fn control_characters_are_escaped_for_a_terminal() {
        assert_eq!(
            for_terminal("did you mean alpha\u{1b}[31m?"),
            "did you mean alpha\\u{1b}[31m?"
        );
        assert!(matches!(for_terminal("plain\ttext\n"), Cow::Borrowed(_)));
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
