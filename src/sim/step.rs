//! One step of a scenario sequence: how the simulated provider answers one
//! request, written as a short string such as `429 retry_after=2s` or
//! `200 cut_after=3`.

use crate::data::schema::{parse_duration, why_not_a_duration};
use crate::diagnostics::suggest;
use std::time::Duration;

/// How one request is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The step as written, for the record.
    pub text: String,
    pub action: Action,
    /// Replaces the latency before the response headers (or before a reset).
    pub slow_headers: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Success(Success),
    Error(ErrorReply),
    /// A 200 whose body (or first stream event) is not valid JSON.
    Malformed {
        first_token: Option<Duration>,
    },
    /// The connection is closed without any response.
    Reset,
    /// The request is read and never answered.
    NoAnswer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success {
    pub status: u16,
    /// Replaces the delay before the first stream event.
    pub first_token: Option<Duration>,
    /// Streams: the events that announce the answer go out with the
    /// headers, then a keep-alive this often until the first content chunk.
    pub ping_every: Option<Duration>,
    pub ending: Ending,
    /// The content chunk (counted from 1) sent as invalid JSON.
    pub malformed_chunk: Option<u32>,
}

/// How a successful answer ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Every event, then the wire format's terminator.
    Complete,
    /// Every event except the terminator, then a normal close.
    NoTerminator,
    /// This many content chunks, then the connection is closed mid-stream.
    CutAfter(u32),
    /// This many content chunks, then nothing more while the connection stays open.
    StallAfter(u32),
    /// This many content chunks, then an error event and a normal close:
    /// the provider failed mid-answer and said why.
    ErrorAfter {
        chunks: u32,
        code: Option<String>,
        message: Option<String>,
    },
    /// Every event except the terminator, then nothing more while the
    /// connection stays open: an answer finished but never ended.
    Linger,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub code: Option<String>,
    pub message: Option<String>,
}

impl Step {
    /// The step used when a provider has no sequence: a plain success.
    pub fn success() -> Step {
        Step {
            text: String::from("200"),
            action: Action::Success(Success {
                status: 200,
                first_token: None,
                ping_every: None,
                ending: Ending::Complete,
                malformed_chunk: None,
            }),
            slow_headers: None,
        }
    }
}

/// A problem in a step, at a character offset within its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub offset: usize,
    pub message: String,
}

fn error_at(offset: usize, message: impl Into<String>) -> StepError {
    StepError {
        offset,
        message: message.into(),
    }
}

/// Words that stand alone.
const FLAGS: [&str; 5] = ["reset", "no_answer", "malformed", "no_done", "linger"];
/// Words written `name=value`.
const OPTIONS: [&str; 10] = [
    "retry_after",
    "code",
    "message",
    "slow_headers",
    "first_token",
    "ping_every",
    "cut_after",
    "stall_after",
    "error_after",
    "malformed_chunk",
];
/// Options that shape a successful stream.
const STREAM_OPTIONS: [&str; 8] = [
    "first_token",
    "ping_every",
    "cut_after",
    "stall_after",
    "error_after",
    "malformed_chunk",
    "no_done",
    "linger",
];
/// Options that describe an error answer.
const ERROR_OPTIONS: [&str; 3] = ["retry_after", "code", "message"];
/// Error options that also describe the error event `error_after` sends.
const STREAM_ERROR_OPTIONS: [&str; 2] = ["code", "message"];

/// One space-separated word of a step: `name` or `name=value`.
#[derive(Debug)]
struct Word {
    offset: usize,
    /// Where the word ends in the step, in characters, as `offset` starts it.
    end: usize,
    name: String,
    value: Option<String>,
}

