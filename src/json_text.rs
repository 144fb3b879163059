//! JSON strings written by hand, where a serializer would cost more than the
//! text: the request log's JSON lines and the keys of the body the proxy
//! sends on. Escaped as serde_json escapes them, byte for byte.

use std::fmt::{self, Write};

/// `text` as a JSON string, quotes included.
pub fn write_json_string(out: &mut impl Write, text: &str) -> fmt::Result {
    out.write_char('"')?;
    JsonEscaped(out).write_str(text)?;
    out.write_char('"')
}

/// Escapes what it is given as the inside of a JSON string, as serde_json
/// does: quotes, backslashes and control characters; the rest as it is.
struct JsonEscaped<'a, W: ?Sized>(&'a mut W);

impl<W: Write + ?Sized> Write for JsonEscaped<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if text
            .bytes()
            .all(|byte| byte >= b' ' && byte != b'"' && byte != b'\\')
        {
            return self.0.write_str(text);
        }
        for c in text.chars() {
            match c {
                '"' => self.0.write_str("\\\"")?,
                '\\' => self.0.write_str("\\\\")?,
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                '\u{8}' => self.0.write_str("\\b")?,
                '\u{c}' => self.0.write_str("\\f")?,
                c if c < ' ' => write!(self.0, "\\u{:04x}", u32::from(c))?,
                c => self.0.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let controls: String = (0u8..0x20).map(char::from).collect();
        for text in [
            "plain",
            "",
            "quote\"back\\slash",
            "é ü 😀 \u{7f}",
            controls.as_str(),
        ] {
            let mut written = String::new();
            write_json_string(&mut written, text).unwrap();
            assert_eq!(written, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }
}
