//! The read-write lock ([`ReadWriteLock`], Redisson's `RReadWriteLock`
//! layout): any number of readers, or one writer.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::shared::Shared;
use crate::error::Result;
use crate::kinds::guard::LockGuard;
use crate::kinds::lock::{acquire_methods, Lock};
use crate::kinds::lockable::lockable_by_inherent;
use crate::scripts::Kind;

/// A distributed read-write lock, shared with Redisson's `RReadWriteLock` on
/// the same name: any number of readers hold it at once, or one writer
/// (re-entrant), never both.
///
/// Both locks are re-entrant per thread, renewed by the watchdog when taken
/// without a lease, and return the usual [`LockGuard`]. The writer's thread
/// may also take the read lock, and keep it when it releases the write lock
/// (a downgrade). There is **no upgrade**: a thread holding only the read lock
/// that asks for the write lock waits for itself, so the timed calls
/// ([`WriteLock::try_lock_for`], ...) return `None` at their deadline, and
/// the calls without one ([`WriteLock::lock`], [`WriteLock::lock_with_lease`],
/// or a wait too long to have a deadline) fail at once with
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) instead of
/// waiting forever.
/// Release the read lock first.
///
/// Readers are admitted while others read, even with writers waiting
/// (Redisson's rule): a steady stream of readers can keep a writer waiting.
/// A write release (or a downgrade) wakes every waiter of the process; a read
/// release that frees the lock wakes one.
///
/// On Redis: the hash `<name>` holds `mode` (`read` or `write`), a hold
/// count per reader (`<client-uuid>:<thread-id>`) and per writer
/// (`...:write`), and each read hold has a key
/// `{<name>}:<client-uuid>:<thread-id>:rwlock_timeout:<k>` with its lease,
/// which the watchdog renews (only its own: a crashed reader's holds run
/// out); the channel is `redisson_rwlock:{<name>}`.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// use std::time::Duration;
/// let rw = client.read_write_lock("catalog");
/// {
///     let _r = rw.read_lock().lock()?;          // shared with other readers
///     // ... read ...
/// }
/// if let Some(_w) = rw.write_lock().try_lock_for(Duration::from_secs(5))? {
///     // ... write, alone ...
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a ReadWriteLock does nothing until one of its methods is called"]
pub struct ReadWriteLock {
    read: Lock,
    write: Lock,
}

impl ReadWriteLock {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> ReadWriteLock {
        let read = Lock::of_kind(shared, name, Kind::Read);
        ReadWriteLock {
            write: read.as_kind(Kind::Write),
            read,
        }
    }

    /// The lock's name (the key of its hash).
    #[must_use]
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// The read lock.
    pub fn read_lock(&self) -> ReadLock {
        ReadLock {
            lock: self.read.clone(),
        }
    }

    /// The write lock.
    pub fn write_lock(&self) -> WriteLock {
        WriteLock {
            lock: self.write.clone(),
        }
    }

    /// `true` if anyone holds it, to read or to write.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_locked(&self) -> Result<bool> {
        self.read.is_locked()
    }

    /// The remaining lease of the lock's key, whoever holds it in either
    /// mode (see [`Lock::remaining_lease`](crate::Lock::remaining_lease)):
    /// `None` if it is free.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn remaining_lease(&self) -> Result<Option<Duration>> {
        self.read.remaining_lease()
    }

    /// Who holds it, readers and writer, as Redis records it (see
    /// [`Holder`](crate::Holder)): a reader's lease is that of its own hold
    /// keys, so a reader whose client crashed shows none. Read only.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn holders(&self) -> Result<Vec<crate::kinds::inspect::Holder>> {
        self.read.holders()
    }

    /// `true` if a writer holds it.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_write_locked(&self) -> Result<bool> {
        Ok(mode(&self.read)?.as_deref() == Some("write"))
    }

    /// Deletes the lock whoever holds it and wakes every waiter; `true` if
    /// it was held. The former holders' guards report the loss at their
    /// next renewal, check or release.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn force_unlock(&self) -> Result<bool> {
        self.write.force_unlock()
    }
}

/// The read-write lock's mode (`read`, `write`), `None` when free.
fn mode(lock: &Lock) -> Result<Option<String>> {
    crate::engine::shared::check_name("lock", lock.name(), lock.router())?;
    lock.router().run(lock.name(), |c| {
        redis::cmd("HGET").arg(lock.name()).arg("mode").query(c)
    })
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("name", &self.name())
            .finish()
    }
}

/// The read lock of a [`ReadWriteLock`]: shared with other readers.
#[derive(Clone)]
#[must_use = "a ReadLock does nothing until one of its methods is called"]
pub struct ReadLock {
    lock: Lock,
}

impl ReadLock {
    acquire_methods!("read");

    /// Takes the read lock, waiting as long as it takes (while a writer
    /// holds it). Renewed by the watchdog.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`].
    pub fn lock(&self) -> Result<LockGuard> {
        self.lock.lock()
    }

    /// Takes the read lock with a fixed `lease`, waiting as long as it
    /// takes.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.lock.lock_with_lease(lease)
    }

    /// `true` if anyone holds the lock for reading (as Redisson's
    /// `RReadLock.isLocked`: the mode is `read`).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_locked(&self) -> Result<bool> {
        Ok(mode(&self.lock)?.as_deref() == Some("read"))
    }

    /// Deletes the read-write lock if it is held for reading (by anyone),
    /// waking every waiter; `true` if it was (as Redisson's
    /// `RReadLock.forceUnlock`). The readers' guards report the loss at
    /// their next renewal, check or release.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn force_unlock(&self) -> Result<bool> {
        self.lock.force_unlock_in("read")
    }
}

/// The write lock of a [`ReadWriteLock`]: one writer, no readers (but the
/// writer's own thread).
#[derive(Clone)]
#[must_use = "a WriteLock does nothing until one of its methods is called"]
pub struct WriteLock {
    lock: Lock,
}

impl WriteLock {
    acquire_methods!("write");

    /// Takes the write lock, waiting as long as it takes. Renewed by the
    /// watchdog.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if this
    /// thread holds the read lock but not the write lock (an upgrade would
    /// wait for itself forever): release the read lock first, or use
    /// [`try_lock_for`](Self::try_lock_for) to give up at a deadline;
    /// otherwise as for [`Lock::lock`].
    pub fn lock(&self) -> Result<LockGuard> {
        self.lock.lock()
    }

    /// Takes the write lock with a fixed `lease`, waiting as long as it
    /// takes.
    ///
    /// # Errors
    ///
    /// As for [`lock`](Self::lock), and for [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.lock.lock_with_lease(lease)
    }

    /// `true` if anyone holds the lock for writing (as Redisson's
    /// `RWriteLock.isLocked`; see [`ReadWriteLock::is_write_locked`]).
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_locked(&self) -> Result<bool> {
        Ok(mode(&self.lock)?.as_deref() == Some("write"))
    }

    /// Deletes the read-write lock if it is held for writing, waking every
    /// waiter; `true` if it was (as Redisson's `RWriteLock.forceUnlock`).
    /// The writer's guards report the loss at their next renewal, check or
    /// release.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn force_unlock(&self) -> Result<bool> {
        self.lock.force_unlock_in("write")
    }
}

lockable_by_inherent!(ReadLock, LockGuard);
lockable_by_inherent!(WriteLock, LockGuard);

impl fmt::Debug for ReadLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadLock")
            .field("name", &self.lock.name())
            .finish()
    }
}

impl fmt::Debug for WriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteLock")
            .field("name", &self.lock.name())
            .finish()
    }
}
