//! Requests in flight and admissions per window, per provider, and the
//! queue of requests waiting for room.

use super::InProcess;
use crate::data::CapacityLimits;
// Keyed by catalog ids, never by what a client sends: a fast hash is
// enough, and these maps are looked up several times per request.
use foldhash::HashMap;
use std::collections::{HashSet, VecDeque};
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
    /// Waiting requests in arrival order, with the providers each can use.
    queue: VecDeque<(u64, HashSet<Arc<str>>)>,
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
        let waiter_ahead = self
            .queue
            .iter()
            .take_while(|(number, _)| Some(*number) != ticket)
            .any(|(_, providers)| providers.contains(provider));
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
        self.queue.push_back((self.next_ticket, providers));
        self.next_ticket
    }

    /// Sets the providers the waiter `number` waits for; whether it let go
    /// of any.
    pub fn wait_for(&mut self, number: u64, providers: HashSet<Arc<str>>) -> bool {
        let Some((_, waited)) = self.queue.iter_mut().find(|(queued, _)| *queued == number) else {
            return false;
        };
        let let_go = waited.iter().any(|provider| !providers.contains(provider));
        *waited = providers;
        let_go
    }

    pub fn dequeue(&mut self, number: u64) {
        self.queue.retain(|(queued, _)| *queued != number);
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
