//! Semaphores: [`Semaphore`] (Redisson's `RSemaphore` layout) and
//! [`ExpirableSemaphore`] (Redisson's `RPermitExpirableSemaphore`), with their
//! RAII guards [`SemaphorePermits`] and [`Permit`].
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

use parking_lot::Mutex;

use crate::engine::shared::{check_lease, check_name, Shared};
use crate::engine::unsettled::{Lost, Unsettled};
use crate::engine::waiting::{Attempt, Wait, Waiters};
use crate::error::{Error, Result};
use crate::net::pool::{send_once, Synced};
use crate::net::pubsub::WakeRule;
use crate::net::router::Router;
use crate::scripts::{self, LockRef, PermitsOp, SemaphoreRef};
use crate::time::{deadline, duration_ms};

/// The longest a waiter for permits goes without trying again when no
/// message comes (and, for an expirable semaphore, no permit out expires
/// sooner). Messages are the way waiters learn of a release; this only
/// bounds the cost of one missed (a Redis client that changed the count
/// without publishing, a subscriber connection being replaced).
pub const PERMIT_RECHECK: Duration = Duration::from_secs(1);

/// The most permits one call takes, gives or sets: 2^53, the largest whole
/// number a Lua script handles exactly.
const MAX_PERMITS: u64 = 1 << 53;

/// The names of one semaphore and the client it is used through.
#[derive(Clone)]
struct Names {
    shared: Arc<Shared>,
    name: String,
    channel: String,
    /// The permit records (`Semaphore`) or the set of permits out
    /// (`ExpirableSemaphore`).
    book: String,
}

impl Names {
    fn new(shared: Arc<Shared>, name: String, book: fn(&str) -> String) -> Names {
        Names {
            shared,
            channel: scripts::semaphore_channel_name(&name),
            book: book(&name),
            name,
        }
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn router(&self) -> &Router {
        &self.shared.router
    }

    fn sem(&self) -> SemaphoreRef<'_> {
        SemaphoreRef {
            name: &self.name,
            channel: &self.channel,
            book: &self.book,
        }
    }

    fn check(&self) -> Result<()> {
        check_name("semaphore", &self.name, self.router())
    }

    fn waiters(&self) -> Waiters<'_> {
        Waiters {
            router: self.router(),
            name: &self.name,
            channel: &self.channel,
            rule: WakeRule::Permits,
            recheck: PERMIT_RECHECK,
        }
    }

    fn permits(&self, op: PermitsOp) -> Result<i64> {
        self.check()?;
        let publish = self.router().publish_command();
        // Not idempotent (as Redisson's, which sends them without retry).
        self.router().run(
            &self.name,
            send_once(|conn| scripts::permits(conn, self.sem(), op, publish)),
        )
    }

    fn try_set_permits(&self, permits: u64) -> Result<bool> {
        check_count("permits", permits)?;
        Ok(self.permits(PermitsOp::Set(permits))? == 1)
    }

    fn add_permits(&self, delta: i64) -> Result<i64> {
        check_count("the change of permits", delta.unsigned_abs())?;
        self.permits(PermitsOp::Add(delta))
    }

    fn get(&self) -> Result<i64> {
        self.check()?;
        let n: Option<i64> = self
            .router()
            .run(&self.name, |c| redis::cmd("GET").arg(&self.name).query(c))?;
        Ok(n.unwrap_or(0))
    }

    fn delete(&self) -> Result<bool> {
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
    fn attempt<R>(
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
            -1 => Attempt::Acquired(acquired()),
            // Cancelled: the request id is new per call, so only a request
            // undone already could see its marker. Not taken.
            -3 => Attempt::Busy(Some(Duration::ZERO)),
            code => Attempt::Busy(hint(code)),
        })
    }

    /// Runs the undo of an acquisition that ran now (one round trip);
    /// settles it in the background if that fails.
    fn undo_now(&self, undo: Unsettled) {
        let publish = self.router().publish_command();
        let latch_ms = self.shared().latch_ttl_ms;
        let done = self.router().run(&self.name, |conn| {
            undo.return_permits(conn, latch_ms, publish)
                .unwrap_or(Ok(0))
        });
        if done.is_err() {
            self.shared().watchdog.settle_later(Arc::new(undo));
        }
    }

    /// `try_once` (a new request each time), tried again (up to the
    /// client's `retry_attempts`) while too few replicas confirm it.
    fn synced<R>(&self, mut try_once: impl FnMut() -> Result<Attempt<R>>) -> Result<Attempt<R>> {
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
enum Held<'a> {
    Record(&'a str),
    Permit(&'a [u8; 16], &'a str),
}

impl Names {
    /// Returns what `held` holds (one round trip): `Ok` if it was out (or
    /// its latch says an earlier copy returned it); [`Error::PermitLost`]
    /// if it was not (deleted, or an expirable permit whose lease ran out);
    /// on a passing failure the return is completed in the background, once.
    fn give_back(&self, held: Held<'_>) -> Result<()> {
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
        let reply = self.router().run(&self.name, |conn| {
            scripts::return_permits(conn, self.sem(), what, &latch, None, latch_ms, publish)
        });
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

fn check_count(what: &str, n: u64) -> Result<()> {
    if n > MAX_PERMITS {
        return Err(Error::invalid(format!(
            "{what} of {n} is too large: use at most 2^53 (Lua counts exactly up to there)"
        )));
    }
    Ok(())
}

fn check_wanted(n: u32) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            "0 permits asked for: acquire or release at least 1",
        ));
    }
    Ok(())
}

