//! Scenario files: which providers the sim hosts, how fast they answer, and
//! the sequence of answers each provider (or each of its models) gives.
//! The format is documented in docs/sim.md.

use super::step::{Step, parse_step};
use crate::data::schema::{parse_duration, why_not_a_duration};
use crate::data::{FileProblem, SpannedMap, yaml_error};
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};
use std::fmt;
use std::time::Duration;

/// Most content chunks a stream may have; keeps a typo from making a stream
/// of millions of events.
pub const MAX_CHUNKS: u32 = 10_000;

/// Largest scenario accepted, from a file or over HTTP.
const MAX_SCENARIO_BYTES: usize = 1024 * 1024;

/// Token counts reported in every answer's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u32,
    pub output: u32,
}

/// How fast and how long a successful answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Before the response headers.
    pub latency: Duration,
    /// After the headers, before the first stream event.
    pub first_token: Duration,
    /// Between two content chunks of a stream.
    pub chunk_interval: Duration,
    /// Content chunks in a stream.
    pub chunks: u32,
    pub usage: Usage,
}

/// Used for whatever the scenario's `defaults` leave out: fast answers,
/// five chunks.
const BUILT_IN: Settings = Settings {
    latency: Duration::ZERO,
    first_token: Duration::ZERO,
    chunk_interval: Duration::ZERO,
    chunks: 5,
    usage: Usage {
        input: 12,
        output: 34,
    },
};

/// Settings given at one level (defaults, provider, model); unset ones come
/// from the level above.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Overrides {
    latency: Option<Duration>,
    first_token: Option<Duration>,
    chunk_interval: Option<Duration>,
    chunks: Option<u32>,
    input_tokens: Option<u32>,
    output_tokens: Option<u32>,
}

impl Overrides {
    fn apply(&self, settings: Settings) -> Settings {
        Settings {
            latency: self.latency.unwrap_or(settings.latency),
            first_token: self.first_token.unwrap_or(settings.first_token),
            chunk_interval: self.chunk_interval.unwrap_or(settings.chunk_interval),
            chunks: self.chunks.unwrap_or(settings.chunks),
            usage: Usage {
                input: self.input_tokens.unwrap_or(settings.usage.input),
                output: self.output_tokens.unwrap_or(settings.usage.output),
            },
        }
    }
}

/// Answers given one per request, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    steps: Vec<Step>,
    /// Whether the sequence starts over after its last step; otherwise the
    /// last step repeats.
    repeat: bool,
}

impl Sequence {
    /// The step for the request that comes after `position` others.
    pub fn step_at(&self, position: usize) -> Step {
        let last = self.steps.len().saturating_sub(1);
        let index = if self.repeat {
            position.checked_rem(self.steps.len()).unwrap_or(0)
        } else {
            position.min(last)
        };
        self.steps.get(index).cloned().unwrap_or_else(Step::success)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelScript {
    name: String,
    overrides: Overrides,
    sequence: Option<Sequence>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProviderScript {
    name: String,
    overrides: Overrides,
    sequence: Option<Sequence>,
    models: Vec<ModelScript>,
}

/// Which sequence a request advances: one model's, or the provider's (then
/// `model` is `None`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SequenceKey {
    pub provider: String,
    pub model: Option<String>,
}

/// How a request to one provider and model is answered.
#[derive(Debug, Clone, Copy)]
pub struct Script<'a> {
    pub settings: Settings,
    pub sequence: Option<&'a Sequence>,
    /// Whether `sequence` is the model's own (else the provider's).
    pub per_model: bool,
}

/// A parsed scenario: every simulated provider and its behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    defaults: Settings,
    providers: Vec<ProviderScript>,
}

