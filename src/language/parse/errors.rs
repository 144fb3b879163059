//! Turns pest's parse errors into diagnostics that speak the policy language:
//! "expected `else`, found `els`" rather than a list of grammar rule names.

use super::Rule;
use crate::diagnostics::{Diagnostic, codes};
use crate::source::{SourceId, Span};
use pest::Parser;
use pest::error::{ErrorVariant, InputLocation};
use std::collections::BTreeSet;

/// What the user should read for a grammar rule the parser expected, or
/// `None` for rules that are implementation detail.
fn describe(rule: Rule) -> Option<String> {
    let name = format!("{rule:?}");
    if let Some(word) = name.strip_prefix("kw_") {
        return Some(format!("`{word}`"));
    }
    Some(
        match rule {
            Rule::EOI => END_OF_FILE,
            Rule::expr | Rule::expr_only | Rule::path | Rule::if_expr | Rule::call => {
                "an expression"
            }
            Rule::ident | Rule::any_ident => "a name",
            Rule::string => "a string",
            Rule::number | Rule::duration | Rule::percent => "a number",
            Rule::sort_key | Rule::sort_keys => "a sort key",
            Rule::direction => "`asc` or `desc`",
            Rule::nulls_clause => "`nulls first` or `nulls last`",
            Rule::nulls_position => "`first` or `last`",
            Rule::status_pattern | Rule::outcome_class => {
                "an outcome such as `429`, `5xx` or `timeout`"
            }
            Rule::outcome_list => "an outcome",
            Rule::merge_op => {
                "a merge operator (`intersect`, `union`, `min`, `max`, `all`, `any`, `first`)"
            }
            Rule::simple_strategy | Rule::weighted_strategy | Rule::share_strategy => {
                "a balance strategy"
            }
            Rule::scope => "`route`, `provider` or `credential`",
            Rule::timeout_name => {
                "a timeout (`connect`, `headers`, `first_token`, `idle`, `attempt`)"
            }
            Rule::list_type
            | Rule::csv_type
            | Rule::object_type
            | Rule::enum_type
            | Rule::int_range
            | Rule::like_type
            | Rule::named_type => "a type",
            Rule::next_action
            | Rule::stop_action
            | Rule::retry_action
            | Rule::pause_effect
            | Rule::penalize_effect
            | Rule::error_effect => {
                "a consequence (`next`, `stop`, `retry`, `pause`, `penalize`, `error`)"
            }
            Rule::policy_decl
            | Rule::models_block
            | Rule::input_decl
            | Rule::validate_block
            | Rule::defaults_block
            | Rule::merge_block
            | Rule::let_decl
            | Rule::eligibility_block
            | Rule::order_block
            | Rule::sort_decl
            | Rule::balance_decl
            | Rule::failover_block
            | Rule::health_block
            | Rule::capacity_block
            | Rule::timeouts_block
            | Rule::stream_block
            | Rule::errors_block
            | Rule::headers_block
            | Rule::listing_block => "a section such as `eligibility { ... }`",
            Rule::layer => "a layer (`key`, `workspace`, `tenant`, optionally `.model`)",
            Rule::policy_setting | Rule::policy_setting_only => "`catalog` or `tenants`",
            Rule::error_decl => "an error declaration `name = status, message`",
            Rule::header_decl => "a field `\"name\" = value`",
            Rule::op_implies
            | Rule::op_or
            | Rule::op_and
            | Rule::op_eq
            | Rule::op_ne
            | Rule::op_le
            | Rule::op_ge
            | Rule::op_lt
            | Rule::op_gt
            | Rule::op_not_in
            | Rule::op_in
            | Rule::op_add
            | Rule::op_sub
            | Rule::op_mul
            | Rule::op_div => "an operator",
            _ => return None,
        }
        .to_string(),
    )
}

/// Where the last token of `text` ends, before the blanks and comments
/// that follow it: where a statement cut short is missing its rest.
fn end_of_code(text: &str) -> usize {
    let mut end = 0;
    let (mut in_string, mut escaped, mut in_comment) = (false, false, false);
    for (at, c) in text.char_indices() {
        if in_comment {
            in_comment = c != '\n';
        } else if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            end = at + c.len_utf8();
        } else if c == '#' {
            in_comment = true;
        } else if !c.is_whitespace() {
            in_string = c == '"';
            end = at + c.len_utf8();
        }
    }
    end
}

