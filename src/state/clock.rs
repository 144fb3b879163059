//! Time as the proxy sees it: milliseconds on a monotonic clock, and sleeps
//! on that clock. Pauses, windows, waits and attempt timeouts all use it, so
//! wall-clock changes do not affect them and tests can move time by hand
//! instead of sleeping through a policy's real durations.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Clock: Send + Sync {
    /// Milliseconds since an arbitrary fixed start.
    fn now_ms(&self) -> u64;

    /// Resolves once `now_ms()` has reached `at_ms`.
    fn sleep_until(&self, at_ms: u64) -> Sleep<'_>;
}

/// The process's monotonic clock.
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        let deadline = self
            .start
            .checked_add(Duration::from_millis(at_ms))
            // Centuries away: as good as never.
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
}

/// A clock that moves only when told to; sleepers wake as it passes their
/// time.
#[derive(Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
    moved: Notify,
}

impl ManualClock {
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
        self.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        Box::pin(async move {
            loop {
                let moved = self.moved.notified();
                tokio::pin!(moved);
                // Registered before the check, so an advance in between
                // still wakes this sleeper.
                moved.as_mut().enable();
                if self.now_ms() >= at_ms {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn manual_sleepers_wake_when_time_passes_them() {
        let clock = Arc::new(ManualClock::default());
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until(1_000).await })
        };
        tokio::task::yield_now().await;
        clock.advance(999);
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(1);
        let woke = tokio::time::timeout(Duration::from_secs(5), sleeper).await;
        assert!(
            woke.is_ok_and(|joined| joined.is_ok()),
            "the sleeper did not wake"
        );
    }
}
