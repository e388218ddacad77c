//! One acquisition of a hash lock ([`LockGuard`], the guard of the plain,
//! fenced, fair, read and write locks) and the release protocol.

use std::cell::OnceCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::engine::grants::{Claim, Outcome};
use crate::engine::hold::{Hold, LostListener};
use crate::engine::owners::{is_latest, owner_state, remove_hold, settle};
use crate::engine::shared::Shared;
use crate::engine::unsettled::{keys, Lost, Unsettled};
use crate::error::{Error, Result};
use crate::kinds::lockable::lease_guard_by_inherent;
use crate::net::pool::Synced;
use crate::scripts::{self, Kind, ReleaseReply};
use crate::time::warn_limited;

/// A held lock. Dropping it releases one hold (the lock is free once every
/// re-entry of this thread is released); [`unlock`](LockGuard::unlock) does
/// the same and reports failures. Either way the release is a blocking round
/// trip to Redis (bounded by the response timeout); a release that fails on
/// drop is logged at `warn` and completed in the background once Redis
/// answers, and the lease bounds the lock meanwhile.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// # fn write_order() {}
/// let guard = client.lock("orders:42").lock()?;
/// guard.ensure_held()?;          // no round trip: is the lease still ours?
/// write_order();
/// if guard.is_lost() {
///     // the write above may have raced another holder: compensate
/// }
/// guard.unlock()?;               // or just drop it
/// # Ok(()) }
/// ```
///
/// The guard is `!Send`: ownership is "this thread of this client", and a
/// guard moved to another thread would let two threads believe they hold the
/// lock. It is `Sync`, so scoped threads may check [`is_lost`](Self::is_lost).
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redlease::LockGuard>();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    held: Held,
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

impl LockGuard {
    pub(crate) fn new(
        shared: Arc<Shared>,
        hold: Arc<Hold>,
        watched: bool,
        token: Option<u64>,
    ) -> LockGuard {
        LockGuard {
            held: Held {
                acquired_at: shared.events.start(),
                shared,
                hold,
                watched,
                token,
                done: false,
            },
            _not_send: PhantomData,
        }
    }

    /// What the guard holds, for a guard of another owner (an owned
    /// acquisition's).
    pub(crate) fn into_held(self) -> Held {
        self.held
    }

    /// The fencing token of this acquisition, for a lock from
    /// [`Client::fenced_lock`](crate::Client::fenced_lock) (`None` for a
    /// plain lock): it grows with every acquisition of the lock, re-entries
    /// included, by any client (Redisson's `RFencedLock` too). Pass it with
    /// each write to the protected resource, and have the resource refuse a
    /// token lower than the highest it has seen: a holder that lost the lock
    /// without knowing it (a pause longer than its lease) is then refused.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("ledger").lock()?;
    /// let token = guard.token().expect("a fenced lock has a token");
    /// // storage.write_if_newer(token, entry)?;
    /// # let _ = token;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn token(&self) -> Option<u64> {
        self.held.token
    }

    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// `true` once this process knows the lock is no longer held: the
    /// watchdog found it gone or could not renew it before its lease ran out,
    /// or its lease has passed without a confirmed renewal.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Checks, without a round trip, that the lock is still held; call it
    /// before each side effect the lock protects.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when [`is_lost`](Self::is_lost) is true.
    pub fn ensure_held(&self) -> Result<()> {
        self.held.ensure_held()
    }

    /// Until when the lease is known to hold: the last acquisition or renewal
    /// Redis confirmed (counted from when it was sent) plus the lease.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// How many guards this thread holds on this lock (re-entries included).
    #[must_use]
    pub fn hold_count(&self) -> u32 {
        self.held.hold.count()
    }

    /// Releases this hold and reports the outcome.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the lock was no longer held (lease ran out,
    /// deleted, or found lost by the watchdog); a Redis or pool error if
    /// Redis could not be reached or did not answer in time. In that case the
    /// release is completed in the background as soon as Redis answers (it
    /// is applied at most once), and the lease bounds the lock meanwhile.
    /// Also the connection's error when the last guard's release failed on
    /// its connection after it may have been sent and the copy sent again
    /// found the lock no longer held: released by the first copy, or lost
    /// before, which nothing tells apart (see docs/guarantees.md).
    pub fn unlock(self) -> Result<()> {
        self.held.unlock()
    }

    /// Tells `listener` (while it lives) if this guard's hold is reported
    /// lost.
    pub(crate) fn on_lost(&self, listener: Weak<dyn LostListener>) {
        self.held.hold.on_lost(listener);
    }

    /// The context of the client the guard belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.held.shared
    }

    /// Its release is not told (an acquisition that was never told: a
    /// member a MultiLock's failed round gives back).
    pub(crate) fn untold(&mut self) {
        self.held.acquired_at = None;
    }

    /// Tells its acquisition (a MultiLock member's, which no shared
    /// acquire loop told), for a call begun at `started`.
    pub(crate) fn tell_acquired(&self, started: Option<Instant>, waited: bool) {
        let held = &self.held;
        held.shared
            .events
            .acquired(held.hold.kind.label(), held.hold.name(), started, waited);
    }

    /// See [`Held::begin_release`].
    pub(crate) fn begin_release(&mut self) -> Release {
        self.held.begin_release()
    }

    /// See [`Held::end_release`].
    pub(crate) fn end_release(
        &self,
        step: ReleaseStep,
        reply: Result<(Option<i64>, Synced)>,
    ) -> Result<()> {
        self.held.end_release(step, reply)
    }

    /// See [`Held::release_command`].
    pub(crate) fn release_command(&self, r: &ReleaseRequest) -> redis::Cmd {
        self.held.release_command(r)
    }

    /// See [`Held::send_release`].
    pub(crate) fn send_release(&self, r: &ReleaseRequest) -> Result<(Option<i64>, Synced)> {
        self.held.send_release(r)
    }
}

