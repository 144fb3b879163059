//! Log lines written out in batches.
//!
//! A proxy under load writes a line per request; a write call for each cost
//! it a few percent of its CPU time per request. Lines wait here instead and
//! go out together, from a writer thread: at most `FLUSH_INTERVAL` after the
//! first of them, sooner once `BATCH_BYTES` are waiting, and all of them
//! when the program drops its [`FlushOnDrop`]. A line may also wait
//! unformatted ([`FormatLater`]): the writer thread formats it, so that the
//! thread that logged it does not. Should the writer thread fail to start,
//! or fall far behind, the logging call writes the batch itself.

use crate::sync::lock;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing_subscriber::fmt::MakeWriter;

/// The longest a line waits before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// The writer thread writes at once when this much is waiting.
const BATCH_BYTES: usize = 64 * 1024;

/// When this much is waiting the writer thread is behind, and the logging
/// call writes the batch itself rather than let it grow.
const BEHIND_BYTES: usize = 4 * BATCH_BYTES;

/// What a line that waits unformatted counts towards the batch's size.
const LATER_LINE_BYTES: usize = 384;

/// A line formatted only when its batch is written.
pub trait FormatLater: Send {
    fn format(&self, out: &mut String);
}

/// The log's writer, for tracing's formatter: each line it formats is added
/// to the batch.
pub struct Batched<W: Write + Send + 'static> {
    shared: Arc<Shared<W>>,
}

impl<W: Write + Send + 'static> Clone for Batched<W> {
    fn clone(&self) -> Self {
        Batched {
            shared: self.shared.clone(),
        }
    }
}

/// Writes the lines still waiting when dropped: held by the command that
/// logs, until it ends.
pub struct FlushOnDrop<W: Write + Send + 'static> {
    shared: Arc<Shared<W>>,
}

struct Shared<W> {
    waiting: Mutex<Batch>,
    /// Signalled when a line arrives to an empty batch, and when the batch
    /// becomes full.
    arrived: Condvar,
    /// Held while a batch is written, so that batches keep their order.
    out: Mutex<W>,
    /// No writer thread: every line is written as it comes.
    unbatched: AtomicBool,
}

/// Lines waiting, in order: formatted text, and the lines still to be
/// formatted with where in the text each goes.
#[derive(Default)]
struct Batch {
    text: Vec<u8>,
    later: Vec<(usize, Box<dyn FormatLater>)>,
    /// The text's length plus an estimate for each line still unformatted.
    size: usize,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.later.is_empty()
    }

    /// Everything in order, the unformatted lines formatted.
    fn into_bytes(self) -> Vec<u8> {
        if self.later.is_empty() {
            return self.text;
        }
        let mut bytes = Vec::with_capacity(self.size);
        let mut line = String::new();
        let mut written = 0;
        for (at, later) in &self.later {
            bytes.extend_from_slice(self.text.get(written..*at).unwrap_or_default());
            written = *at;
            line.clear();
            later.format(&mut line);
            bytes.extend_from_slice(line.as_bytes());
        }
        bytes.extend_from_slice(self.text.get(written..).unwrap_or_default());
        bytes
    }
}

impl<W: Write + Send + 'static> Batched<W> {
    /// Starts the thread that writes waiting lines to `out`.
    pub fn start(out: W) -> (Batched<W>, FlushOnDrop<W>) {
        let shared = Arc::new(Shared {
            waiting: Mutex::new(Batch::default()),
            arrived: Condvar::new(),
            out: Mutex::new(out),
            unbatched: AtomicBool::new(false),
        });
        let flusher = shared.clone();
        let started = std::thread::Builder::new()
            .name(String::from("log-writer"))
            .spawn(move || flusher.write_as_lines_arrive());
        if started.is_err() {
            shared.unbatched.store(true, Ordering::Relaxed);
        }
        (
            Batched {
                shared: shared.clone(),
            },
            FlushOnDrop { shared },
        )
    }

    /// Writes `line` at once, after the lines waiting: a status line that
    /// must not wait, and must not come before what was logged earlier.
    pub fn write_now(&self, line: &[u8]) {
        self.shared.write_waiting_and(line);
    }

    /// Adds a line that the writer thread formats when it writes the batch.
    pub fn add_later(&self, line: Box<dyn FormatLater>) {
        self.shared.add(|batch| {
            batch.later.push((batch.text.len(), line));
            LATER_LINE_BYTES
        });
    }
}

impl<W: Write + Send + 'static> Drop for FlushOnDrop<W> {
    fn drop(&mut self) {
        self.shared.write_waiting();
    }
}