impl Scenario {
    /// Parses a scenario. `file` names the text in errors, which read
    /// `file:line:col: what is wrong`.
    pub fn parse(text: &str, file: &str) -> Result<Scenario, FileProblem> {
        if text.len() > MAX_SCENARIO_BYTES {
            return Err(FileProblem::at(file, None, "a scenario is at most 1 MiB"));
        }
        let raw: RawScenario = serde_saphyr::from_str_with_options(text, yaml_options())
            .map_err(|error| yaml_error(file, text, &error))?;
        let place = Place { file, text };
        let defaults = match &raw.defaults {
            Some(defaults) => place.overrides(&defaults.settings())?.apply(BUILT_IN),
            None => BUILT_IN,
        };
        if raw.providers.0.is_empty() {
            return Err(FileProblem::at(
                file,
                None,
                "a scenario needs at least one provider under `providers`",
            ));
        }
        let mut providers = Vec::new();
        for (name, provider) in &raw.providers.0 {
            place.check_provider_name(name)?;
            let provider = provider.as_ref().map(|p| &p.value);
            let mut models = Vec::new();
            for (model, script) in provider.map_or(&[][..], |p| p.models.0.as_slice()) {
                if model.value.is_empty() {
                    return Err(place.error(&model.referenced, "a model name cannot be empty"));
                }
                let script = script.as_ref().map(|s| &s.value);
                models.push(ModelScript {
                    name: model.value.clone(),
                    overrides: match script {
                        Some(script) => place.overrides(&script.settings())?,
                        None => Overrides::default(),
                    },
                    sequence: match script {
                        Some(script) => {
                            place.sequence(script.sequence.as_ref(), script.repeat.as_ref())?
                        }
                        None => None,
                    },
                });
            }
            providers.push(ProviderScript {
                name: name.value.clone(),
                overrides: match provider {
                    Some(provider) => place.overrides(&provider.settings())?,
                    None => Overrides::default(),
                },
                sequence: match provider {
                    Some(provider) => {
                        place.sequence(provider.sequence.as_ref(), provider.repeat.as_ref())?
                    }
                    None => None,
                },
                models,
            });
        }
        Ok(Scenario {
            defaults,
            providers,
        })
    }

    /// The simulated providers (the first URL path segment), in file order.
    pub fn providers(&self) -> impl Iterator<Item = &str> {
        self.providers.iter().map(|provider| provider.name.as_str())
    }

    /// The models a provider lists, in file order; `None` for an unknown provider.
    pub fn models(&self, provider: &str) -> Option<impl Iterator<Item = &str>> {
        self.provider(provider)
            .map(|provider| provider.models.iter().map(|model| model.name.as_str()))
    }

    /// How a request for `model` to `provider` is answered; `None` for an
    /// unknown provider. A model's own sequence wins over the provider's.
    pub fn script(&self, provider: &str, model: &str) -> Option<Script<'_>> {
        let provider = self.provider(provider)?;
        let model = provider.models.iter().find(|script| script.name == model);
        let mut settings = provider.overrides.apply(self.defaults);
        if let Some(model) = model {
            settings = model.overrides.apply(settings);
        }
        let own = model.and_then(|model| model.sequence.as_ref());
        Some(Script {
            settings,
            sequence: own.or(provider.sequence.as_ref()),
            per_model: own.is_some(),
        })
    }

    fn provider(&self, name: &str) -> Option<&ProviderScript> {
        self.providers.iter().find(|provider| provider.name == name)
    }
}

// ------------------------------------------------------------ the YAML form

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    defaults: Option<RawDefaults>,
    #[serde(default)]
    providers: SpannedMap<Option<Spanned<RawProvider>>>,
}

// The three levels repeat the settings fields: serde cannot combine
// `flatten` with `deny_unknown_fields`, and a closed schema matters more.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    latency: Option<Spanned<String>>,
    first_token: Option<Spanned<String>>,
    chunk_interval: Option<Spanned<String>>,
    chunks: Option<Spanned<f64>>,
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    latency: Option<Spanned<String>>,
    first_token: Option<Spanned<String>>,
    chunk_interval: Option<Spanned<String>>,
    chunks: Option<Spanned<f64>>,
    usage: Option<RawUsage>,
    sequence: Option<Spanned<Vec<Spanned<String>>>>,
    repeat: Option<Spanned<bool>>,
    #[serde(default)]
    models: SpannedMap<Option<Spanned<RawModel>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    latency: Option<Spanned<String>>,
    first_token: Option<Spanned<String>>,
    chunk_interval: Option<Spanned<String>>,
    chunks: Option<Spanned<f64>>,
    usage: Option<RawUsage>,
    sequence: Option<Spanned<Vec<Spanned<String>>>>,
    repeat: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUsage {
    input: Option<u32>,
    output: Option<u32>,
}

