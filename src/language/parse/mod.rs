//! Text → syntax tree. This module is the only one that sees pest: the rest of
//! the crate works on [`crate::language::ast`].
//!
//! A clean file is parsed in one pass. A file with syntax errors is cut into
//! sections and statements (see [`recover`]) which are parsed one by one, so a
//! single run reports every mistake and the checker still sees every
//! statement that parsed.

mod errors;
mod lower;
mod recover;

use crate::diagnostics::Diagnostic;
use crate::language::ast::*;
use crate::source::{SourceId, Span};
use lower::{BlockKind, Lowerer, Statement};
use pest::Parser;
use std::sync::Once;

pub use lower::parse_expression;

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/policy.pest"]
pub(crate) struct PolicyParser;

/// The result of parsing one policy file.
#[derive(Debug, Default)]
pub struct Parsed {
    pub file: PolicyFile,
    pub diagnostics: Vec<Diagnostic>,
    /// Names whose definitions did not parse. The checker treats uses of them
    /// as defined, so one typo does not cascade into "unknown name" errors.
    pub broken_names: Vec<String>,
}

static ERROR_DETAIL: Once = Once::new();

pub fn parse(source: SourceId, text: &str) -> Parsed {
    ERROR_DETAIL.call_once(|| pest::set_error_detail(true));
    let scan = recover::scan(source, 0, text);
    if scan
        .problems
        .iter()
        .any(|problem| problem.code == crate::diagnostics::codes::TOO_DEEP)
    {
        return Parsed {
            diagnostics: scan.problems,
            ..Parsed::default()
        };
    }
    match PolicyParser::parse(Rule::file, text) {
        Ok(mut pairs) => {
            let lowerer = Lowerer::new(source, 0);
            let file = pairs
                .next()
                .map(|pair| lowerer.file(pair))
                .unwrap_or_default();
            let mut diagnostics = scan.problems;
            diagnostics.extend(lowerer.diagnostics.into_inner());
            Parsed {
                file,
                diagnostics,
                broken_names: lowerer.broken_names.into_inner(),
            }
        }
        Err(whole_file_error) => {
            let mut parsed = Recovery::new(source, text, scan).run();
            if parsed.diagnostics.is_empty() {
                parsed.diagnostics.push(errors::syntax_error(
                    source,
                    (0, true),
                    text,
                    &whole_file_error,
                ));
            }
            parsed
        }
    }
}

/// Parses a file with errors piece by piece.
struct Recovery<'t> {
    source: SourceId,
    text: &'t str,
    delimiter_problems: Vec<Span>,
    parsed: Parsed,
}

impl<'t> Recovery<'t> {
    fn new(source: SourceId, text: &'t str, scan: recover::Scan) -> Recovery<'t> {
        let delimiter_problems = scan
            .problems
            .iter()
            .filter_map(|problem| problem.primary.as_ref().map(|label| label.span))
            .collect();
        let sections = recover::sections(text, &scan);
        let mut shown = scan.problems;
        recover::limit_bracket_problems(&mut shown);
        let mut recovery = Recovery {
            source,
            text,
            delimiter_problems,
            parsed: Parsed {
                diagnostics: shown,
                ..Parsed::default()
            },
        };
        for range in sections {
            recovery.section(range.start, range.end);
        }
        recovery
    }

    fn run(mut self) -> Parsed {
        self.parsed
            .diagnostics
            .sort_by_key(|d| d.primary.as_ref().map(|label| label.span.start));
        self.parsed
    }

    /// Whether a bracket or string problem already explains an error here.
    fn explained(&self, start: usize, end: usize) -> bool {
        self.delimiter_problems
            .iter()
            .any(|span| span.start >= start && span.start <= end)
    }

    fn report(&mut self, offset: usize, text: &str, end: usize, error: &pest::error::Error<Rule>) {
        if !self.explained(offset, end) {
            self.parsed.diagnostics.push(errors::syntax_error(
                self.source,
                (offset, offset + text.len() >= self.text.len()),
                text,
                error,
            ));
        }
    }

    fn section(&mut self, start: usize, end: usize) {
        let chunk = self.text.get(start..end).unwrap_or("");
        match PolicyParser::parse(Rule::item_only, chunk) {
            Ok(mut pairs) => {
                let lowerer = Lowerer::new(self.source, start);
                if let Some(item) = pairs.next().and_then(|pair| lowerer.item_only(pair)) {
                    self.parsed.file.items.push(item);
                }
                self.parsed
                    .diagnostics
                    .extend(lowerer.diagnostics.into_inner());
            }
            Err(error) => {
                let first_word: String = chunk
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let body = recover::block_body(chunk);
                match (BlockKind::of_keyword(&first_word), body) {
                    (Some(kind), Some(body)) => self.block(kind, start, chunk, body),
                    _ => {
                        if matches!(first_word.as_str(), "let" | "input") {
                            self.broken_name(chunk, 1);
                        }
                        self.report(start, chunk, end, &error);
                    }
                }
            }
        }
    }

    /// Records the `index`-th word of a failed definition as a broken name.
    fn broken_name(&mut self, text: &str, index: usize) {
        let word = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| !word.is_empty())
            .nth(index);
        if let Some(word) = word {
            self.parsed.broken_names.push(word.to_string());
        }
    }

