//! Renders diagnostics as rustc-style text or as JSON for CI.

use super::redact::{for_terminal, redact, redact_data_line};
use super::{Diagnostic, Label, Severity};
use crate::source::{SourceFile, SourceMap};
use annotate_snippets::{AnnotationKind, Element, Group, Level, Origin, Renderer, Snippet};
use serde::Serialize;
use std::borrow::Cow;

/// Whether human output uses terminal colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    Colored,
}

/// Renders one diagnostic the way rustc does: header, `--> file:line:col`,
/// the source line with the span underlined, then the help line. Words that
/// look like API keys are masked in all of it ([`redact`]).
pub fn human(diagnostic: &Diagnostic, sources: &SourceMap, style: Style) -> String {
    let level = match diagnostic.severity() {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
    };
    let mut labels: Vec<(&Label, bool)> = Vec::new();
    if let Some(primary) = &diagnostic.primary {
        labels.push((primary, true));
    }
    labels.extend(diagnostic.secondary.iter().map(|label| (label, false)));
    let label_messages: Vec<Cow<'_, str>> = labels
        .iter()
        .map(|(label, _)| for_terminal(&label.message))
        .collect();

    // One place per file, primary file first, so labels in a data file and
    // in the policy are both quoted.
    let mut files = Vec::new();
    for (label, _) in &labels {
        if !files.contains(&label.source) {
            files.push(label.source);
        }
    }
    let places: Vec<Place<'_>> = files
        .into_iter()
        .filter_map(|source| {
            let file = sources.file(source)?;
            let located = || {
                let (label, _) = labels.iter().find(|(label, _)| label.source == source)?;
                let (line, column) = file.line_col(label.span.start);
                Some(Place::Located {
                    path: file.name.as_str(),
                    line,
                    column,
                })
            };
            if !diagnostic.quote_source {
                return located();
            }
            let annotations: Vec<(std::ops::Range<usize>, usize)> = labels
                .iter()
                .enumerate()
                .filter(|(_, (label, _))| label.source == source)
                .map(|(index, (label, _))| (visible_range(file, label), index))
                .collect();
            // Only the lines the labels touch go to the renderer: quoting the
            // whole file for every diagnostic made many diagnostics quadratic.
            let ranges: Vec<std::ops::Range<usize>> =
                annotations.iter().map(|(range, _)| range.clone()).collect();
            let (text, first_line, offset) = excerpt(file, &ranges);
            if text.len() > LONG_EXCERPT {
                // A line this long (a flow list of thousands of items) is no
                // help quoted, and quoting it for each of its many
                // diagnostics would cost its length every time: say where,
                // not what.
                return located();
            }
            let annotations = annotations
                .into_iter()
                .map(|(range, index)| {
                    (
                        range.start.saturating_sub(offset)..range.end.saturating_sub(offset),
                        index,
                    )
                })
                .collect();
            // Policies have no `key` fields; data files, test cases and
            // the like have, for credentials and callers' keys.
            let text = if file.name.ends_with(".policy") {
                redact(text)
            } else {
                redact_data_line(text)
            };
            Some(Place::Quoted {
                path: file.name.as_str(),
                text: without_carriage_returns(text),
                first_line,
                annotations,
            })
        })
        .collect();

    let message = for_terminal(&diagnostic.message);
    let mut group = Group::with_title(level.primary_title(&*message).id(diagnostic.code.id));
    for place in &places {
        let element: Element<'_> = match place {
            Place::Located { path, line, column } => {
                Origin::path(*path).line(*line).char_column(*column).into()
            }
            Place::Quoted {
                path,
                text,
                first_line,
                annotations,
            } => {
                let mut snippet = Snippet::source(&**text).path(*path).line_start(*first_line);
                for (range, index) in annotations {
                    let kind = match labels.get(*index) {
                        Some((_, true)) => AnnotationKind::Primary,
                        _ => AnnotationKind::Context,
                    };
                    let label = label_messages.get(*index).map_or("", |m| &**m);
                    snippet = snippet.annotation(kind.span(range.clone()).label(label));
                }
                snippet.into()
            }
        };
        group = group.element(element);
    }
    if places.is_empty()
        && let Some(file) = &diagnostic.file
    {
        group = group.element(Origin::path(file.as_str()));
    }
    let help = diagnostic.help.as_deref().map(for_terminal);
    if let Some(help) = &help {
        group = group.element(Level::HELP.message(&**help));
    }

    let renderer = match style {
        Style::Plain => Renderer::plain(),
        Style::Colored => Renderer::styled(),
    };
    let report: [Group<'_>; 1] = [group];
    renderer.render(&report)
}