const END_OF_FILE: &str = "end of file";
const END_OF_LINE: &str = "end of line";

/// The token at `offset`, for "found ..." in messages, with its length.
fn found_at(text: &str, offset: usize) -> (String, usize) {
    let rest = text.get(offset..).unwrap_or("");
    let Some(first) = rest.chars().next() else {
        return (String::from(END_OF_FILE), 0);
    };
    let length = if first.is_alphanumeric() || first == '_' {
        rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '%'))
            .unwrap_or(rest.len())
    } else {
        first.len_utf8()
    };
    let token = rest.get(..length).unwrap_or("");
    if first == '\n' || first == '\r' {
        (String::from(END_OF_LINE), 0)
    } else if first != ' ' && (first.is_whitespace() || first.is_control() || is_invisible(first)) {
        // Shown between backticks it would look like nothing, or a space.
        (
            format!("the invisible character U+{:04X}", u32::from(first)),
            length,
        )
    } else {
        (format!("`{token}`"), length)
    }
}

/// Characters that print as nothing: zero-width spaces and joiners, the
/// byte-order mark, directional marks.
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}')
}

/// At most this many things are named after "expected": every section
/// keyword fits (19), so a mistake between sections lists them all.
const MAX_EXPECTED: usize = 24;

/// The word that ends at `position`, with where it starts, if it is one
/// of the grammar's reserved words.
fn reserved_word_before(text: &str, position: usize) -> Option<(usize, &str)> {
    let before = text.get(..position)?;
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |at| at + 1);
    let word = before.get(start..)?;
    let whole = super::PolicyParser::parse(Rule::reserved, word)
        .is_ok_and(|pairs| pairs.as_str().len() == word.len());
    (!word.is_empty() && whole).then_some((start, word))
}

/// "a, b or c"; a count of more things (`N more`) goes last.
fn join_expected(expected: &BTreeSet<String>) -> String {
    let (more, named): (Vec<&String>, Vec<&String>) =
        expected.iter().partition(|item| item.ends_with(" more"));
    let items: Vec<&String> = named.into_iter().chain(more).collect();
    match items.as_slice() {
        [] => String::new(),
        [only] => (*only).clone(),
        [init @ .., last] => {
            let head: Vec<&str> = init.iter().map(|s| s.as_str()).collect();
            format!("{} or {}", head.join(", "), last)
        }
    }
}

/// Where pest reports the parse of a chunk failed.
fn reported_at(error: &pest::error::Error<Rule>) -> usize {
    match error.location {
        InputLocation::Pos(at) => at,
        InputLocation::Span((start, _)) => start,
    }
}

/// Where the parse of a chunk failed: the furthest point its attempts
/// reached, which is past the reported position when an enclosing rule
/// failed, and there the mistake is.
fn failed_at(error: &pest::error::Error<Rule>) -> usize {
    let reported = reported_at(error);
    error
        .parse_attempts()
        .map_or(reported, |attempts| attempts.max_position.max(reported))
}

/// A line of a block's statement that begins with a word no statement of
/// the block begins with, where the parse of the statement stopped, after
/// lines that are a whole statement (`statement` parses them), and no
/// further in than the statement began (`column`): most likely a statement
/// misnamed (`total 20s` in `timeouts`). After lines that are not whole,
/// or indented as their continuation, the line is the rest of theirs,
/// misspelt (`els`, `whn`, `nd`), and the parser's own "expected …" says
/// more. `text` starts at byte `offset` of its file.
pub fn unknown_statement(
    source: SourceId,
    (offset, column): (usize, usize),
    text: &str,
    error: &pest::error::Error<Rule>,
    (block, keywords, statement): (&str, &[&str], Rule),
) -> Option<Diagnostic> {
    let position = failed_at(error);
    let before = text.get(..position)?;
    let line_start = before.rfind('\n')? + 1;
    let indent = before.get(line_start..)?;
    if !indent.chars().all(char::is_whitespace) || indent.chars().count() > column {
        return None;
    }
    let above = before.get(..line_start)?;
    if super::PolicyParser::parse(statement, above).is_err() {
        return None;
    }
    let rest = text.get(position..)?;
    let word_length = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let word = rest.get(..word_length)?;
    if word.is_empty() || keywords.contains(&word) {
        return None;
    }
    let listed: Vec<String> = keywords.iter().map(|word| format!("`{word}`")).collect();
    let help = match crate::diagnostics::suggest(word, keywords.iter().copied()) {
        Some(close) => format!("did you mean `{close}`? see docs/language.md for `{block}`"),
        None => format!(
            "each statement of `{block}` begins with one of these words; see docs/language.md"
        ),
    };
    Some(
        Diagnostic::new(
            codes::SYNTAX,
            format!(
                "expected a statement of `{block}` ({}), found `{word}`",
                join_expected(&listed.into_iter().collect())
            ),
        )
        .at(
            source,
            Span::new(offset + position, offset + position + word_length),
            format!("not a statement of `{block}`"),
        )
        .help(help),
    )
}

