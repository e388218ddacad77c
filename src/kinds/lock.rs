//! A named lock handle and the acquire loop.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::grants::Offer;
use crate::engine::hold::{slot_key, Hold};
use crate::engine::owners::{insert_hold, owner_state, settle};
use crate::engine::shared::{check_lease, check_max_hold, check_name, Shared};
use crate::engine::unsettled::{keys, Lost, Unsettled};
use crate::engine::waiting::Waiters;
pub(crate) use crate::engine::waiting::{Attempt, Wait};
use crate::engine::watchdog::MIN_RENEW_INTERVAL;
use crate::error::{Error, Result};
use crate::kinds::guard::LockGuard;
use crate::kinds::lockable::lockable_by_inherent;
use crate::net::pool::Synced;
use crate::net::pubsub::{Poker, Subscription, WakeRule};
use crate::net::router::Router;
use crate::scripts::{self, AcquireReply, Kind, LockRef, Queued};
use crate::time::duration_ms;

/// When waiting for a holder that set no lease (PTTL -1), re-check at least
/// this often even without a release message.
const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

/// A named, reentrant distributed lock.
///
/// A `Lock` is a cheap handle: it owns no Redis state and can be created,
/// cloned and dropped freely; each acquisition returns a [`LockGuard`].
/// Ownership is per thread: a thread that holds the lock may take it again
/// (re-entry), and the lock is free once it has released every hold.
///
/// Locks taken without a lease ([`lock`](Lock::lock),
/// [`try_lock`](Lock::try_lock), [`try_lock_for`](Lock::try_lock_for),
/// [`try_lock_until`](Lock::try_lock_until)) get the client's
/// `watchdog_timeout` as their lease and are renewed by the client's watchdog
/// until released. Locks taken with an explicit lease are never renewed.
///
/// Every method makes blocking round trips to Redis (so does dropping a
/// guard); from async code, call them inside `tokio::task::spawn_blocking`
/// (or your runtime's equivalent) and drop the guard in the same closure:
/// ownership is per OS thread, and a guard is `!Send`. For a hold that must
/// move between threads, use [`owned`](Lock::owned): its guard is `Send`.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("orders:42");
/// {
///     let guard = lock.lock()?;        // waits; renewed by the watchdog
///     guard.ensure_held()?;            // before each exclusive side effect
///     // ... work ...
/// }                                    // released here (one round trip)
/// assert!(!lock.is_locked()?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a Lock does nothing until one of its methods is called"]
pub struct Lock {
    shared: Arc<Shared>,
    name: String,
    /// The release channel, computed once.
    channel: String,
    renew_interval: Option<Duration>,
    /// The longest a hold may last (`with_max_hold`, else the client's).
    max_hold: Option<Duration>,
    /// Each acquisition is its own owner (`Lock::owned`), not the thread.
    owned: bool,
    /// A fenced lock's token key (Redisson's RFencedLock), computed once.
    token_key: Option<String>,
    kind: Kind,
    /// Its key among a thread's holds (`hold::slot_key`), computed once.
    slot: String,
}

/// What one acquisition asks for.
#[derive(Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) lease_ms: u64,
    /// `Some(interval)` when the watchdog renews the lock.
    pub(crate) renew: Option<Duration>,
    /// A fair lock's waiter: how long its place in line is kept (0: none).
    pub(crate) place_ms: u64,
    /// A fair lock's waiter's first try of a wait: it queues at the end
    /// (a place left from an earlier wait goes).
    pub(crate) requeue: bool,
    /// The longest a new hold may last (`max_hold`).
    pub(crate) max_hold: Option<Duration>,
}

impl Terms {
    /// The lease a new hold's acquisition sets: the one asked for, cut to
    /// the cap.
    pub(crate) fn new_hold_lease_ms(&self) -> u64 {
        self.max_hold
            .map_or(self.lease_ms, |cap| self.lease_ms.min(duration_ms(cap)))
    }
}

/// An acquire request made ready: what [`Lock::prepare`] decided before
/// its round trip.
pub(crate) struct Request {
    existing: Option<Arc<Hold>>,
    pending: Vec<Arc<Unsettled>>,
    field: String,
    /// A read hold's key prefix, else empty.
    prefix: String,
    /// A reader's thread's writer field, else empty.
    writer: String,
    /// A fair lock's waiter: how long its place in line is kept.
    place_ms: u64,
    /// A fair lock's waiter's first try.
    requeue: bool,
    /// Holds the owner had when the request was made.
    held: u32,
    lease_ms: u64,
    /// The lease the remaining holds need if the request is undone.
    restore_ms: u64,
    /// The request's id (the hold's new generation).
    n: u64,
    marker: String,
    sent: Instant,
}