/// Where a diagnostic points in one file: the lines quoted with the labels'
/// ranges in them (and the index of each label), or only the position.
enum Place<'a> {
    Quoted {
        path: &'a str,
        text: Cow<'a, str>,
        first_line: usize,
        annotations: Vec<(std::ops::Range<usize>, usize)>,
    },
    Located {
        path: &'a str,
        line: usize,
        column: usize,
    },
}

/// Excerpts longer than this are not quoted.
const LONG_EXCERPT: usize = 4096;

/// The whole lines of `file` that `ranges` touch: their text, the number of
/// the first line, and the byte offset where it starts.
fn excerpt<'f>(file: &'f SourceFile, ranges: &[std::ops::Range<usize>]) -> (&'f str, usize, usize) {
    let start = ranges.iter().map(|range| range.start).min().unwrap_or(0);
    let end = ranges
        .iter()
        .map(|range| range.end)
        .max()
        .unwrap_or(0)
        .max(start);
    let (first_line, _) = file.line_col(start);
    let begin = file.offset_of(first_line, 1);
    let finish = file
        .text
        .get(end..)
        .and_then(|rest| rest.find('\n'))
        .map_or(file.text.len(), |newline| end + newline);
    (
        file.text.get(begin..finish).unwrap_or(""),
        first_line,
        begin,
    )
}

/// A quoted excerpt of a file with CRLF line ends, whose carriage returns
/// the renderer would show as `␍`: each becomes a space, which keeps the
/// byte offsets of the labels.
fn without_carriage_returns(text: Cow<'_, str>) -> Cow<'_, str> {
    if text.contains('\r') {
        Cow::Owned(text.replace('\r', " "))
    } else {
        text
    }
}

/// The end of a span, before the carriage return of a CRLF line end that
/// it runs into (a string left open reaches the end of its line).
fn end_before_line_end(file: &SourceFile, start: usize, end: usize) -> usize {
    let bytes = file.text.as_bytes();
    let at_line_end = end > 0
        && bytes.get(end - 1) == Some(&b'\r')
        && (end == bytes.len() || bytes.get(end) == Some(&b'\n'));
    if at_line_end && end > start + 1 {
        end - 1
    } else {
        end
    }
}

/// A span that points at something visible: an empty span or one at the end
/// of the file is widened to the character before it.
fn visible_range(file: &SourceFile, label: &Label) -> std::ops::Range<usize> {
    let len = file.text.len();
    let mut start = label.span.start.min(len);
    let mut end = end_before_line_end(file, start, label.span.end.min(len).max(start));
    while !file.text.is_char_boundary(start) {
        start -= 1;
    }
    while !file.text.is_char_boundary(end) {
        end += 1;
    }
    let next = file.text.get(end..).and_then(|rest| rest.chars().next());
    // At a line's end the caret stays after its last character: widened
    // over the line break, it would reach into the next line.
    if start == end && !matches!(next, Some('\n' | '\r')) {
        if end < len {
            end += next.map_or(0, char::len_utf8);
        } else if let Some(last) = file.text[..start].chars().next_back() {
            start -= last.len_utf8();
        }
    }
    start..end
}

/// The summary line printed after all diagnostics.
pub fn summary(errors: usize, warnings: usize) -> String {
    fn plural(count: usize, word: &str) -> String {
        if count == 1 {
            format!("1 {word}")
        } else {
            format!("{count} {word}s")
        }
    }
    match (errors, warnings) {
        (0, 0) => String::from("no problems found"),
        (0, w) => plural(w, "warning"),
        (e, 0) => plural(e, "error"),
        (e, w) => format!("{}, {}", plural(e, "error"), plural(w, "warning")),
    }
}

#[derive(Serialize)]
struct JsonLabel<'a> {
    file: &'a str,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    message: Cow<'a, str>,
}

/// A diagnostic as `check --format json` gives it.
#[derive(Serialize)]
pub struct JsonDiagnostic<'a> {
    code: &'a str,
    severity: Severity,
    message: Cow<'a, str>,
    file: Option<&'a str>,
    line: Option<usize>,
    column: Option<usize>,
    labels: Vec<JsonLabel<'a>>,
    help: Option<Cow<'a, str>>,
}