/// A distributed counting semaphore, shared with Redisson's `RSemaphore` on
/// the same name: the string integer at `<name>` counts the permits
/// available, and `redisson_sc:{<name>}` carries the new total when permits
/// come back.
///
/// Permits have no owner and no lease: any client may release them, and a
/// holder that crashes keeps its permits out until someone adds them back
/// (use an [`ExpirableSemaphore`] when holders may crash). A guard
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
            names: Names::new(shared, name, scripts::semaphore_records_name),
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
    /// [`Error::InvalidArgument`] for 0 permits or an empty name; a Redis
    /// or pool error, after which the release may or may not have happened
    /// (unlike a guard's release, it is not idempotent, as in Redisson).
    pub fn release(&self, permits: u32) -> Result<()> {
        check_wanted(permits)?;
        self.names.add_permits(i64::from(permits)).map(|_| ())
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
    /// [`Error::InvalidArgument`] for 0 permits or an empty name; a Redis
    /// or pool error ([`Error::ReplicaSync`] when replica sync could not
    /// confirm it). A failed call never leaves permits out in the caller's
    /// name: one that may have been taken is returned in the background.
    pub fn acquire(&self, permits: u32) -> Result<SemaphorePermits> {
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
    pub fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermits>> {
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
        permits: u32,
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
        permits: u32,
        deadline: Instant,
    ) -> Result<Option<SemaphorePermits>> {
        self.acquire_until(permits, Wait::Until(deadline))
    }

    fn acquire_until(&self, permits: u32, wait: Wait) -> Result<Option<SemaphorePermits>> {
        check_wanted(permits)?;
        self.names.check()?;
        let names = &self.names;
        names
            .waiters()
            .acquire(wait.deadline(), || names.synced(|| self.attempt(permits)))
    }

    fn attempt(&self, permits: u32) -> Result<Attempt<SemaphorePermits>> {
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
    fn lost(&self, held: Held<'_>, key: String, undo: bool, sent: Instant) -> Unsettled {
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
    fn lock_ref<'a>(&'a self, field: &'a str) -> LockRef<'a> {
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
    permits: u32,
    done: bool,
}

impl SemaphorePermits {
    /// How many permits this guard holds.
    #[must_use]
    pub fn permits(&self) -> u32 {
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
                "redlease: forgetting the record of permits of {:?} failed: {e}",
                names.name
            );
        }
    }

    fn return_permits(&self) -> Result<()> {
        self.sem.names.give_back(Held::Record(&self.field))
    }
}

impl Drop for SemaphorePermits {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.return_permits() {
            log::warn!(
                "redlease: returning permits of semaphore {:?} on drop failed: {e}",
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

/// A distributed semaphore whose permits expire, shared with Redisson's
/// `RPermitExpirableSemaphore` on the same name: `<name>` counts the permits
/// available, the sorted set `{<name>}:timeout` holds the permits out
/// (member: the permit's 16-byte id; score: its expiry in epoch ms), and
/// `redisson_sc:{<name>}` carries counts when permits come back.
///
/// Every permit has a lease: a holder that crashes loses its permit when
/// the lease runs out, and the next acquisition (or
/// [`available_permits`](Self::available_permits)) counts it back. Expiry is
/// by Redis's clock, so clients' clocks do not matter among redlease
/// clients (Redisson computes expiries with its own clock). A permit is
/// released by its guard ([`Permit`]) or by id; release by id is idempotent,
/// so retrying it after a lost reply is safe.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// use std::time::Duration;
/// let slots = client.permit_expirable_semaphore("render-slots");
/// slots.try_set_permits(4)?;
/// let permit = slots.acquire(Duration::from_secs(30))?;  // comes back after 30 s at most
/// println!("holding permit {}", permit.id());
/// permit.update_lease(Duration::from_secs(30))?;         // 30 s from now
/// permit.release()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an ExpirableSemaphore does nothing until one of its methods is called"]
pub struct ExpirableSemaphore {
    names: Names,
}

impl ExpirableSemaphore {
    /// The longest permit lease accepted: 100 years (expiries are absolute
    /// epoch milliseconds; Redisson reads far larger ones as "never").
    pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    pub(crate) fn new(shared: Arc<Shared>, name: String) -> ExpirableSemaphore {
        ExpirableSemaphore {
            names: Names::new(shared, name, scripts::permits_out_name),
        }
    }

    /// The semaphore's name (the key of its count).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.names.name
    }

    /// Sets the permits available to `permits` if the semaphore does not
    /// exist; `false` if it does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or more than 2^53
    /// permits; a Redis or pool error.
    pub fn try_set_permits(&self, permits: u64) -> Result<bool> {
        self.names.try_set_permits(permits)
    }

    /// Adds `delta` permits (takes them away when negative).
    ///
    /// # Errors
    ///
    /// As for [`Semaphore::add_permits`].
    pub fn add_permits(&self, delta: i64) -> Result<()> {
        self.names.add_permits(delta).map(|_| ())
    }

    /// The permits available now, after counting back the permits whose
    /// lease ran out (a write: waiters are told of those).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn available_permits(&self) -> Result<i64> {
        self.names.check()?;
        let names = &self.names;
        let publish = names.router().publish_command();
        names.router().run(&names.name, |conn| {
            scripts::permit_lease(conn, names.sem(), None, publish)
        })
    }

    /// Releases the permit with id `id` (32 hex digits, as
    /// [`Permit::id`] gives); `true` if it was out and is now returned
    /// (also when its lease had run out but it was not counted back yet),
    /// `false` if it was not out (released already, or counted back after
    /// its lease ran out). Idempotent: safe to retry after an error, which
    /// returns the permit once (the retry answers `false` if the first call
    /// had returned it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an id that is not 32 hex digits or an
    /// empty name; a Redis or pool error.
    pub fn release(&self, id: &str) -> Result<bool> {
        let raw = parse_id(id)?;
        self.names.check()?;
        let names = &self.names;
        let publish = names.router().publish_command();
        let latch =
            scripts::permit_latch_name(&names.name, &hex(&raw), names.shared().next_request());
        let n = names.router().run(&names.name, |conn| {
            scripts::return_permits(
                conn,
                names.sem(),
                scripts::Held::Permit(&raw),
                &latch,
                None,
                names.shared().latch_ttl_ms,
                publish,
            )
        })?;
        Ok(n != 0)
    }

    /// Deletes the semaphore (its count and its permits out); `false` if
    /// there was none. Permits of it are lost ([`Error::PermitLost`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn delete(&self) -> Result<bool> {
        self.names.delete()
    }

    /// Takes a permit with `lease`, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease below 1 ms or above
    /// [`MAX_LEASE`](Self::MAX_LEASE), or an empty name; a Redis or pool
    /// error. A failed call never leaves a permit out in the caller's name:
    /// one that may have been taken is returned in the background.
    pub fn acquire(&self, lease: Duration) -> Result<Permit> {
        loop {
            if let Some(p) = self.acquire_until(Wait::Forever, lease)? {
                return Ok(p);
            }
        }
    }

    /// Takes a permit with `lease` if one is available, without waiting.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire(&self, lease: Duration) -> Result<Option<Permit>> {
        self.acquire_until(Wait::No, lease)
    }

    /// Takes a permit with `lease`, waiting at most `wait`.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire_for(&self, wait: Duration, lease: Duration) -> Result<Option<Permit>> {
        self.acquire_until(Wait::after(wait), lease)
    }

    /// Takes a permit with `lease`, waiting until `deadline` at the latest.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire_until(&self, deadline: Instant, lease: Duration) -> Result<Option<Permit>> {
        self.acquire_until(Wait::Until(deadline), lease)
    }

    fn acquire_until(&self, wait: Wait, lease: Duration) -> Result<Option<Permit>> {
        check_permit_lease(lease)?;
        self.names.check()?;
        let names = &self.names;
        names
            .waiters()
            .acquire(wait.deadline(), || names.synced(|| self.attempt(lease)))
    }

    fn attempt(&self, lease: Duration) -> Result<Attempt<Permit>> {
        let names = &self.names;
        let raw = *uuid::Uuid::new_v4().as_bytes();
        let id = hex(&raw);
        let marker = scripts::permit_cancel_name(&names.name, &id);
        let lease_ms = duration_ms(lease);
        let publish = names.router().publish_command();
        let sent = Instant::now();
        names.attempt(
            |conn| scripts::permit_acquire(conn, names.sem(), &marker, lease_ms, &raw, publish),
            || names.lost(Held::Permit(&raw, &id), marker.clone(), true, sent),
            || Permit {
                sem: self.clone(),
                id: id.clone(),
                raw,
                lease: Mutex::new(PermitLease {
                    valid_until: deadline(sent, lease_ms),
                    in_flight: 0,
                    overlapped: false,
                }),
                done: false,
            },
            // The ms until the first permit out expires (-2: none will),
            // and a re-check at least every PERMIT_RECHECK all the same.
            |ms| {
                let expiry = Duration::from_millis(ms.unsigned_abs());
                Some(if ms >= 0 {
                    expiry.min(PERMIT_RECHECK)
                } else {
                    PERMIT_RECHECK
                })
            },
        )
    }
}