/// One acquisition of a hash lock, whoever owns it (a thread: in a
/// [`LockGuard`]; the acquisition itself: in an
/// [`OwnedLockGuard`](crate::OwnedLockGuard)), and its release: on drop
/// unless released already.
pub(crate) struct Held {
    shared: Arc<Shared>,
    hold: Arc<Hold>,
    /// Taken without a lease: renewed by the watchdog.
    watched: bool,
    /// A fenced lock's token for this acquisition.
    token: Option<u64>,
    done: bool,
    /// When it was acquired, if an event handler measures it.
    acquired_at: Option<Instant>,
}

impl Held {
    pub(crate) fn name(&self) -> &str {
        self.hold.name()
    }

    /// See [`LockGuard::is_lost`].
    pub(crate) fn is_lost(&self) -> bool {
        self.hold.is_lost() || Instant::now() >= self.hold.valid_until()
    }

    /// See [`LockGuard::ensure_held`].
    pub(crate) fn ensure_held(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::LockLost {
                name: self.hold.name().to_owned(),
            });
        }
        Ok(())
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    pub(crate) fn token(&self) -> Option<u64> {
        self.token
    }

    /// See [`LockGuard::unlock`].
    pub(crate) fn unlock(mut self) -> Result<()> {
        self.done = true;
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        match self.begin_release() {
            Release::Done(r) => r,
            Release::Send(mut step) => {
                // A full release of a reentrant lock (fenced or not) that
                // another thread of this client waits for hands it over
                // (engine/grants.rs).
                if step.request.left == 0
                    && !step.expired
                    && matches!(self.hold.kind, Kind::Plain | Kind::Fenced)
                {
                    step.request.grant = self.shared.grants.claim(self.hold.name());
                    // Handing nothing over, with nothing unsettled to
                    // mark and the hold's generation certain: no latch
                    // (release_full.lua).
                    if step.request.grant.is_none() && step.request.pending.is_empty() {
                        step.request.unlatched = self.hold.settled_gen();
                    }
                }
                let reply = self.send(&step.request);
                // At once: the waiter's wait is bounded by this round trip
                // alone, not by what follows (an event handler's code).
                if let Some(claim) = step.request.grant.take() {
                    let fenced = claim.offer().kind == Kind::Fenced;
                    claim.decide(grant_outcome(&reply, step.request.sent, fenced));
                }
                let reply = reply.map(|(r, synced)| (r.code, synced));
                self.end_release(step, reply)
            }
        }
    }

    /// The part of a release before its round trip: the guard's
    /// bookkeeping, and either the outcome (nothing to send) or the request
    /// to send. The guard is done from here on (dropping it sends nothing).
    pub(crate) fn begin_release(&mut self) -> Release {
        self.done = true;
        let hold = Arc::clone(&self.hold);
        let lost = || Error::LockLost {
            name: hold.name().to_owned(),
        };
        // Past its bound the hold may have been lost unnoticed: release what
        // may still be held, but do not report success.
        let expired = Instant::now() >= hold.valid_until();
        let (left, last_watched) = hold.guard_gone(self.watched);
        if last_watched {
            // The watchdog stops, and what is left (explicit-lease guards)
            // is bounded by its own lease again.
            self.shared.watchdog.unwatch(&hold);
        }
        if hold.is_lost() {
            if left == 0 {
                remove_hold(&hold);
            }
            // The hold was declared lost, but Redis may still hold it (the
            // renewals ran though their replies were lost): the first guard
            // to go releases whatever this owner may still hold, unless the
            // thread has taken the lock again since (that hold owns it now).
            if hold.take_lost_release() && is_latest(&hold) {
                let request = self.prepare_release(&hold, 0, 0);
                let reply = self.send_release(&request);
                match self.finish_release(request, reply) {
                    Ok(Some(_)) => log::info!(
                        "lock {:?} was found lost but was still held in redis; \
                         released it",
                        hold.name()
                    ),
                    Ok(None) => {}
                    Err(e) => log::debug!(
                        "releasing lost lock {:?} failed ({e}); it is completed in \
                         the background",
                        hold.name()
                    ),
                }
            }
            self.tell_released(false);
            return Release::Done(Err(lost()));
        }
        if left == 0 {
            // Before the script goes out: the watchdog never renews it again,
            // and a late renewal result cannot mark it lost.
            hold.set_released();
            remove_hold(&hold);
            let request = self.prepare_release(&hold, 0, 0);
            return Release::Send(ReleaseStep { request, expired });
        }
        // What the remaining holds need, no later than the hold's cap.
        let lease_ms = hold.capped_lease_ms(hold.needed_lease_ms(), Instant::now());
        let request = self.prepare_release(&hold, left, lease_ms);
        Release::Send(ReleaseStep { request, expired })
    }

    /// The part of a release after its round trip: what `reply` means.
    pub(crate) fn end_release(
        &self,
        step: ReleaseStep,
        reply: Result<(Option<i64>, Synced)>,
    ) -> Result<()> {
        let hold = &self.hold;
        let lost = || Error::LockLost {
            name: hold.name().to_owned(),
        };
        let partial = step.request.left > 0;
        let result = self.finish_release(step.request, reply);
        self.tell_released(matches!(result, Ok(Some(_))) && !step.expired);
        match result? {
            Some(_) if !step.expired => Ok(()),
            Some(_) => Err(lost()),
            None if !partial => Err(lost()),
            None => {
                // Gone on the server: the other guards of this owner are lost too.
                if hold.mark_lost() {
                    self.shared
                        .watchdog
                        .report_lost(hold, "its key or owner field is gone from redis");
                }
                remove_hold(hold);
                Err(lost())
            }
        }
    }

    /// The release's event, if a handler is set.
    fn tell_released(&self, ok: bool) {
        let events = &self.shared.events;
        events.released(
            self.hold.kind.label(),
            self.hold.name(),
            self.acquired_at,
            ok,
        );
    }

    /// A release leaving `left` holds (re-applying `lease_ms` if any
    /// remain), made ready to send; a partial release lowers the hold's
    /// bound to what it may set.
    fn prepare_release(&self, hold: &Arc<Hold>, left: u32, lease_ms: u64) -> ReleaseRequest {
        let shared = &self.shared;
        let n = shared.next_request();
        let pending = if hold.owned {
            Vec::new()
        } else {
            owner_state(hold.client_id, hold.slot()).1
        };
        let sent = Instant::now();
        if left > 0 {
            hold.begin(sent, lease_ms);
        }
        ReleaseRequest {
            n,
            latch: OnceCell::new(),
            pending,
            sent,
            left,
            lease_ms,
            grant: None,
            unlatched: None,
        }
    }

    /// The release script command of `r` (EVALSHA), for a round trip
    /// shared with other requests.
    pub(crate) fn release_command(&self, r: &ReleaseRequest) -> redis::Cmd {
        self.release_script(r, None, r.unlatched).command()
    }

    /// The release script's request for `r` (`token_key`: a fenced lock's,
    /// for a hand-off).
    fn release_script<'a>(
        &'a self,
        r: &'a ReleaseRequest,
        token_key: Option<&'a str>,
        unlatched: Option<u64>,
    ) -> scripts::Release<'a> {
        let shared = &self.shared;
        scripts::Release {
            lock: self.hold.lock_ref(),
            // A release without a latch names none (its name is made only if
            // its reply is lost).
            latch: if unlatched.is_some() {
                ""
            } else {
                r.latch(&self.hold)
            },
            unsettled: keys(&r.pending),
            left: r.left,
            lease_ms: r.lease_ms,
            latch_ms: shared.latch_ttl_ms,
            gen: r.n,
            unlatched,
            publish: shared.router.publish_command(),
            prefix: self.hold.prefix(),
            grant: r.grant.as_ref().map(|c| {
                let o = c.offer();
                scripts::Grant {
                    field: &o.field,
                    marker: &o.marker,
                    gen: o.n,
                    lease_ms: o.lease_ms,
                    leave: c.last().then_some(o.wake.as_str()),
                    token_key,
                }
            }),
        }
    }

    /// Sends `r` on its own (one round trip, routed): `None` when the
    /// owner's field was gone, else the script's code.
    pub(crate) fn send_release(&self, r: &ReleaseRequest) -> Result<(Option<i64>, Synced)> {
        self.send(r).map(|(reply, synced)| (reply.code, synced))
    }

    /// Sends `r` on its own (one round trip, routed): with the lock handed
    /// to a fenced lock's waiter (whatever kind the releaser's is: the two
    /// share the hash), the waiter's token comes back.
    fn send(&self, r: &ReleaseRequest) -> Result<(ReleaseReply, Synced)> {
        let hold = &self.hold;
        let token_key = r
            .grant
            .as_ref()
            .filter(|c| c.offer().kind == Kind::Fenced)
            .map(|_| scripts::token_name(hold.name()));
        let run = |unlatched: Option<u64>| {
            let script = self.release_script(r, token_key.as_deref(), unlatched);
            // The first try that failed on its connection (not a refusal
            // such as MOVED or READONLY): it may have reached Redis and run.
            let mut maybe_ran: Option<redis::RedisError> = None;
            // A release fewer replicas confirmed is still done on the
            // master: at worst a failover brings the lock back until its
            // lease runs out.
            let (reply, synced) = self.shared.router.run_synced(hold.name(), |conn| {
                let r = script.run(conn);
                if let Err(e) = &r {
                    if maybe_ran.is_none() && crate::error::is_io_failure(e) {
                        maybe_ran = Some(e.clone());
                    }
                }
                r
            })?;
            Ok::<_, Error>((reply, synced, maybe_ran))
        };
        let Some(gen) = r.unlatched else {
            return run(None).map(|(reply, synced, _)| (reply, synced));
        };
        match run(Some(gen))? {
            // Held with another generation than the hold recorded (nothing
            // was done): released as usual, with a latch.
            (ReleaseReply { code: Some(3), .. }, _, _) => {
                log::debug!(
                    "lock {:?}: the owner's field carries another generation than \
                     {gen}; releasing it with a latch",
                    hold.name()
                );
                run(None).map(|(reply, synced, _)| (reply, synced))
            }
            // Sent again after a try that failed on its connection, and the
            // hold was gone: either that try ran (its reply lost) or the hold
            // was gone before it (deleted, lost to a failover), and a release
            // without a latch leaves nothing to tell which. Neither "released"
            // nor "lost" would be sure: the caller gets that try's failure
            // (the hold is not held in its name either way).
            (ReleaseReply { code: None, .. }, _, Some(e)) => Err(Error::Redis(e)),
            (reply, synced, _) => Ok((reply, synced)),
        }
    }

    /// Records the outcome of release `r` on the hold. A release that did
    /// not complete for a passing reason (no reply, no connection, a refusal
    /// such as BUSY) is completed in the background as soon as Redis takes
    /// it.
    fn finish_release(
        &self,
        r: ReleaseRequest,
        reply: Result<(Option<i64>, Synced)>,
    ) -> Result<Option<i64>> {
        let shared = &self.shared;
        let hold = &self.hold;
        let partial = r.left > 0;
        match reply.map(|(reply, _)| reply) {
            Ok(reply) => {
                settle(hold.client_id, &r.pending);
                if partial {
                    match reply {
                        Some(_) => hold.confirmed(r.sent, r.lease_ms, r.n),
                        None => hold.aborted(),
                    }
                }
                Ok(reply)
            }
            Err(e) => {
                if e.needs_settle() {
                    // Not sent, or it may have run, or may run later, or
                    // Redis refused it for now: complete it in the background
                    // (the latch makes it run once).
                    let kind = Lost::Release {
                        left: r.left,
                        lease_ms: r.lease_ms,
                    };
                    let owner = partial.then_some(hold);
                    let latch = r.latch(hold).to_owned();
                    let request = Unsettled::new(hold.lock_ref(), latch, kind, owner, r.sent);
                    if hold.owned {
                        shared.settle_owned_later(request);
                    } else {
                        shared.settle_later(request);
                    }
                } else if partial {
                    hold.aborted();
                }
                Err(e)
            }
        }
    }
}