/// The settings fields of one level, whichever level it is.
struct RawSettings<'a> {
    latency: Option<&'a Spanned<String>>,
    first_token: Option<&'a Spanned<String>>,
    chunk_interval: Option<&'a Spanned<String>>,
    chunks: Option<&'a Spanned<f64>>,
    usage: Option<&'a RawUsage>,
}

impl RawDefaults {
    fn settings(&self) -> RawSettings<'_> {
        RawSettings {
            latency: self.latency.as_ref(),
            first_token: self.first_token.as_ref(),
            chunk_interval: self.chunk_interval.as_ref(),
            chunks: self.chunks.as_ref(),
            usage: self.usage.as_ref(),
        }
    }
}

impl RawProvider {
    fn settings(&self) -> RawSettings<'_> {
        RawSettings {
            latency: self.latency.as_ref(),
            first_token: self.first_token.as_ref(),
            chunk_interval: self.chunk_interval.as_ref(),
            chunks: self.chunks.as_ref(),
            usage: self.usage.as_ref(),
        }
    }
}

impl RawModel {
    fn settings(&self) -> RawSettings<'_> {
        RawSettings {
            latency: self.latency.as_ref(),
            first_token: self.first_token.as_ref(),
            chunk_interval: self.chunk_interval.as_ref(),
            chunks: self.chunks.as_ref(),
            usage: self.usage.as_ref(),
        }
    }
}

/// Only `true` and `false` are booleans, so a model named `no` stays a string.
fn yaml_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options
}

// ------------------------------------------------------------- validation

/// How many characters into a scalar's `source` its value's character
/// `offset` is written: past an opening quote, and counting each escape
/// (`\"`, `\\`, `\u00e9`; `''` in single quotes) as written. `None` for a
/// block scalar or a character past the scalar's first line, which this
/// walk does not follow.
fn columns_to(source: &str, offset: usize) -> Option<u64> {
    let mut chars = source.chars();
    let quote = match source.chars().next()? {
        '|' | '>' => return None,
        quote @ ('"' | '\'') => {
            chars.next();
            Some(quote)
        }
        _ => None,
    };
    let mut columns = u64::from(quote.is_some());
    for _ in 0..offset {
        let written = chars.next()?;
        if written == '\n' || written == '\r' {
            return None;
        }
        // The characters of the source that write this one of the value.
        columns += match (quote, written) {
            (Some('"'), '\\') => {
                let digits = match chars.next()? {
                    'x' => 2,
                    'u' => 4,
                    'U' => 8,
                    _ => 0,
                };
                for _ in 0..digits {
                    chars.next()?;
                }
                2 + digits
            }
            (Some('\''), '\'') => {
                chars.next()?;
                2
            }
            _ => 1,
        };
    }
    match chars.next() {
        Some('\n' | '\r') => None,
        _ => Some(columns),
    }
}

/// The text being parsed, to turn YAML locations into `file:line:col`.
/// A line or column as the YAML library counts it.
fn whole(number: u64) -> usize {
    usize::try_from(number).unwrap_or(usize::MAX)
}

struct Place<'a> {
    file: &'a str,
    text: &'a str,
}