/// Converts a pest error on `text` (a chunk that starts at byte `offset` of
/// its file, and ends the file or not) into a syntax diagnostic.
pub fn syntax_error(
    source: SourceId,
    (offset, ends_the_file): (usize, bool),
    text: &str,
    error: &pest::error::Error<Rule>,
) -> Diagnostic {
    let reported = reported_at(error);
    // pest stops (instead of overflowing its stack) on text nested beyond
    // what the stack holds; say so rather than "expected …".
    if let ErrorVariant::CustomError { message } = &error.variant
        && (message.contains("stack limit") || message.contains("call limit"))
    {
        let at = offset + reported.min(text.len());
        return Diagnostic::new(codes::TOO_DEEP, "this is nested too deeply to parse")
            .at(source, Span::new(at, at), "too deep here")
            .help("split it into `let` definitions");
    }
    let mut position = failed_at(error);
    let mut expected = BTreeSet::new();
    // What pest expected where it reports, unless the attempts reached
    // further: then only what they expected there counts.
    if let ErrorVariant::ParsingError { positives, .. } = &error.variant
        && position == reported
    {
        expected.extend(positives.iter().filter_map(|rule| describe(*rule)));
    }
    if let Some(attempts) = error.parse_attempts() {
        for stack in &attempts.call_stacks {
            if let Some(description) = stack.parent.and_then(describe) {
                expected.insert(description);
            }
        }
        for token in attempts.expected_tokens() {
            // Only punctuation: words are already named by their keyword rules.
            let token = token.to_string();
            let trimmed = token.trim();
            let operator = matches!(
                trimmed,
                "#" | "==" | "!=" | "<=" | ">=" | "<" | ">" | "+" | "-" | "*" | "/" | "(" | "."
            );
            if !operator && !trimmed.is_empty() && trimmed.chars().all(|c| !c.is_alphanumeric()) {
                expected.insert(format!("`{trimmed}`"));
            }
        }
    }
    // Expressions can continue almost anywhere; naming every operator buries
    // what the user most likely needs.
    if expected.len() > 1 {
        expected.remove("an operator");
    }
    // The characters a name or an expression may begin with are named by
    // those words already.
    if expected.contains("a name") || expected.contains("an expression") {
        expected.remove("`_`");
    }
    if expected.contains("an expression") || expected.contains("a string") {
        expected.remove("`\"`");
    }
    if expected.contains("an expression") {
        expected.remove("`[`");
    }
    // A statement's or a section's text ends at its line, not the file's
    // end; with nothing but blanks and comments left, it stopped short.
    let at_chunk_end = text.get(position..).is_some_and(super::recover::is_blank);
    if !ends_the_file && expected.remove(END_OF_FILE) {
        expected.insert(String::from(END_OF_LINE));
    }
    if at_chunk_end {
        position = end_of_code(text);
    }
    // The parser tried to read a name, matched a reserved word, and wanted
    // the word to go on: "expected `_`" would send the reader looking for
    // a missing underscore.
    if expected.len() == 1
        && expected.contains("`_`")
        && let Some((start, word)) = reserved_word_before(text, position)
    {
        return Diagnostic::new(
            codes::SYNTAX,
            format!("`{word}` is a reserved word and cannot be a name"),
        )
        .at(
            source,
            Span::new(offset + start, offset + position),
            "reserved",
        )
        .help("choose another name; docs/language.md lists the reserved words");
    }
    if let Some(diagnostic) = malformed_literal(source, offset, text, position) {
        return diagnostic;
    }
    if let Some(diagnostic) = unknown_escape_or_letter(source, offset, text, position) {
        return diagnostic;
    }
    if expected.len() > MAX_EXPECTED {
        let more = expected.len() - MAX_EXPECTED;
        let keep: BTreeSet<String> = expected.iter().take(MAX_EXPECTED).cloned().collect();
        expected = keep;
        expected.insert(format!("{more} more"));
    }
    // Stopped inside a word, past a keyword it begins with (`andd` read as
    // `and` then `d`): the word is what is wrong, whole.
    let is_word_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if expected.is_empty()
        && !at_chunk_end
        && text
            .get(position..)
            .and_then(|rest| rest.chars().next())
            .is_some_and(is_word_char)
        && let Some(before) = text.get(..position)
        && before.chars().next_back().is_some_and(is_word_char)
    {
        position = before
            .rfind(|c: char| !is_word_char(c))
            .map_or(0, |at| at + 1);
    }
    let (found, length) = match (at_chunk_end, ends_the_file) {
        (true, false) => (String::from(END_OF_LINE), 0),
        (true, true) => (String::from(END_OF_FILE), 0),
        (false, _) => found_at(text, position),
    };
    let span = Span::new(offset + position, offset + position + length);
    // A word where a keyword or punctuation belongs: most often a keyword
    // misspelt.
    let word = text.get(position..position + length).unwrap_or("");
    let is_keyword = keywords().iter().any(|keyword| keyword == word);
    // The words the parser names as expected, if it names any: a
    // suggestion among them, not among every keyword (`avg` where a merge
    // operator belongs is not `and`).
    let named: Vec<&str> = expected
        .iter()
        .flat_map(|entry| entry.split('`').skip(1).step_by(2))
        .filter(|quoted| quoted.chars().all(|c| c.is_ascii_alphabetic() || c == '_'))
        .collect();
    let candidates: Vec<&str> = if named.is_empty() {
        keywords().iter().map(String::as_str).collect()
    } else {
        named
    };
    let help = match crate::diagnostics::suggest(word, candidates.iter().copied()) {
        Some(close)
            if !is_keyword
                && !word.is_empty()
                && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            format!("did you mean `{close}`? see docs/language.md for the form of each statement")
        }
        _ => String::from("see docs/language.md for the form of each statement"),
    };
    let message = if expected.is_empty() {
        format!("unexpected {found}")
    } else {
        format!("expected {}, found {found}", join_expected(&expected))
    };
    Diagnostic::new(codes::SYNTAX, message)
        .at(source, span, "unexpected here")
        .help(help)
}

