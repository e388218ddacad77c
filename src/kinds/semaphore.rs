//! The semaphore ([`Semaphore`], Redisson's `RSemaphore` layout) with its
//! RAII guard [`SemaphorePermits`], and what both semaphores share
//! ([`Names`]: the names, the checks, an attempt, giving permits back); the
//! permit-expirable semaphore (`expirable`) is built on it.
//!
//! Both kinds count the permits available in the string integer at `<name>`
//! and publish on `redisson_sc:{<name>}` when permits come back, so Redisson
//! clients on the same name share them. Waiting is the lock's loop
//! (`waiting::Waiters`): a message wakes this process's waiters of the name, each
//! tries for what it needs, and a wait never lasts past
//! [`PERMIT_RECHECK`] without a try (an expirable semaphore's waiter tries
//! sooner when the next permit out expires sooner), so a missed message
//! delays an acquisition but never hangs it.
//!
//! Exactly once: every acquisition records what it took (a field of
//! redlease's `redlease_semaphore_permits:{<name>}` hash, or the permit's id
//! in the set of permits out), so its release, retried or completed in the
//! background after a lost reply, returns the permits once; an acquisition
//! whose reply was lost is undone in the background and its cancel marker
//! stops a late copy of it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::shared::{check_count, check_name, Shared};
use crate::engine::unsettled::{Lost, Unsettled};
use crate::engine::waiting::{Attempt, Wait, Waiters};
use crate::error::{Error, Result};
use crate::net::pool::{send_once, Synced};
use crate::net::pubsub::WakeRule;
use crate::net::router::Router;
use crate::scripts::{self, LockRef, PermitsOp, SemaphoreRef};
use crate::time::warn_limited;

/// The longest a waiter for permits goes without trying again when no
/// message comes (and, for an expirable semaphore, no permit out expires
/// sooner). Messages are the way waiters learn of a release; this only
/// bounds the cost of one missed (a Redis client that changed the count
/// without publishing, a subscriber connection being replaced).
pub const PERMIT_RECHECK: Duration = Duration::from_secs(1);

/// The names of one semaphore and the client it is used through.
#[derive(Clone)]
pub(crate) struct Names {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    pub(crate) channel: String,
    /// The permit records (`Semaphore`) or the set of permits out
    /// (`ExpirableSemaphore`).
    pub(crate) book: String,
    /// `semaphore` or `expirable-semaphore` (events).
    pub(crate) kind: &'static str,
}

