//! Locking shared state.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, also after a thread panicked while holding it: the state
/// behind this crate's locks is changed by single assignments, pushes and
/// removals, so a panic elsewhere cannot leave it half-written, and a proxy
/// that stopped serving over it would lose more than it guards.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
