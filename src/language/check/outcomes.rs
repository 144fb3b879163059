//! Coverage of attempt outcomes by `on` rules: every way an attempt can fail
//! must be handled, and a rule that earlier rules always pre-empt is flagged.

use super::Checker;
use crate::diagnostics::{Diagnostic, codes};
use crate::language::ast::*;

/// Failure statuses that rules must cover: 300 to 599.
const FIRST_STATUS: u16 = 300;
const LAST_STATUS: u16 = 599;

const CLASSES: [(OutcomeKind, &str); 6] = [
    (OutcomeKind::ConnectError, "connect_error"),
    (OutcomeKind::Reset, "reset"),
    (OutcomeKind::Timeout, "timeout"),
    (OutcomeKind::FirstTokenTimeout, "first_token_timeout"),
    (OutcomeKind::Malformed, "malformed"),
    (OutcomeKind::StreamBroken, "stream_broken"),
];

const SLOTS: usize = CLASSES.len() + (LAST_STATUS - FIRST_STATUS + 1) as usize;

/// The outcome slots a pattern matches.
fn slots(kind: OutcomeKind) -> Vec<usize> {
    match kind {
        OutcomeKind::Any => (0..SLOTS).collect(),
        OutcomeKind::Status { low, high } => (low.max(FIRST_STATUS)..=high.min(LAST_STATUS))
            .map(|status| CLASSES.len() + usize::from(status - FIRST_STATUS))
            .collect(),
        class => CLASSES
            .iter()
            .position(|(k, _)| *k == class)
            .into_iter()
            .collect(),
    }
}

/// Names uncovered slots compactly: classes by name, statuses as `3xx`,
/// `40x` or single codes.
fn describe(uncovered: &[bool]) -> Vec<String> {
    let mut names: Vec<String> = CLASSES
        .iter()
        .enumerate()
        .filter(|(index, _)| uncovered.get(*index).copied().unwrap_or(false))
        .map(|(_, (_, name))| format!("`{name}`"))
        .collect();
    let missing = |status: u16| {
        uncovered
            .get(CLASSES.len() + usize::from(status - FIRST_STATUS))
            .copied()
            .unwrap_or(false)
    };
    let mut status = FIRST_STATUS;
    while status <= LAST_STATUS {
        if status.is_multiple_of(100) && (status..status + 100).all(missing) {
            names.push(format!("`{}xx`", status / 100));
            status += 100;
        } else if status.is_multiple_of(10) && (status..status + 10).all(missing) {
            names.push(format!("`{}x`", status / 10));
            status += 10;
        } else {
            if missing(status) {
                names.push(format!("`{status}`"));
            }
            status += 1;
        }
    }
    names
}

impl Checker<'_> {
    pub(super) fn coverage(&mut self, block: &FailoverBlock) {
        let mut covered = vec![false; SLOTS];
        for statement in &block.statements {
            let FailoverStmt::On(rule) = statement else {
                continue;
            };
            let mut matched: Vec<usize> = Vec::new();
            let mut never = false;
            for pattern in &rule.outcomes {
                let pattern_slots = slots(pattern.kind);
                if pattern_slots.is_empty() {
                    never = true;
                }
                matched.extend(pattern_slots);
            }
            let shadowed = !matched.is_empty()
                && matched
                    .iter()
                    .all(|slot| covered.get(*slot).copied().unwrap_or(false));
            if shadowed || (never && matched.is_empty()) {
                let why = if shadowed {
                    "earlier rules without `when` take every outcome it names"
                } else {
                    "successful answers (1xx and 2xx) never reach `on` rules"
                };
                let source = self.source;
                self.diagnostics.push(
                    Diagnostic::new(codes::SHADOWED_RULE, "this rule can never apply")
                        .at(source, rule.keyword, why)
                        .help("rules are tried in order and the first that matches decides; move it up or remove it"),
                );
            }
            if rule.when.is_none() {
                for slot in matched {
                    if let Some(covered) = covered.get_mut(slot) {
                        *covered = true;
                    }
                }
            }
        }
        let uncovered: Vec<bool> = covered.iter().map(|c| !c).collect();
        if uncovered.iter().any(|u| *u) {
            let mut names = describe(&uncovered);
            let more = names.len().saturating_sub(8);
            names.truncate(8);
            let mut list = names.join(", ");
            if more > 0 {
                list.push_str(&format!(" and {more} more"));
            }
            let source = self.source;
            self.diagnostics.push(
                Diagnostic::new(codes::UNCOVERED_OUTCOME, format!("no rule handles {list}"))
                    .at(source, block.keyword, "in this failover")
                    .help(
                        "end with a rule that takes the rest, such as `on any => stop, error NAME`",
                    ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_missing_outcomes_compactly() {
        let mut uncovered = vec![false; SLOTS];
        uncovered[2] = true;
        for status in 300..=399u16 {
            uncovered[CLASSES.len() + usize::from(status - FIRST_STATUS)] = true;
        }
        for status in 400..=409u16 {
            uncovered[CLASSES.len() + usize::from(status - FIRST_STATUS)] = true;
        }
        uncovered[CLASSES.len() + usize::from(429 - FIRST_STATUS)] = true;
        assert_eq!(
            describe(&uncovered),
            ["`timeout`", "`3xx`", "`40x`", "`429`"]
        );
    }

    #[test]
    fn patterns_below_300_match_nothing() {
        assert!(
            slots(OutcomeKind::Status {
                low: 200,
                high: 299
            })
            .is_empty()
        );
        assert_eq!(
            slots(OutcomeKind::Status {
                low: 500,
                high: 599
            })
            .len(),
            100
        );
    }
}