impl Place<'_> {
    fn error(&self, location: &Location, message: impl fmt::Display) -> FileProblem {
        FileProblem::at(
            self.file,
            Some((whole(location.line()), whole(location.column()))),
            message,
        )
    }

    /// An error at a character offset inside a string value: where that
    /// character is written, or the value's start where the value does not
    /// stay on its first line.
    fn error_inside(&self, location: &Location, offset: usize, message: &str) -> FileProblem {
        let written = location
            .span()
            .byte_offset()
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| self.text.get(at..))
            .and_then(|source| columns_to(source, offset));
        let column = whole(location.column().saturating_add(written.unwrap_or(0)));
        FileProblem::at(self.file, Some((whole(location.line()), column)), message)
    }

    fn check_provider_name(&self, name: &Spanned<String>) -> Result<(), FileProblem> {
        // `.` and `..` are dot segments, which clients fold out of a URL.
        let valid = !name.value.is_empty()
            && !name.value.starts_with('_')
            && name.value != "."
            && name.value != ".."
            && name
                .value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~'));
        if valid {
            Ok(())
        } else {
            Err(self.error(
                &name.referenced,
                format_args!(
                    "`{}` cannot name a provider: it is the first segment of the URL path, \
                     made of letters, digits, `.`, `-`, `_` and `~`, not starting with `_`, \
                     and not `.` or `..`",
                    name.value
                ),
            ))
        }
    }

    fn overrides(&self, raw: &RawSettings<'_>) -> Result<Overrides, FileProblem> {
        let chunks = match raw.chunks {
            // Read as a number, so that any number out of range (10^12, -3,
            // 2.5) gets the range, not a type error.
            Some(chunks)
                if chunks.value.fract() == 0.0
                    && (1.0..=f64::from(MAX_CHUNKS)).contains(&chunks.value) =>
            {
                Some(chunks.value as u32)
            }
            Some(chunks) => {
                return Err(self.error(
                    &chunks.referenced,
                    format_args!("`chunks` is a whole number from 1 to {MAX_CHUNKS}"),
                ));
            }
            None => None,
        };
        Ok(Overrides {
            latency: self.duration(raw.latency)?,
            first_token: self.duration(raw.first_token)?,
            chunk_interval: self.duration(raw.chunk_interval)?,
            chunks,
            input_tokens: raw.usage.and_then(|usage| usage.input),
            output_tokens: raw.usage.and_then(|usage| usage.output),
        })
    }

    fn duration(&self, raw: Option<&Spanned<String>>) -> Result<Option<Duration>, FileProblem> {
        let Some(raw) = raw else { return Ok(None) };
        match parse_duration(&raw.value) {
            Some(millis) => Ok(Some(Duration::from_millis(millis))),
            None => Err(self.error(
                &raw.referenced,
                format_args!("`{}` {}", raw.value, why_not_a_duration(&raw.value)),
            )),
        }
    }

    fn sequence(
        &self,
        sequence: Option<&Spanned<Vec<Spanned<String>>>>,
        repeat: Option<&Spanned<bool>>,
    ) -> Result<Option<Sequence>, FileProblem> {
        let Some(sequence) = sequence else {
            if let Some(repeat) = repeat {
                return Err(self.error(
                    &repeat.referenced,
                    "`repeat` says whether a `sequence` starts over, but there is no `sequence` here",
                ));
            }
            return Ok(None);
        };
        if sequence.value.is_empty() {
            return Err(self.error(
                &sequence.referenced,
                "a `sequence` needs at least one step; leave it out to answer `200` every time",
            ));
        }
        let mut steps = Vec::new();
        for step in &sequence.value {
            let parsed = parse_step(&step.value).map_err(|error| {
                self.error_inside(&step.referenced, error.offset, &error.message)
            })?;
            steps.push(parsed);
        }
        Ok(Some(Sequence {
            steps,
            repeat: repeat.is_some_and(|repeat| repeat.value),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Scenario {
        match Scenario::parse(text, "s.yaml") {
            Ok(scenario) => scenario,
            Err(error) => panic!("does not parse: {error}"),
        }
    }

    fn error(text: &str) -> String {
        match Scenario::parse(text, "s.yaml") {
            Ok(scenario) => panic!("parses: {scenario:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn each_usage_count_comes_from_the_closest_level_that_sets_it() {
        let scenario = parse(
            "defaults: {usage: {input: 5}}\n\
             providers:\n  \
               a:\n    \
                 usage: {output: 9}\n",
        );
        assert_eq!(
            scenario.script("a", "m").map(|s| s.settings.usage),
            Some(Usage {
                input: 5,
                output: 9
            })
        );
    }

    #[test]
    fn settings_come_from_the_closest_level() {
        let scenario = parse(
            "defaults: {latency: 20ms, chunks: 3, usage: {input: 1, output: 2}}\n\
             providers:\n  \
               a:\n    \
                 latency: 50ms\n    \
                 models:\n      \
                   m: {chunks: 7}\n      \
                   n:\n  \
               b:\n",
        );
        let script = scenario.script("a", "m").map(|s| s.settings);
        assert_eq!(
            script,
            Some(Settings {
                latency: Duration::from_millis(50),
                first_token: Duration::ZERO,
                chunk_interval: Duration::ZERO,
                chunks: 7,
                usage: Usage {
                    input: 1,
                    output: 2
                },
            })
        );
        assert_eq!(
            scenario.script("b", "other").map(|s| s.settings.latency),
            Some(Duration::from_millis(20))
        );
        assert!(scenario.script("c", "m").is_none());
        assert_eq!(scenario.providers().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            scenario.models("a").map(Iterator::collect::<Vec<_>>),
            Some(vec!["m", "n"])
        );
    }

    #[test]
    fn sequences_repeat_their_last_step_or_start_over() {
        let scenario = parse(
            "providers:\n  \
               a:\n    \
                 sequence: [\"503\", 200]\n    \
                 models:\n      \
                   m: {sequence: [reset, 429], repeat: true}\n",
        );
        let steps = |model: &str| -> Vec<String> {
            let Some(script) = scenario.script("a", model) else {
                return Vec::new();
            };
            (0..5)
                .map(|n| {
                    script
                        .sequence
                        .map_or_else(String::new, |s| s.step_at(n).text)
                })
                .collect()
        };
        assert_eq!(steps("x"), ["503", "200", "200", "200", "200"]);
        assert_eq!(steps("m"), ["reset", "429", "reset", "429", "reset"]);
        assert_eq!(scenario.script("a", "m").map(|s| s.per_model), Some(true));
        assert_eq!(scenario.script("a", "x").map(|s| s.per_model), Some(false));
    }

    #[test]
    fn errors_name_the_place() {
        assert_eq!(
            error("providers:\n  a:\n    latncy: 20ms\n"),
            "s.yaml:3:5: `latncy` is not a field here; did you mean `latency`?"
        );
        assert_eq!(
            error("defaults: {models: {}}\nproviders: {a: {}}\n"),
            "s.yaml:1:12: `models` is not a field here; the fields are `latency`, `first_token`, \
             `chunk_interval`, `chunks`, `usage`"
        );
        assert_eq!(
            error("providers:\n  a:\n    sequence:\n      - \"429 retry_after=2x\"\n"),
            "s.yaml:4:26: `2x` is not a duration; write it like `250ms`, `2s`, `5m`, `1h` or `1d`"
        );
        assert_eq!(
            error("providers:\n  a: {sequence: [200, 503 cut_after=1]}\n"),
            "s.yaml:2:27: `cut_after` shapes a successful stream; an error answer has no stream"
        );
        assert_eq!(
            error("providers:\n  a: {latency: 20}\n"),
            "s.yaml:2:16: `20` is not a duration; write it like `250ms`, `2s`, `5m`, `1h` or `1d`"
        );
        assert_eq!(
            error("providers:\n  a: {repeat: true}\n"),
            "s.yaml:2:15: `repeat` says whether a `sequence` starts over, but there is no `sequence` here"
        );
        assert_eq!(
            error("providers:\n  _sim: {}\n"),
            "s.yaml:2:3: `_sim` cannot name a provider: it is the first segment of the URL path, \
             made of letters, digits, `.`, `-`, `_` and `~`, not starting with `_`, \
             and not `.` or `..`"
        );
        assert!(
            error("providers:\n  \"..\": {}\n").contains("`..` cannot name a provider"),
            "a dot segment"
        );
        for chunks in ["0", "1000000000000", "-3", "2.5"] {
            assert_eq!(
                error(&format!(
                    "defaults: {{chunks: {chunks}}}\nproviders: {{a: {{}}}}\n"
                )),
                "s.yaml:1:20: `chunks` is a whole number from 1 to 10000",
                "{chunks}"
            );
        }
        assert_eq!(
            error("providers:\n  a: {latency: 99999999999h}\n"),
            "s.yaml:2:16: `99999999999h` is longer than a year, the longest duration"
        );
        assert_eq!(
            error("providers: {}\n"),
            "s.yaml: a scenario needs at least one provider under `providers`"
        );
        assert!(error("providers:\n  a: {}\n  a: {}\n").starts_with("s.yaml:3:"));
        // Escapes in the step are counted as written.
        assert_eq!(
            error("providers:\n  a:\n    sequence: [\"503 message=\\\"down\\\" retry_afte=2s\"]\n"),
            "s.yaml:3:38: `retry_afte` is not a step word; did you mean `retry_after`?"
        );
        assert_eq!(
            error("providers:\n  a:\n    sequence: ['503 message=''x'' retry_afte=2s']\n"),
            "s.yaml:3:35: `retry_afte` is not a step word; did you mean `retry_after`?"
        );
        // A step folded over lines is placed at its start.
        assert!(
            error(
                "providers:\n  a:\n    sequence:\n      - >-\n        503\n        retry_afte=2s\n"
            )
            .starts_with("s.yaml:5:9: "),
        );
    }
}
