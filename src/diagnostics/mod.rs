//! Diagnostics: what every stage reports to the user, and how it is shown.
//!
//! A diagnostic is data (code, message, labelled source spans, help); the
//! renderers in [`render`] turn it into rustc-style text or JSON.

pub mod codes;
pub mod redact;
pub mod render;

use crate::source::{SourceId, SourceMap, Span};
pub use codes::Code;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// A place in a source file with a short note about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub source: SourceId,
    pub span: Span,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub code: Code,
    pub message: String,
    /// Where the problem is; absent only for problems with no file, such as a
    /// missing command-line argument.
    pub primary: Option<Label>,
    pub secondary: Vec<Label>,
    /// The file a problem without a place in it is about (one that cannot
    /// be read), so that a run over many files still names it.
    pub file: Option<String>,
    pub help: Option<String>,
    /// Whether renderers may quote the source line. Off for diagnostics about
    /// secrets, so a pasted key never reaches a terminal or CI log.
    pub quote_source: bool,
}

impl Diagnostic {
    pub fn new(code: Code, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            message: message.into(),
            primary: None,
            secondary: Vec::new(),
            file: None,
            help: None,
            quote_source: true,
        }
    }

    pub fn severity(&self) -> Severity {
        self.code.severity
    }

    pub fn at(mut self, source: SourceId, span: Span, label: impl Into<String>) -> Diagnostic {
        self.primary = Some(Label {
            source,
            span,
            message: label.into(),
        });
        self
    }

    pub fn also(mut self, source: SourceId, span: Span, label: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label {
            source,
            span,
            message: label.into(),
        });
        self
    }

    /// About `file` as a whole, for a problem with no place in it.
    pub fn about_file(mut self, file: impl Into<String>) -> Diagnostic {
        self.file = Some(file.into());
        self
    }

    /// The file the diagnostic points into, or is about.
    pub fn file_name<'a>(&'a self, sources: &'a SourceMap) -> Option<&'a str> {
        self.primary
            .as_ref()
            .and_then(|label| sources.file(label.source))
            .map(|file| file.name.as_str())
            .or(self.file.as_deref())
    }

    pub fn help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn help_opt(mut self, help: Option<String>) -> Diagnostic {
        if help.is_some() {
            self.help = help;
        }
        self
    }
}

/// Diagnostics collected by a run, in the order they were found.
#[derive(Debug, Default)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn new() -> Diagnostics {
        Diagnostics::default()
    }

    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.items.push(diagnostic);
    }

    pub fn extend(&mut self, other: impl IntoIterator<Item = Diagnostic>) {
        self.items.extend(other);
    }

    pub fn has_errors(&self) -> bool {
        self.items
            .iter()
            .any(|diagnostic| diagnostic.severity() == Severity::Error)
    }

    pub fn count(&self, severity: Severity) -> usize {
        self.items
            .iter()
            .filter(|diagnostic| diagnostic.severity() == severity)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    /// Orders diagnostics by file and position, errors before warnings at the
    /// same place, so output is stable whatever order checks ran in.
    pub fn sort(&mut self) {
        self.items.sort_by_key(|diagnostic| {
            let position = diagnostic
                .primary
                .as_ref()
                .map(|label| (label.source, label.span.start, label.span.end));
            (position, diagnostic.severity(), diagnostic.code.id)
        });
        // Spans compare equal whatever their position, so duplicates are
        // judged by position explicitly: the same mistake in two places is
        // two diagnostics.
        self.items.dedup_by(|a, b| {
            let place = |d: &Diagnostic| {
                d.primary
                    .as_ref()
                    .map(|l| (l.source, l.span.start, l.span.end))
            };
            a == b && place(a) == place(b)
        });
    }

    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.items
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

/// Why a file could not be read, or an address not listened on, in words.
pub fn io_reason(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => String::from("no such file"),
        std::io::ErrorKind::PermissionDenied => String::from("permission denied"),
        // `read_text` says where.
        std::io::ErrorKind::InvalidData if error.get_ref().is_some() => error.to_string(),
        std::io::ErrorKind::InvalidData => String::from("it is not UTF-8 text"),
        std::io::ErrorKind::IsADirectory => String::from("it is a directory"),
        // The kind that names it is not stable yet; its name is.
        kind if format!("{kind:?}") == "FilesystemLoop" => {
            String::from("its symbolic links form a loop")
        }
        std::io::ErrorKind::AddrInUse => String::from("the address is in use"),
        std::io::ErrorKind::AddrNotAvailable => {
            String::from("the address is not one of this machine's")
        }
        _ => error.to_string(),
    }
}