impl Names {
    pub(crate) fn new(
        shared: Arc<Shared>,
        name: String,
        book: fn(&str) -> String,
        kind: &'static str,
    ) -> Names {
        Names {
            kind,
            shared,
            channel: scripts::semaphore_channel_name(&name),
            book: book(&name),
            name,
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    pub(crate) fn router(&self) -> &Router {
        &self.shared.router
    }

    pub(crate) fn sem(&self) -> SemaphoreRef<'_> {
        SemaphoreRef {
            name: &self.name,
            channel: &self.channel,
            book: &self.book,
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        check_name("semaphore", &self.name, self.router())
    }

    pub(crate) fn waiters(&self) -> Waiters<'_> {
        Waiters {
            router: self.router(),
            name: &self.name,
            channel: &self.channel,
            rule: WakeRule::Permits,
            recheck: PERMIT_RECHECK,
            every: Duration::MAX,
            ride_out: Duration::MAX,
            kind: Some(self.kind),
            client: None,
            failover: self.shared.watchdog_timeout,
        }
    }

    pub(crate) fn permits(&self, op: PermitsOp) -> Result<i64> {
        self.check()?;
        let publish = self.router().publish_command();
        // Not idempotent (as Redisson's, which sends them without retry).
        // Waited for by the replicas, as a lock's writes, where replica sync
        // is on (a count fewer confirmed is still set on the master).
        self.router()
            .run_synced(
                &self.name,
                send_once(|conn| scripts::permits(conn, self.sem(), op, publish)),
            )
            .map(|(n, _)| n)
    }

    pub(crate) fn try_set_permits(&self, permits: u64) -> Result<bool> {
        check_count("permits", permits)?;
        Ok(self.permits(PermitsOp::Set(permits))? == 1)
    }

    pub(crate) fn add_permits(&self, delta: i64) -> Result<i64> {
        check_count("permit change", delta.unsigned_abs())?;
        self.permits(PermitsOp::Add(delta))
    }

    pub(crate) fn get(&self) -> Result<i64> {
        self.check()?;
        let n: Option<i64> = self
            .router()
            .run(&self.name, |c| redis::cmd("GET").arg(&self.name).query(c))?;
        Ok(n.unwrap_or(0))
    }

    pub(crate) fn delete(&self) -> Result<bool> {
        self.check()?;
        let n: u32 = self.router().run(&self.name, |c| {
            redis::cmd("DEL").arg(&self.name).arg(&self.book).query(c)
        })?;
        Ok(n > 0)
    }

    /// One acquire script call: acquired (`acquired` makes the guard), busy
    /// (`hint` reads the script's answer), or an error after which the
    /// acquisition, if it may have run (or ran but too few replicas
    /// confirmed it), is undone in the background (`undo`: what settles it).
    pub(crate) fn attempt<R>(
        &self,
        run: impl FnMut(&mut crate::net::transport::Connection) -> redis::RedisResult<i64>,
        undo: impl Fn() -> Unsettled,
        acquired: impl FnOnce() -> R,
        hint: impl FnOnce(i64) -> Option<Duration>,
    ) -> Result<Attempt<R>> {
        let shared = self.shared();
        let code = match self.router().run_synced(&self.name, run) {
            Ok((-1, Synced::No { wanted, acked })) => {
                // Taken, but too few replicas confirmed it: a failover could
                // hand the permits out again. Undo it now (so that a retry
                // finds them back), or in the background if that fails.
                self.undo_now(undo());
                return Err(Error::ReplicaSync {
                    name: self.name.clone(),
                    wanted,
                    acked,
                });
            }
            Ok((code, _)) => code,
            Err(e) => {
                if e.maybe_applied() {
                    // It may have run, or run later: undo it in the
                    // background; its marker stops a late copy.
                    shared.watchdog.settle_later(Arc::new(undo()));
                }
                return Err(e);
            }
        };
        Ok(match code {
            -1 => {
                shared.announce();
                Attempt::Acquired(acquired())
            }
            // Cancelled: the request id is new per call, so only a request
            // undone already could see its marker. Not taken.
            -3 => Attempt::Busy(Some(Duration::ZERO)),
            code => Attempt::Busy(hint(code)),
        })
    }

    /// Runs the undo of an acquisition that ran now (one round trip);
    /// settles it in the background if that fails.
    pub(crate) fn undo_now(&self, undo: Unsettled) {
        let publish = self.router().publish_command();
        let latch_ms = self.shared().latch_ttl_ms;
        // Waited for by the replicas where replica sync is on: an
        // acquisition a replica has must not outlive its undo there.
        let done = self.router().run_synced(&self.name, |conn| {
            undo.return_permits(conn, latch_ms, publish)
                .unwrap_or(Ok(0))
        });
        if done.is_err() {
            self.shared().watchdog.settle_later(Arc::new(undo));
        }
    }

    /// `try_once` (a new request each time), tried again (up to the
    /// client's `retry_attempts`) while too few replicas confirm it.
    pub(crate) fn synced<R>(
        &self,
        mut try_once: impl FnMut() -> Result<Attempt<R>>,
    ) -> Result<Attempt<R>> {
        let mut tries = 0;
        loop {
            match try_once() {
                Err(e) if e.is_replica_sync() && tries < self.router().retry_attempts() => {
                    tries += 1;
                }
                other => return other,
            }
        }
    }
}

/// What one acquisition holds: its record (the field of the semaphore's
/// records), or an expirable semaphore's permit (raw id, hex id).
#[derive(Clone, Copy)]
pub(crate) enum Held<'a> {
    Record(&'a str),
    Permit(&'a [u8; 16], &'a str),
}

impl Names {
    /// Returns what `held` holds (one round trip): `Ok` if it was out (or
    /// its latch says an earlier copy returned it); [`Error::PermitLost`]
    /// if it was not (deleted, or an expirable permit whose lease ran out);
    /// on a passing failure the return is completed in the background, once.
    /// Tells the release's event for a guard acquired at `acquired_at`.
    pub(crate) fn give_back(&self, held: Held<'_>, acquired_at: Option<Instant>) -> Result<()> {
        let r = self.return_held(held);
        let events = &self.shared().events;
        events.released(self.kind, &self.name, acquired_at, r.is_ok());
        r
    }

