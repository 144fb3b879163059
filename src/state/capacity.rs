//! Requests in flight and admissions per window, per provider, and the
//! queue of requests waiting for room.

use super::InProcess;
use crate::data::CapacityLimits;
// Keyed by catalog ids, never by what a client sends: a fast hash is
// enough, and these maps are looked up several times per request.
use foldhash::HashMap;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

#[derive(Default)]
struct ProviderLoad {
    in_flight: u32,
    /// Admission times (ms) within the provider's window, oldest first.
    admitted: VecDeque<u64>,
}

/// Whether a provider has room now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Room {
    pub available: bool,
    pub in_flight: u32,
    /// When full only because of the window: when its oldest admission
    /// leaves it.
    pub free_in_ms: Option<u64>,
}

#[derive(Default)]
pub(super) struct CapacityTables {
    providers: HashMap<Arc<str>, ProviderLoad>,
    /// Waiting requests by ticket (tickets are numbered in arrival order).
    waiting: HashMap<u64, Waiter>,
    /// Per provider, the tickets waiting for it. Only its first may take
    /// room there, so only its first is woken when room may appear: a
    /// release wakes one waiter, not the queue.
    waiters: HashMap<Arc<str>, BTreeSet<u64>>,
    next_ticket: u64,
}

struct Waiter {
    /// The providers it waits for room at.
    providers: HashSet<Arc<str>>,
    wake: Arc<Notify>,
}

impl CapacityTables {
    /// Room at `provider` for the holder of `ticket` (or for a request that
    /// is not waiting): within the limits, and no earlier waiter wants it.
    pub fn room(
        &mut self,
        provider: &str,
        limits: Option<CapacityLimits>,
        now_ms: u64,
        ticket: Option<u64>,
    ) -> Room {
        // An earlier waiter wants it: for one not waiting, any waiter. (No
        // lookup at all while nobody waits, the usual case.)
        let waiter_ahead = !self.waiters.is_empty()
            && self
                .waiters
                .get(provider)
                .and_then(BTreeSet::first)
                .is_some_and(|first| ticket.is_none_or(|own| *first < own));
        let Some(load) = self.providers.get_mut(provider) else {
            return Room {
                available: !waiter_ahead,
                in_flight: 0,
                free_in_ms: None,
            };
        };
        let mut available = !waiter_ahead;
        let mut free_in_ms = None;
        if let Some(limits) = limits {
            if let Some(concurrent) = limits.concurrent
                && load.in_flight >= concurrent
            {
                available = false;
            }
            if let Some((requests, window_ms)) = limits.window {
                while load
                    .admitted
                    .front()
                    .is_some_and(|at| at.saturating_add(window_ms) <= now_ms)
                {
                    load.admitted.pop_front();
                }
                if load.admitted.len() >= requests as usize {
                    available = false;
                    free_in_ms = load
                        .admitted
                        .front()
                        .map(|oldest| oldest.saturating_add(window_ms).saturating_sub(now_ms));
                }
            } else {
                load.admitted.clear();
            }
        }
        Room {
            available,
            in_flight: load.in_flight,
            free_in_ms,
        }
    }

    pub fn acquire(
        &mut self,
        provider: &str,
        limits: Option<CapacityLimits>,
        now_ms: u64,
        ticket: Option<u64>,
    ) -> bool {
        if !self.room(provider, limits, now_ms, ticket).available {
            return false;
        }
        let load = self.providers.entry(Arc::from(provider)).or_default();
        load.in_flight = load.in_flight.saturating_add(1);
        if limits.is_some_and(|l| l.window.is_some()) {
            load.admitted.push_back(now_ms);
        }
        true
    }

    pub fn release(&mut self, provider: &str) {
        if let Some(load) = self.providers.get_mut(provider) {
            load.in_flight = load.in_flight.saturating_sub(1);
        }
        self.wake_first(provider);
    }