    fn block(&mut self, kind: BlockKind, start: usize, chunk: &str, body: std::ops::Range<usize>) {
        // The header, checked by parsing it with an empty body.
        let header = chunk.get(..body.start.saturating_sub(1)).unwrap_or("");
        let synthetic = format!("{header}{{}}");
        let mut name = None;
        match PolicyParser::parse(Rule::item_only, &synthetic) {
            Ok(mut pairs) => {
                let lowerer = Lowerer::new(self.source, start);
                match pairs.next().and_then(|pair| lowerer.item_only(pair)) {
                    Some(Item::Sort(sort)) => name = Some(sort.name),
                    Some(Item::Policy(policy)) => name = Some(policy.name),
                    _ => {}
                }
            }
            Err(error) => {
                if kind == BlockKind::Sort {
                    self.broken_name(header, 1);
                }
                // The error's position is in the header as parsed, whose
                // `{` the file has too.
                self.report(start, &synthetic, start + header.len(), &error);
            }
        }

        let body_text = chunk.get(body.clone()).unwrap_or("");
        let body_start = start + body.start;
        let scan = recover::scan(self.source, body_start, body_text);
        let mut statements = Vec::new();
        for range in recover::statements(body_text, &scan, kind.statement_keywords()) {
            let text = body_text.get(range.clone()).unwrap_or("");
            let offset = body_start + range.start;
            match PolicyParser::parse(kind.statement_rule(), text) {
                Ok(mut pairs) => {
                    let lowerer = Lowerer::new(self.source, offset);
                    if let Some(statement) =
                        pairs.next().and_then(|pair| lowerer.statement(kind, pair))
                    {
                        statements.push(statement);
                    }
                    self.parsed
                        .diagnostics
                        .extend(lowerer.diagnostics.into_inner());
                }
                Err(error) => {
                    let Some(keywords) = kind.statement_keywords() else {
                        self.broken_name(text, 0);
                        self.report(offset, text, offset + text.len(), &error);
                        continue;
                    };
                    let block_word = chunk.get(..kind_keyword_len(chunk)).unwrap_or("");
                    // How far in the statement begins on its line.
                    let line_start = self
                        .text
                        .get(..offset)
                        .and_then(|before| before.rfind('\n'))
                        .map_or(0, |at| at + 1);
                    let column = self
                        .text
                        .get(line_start..offset)
                        .map_or(0, |indent| indent.chars().count());
                    match errors::unknown_statement(
                        self.source,
                        (offset, column),
                        text,
                        &error,
                        (block_word, keywords, kind.statement_rule()),
                    ) {
                        Some(diagnostic) if !self.explained(offset, offset + text.len()) => {
                            self.parsed.diagnostics.push(diagnostic);
                        }
                        Some(_) => {}
                        None => self.report(offset, text, offset + text.len(), &error),
                    }
                }
            }
        }

        // Anything after the closing brace belongs to no section.
        let after = chunk.get(body.end + 1..).unwrap_or("");
        if body.end < chunk.len() && !recover::is_blank(after) {
            let at = start + body.end + 1;
            if let Err(error) = PolicyParser::parse(Rule::item_only, after) {
                self.report(at, after, at + after.len(), &error);
            }
        }

        let keyword = Span::new(start, start + kind_keyword_len(chunk));
        if let Some(item) = assemble(kind, keyword, name, statements) {
            self.parsed.file.items.push(item);
        }
    }
}