/// "; did you mean `x`?" for the candidate closest to `wrong`, if one is
/// close enough to be meant; nothing otherwise. Ends a message.
pub fn did_you_mean<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    suggest(wrong, candidates)
        .map_or_else(String::new, |close| format!("; did you mean `{close}`?"))
}

/// The closest candidate to a misspelled name, if one is close enough to be
/// what the user meant.
pub fn suggest<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let length = wrong.chars().count();
    // Nobody mistypes a name this long; and measuring it against every
    // candidate would cost more than the hint is worth.
    if length > MAX_SUGGESTED_LENGTH {
        return None;
    }
    let limit = match length {
        0..=2 => 1,
        3..=5 => 2,
        _ => 3,
    };
    let letters = Letters::of(wrong);
    candidates
        .into_iter()
        .take(MAX_SUGGESTION_CANDIDATES)
        // Cheap lower bounds of the edit distance first: the difference in
        // length, then letters one has and the other lacks.
        .filter(|candidate| candidate.chars().count().abs_diff(length) <= limit)
        .filter(|candidate| letters.lower_bound(candidate) <= limit)
        .take(MAX_MEASURED_CANDIDATES)
        .map(|candidate| (strsim::osa_distance(wrong, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, candidate)| (*distance, *candidate))
        .map(|(_, candidate)| candidate)
}

/// Names longer than this get no "did you mean".
const MAX_SUGGESTED_LENGTH: usize = 64;
/// At most this many candidates are looked at …
const MAX_SUGGESTION_CANDIDATES: usize = 10_000;
/// … and at most this many of them measured exactly, so that a file with
/// thousands of unknown names among thousands of similar ones stays fast.
const MAX_MEASURED_CANDIDATES: usize = 32;

/// Which ASCII letters a name contains.
struct Letters {
    mask: u128,
    ascii: bool,
}

impl Letters {
    fn of(text: &str) -> Letters {
        Letters {
            mask: mask(text),
            ascii: text.is_ascii(),
        }
    }

    /// A lower bound of the edit distance to `candidate`: each letter only
    /// one of them has takes at least one edit of its own. Zero, which
    /// filters nothing, for names that are not ASCII.
    fn lower_bound(&self, candidate: &str) -> usize {
        if !self.ascii || !candidate.is_ascii() {
            return 0;
        }
        let other = mask(candidate);
        let only_here = (self.mask & !other).count_ones();
        let only_there = (other & !self.mask).count_ones();
        only_here.max(only_there) as usize
    }
}

fn mask(text: &str) -> u128 {
    text.bytes()
        .filter(|byte| byte.is_ascii())
        .fold(0u128, |mask, byte| mask | (1u128 << byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let names = ["priority", "name", "region"];
        assert_eq!(suggest("prioritty", names), Some("priority"));
        assert_eq!(suggest("regoin", names), Some("region"));
        assert_eq!(suggest("zzz", names), None);
        // A transposition is one edit.
        assert_eq!(suggest("nmae", names), Some("name"));
        assert_eq!(suggest(&"x".repeat(65), ["x"]), None);
    }

    #[test]
    fn the_letter_bound_never_exceeds_the_edit_distance() {
        for (a, b) in [
            ("priority", "prioritty"),
            ("abc", "cab"),
            ("", "xyz"),
            ("kitten", "sitting"),
            ("unknown-model-1", "model-number-1"),
        ] {
            assert!(Letters::of(a).lower_bound(b) <= strsim::osa_distance(a, b));
        }
    }
}
