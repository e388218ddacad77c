//! The fair lock ([`FairLock`], Redisson's `RFairLock` layout): the lock goes
//! to its waiters in the order they came.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::shared::Shared;
use crate::engine::unsettled::{Lost, Unsettled};
use crate::engine::waiting::{Wait, Waiters};
use crate::error::Result;
use crate::kinds::guard::LockGuard;
use crate::kinds::lock::{acquire_methods, until_acquired, Lock, Terms};
use crate::kinds::lockable::lockable_by_inherent;
use crate::scripts::{self, Kind, LockRef};
use crate::time::duration_ms;

/// How long a fair lock's waiter keeps its place in line without renewing
/// it (longer only with a response timeout above 2.5 s: then 2 s plus two
/// response timeouts plus 1 s, so that a live waiter with slow replies keeps
/// its place). A waiter that crashed holds up the line about this long after
/// its last renewal, plus up to the next waiter's 2 s re-check (its place is
/// dropped when it comes first).
pub const FAIR_PLACE: Duration = Duration::from_secs(8);

/// How often a fair lock's waiter tries again without a message, renewing
/// its place in line.
const FAIR_RECHECK: Duration = Duration::from_secs(2);

/// A distributed fair lock, shared with Redisson's `RFairLock` on the same
/// name: a reentrant lock whose waiters get it in the order they came,
/// across threads, clients and processes.
///
/// A waiter takes a place at the end of the line (Redisson's
/// `redisson_lock_queue:{<name>}` and `redisson_lock_timeout:{<name>}`) and
/// waits on its own channel (`redisson_lock__channel:{<name>}:<owner>`); a
/// release tells only the first waiter in line, so the hand-off wakes one
/// thread in all. A waiter keeps its place by trying again at least every
/// 2 s, and a place not kept for [`FAIR_PLACE`] (8 s,
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

    acquire_methods!("fair", own_wait);

    /// Takes the lock in turn, waiting as long as it takes. Renewed by the
    /// watchdog.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock`].
    pub fn lock(&self) -> Result<LockGuard> {
        let terms = self.lock.watchdog_terms()?;
        until_acquired(|| self.acquire(Wait::Forever, &terms))
    }

    /// Takes the lock in turn with a fixed `lease`, waiting as long as it
    /// takes.
    ///
    /// # Errors
    ///
    /// As for [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        let terms = self.lock.lease_terms(lease)?;
        until_acquired(|| self.acquire(Wait::Forever, &terms))
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

    /// Who holds it, as Redis records it: for each holder its owner field,
    /// client and thread, hold count, remaining lease and, for a redlease
    /// client, its process (see [`Holder`](crate::Holder)). Read only.
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn holders(&self) -> Result<Vec<crate::kinds::inspect::Holder>> {
        self.lock.holders()
    }

    /// The waiters in line, first first, each with how long its place is
    /// kept and, for a redlease client, its process (see
    /// [`Waiter`](crate::Waiter)). Places that have lapsed are left out.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// for (i, w) in client.fair_lock("orders:42").queue()?.iter().enumerate() {
    ///     println!("{i}: {} (place kept {:?})", w.owner, w.place_kept_for);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn queue(&self) -> Result<Vec<crate::kinds::inspect::Waiter>> {
        crate::engine::shared::check_name("lock", self.lock.name(), self.lock.router())?;
        crate::kinds::inspect::fair_queue(self.lock.shared(), self.lock.name())
    }

    /// A fair lock's wait: each try takes (or keeps) this thread's place in
    /// line, and the thread waits on its own channel, which a release
    /// tells only when it is first in line; it tries again at least every
    /// [`FAIR_RECHECK`], which keeps its place. However the wait ends
    /// without the lock (its deadline, an error, a panic), the place is
    /// given up at once: by one more round trip after its deadline, in the
    /// background after an error or a panic (or if Redis does not answer).
    fn acquire(&self, wait: Wait, terms: &Terms) -> Result<Option<LockGuard>> {
        if matches!(wait, Wait::No) {
            // try_lock never takes a place (and a re-entry needs none).
            return self.lock.acquire(wait, terms);
        }
        let lock = &self.lock;
        let field = lock.owner_field();
        let channel = format!("{}:{field}", lock.channel());
        // A live waiter renews its place at least every FAIR_RECHECK plus
        // a reply (and a subscription) that may take a response timeout
        // each: its place outlasts that.
        let response_ms = duration_ms(lock.shared().response_timeout);
        let place_ms =
            duration_ms(FAIR_PLACE).max(duration_ms(FAIR_RECHECK) + 2 * response_ms + 1000);
        let mut terms = Terms {
            place_ms,
            requeue: true,
            ..*terms
        };
        let mut place = Place {
            lock,
            field,
            taken: false,
            failed: false,
        };
        let waiters = Waiters {
            channel: &channel,
            recheck: FAIR_RECHECK,
            // Each answered try keeps the place.
            every: FAIR_RECHECK,
            // A failed one does not: an outage is ridden out while the
            // place lasts, with a re-check to spare.
            ride_out: Duration::from_millis(place_ms).saturating_sub(FAIR_RECHECK),
            // The fair lock's line is its queue.
            client: None,
            ..lock.waiters()
        };
        let got = waiters.acquire(wait.deadline(), |_| {
            let tried = lock.attempt_synced(&terms, None)?;
            // Queued at the end once; later tries keep the place.
            terms.requeue = false;
            Ok(tried)
        });
        // Taking the lock took this thread out of the line.
        place.taken = matches!(got, Ok(Some(_)));
        place.failed = got.is_err();
        got
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

lockable_by_inherent!(FairLock, LockGuard);

impl fmt::Debug for FairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLock")
            .field("name", &self.lock.name())
            .finish()
    }
}

/// A fair lock waiter's place in line: given up on drop unless the lock was
/// taken (which took it out of the line).
struct Place<'a> {
    lock: &'a Lock,
    field: String,
    taken: bool,
    /// The wait ended in an error: the place is given up in the background
    /// (Redis likely does not answer; the call returns now).
    failed: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let lock = self.lock;
        let shared = lock.shared();
        if self.taken {
            // The try that took the lock settled the failed tries before it.
            return;
        }
        // Failed tries of this wait whose undo waited for a next try.
        shared.settle_deferred(lock.slot());
        let lock_ref = LockRef {
            name: lock.name(),
            channel: lock.channel(),
            field: &self.field,
            kind: lock.kind(),
        };
        let publish = lock.router().publish_command();
        let marker = scripts::fair_leave_name(lock.name(), &self.field, shared.next_request());
        let sent = Instant::now();
        if self.failed || std::thread::panicking() {
            // No round trip more after a failed wait (its call returns
            // within its bound), nor while unwinding.
            shared.settle_later(Unsettled::new(lock_ref, marker, Lost::Leave, None, sent));
            return;
        }
        let left = lock.router().run(lock.name(), |conn| {
            scripts::fair_leave(conn, lock_ref, &marker, shared.latch_ttl_ms, publish)
        });
        if let Err(e) = left {
            log::debug!(
                "leaving the line of {:?} failed ({e}); retried in the background",
                lock.name()
            );
            // Until it is settled, this thread's next operation on the lock
            // sets its marker first.
            shared.settle_later(Unsettled::new(lock_ref, marker, Lost::Leave, None, sent));
        }
    }
}
