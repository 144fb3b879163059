//! A lexical pass over policy text: finds strings, comments and brackets so
//! that a file with syntax errors can be cut into sections and statements and
//! each piece parsed on its own. This is how one run reports every mistake in
//! a file instead of stopping at the first.

use crate::diagnostics::{Diagnostic, codes};
use crate::source::{SourceId, Span};
use std::ops::Range;

/// Deepest bracket nesting accepted; deeper text is refused before parsing so
/// no recursive stage can run out of stack.
pub const MAX_NESTING: usize = 48;

/// The keywords that begin a top-level section.
pub const SECTION_KEYWORDS: &[&str] = &[
    "policy",
    "models",
    "input",
    "validate",
    "defaults",
    "merge",
    "let",
    "eligibility",
    "order",
    "sort",
    "balance",
    "failover",
    "health",
    "capacity",
    "timeouts",
    "stream",
    "errors",
    "headers",
    "listing",
];

/// The first token of a line: where it starts, its bracket depth, its column
/// and its text.
#[derive(Debug, Clone)]
pub struct LineStart {
    pub offset: usize,
    pub depth: usize,
    pub column: usize,
    pub word: String,
    /// Whether the token after the first word is `=` (not `==`): the start of
    /// an `errors`, `merge` or `headers` entry.
    pub assigns: bool,
}

#[derive(Debug, Default)]
pub struct Scan {
    pub lines: Vec<LineStart>,
    pub problems: Vec<Diagnostic>,
}

fn word_at(text: &str, offset: usize) -> (String, bool) {
    let rest = text.get(offset..).unwrap_or("");
    let word_len = if rest.starts_with('"') {
        // A quoted name, as in `headers`: include the closing quote.
        rest.get(1..)
            .and_then(|tail| tail.find(['"', '\n']))
            .map_or(rest.len(), |end| end + 2)
    } else {
        rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len())
    };
    let word = rest.get(..word_len).unwrap_or("").to_string();
    let after = rest
        .get(word_len..)
        .unwrap_or("")
        .trim_start_matches([' ', '\t']);
    let assigns = after.starts_with('=') && !after.starts_with("==") && !after.starts_with("=>");
    (word, assigns)
}

/// Scans `text` (which starts at byte `base` of its file).
pub fn scan(source: SourceId, base: usize, text: &str) -> Scan {
    let mut result = Scan::default();
    let mut stack: Vec<(char, usize)> = Vec::new();
    let mut string_start: Option<usize> = None;
    let mut in_comment = false;
    let mut at_line_start = true;
    let mut column = 0usize;
    let mut reported_depth = false;

    for (at, c) in text.char_indices() {
        if c == '\n' {
            if let Some(start) = string_start.take() {
                result.problems.push(
                    Diagnostic::new(codes::UNTERMINATED_STRING, "this string is not closed on its line")
                        .at(source, Span::new(base + start, base + at), "string starts here")
                        .help("close it with `\"`; strings cannot span lines, write `\\n` for a line break"),
                );
            }
            in_comment = false;
            at_line_start = true;
            column = 0;
            continue;
        }
        column += 1;
        if in_comment {
            continue;
        }
        if let Some(_start) = string_start {
            if c == '"' && !escaped(text, at) {
                string_start = None;
            }
            continue;
        }
        if at_line_start && !c.is_whitespace() {
            at_line_start = false;
            if c != '#' {
                let (word, assigns) = word_at(text, at);
                result.lines.push(LineStart {
                    offset: at,
                    depth: stack.len(),
                    column,
                    word,
                    assigns,
                });
            }
        }
        match c {
            '#' => in_comment = true,
            '"' => string_start = Some(at),
            '{' | '(' | '[' => {
                stack.push((c, at));
                if stack.len() > MAX_NESTING && !reported_depth {
                    reported_depth = true;
                    result.problems.push(
                        Diagnostic::new(codes::TOO_DEEP, "brackets are nested too deeply")
                            .at(source, Span::new(base + at, base + at + 1), "too deep here")
                            .help(format!(
                                "policies may nest brackets at most {MAX_NESTING} deep; split the expression into `let` definitions"
                            )),
                    );
                }
            }
            '}' | ')' | ']' => {
                let expected_open = match c {
                    '}' => '{',
                    ')' => '(',
                    _ => '[',
                };
                match stack.last() {
                    Some((open, _)) if *open == expected_open => {
                        stack.pop();
                    }
                    Some((open, open_at)) => {
                        let open_at = *open_at;
                        let open = *open;
                        result.problems.push(
                            Diagnostic::new(
                                codes::UNCLOSED_BLOCK,
                                format!("`{c}` does not close `{open}`"),
                            )
                            .at(source, Span::new(base + at, base + at + 1), "mismatched")
                            .also(
                                source,
                                Span::new(base + open_at, base + open_at + 1),
                                "opened here",
                            )
                            .help(format!("close `{open}` with `{}` first", closer(open))),
                        );
                        stack.pop();
                    }
                    None => result.problems.push(
                        Diagnostic::new(
                            codes::UNCLOSED_BLOCK,
                            format!("`{c}` has nothing to close"),
                        )
                        .at(source, Span::new(base + at, base + at + 1), "unexpected")
                        .help("remove it, or add the opening bracket it belongs to"),
                    ),
                }
            }
            _ => {}
        }
    }
    if let Some(start) = string_start {
        result.problems.push(
            Diagnostic::new(codes::UNTERMINATED_STRING, "this string is not closed")
                .at(
                    source,
                    Span::new(base + start, base + text.len()),
                    "string starts here",
                )
                .help("close it with `\"`"),
        );
    }
    for (open, at) in stack {
        result.problems.push(
            Diagnostic::new(
                codes::UNCLOSED_BLOCK,
                format!("this `{open}` is never closed"),
            )
            .at(source, Span::new(base + at, base + at + 1), "opened here")
            .help(format!("add `{}` where it ends", closer(open))),
        );
    }
    result
}

