//! What the long-running commands (`serve`, `sim`, `demo`) share: logging,
//! the runtime, and waiting for a signal to stop.

use super::exit;
use super::log_batch::{Batched, FlushOnDrop, FormatLater};
use crate::json_text::write_json_string;
use crate::proxy::{AccessLog, REQUEST_LOG_TARGET, RequestLine, TracingAccessLog};
use clap::ValueEnum;
use std::fmt::{self, Write as _};
use std::io::{IsTerminal, Stderr};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use tracing::Level;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The log of a long-running command.
pub struct Logging {
    /// Writes the lines still waiting when the command ends.
    pub flush: FlushOnDrop<Stderr>,
    /// Where the proxy sends its request lines.
    pub access_log: Arc<dyn AccessLog>,
}

/// Logs at `info` unless `RUST_LOG` says otherwise, to standard error in
/// batches (`log_batch`). Request lines wait unformatted and the log's
/// writer thread formats them, off the requests' path; on a terminal,
/// where tracing colours them, they are tracing events like the rest.
pub fn init_logging(format: LogFormat) -> Logging {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal();
    let (writer, flush) = Batched::start(std::io::stderr());
    let installed_writer = writer.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    // A second initialisation (tests running commands in-process) keeps the first.
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    let access_log: Arc<dyn AccessLog> = if installed.is_ok() && !ansi {
        Arc::new(BatchedAccessLog {
            writer: installed_writer.clone(),
            json: format == LogFormat::Json,
        })
    } else {
        Arc::new(TracingAccessLog)
    };
    if installed.is_ok() {
        let _ = LOG_WRITER.set(StatusWriter {
            writer: installed_writer,
            json: format == LogFormat::Json,
        });
    }
    Logging { flush, access_log }
}

/// The log's writer once `init_logging` installed it, and its format.
static LOG_WRITER: OnceLock<StatusWriter> = OnceLock::new();

struct StatusWriter {
    writer: Batched<Stderr>,
    json: bool,
}

/// Writes a status line (starting, stopping) to standard error at once,
/// after the log lines still waiting to be written.
pub fn status(message: fmt::Arguments<'_>) {
    status_at("INFO", message);
}

/// Writes a problem that stops the command (a policy's diagnostic at
/// start) as [`status`] does, at the error level.
pub fn problem(message: fmt::Arguments<'_>) {
    status_at("ERROR", message);
}

/// Writes something worth knowing that stops nothing (a policy's warning
/// at start) as [`status`] does, at the warning level.
pub fn warning(message: fmt::Arguments<'_>) {
    status_at("WARN", message);
}

/// A status line at `level`: plain text, or with `--log-format json` a
/// JSON object like every other line, so collectors can read them all.
fn status_at(level: &str, message: fmt::Arguments<'_>) {
    match LOG_WRITER.get() {
        Some(StatusWriter { writer, json: true }) => {
            writer.write_now(json_status_line(level, &message.to_string()).as_bytes());
        }
        Some(StatusWriter {
            writer,
            json: false,
        }) => {
            writer.write_now(format!("{message}\n").as_bytes());
        }
        None => say_err!("{message}"),
    }
}

/// A status line as a JSON object, as tracing's JSON lines are.
fn json_status_line(level: &str, message: &str) -> String {
    let mut line = String::from("{\"timestamp\":\"");
    let _ = write_timestamp(&mut line, std::time::SystemTime::now());
    let _ = write!(line, "\",\"level\":\"{level}\",\"fields\":{{\"message\":");
    let _ = write_json_string(&mut line, message.trim_end());
    line.push_str("},\"target\":\"switchyard\"}\n");
    line
}

/// An error before logging starts (the command line's), as a JSON line on
/// standard error.
pub fn json_error(message: &str) {
    use std::io::Write as _;
    let line = json_status_line("ERROR", message);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A fatal error in the command's use or set-up: a status line, exit 2.
pub fn fail(message: impl fmt::Display) -> ExitCode {
    status_at("ERROR", format_args!("error: {message}"));
    ExitCode::from(exit::USAGE)
}

/// Below this many open files a warning says how few requests fit.
const FEW_OPEN_FILES: u64 = 4096;

/// Raises the soft limit on open files to the hard one, as Go's runtime
/// does for its servers. Each request in flight holds two sockets (the
/// client's and the provider's), and the soft limit shells and systemd
/// give by default, 1,024, would cap the proxy near 500 at once: past it
/// connections wait unaccepted and upstream connects fail.
pub fn raise_open_file_limit() {
    #[cfg(unix)]
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < FEW_OPEN_FILES => tracing::warn!(
            limit,
            "the open-file limit allows about {} requests in flight; raise the hard limit \
             (`ulimit -Hn`, systemd's LimitNOFILE) for more",
            limit / 2
        ),
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(error) => tracing::warn!(%error, "could not raise the open-file limit"),
    }
}

pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// The signals a long-running command answers, listened for from the
/// moment they are made: before that, SIGTERM and SIGHUP take their default
/// action and end the process on the spot. Made before the command says it
/// is ready, so that a signal sent on reading that line is always handled.
pub struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Starts listening for SIGINT and SIGTERM; inside the runtime.
    pub fn to_stop() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
                hangup: None,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// The same, and for SIGHUP, which reloads.
    pub fn to_stop_or_reload() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let hangup = signal(SignalKind::hangup())?;
            let mut signals = Signals::to_stop()?;
            signals.hangup = Some(hangup);
            Ok(signals)
        }
        #[cfg(not(unix))]
        {
            Signals::to_stop()
        }
    }

    /// SIGHUP's stream, for whoever reloads on it; `None` once taken or
    /// where there is no SIGHUP.
    #[cfg(unix)]
    pub fn take_hangup(&mut self) -> Option<tokio::signal::unix::Signal> {
        self.hangup.take()
    }

    /// Resolves on SIGINT (Ctrl-C) or SIGTERM.
    pub async fn stopped(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => {}
                _ = self.terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Parses a `--listen` address, saying what form it takes.
pub fn listen_arg(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!(
            "`{text}` is not an IP address and port; write one such as 127.0.0.1:8080 \
             or [::1]:8080 (host names such as localhost are not looked up)"
        )
    })
}

/// Parses a duration such as `10s` or `250ms` for a command-line option.
pub fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    crate::data::schema::parse_duration(text)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| format!("`{text}` {}", crate::data::schema::why_not_a_duration(text)))
}

/// Request lines for the log's writer thread, subject to `RUST_LOG` like
/// every other event.
struct BatchedAccessLog {
    writer: Batched<Stderr>,
    json: bool,
}

impl AccessLog for BatchedAccessLog {
    fn write(&self, line: RequestLine) {
        if tracing::enabled!(target: REQUEST_LOG_TARGET, Level::INFO) {
            self.writer.add_later(Box::new(LaterLine {
                line,
                json: self.json,
            }));
        }
    }
}

struct LaterLine {
    line: RequestLine,
    json: bool,
}

impl FormatLater for LaterLine {
    fn format(&self, out: &mut String) {
        // Writing to a `String` cannot fail.
        let _ = write_request_line(out, &self.line, self.json);
    }
}

/// A request line exactly as tracing's text or JSON formatter writes the
/// event `TracingAccessLog` makes of it (a test compares them), without
/// tracing's dispatch and its `Debug`-with-escaping path per field.
fn write_request_line(out: &mut String, line: &RequestLine, json: bool) -> fmt::Result {
    if json {
        out.write_str("{\"timestamp\":\"")?;
        write_timestamp(out, line.at)?;
        out.write_str("\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\"")?;
    } else {
        write_timestamp(out, line.at)?;
        out.write_str("  INFO ")?;
        out.write_str(REQUEST_LOG_TARGET)?;
        out.write_str(": request")?;
    }
    let mut fields = Fields { out, json };
    fields.text("request_id", &line.request_id)?;
    fields.text("endpoint", line.endpoint)?;
    fields.text("tenant", &line.tenant)?;
    fields.text("model", &line.model)?;
    // Quoted, as they hold spaces: a line splits into its fields.
    fields.text("decision", &line.decision)?;
    if let Some(exchange) = &line.exchange {
        let mut attempts = String::with_capacity(32 * exchange.report.attempts.len());
        exchange.write_attempts(&mut attempts)?;
        fields.text("attempts", &attempts)?;
        fields.text("served_by", exchange.served_by())?;
        fields.text("served_model", exchange.served_model())?;
        if let Some((input_tokens, output_tokens)) = exchange.tokens() {
            fields.number("input_tokens", input_tokens)?;
            fields.number("output_tokens", output_tokens)?;
        }
        fields.number("waited_ms", exchange.report.waited_ms)?;
        fields.number("status", line.status.into())?;
        fields.text("outcome", line.outcome)?;
        fields.text("error", line.error())?;
        fields.number("ms", exchange.ms)?;
    } else {
        fields.number("status", line.status.into())?;
        fields.text("outcome", line.outcome)?;
        fields.text("error", line.error())?;
    }
    if json {
        out.write_str("},\"target\":")?;
        write_json_string(out, REQUEST_LOG_TARGET)?;
        out.write_str("}\n")
    } else {
        out.write_str("\n")
    }
}

/// Fields after the message, as tracing's formatters write them. Text:
/// `name=value`, strings quoted and escaped as `Debug` does. JSON: numbers
/// as numbers, everything else as a string.
struct Fields<'a> {
    out: &'a mut String,
    json: bool,
}