impl Lock {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> Lock {
        Lock::of_kind(shared, name, Kind::Plain)
    }

    /// A fenced lock (see [`Client::fenced_lock`]).
    pub(crate) fn fenced(shared: Arc<Shared>, name: String) -> Lock {
        Lock::of_kind(shared, name, Kind::Fenced)
    }

    /// A lock of `kind`: its channel, token key and slot key.
    pub(crate) fn of_kind(shared: Arc<Shared>, name: String, kind: Kind) -> Lock {
        Lock {
            max_hold: shared.max_hold,
            shared,
            channel: if kind.is_rw() {
                scripts::rw_channel_name(&name)
            } else {
                scripts::channel_name(&name)
            },
            token_key: (kind == Kind::Fenced).then(|| scripts::token_name(&name)),
            slot: slot_key(&name, kind),
            kind,
            name,
            renew_interval: None,
            owned: false,
        }
    }

    /// The same lock, each acquisition of it its own owner (see
    /// `OwnedLock`).
    pub(crate) fn as_owned(&self) -> Lock {
        Lock {
            owned: true,
            ..self.clone()
        }
    }

    /// This thread's owner field for this lock (`:write` appended for a
    /// write lock).
    pub(crate) fn owner_field(&self) -> String {
        let mut field = self.shared.owner_field();
        if self.kind == Kind::Write {
            field.push_str(":write");
        }
        field
    }