    fn return_held(&self, held: Held<'_>) -> Result<()> {
        let publish = self.router().publish_command();
        let latch_ms = self.shared().latch_ttl_ms;
        let (latch, what) = match held {
            Held::Record(field) => (
                scripts::semaphore_latch_name(&self.name, field),
                scripts::Held::Record(field),
            ),
            Held::Permit(raw, id) => (
                scripts::permit_latch_name(&self.name, id, self.shared().next_request()),
                scripts::Held::Permit(raw),
            ),
        };
        let sent = Instant::now();
        // Waited for by the replicas where replica sync is on, as a lock's
        // release (one fewer confirmed is still done on the master).
        let reply = self
            .router()
            .run_synced(&self.name, |conn| {
                scripts::return_permits(conn, self.sem(), what, &latch, None, latch_ms, publish)
            })
            .map(|(n, _)| n);
        match reply {
            Ok(1) => Ok(()),
            Ok(_) => Err(Error::PermitLost {
                name: self.name.clone(),
            }),
            Err(e) => {
                if e.needs_settle() {
                    let later = self.lost(held, latch, false, sent);
                    self.shared().watchdog.settle_later(Arc::new(later));
                }
                Err(e)
            }
        }
    }
}

fn check_wanted(n: u64) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid("permits must be at least 1, got 0"));
    }
    check_count("permits", n)
}

/// A distributed counting semaphore, shared with Redisson's `RSemaphore` on
/// the same name: the string integer at `<name>` counts the permits
/// available, and `redisson_sc:{<name>}` carries the new total when permits
/// come back.
///
/// Permits have no owner and no lease: any client may release them, and a
/// holder that crashes keeps its permits out until someone adds them back
/// (use an [`ExpirableSemaphore`](crate::ExpirableSemaphore) when holders may crash). A guard
/// ([`SemaphorePermits`]) returns exactly what its acquisition took, once,
/// even when a reply is lost; it records them in redlease's own hash
/// `redlease_semaphore_permits:{<name>}` (field `<client-uuid>:<request>`),
/// which Redisson does not read.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let pool = client.semaphore("db-connections");
/// pool.try_set_permits(10)?;               // false if it exists already
/// {
///     let permit = pool.acquire(1)?;       // waits for a permit
///     // ... at most 10 of these sections run at once, across processes
/// }                                        // returned here
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a Semaphore does nothing until one of its methods is called"]
pub struct Semaphore {
    names: Names,
}

impl Semaphore {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> Semaphore {
        Semaphore {
            names: Names::new(shared, name, scripts::semaphore_records_name, "semaphore"),
        }
    }

