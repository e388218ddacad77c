//! Locks owned by the acquisition rather than the thread ([`OwnedLock`],
//! [`OwnedLockGuard`]): a guard that can move to, and be released on,
//! another thread.

use std::fmt;
use std::time::{Duration, Instant};

use crate::engine::waiting::Wait;
use crate::error::Result;
use crate::kinds::guard::{Held, LockGuard};
use crate::kinds::lock::Lock;
use crate::kinds::lockable::{lease_guard_by_inherent, lockable_by_inherent};

/// A [`Lock`] whose every acquisition is its own owner, not the thread that
/// took it: the guard, an [`OwnedLockGuard`], is `Send + Sync` and may be
/// released on any thread. From [`Lock::owned`].
///
/// The owner field is `<client-uuid>:<id>` with an id unique to the
/// acquisition (Redisson's layout, so Redisson clients and thread-owned
/// holders exclude it and are woken by its release as usual). There is no
/// re-entry: a second acquisition of the same lock, by an owned lock or by
/// a thread, from this thread or any other, waits like anyone else's. It is
/// renewed by the watchdog like a thread-owned hold, and every guarantee of
/// a [`Lock`] holds for it: lost replies are settled in the background,
/// failovers ridden out, and [`OwnedLockGuard::ensure_held`] never says `Ok`
/// past what Redis may hold.
///
/// **Which to use.** A thread-owned [`Lock`] (the default, as in Redisson)
/// when the lock is taken and released by the same code on one thread, and
/// re-entry should work. An owned lock when the hold outlives the code that
/// took it on that thread: a task handed to a worker pool, a guard kept in a
/// struct that moves between threads, a lock taken in `spawn_blocking` and
/// released in another.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let guard = client.lock("import:daily").owned().lock()?;
/// std::thread::spawn(move || {
///     guard.ensure_held()?;
///     // ... the work, on another thread ...
///     guard.unlock() // or drop it
/// })
/// .join()
/// .expect("the worker")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an OwnedLock does nothing until one of its methods is called"]
pub struct OwnedLock {
    lock: Lock,
}

impl Lock {
    /// This lock with ownership by the acquisition instead of the thread:
    /// its guards are `Send + Sync` (see [`OwnedLock`]). The renew
    /// interval and cap set on this lock carry over.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let jobs = client.lock("jobs:7").owned();
    /// let guard = jobs.lock()?;       // an OwnedLockGuard
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn owned(&self) -> OwnedLock {
        OwnedLock {
            lock: self.as_owned(),
        }
    }
}

impl OwnedLock {
    /// The lock's name (the Redis key of its hash).
    #[must_use]
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Who holds it, as Redis records it (see [`Lock::holders`]).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn holders(&self) -> Result<Vec<crate::kinds::inspect::Holder>> {
        self.lock.holders()
    }

    /// Renews this lock's lease every `interval` (see
    /// [`Lock::with_renew_interval`]).
    #[must_use = "with_renew_interval returns the lock with the interval set"]
    pub fn with_renew_interval(self, interval: Duration) -> OwnedLock {
        OwnedLock {
            lock: self.lock.with_renew_interval(interval),
        }
    }

    /// Caps how long this lock may be held (see [`Lock::with_max_hold`]).
    #[must_use = "with_max_hold returns the lock with the cap set"]
    pub fn with_max_hold(self, max_hold: Duration) -> OwnedLock {
        OwnedLock {
            lock: self.lock.with_max_hold(max_hold),
        }
    }

    /// Acquires the lock, waiting as long as it takes; renewed by the
    /// watchdog until the guard is released.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`]. A failed call never leaves the lock held.
    pub fn lock(&self) -> Result<OwnedLockGuard> {
        let terms = self.lock.watchdog_terms()?;
        self.lock.acquire_forever(&terms).map(OwnedLockGuard::new)
    }