fn json_label<'a>(label: &'a Label, sources: &'a SourceMap) -> Option<JsonLabel<'a>> {
    let file = sources.file(label.source)?;
    let (line, column) = file.line_col(label.span.start);
    let end = end_before_line_end(file, label.span.start, label.span.end);
    let (end_line, end_column) = file.line_col(end);
    Some(JsonLabel {
        file: file.name.as_str(),
        line,
        column,
        end_line,
        end_column,
        message: for_terminal(&label.message),
    })
}

/// A diagnostic on one line, for logs that keep one line per event:
/// `error[E0302] p.policy:2:6: unknown attribute (help: …)`. The source
/// line and its caret are left to `switchyard check`. Words that look like
/// API keys are masked, as in [`human`].
pub fn one_line(diagnostic: &Diagnostic, sources: &SourceMap) -> String {
    let severity = match diagnostic.severity() {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let mut line = format!("{severity}[{}]", diagnostic.code.id);
    if let Some(label) = diagnostic
        .primary
        .as_ref()
        .and_then(|label| json_label(label, sources))
    {
        line.push_str(&format!(" {}:{}:{}", label.file, label.line, label.column));
    } else if let Some(file) = &diagnostic.file {
        line.push_str(&format!(" {file}"));
    }
    line.push_str(": ");
    line.push_str(&for_terminal(&diagnostic.message));
    if let Some(help) = &diagnostic.help {
        line.push_str(&format!(" (help: {})", redact(help)));
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// All diagnostics as one JSON array; the primary label comes first in
/// `labels`. Words that look like API keys are masked, as in [`human`].
pub fn json<'a>(
    diagnostics: impl IntoIterator<Item = &'a Diagnostic>,
    sources: &'a SourceMap,
) -> String {
    json_of_files([(diagnostics, sources)])
}

/// The diagnostics of several files, each with its own sources, as one
/// JSON array in the same form as [`json`].
pub fn json_of_files<'a, D>(files: impl IntoIterator<Item = (D, &'a SourceMap)>) -> String
where
    D: IntoIterator<Item = &'a Diagnostic>,
{
    let items: Vec<JsonDiagnostic<'_>> = files
        .into_iter()
        .flat_map(|(diagnostics, sources)| json_items(diagnostics, sources))
        .collect();
    serde_json::to_string_pretty(&items).unwrap_or_else(|_| String::from("[]"))
}

