//! What every lock kind offers ([`Lockable`]) and every guard of one
//! ([`LeaseGuard`]), for code that works with any kind.

use std::time::{Duration, Instant};

use crate::error::Result;

/// The acquire methods every lock kind has: [`Lock`](crate::Lock) (plain or
/// fenced), [`FairLock`](crate::FairLock), [`ReadLock`](crate::ReadLock),
/// [`WriteLock`](crate::WriteLock), [`RedLock`](crate::RedLock),
/// [`MultiLock`](crate::MultiLock) and [`OwnedLock`](crate::OwnedLock).
///
/// Each kind has the same methods without the trait (no import is needed
/// for the common case); the trait is for code written once for any kind,
/// such as a job runner that takes "a lock" and lets its caller choose a
/// plain lock, a fair one, a write lock or a RedLock. The methods mean what
/// they mean on [`Lock`](crate::Lock): the ones without a lease are renewed
/// by the watchdog until the guard is released (or its max_hold is
/// reached), the `_with_lease` ones hold for a fixed lease.
///
/// ```no_run
/// use redlease::{LeaseGuard, Lockable};
/// use std::time::Duration;
///
/// /// Runs `job` under `lock` unless someone else holds it for 5 s.
/// fn run_exclusive<L: Lockable>(lock: &L, job: impl FnOnce()) -> redlease::Result<bool> {
///     let Some(guard) = lock.try_lock_for(Duration::from_secs(5))? else {
///         return Ok(false);
///     };
///     guard.ensure_held()?; // before the side effect the lock protects
///     job();
///     guard.unlock()?;
///     Ok(true)
/// }
///
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// run_exclusive(&client.lock("report"), || println!("plain"))?;
/// run_exclusive(&client.fair_lock("report:fair"), || println!("fair"))?;
/// run_exclusive(&client.read_write_lock("table").write_lock(), || println!("write"))?;
/// # Ok(()) }
/// ```
pub trait Lockable {
    /// What an acquisition returns: it holds the lock until it is dropped or
    /// unlocked.
    type Guard: LeaseGuard;

    /// Acquires, waiting as long as it takes; renewed by the watchdog.
    ///
    /// # Errors
    ///
    /// As for the kind's own method (e.g. [`Lock::lock`](crate::Lock::lock)).
    fn lock(&self) -> Result<Self::Guard>;

    /// Acquires if free (or, for kinds that allow it, re-entered by this
    /// thread), without waiting; `None` if busy.
    ///
    /// # Errors
    ///
    /// As for the kind's own method.
    fn try_lock(&self) -> Result<Option<Self::Guard>>;

    /// Acquires, waiting at most `wait`; `None` if it stayed busy.
    ///
    /// # Errors
    ///
    /// As for the kind's own method.
    fn try_lock_for(&self, wait: Duration) -> Result<Option<Self::Guard>>;

    /// Acquires, waiting until `deadline` at the latest; `None` if it
    /// stayed busy.
    ///
    /// # Errors
    ///
    /// As for the kind's own method.
    fn try_lock_until(&self, deadline: Instant) -> Result<Option<Self::Guard>>;

    /// Acquires with a fixed `lease` (never renewed), waiting as long as it
    /// takes.
    ///
    /// # Errors
    ///
    /// As for the kind's own method.
    fn lock_with_lease(&self, lease: Duration) -> Result<Self::Guard>;

    /// Acquires with a fixed `lease`, waiting at most `wait`; `None` if it
    /// stayed busy.
    ///
    /// # Errors
    ///
    /// As for the kind's own method.
    fn try_lock_with_lease(&self, wait: Duration, lease: Duration) -> Result<Option<Self::Guard>>;
}

/// What every guard of a [`Lockable`] tells about the hold it stands for:
/// [`LockGuard`](crate::LockGuard), [`MultiGuard`](crate::MultiGuard) and
/// [`OwnedLockGuard`](crate::OwnedLockGuard).
///
/// A lock is a lease: a guard knows, without a round trip, until when Redis
/// confirmed the hold ([`valid_until`](Self::valid_until)) and whether it was
/// found lost ([`is_lost`](Self::is_lost)); call
/// [`ensure_held`](Self::ensure_held) before each side effect the lock
/// protects.
pub trait LeaseGuard {
    /// The lock's name (a `RedLock`'s or `MultiLock`'s: its members' names,
    /// comma-separated).
    fn name(&self) -> &str;

    /// `true` once this process knows the lock is no longer held.
    fn is_lost(&self) -> bool;

    /// Checks, without a round trip, that the lock is still held.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`](crate::Error::LockLost) when
    /// [`is_lost`](Self::is_lost) is true.
    fn ensure_held(&self) -> Result<()>;

    /// Until when the hold is known to last: the lease Redis last confirmed,
    /// counted from when its request was sent.
    fn valid_until(&self) -> Instant;

    /// Releases the hold and reports the outcome (dropping the guard
    /// releases it too, logging a failure).
    ///
    /// # Errors
    ///
    /// As for [`LockGuard::unlock`](crate::LockGuard::unlock).
    fn unlock(self) -> Result<()>
    where
        Self: Sized;
}

/// Implements [`Lockable`] for a kind by its inherent methods of the same
/// names.
macro_rules! lockable_by_inherent {
    ($kind:ty, $guard:ty) => {
        impl $crate::kinds::lockable::Lockable for $kind {
            type Guard = $guard;

            fn lock(&self) -> $crate::error::Result<$guard> {
                <$kind>::lock(self)
            }

            fn try_lock(&self) -> $crate::error::Result<Option<$guard>> {
                <$kind>::try_lock(self)
            }

            fn try_lock_for(
                &self,
                wait: std::time::Duration,
            ) -> $crate::error::Result<Option<$guard>> {
                <$kind>::try_lock_for(self, wait)
            }

            fn try_lock_until(
                &self,
                deadline: std::time::Instant,
            ) -> $crate::error::Result<Option<$guard>> {
                <$kind>::try_lock_until(self, deadline)
            }

            fn lock_with_lease(&self, lease: std::time::Duration) -> $crate::error::Result<$guard> {
                <$kind>::lock_with_lease(self, lease)
            }

            fn try_lock_with_lease(
                &self,
                wait: std::time::Duration,
                lease: std::time::Duration,
            ) -> $crate::error::Result<Option<$guard>> {
                <$kind>::try_lock_with_lease(self, wait, lease)
            }
        }
    };
}

pub(crate) use lockable_by_inherent;

/// Implements [`LeaseGuard`] for a guard by its inherent methods of the
/// same names.
macro_rules! lease_guard_by_inherent {
    ($guard:ty) => {
        impl $crate::kinds::lockable::LeaseGuard for $guard {
            fn name(&self) -> &str {
                <$guard>::name(self)
            }

            fn is_lost(&self) -> bool {
                <$guard>::is_lost(self)
            }

            fn ensure_held(&self) -> $crate::error::Result<()> {
                <$guard>::ensure_held(self)
            }

            fn valid_until(&self) -> std::time::Instant {
                <$guard>::valid_until(self)
            }

            fn unlock(self) -> $crate::error::Result<()> {
                <$guard>::unlock(self)
            }
        }
    };
}

pub(crate) use lease_guard_by_inherent;