impl Fields<'_> {
    fn name(&mut self, name: &str) -> fmt::Result {
        if self.json {
            self.out.push_str(",\"");
            self.out.push_str(name);
            self.out.push_str("\":");
        } else {
            self.out.push(' ');
            self.out.push_str(name);
            self.out.push('=');
        }
        Ok(())
    }

    /// A string field.
    fn text(&mut self, name: &str, value: &str) -> fmt::Result {
        self.name(name)?;
        if self.json {
            write_json_string(self.out, value)
        } else if value.bytes().all(is_plain) {
            self.out.push('"');
            self.out.push_str(value);
            self.out.push('"');
            Ok(())
        } else {
            write!(self.out, "{value:?}")
        }
    }

    fn number(&mut self, name: &str, value: u64) -> fmt::Result {
        self.name(name)?;
        write_u64(self.out, value)
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

/// A time as tracing's `SystemTime` writes the current one
/// (`2026-11-30T10:25:48.589122Z`), without its formatting machinery.
fn write_timestamp(out: &mut String, at: std::time::SystemTime) -> fmt::Result {
    match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(since_epoch) if since_epoch.as_secs() < LAST_FOUR_DIGIT_YEAR_ENDS => {
            write_utc(out, since_epoch.as_secs(), since_epoch.subsec_micros())
        }
        // Before 1970 or after 9999: tracing's own, signs and all.
        _ => tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(out)),
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
    use crate::proxy::{AttemptRecord, ExchangeLine, Report};
    use std::sync::Mutex;
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

    fn samples() -> Vec<RequestLine> {
        let attempt = |provider: &str, outcome: &str, millis| AttemptRecord {
            provider: provider.to_string(),
            credential: String::from("c"),
            outcome: outcome.to_string(),
            millis,
        };
        let served = RequestLine {
            at: std::time::SystemTime::now(),
            request_id: std::sync::Arc::from("req_1"),
            endpoint: "chat_completions",
            tenant: String::from("acme"),
            model: String::from("nön\u{1}\u{7f}ex\tist \"q\\\\ 🚀"),
            decision: String::from("plan a,b (at most 3) \"x\"\\"),
            status: 200,
            outcome: "served",
            error: None,
            exchange: Some(ExchangeLine {
                report: Report {
                    status: 200,
                    outcome: "served",
                    attempts: vec![attempt("a", "timeout", 10_000), attempt("b", "ok", 0)],
                    served_provider: Some(String::from("b")),
                    served_model: Some(String::from("m\"x")),
                    usage: Some((12, 0)),
                    waited_ms: 7,
                    error: None,
                },
                ms: u64::MAX,
            }),
        };
        let failed = RequestLine {
            exchange: Some(ExchangeLine {
                report: Report {
                    status: 503,
                    outcome: "error",
                    error: Some(String::from("provider_overloaded")),
                    ..Report::default()
                },
                ms: 0,
            }),
            status: 503,
            outcome: "error",
            error: Some(String::from("provider_overloaded")),
            ..served.clone()
        };
        let refused = RequestLine {
            tenant: String::new(),
            model: String::new(),
            decision: String::from("refused unauthorized"),
            status: 401,
            outcome: "unauthorized",
            error: Some(String::from("invalid_api_key")),
            exchange: None,
            ..served.clone()
        };
        vec![served, failed, refused]
    }

    fn without_timestamp(line: &str, json: bool) -> String {
        match line.split_once(if json { "Z\"" } else { "Z " }) {
            Some((_, rest)) => rest.to_string(),
            None => line.to_string(),
        }
    }

    /// Tracing's own formatter's lines for the samples' events.
    fn tracing_lines(json: bool) -> Vec<String> {
        let captured = Captured::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false);
        let emit = || {
            for line in samples() {
                TracingAccessLog.write(line);
            }
        };
        if json {
            tracing::subscriber::with_default(builder.json().finish(), emit);
        } else {
            tracing::subscriber::with_default(builder.finish(), emit);
        }
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| without_timestamp(line, json))
            .collect()
    }

    #[test]
    fn request_lines_read_as_tracing_writes_them() {
        for json in [false, true] {
            let lean: Vec<String> = samples()
                .iter()
                .map(|line| {
                    let mut text = String::new();
                    write_request_line(&mut text, line, json).unwrap();
                    assert!(text.ends_with('\n'));
                    without_timestamp(text.trim_end(), json)
                })
                .collect();
            assert_eq!(lean.len(), 3);
            assert_eq!(lean, tracing_lines(json), "json: {json}");
            // Usage the provider did not report is left out, not zero.
            assert!(lean[0].contains("input_tokens"), "{}", lean[0]);
            assert!(!lean[1].contains("input_tokens"), "{}", lean[1]);
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
