//! Requests in flight and admissions per window, per provider, and the
//! queue of requests waiting for room.

use super::InProcess;
use crate::data::CapacityLimits;
// Keyed by catalog ids, never by what a client sends: a fast hash is
// enough, and these maps are looked up several times per request.
use foldhash::HashMap;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Arc;

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
    /// Waiting requests by ticket (tickets are numbered in arrival order),
    /// with the providers each waits for room at.
    waiting: HashMap<u64, HashSet<Arc<str>>>,
    /// Per provider, the tickets waiting for it. Its first is the only one
    /// a room check needs: every waiter wakes on each release, so a check
    /// that walked the whole queue made a release cost the queue's length
    /// squared.
    waiters: HashMap<Arc<str>, BTreeSet<u64>>,
    next_ticket: u64,
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
    }

    pub fn enqueue(&mut self, providers: HashSet<Arc<str>>) -> u64 {
        self.next_ticket += 1;
        let number = self.next_ticket;
        self.wait_for(number, providers);
        number
    }

    /// Sets the providers the waiter `number` waits for; whether it let go
    /// of any.
    pub fn wait_for(&mut self, number: u64, providers: HashSet<Arc<str>>) -> bool {
        let before = self.waiting.remove(&number).unwrap_or_default();
        let let_go = before.iter().any(|provider| !providers.contains(provider));
        for provider in &before {
            self.forget_waiter(provider, number);
        }
        for provider in &providers {
            self.waiters
                .entry(provider.clone())
                .or_default()
                .insert(number);
        }
        self.waiting.insert(number, providers);
        let_go
    }

    pub fn dequeue(&mut self, number: u64) {
        for provider in self.waiting.remove(&number).unwrap_or_default() {
            self.forget_waiter(&provider, number);
        }
    }

    fn forget_waiter(&mut self, provider: &Arc<str>, number: u64) {
        if let Some(tickets) = self.waiters.get_mut(provider) {
            tickets.remove(&number);
            if tickets.is_empty() {
                self.waiters.remove(provider);
            }
        }
    }

    pub fn retain(&mut self, providers: &HashSet<&str>) {
        self.providers
            .retain(|provider, load| providers.contains(provider.as_ref()) || load.in_flight > 0);
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
}

impl Ticket {
    pub(super) fn new(state: Arc<InProcess>, number: u64) -> Ticket {
        Ticket { state, number }
    }

    pub fn number(&self) -> u64 {
        self.number
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.state.dequeue(self.number);
    }
}