    /// Renews this lock's lease every `interval` instead of every third of
    /// the lease (the watchdog's default). Only affects acquisitions without
    /// an explicit lease. Checked when the lock is acquired: the interval must
    /// be at least [`MIN_RENEW_INTERVAL`] and below the lease (the client's
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout)); well
    /// below it, such as a third, leaves time for a renewal to be retried.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// let lock = client.lock("orders:42").with_renew_interval(Duration::from_secs(2));
    /// # Ok(()) }
    /// ```
    #[must_use = "with_renew_interval returns the lock with the interval set"]
    pub fn with_renew_interval(mut self, interval: Duration) -> Lock {
        self.renew_interval = Some(interval);
        self
    }

    /// Caps how long this lock may be held, instead of the client's
    /// [`max_hold`](crate::ClientBuilder::max_hold): past `max_hold` from a
    /// hold's first acquisition the watchdog renews it no more, its lease
    /// runs out then, and the guard reports it lost (the client's
    /// `on_lock_lost` is called). The cap of a hold is the one its first
    /// acquisition had: re-entering it through a handle with another cap
    /// changes nothing. A fixed lease longer than the cap is refused.
    /// Checked when the lock is acquired: 1 ms to
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// let lock = client.lock("nightly-report").with_max_hold(Duration::from_secs(3600));
    /// let guard = lock.lock()?;
    /// // ... a report that hangs frees the lock after an hour ...
    /// guard.ensure_held()?; // fails once the hour is up
    /// # Ok(()) }
    /// ```
    #[must_use = "with_max_hold returns the lock with the cap set"]
    pub fn with_max_hold(mut self, max_hold: Duration) -> Lock {
        self.max_hold = Some(max_hold);
        self
    }

    /// The lock's name (the Redis key of its hash).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Acquires the lock, waiting as long as it takes. The watchdog renews it
    /// until the guard is released.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("orders:42").lock()?;
    /// // ... held and renewed until `guard` is dropped
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for bad input (empty name, renew interval
    /// or max_hold out of range); [`Error::Redis`] or [`Error::Pool`] when Redis fails or
    /// cannot be reached ([`Error::is_auth`] for refused credentials or
    /// permissions, [`Error::ReplicaSync`] when replica sync could not
    /// confirm it); [`Error::Thread`] if the watchdog or subscriber thread
    /// cannot start. A failed call never leaves the lock held in the
    /// caller's name.
    pub fn lock(&self) -> Result<LockGuard> {
        let terms = self.watchdog_terms()?;
        self.acquire_forever(&terms)
    }

    /// Acquires the lock if it is free (or already held by this thread),
    /// without waiting. Renewed by the watchdog.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// match client.lock("orders:42").try_lock()? {
    ///     Some(guard) => { /* ours */ }
    ///     None => { /* someone else holds it */ }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`lock`](Lock::lock).
    pub fn try_lock(&self) -> Result<Option<LockGuard>> {
        let terms = self.watchdog_terms()?;
        self.acquire(Wait::No, &terms)
    }

    /// Acquires the lock, waiting at most `wait`; `None` if it stayed busy.
    /// A `wait` too large to represent means "no deadline". Renewed by the
    /// watchdog.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// if let Some(guard) = client.lock("orders:42").try_lock_for(Duration::from_secs(5))? {
    ///     // ...
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`lock`](Lock::lock).
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard>> {
        let terms = self.watchdog_terms()?;
        self.acquire(Wait::after(wait), &terms)
    }

    /// Acquires the lock, waiting until `deadline` at the latest; `None` if it
    /// stayed busy. Renewed by the watchdog.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::{Duration, Instant};
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// let guard = client.lock("orders:42").try_lock_until(deadline)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`lock`](Lock::lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>> {
        let terms = self.watchdog_terms()?;
        self.acquire(Wait::Until(deadline), &terms)
    }

    /// Acquires the lock with a fixed `lease`, waiting as long as it takes.
    /// The lease is never renewed: the lock frees itself when it runs out.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// let guard = client.lock("orders:42").lock_with_lease(Duration::from_secs(10))?;
    /// // held for at most 10 s
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`lock`](Lock::lock), with a zero or too long lease, or one
    /// longer than the lock's max_hold, as bad input.
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        let terms = self.lease_terms(lease)?;
        self.acquire_forever(&terms)
    }

    /// Acquires the lock with a fixed `lease`, waiting at most `wait`; `None`
    /// if it stayed busy. The lease is never renewed.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// let lock = client.lock("orders:42");
    /// let guard = lock.try_lock_with_lease(Duration::from_secs(1), Duration::from_secs(10))?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`lock_with_lease`](Lock::lock_with_lease).
    pub fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>> {
        let terms = self.lease_terms(lease)?;
        self.acquire(Wait::after(wait), &terms)
    }

    /// `true` if anyone holds the lock.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let busy = client.lock("orders:42").is_locked()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_locked(&self) -> Result<bool> {
        self.check_name()?;
        self.router().run(&self.name, |c| {
            redis::cmd("EXISTS").arg(&self.name).query(c)
        })
    }

    /// How many times the current thread holds the lock (0 if it does not),
    /// as Redis records it.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("orders:42");
    /// let _g = lock.lock()?;
    /// assert_eq!(lock.hold_count()?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn hold_count(&self) -> Result<u32> {
        self.check_name()?;
        let field = self.owner_field();
        let n: Option<u32> = self.router().run(&self.name, |c| {
            redis::cmd("HGET").arg(&self.name).arg(&field).query(c)
        })?;
        Ok(n.unwrap_or(0))
    }

    /// `true` if the current thread holds the lock, as Redis records it.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let mine = client.lock("orders:42").is_held_by_current_thread()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn is_held_by_current_thread(&self) -> Result<bool> {
        self.check_name()?;
        let field = self.owner_field();
        self.router().run(&self.name, |c| {
            redis::cmd("HEXISTS").arg(&self.name).arg(&field).query(c)
        })
    }

    /// The holder's remaining lease: `None` if the lock is free,
    /// `Some(Duration::MAX)` if it is held without a lease (never the case
    /// for locks taken by redlease or Redisson).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// if let Some(left) = client.lock("orders:42").remaining_lease()? {
    ///     println!("held for {left:?} more at most");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn remaining_lease(&self) -> Result<Option<Duration>> {
        self.check_name()?;
        let ms: i64 = self
            .router()
            .run(&self.name, |c| redis::cmd("PTTL").arg(&self.name).query(c))?;
        Ok(match ms {
            -2 => None,
            ms if ms < 0 => Some(Duration::MAX),
            ms => Some(Duration::from_millis(ms.unsigned_abs())),
        })
    }

    /// Who holds it, as Redis records it: for each holder its owner field,
    /// client and thread, hold count, remaining lease and, for a redlease
    /// client, its process (see [`Holder`](crate::Holder)). Read only.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// for h in client.lock("orders:42").holders()? {
    ///     let who = h.process.as_ref().map(|p| format!("pid {} on {}", p.pid, p.host));
    ///     println!("{} holds it {} time(s) ({})", h.owner, h.count, who.unwrap_or_default());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name, or a Redis or pool error.
    pub fn holders(&self) -> Result<Vec<crate::kinds::inspect::Holder>> {
        self.check_name()?;
        crate::kinds::inspect::lock_holders(&self.shared, &self.name)
    }

    /// Deletes the lock whoever holds it and wakes a waiter; `true` if it was
    /// held. The former holder's guards report the loss at their next renewal,
    /// check or release.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let was_held = client.lock("orders:42").force_unlock()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Empty name; a Redis error, `WRONGTYPE` with nothing deleted when the
    /// key is not a lock (not a hash: a list, a string...); or a pool
    /// error.
    pub fn force_unlock(&self) -> Result<bool> {
        self.force_unlock_in("")
    }

    /// Deletes the lock whoever holds it, if it is a read-write lock in
    /// `mode` (`read`, `write`; `""`: in any mode, or any lock).
    pub(crate) fn force_unlock_in(&self, mode: &str) -> Result<bool> {
        self.check_name()?;
        let shared = &self.shared;
        // A latch per request: a retry after a lost reply returns what the
        // first run did, not "nothing to delete".
        let latch =
            scripts::force_unlock_latch_name(&self.name, &shared.uuid, shared.next_request());
        let (deleted, _) = self.router().run_synced(&self.name, |conn| {
            scripts::force_unlock(
                conn,
                &self.name,
                &self.channel,
                self.kind,
                mode,
                &latch,
                shared.latch_ttl_ms,
                self.router().publish_command(),
            )
        })?;
        Ok(deleted == 1)
    }

    pub(crate) fn router(&self) -> &Router {
        &self.shared.router
    }

    /// `true` if this thread holds this lock as `kind` through this client,
    /// as far as it knows (not released, not found lost).
    fn held_as(&self, kind: Kind) -> bool {
        owner_state(self.shared.id, &slot_key(&self.name, kind))
            .0
            .is_some()
    }

    /// A write lock asked for without a deadline by a thread that holds only
    /// the read lock would wait for itself forever: refused.
    fn check_no_upgrade(&self) -> Result<()> {
        if !self.held_as(Kind::Write) && self.held_as(Kind::Read) {
            return Err(Error::invalid(format!(
                "write lock of {:?} requested while this thread holds its read lock (no \
                 upgrade): release the read lock first",
                self.name
            )));
        }
        Ok(())
    }

    /// The same lock as another kind (the read or the write lock of a
    /// read-write lock), with the same renew interval.
    pub(crate) fn as_kind(&self, kind: Kind) -> Lock {
        Lock {
            renew_interval: self.renew_interval,
            ..Lock::of_kind(Arc::clone(&self.shared), self.name.clone(), kind)
        }
    }

    fn check_name(&self) -> Result<()> {
        check_name("lock", &self.name, self.router())
    }

    pub(crate) fn watchdog_terms(&self) -> Result<Terms> {
        self.check_name()?;
        check_max_hold(self.max_hold)?;
        let lease = self.shared.watchdog_timeout;
        let interval = match self.renew_interval {
            Some(i) => {
                if i < MIN_RENEW_INTERVAL {
                    return Err(Error::invalid(format!(
                        "renew interval must be at least {MIN_RENEW_INTERVAL:?} \
                         (MIN_RENEW_INTERVAL), got {i:?}"
                    )));
                }
                if i >= lease {
                    return Err(Error::invalid(format!(
                        "renew interval must be below the lease (watchdog_timeout, {lease:?}), \
                         got {i:?}"
                    )));
                }
                i
            }
            None => (lease / 3).max(MIN_RENEW_INTERVAL),
        };
        Ok(Terms {
            // What the hold needs; each request cuts it to the hold's cap.
            lease_ms: duration_ms(lease),
            renew: Some(interval),
            place_ms: 0,
            requeue: false,
            max_hold: self.max_hold,
        })
    }

    pub(crate) fn lease_terms(&self, lease: Duration) -> Result<Terms> {
        self.check_name()?;
        check_lease("lease", lease)?;
        check_max_hold(self.max_hold)?;
        if let Some(cap) = self.max_hold.filter(|&cap| lease > cap) {
            return Err(Error::invalid(format!(
                "lease must be at most the lock's max_hold ({cap:?}), got {lease:?}"
            )));
        }
        Ok(Terms {
            lease_ms: duration_ms(lease),
            renew: None,
            place_ms: 0,
            requeue: false,
            max_hold: self.max_hold,
        })
    }

    /// Try; if busy, subscribe to the release channel, then retry and wait
    /// for a release message or the holder's lease, whichever comes first,
    /// until the deadline (see [`Waiters::acquire`]).
    pub(crate) fn acquire(&self, wait: Wait, terms: &Terms) -> Result<Option<LockGuard>> {
        if self.kind == Kind::Write && matches!(wait, Wait::Forever) {
            self.check_no_upgrade()?;
        }
        let waiters = self.waiters();
        let try_once = |q: Option<&Queued>| self.attempt_synced(terms, q);
        if matches!(self.kind, Kind::Plain | Kind::Fenced) {
            // A release by another thread of this client may hand it over.
            let mut grantee = Grantee { lock: self, terms };
            waiters.acquire_with(wait.deadline(), try_once, Some(&mut grantee))
        } else {
            waiters.acquire(wait.deadline(), try_once)
        }
    }

    /// Where this lock's waiters listen: a release wakes one per process
    /// (one queued process, for a reentrant lock with processes queued).
    pub(crate) fn waiters(&self) -> Waiters<'_> {
        Waiters {
            router: self.router(),
            name: &self.name,
            channel: &self.channel,
            // A write release ('1') lets every reader in.
            rule: if self.kind.is_rw() {
                WakeRule::OneOrAll
            } else {
                WakeRule::One
            },
            recheck: NO_TTL_RECHECK,
            every: Duration::MAX,
            ride_out: Duration::MAX,
            kind: Some(self.kind.label()),
            // The reentrant lock queues the processes of its waiters.
            client: matches!(self.kind, Kind::Plain | Kind::Fenced).then_some(&*self.shared),
            failover: self.shared.watchdog_timeout,
        }
    }

    /// Subscribes to this lock's release channel on the node serving it,
    /// riding out a failover (no node for the slot yet) until `deadline`.
    pub(crate) fn subscribe(&self, deadline: Option<Instant>) -> Result<Subscription> {
        self.waiters().subscribe(deadline)
    }

    /// [`attempt`](Lock::attempt), tried again (up to the client's
    /// `retry_attempts`) while too few replicas confirm the acquisition.
    pub(crate) fn attempt_synced(
        &self,
        terms: &Terms,
        queued: Option<&Queued>,
    ) -> Result<Attempt<LockGuard>> {
        let mut tries = 0;
        loop {
            match self.attempt(terms, queued) {
                Err(e) if e.is_replica_sync() && tries < self.router().retry_attempts() => {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// [`acquire`](Lock::acquire) with no deadline: it returns only once
    /// acquired (or on an error).
    pub(crate) fn acquire_forever(&self, terms: &Terms) -> Result<LockGuard> {
        until_acquired(|| self.acquire(Wait::Forever, terms))
    }

    /// One acquire script call; registers the hold before returning a guard.
    fn attempt(&self, terms: &Terms, queued: Option<&Queued>) -> Result<Attempt<LockGuard>> {
        let request = self.prepare(terms);
        let reply = self.send(&request, queued);
        self.finish(terms, request, reply)
    }

    /// Everything an acquire request decides before its round trip; marks
    /// an existing hold's bound as what the request may set.
    pub(crate) fn prepare(&self, terms: &Terms) -> Request {
        let shared = &self.shared;
        let (existing, pending, field) = if self.owned {
            // A new owner: nothing held, nothing unsettled.
            (None, Vec::new(), shared.owned_field())
        } else {
            let (existing, pending) = owner_state(shared.id, &self.slot);
            let field = existing
                .as_ref()
                .map_or_else(|| self.owner_field(), |h| h.field().to_owned());
            (existing, pending, field)
        };
        let held = existing.as_ref().map_or(0, |h| h.count());
        let watched = terms.renew.is_some();
        // A re-entry never shortens the lease that watched guards need; the
        // undo of a lost re-entry re-applies what the hold needs now. Both
        // end at the hold's cap at the latest (its first acquisition's: a
        // re-entry through a handle with another cap changes nothing), as
        // does a new hold's lease at its own.
        let (lease_ms, restore_ms) = match &existing {
            Some(h) => {
                let now = Instant::now();
                (
                    h.capped_lease_ms(h.reentry_lease_ms(terms.lease_ms, watched), now),
                    h.capped_lease_ms(h.needed_lease_ms(), now),
                )
            }
            None => (terms.new_hold_lease_ms(), 0),
        };
        let n = shared.next_request();
        let marker = scripts::acquire_cancel_name(&self.name, &field, n);
        // A reader's hold keys, and its thread's writer field.
        let (prefix, writer) = if self.kind == Kind::Read {
            let lock = LockRef {
                name: &self.name,
                channel: &self.channel,
                field: &field,
                kind: self.kind,
            };
            (lock.hold_prefix(), format!("{field}:write"))
        } else {
            (String::new(), String::new())
        };
        let sent = Instant::now();
        if let Some(h) = &existing {
            h.begin(sent, lease_ms);
        }
        Request {
            existing,
            pending,
            field,
            prefix,
            writer,
            place_ms: terms.place_ms,
            requeue: terms.requeue,
            held,
            lease_ms,
            restore_ms,
            n,
            marker,
            sent,
        }
    }

    /// The names `request` works on.
    fn lock_ref<'a>(&'a self, request: &'a Request) -> LockRef<'a> {
        LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &request.field,
            kind: self.kind,
        }
    }

    /// The acquire command of `request` (EVALSHA), for a round trip shared
    /// with other requests.
    pub(crate) fn command(&self, r: &Request) -> redis::Cmd {
        self.script(r, None).command()
    }

    /// The acquire script's request for `r`.
    fn script<'a>(&'a self, r: &'a Request, queued: Option<&Queued<'a>>) -> scripts::Acquire<'a> {
        scripts::Acquire {
            lock: self.lock_ref(r),
            marker: &r.marker,
            token: self.token_key.as_deref(),
            unsettled: keys(&r.pending),
            lease_ms: r.lease_ms,
            count: r.held + 1,
            gen: r.n,
            prefix: &r.prefix,
            writer: &r.writer,
            place_ms: r.place_ms,
            requeue: r.requeue,
            publish: self.shared.router.publish_command(),
            queue: queued.copied(),
        }
    }

    /// Its key among a thread's holds.
    pub(crate) fn slot(&self) -> &str {
        &self.slot
    }

    /// What kind of lock it is.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Its release channel.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// The context of the client this lock belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Sends `request` on its own (one round trip, routed).
    pub(crate) fn send(
        &self,
        r: &Request,
        queued: Option<&Queued>,
    ) -> Result<(AcquireReply, Synced)> {
        let script = self.script(r, queued);
        self.router()
            .run_synced(&self.name, |conn| script.run(conn))
    }

    /// What the reply to `request` means: a guard (the hold registered and
    /// watched), busy, or an error after which nothing stays held in the
    /// caller's name (an acquisition that may have run is undone in the
    /// background).
    pub(crate) fn finish(
        &self,
        terms: &Terms,
        r: Request,
        reply: Result<(AcquireReply, Synced)>,
    ) -> Result<Attempt<LockGuard>> {
        let shared = &self.shared;
        // A fair lock's waiter, whose wait goes on after a failed try.
        let in_line = r.place_ms > 0;
        let Request {
            existing,
            pending,
            held,
            lease_ms,
            restore_ms,
            n,
            sent,
            ..
        } = r;
        let lock = LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &r.field,
            kind: self.kind,
        };
        let unsynced = match &reply {
            Ok((r, Synced::No { wanted, acked })) if r.busy.is_none() => Some(Error::ReplicaSync {
                name: self.name.clone(),
                wanted: *wanted,
                acked: *acked,
            }),
            _ => None,
        };
        if unsynced.is_some() {
            // The requests it carried ran with it.
            settle(shared.id, &pending);
        }
        let reply = match (reply, unsynced) {
            (Ok((reply, _)), None) => reply,
            (Ok(_), Some(e)) | (Err(e), _) => {
                if e.maybe_applied() || e.is_replica_sync() {
                    // The request may have run, or run later (or ran, but too
                    // few replicas confirmed it): undo it in the
                    // background (this call stays within its response
                    // timeout); until then this owner's next operations on
                    // the lock mark it done first, and the hold stays bounded
                    // by the lease the request may have set.
                    let kind = Lost::Acquire {
                        held,
                        lease_ms: restore_ms,
                    };
                    let request = Unsettled::new(lock, r.marker, kind, existing.as_ref(), sent);
                    if self.owned {
                        shared.settle_owned_later(request);
                    } else if in_line {
                        // The wait goes on: its next try settles it (see
                        // `Place`, which settles it if the wait ends).
                        shared.defer_settle(request);
                    } else {
                        shared.settle_later(request);
                    }
                } else if let Some(h) = &existing {
                    h.aborted();
                }
                return Err(e);
            }
        };
        settle(shared.id, &pending);
        let AcquireReply { busy, token } = reply;
        if busy.is_some() {
            if let Some(h) = &existing {
                h.aborted();
            }
        }
        match busy {
            None => {}
            Some(-4) => {
                // This thread's earlier holds are gone on the server (lease ran
                // out, deleted): their guards are lost, and this acquisition
                // starts afresh. Once the old hold is lost, owner_state skips
                // it, the count sent is 1, and -4 cannot come back.
                if let Some(old) = existing.filter(|old| old.mark_lost()) {
                    shared
                        .watchdog
                        .report_lost(&old, "its key or owner field is gone from redis");
                    return self.attempt(terms, None);
                }
                return Ok(Attempt::Busy(None));
            }
            Some(ttl) if ttl >= 0 => {
                return Ok(Attempt::Busy(Some(Duration::from_millis(
                    ttl.unsigned_abs(),
                ))))
            }
            Some(_) => return Ok(Attempt::Busy(None)),
        }
        let hold = match existing {
            Some(hold) => {
                hold.confirmed(sent, lease_ms, n);
                hold
            }
            None => self.new_hold(terms, lock, sent, lease_ms, n),
        };
        self.guard(terms, hold, token).map(Attempt::Acquired)
    }

    /// A first hold of this owner, acquired with a request sent at `sent`,
    /// registered as the thread's.
    fn new_hold(
        &self,
        terms: &Terms,
        lock: LockRef<'_>,
        sent: Instant,
        lease_ms: u64,
        n: u64,
    ) -> Arc<Hold> {
        let cap = terms.max_hold.and_then(|d| sent.checked_add(d));
        let hold = Arc::new(Hold::new(
            self.shared.id,
            lock,
            sent,
            lease_ms,
            n,
            cap,
            self.owned,
        ));
        insert_hold(&hold);
        hold
    }

    /// The guard of one acquisition of `hold`, watched if `terms` say so.
    fn guard(&self, terms: &Terms, hold: Arc<Hold>, token: Option<u64>) -> Result<LockGuard> {
        let shared = &self.shared;
        let watched = terms.renew.is_some();
        shared.announce();
        let first_watched = hold.acquired(terms.lease_ms, watched);
        let guard = LockGuard::new(Arc::clone(&self.shared), Arc::clone(&hold), watched, token);
        if let (true, Some(interval)) = (first_watched, terms.renew) {
            // The guard releases the lock if the watchdog cannot start.
            shared
                .watchdog
                .watch(&hold, interval, terms.lease_ms)
                .map_err(Error::Thread)?;
        }
        Ok(guard)
    }
}

