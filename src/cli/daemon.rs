//! What the long-running commands (`serve`, `sim`, `demo`) share: logging,
//! the runtime, and waiting for a signal to stop.

use super::log_batch::{Batched, FlushOnDrop};
use crate::json_text::{JsonEscaped, write_json_string};
use crate::proxy::REQUEST_LOG_TARGET;
use clap::ValueEnum;
use std::fmt::{self, Write as _};
use std::io::{IsTerminal, Stderr};
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logs at `info` unless `RUST_LOG` says otherwise, to standard error in
/// batches (`log_batch`); the lines still waiting are written when the
/// returned guard drops.
pub fn init_logging(format: LogFormat) -> FlushOnDrop<Stderr> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal();
    let (writer, guard) = Batched::start(std::io::stderr());
    let installed_writer = writer.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    // A second initialisation (tests running commands in-process) keeps the first.
    let installed = match format {
        LogFormat::Text => builder
            .event_format(RequestLines::text(tracing_subscriber::fmt::format()))
            .try_init(),
        LogFormat::Json => builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(RequestLines::json(tracing_subscriber::fmt::format().json()))
            .try_init(),
    };
    if installed.is_ok() {
        let _ = LOG_WRITER.set(installed_writer);
    }
    guard
}

/// The log's writer once `init_logging` installed it.
static LOG_WRITER: OnceLock<Batched<Stderr>> = OnceLock::new();

/// Writes a status line (starting, stopping, a fatal error) to standard
/// error at once, after the log lines still waiting to be written.
pub fn status(message: fmt::Arguments<'_>) {
    match LOG_WRITER.get() {
        Some(writer) => writer.write_now(format!("{message}\n").as_bytes()),
        None => eprintln!("{message}"),
    }
}

pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// Resolves on SIGINT or SIGTERM.
pub async fn stop_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// Parses a duration such as `10s` or `250ms` for a command-line option.
pub fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    crate::data::schema::parse_duration(text)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration such as `10s` or `250ms`"))
}

/// Writes the request lines (target [`REQUEST_LOG_TARGET`], one per request)
/// exactly as tracing's own formatter `fallback` would, but without its
/// generic path: that writes every field through `Debug` with escaping and
/// styling checks, a tenth of a request's instructions. Other events, a
/// terminal's coloured lines and events inside spans go to `fallback`.
pub struct RequestLines<F> {
    fallback: F,
    json: bool,
}

impl<F> RequestLines<F> {
    pub fn text(fallback: F) -> Self {
        RequestLines {
            fallback,
            json: false,
        }
    }

    pub fn json(fallback: F) -> Self {
        RequestLines {
            fallback,
            json: true,
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for RequestLines<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if meta.target() != REQUEST_LOG_TARGET
            || writer.has_ansi_escapes()
            || context.lookup_current().is_some()
        {
            return self.fallback.format_event(context, writer, event);
        }
        if self.json {
            writer.write_str("{\"timestamp\":\"")?;
            write_timestamp(&mut writer)?;
            writer.write_str("\",\"level\":\"")?;
            writer.write_str(meta.level().as_str())?;
            writer.write_str("\",\"fields\":{")?;
            let mut fields = Fields::new(&mut writer, true);
            event.record(&mut fields);
            fields.result?;
            writer.write_str("},\"target\":")?;
            write_json_string(&mut writer, meta.target())?;
            writer.write_str("}\n")
        } else {
            write_timestamp(&mut writer)?;
            writer.write_str(match *meta.level() {
                Level::TRACE => " TRACE ",
                Level::DEBUG => " DEBUG ",
                Level::INFO => "  INFO ",
                Level::WARN => "  WARN ",
                Level::ERROR => " ERROR ",
            })?;
            writer.write_str(meta.target())?;
            writer.write_str(": ")?;
            let mut fields = Fields::new(&mut writer, false);
            event.record(&mut fields);
            fields.result?;
            writer.write_str("\n")
        }
    }
}

/// Fields as tracing's formatters write them. Text: the message bare, then
/// `name=value`, strings quoted and escaped as `Debug` does. JSON: numbers
/// as numbers, everything else as a string (`Debug` for values that are not
/// strings).
struct Fields<'a, W> {
    out: &'a mut W,
    json: bool,
    first: bool,
    result: fmt::Result,
}

impl<'a, W: fmt::Write> Fields<'a, W> {
    fn new(out: &'a mut W, json: bool) -> Self {
        Fields {
            out,
            json,
            first: true,
            result: Ok(()),
        }
    }

    /// Writes a field's name, then its value with `value`; after the first
    /// error the line is abandoned.
    fn write(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = self.name(field).and_then(|()| value(&mut *self.out));
    }

    fn name(&mut self, field: &Field) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.out.write_char(if self.json { ',' } else { ' ' })?;
        }
        if self.json {
            write_json_string(self.out, field.name())?;
            return self.out.write_char(':');
        }
        if field.name() == "message" {
            return Ok(());
        }
        self.out
            .write_str(field.name().strip_prefix("r#").unwrap_or(field.name()))?;
        self.out.write_char('=')
    }
}