/// The items of [`json`]'s array, for a command that embeds diagnostics in
/// a JSON document of its own: serialized as they are, they keep their
/// members in the same order.
pub fn json_items<'a>(
    diagnostics: impl IntoIterator<Item = &'a Diagnostic>,
    sources: &'a SourceMap,
) -> Vec<JsonDiagnostic<'a>> {
    diagnostics
        .into_iter()
        .map(|diagnostic| {
            let primary = diagnostic
                .primary
                .as_ref()
                .and_then(|label| json_label(label, sources));
            let (file, line, column) = primary
                .as_ref()
                .map_or((diagnostic.file.as_deref(), None, None), |label| {
                    (Some(label.file), Some(label.line), Some(label.column))
                });
            let labels = primary
                .into_iter()
                .chain(
                    diagnostic
                        .secondary
                        .iter()
                        .filter_map(|label| json_label(label, sources)),
                )
                .collect();
            JsonDiagnostic {
                code: diagnostic.code.id,
                severity: diagnostic.severity(),
                message: redact(&diagnostic.message),
                file,
                line,
                column,
                labels,
                help: diagnostic.help.as_deref().map(redact),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::codes;
    use crate::source::Span;

    /// A misspelt attribute in a one-file policy, with `help`.
    fn misspelt_attribute(help: &str) -> (Diagnostic, SourceMap) {
        let mut sources = SourceMap::new();
        let text = "order {\n  by provider.prioritty desc\n}\n";
        let id = sources.add("p.policy", text);
        let start = text.find("provider.").unwrap();
        let diagnostic = Diagnostic::new(codes::UNKNOWN_ATTRIBUTE, "unknown attribute")
            .at(id, Span::new(start, start + 18), "not a provider attribute")
            .help(help);
        (diagnostic, sources)
    }

    #[test]
    fn renders_location_caret_and_help() {
        let (diagnostic, sources) = misspelt_attribute("did you mean provider.priority?");
        let out = human(&diagnostic, &sources, Style::Plain);
        assert!(out.starts_with("error[E0302]: unknown attribute"), "{out}");
        assert!(out.contains("--> p.policy:2:6"), "{out}");
        assert!(
            out.contains("^^^^^^^^^^^^^^^^^^ not a provider attribute"),
            "{out}"
        );
        assert!(
            out.contains("= help: did you mean provider.priority?"),
            "{out}"
        );
    }

    #[test]
    fn one_line_keeps_code_location_message_and_help_on_one_line() {
        let (diagnostic, sources) = misspelt_attribute("did you mean\nprovider.priority?");
        assert_eq!(
            one_line(&diagnostic, &sources),
            "error[E0302] p.policy:2:6: unknown attribute (help: did you mean provider.priority?)"
        );
    }

    #[test]
    fn a_key_like_word_is_masked_wherever_it_is_printed() {
        let key = "sk-proj-AbCdEf0123456789AbCdEf";
        let mut sources = SourceMap::new();
        let text = format!("providers:\n  - {{id: a, api_key: {key}}}\n");
        let id = sources.add("catalog.yaml", &text);
        let start = text.find("api_key").unwrap();
        let diagnostic =
            Diagnostic::new(codes::DATA_UNKNOWN_FIELD, format!("unknown value `{key}`"))
                .at(id, Span::new(start, start + 7), format!("near {key}"))
                .help(format!("remove {key}"));
        let human = human(&diagnostic, &sources, Style::Plain);
        let json = json([&diagnostic], &sources);
        for out in [&human, &json] {
            assert!(!out.contains("AbCdEf"), "{out}");
            assert!(out.contains("sk-***************************"), "{out}");
        }
        // The caret still sits under `api_key`.
        let lines: Vec<&str> = human.lines().collect();
        let quoted = lines
            .iter()
            .position(|line| line.contains("api_key"))
            .unwrap();
        assert_eq!(
            lines[quoted].find("api_key"),
            lines[quoted + 1].find('^'),
            "{human}"
        );
    }

    #[test]
    fn a_crlf_file_is_quoted_without_its_carriage_returns() {
        let mut sources = SourceMap::new();
        let text = "policy p {\r\n  catalog \"data\r\n}\r\n";
        let id = sources.add("p.policy", text);
        // A string left open runs to the end of its line, carriage return
        // included.
        let start = text.find('"').unwrap();
        let end = text.find("\r\n}").unwrap() + 1;
        let diagnostic = Diagnostic::new(codes::SYNTAX, "unclosed string").at(
            id,
            Span::new(start, end),
            "opened here",
        );
        let out = human(&diagnostic, &sources, Style::Plain);
        assert!(!out.contains('\u{240d}') && !out.contains('\r'), "{out:?}");
        assert!(out.contains("^^^^^ opened here"), "{out}");
        assert!(!out.contains("^^^^^^ opened here"), "{out}");
        let json = json([&diagnostic], &sources);
        assert!(json.contains("\"end_column\": 16"), "{json}");
        // A carriage return that ends no line is kept.
        let lone = sources.add("q", "a\ré\r");
        let file = sources.file(lone).unwrap();
        assert_eq!(end_before_line_end(file, 0, 2), 2);
        assert_eq!(end_before_line_end(file, 0, 5), 4);
    }

    #[test]
    fn empty_span_at_end_of_file_points_at_last_character() {
        let mut sources = SourceMap::new();
        let id = sources.add("p", "abc");
        let diagnostic = Diagnostic::new(codes::SYNTAX, "x").at(id, Span::new(3, 3), "here");
        let out = human(&diagnostic, &sources, Style::Plain);
        assert!(out.contains("p:1:3"), "{out}");
    }

    #[test]
    fn json_lists_code_position_and_help() {
        let mut sources = SourceMap::new();
        let id = sources.add("p", "ab\ncd");
        let diagnostic = Diagnostic::new(codes::SYNTAX, "bad")
            .at(id, Span::new(3, 4), "here")
            .help("fix it");
        let out = json([&diagnostic], &sources);
        let value: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value[0]["code"], "E0101");
        assert_eq!(value[0]["line"], 2);
        assert_eq!(value[0]["column"], 1);
        assert_eq!(value[0]["help"], "fix it");
        assert_eq!(summary(1, 2), "1 error, 2 warnings");
    }
}
