//! The fair lock ([`FairLock`], Redisson's `RFairLock` layout): the lock goes
//! to its waiters in the order they came.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::shared::Shared;
use crate::error::Result;
use crate::kinds::guard::LockGuard;
use crate::kinds::lock::{acquire_methods, Lock};
use crate::scripts::Kind;

/// A distributed fair lock, shared with Redisson's `RFairLock` on the same
/// name: a reentrant lock whose waiters get it in the order they came,
/// across threads, clients and processes.
///
/// A waiter takes a place at the end of the line (Redisson's
/// `redisson_lock_queue:{<name>}` and `redisson_lock_timeout:{<name>}`) and
/// waits on its own channel (`redisson_lock__channel:{<name>}:<owner>`); a
/// release tells only the first waiter in line, so the hand-off wakes one
/// thread in all. A waiter keeps its place by trying again at least every
/// 2 s, and a place not kept for [`FAIR_PLACE`](crate::FAIR_PLACE) (8 s,
/// more with a response timeout above 2.5 s) is dropped when it comes first:
/// a waiter that crashed holds up the line for seconds, not the 5 minutes
/// per waiter of Redisson's default. A
/// waiter that gives up (its deadline passed, an error, a panic) leaves the
/// line at once. `try_lock` never takes a place: it gets the lock only when
/// it is free and nobody waits.
///
/// The guard, the lease, the watchdog and the lost-reply handling are the
/// reentrant lock's ([`Lock`]).
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let turnstile = client.fair_lock("ledger");
/// let guard = turnstile.lock()?;   // after everyone who came before
/// // ...
/// drop(guard);                     // the next in line is woken
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a FairLock does nothing until one of its methods is called"]
pub struct FairLock {
    lock: Lock,
}

impl FairLock {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> FairLock {
        FairLock {
            lock: Lock::of_kind(shared, name, Kind::Fair),
        }
    }

    acquire_methods!("fair");

    /// Takes the lock in turn, waiting as long as it takes. Renewed by the
    /// watchdog.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`].
    pub fn lock(&self) -> Result<LockGuard> {
        self.lock.lock()
    }

    /// Takes the lock in turn with a fixed `lease`, waiting as long as it
    /// takes.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.lock.lock_with_lease(lease)
    }

    /// `true` if anyone holds the lock.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_locked(&self) -> Result<bool> {
        self.lock.is_locked()
    }

    /// How many waiters are in line (places not yet dropped: a crashed
    /// waiter's place counts until it comes first and is found expired).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn waiters(&self) -> Result<u64> {
        crate::engine::shared::check_name("lock", self.lock.name(), self.lock.router())?;
        let line = crate::scripts::fair_line_name(self.lock.name());
        self.lock
            .router()
            .run(self.lock.name(), |c| redis::cmd("LLEN").arg(&line).query(c))
    }

    /// Deletes the lock whoever holds it and wakes the first waiter in
    /// line; `true` if it was held.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn force_unlock(&self) -> Result<bool> {
        self.lock.force_unlock()
    }
}

impl fmt::Debug for FairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLock")
            .field("name", &self.lock.name())
            .finish()
    }
}