/// Splits a step into words; a value may be double-quoted to hold spaces
/// (`message="try again later"`), with `\"` and `\\` as escapes.
fn words(text: &str) -> Result<Vec<Word>, StepError> {
    let chars: Vec<char> = text.chars().collect();
    let mut words = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        if chars.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
            continue;
        }
        let start = at;
        let mut name = String::new();
        while let Some(&c) = chars.get(at) {
            if c.is_whitespace() || c == '=' {
                break;
            }
            name.push(c);
            at += 1;
        }
        let mut value = None;
        if chars.get(at) == Some(&'=') {
            at += 1;
            let mut text = String::new();
            if chars.get(at) == Some(&'"') {
                let quote = at;
                at += 1;
                loop {
                    match chars.get(at) {
                        None => return Err(error_at(quote, "this quote is never closed")),
                        Some('"') => {
                            at += 1;
                            break;
                        }
                        Some('\\') if matches!(chars.get(at + 1), Some('"' | '\\')) => {
                            text.extend(chars.get(at + 1));
                            at += 2;
                        }
                        Some(&c) => {
                            text.push(c);
                            at += 1;
                        }
                    }
                }
                if chars.get(at).is_some_and(|c| !c.is_whitespace()) {
                    return Err(error_at(at, "put a space after the closing quote"));
                }
            } else {
                while let Some(&c) = chars.get(at) {
                    if c.is_whitespace() {
                        break;
                    }
                    text.push(c);
                    at += 1;
                }
            }
            value = Some(text);
        }
        words.push(Word {
            offset: start,
            end: at,
            name,
            value,
        });
    }
    Ok(words)
}

/// What the words of a step say, before they are checked against each other.
#[derive(Default)]
struct Parts {
    status: Option<u16>,
    kind: Option<&'static str>,
    retry_after: Option<Duration>,
    code: Option<String>,
    message: Option<String>,
    slow_headers: Option<Duration>,
    first_token: Option<Duration>,
    ping_every: Option<Duration>,
    cut_after: Option<u32>,
    stall_after: Option<u32>,
    error_after: Option<u32>,
    malformed_chunk: Option<(usize, u32)>,
    no_done: bool,
    linger: bool,
    /// Every word given, with its offset, to report conflicts where they are.
    seen: Vec<(usize, &'static str)>,
}

impl Parts {
    fn offset_of(&self, name: &str) -> usize {
        self.seen
            .iter()
            .find(|(_, seen)| *seen == name)
            .map_or(0, |(offset, _)| *offset)
    }