    /// The semaphore's name (the key of its count).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.names.name
    }

    /// Sets the permits available to `permits` if the semaphore does not
    /// exist; `false` if it does (its count is left as it is).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or more than 2^53
    /// permits; a Redis or pool error.
    pub fn try_set_permits(&self, permits: u64) -> Result<bool> {
        self.names.try_set_permits(permits)
    }

    /// Adds `delta` permits (takes them away when negative: the count may go
    /// below zero, and acquisitions wait until it is back up). Waiters wake
    /// when the total is above zero.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or a change beyond
    /// 2^53; a Redis or pool error, after which the change may or may not
    /// have happened (it is not idempotent, as in Redisson).
    pub fn add_permits(&self, delta: i64) -> Result<()> {
        self.names.add_permits(delta).map(|_| ())
    }

    /// The permits available now (may be below zero after
    /// [`add_permits`](Self::add_permits) with a negative change; 0 for a
    /// semaphore never set).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn available_permits(&self) -> Result<i64> {
        self.names.get()
    }

    /// Who holds permits, as redlease records them: each acquisition with
    /// its client, permits and, for a live client, its process (see
    /// [`Holder`](crate::Holder)). Permits taken by Redisson clients, or
    /// [`forget`](SemaphorePermits::forget)-ten, are not recorded. Read only.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn holders(&self) -> Result<Vec<crate::kinds::inspect::Holder>> {
        self.names.check()?;
        crate::kinds::inspect::semaphore_holders(self.names.shared(), &self.names.name)
    }

    /// Takes every permit available and returns how many; they are out
    /// until [`release`](Self::release)d or added back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn drain_permits(&self) -> Result<u64> {
        let n = self.names.permits(PermitsOp::Drain)?;
        Ok(n.unsigned_abs())
    }

    /// Returns `permits` permits without a guard (Redisson's
    /// `release(n)`), e.g. those of a guard that was
    /// [`forget`](SemaphorePermits::forget)-ed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 permits, more than 2^53 or an empty name; a Redis
    /// or pool error, after which the release may or may not have happened
    /// (unlike a guard's release, it is not idempotent, as in Redisson).
    pub fn release(&self, permits: u64) -> Result<()> {
        check_wanted(permits)?;
        self.names.add_permits(permits.cast_signed()).map(|_| ())
    }

    /// Deletes the semaphore (its count and redlease's records of the
    /// permits out); `false` if there was none. Guards of it return nothing
    /// afterwards ([`Error::PermitLost`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn delete(&self) -> Result<bool> {
        self.names.delete()
    }

    /// Takes `permits` permits, waiting as long as it takes.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let permits = client.semaphore("uploads").acquire(2)?;
    /// assert_eq!(permits.permits(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 permits, more than 2^53 or an empty name; a Redis
    /// or pool error ([`Error::ReplicaSync`] when replica sync could not
    /// confirm it). A failed call never leaves permits out in the caller's
    /// name: one that may have been taken is returned in the background.
    pub fn acquire(&self, permits: u64) -> Result<SemaphorePermits> {
        loop {
            if let Some(p) = self.acquire_until(permits, Wait::Forever)? {
                return Ok(p);
            }
        }
    }

    /// Takes `permits` permits if that many are available, without waiting.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire(&self, permits: u64) -> Result<Option<SemaphorePermits>> {
        self.acquire_until(permits, Wait::No)
    }

    /// Takes `permits` permits, waiting at most `wait`; `None` if too few
    /// became available.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// if let Some(_p) = client.semaphore("uploads").try_acquire_for(1, Duration::from_secs(2))? {
    ///     // ...
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire_for(
        &self,
        permits: u64,
        wait: Duration,
    ) -> Result<Option<SemaphorePermits>> {
        self.acquire_until(permits, Wait::after(wait))
    }

    /// Takes `permits` permits, waiting until `deadline` at the latest.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire_until(
        &self,
        permits: u64,
        deadline: Instant,
    ) -> Result<Option<SemaphorePermits>> {
        self.acquire_until(permits, Wait::Until(deadline))
    }

    fn acquire_until(&self, permits: u64, wait: Wait) -> Result<Option<SemaphorePermits>> {
        check_wanted(permits)?;
        self.names.check()?;
        let names = &self.names;
        names
            .waiters()
            .acquire(wait.deadline(), |_| names.synced(|| self.attempt(permits)))
    }

    fn attempt(&self, permits: u64) -> Result<Attempt<SemaphorePermits>> {
        let names = &self.names;
        let shared = names.shared();
        let n = shared.next_request();
        let client_id = shared.uuid.as_str();
        let mut field = String::with_capacity(client_id.len() + 21);
        field.push_str(client_id);
        field.push(':');
        field.push_str(&n.to_string());
        let marker = scripts::semaphore_cancel_name(&names.name, client_id, n);
        let sent = Instant::now();
        names.attempt(
            |conn| scripts::semaphore_acquire(conn, names.sem(), &marker, permits, &field),
            || names.lost(Held::Record(&field), marker.clone(), true, sent),
            || SemaphorePermits {
                sem: self.clone(),
                field: field.clone(),
                permits,
                done: false,
                acquired_at: shared.events.start(),
            },
            // The permits available: no hint when the next come back.
            |_| None,
        )
    }
}