/// Most bracket problems reported for one file: past a few, each is the
/// same mistake again (a file of 100,000 `(` had as many errors, 10 MB).
const MAX_BRACKET_PROBLEMS: usize = 20;

/// Keeps the first [`MAX_BRACKET_PROBLEMS`] bracket problems, and says how
/// many more there were where the first left out is. Only what is shown is
/// cut: every problem still holds back the syntax errors it explains.
pub fn limit_bracket_problems(problems: &mut Vec<Diagnostic>) {
    let mut seen = 0usize;
    let mut first_left_out = None;
    problems.retain(|problem| {
        if problem.code != codes::UNCLOSED_BLOCK {
            return true;
        }
        seen += 1;
        if seen == MAX_BRACKET_PROBLEMS + 1 {
            first_left_out = problem.primary.clone();
        }
        seen <= MAX_BRACKET_PROBLEMS
    });
    let left_out = seen.saturating_sub(MAX_BRACKET_PROBLEMS);
    if let Some(label) = first_left_out {
        problems.push(
            Diagnostic::new(
                codes::UNCLOSED_BLOCK,
                format!("{left_out} more brackets do not match; the first {MAX_BRACKET_PROBLEMS} are shown"),
            )
            .at(label.source, label.span, "the next one")
            .help("fix those shown, then check again"),
        );
    }
}

fn closer(open: char) -> char {
    match open {
        '{' => '}',
        '(' => ')',
        _ => ']',
    }
}

/// Whether the quote at `at` is escaped by an odd number of backslashes.
fn escaped(text: &str, at: usize) -> bool {
    let before = text.get(..at).unwrap_or("");
    before.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1
}

/// Cuts a file into top-level sections: a section begins at a line whose
/// first word is a section keyword, at bracket depth 0 — or in column 1 when
/// an earlier bracket was left open, so one unclosed block does not swallow
/// the rest of the file.
pub fn sections(text: &str, scan: &Scan) -> Vec<Range<usize>> {
    let starts: Vec<usize> = scan
        .lines
        .iter()
        .filter(|line| {
            SECTION_KEYWORDS.contains(&line.word.as_str()) && (line.depth == 0 || line.column == 1)
        })
        .map(|line| line.offset)
        .collect();
    cut(text, &starts)
}

/// Cuts the body of a block into statements: a statement begins at a line
/// (at the body's own depth) that starts with one of the block's statement
/// keywords or, for blocks of `name = ...` entries, with a name and `=`.
pub fn statements(body: &str, scan: &Scan, keywords: Option<&[&str]>) -> Vec<Range<usize>> {
    let mut starts: Vec<usize> = scan
        .lines
        .iter()
        .filter(|line| line.depth == 0)
        .filter(|line| match keywords {
            Some(words) => words.contains(&line.word.as_str()),
            None => line.assigns,
        })
        .map(|line| line.offset)
        .collect();
    // Text on the same line as the opening brace is a statement too.
    let first_token = body
        .char_indices()
        .find(|(_, c)| !c.is_whitespace())
        .map(|(at, _)| at);
    if let Some(first) = first_token
        && !body[first..].starts_with('#')
        && starts.first() != Some(&first)
    {
        starts.insert(0, first);
    }
    cut(body, &starts)
}