impl<W: Write> Shared<W> {
    /// The writer thread: sleeps while nothing waits, otherwise writes the
    /// batch `FLUSH_INTERVAL` after its first line, or once it is full.
    fn write_as_lines_arrive(&self) {
        loop {
            let mut waiting = lock(&self.waiting);
            while waiting.is_empty() {
                waiting = self
                    .arrived
                    .wait(waiting)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let due = Instant::now() + FLUSH_INTERVAL;
            while waiting.size < BATCH_BYTES {
                let Some(left) = due.checked_duration_since(Instant::now()) else {
                    break;
                };
                waiting = self
                    .arrived
                    .wait_timeout(waiting, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            drop(waiting);
            self.write_waiting();
        }
    }

    /// Adds to the batch with `push`, which returns the size it added.
    fn add(&self, push: impl FnOnce(&mut Batch) -> usize) {
        let behind = {
            let mut waiting = lock(&self.waiting);
            let was_empty = waiting.is_empty();
            let before = waiting.size;
            waiting.size += push(&mut waiting);
            if was_empty || (before < BATCH_BYTES && waiting.size >= BATCH_BYTES) {
                self.arrived.notify_one();
            }
            waiting.size >= BEHIND_BYTES || self.unbatched.load(Ordering::Relaxed)
        };
        if behind {
            self.write_waiting();
        }
    }

    fn write_waiting(&self) {
        self.write_waiting_and(&[]);
    }

    fn write_waiting_and(&self, line: &[u8]) {
        let mut out = lock(&self.out);
        let batch = std::mem::take(&mut *lock(&self.waiting));
        if !batch.is_empty() || !line.is_empty() {
            // A log that cannot be written has nowhere to say so.
            let _ = out.write_all(&batch.into_bytes());
            let _ = out.write_all(line);
            let _ = out.flush();
        }
    }
}

/// One formatted line on its way into the batch.
pub struct Line<'a, W> {
    shared: &'a Shared<W>,
}

impl<W: Write> Write for Line<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.shared.add(|batch| {
            batch.text.extend_from_slice(bytes);
            bytes.len()
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a, W: Write + Send + 'static> MakeWriter<'a> for Batched<W> {
    type Writer = Line<'a, W>;

    fn make_writer(&'a self) -> Line<'a, W> {
        Line {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Instant;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn log(batched: &Batched<Sink>, line: &str) {
        batched.make_writer().write_all(line.as_bytes()).unwrap();
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_the_guard_drops() {
        let sink = Sink::default();
        let (batched, guard) = Batched::start(sink.clone());
        let lines: Vec<String> = (0..1000).map(|n| format!("line {n}\n")).collect();
        for line in &lines {
            log(&batched, line);
        }
        drop(guard);
        assert_eq!(sink.text(), lines.concat());
    }

    #[test]
    fn a_line_goes_out_without_waiting_for_the_end() {
        let sink = Sink::default();
        let (batched, _guard) = Batched::start(sink.clone());
        log(&batched, "alone\n");
        // Liveness only: the writer thread writes it on its own, soon.
        let given_up = Instant::now() + Duration::from_secs(10);
        while sink.text().is_empty() && Instant::now() < given_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sink.text(), "alone\n");
    }

    #[test]
    fn a_status_line_goes_out_at_once_after_the_lines_before_it() {
        let sink = Sink::default();
        let (batched, _guard) = Batched::start(sink.clone());
        log(&batched, "logged\n");
        batched.write_now(b"status\n");
        assert_eq!(sink.text(), "logged\nstatus\n");
    }

    #[test]
    fn a_batch_far_behind_is_written_by_the_call_that_fills_it() {
        let sink = Sink::default();
        let (batched, _guard) = Batched::start(sink.clone());
        let line = "x".repeat(BEHIND_BYTES - 1) + "\n";
        log(&batched, &line);
        assert_eq!(sink.text(), line);
    }

    struct Numbered(usize);

    impl FormatLater for Numbered {
        fn format(&self, out: &mut String) {
            out.push_str(&format!("later {}\n", self.0));
        }
    }

    #[test]
    fn lines_formatted_later_keep_their_place() {
        let sink = Sink::default();
        let (batched, guard) = Batched::start(sink.clone());
        let mut expected = String::new();
        for n in 0..1000 {
            if n % 3 == 0 {
                batched.add_later(Box::new(Numbered(n)));
                expected.push_str(&format!("later {n}\n"));
            } else {
                let line = format!("line {n}\n");
                log(&batched, &line);
                expected.push_str(&line);
            }
        }
        batched.write_now(b"status\n");
        expected.push_str("status\n");
        batched.add_later(Box::new(Numbered(1000)));
        expected.push_str("later 1000\n");
        drop(guard);
        assert_eq!(sink.text(), expected);
    }
}