impl Names {
    /// The request that returns what `held` holds in the background (`key`:
    /// the release's latch, or for an `undo`, the acquisition's cancel
    /// marker).
    pub(crate) fn lost(&self, held: Held<'_>, key: String, undo: bool, sent: Instant) -> Unsettled {
        let (field, permit) = match held {
            Held::Record(field) => (field, None),
            Held::Permit(raw, _) => ("", Some(*raw)),
        };
        let kind = Lost::Permits {
            book: self.book.clone(),
            permit,
            undo,
        };
        Unsettled::new(self.lock_ref(field), key, kind, None, sent)
    }

    /// The names a settle of an ownerless request works on (`field`: the
    /// permit record's field, or empty).
    pub(crate) fn lock_ref<'a>(&'a self, field: &'a str) -> LockRef<'a> {
        LockRef {
            name: &self.name,
            channel: &self.channel,
            field,
            kind: scripts::Kind::Plain,
        }
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.names.name)
            .finish()
    }
}

/// Permits taken from a [`Semaphore`]; dropping the guard returns them (so
/// does [`release`](Self::release), which reports failures). The return is
/// exactly once: a release whose reply was lost is completed in the
/// background, and never applied twice.
///
/// Permits have no owner, so the guard is `Send`: it may be released from
/// another thread.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let permits = client.semaphore("uploads").acquire(1)?;
/// std::thread::spawn(move || {
///     // ... work ...
///     permits.release()
/// })
/// .join()
/// .unwrap()?;
/// # Ok(()) }
/// ```
#[must_use = "the permits are returned as soon as the guard is dropped"]
pub struct SemaphorePermits {
    sem: Semaphore,
    field: String,
    permits: u64,
    done: bool,
    /// When it was acquired, if an event handler measures it.
    acquired_at: Option<std::time::Instant>,
}

impl SemaphorePermits {
    /// How many permits this guard holds.
    #[must_use]
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// The semaphore's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.sem.names.name
    }

    /// Returns the permits and reports the outcome.
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] if the semaphore was deleted meanwhile; a Redis
    /// or pool error if Redis could not be reached or did not answer in
    /// time: the release is then completed in the background as soon as
    /// Redis answers, once.
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        self.return_permits()
    }

    /// Drops the guard without returning the permits: they stay out until
    /// someone calls [`Semaphore::release`] or
    /// [`Semaphore::add_permits`]. Forgets redlease's record of them (one
    /// round trip; a failure to do so is only logged).
    pub fn forget(mut self) {
        self.done = true;
        let names = &self.sem.names;
        let forgot = names.router().run(&names.name, |c| {
            redis::cmd("HDEL")
                .arg(&names.book)
                .arg(&self.field)
                .query::<i64>(c)
        });
        if let Err(e) = forgot {
            log::debug!(
                "forgetting the record of permits of {:?} failed: {e}",
                names.name
            );
        }
    }

    fn return_permits(&self) -> Result<()> {
        self.sem
            .names
            .give_back(Held::Record(&self.field), self.acquired_at)
    }
}

impl Drop for SemaphorePermits {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.return_permits() {
            // A lost lock (or permit) is told each time.
            warn_limited!(
                unless e.is_lock_lost(),
                "permits release on drop",
                "returning permits of semaphore {:?} on drop failed: {e}",
                self.sem.names.name
            );
        }
    }
}

impl fmt::Debug for SemaphorePermits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermits")
            .field("name", &self.sem.names.name)
            .field("permits", &self.permits)
            .finish()
    }
}