    fn has(&self, name: &str) -> bool {
        self.seen.iter().any(|(_, seen)| *seen == name)
    }
}

/// Parses a step such as `429 retry_after=2s code=rate_limited`.
pub fn parse_step(text: &str) -> Result<Step, StepError> {
    let words = words(text)?;
    if words.is_empty() {
        return Err(error_at(
            0,
            "a step is empty; write a status such as `200`, or `reset`, `no_answer`, `malformed`",
        ));
    }
    let mut parts = Parts::default();
    for word in &words {
        read_word(word, &mut parts)?;
    }
    let action = build_action(&parts)?;
    Ok(Step {
        text: words_text(text, &words),
        action,
        slow_headers: parts.slow_headers,
    })
}

/// The step's words as written, one space between them, as the record
/// shows it: spaces inside a quoted value stay.
fn words_text(text: &str, words: &[Word]) -> String {
    let chars: Vec<char> = text.chars().collect();
    words
        .iter()
        .map(|word| {
            chars
                .get(word.offset..word.end)
                .map_or_else(String::new, |written| written.iter().collect())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_word(word: &Word, parts: &mut Parts) -> Result<(), StepError> {
    let name = word.name.as_str();
    // Quoted back, an empty name or value would read as empty backticks.
    if name.is_empty() {
        return Err(error_at(
            word.offset,
            "an option's name is missing before its `=`; write it like `retry_after=2s`",
        ));
    }
    // `name=` and nothing after it (a quoted `""` is a value).
    let written = word.end.saturating_sub(word.offset);
    if word.value.as_deref() == Some("") && written == name.chars().count() + 1 {
        return Err(error_at(
            word.offset,
            format!("`{name}=` has no value; give one after the `=`"),
        ));
    }
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_digit()) {
        if let Some(value) = &word.value {
            return Err(error_at(
                word.offset,
                format!("`{name}={value}` is not a step option"),
            ));
        }
        let status = name
            .parse::<u16>()
            .ok()
            .filter(|status| (200..=599).contains(status))
            .ok_or_else(|| {
                error_at(
                    word.offset,
                    format!("`{name}` is not a status a provider answers with; use 200 to 599"),
                )
            })?;
        // Every step's answer has a body (an answer, a stream, an error
        // object), which HTTP forbids with these.
        if matches!(status, 204 | 205 | 304) {
            return Err(error_at(
                word.offset,
                format!(
                    "`{name}` is an answer without a body, which the sim cannot give; use 200, or an error status"
                ),
            ));
        }
        if parts.status.is_some() || parts.kind.is_some() {
            return Err(error_at(
                word.offset,
                "a step answers one way; give one status or one of `reset`, `no_answer`, `malformed`",
            ));
        }
        parts.status = Some(status);
        return Ok(());
    }
    let known = FLAGS
        .iter()
        .chain(OPTIONS.iter())
        .find(|known| **known == name)
        .copied()
        .ok_or_else(|| {
            let hint = suggest(name, FLAGS.iter().chain(OPTIONS.iter()).copied())
                .map(|close| format!("; did you mean `{close}`?"))
                .unwrap_or_else(|| {
                    String::from(
                        "; a step is a status such as `503`, `reset`, `no_answer` or `malformed`, \
                         with options such as `retry_after=2s`",
                    )
                });
            error_at(word.offset, format!("`{name}` is not a step word{hint}"))
        })?;
    if parts.has(known) {
        return Err(error_at(word.offset, format!("`{known}` is given twice")));
    }
    parts.seen.push((word.offset, known));
    let is_flag = FLAGS.contains(&known);
    let value = match (&word.value, is_flag) {
        (Some(_), true) => {
            return Err(error_at(
                word.offset,
                format!("`{known}` takes no value; write it alone"),
            ));
        }
        (None, false) => {
            return Err(error_at(
                word.offset,
                format!(
                    "`{known}` needs a value: `{known}={}`",
                    example_value(known)
                ),
            ));
        }
        (Some(value), false) => value.as_str(),
        (None, true) => "",
    };
    let value_offset = word.offset + known.chars().count() + 1;
    match known {
        "reset" | "no_answer" | "malformed" => {
            if parts.status.is_some() || parts.kind.is_some() {
                return Err(error_at(
                    word.offset,
                    "a step answers one way; give one status or one of `reset`, `no_answer`, `malformed`",
                ));
            }
            parts.kind = Some(known);
        }
        "no_done" => parts.no_done = true,
        "linger" => parts.linger = true,
        "retry_after" => parts.retry_after = Some(duration(value, value_offset)?),
        "slow_headers" => parts.slow_headers = Some(duration(value, value_offset)?),
        "first_token" => parts.first_token = Some(duration(value, value_offset)?),
        "ping_every" => {
            let every = duration(value, value_offset)?;
            if every.is_zero() {
                return Err(error_at(
                    value_offset,
                    "keep-alives 0 ms apart would never let the answer come; give a longer interval",
                ));
            }
            parts.ping_every = Some(every);
        }
        "cut_after" => parts.cut_after = Some(count(value, value_offset)?),
        "stall_after" => parts.stall_after = Some(count(value, value_offset)?),
        "error_after" => parts.error_after = Some(count(value, value_offset)?),
        "malformed_chunk" => {
            let chunk = count(value, value_offset)?;
            if chunk == 0 {
                return Err(error_at(
                    value_offset,
                    "chunks count from 1; `malformed_chunk=1` breaks the first",
                ));
            }
            parts.malformed_chunk = Some((word.offset, chunk));
        }
        "code" => {
            if value.is_empty() {
                return Err(error_at(value_offset, "`code` needs a non-empty value"));
            }
            parts.code = Some(value.to_string());
        }
        "message" => parts.message = Some(value.to_string()),
        _ => {}
    }
    Ok(())
}

fn example_value(option: &str) -> &'static str {
    match option {
        "retry_after" | "slow_headers" | "first_token" | "ping_every" => "2s",
        "code" => "rate_limited",
        "message" => "\"try again later\"",
        _ => "3",
    }
}

fn duration(value: &str, offset: usize) -> Result<Duration, StepError> {
    parse_duration(value)
        .map(Duration::from_millis)
        .ok_or_else(|| error_at(offset, format!("`{value}` {}", why_not_a_duration(value))))
}

fn count(value: &str, offset: usize) -> Result<u32, StepError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|count| *count <= super::scenario::MAX_CHUNKS)
        .ok_or_else(|| {
            error_at(
                offset,
                format!(
                    "`{value}` is not a chunk count; write a whole number up to {}",
                    super::scenario::MAX_CHUNKS
                ),
            )
        })
}

