//! Log lines written out in batches.
//!
//! A proxy under load writes a line per request; a write call for each cost
//! it a few percent of its CPU time per request. Lines wait here instead and
//! go out together: at most `FLUSH_INTERVAL` after the first of them, at
//! once when `BATCH_BYTES` are waiting, and all of them when the program
//! drops its [`FlushOnDrop`]. Should the writer thread fail to start, each
//! line is written as it comes.

use crate::sync::lock;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// The longest a line waits before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// Waiting lines are written at once when they reach this size.
const BATCH_BYTES: usize = 64 * 1024;

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
    waiting: Mutex<Vec<u8>>,
    /// Signalled when a line arrives to an empty batch.
    arrived: Condvar,
    /// Held while a batch is written, so that batches keep their order.
    out: Mutex<W>,
    /// No writer thread: every line is written as it comes.
    unbatched: AtomicBool,
}

impl<W: Write + Send + 'static> Batched<W> {
    /// Starts the thread that writes waiting lines to `out`.
    pub fn start(out: W) -> (Batched<W>, FlushOnDrop<W>) {
        let shared = Arc::new(Shared {
            waiting: Mutex::new(Vec::new()),
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
}

impl<W: Write + Send + 'static> Batched<W> {
    /// Writes `line` at once, after the lines waiting: a status line that
    /// must not wait, and must not come before what was logged earlier.
    pub fn write_now(&self, line: &[u8]) {
        self.shared.write_waiting_and(line);
    }
}

impl<W: Write + Send + 'static> Drop for FlushOnDrop<W> {
    fn drop(&mut self) {
        self.shared.write_waiting();
    }
}

impl<W: Write> Shared<W> {
    /// The writer thread: sleeps while nothing waits, otherwise writes the
    /// batch `FLUSH_INTERVAL` after its first line.
    fn write_as_lines_arrive(&self) {
        loop {
            let mut waiting = lock(&self.waiting);
            while waiting.is_empty() {
                waiting = self
                    .arrived
                    .wait(waiting)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            drop(waiting);
            std::thread::sleep(FLUSH_INTERVAL);
            self.write_waiting();
        }
    }

    fn add(&self, line: &[u8]) {
        let full = {
            let mut waiting = lock(&self.waiting);
            if waiting.is_empty() {
                self.arrived.notify_one();
            }
            waiting.extend_from_slice(line);
            waiting.len() >= BATCH_BYTES || self.unbatched.load(Ordering::Relaxed)
        };
        if full {
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
            let _ = out.write_all(&batch);
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
        self.shared.add(bytes);
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
    fn a_full_batch_is_written_at_once() {
        let sink = Sink::default();
        let (batched, _guard) = Batched::start(sink.clone());
        let line = "x".repeat(BATCH_BYTES - 1) + "\n";
        log(&batched, &line);
        // Written by the call that filled the batch, before it returned.
        assert_eq!(sink.text(), line);
    }
}