/// A reentrant lock's waiter (fenced or not, owned by its thread or by the
/// acquisition), to which a release by another thread of its client may
/// hand the lock (engine/grants.rs): only a first acquisition with nothing
/// unsettled (a re-entry does not wait; an unsettled request goes out with
/// the waiter's own next try; an owned acquisition is a new owner, with
/// nothing of either).
struct Grantee<'a> {
    lock: &'a Lock,
    terms: &'a Terms,
}

impl crate::engine::waiting::Grantee<LockGuard> for Grantee<'_> {
    fn offer(&mut self, poker: Poker, wake: &str) -> Option<Offer> {
        let lock = self.lock;
        let shared = &lock.shared;
        let field = if lock.owned {
            shared.owned_field()
        } else {
            let (existing, pending) = owner_state(shared.id, &lock.slot);
            if existing.is_some() || !pending.is_empty() {
                return None;
            }
            lock.owner_field()
        };
        let n = shared.next_request();
        let marker = scripts::acquire_cancel_name(&lock.name, &field, n);
        Some(Offer::new(
            &lock.name,
            lock.kind,
            lock.owned,
            &lock.channel,
            field,
            marker,
            n,
            self.terms.new_hold_lease_ms(),
            wake.to_owned(),
            poker,
        ))
    }

    fn granted(&mut self, offer: &Offer, sent: Instant, token: Option<u64>) -> Result<LockGuard> {
        let lock = self.lock;
        let lock_ref = LockRef {
            name: &lock.name,
            channel: &lock.channel,
            field: &offer.field,
            kind: lock.kind,
        };
        let hold = lock.new_hold(self.terms, lock_ref, sent, offer.lease_ms, offer.n);
        lock.guard(self.terms, hold, token)
    }
}