fn build_action(parts: &Parts) -> Result<Action, StepError> {
    let status = parts.status;
    let is_error = status.is_some_and(|status| !(200..300).contains(&status));
    // `code` and `message` also describe the error event of `error_after`.
    let error_event_options: &[&str] = if parts.has("error_after") {
        &STREAM_ERROR_OPTIONS
    } else {
        &[]
    };
    let misplaced_error_option = ERROR_OPTIONS
        .iter()
        .find(|option| parts.has(option) && !error_event_options.contains(option));
    if !is_error && let Some(option) = misplaced_error_option {
        let or_error_event = if STREAM_ERROR_OPTIONS.contains(option) {
            ", or end a stream with `error_after=N`"
        } else {
            ""
        };
        return Err(error_at(
            parts.offset_of(option),
            format!(
                "`{option}` belongs to an error answer; give an error status such as `429` or `503`{or_error_event}"
            ),
        ));
    }
    if let Some(kind) = parts.kind {
        let allowed: &[&str] = match kind {
            "reset" => &[kind, "slow_headers"],
            "malformed" => &[kind, "slow_headers", "first_token"],
            _ => &[kind],
        };
        if let Some((at, extra)) = parts.seen.iter().find(|(_, name)| !allowed.contains(name)) {
            return Err(error_at(
                *at,
                format!("`{extra}` cannot be combined with `{kind}`"),
            ));
        }
        return Ok(match kind {
            "reset" => Action::Reset,
            "no_answer" => Action::NoAnswer,
            _ => Action::Malformed {
                first_token: parts.first_token,
            },
        });
    }
    if is_error {
        if let Some(option) = STREAM_OPTIONS.iter().find(|option| parts.has(option)) {
            return Err(error_at(
                parts.offset_of(option),
                format!("`{option}` shapes a successful stream; an error answer has no stream"),
            ));
        }
        return Ok(Action::Error(ErrorReply {
            status: status.unwrap_or(500),
            retry_after: parts.retry_after,
            code: parts.code.clone(),
            message: parts.message.clone(),
        }));
    }
    let endings: Vec<&str> = [
        "cut_after",
        "stall_after",
        "error_after",
        "no_done",
        "linger",
    ]
    .into_iter()
    .filter(|ending| parts.has(ending))
    .collect();
    if let [first, second, ..] = endings.as_slice() {
        return Err(error_at(
            parts.offset_of(second),
            format!("`{second}` and `{first}` both say how the stream ends; keep one"),
        ));
    }
    let ending = match (
        parts.cut_after,
        parts.stall_after,
        parts.error_after,
        parts.no_done,
        parts.linger,
    ) {
        (Some(chunks), ..) => Ending::CutAfter(chunks),
        (_, Some(chunks), ..) => Ending::StallAfter(chunks),
        (_, _, Some(chunks), ..) => Ending::ErrorAfter {
            chunks,
            code: parts.code.clone(),
            message: parts.message.clone(),
        },
        (.., true, _) => Ending::NoTerminator,
        (.., true) => Ending::Linger,
        _ => Ending::Complete,
    };
    if let (
        Some((offset, chunk)),
        Ending::CutAfter(sent) | Ending::StallAfter(sent) | Ending::ErrorAfter { chunks: sent, .. },
    ) = (parts.malformed_chunk, &ending)
        && chunk > *sent
    {
        return Err(error_at(
            offset,
            format!("chunk {chunk} is never sent: the stream ends after chunk {sent}"),
        ));
    }
    Ok(Action::Success(Success {
        status: status.unwrap_or(200),
        first_token: parts.first_token,
        ping_every: parts.ping_every,
        ending,
        malformed_chunk: parts.malformed_chunk.map(|(_, chunk)| chunk),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(text: &str) -> Step {
        match parse_step(text) {
            Ok(step) => step,
            Err(error) => panic!("`{text}` does not parse: {error:?}"),
        }
    }

    fn error(text: &str) -> (usize, String) {
        match parse_step(text) {
            Ok(step) => panic!("`{text}` parses: {step:?}"),
            Err(error) => (error.offset, error.message),
        }
    }

    #[test]
    fn statuses_and_error_options() {
        assert_eq!(step("200"), Step::success());
        assert_eq!(
            step("429 retry_after=1500ms code=rate_limited message=\"slow \\\"down\\\"\"").action,
            Action::Error(ErrorReply {
                status: 429,
                retry_after: Some(Duration::from_millis(1500)),
                code: Some(String::from("rate_limited")),
                message: Some(String::from("slow \"down\"")),
            })
        );
        assert_eq!(
            step("  503   code=x ").text,
            "503 code=x",
            "the record shows the step with normal spacing"
        );
        assert_eq!(
            step("503   message=\"two  spaces \\\"q\\\"\"    code=x").text,
            "503 message=\"two  spaces \\\"q\\\"\" code=x",
            "a quoted value keeps its spaces, as it is answered"
        );
    }

    #[test]
    fn stream_shapes() {
        let Action::Success(success) = step("cut_after=3 first_token=20ms").action else {
            panic!("not a success")
        };
        assert_eq!(success.ending, Ending::CutAfter(3));
        assert_eq!(success.first_token, Some(Duration::from_millis(20)));
        let Action::Success(success) = step("201 malformed_chunk=2 no_done").action else {
            panic!("not a success")
        };
        assert_eq!(
            (success.status, success.ending, success.malformed_chunk),
            (201, Ending::NoTerminator, Some(2))
        );
        assert_eq!(
            step("slow_headers=2s").slow_headers,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            step("malformed first_token=5ms").action,
            Action::Malformed {
                first_token: Some(Duration::from_millis(5))
            }
        );
        assert_eq!(step("reset").action, Action::Reset);
        assert_eq!(step("no_answer").action, Action::NoAnswer);
    }

    #[test]
    fn keep_alives_come_at_a_positive_interval_on_a_successful_stream() {
        let Action::Success(success) = step("ping_every=10s first_token=80s").action else {
            panic!("not a success")
        };
        assert_eq!(success.ping_every, Some(Duration::from_secs(10)));
        assert_eq!(success.first_token, Some(Duration::from_secs(80)));
        let (offset, message) = error("ping_every=0s");
        assert_eq!(offset, 11);
        assert!(message.contains("longer interval"), "{message}");
        let (_, message) = error("503 ping_every=1s");
        assert!(message.contains("successful stream"), "{message}");
    }

    #[test]
    fn error_after_takes_the_error_events_code_and_message() {
        let Action::Success(success) = step("error_after=2 code=max_tokens_exceeded").action else {
            panic!("not a success")
        };
        assert_eq!(
            (success.status, success.ending),
            (
                200,
                Ending::ErrorAfter {
                    chunks: 2,
                    code: Some(String::from("max_tokens_exceeded")),
                    message: None,
                }
            )
        );
        let Action::Success(success) = step("error_after=0 message=\"out of room\"").action else {
            panic!("not a success")
        };
        assert_eq!(
            success.ending,
            Ending::ErrorAfter {
                chunks: 0,
                code: None,
                message: Some(String::from("out of room")),
            }
        );
    }

    #[test]
    fn an_empty_option_name_or_value_is_named() {
        assert_eq!(
            error("200 cut_after="),
            (
                4,
                String::from("`cut_after=` has no value; give one after the `=`")
            )
        );
        let (offset, message) = error("=3");
        assert_eq!(offset, 0);
        assert!(message.contains("name is missing"), "{message}");
        // A quoted empty value is a value.
        let quoted = step("503 message=\"\"");
        assert!(matches!(quoted.action, Action::Error(_)));
    }

    #[test]
    fn errors_point_at_the_word() {
        for status in ["204", "205", "304"] {
            let (offset, message) = error(status);
            assert_eq!(offset, 0, "{status}");
            assert!(
                message.contains("an answer without a body"),
                "{status}: {message}"
            );
        }
        assert_eq!(
            error("429 retry_afte=2s"),
            (
                4,
                String::from("`retry_afte` is not a step word; did you mean `retry_after`?")
            )
        );
        assert_eq!(
            error("429 retry_after=2x"),
            (
                16,
                String::from(
                    "`2x` is not a duration; write it like `250ms`, `2s`, `5m`, `1h` or `1d`"
                )
            )
        );
        assert_eq!(
            error("200 retry_after=2s"),
            (
                4,
                String::from(
                    "`retry_after` belongs to an error answer; give an error status such as `429` or `503`"
                )
            )
        );
        assert_eq!(
            error("503 cut_after=2"),
            (
                4,
                String::from(
                    "`cut_after` shapes a successful stream; an error answer has no stream"
                )
            )
        );
        assert_eq!(
            error("cut_after=2 stall_after=1"),
            (
                12,
                String::from(
                    "`stall_after` and `cut_after` both say how the stream ends; keep one"
                )
            )
        );
        assert_eq!(
            error("error_after=1 cut_after=2").1,
            "`error_after` and `cut_after` both say how the stream ends; keep one"
        );
        assert_eq!(
            error("200 code=x"),
            (
                4,
                String::from(
                    "`code` belongs to an error answer; give an error status such as `429` or `503`, or end a stream with `error_after=N`"
                )
            )
        );
        assert_eq!(
            error("error_after=1 retry_after=1s").1,
            "`retry_after` belongs to an error answer; give an error status such as `429` or `503`"
        );
        assert_eq!(
            error("503 code=x error_after=1"),
            (
                11,
                String::from(
                    "`error_after` shapes a successful stream; an error answer has no stream"
                )
            )
        );
        assert_eq!(
            error("reset error_after=1").1,
            "`error_after` cannot be combined with `reset`"
        );
        assert_eq!(
            error("error_after=1 malformed_chunk=2").1,
            "chunk 2 is never sent: the stream ends after chunk 1"
        );
        assert_eq!(
            error("no_done linger").1,
            "`linger` and `no_done` both say how the stream ends; keep one"
        );
        assert_eq!(
            error("reset retry_after=1s").1,
            "`retry_after` belongs to an error answer; give an error status such as `429` or `503`"
        );
        assert_eq!(
            error("no_answer slow_headers=1s"),
            (
                10,
                String::from("`slow_headers` cannot be combined with `no_answer`")
            )
        );
        assert_eq!(
            error("99").1,
            "`99` is not a status a provider answers with; use 200 to 599"
        );
        assert_eq!(error("503 429").0, 4);
        assert_eq!(error("message=\"open").0, 8);
        assert_eq!(error("reset=1").1, "`reset` takes no value; write it alone");
        assert_eq!(
            error("cut_after").1,
            "`cut_after` needs a value: `cut_after=3`"
        );
        assert_eq!(
            error("code=a code=b"),
            (7, String::from("`code` is given twice"))
        );
        assert_eq!(
            error("cut_after=2 malformed_chunk=3").1,
            "chunk 3 is never sent: the stream ends after chunk 2"
        );
        assert_eq!(
            error("malformed_chunk=0").1,
            "chunks count from 1; `malformed_chunk=1` breaks the first"
        );
        assert_eq!(error("").0, 0);
    }
}