    /// Acquires the lock if it is free, without waiting; `None` if it is
    /// held (by anyone: an owned lock is never re-entered).
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`].
    pub fn try_lock(&self) -> Result<Option<OwnedLockGuard>> {
        let terms = self.lock.watchdog_terms()?;
        self.guard(self.lock.acquire(Wait::No, &terms))
    }

    /// Acquires the lock, waiting at most `wait`; `None` if it stayed busy.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`].
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<OwnedLockGuard>> {
        let terms = self.lock.watchdog_terms()?;
        self.guard(self.lock.acquire(Wait::after(wait), &terms))
    }

    /// Acquires the lock, waiting until `deadline` at the latest; `None` if
    /// it stayed busy.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`].
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<OwnedLockGuard>> {
        let terms = self.lock.watchdog_terms()?;
        self.guard(self.lock.acquire(Wait::Until(deadline), &terms))
    }

    /// Acquires the lock with a fixed `lease` (never renewed), waiting as
    /// long as it takes.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<OwnedLockGuard> {
        let terms = self.lock.lease_terms(lease)?;
        self.lock.acquire_forever(&terms).map(OwnedLockGuard::new)
    }

    /// Acquires the lock with a fixed `lease`, waiting at most `wait`;
    /// `None` if it stayed busy.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock_with_lease`].
    pub fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<OwnedLockGuard>> {
        let terms = self.lock.lease_terms(lease)?;
        self.guard(self.lock.acquire(Wait::after(wait), &terms))
    }

    /// `true` if anyone holds the lock (see [`Lock::is_locked`]).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_locked(&self) -> Result<bool> {
        self.lock.is_locked()
    }

    /// The holder's remaining lease (see [`Lock::remaining_lease`]).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn remaining_lease(&self) -> Result<Option<Duration>> {
        self.lock.remaining_lease()
    }

    /// Deletes the lock whoever holds it (see [`Lock::force_unlock`]).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn force_unlock(&self) -> Result<bool> {
        self.lock.force_unlock()
    }

    fn guard(&self, got: Result<Option<LockGuard>>) -> Result<Option<OwnedLockGuard>> {
        got.map(|g| g.map(OwnedLockGuard::new))
    }
}

lockable_by_inherent!(OwnedLock, OwnedLockGuard);

impl fmt::Debug for OwnedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLock")
            .field("name", &self.lock.name())
            .finish()
    }
}

/// A held [`OwnedLock`]: owned by this acquisition, not by a thread. It is
/// `Send + Sync`: move it to another thread, keep it in a struct, release it
/// wherever (drop, or [`unlock`](Self::unlock) to see the outcome). The
/// release is a blocking round trip, as for a [`LockGuard`](crate::LockGuard).
///
/// ```
/// fn assert_send_sync<T: Send + Sync>() {}
/// assert_send_sync::<redlease::OwnedLockGuard>();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct OwnedLockGuard {
    held: Held,
}

impl OwnedLockGuard {
    fn new(guard: LockGuard) -> OwnedLockGuard {
        OwnedLockGuard {
            held: guard.into_held(),
        }
    }

    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// The fencing token of this acquisition, for an owned lock of a
    /// [`fenced_lock`](crate::Client::fenced_lock) (see
    /// [`LockGuard::token`](crate::LockGuard::token)); `None` otherwise.
    #[must_use]
    pub fn token(&self) -> Option<u64> {
        self.held.token()
    }

    /// `true` once this process knows the lock is no longer held (see
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost)).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Checks, without a round trip, that the lock is still held.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`](crate::Error::LockLost) when
    /// [`is_lost`](Self::is_lost) is true.
    pub fn ensure_held(&self) -> Result<()> {
        self.held.ensure_held()
    }

    /// Until when the lease is known to hold (see
    /// [`LockGuard::valid_until`](crate::LockGuard::valid_until)).
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// Releases the lock and reports the outcome, from any thread.
    ///
    /// # Errors
    ///
    /// As for [`LockGuard::unlock`](crate::LockGuard::unlock).
    pub fn unlock(self) -> Result<()> {
        self.held.unlock()
    }
}

lease_guard_by_inherent!(OwnedLockGuard);

impl fmt::Debug for OwnedLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLockGuard")
            .field("name", &self.held.name())
            .field("lost", &self.is_lost())
            .finish()
    }
}
