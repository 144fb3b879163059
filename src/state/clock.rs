//! Time as the proxy sees it: milliseconds on a monotonic clock, and sleeps
//! on that clock. Pauses, windows, waits and attempt timeouts all use it, so
//! wall-clock changes do not affect them and tests can move time by hand
//! instead of sleeping through a policy's real durations.

use crate::sync::lock;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A sleep on a [`Clock`], resolving at its wake time.
pub struct Sleep<'a>(SleepKind<'a>);

enum SleepKind<'a> {
    /// On the runtime's timer, which can move it in place.
    Runtime(Pin<Box<tokio::time::Sleep>>),
    Other(Pin<Box<dyn Future<Output = ()> + Send + 'a>>),
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        match &mut self.get_mut().0 {
            SleepKind::Runtime(sleep) => sleep.as_mut().poll(context),
            SleepKind::Other(sleep) => sleep.as_mut().poll(context),
        }
    }
}

pub trait Clock: Send + Sync {
    /// Milliseconds since an arbitrary fixed start.
    fn now_ms(&self) -> u64;

    /// Resolves once `now_ms()` has reached `at_ms`.
    fn sleep_until(&self, at_ms: u64) -> Sleep<'_>;

    /// Moves `sleep` (one of this clock's) to wake at `at_ms` instead.
    fn reset<'c>(&'c self, sleep: &mut Sleep<'c>, at_ms: u64) {
        *sleep = self.sleep_until(at_ms);
    }
}

/// One sleep moved from wake time to wake time, for a wait that is renewed
/// again and again (a stream's idle limit, with every chunk): the runtime's
/// timer is made and registered once, then moved, which for a later wake
/// time costs no lock and no allocation.
#[derive(Default)]
pub struct Timer<'c> {
    sleep: Option<Sleep<'c>>,
}

impl<'c> Timer<'c> {
    /// The sleep, now waking at `at_ms`.
    pub fn until(&mut self, clock: &'c dyn Clock, at_ms: u64) -> &mut Sleep<'c> {
        if let Some(sleep) = self.sleep.as_mut() {
            clock.reset(sleep, at_ms);
        }
        self.sleep.get_or_insert_with(|| clock.sleep_until(at_ms))
    }
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
        Sleep(SleepKind::Runtime(Box::pin(tokio::time::sleep_until(
            self.deadline(at_ms),
        ))))
    }

    fn reset<'c>(&'c self, sleep: &mut Sleep<'c>, at_ms: u64) {
        match &mut sleep.0 {
            SleepKind::Runtime(timer) => timer.as_mut().reset(self.deadline(at_ms)),
            SleepKind::Other(_) => *sleep = self.sleep_until(at_ms),
        }
    }
}

impl SystemClock {
    fn deadline(&self, at_ms: u64) -> tokio::time::Instant {
        self.start
            .checked_add(Duration::from_millis(at_ms))
            // Centuries away: as good as never.
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365))
            .into()
    }
}

/// A clock that moves only when told to; sleepers wake as it passes their
/// time. It also tells what is asleep on it, so a test can move time once
/// the code under test waits, instead of guessing how long that takes.
#[derive(Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
    moved: Notify,
    /// The wake times of the sleeps now pending, one entry per sleep.
    sleeping: Mutex<Vec<u64>>,
}

impl ManualClock {
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// The wake times of the sleeps pending now, soonest first.
    pub fn sleeping_until(&self) -> Vec<u64> {
        let mut times = self.sleepers().clone();
        times.sort_unstable();
        times
    }

    fn sleepers(&self) -> MutexGuard<'_, Vec<u64>> {
        lock(&self.sleeping)
    }
}

/// A pending sleep's entry in [`ManualClock::sleeping_until`], gone with
/// the sleep, whether it woke or was dropped.
struct Asleep<'a> {
    clock: &'a ManualClock,
    at_ms: u64,
}

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        let mut sleepers = self.clock.sleepers();
        if let Some(index) = sleepers.iter().position(|&at| at == self.at_ms) {
            sleepers.swap_remove(index);
        }
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        self.sleepers().push(at_ms);
        let asleep = Asleep { clock: self, at_ms };
        Sleep(SleepKind::Other(Box::pin(async move {
            let _asleep = asleep;
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
        })))
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

    /// Sets a timer on the system clock `first_ms` from now and polls it
    /// once for a millisecond (so the runtime's timer holds it there), then
    /// moves it to `then_ms` from now: whether it woke in that first
    /// millisecond, and whether it wakes within `wait` after the move.
    async fn wakes_after_a_move(first_ms: u64, then_ms: u64, wait: Duration) -> (bool, bool) {
        let clock = SystemClock::new();
        let mut timer = Timer::default();
        let first = clock.now_ms() + first_ms;
        let early =
            tokio::time::timeout(Duration::from_millis(1), timer.until(&clock, first)).await;
        let then = clock.now_ms() + then_ms;
        let woke = tokio::time::timeout(wait, timer.until(&clock, then)).await;
        (early.is_ok(), woke.is_ok())
    }

    #[tokio::test]
    async fn a_timer_moved_earlier_wakes_at_its_new_time() {
        let (early, woke) = wakes_after_a_move(600_000, 10, Duration::from_secs(5)).await;
        assert!(!early);
        assert!(woke, "the timer kept its first wake time");
    }

    #[tokio::test]
    async fn a_timer_moved_later_does_not_wake_at_its_old_time() {
        let (_, woke) = wakes_after_a_move(5, 600_000, Duration::from_millis(200)).await;
        assert!(!woke, "the timer woke at its first wake time");
    }

    #[tokio::test]
    async fn a_timer_on_a_manual_clock_keeps_one_sleep() {
        let clock = ManualClock::default();
        let mut timer = Timer::default();
        timer.until(&clock, 100);
        assert_eq!(clock.sleeping_until(), [100]);
        timer.until(&clock, 300);
        assert_eq!(clock.sleeping_until(), [300]);
        clock.advance(300);
        timer.until(&clock, 300).await;
    }

    #[tokio::test]
    async fn manual_clocks_tell_what_sleeps_on_them() {
        let clock = ManualClock::default();
        let first = clock.sleep_until(300);
        let second = clock.sleep_until(100);
        let third = clock.sleep_until(300);
        assert_eq!(clock.sleeping_until(), [100, 300, 300]);
        drop(first);
        assert_eq!(clock.sleeping_until(), [100, 300]);
        clock.advance(100);
        second.await;
        assert_eq!(clock.sleeping_until(), [300]);
        drop(third);
        assert!(clock.sleeping_until().is_empty());
    }
}