impl<W: fmt::Write> Visit for Fields<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let json = self.json;
        self.write(field, |out| {
            if json {
                write_json_string(out, value)
            } else if field.name() == "message" {
                out.write_str(value)
            } else if value.bytes().all(is_plain) {
                out.write_char('"')?;
                out.write_str(value)?;
                out.write_char('"')
            } else {
                write!(out, "{value:?}")
            }
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.write(field, |out| write_u64(out, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let json = self.json;
        self.write(field, |out| {
            if json {
                out.write_char('"')?;
                write!(JsonEscaped(&mut *out), "{value:?}")?;
                out.write_char('"')
            } else {
                write!(out, "{value:?}")
            }
        });
    }
}

/// A byte that neither `Debug` nor JSON escapes.
fn is_plain(byte: u8) -> bool {
    (b' '..=b'~').contains(&byte) && byte != b'"' && byte != b'\\'
}

/// Writes `value`'s decimal digits, most significant first.
fn write_u64(out: &mut (impl fmt::Write + ?Sized), value: u64) -> fmt::Result {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = value;
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
        start -= 1;
        if rest == 0 {
            break;
        }
    }
    let text = digits
        .get(start..)
        .and_then(|digits| std::str::from_utf8(digits).ok())
        .unwrap_or("0");
    out.write_str(text)
}

/// The current time as tracing's `SystemTime` writes it
/// (`2026-11-30T10:25:48.589122Z`), without its formatting machinery.
fn write_timestamp(out: &mut Writer<'_>) -> fmt::Result {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(since_epoch) if since_epoch.as_secs() < LAST_FOUR_DIGIT_YEAR_ENDS => {
            write_utc(out, since_epoch.as_secs(), since_epoch.subsec_micros())
        }
        // Before 1970 or after 9999: tracing's own, signs and all.
        _ => tracing_subscriber::fmt::time::SystemTime.format_time(out),
    }
}

/// 10000-01-01T00:00:00Z, in seconds since the epoch.
const LAST_FOUR_DIGIT_YEAR_ENDS: u64 = 253_402_300_800;

/// Seconds since the epoch as a UTC date and time, the civil calendar
/// computed as in Howard Hinnant's `civil_from_days`.
fn write_utc(out: &mut impl fmt::Write, seconds: u64, micros: u32) -> fmt::Result {
    let days = seconds / 86_400;
    let of_day = seconds % 86_400;
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let of_era = shifted % 146_097;
    let year_of_era = (of_era - of_era / 1_460 + of_era / 36_524 - of_era / 146_096) / 365;
    let day_of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    let parts = [
        (year, 4, b'-'),
        (month, 2, b'-'),
        (day, 2, b'T'),
        (of_day / 3_600, 2, b':'),
        (of_day / 60 % 60, 2, b':'),
        (of_day % 60, 2, b'.'),
        (u64::from(micros), 6, b'Z'),
    ];
    // Written whole: one write instead of one per character.
    let mut text = [0u8; 27];
    let mut slots = text.iter_mut();
    for (value, width, after) in parts {
        let mut unit = 10u64.pow(width - 1);
        while unit > 0 {
            if let Some(slot) = slots.next() {
                *slot = b'0' + (value / unit % 10) as u8;
            }
            unit /= 10;
        }
        if let Some(slot) = slots.next() {
            *slot = after;
        }
    }
    out.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    fn emit() {
        let decision = String::from("plan a,b (at most 3)");
        tracing::info!(
            target: REQUEST_LOG_TARGET,
            request_id = "req_1",
            endpoint = "chat_completions",
            tenant = "acme",
            model = "nön\u{1}\u{7f}ex\tist \"q\\\\ 🚀",
            decision = %decision,
            attempts = %format_args!("a:timeout:{}ms b:ok:{}ms", 10_000, 0),
            input_tokens = 12u64,
            status = 200u16,
            outcome = "served",
            ms = u64::MAX,
            "request"
        );
        tracing::warn!(provider = %"p", variable = "X\"Y", "the credential's variable is not set");
    }

    /// The lines of `emit` without their timestamps.
    fn lines(json: bool, lean: bool) -> Vec<String> {
        let captured = Captured::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false);
        if json {
            let builder = builder.fmt_fields(tracing_subscriber::fmt::format::JsonFields::new());
            let fallback = tracing_subscriber::fmt::format().json();
            if lean {
                tracing::subscriber::with_default(
                    builder.event_format(RequestLines::json(fallback)).finish(),
                    emit,
                );
            } else {
                tracing::subscriber::with_default(builder.event_format(fallback).finish(), emit);
            }
        } else {
            let fallback = tracing_subscriber::fmt::format();
            if lean {
                tracing::subscriber::with_default(
                    builder.event_format(RequestLines::text(fallback)).finish(),
                    emit,
                );
            } else {
                tracing::subscriber::with_default(builder.event_format(fallback).finish(), emit);
            }
        }
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| match line.split_once("Z\"") {
                Some((_, rest)) if json => rest.to_string(),
                _ if json => line.to_string(),
                _ => line
                    .split_once("Z ")
                    .map_or(line, |(_, rest)| rest)
                    .to_string(),
            })
            .collect()
    }

    #[test]
    fn request_lines_read_as_tracing_writes_them() {
        for json in [false, true] {
            let lean = lines(json, true);
            assert_eq!(lean.len(), 2);
            assert_eq!(lean, lines(json, false), "json: {json}");
        }
    }

    #[test]
    fn timestamps_in_utc() {
        let utc = |seconds, micros| {
            let mut text = String::new();
            write_utc(&mut text, seconds, micros).unwrap();
            text
        };
        assert_eq!(utc(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(utc(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(utc(1_795_948_748, 589_122), "2026-11-29T10:39:08.589122Z");
        assert_eq!(
            utc(LAST_FOUR_DIGIT_YEAR_ENDS - 1, 999_999),
            "9999-12-31T23:59:59.999999Z"
        );
    }
}