lockable_by_inherent!(Lock, LockGuard);

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("renew_interval", &self.renew_interval)
            .finish()
    }
}

/// Calls `acquire` (a wait without a deadline) until it returns a guard
/// or an error.
pub(crate) fn until_acquired(
    mut acquire: impl FnMut() -> Result<Option<LockGuard>>,
) -> Result<LockGuard> {
    loop {
        if let Some(guard) = acquire()? {
            return Ok(guard);
        }
    }
}

/// The acquire methods of [`Lock`] on a handle wrapping one (`self.lock`):
/// the read and write locks, the fair lock. The waits go through the
/// handle's `fn acquire(&self, wait: Wait, terms: &Terms)`: the wrapped
/// lock's, or with `own_wait` one the kind defines (the fair lock waits in
/// line).
macro_rules! acquire_methods {
    ($kind:literal) => {
        acquire_methods!($kind, own_wait);

        /// Waits as the lock it wraps does.
        fn acquire(
            &self,
            wait: $crate::engine::waiting::Wait,
            terms: &$crate::kinds::lock::Terms,
        ) -> Result<Option<LockGuard>> {
            self.lock.acquire(wait, terms)
        }
    };
    ($kind:literal, own_wait) => {
        /// The lock's name.
        #[must_use]
        pub fn name(&self) -> &str {
            self.lock.name()
        }

        /// Renews this lock's lease every `interval` (see
        /// [`Lock::with_renew_interval`]).
        #[must_use = "with_renew_interval returns the lock with the interval set"]
        pub fn with_renew_interval(self, interval: Duration) -> Self {
            Self {
                lock: self.lock.with_renew_interval(interval),
            }
        }

        /// Caps how long this lock may be held (see
        /// [`Lock::with_max_hold`]).
        #[must_use = "with_max_hold returns the lock with the cap set"]
        pub fn with_max_hold(self, max_hold: Duration) -> Self {
            Self {
                lock: self.lock.with_max_hold(max_hold),
            }
        }

        #[doc = concat!("Takes the ", $kind, " lock if it is free for it, without waiting.")]
        ///
        /// # Errors
        ///
        /// As for [`Lock::lock`].
        pub fn try_lock(&self) -> Result<Option<LockGuard>> {
            self.lock.try_lock()
        }

        #[doc = concat!("Takes the ", $kind, " lock, waiting at most `wait` (a `wait` too large to represent means no deadline).")]
        ///
        /// # Errors
        ///
        /// As for [`Lock::lock`]; for a write lock also as for
        /// [`WriteLock::lock`](crate::WriteLock::lock) when there is no
        /// deadline (an upgrade would wait forever).
        pub fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard>> {
            let terms = self.lock.watchdog_terms()?;
            self.acquire($crate::engine::waiting::Wait::after(wait), &terms)
        }

        #[doc = concat!("Takes the ", $kind, " lock, waiting until `deadline` at the latest.")]
        ///
        /// # Errors
        ///
        /// As for [`Lock::lock`].
        pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>> {
            let terms = self.lock.watchdog_terms()?;
            self.acquire($crate::engine::waiting::Wait::Until(deadline), &terms)
        }

        #[doc = concat!("Takes the ", $kind, " lock with a fixed `lease`, waiting at most `wait`.")]
        ///
        /// # Errors
        ///
        /// As for [`Lock::lock_with_lease`]; for a write lock also as for
        /// [`WriteLock::lock`](crate::WriteLock::lock) when `wait` is too
        /// large to have a deadline.
        pub fn try_lock_with_lease(
            &self,
            wait: Duration,
            lease: Duration,
        ) -> Result<Option<LockGuard>> {
            let terms = self.lock.lease_terms(lease)?;
            self.acquire($crate::engine::waiting::Wait::after(wait), &terms)
        }

        #[doc = concat!("How many times this thread holds the ", $kind, " lock, as Redis records it.")]
        ///
        /// # Errors
        ///
        /// Empty name, or a Redis or pool error.
        pub fn hold_count(&self) -> Result<u32> {
            self.lock.hold_count()
        }

        #[doc = concat!("`true` if this thread holds the ", $kind, " lock, as Redis records it.")]
        ///
        /// # Errors
        ///
        /// Empty name, or a Redis or pool error.
        pub fn is_held_by_current_thread(&self) -> Result<bool> {
            self.lock.is_held_by_current_thread()
        }

        #[doc = concat!("The remaining lease of the ", $kind, " lock's key, whoever holds it (a read or write lock's: the read-write lock's, in either mode; see [`Lock::remaining_lease`]): `None` if it is free.")]
        ///
        /// # Errors
        ///
        /// Empty name, or a Redis or pool error.
        pub fn remaining_lease(&self) -> Result<Option<Duration>> {
            self.lock.remaining_lease()
        }
    };
}

pub(crate) use acquire_methods;