fn kind_keyword_len(chunk: &str) -> usize {
    chunk
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(chunk.len())
}

/// Builds a block from the statements that parsed.
fn assemble(
    kind: BlockKind,
    keyword: Span,
    name: Option<Ident>,
    statements: Vec<Statement>,
) -> Option<Item> {
    macro_rules! collect {
        ($variant:ident) => {
            statements
                .into_iter()
                .filter_map(|statement| match statement {
                    Statement::$variant(inner) => Some(inner),
                    _ => None,
                })
                .collect()
        };
    }
    Some(match kind {
        BlockKind::Policy => Item::Policy(PolicyDecl {
            keyword,
            name: name?,
            settings: collect!(Policy),
        }),
        BlockKind::Models => Item::Models(ModelsBlock {
            keyword,
            statements: collect!(Models),
        }),
        BlockKind::Validate => {
            let statements: Vec<lower::ValidateStmt> = collect!(Validate);
            let mut block = ValidateBlock {
                keyword,
                rules: Vec::new(),
                malformed_body: Vec::new(),
            };
            for statement in statements {
                match statement {
                    lower::ValidateStmt::Reject(rule) => block.rules.push(rule),
                    lower::ValidateStmt::MalformedBody(body) => block.malformed_body.push(body),
                }
            }
            Item::Validate(block)
        }
        BlockKind::Defaults => {
            let layers: Vec<Vec<LayerRef>> = collect!(Layers);
            Item::Defaults(DefaultsBlock {
                keyword,
                layers: layers.into_iter().flatten().collect(),
            })
        }
        BlockKind::Merge => Item::Merge(MergeBlock {
            keyword,
            merges: collect!(Merge),
        }),
        BlockKind::Eligibility => Item::Eligibility(EligibilityBlock {
            keyword,
            steps: collect!(Eligibility),
        }),
        BlockKind::Order => Item::Order(OrderBlock {
            keyword,
            statements: collect!(Order),
        }),
        BlockKind::Sort => Item::Sort(SortDecl {
            keyword,
            name: name?,
            keys: collect!(SortKey),
        }),
        BlockKind::Failover => Item::Failover(FailoverBlock {
            keyword,
            statements: collect!(Failover),
        }),
        BlockKind::Health => Item::Health(HealthBlock {
            keyword,
            statements: collect!(Health),
        }),
        BlockKind::Capacity => Item::Capacity(CapacityBlock {
            keyword,
            statements: collect!(Capacity),
        }),
        BlockKind::Timeouts => Item::Timeouts(TimeoutsBlock {
            keyword,
            timeouts: collect!(Timeout),
        }),
        BlockKind::Stream => Item::Stream(StreamBlock {
            keyword,
            statements: collect!(Stream),
        }),
        BlockKind::Errors => Item::Errors(ErrorsBlock {
            keyword,
            errors: collect!(Error),
        }),
        BlockKind::Headers => Item::Headers(HeadersBlock {
            keyword,
            fields: collect!(Field),
        }),
        BlockKind::Listing => Item::Listing(ListingBlock {
            keyword,
            fields: collect!(Field),
        }),
    })
}

#[cfg(test)]
mod tests;