/// Two mistakes the parser can only call "unexpected": a backslash in a
/// string before a character that is no escape (`"a\qb"`), and a letter
/// outside ASCII in a name (`let café`).
fn unknown_escape_or_letter(
    source: SourceId,
    offset: usize,
    text: &str,
    position: usize,
) -> Option<Diagnostic> {
    let before = text.get(..position)?;
    let next = text.get(position..)?.chars().next()?;
    if before.ends_with('\\') {
        let start = position - 1;
        let span = Span::new(offset + start, offset + position + next.len_utf8());
        return Some(
            Diagnostic::new(
                codes::SYNTAX,
                format!("`\\{next}` is not an escape in a string"),
            )
            .at(source, span, "unknown escape")
            .help("a string's escapes are `\\\"`, `\\\\`, `\\n` and `\\t`; write `\\\\` for a backslash"),
        );
    }
    let name_start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |at| at + 1);
    let in_a_name = name_start < position;
    if in_a_name && next.is_alphabetic() && !next.is_ascii() {
        let rest = text.get(position..).unwrap_or("");
        let end = position
            + rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
        let word = text.get(name_start..end).unwrap_or("");
        return Some(
            Diagnostic::new(codes::SYNTAX, format!("`{word}` is not a name"))
                .at(
                    source,
                    Span::new(offset + position, offset + position + next.len_utf8()),
                    "not an ASCII letter",
                )
                .help("names use ASCII letters, digits and `_`, and begin with a letter or `_`"),
        );
    }
    None
}

/// The words operators and literals are spelt with; the grammar's
/// `op_`, `boolean` and `null` rules, whose names are not the words.
const OPERATOR_WORDS: [&str; 8] = ["and", "or", "not", "in", "implies", "true", "false", "null"];