/// A release request made ready (see [`LockGuard::begin_release`]).
pub(crate) struct ReleaseRequest {
    n: u64,
    /// Its unlock latch's name, made when first needed: a release sent
    /// without a latch needs it only if its reply is lost.
    latch: OnceCell<String>,
    pending: Vec<Arc<Unsettled>>,
    sent: Instant,
    /// Holds left after it (0: a full release).
    left: u32,
    lease_ms: u64,
    /// The waiting thread of this client it may hand the lock to.
    grant: Option<Claim>,
    /// Sent without a latch: a full release that hands nothing over, of the
    /// hold with this generation (release_full.lua).
    unlatched: Option<u64>,
}

impl ReleaseRequest {
    /// Its unlock latch's name (of `hold`, the hold it releases).
    fn latch(&self, hold: &Hold) -> &str {
        self.latch
            .get_or_init(|| scripts::unlock_latch_name(hold.name(), hold.field(), self.n))
    }
}

/// What a release that may have handed the lock over did for its waiter:
/// granted only on Redis's word (and, with replica sync, the replicas'),
/// missed when the releaser held nothing any more, declined when Redis
/// released as usual or never got it (a release settled later wakes as
/// usual), unknown when it may have run. A fenced lock is granted only with
/// the waiter's token (a release run again after a lost reply answers
/// without it: unknown, then).
fn grant_outcome(reply: &Result<(ReleaseReply, Synced)>, sent: Instant, fenced: bool) -> Outcome {
    match reply {
        Ok((ReleaseReply { code: Some(2), .. }, Synced::No { .. })) => Outcome::Unknown { sent },
        Ok((
            ReleaseReply {
                code: Some(2),
                token,
            },
            _,
        )) if fenced && token.is_none() => Outcome::Unknown { sent },
        Ok((
            ReleaseReply {
                code: Some(2),
                token,
            },
            _,
        )) => Outcome::Granted {
            sent,
            token: *token,
        },
        // Not held any more (lease ran out, deleted): the lock may be free
        // and nobody was told.
        Ok((ReleaseReply { code: None, .. }, _)) => Outcome::Missed,
        Ok(_) => Outcome::Declined,
        Err(e) if e.maybe_applied() => Outcome::Unknown { sent },
        Err(_) => Outcome::Declined,
    }
}

/// A release under way: its request, and whether the hold's bound had
/// passed when it began.
pub(crate) struct ReleaseStep {
    pub(crate) request: ReleaseRequest,
    expired: bool,
}

/// What [`LockGuard::begin_release`] found.
pub(crate) enum Release {
    /// Nothing (more) to send: the outcome.
    Done(Result<()>),
    /// A request to send, then [`LockGuard::end_release`].
    Send(ReleaseStep),
}

lease_guard_by_inherent!(LockGuard);

impl Drop for Held {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.release() {
            // A lost lock (or permit) is told each time.
            warn_limited!(
                unless e.is_lock_lost(),
                "lock release on drop",
                "releasing lock {:?} on drop failed: {e}",
                self.hold.name()
            );
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.held.hold.name())
            .field("owner", &self.held.hold.field())
            .field("hold_count", &self.held.hold.count())
            .field("lost", &self.is_lost())
            .finish()
    }
}