impl fmt::Debug for ExpirableSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpirableSemaphore")
            .field("name", &self.names.name)
            .finish()
    }
}

fn check_permit_lease(lease: Duration) -> Result<()> {
    check_lease("the permit lease", lease)?;
    if lease > ExpirableSemaphore::MAX_LEASE {
        return Err(Error::invalid(format!(
            "the permit lease of {lease:?} is too long: use at most 100 years \
             (ExpirableSemaphore::MAX_LEASE)"
        )));
    }
    Ok(())
}

pub(crate) fn hex(raw: &[u8; 16]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(32);
    for b in raw {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn parse_id(id: &str) -> Result<[u8; 16]> {
    let bad = || {
        Error::invalid(format!(
            "permit id {id:?} is not 32 hex digits: pass the id Permit::id gave"
        ))
    };
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&id[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(raw)
}

/// What a [`Permit`] knows of its lease.
struct PermitLease {
    /// Until when the permit is known to be out.
    valid_until: Instant,
    /// Lease updates under way.
    in_flight: u32,
    /// Some of them overlapped.
    overlapped: bool,
}

/// A permit of an [`ExpirableSemaphore`]: it comes back when released (by
/// this guard, on drop, or by id) or when its lease runs out.
///
/// The guard is `Send`: permits have no owner.
#[must_use = "the permit is released as soon as the guard is dropped"]
pub struct Permit {
    sem: ExpirableSemaphore,
    id: String,
    raw: [u8; 16],
    lease: Mutex<PermitLease>,
    done: bool,
}

impl Permit {
    /// The permit's id: 32 lower-case hex digits (Redisson's form), for
    /// [`ExpirableSemaphore::release`].
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Until when the permit is known to be out: its last lease, counted
    /// from when the request that set it was sent.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.lease.lock().valid_until
    }

    /// `true` once the permit's lease has passed (it may be counted back
    /// and handed out again).
    #[must_use]
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until()
    }

    /// Sets the permit's lease to `lease` from now.
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] if the permit is no longer out (its lease ran
    /// out first, it was released by id, or the semaphore was deleted);
    /// [`Error::InvalidArgument`] for a lease out of range; a
    /// Redis or pool error (the lease is then known only up to the shorter
    /// of the old and the new one).
    pub fn update_lease(&self, lease: Duration) -> Result<()> {
        check_permit_lease(lease)?;
        let names = &self.sem.names;
        let lease_ms = duration_ms(lease);
        let publish = names.router().publish_command();
        let sent = Instant::now();
        {
            // Until the reply: either lease may be the one in Redis.
            let mut st = self.lease.lock();
            st.valid_until = st.valid_until.min(deadline(sent, lease_ms));
            st.in_flight += 1;
            st.overlapped |= st.in_flight > 1;
        }
        let result = names.router().run(&names.name, |conn| {
            scripts::permit_lease(conn, names.sem(), Some((&self.raw, lease_ms)), publish)
        });
        let mut st = self.lease.lock();
        st.in_flight -= 1;
        // Updates from several threads at once may have run in another
        // order than their replies came: the bound stays at the shortest.
        let alone = !st.overlapped;
        if st.in_flight == 0 {
            st.overlapped = false;
        }
        let n = result?;
        if n == 1 {
            if alone {
                st.valid_until = deadline(sent, lease_ms);
            }
            Ok(())
        } else {
            Err(Error::PermitLost {
                name: names.name.clone(),
            })
        }
    }

    /// Releases the permit and reports the outcome.
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] if the permit's lease had run out (it is
    /// counted back either way); a Redis or pool error if Redis could not be
    /// reached or did not answer in time: the release is then completed in
    /// the background as soon as Redis answers.
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        self.return_permit()
    }

    /// Drops the guard without releasing the permit, and returns its id: it
    /// comes back when its lease runs out, or by
    /// [`ExpirableSemaphore::release`].
    #[must_use = "the id is the only way left to release the permit early"]
    pub fn forget(mut self) -> String {
        self.done = true;
        std::mem::take(&mut self.id)
    }

    fn return_permit(&self) -> Result<()> {
        self.sem.names.give_back(Held::Permit(&self.raw, &self.id))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.return_permit() {
            log::warn!(
                "redlease: releasing permit {} of {:?} on drop failed: {e}",
                self.id,
                self.sem.names.name
            );
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.sem.names.name)
            .field("id", &self.id)
            .field("expired", &self.is_expired())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_ids_round_trip_and_bad_ids_are_refused() {
        let raw = [0xab; 16];
        let id = hex(&raw);
        assert_eq!(id, "ab".repeat(16));
        assert_eq!(parse_id(&id).unwrap(), raw);
        assert_eq!(parse_id(&id.to_uppercase()).unwrap(), raw);
        for bad in [
            "",
            "ab",
            &"zz".repeat(16),
            &"é".repeat(16),
            &"ab".repeat(17),
        ] {
            assert!(parse_id(bad).unwrap_err().is_invalid_argument(), "{bad:?}");
        }
    }
}