/// Non-empty ranges between consecutive starts; text before the first start
/// that is not blank or a comment becomes a range of its own.
fn cut(text: &str, starts: &[usize]) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let first = starts.first().copied().unwrap_or(text.len());
    if !is_blank(text.get(..first).unwrap_or("")) {
        ranges.push(0..first);
    }
    for (index, &start) in starts.iter().enumerate() {
        let end = starts.get(index + 1).copied().unwrap_or(text.len());
        if start < end {
            ranges.push(start..end);
        }
    }
    ranges
}

/// Whether text holds nothing but whitespace and comments.
pub fn is_blank(text: &str) -> bool {
    text.lines().all(|line| {
        let line = line.trim_start();
        line.is_empty() || line.starts_with('#')
    })
}

/// The range of a block's body: after its first `{` at depth 0 up to the
/// matching `}` (or the end of the text when it is never closed).
pub fn block_body(text: &str) -> Option<Range<usize>> {
    let mut depth = 0usize;
    let mut open = None;
    let mut in_string = false;
    let mut in_comment = false;
    for (at, c) in text.char_indices() {
        if in_comment {
            in_comment = c != '\n';
            continue;
        }
        if in_string {
            in_string = (c != '"' || escaped(text, at)) && c != '\n';
            continue;
        }
        match c {
            '#' => in_comment = true,
            '"' => in_string = true,
            '{' | '(' | '[' => {
                if depth == 0 && c == '{' && open.is_none() {
                    open = Some(at + 1);
                }
                depth += 1;
            }
            '}' | ')' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0
                    && c == '}'
                    && let Some(start) = open
                {
                    return Some(start..at);
                }
            }
            _ => {}
        }
    }
    open.map(|start| start..text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceMap;

    fn id() -> SourceId {
        SourceMap::new().add("t", "")
    }

    #[test]
    fn a_flood_of_bracket_problems_is_cut_short() {
        let text = "(".repeat(1000);
        let mut problems = scan(id(), 0, &text).problems;
        limit_bracket_problems(&mut problems);
        let brackets = problems
            .iter()
            .filter(|p| p.code == codes::UNCLOSED_BLOCK)
            .count();
        assert_eq!(brackets, MAX_BRACKET_PROBLEMS + 1);
        let last = problems.last().map(|p| p.message.as_str());
        assert_eq!(
            last,
            Some("980 more brackets do not match; the first 20 are shown")
        );
    }

    #[test]
    fn cuts_sections_at_top_level_keywords_only() {
        let text = "policy p {\n  catalog \"c\"\n}\norder {\n  by x\n}\nlet a = 1\n";
        let scan = scan(id(), 0, text);
        let cuts: Vec<&str> = sections(text, &scan)
            .into_iter()
            .map(|r| &text[r])
            .collect();
        assert_eq!(cuts.len(), 3);
        assert!(cuts[1].starts_with("order"));
        assert!(cuts[2].starts_with("let"));
    }

    #[test]
    fn an_unclosed_block_does_not_swallow_later_sections() {
        let text = "order {\n  by x\nlet a = 1\n";
        let scan = scan(id(), 0, text);
        assert_eq!(sections(text, &scan).len(), 2);
        assert_eq!(scan.problems.len(), 1);
        assert_eq!(scan.problems[0].code, codes::UNCLOSED_BLOCK);
    }

    #[test]
    fn strings_and_comments_hide_brackets() {
        let text = "let a = \"{\" # }\n";
        assert!(scan(id(), 0, text).problems.is_empty());
        let text = "let a = \"oops\nlet b = 1\n";
        assert_eq!(
            scan(id(), 0, text).problems[0].code,
            codes::UNTERMINATED_STRING
        );
    }

    #[test]
    fn statements_split_on_keywords_and_assignments() {
        let body = " by a\n  by b desc\n    and c\n";
        let s = scan(id(), 0, body);
        assert_eq!(statements(body, &s, Some(&["by"])).len(), 2);
        let body = "\n  a = 400, \"x\"\n  b = 500,\n    \"y\"\n  c == d\n";
        let s = scan(id(), 0, body);
        assert_eq!(statements(body, &s, None).len(), 2);
    }

    #[test]
    fn block_body_matches_braces() {
        let text = "order { by f({a: 1}) } trailing";
        let body = block_body(text).unwrap();
        assert_eq!(&text[body], " by f({a: 1}) ");
    }

    #[test]
    fn too_deep_nesting_is_reported_once() {
        let text = format!("let a = {}1{}", "(".repeat(60), ")".repeat(60));
        let problems = scan(id(), 0, &text).problems;
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].code, codes::TOO_DEEP);
    }
}
