//! The registry of diagnostic codes.
//!
//! Codes are stable: once released a code keeps its meaning and is never
//! reused, even if the check behind it is removed. Bands follow the pipeline:
//! E01xx syntax, E02xx data files, E03xx names, E04xx types, E05xx structure
//! and conflicts, W06xx warnings; E09xx files of the other commands (the
//! sim's scenarios, `test`'s cases).

use super::Severity;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code {
    pub id: &'static str,
    pub severity: Severity,
    pub summary: &'static str,
}

macro_rules! codes {
    ($($name:ident = $id:literal, $severity:ident, $summary:literal;)*) => {
        $(pub const $name: Code = Code { id: $id, severity: Severity::$severity, summary: $summary };)*
        /// Every code, in registry order.
        pub const ALL: &[Code] = &[$($name),*];
    };
}

codes! {
    SYNTAX = "E0101", Error, "the text does not follow the policy grammar";
    UNTERMINATED_STRING = "E0102", Error, "a string literal is not closed on its line";
    UNCLOSED_BLOCK = "E0103", Error, "a `{`, `(` or `[` is never closed, or a closing one has no opening";
    BAD_LITERAL = "E0104", Error, "a number or duration literal is malformed or out of range";
    BAD_STATUS_PATTERN = "E0105", Error, "a status pattern is not a valid HTTP status or class";
    BAD_PIN_TEMPLATE = "E0106", Error, "a pin template does not have exactly one target and one `{model}` placeholder";
    TOO_DEEP = "E0107", Error, "an expression is nested too deeply or chains too many operands";
    READ_FAILED = "E0108", Error, "a file could not be read";

    DATA_SCHEMA = "E0201", Error, "a data file does not match its schema";
    DATA_UNKNOWN_FIELD = "E0202", Error, "a data file has a field its schema does not define";
    LITERAL_SECRET = "E0203", Error, "a credential is written into a data file instead of referenced from the environment";
    DUPLICATE_ID = "E0204", Error, "two entries of a data file have the same id";
    UNKNOWN_REFERENCE = "E0205", Error, "a data file names a provider, model, tenant or workspace that does not exist";
    UNDECLARED_ATTRIBUTE = "E0206", Error, "a data entry sets an attribute its schema does not declare, or leaves out one it requires";
    ATTRIBUTE_TYPE = "E0207", Error, "an attribute value does not have its declared type";
    BAD_SCHEMA_TYPE = "E0208", Error, "a schema declares a type that does not exist";
    BAD_KEY_HASH = "E0209", Error, "an API key hash is not a SHA-256 hex digest";
    AMBIGUOUS_PROVIDER_NAME = "E0210", Error, "providers of different names answer to the same id, name or alias";

    UNKNOWN_NAME = "E0301", Error, "a name is not defined";
    UNKNOWN_ATTRIBUTE = "E0302", Error, "an attribute path does not exist in the data schema";
    UNKNOWN_ERROR = "E0303", Error, "an error code is used but not declared in `errors`";
    UNKNOWN_FUNCTION = "E0304", Error, "a function does not exist";
    UNKNOWN_ENUM_MEMBER = "E0305", Error, "a string is compared with an enumeration that has no such member";
    UNKNOWN_SORT = "E0306", Error, "a sort selector can name a sort that is not declared";
    NOT_IN_SCOPE = "E0307", Error, "a name exists but is not available at this place in the policy";
    UNKNOWN_TYPE = "E0308", Error, "an input declares a type that does not exist";
    DUPLICATE_DEFINITION = "E0309", Error, "a name is defined twice";
    CYCLIC_DEFINITION = "E0310", Error, "`let` definitions refer to each other in a cycle";

    TYPE_MISMATCH = "E0401", Error, "an expression has a different type than its place requires";
    BAD_OPERANDS = "E0402", Error, "an operator is applied to types it is not defined for";
    MAYBE_ABSENT = "E0403", Error, "a value that may be absent is used where a value is required";
    ARGUMENT_COUNT = "E0404", Error, "a function is called with the wrong number of arguments";
    NOT_ORDERED = "E0405", Error, "values are compared by order but their type has no order";
    BAD_MERGE = "E0406", Error, "a merge operator does not apply to the merged values' type";
    UPSTREAM_BEFORE_ATTEMPT = "E0407", Error, "an error reads `upstream` but is raised where no provider has answered";
    BAD_HEADER_VALUE = "E0408", Error, "a header or listing value cannot be written as text";

    DUPLICATE_SECTION = "E0501", Error, "a section, statement or clause that may appear once appears twice";
    MISSING_SECTION = "E0502", Error, "a required section or statement is missing";
    UNREACHABLE_ERROR = "E0503", Error, "a declared error code can never be produced";
    UNCOVERED_OUTCOME = "E0504", Error, "some attempt outcomes are not handled by any `on` rule";
    BAD_CONSEQUENCE = "E0505", Error, "an `on` rule does not say exactly once what happens next";
    MODEL_ON_TWO_PROVIDERS = "E0506", Error, "a model is routed to two providers where the policy allows one";
    UNBOUNDED_RETRY = "E0507", Error, "a `retry` could repeat forever";
    BAD_ATTEMPTS = "E0508", Error, "an attempt limit is not a positive whole number";
    MISSING_INPUT_ERROR = "E0509", Error, "an input does not say which error a malformed value gets";
    AGGREGATE_MISUSE = "E0510", Error, "an aggregate or `self` is used where there is no candidate set";
    DUPLICATE_HEADER = "E0511", Error, "a response header or listing field is set twice";
    BAD_LAYERS = "E0512", Error, "default layers are repeated";
    BAD_SCHEDULE = "E0513", Error, "a penalty schedule's factor is below 1 or its maximum below its base";
    RESERVED_INPUT = "E0514", Error, "an input reads a body field or header the proxy itself uses, or one no request can carry";
    ZERO_TIMEOUT = "E0515", Error, "a timeout is written as no time at all";

    SHADOWED_RULE = "W0601", Warning, "a rule can never apply because earlier rules always take its cases";
    UNUSED_DEFINITION = "W0602", Warning, "a definition, input or sort is never used";
    CONSTANT_CONDITION = "W0603", Warning, "a condition is always true or always false";
    BAD_SCENARIO = "E0901", Error, "a scenario file for `switchyard sim` does not read as docs/sim.md describes";
    BAD_CASES_FILE = "E0902", Error, "a cases file for `switchyard test` does not read as docs/testing.md describes";
    UNSOUND_CASE = "E0903", Error, "a test case cannot run as written, or could pass whatever the policy does";
}

/// Looks a code up by its id, such as `E0302`.
pub fn by_id(id: &str) -> Option<Code> {
    ALL.iter().copied().find(|code| code.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_and_banded_by_severity() {
        let mut seen = HashSet::new();
        for code in ALL {
            assert!(seen.insert(code.id), "{} is registered twice", code.id);
            let expected = match code.severity {
                Severity::Error => 'E',
                Severity::Warning => 'W',
            };
            assert!(
                code.id.starts_with(expected),
                "{} has the wrong letter",
                code.id
            );
            assert_eq!(code.id.len(), 5);
        }
        assert_eq!(by_id("E0302"), Some(UNKNOWN_ATTRIBUTE));
    }

    #[test]
    fn every_code_is_documented() {
        let doc = include_str!("../../docs/diagnostics.md");
        for code in ALL {
            let row = format!("| `{}` |", code.id);
            assert!(doc.contains(&row), "docs/diagnostics.md lacks {}", code.id);
            assert!(
                doc.contains(code.summary),
                "docs/diagnostics.md has another summary for {}",
                code.id
            );
        }
    }
}
