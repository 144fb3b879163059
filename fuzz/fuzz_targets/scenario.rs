//! Scenario YAML → the sim's scenario parser (`Scenario::parse`), including
//! the parser of sequence steps (`429 retry_after=2s`, ...). Needs the
//! library's `server` feature: `cargo fuzz run --features server scenario ...`.
//!
//! Input format: the scenario text (bytes, lossily UTF-8). The step parser
//! has no public entry point of its own, so each of the first lines of the
//! input is also parsed as a step on its own, put into a one-step scenario
//! as a YAML double-quoted string (every character outside printable ASCII
//! escaped, so the step reaches the step parser whatever it holds).
//!
//! On a scenario that parses, the target also asks it what the sim asks:
//! providers, models, each model's script and the first steps of its
//! sequence.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::fmt::Write;
use switchyard::sim::Scenario;

/// Lines of the input also parsed as steps on their own, at most.
const MAX_STEP_LINES: usize = 8;

/// Providers, and models per provider, asked about, at most. The sim looks
/// up one provider and model per request; asking about every one of tens of
/// thousands (a scenario may be 1 MiB) would make the target itself
/// quadratic.
const MAX_EXERCISED: usize = 16;

/// `text` as a YAML double-quoted scalar.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            _ => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

fn exercise(scenario: &Scenario) {
    let providers: Vec<&str> = scenario.providers().take(MAX_EXERCISED).collect();
    for provider in providers {
        let models: Vec<&str> = scenario
            .models(provider)
            .map(|models| models.take(MAX_EXERCISED).collect())
            .unwrap_or_default();
        for model in models.into_iter().chain(["not-listed"]) {
            if let Some(script) = scenario.script(provider, model)
                && let Some(sequence) = script.sequence
            {
                for position in 0..4 {
                    let _ = sequence.step_at(position);
                }
                let _ = sequence.step_at(usize::MAX);
            }
        }
    }
}

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(scenario) = Scenario::parse(&text, "fuzz.yaml") {
        exercise(&scenario);
    }
    for line in text.lines().take(MAX_STEP_LINES) {
        let wrapped = format!("providers:\n  p:\n    sequence: [{}]\n", quoted(line));
        if wrapped.len() > 1024 * 1024 {
            // Over the scenario size limit.
            continue;
        }
        match Scenario::parse(&wrapped, "step.yaml") {
            Ok(scenario) => exercise(&scenario),
            Err(error) => {
                // The wrapper itself is always valid: any error is the step's.
                assert!(
                    error.to_string().starts_with("step.yaml:3:"),
                    "the step wrapper did not parse: {error}\n{wrapped}"
                );
            }
        }
    }
});