    /// Joins the queue: the ticket's number, and what wakes its holder.
    pub fn enqueue(&mut self, providers: HashSet<Arc<str>>) -> (u64, Arc<Notify>) {
        self.next_ticket += 1;
        let number = self.next_ticket;
        let wake = Arc::new(Notify::new());
        self.waiting.insert(
            number,
            Waiter {
                providers: HashSet::new(),
                wake: wake.clone(),
            },
        );
        self.wait_for(number, providers);
        (number, wake)
    }

    /// Sets the providers the waiter `number` waits for. One it lets go of
    /// may have room for the waiter behind it, which is woken to look.
    pub fn wait_for(&mut self, number: u64, providers: HashSet<Arc<str>>) {
        let Some(waiter) = self.waiting.get_mut(&number) else {
            return;
        };
        let before = std::mem::replace(&mut waiter.providers, providers.clone());
        for provider in before.difference(&providers) {
            self.forget_waiter(provider, number);
        }
        for provider in providers.difference(&before) {
            self.waiters
                .entry(provider.clone())
                .or_default()
                .insert(number);
        }
    }

    pub fn dequeue(&mut self, number: u64) {
        let Some(waiter) = self.waiting.remove(&number) else {
            return;
        };
        for provider in &waiter.providers {
            self.forget_waiter(provider, number);
        }
    }

    /// Takes `number` off `provider`'s queue; if it was first there, the
    /// next in line is woken, as the room it held back is its now.
    fn forget_waiter(&mut self, provider: &Arc<str>, number: u64) {
        let Some(tickets) = self.waiters.get_mut(provider) else {
            return;
        };
        let was_first = tickets.first() == Some(&number);
        tickets.remove(&number);
        if tickets.is_empty() {
            self.waiters.remove(provider);
        } else if was_first {
            self.wake_first(provider);
        }
    }

    /// Wakes the first waiter for `provider`, the only one that may take
    /// room there. A waiter not listening at that moment finds the wake-up
    /// when it next listens.
    fn wake_first(&self, provider: &str) {
        if self.waiters.is_empty() {
            return;
        }
        if let Some(waiter) = self
            .waiters
            .get(provider)
            .and_then(BTreeSet::first)
            .and_then(|first| self.waiting.get(first))
        {
            waiter.wake.notify_one();
        }
    }

    /// Forgets providers no longer in the catalog; every waiter looks again,
    /// as the reload may have changed limits anywhere.
    pub fn retain(&mut self, providers: &HashSet<&str>) {
        self.providers
            .retain(|provider, load| providers.contains(provider.as_ref()) || load.in_flight > 0);
        for waiter in self.waiting.values() {
            waiter.wake.notify_one();
        }
    }

    pub fn in_flight_total(&self) -> u32 {
        self.providers.values().map(|load| load.in_flight).sum()
    }
}

/// Room taken at a provider for one attempt; dropping it gives the room
/// back, whether the attempt ended or its client went away.
pub struct Permit {
    state: Arc<InProcess>,
    provider: Arc<str>,
}

impl Permit {
    pub(super) fn new(state: Arc<InProcess>, provider: &str) -> Permit {
        Permit {
            state,
            provider: Arc::from(provider),
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.state.release(&self.provider);
    }
}

/// A place in the queue of waiting requests; dropping it leaves the queue.
pub struct Ticket {
    state: Arc<InProcess>,
    number: u64,
    wake: Arc<Notify>,
}

impl Ticket {
    pub(super) fn new(state: Arc<InProcess>, (number, wake): (u64, Arc<Notify>)) -> Ticket {
        Ticket {
            state,
            number,
            wake,
        }
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    /// Resolves when room may have appeared for this waiter: at a provider
    /// it is first in line for, or on a reload. A wake-up that came while
    /// nobody listened resolves the next call at once, so a holder that
    /// looks for room after calling this misses none.
    pub fn room_may_have_appeared(&self) -> Notified<'_> {
        self.wake.notified()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.state.dequeue(self.number);
    }
}