/// Words the grammar matches inside a rule of its own rather than as a
/// `kw_` rule: a sort key's direction.
const DIRECTION_WORDS: [&str; 2] = ["asc", "desc"];

/// The language's keywords: the grammar's `kw_` rules, and the words of its
/// operators, literals and directions.
fn keywords() -> &'static [String] {
    static KEYWORDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    KEYWORDS.get_or_init(|| {
        Rule::all_rules()
            .iter()
            .filter_map(|rule| format!("{rule:?}").strip_prefix("kw_").map(String::from))
            .chain(OPERATOR_WORDS.iter().map(|word| word.to_string()))
            .chain(DIRECTION_WORDS.iter().map(|word| word.to_string()))
            .collect()
    })
}

/// A number, duration or status pattern the parser stopped inside: the
/// literal's own diagnostic (`E0105`, `E0104`) says more than the
/// parser's "expected …". `position` may be inside the word or at its end.
fn malformed_literal(
    source: SourceId,
    offset: usize,
    text: &str,
    position: usize,
) -> Option<Diagnostic> {
    let word_char = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '_';
    let before = text.get(..position)?;
    let start = before.rfind(|c: char| !word_char(c)).map_or(0, |at| at + 1);
    let after = text.get(position..)?;
    let end = position + after.find(|c: char| !word_char(c)).unwrap_or(after.len());
    let word = text.get(start..end)?;
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    // Inside a string (an odd number of quotes before it on its line), a
    // word is the string's text, not a literal.
    let quotes = text
        .get(line_start..start)?
        .replace("\\\\", "")
        .replace("\\\"", "")
        .matches('"')
        .count();
    if quotes % 2 == 1 {
        return None;
    }
    let is_whole = |rule: Rule| {
        super::PolicyParser::parse(rule, word).is_ok_and(|pairs| pairs.as_str().len() == word.len())
    };
    if !word.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let span = Span::new(offset + start, offset + end);
    // In an `on` rule's outcomes: between the last `on` and the word only
    // outcomes, commas and line breaks (a list may wrap), not a `when`.
    let before_word = text.get(..start)?;
    let outcome_text = before_word.trim_end_matches(|c: char| {
        c.is_ascii_alphanumeric() || c == '_' || c == ',' || c.is_whitespace()
    });
    let list = before_word.get(outcome_text.len()..)?;
    let words: Vec<&str> = list
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
        .collect();
    let in_outcomes = words
        .iter()
        .rposition(|item| *item == "on")
        .is_some_and(|at| {
            words
                .get(at..)
                .is_some_and(|after| !after.contains(&"when") && !after.contains(&"=>"))
        })
        // Meant as a status or a class (`5xy`, `4xx5`), not a word.
        && word.starts_with(|c: char| c.is_ascii_digit());
    // A well-formed literal in the wrong place is the parser's to explain.
    if in_outcomes {
        if is_whole(Rule::status_pattern) {
            return None;
        }
        return Some(
            Diagnostic::new(
                codes::BAD_STATUS_PATTERN,
                format!("`{word}` is not an HTTP status or status class"),
            )
            .at(source, span, "not a status")
            .help(
                "write a status from 100 to 599 such as `429`, or a class such as `5xx` or `40x`",
            ),
        );
    }
    let well_formed = [Rule::number, Rule::duration, Rule::percent]
        .into_iter()
        .any(is_whole);
    if !well_formed && word.contains(|c: char| c.is_ascii_alphabetic()) {
        return Some(
            Diagnostic::new(
                codes::BAD_LITERAL,
                format!("`{word}` is not a number or a duration"),
            )
            .at(source, span, "malformed")
            .help("a duration is a number and a unit: `ms`, `s`, `m`, `h` or `d`, such as `250ms` or `10s`"),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_of_more_things_goes_last() {
        let expected: BTreeSet<String> = ["`b`", "3 more", "`a`"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(join_expected(&expected), "`a`, `b` or 3 more");
    }

    #[test]
    fn only_a_whole_reserved_word_counts() {
        assert_eq!(reserved_word_before("let where", 9), Some((4, "where")));
        assert_eq!(reserved_word_before("let wherever", 12), None);
        assert_eq!(reserved_word_before("let x_in", 8), None);
        assert_eq!(reserved_word_before("in", 2), Some((0, "in")));
        assert_eq!(reserved_word_before("let ", 4), None);
    }
}
