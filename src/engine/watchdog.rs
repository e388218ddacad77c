//! The renewal scheduler (`redlease-watchdog`): one thread per client keeps
//! every watched lock alive, whatever their number.
//!
//! Each watched hold has a *slot* in the schedule, which holds the
//! [`Hold`] (re-entries of one owner share it) with that lock's own interval
//! and lease, and a number that changes whenever the slot's terms change or
//! it is let go. The schedule is an ordered map from due times, rounded up
//! to the millisecond, to buckets of entries, each a slot and its number: an
//! entry whose number is no longer its slot's is skipped. The locks of one
//! batch come due together again, into one bucket: scheduling a renewal is a
//! push, not a map insertion. A release lets its slot go at once (the hold
//! with it), so released locks cost the thread nothing but a skipped entry.
//! A wake-up takes every bucket that is due, or due within a tenth of its
//! first entry's interval, and renews them all in one round trip: a
//! pipeline of multi-key renewal scripts of at most [`CHUNK`] locks each.
//!
//! Scheduling a renewal that succeeded again reads no hold: its entry goes
//! back into the schedule, and the hold's bound is raised when next read
//! (a renewal taken from a hold is *pending* until its batch is done; see
//! `hold::LeaseState`). With many locks the holds are not in the cache
//! between the two passes (Redis runs the batch in between), and reading
//! each once per renewal rather than twice took about a third off what a
//! renewal costs the client. A renewal that failed is taken back from its
//! hold before its batch is done.
//!
//! Each renewal carries the generation the owner last wrote (see
//! `hold::LeaseState`): Redis extends the lease only if its owner field still
//! carries it, so a renewal taken for an earlier state of a hold, or for an
//! earlier hold of the same owner, cannot extend a lease set since. A lock
//! the renewal script reports gone (key or owner field missing) is lost at
//! once; one whose generation changed is renewed again with the generation
//! found, once the hold's own requests are all settled. A renewal that fails
//! on the connection is retried every [`RETRY_DELAY`] (or its interval, if
//! shorter) until the hold's bound has passed; then the hold is lost.
//! Nothing is locked across the round trip.
//!
//! The same thread settles requests whose reply was lost, or that Redis
//! refused for a passing reason ([`Unsettled`]), retrying with a jittered
//! backoff from [`MIN_SETTLE_DELAY`] to [`MAX_SETTLE_DELAY`]. When the client
//! goes away, requests still unsettled are left to their lease, except those
//! that return semaphore permits (a plain semaphore's have none), which it
//! goes on settling for up to [`scripts::LATE_REQUEST_WINDOW_MS`].
//!
//! It also keeps the client's process key written (see `engine::process`):
//! each write runs on a short-lived `redlease-process` thread, one at a
//! time, so that a slow node of that key (its own, on a Cluster) never holds
//! up the renewals.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::engine::hold::{Hold, Progress, RenewToken};
use crate::engine::process::Announce;
use crate::engine::unsettled::Unsettled;
use crate::net::pool::{fan_out, Job, Synced};
use crate::net::router::{Group, Router};
use crate::scripts::{self, Kind};
use crate::time::{bound_us, deadline, far_future, jitter, warn_limited};

/// The shortest renewal interval the watchdog accepts. Renewing thousands of
/// locks more often than this would turn the watchdog into a load on Redis.
pub const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(50);

/// Locks per renewal script call; a pipeline carries as many calls as needed.
pub(crate) const CHUNK: usize = 1000;
/// Upper bound on the wait between retries of a failed renewal.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(250);
/// The first wait before trying again to settle a request.
pub(crate) const MIN_SETTLE_DELAY: Duration = Duration::from_millis(50);
/// The longest wait between tries to settle a request whose reply was lost:
/// what a release made during a failover may wait, once the new master is
/// there, before it is completed (one try per node per pass, so an outage
/// costs a try a second per node, not per request).
pub(crate) const MAX_SETTLE_DELAY: Duration = Duration::from_secs(1);

pub(crate) type LostCallback = Arc<dyn Fn(&str) + Send + Sync + 'static>;

/// A watched hold's place in the schedule.
struct Slot {
    /// Strong: a slot is let go as soon as its hold stops being watched
    /// (release, last watched guard dropped, loss), so it keeps no released
    /// hold alive, and taking it for a renewal is a move, not an upgrade.
    /// `None` while its renewal is under way (the renewal has it) and while
    /// the slot is free.
    hold: Option<Arc<Hold>>,
    interval: Duration,
    lease_ms: u64,
    /// Changed whenever the slot's terms change or it is let go: an entry
    /// or a renewal with another number is no longer the slot's.
    number: u32,
    /// Let go while its renewal was under way: freed when that renewal
    /// comes back.
    orphan: bool,
}

/// A scheduled renewal: a slot and the slot's number when it was scheduled.
type Entry = (u32, u32);

/// The watched holds' slots.
#[derive(Default)]
struct Slots {
    /// Indexed by an entry's slot.
    all: Vec<Slot>,
    /// Slots free for reuse.
    free: Vec<u32>,
    /// Holds with a slot (watched).
    len: usize,
}

struct State {
    /// Buckets of entries by due tick (milliseconds since `base`, rounded up).
    schedule: BTreeMap<u64, Vec<Entry>>,
    slots: Slots,
    base: Instant,
    /// The last batch taken (see [`Progress`]).
    batch: u32,
    /// Requests to settle, with the time of their next try and the number
    /// of tries so far.
    unsettled: Vec<(Instant, u32, Arc<Unsettled>)>,
    /// While the thread sleeps: when it wakes by itself (`None` while it
    /// works; it reads the schedule again before it sleeps). A new entry due
    /// earlier than this wakes it; any other lets it sleep.
    sleeping_until: Option<Instant>,
    /// The client's process key ([`Announce`]) and when it is written next
    /// (`None` until the client first holds something, and after the ACL
    /// refused it).
    announce: Option<(Instant, Arc<Announce>)>,
    started: bool,
    shutdown: bool,
    /// After shutdown: until when requests that return semaphore permits
    /// are still settled (see [`Inner::next_batch`]).
    linger_until: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct Counters {
    /// Wake-ups that renewed leases.
    pub(crate) batches: AtomicU64,
    pub(crate) round_trips: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) lost: AtomicU64,
    /// Requests handed to `settle_later` and not settled (nor given up) yet.
    pub(crate) unsettled: AtomicU64,
}

struct Inner {
    router: Arc<Router>,
    /// Taken when the client goes away: a thread that lingers (see
    /// [`State::linger`]) reports no hold, and keeps nothing of the
    /// caller's alive.
    on_lost: Mutex<Option<LostCallback>>,
    /// The causes of failed settles warned about (`<node>: <what failed>`),
    /// until a settle on that node succeeds.
    settle_warned: Mutex<Vec<String>>,
    state: Mutex<State>,
    wake: Condvar,
    counters: Counters,
    /// A renewal found that `PEXPIREAT` cannot be used (the ACL forbids it
    /// or `TIME`, or the server refuses `GT`): renewals ask for `PEXPIRE`
    /// from then on (see renew.lua).
    relative: AtomicBool,
    /// The batches done, which the holds read (see `hold::LeaseState`).
    progress: Arc<Progress>,
}

/// The client's handle on the scheduler; stops the thread on drop.
pub(crate) struct Watchdog {
    inner: Arc<Inner>,
}

struct Renewal {
    hold: Arc<Hold>,
    /// Its slot, and the slot's number when it was taken.
    slot: u32,
    number: u32,
    /// The hold's kind and owner key, copied: grouping a batch reads no hold.
    kind: Kind,
    owner: Option<(u64, bool)>,
    interval: Duration,
    lease_ms: u64,
    token: RenewToken,
    /// The key may carry a longer lease than this renewal's, which Redis
    /// must keep (`GT`; see [`Hold::take_due`]).
    keep_longer: bool,
    /// Held for its `max_hold`: not renewed any more, reported lost.
    capped: bool,
    /// The hold has a `max_hold` (`Hold::capped`), copied: scheduling it
    /// again reads the hold only then.
    has_cap: bool,
}

/// What the renewal script says of one lock.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Renewed,
    /// The key or the owner field is gone.
    Gone,
    /// The owner field carries another generation (`None`: none).
    Stale(Option<u64>),
}

impl Watchdog {
    pub(crate) fn new(router: Arc<Router>, on_lost: Option<LostCallback>) -> Watchdog {
        Watchdog {
            inner: Arc::new(Inner {
                router,
                on_lost: Mutex::new(on_lost),
                settle_warned: Mutex::new(Vec::new()),
                relative: AtomicBool::new(false),
                progress: Arc::new(Progress::default()),
                state: Mutex::new(State {
                    schedule: BTreeMap::new(),
                    slots: Slots::default(),
                    base: Instant::now(),
                    batch: 0,
                    unsettled: Vec::new(),
                    sleeping_until: None,
                    announce: None,
                    started: false,
                    shutdown: false,
                    linger_until: None,
                }),
                wake: Condvar::new(),
                counters: Counters::default(),
            }),
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Locks being renewed.
    pub(crate) fn scheduled(&self) -> usize {
        self.inner.state.lock().slots.len
    }

    /// Starts renewing `hold` every `interval` with `lease_ms`.
    ///
    /// # Errors
    ///
    /// Only if the watchdog thread cannot be spawned.
    pub(crate) fn watch(
        &self,
        hold: &Arc<Hold>,
        interval: Duration,
        lease_ms: u64,
    ) -> std::io::Result<()> {
        let progress = &self.inner.progress;
        self.schedule(|st| {
            let (due, every) = next_turn(hold, Instant::now() + interval, interval);
            let entry = match hold.watch_slot() {
                Some(slot) => {
                    // Scheduled already (its renewal may be under way): new
                    // terms, from now on; the entry or renewal with the old
                    // number is no longer the slot's.
                    st.slots.renew_terms(slot, every, lease_ms)
                }
                None => {
                    let entry = st.slots.occupy(Arc::clone(hold), every, lease_ms);
                    hold.set_watch_slot(entry.0, progress);
                    entry
                }
            };
            st.push(due, entry);
            st.sleeping_until.is_some_and(|t| due < t)
        })
    }

    /// Stops renewing `hold`. The caller has already released it or dropped
    /// its last watched guard, so a renewal in flight does not schedule it
    /// again (see `Hold::is_watched`).
    pub(crate) fn unwatch(&self, hold: &Hold) {
        let mut st = self.inner.state.lock();
        if let Some(slot) = hold.take_watch_slot() {
            let released = st.slots.release(slot);
            drop(st);
            drop(released);
        }
    }

    /// Reports a hold its owner found lost (and already marked lost) the way
    /// the watchdog reports the ones it finds.
    pub(crate) fn report_lost(&self, hold: &Hold, why: &str) {
        self.inner.report(hold, why);
    }

    /// Settles a request whose reply was lost, in the background, retrying
    /// until it has run once on Redis.
    pub(crate) fn settle_later(&self, request: Arc<Unsettled>) {
        self.inner
            .counters
            .unsettled
            .fetch_add(1, Ordering::Relaxed);
        let result = self.schedule(|st| {
            st.unsettled.push((Instant::now(), 0, Arc::clone(&request)));
            true
        });
        if let Err(e) = result {
            self.inner
                .counters
                .unsettled
                .fetch_sub(1, Ordering::Relaxed);
            warn_limited!(
                "watchdog thread",
                "cannot start the watchdog thread ({e}); a request on {:?} whose \
                 reply was lost is left to the lease",
                request.name
            );
        }
    }

    /// Writes the client's process key now and keeps it written (every
    /// third of its lease) while the client lives.
    pub(crate) fn announce(&self, announce: Announce) {
        let result = self.schedule(|st| {
            st.announce = Some((Instant::now(), Arc::new(announce)));
            true
        });
        if let Err(e) = result {
            log::warn!("cannot start the watchdog thread ({e}); the process key is not written");
        }
    }

    /// Changes the schedule under its lock (`change` says whether the thread
    /// must wake up early) and starts the thread on first use.
    fn schedule(&self, change: impl FnOnce(&mut State) -> bool) -> std::io::Result<()> {
        let spawn = {
            let mut st = self.inner.state.lock();
            if change(&mut st) {
                self.inner.wake.notify_one();
            }
            !std::mem::replace(&mut st.started, true)
        };
        if spawn {
            let inner = Arc::clone(&self.inner);
            let spawned = std::thread::Builder::new()
                .name("redlease-watchdog".into())
                .spawn(move || inner.run());
            if let Err(e) = spawned {
                self.inner.state.lock().started = false;
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropped here, not under the lock (it may own anything).
        let on_lost = self.inner.on_lost.lock().take();
        drop(on_lost);
        self.inner.state.lock().shutdown = true;
        self.inner.wake.notify_all();
    }
}

impl Slots {
    /// Gives `hold` a slot with these terms, and returns its entry; the
    /// caller records the slot in the hold.
    fn occupy(&mut self, hold: Arc<Hold>, interval: Duration, lease_ms: u64) -> Entry {
        self.len += 1;
        if let Some(slot) = self.free.pop() {
            let s = &mut self.all[slot as usize];
            s.hold = Some(hold);
            s.interval = interval;
            s.lease_ms = lease_ms;
            s.number = s.number.wrapping_add(1);
            return (slot, s.number);
        }
        // More than 2^32 watched holds would not fit in memory first.
        let slot = u32::try_from(self.all.len()).unwrap_or(u32::MAX);
        self.all.push(Slot {
            hold: Some(hold),
            interval,
            lease_ms,
            number: 0,
            orphan: false,
        });
        (slot, 0)
    }

    /// New terms for `slot` from now on, and its new entry: the entry or
    /// renewal with the old number is no longer the slot's.
    fn renew_terms(&mut self, slot: u32, interval: Duration, lease_ms: u64) -> Entry {
        let s = &mut self.all[slot as usize];
        s.number = s.number.wrapping_add(1);
        s.interval = interval;
        s.lease_ms = lease_ms;
        (slot, s.number)
    }

    /// The slot of `entry`, while the entry is its own.
    fn current(&mut self, (slot, number): Entry) -> Option<&mut Slot> {
        self.all
            .get_mut(slot as usize)
            .filter(|s| s.number == number)
    }

    /// Lets `slot` go (its hold is not watched any more; the caller records
    /// that in the hold): its entry is skipped from now on, and the slot is
    /// free, or freed when its renewal under way comes back. Returns the
    /// hold, for the caller to drop once the lock is let go.
    fn release(&mut self, slot: u32) -> Option<Arc<Hold>> {
        let s = &mut self.all[slot as usize];
        s.number = s.number.wrapping_add(1);
        self.len -= 1;
        match s.hold.take() {
            Some(hold) => {
                self.free.push(slot);
                Some(hold)
            }
            None => {
                s.orphan = true;
                None
            }
        }
    }

    /// Lets the slot of a renewal taken from it go, the renewal's hold
    /// with the caller (not watched any more; the caller records that in
    /// the hold).
    fn let_go(&mut self, slot: u32) {
        let s = &mut self.all[slot as usize];
        s.number = s.number.wrapping_add(1);
        self.free.push(slot);
        self.len -= 1;
    }

    /// A renewal of `hold` taken from the slot of `entry` is back: `Err`
    /// with the hold if the slot is still the renewal's (the caller
    /// schedules it again or lets it go), else `Ok` with the hold to drop
    /// if the slot was let go meanwhile (now free) or `None` if it was
    /// given new terms and an entry of its own (the hold is back in it).
    fn take_back(&mut self, entry: Entry, hold: Arc<Hold>) -> Result<Option<Arc<Hold>>, Arc<Hold>> {
        let Some(s) = self.all.get_mut(entry.0 as usize) else {
            return Ok(Some(hold));
        };
        if s.number == entry.1 {
            return Err(hold);
        }
        if s.orphan {
            s.orphan = false;
            self.free.push(entry.0);
            Ok(Some(hold))
        } else {
            s.hold = Some(hold);
            Ok(None)
        }
    }
}

impl State {
    /// After the client went away: whether the thread goes on. Nothing is
    /// renewed or announced any more, and requests whose lock or permit a
    /// lease brings back are left to it; requests that return semaphore
    /// permits (a plain semaphore's have no lease: left, they would be out
    /// for good) are still settled, until none is left or
    /// [`scripts::LATE_REQUEST_WINDOW_MS`] has passed. The process must
    /// keep running for that (see `ClientStats::unsettled_requests`).
    fn linger(&mut self) -> bool {
        self.schedule.clear();
        self.announce = None;
        self.unsettled.retain(|(_, _, u)| !u.expires());
        let now = Instant::now();
        let until = match self.linger_until {
            Some(until) => until,
            None => {
                let until = now + Duration::from_millis(scripts::LATE_REQUEST_WINDOW_MS);
                self.linger_until = Some(until);
                if !self.unsettled.is_empty() {
                    log::info!(
                        "client dropped with {} request(s) returning semaphore permits not \
                         answered yet: still tried in the background, for up to {} s",
                        self.unsettled.len(),
                        scripts::LATE_REQUEST_WINDOW_MS / 1000
                    );
                }
                until
            }
        };
        if self.unsettled.is_empty() {
            return false;
        }
        if now >= until {
            log::warn!(
                "gave up {} request(s) returning semaphore permits: Redis did not answer \
                 within {} s of the client being dropped; their permits stay out",
                self.unsettled.len(),
                scripts::LATE_REQUEST_WINDOW_MS / 1000
            );
            return false;
        }
        true
    }

    /// The tick of `at`: milliseconds since `base`, rounded up (renewing up
    /// to a millisecond late is nothing next to an interval of 50 ms or
    /// more, and it puts the locks acquired in one millisecond in one
    /// bucket).
    fn tick(&self, at: Instant) -> u64 {
        tick_of(self.base, at)
    }

    /// When tick `t` is due.
    fn due(&self, t: u64) -> Instant {
        due_at(self.base, t)
    }

    /// Schedules `entry` at `at`.
    fn push(&mut self, at: Instant, entry: Entry) {
        let t = self.tick(at);
        self.schedule.entry(t).or_default().push(entry);
    }
}

impl Inner {
    fn run(self: Arc<Self>) {
        // The pipelines' buffers, kept from one batch to the next.
        let mut buffers = Vec::new();
        while let Some((renewals, number, unsettled, announce)) = self.next_batch() {
            if let Some(announce) = announce {
                // On a thread of its own: a slow node of the process key
                // (its own, on a Cluster) must not hold the renewals up.
                // It schedules the next write when done (one at a time).
                let inner = Arc::clone(&self);
                let a = Arc::clone(&announce);
                let spawned = std::thread::Builder::new()
                    .name("redlease-process".into())
                    .spawn(move || inner.announce(a));
                if spawned.is_err() {
                    self.announce(announce);
                }
            }
            if !unsettled.is_empty() {
                self.settle(unsettled);
            }
            if !renewals.is_empty() {
                self.renew(renewals, number, &mut buffers);
                let mut st = self.state.lock();
                if st.slots.len == 0 {
                    // Nothing to renew any more: no buffer kept for it, and
                    // no slot. Every entry left is stale (no renewal is
                    // under way), so none can match a slot given out anew.
                    buffers = Vec::new();
                    st.slots = Slots::default();
                    st.schedule.clear();
                }
            }
        }
        log::debug!("stopped");
    }

    /// Sleeps until something is due; takes what is due (renewals within
    /// their slack). `None` on shutdown, once nothing is left to settle
    /// (see [`State::linger`]).
    #[allow(clippy::type_complexity)]
    fn next_batch(
        &self,
    ) -> Option<(
        Vec<Renewal>,
        u32,
        Vec<(u32, Arc<Unsettled>)>,
        Option<Arc<Announce>>,
    )> {
        let mut st = self.state.lock();
        loop {
            if st.shutdown && !st.linger() {
                return None;
            }
            let renewal = st.schedule.first_key_value().map(|(t, _)| st.due(*t));
            let settle = st.unsettled.iter().map(|(at, _, _)| *at).min();
            let announce = st.announce.as_ref().map(|(at, _)| *at);
            let next = [renewal, settle, announce, st.linger_until]
                .into_iter()
                .flatten()
                .min();
            match next {
                None => {
                    st.sleeping_until = Some(far_future(Instant::now()));
                    self.wake.wait(&mut st);
                }
                Some(at) if at > Instant::now() => {
                    st.sleeping_until = Some(at);
                    self.wake.wait_until(&mut st, at);
                }
                Some(_) => break,
            }
            st.sleeping_until = None;
        }
        let now = Instant::now();
        let announce = match &mut st.announce {
            Some((at, a)) if *at <= now => {
                // Scheduled again once written (or not, if refused).
                *at = far_future(now);
                Some(Arc::clone(a))
            }
            _ => None,
        };
        let mut unsettled = Vec::new();
        st.unsettled.retain(|(at, tries, u)| {
            if *at <= now {
                unsettled.push((*tries, Arc::clone(u)));
                false
            } else {
                true
            }
        });
        let mut batch = Vec::new();
        // What a renewal sent now extends a lease to, per lease (most share
        // one).
        let mut bound: Option<(u64, u64)> = None;
        // This batch's number (see `Progress`): never 0, which a hold
        // reads as none.
        let number = match st.batch.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        let State {
            schedule,
            slots,
            base,
            ..
        } = &mut *st;
        while let Some(first) = schedule.first_entry() {
            let t = *first.key();
            // The first entry that is still its slot's gives the slack.
            let slack = first
                .get()
                .iter()
                .find_map(|&e| slots.current(e).map(|s| s.interval / 10))
                .unwrap_or(Duration::ZERO);
            if due_at(*base, t) > now + slack {
                break;
            }
            let bucket = first.remove();
            batch.reserve(bucket.len());
            for block in bucket.chunks(TOUCH) {
                touch(
                    block.iter().filter_map(|&(slot, n)| {
                        slots
                            .all
                            .get(slot as usize)
                            .filter(|s| s.number == n)
                            .and_then(|s| s.hold.as_ref())
                    }),
                    false,
                );
                for &(slot, n) in block {
                    let Some(s) = slots.current((slot, n)) else {
                        // Let go or given new terms since it was scheduled.
                        continue;
                    };
                    let Some(hold) = s.hold.take() else {
                        continue;
                    };
                    // A capped hold is renewed up to its cap, no further, and
                    // not at all once the cap has come (within its own slack:
                    // none for an entry due at its cap). The cap is read only
                    // for a hold that has one: it sits past the cache lines
                    // every renewal reads.
                    let (lease_ms, capped) = if hold.capped {
                        (
                            hold.capped_lease_ms(s.lease_ms, now),
                            hold.cap.is_some_and(|cap| cap <= now + s.interval / 10),
                        )
                    } else {
                        (s.lease_ms, false)
                    };
                    let until = match bound {
                        Some((ms, until)) if ms == lease_ms => until,
                        _ => {
                            let until = bound_us(deadline(now, lease_ms));
                            bound = Some((lease_ms, until));
                            until
                        }
                    };
                    match hold.take_due(lease_ms, number, until, !capped) {
                        Some((token, keep_longer)) => batch.push(Renewal {
                            // A write hold shares its hash with its owner's
                            // read holds, whose leases it must keep: always
                            // `GT` (a read hold's renewal never shortens
                            // either way).
                            keep_longer: keep_longer || hold.kind.is_rw(),
                            kind: hold.kind,
                            owner: hold.owner,
                            has_cap: hold.capped,
                            lease_ms,
                            interval: s.interval,
                            slot,
                            number: n,
                            hold,
                            token,
                            capped,
                        }),
                        // Not watched any more (the hold says so now).
                        None => slots.let_go(slot),
                    }
                }
            }
        }
        st.batch = number;
        Some((batch, number, unsettled, announce))
    }

    /// Writes the process key (one round trip, tried once: it is written
    /// again at its next turn) and schedules the next write: a third of its
    /// lease later, a second at most after a failure, never once the ACL has
    /// refused it (warned once).
    fn announce(&self, a: Arc<Announce>) {
        let result = self.router.run_within(&a.key, Duration::ZERO, |conn| {
            let mut pipe = redis::pipe();
            let hset = pipe.cmd("HSET").arg(&a.key);
            for (field, value) in &a.fields {
                hset.arg(*field).arg(value);
            }
            hset.ignore();
            pipe.cmd("PEXPIRE").arg(&a.key).arg(a.lease_ms).ignore();
            pipe.query::<()>(conn)
        });
        let next = match result {
            Ok(()) => Some(Instant::now() + a.every()),
            Err(e) if matches!(&e, crate::error::Error::Redis(r) if r.code() == Some("NOPERM")) => {
                log::warn!(
                    "the ACL forbids writing this client's process key {:?} ({e}); lock \
                     holders will be listed without their host, process id and name: \
                     allow the key pattern `redlease_client:*` (HSET, PEXPIRE) to publish them",
                    a.key
                );
                None
            }
            Err(e) => {
                warn_limited!(
                    "process key",
                    "cannot write this client's process key {:?}: {e}",
                    a.key
                );
                Some(Instant::now() + a.every().min(Duration::from_secs(1)))
            }
        };
        let mut st = self.state.lock();
        st.announce = next.map(|at| (at, a));
        // Written on a thread of its own: the watchdog may sleep past it.
        self.wake.notify_one();
    }

    /// Settles each request not settled meanwhile by its owner (what that
    /// takes is the request's own: [`Unsettled::run`]). A copy of the
    /// request may still be on its way, so this is retried (backing off to
    /// [`MAX_SETTLE_DELAY`]) until it has run once; from then on the request's
    /// key makes a late copy a no-op.
    ///
    /// After a failure that other requests to the same node would meet too
    /// (no connection, a busy or refusing server) the rest of the pass on
    /// that node is deferred untried: one stalled server must not hold the
    /// thread (and the renewals behind it) for a response timeout per
    /// request.
    fn settle(&self, requests: Vec<(u32, Arc<Unsettled>)>) {
        let taken = requests.len();
        let mut again = Vec::new();
        // Nodes a settle failed on in this pass (by name).
        let mut failed: Vec<String> = Vec::new();
        for (tries, u) in requests {
            if u.is_done() {
                continue;
            }
            let window = Duration::from_millis(scripts::LATE_REQUEST_WINDOW_MS);
            if u.sent.elapsed() >= window && u.expires() {
                // No copy of it can arrive any more, and its lease is long gone.
                log::warn!(
                    "gave up settling a request on {:?} after {window:?}",
                    u.name
                );
                u.set_done();
                continue;
            }
            let backoff = jitter(
                MIN_SETTLE_DELAY
                    .saturating_mul(1 << tries.min(8))
                    .min(MAX_SETTLE_DELAY),
                0.25,
            );
            let node = self.router.node(&u.name).map(|n| n.name.clone()).ok();
            if node.as_ref().is_some_and(|n| failed.contains(n)) {
                again.push((Instant::now() + backoff, tries, u));
                continue;
            }
            let hold = u.active_hold();
            let epoch = hold.as_ref().map(|h| h.epoch());
            let n = self.router.next_request();
            let publish = self.router.publish_command();
            let sent = Instant::now();
            // One try: the thread tries again on its own schedule, and other
            // settles and the renewals wait behind this one.
            let result = self
                .router
                .run_synced_within(&u.name, Duration::ZERO, |conn| u.run(conn, n, publish));
            // Replica sync is best effort here: the request ran on the master.
            let result = result.map(|(applied, _)| applied);
            match result {
                Ok(applied) => {
                    if let Some(node) = &node {
                        let prefix = format!("{node}: ");
                        // This node answers again: its causes, and "no node",
                        // may be warned about again.
                        self.settle_warned
                            .lock()
                            .retain(|c| !c.starts_with(&prefix) && !c.starts_with("no node: "));
                    }
                    if let Some((h, why)) = u.ran(applied, hold.as_ref(), epoch, sent, n) {
                        self.lose(h, why);
                    }
                    u.set_done();
                    if applied == 1 {
                        log::info!("{} of {:?} whose reply was lost", u.what(), u.name);
                    }
                }
                Err(e) if !e.needs_settle() => {
                    // Redis ran it and answered with an error that will not
                    // pass (e.g. the key is no longer a lock): nothing of
                    // ours is left to settle.
                    log::warn!(
                        "settling a request on {:?} failed for good ({e}); giving up",
                        u.name
                    );
                    u.set_done();
                }
                Err(e) => {
                    // Warned once per cause (a node and what failed there)
                    // until a settle on that node succeeds again: an outage
                    // with many requests pending is one line.
                    let cause = format!("{}: {}", node.as_deref().unwrap_or("no node"), cause(&e));
                    let first = {
                        let mut warned = self.settle_warned.lock();
                        let first = !warned.contains(&cause);
                        if first {
                            warned.push(cause);
                        }
                        first
                    };
                    if first {
                        log::warn!(
                            "settling a request on {:?} failed ({e}); retrying until \
                             redis takes it (requests pending: see ClientStats::\
                             unsettled_requests)",
                            u.name
                        );
                    } else {
                        log::debug!("settling a request on {:?} failed ({e})", u.name);
                    }
                    failed.extend(node);
                    again.push((Instant::now() + backoff, tries.saturating_add(1), u));
                }
            }
        }
        // Each request taken is settled (or given up) or tried again later.
        self.counters
            .unsettled
            .fetch_sub((taken - again.len()) as u64, Ordering::Relaxed);
        if !again.is_empty() {
            self.state.lock().unsettled.extend(again);
        }
    }

    /// Renews `batch`, batch number `number` (see [`Progress`]), and
    /// schedules its locks again.
    fn renew(&self, mut batch: Vec<Renewal>, number: u32, buffers: &mut Vec<Vec<u8>>) {
        if batch.iter().any(|r| r.capped) {
            let capped;
            (capped, batch) = batch.into_iter().partition(|r| r.capped);
            self.stop_capped(capped);
            if batch.is_empty() {
                self.progress.finish(number);
                return;
            }
        }
        let sent = Instant::now();
        let outcomes = self.renew_all(&batch, buffers);
        let now = Instant::now();
        let retry = |r: &Renewal| {
            let delay = match r.interval {
                Duration::ZERO => RETRY_DELAY,
                interval => RETRY_DELAY.min(interval),
            };
            next_turn(&r.hold, now + delay, delay).0
        };
        let renewed = outcomes
            .iter()
            .filter(|o| matches!(o, Some(Outcome::Renewed)))
            .count();
        let size = batch.len();
        log::debug!("renewed {renewed} of {size} leases");
        self.counters
            .renewals
            .fetch_add(renewed as u64, Ordering::Relaxed);
        // One pass over the renewals: each goes back into the schedule, and
        // only one that failed reads its hold (to take it back, see
        // `Hold::not_renewed`, and to find whether it is lost): a renewal
        // that succeeded raises its hold's bound once the batch is done
        // (`Progress`). The schedule's lock is let go every so often, so that
        // a large batch does not hold up acquisitions. Renewals of one
        // interval share their next turn, due tick and bucket: each is
        // computed (or looked up) once per run.
        let mut lost = Vec::new();
        // Holds let go meanwhile, dropped once the lock is let go.
        let mut gone = Vec::new();
        let mut st = self.state.lock();
        let mut renewals = batch.into_iter();
        let mut outcomes = outcomes.into_iter();
        let mut tick: Option<(Instant, u64)> = None;
        let mut turn: Option<(Duration, Instant)> = None;
        let mut reserved = false;
        // Renewals taken out of `renewals` so far.
        let mut placed = 0usize;
        while renewals.len() > 0 {
            if placed > 0 {
                MutexGuard::bump(&mut st);
            }
            let State {
                schedule,
                slots,
                base,
                ..
            } = &mut *st;
            let mut bucket: Option<(u64, &mut Vec<Entry>)> = None;
            for (r, outcome) in renewals.by_ref().take(1024).zip(outcomes.by_ref()) {
                placed += 1;
                let renewed = matches!(outcome, Some(Outcome::Renewed));
                let at = if renewed && r.token.epoch.is_none() {
                    // Taken while a lease-setting request was under way: it
                    // raises no bound, so the next renewal comes soon (once
                    // the request is settled, it raises the bound). One
                    // that such a request overlapped during the round trip
                    // is not known here without reading its hold: the
                    // request's own outcome sets the bound then.
                    Some(retry(&r))
                } else if renewed {
                    match r.interval {
                        // An entry due at its cap (no interval) stays due then.
                        Duration::ZERO => Some(r.hold.cap.unwrap_or(sent + RETRY_DELAY)),
                        interval => Some(match turn {
                            Some((every, at)) if every == interval => at,
                            _ => {
                                let at = sent + interval;
                                turn = Some((interval, at));
                                at
                            }
                        }),
                    }
                } else {
                    r.hold.not_renewed();
                    match outcome {
                        // A generation that reads as the one sent but is
                        // not it (a shape this kind never writes), or none
                        // that parses: not ours to adopt; renewing again
                        // at once would only find it again.
                        Some(Outcome::Stale(gen)) if gen == r.token.gen => {
                            lost.push((
                                Arc::clone(&r.hold),
                                "its owner field carries a generation this client did not write",
                            ));
                            None
                        }
                        Some(Outcome::Stale(gen)) if r.hold.adopt(r.token, gen) => Some(now),
                        Some(Outcome::Stale(_)) => Some(retry(&r)),
                        Some(Outcome::Gone) => {
                            lost.push((
                                Arc::clone(&r.hold),
                                "its key or owner field is gone from redis",
                            ));
                            None
                        }
                        // Not renewed (no answer, an error, too few
                        // replicas): the bound stays where it was; retried
                        // soon, lost once it has passed.
                        None if now >= r.hold.valid_until() => {
                            lost.push((
                                Arc::clone(&r.hold),
                                "it could not be renewed before its lease ran out",
                            ));
                            None
                        }
                        None | Some(Outcome::Renewed) => Some(retry(&r)),
                    }
                };
                // Let go during the round trip, or given new terms (and an
                // entry of its own): nothing to schedule.
                let hold = match slots.take_back((r.slot, r.number), r.hold) {
                    Ok(let_go) => {
                        gone.extend(let_go);
                        continue;
                    }
                    Err(hold) => hold,
                };
                // A hold released without being let go (found at its next
                // turn if it renewed) is not scheduled again after a failure.
                let next = match at {
                    Some(at) if r.has_cap && (renewed || hold.is_watched()) => {
                        Some(next_turn(&hold, at, r.interval))
                    }
                    Some(at) if renewed || hold.is_watched() => Some((at, r.interval)),
                    _ => None,
                };
                let Some((at, interval)) = next else {
                    // Lost, or not watched any more: its slot is let go.
                    hold.take_watch_slot();
                    slots.let_go(r.slot);
                    gone.push(hold);
                    continue;
                };
                let slot = &mut slots.all[r.slot as usize];
                slot.interval = interval;
                slot.hold = Some(hold);
                let t = match tick {
                    Some((a, t)) if a == at => t,
                    _ => {
                        let t = tick_of(*base, at);
                        tick = Some((at, t));
                        t
                    }
                };
                let entries = match bucket.take() {
                    Some((bt, entries)) if bt == t => entries,
                    _ => schedule.entry(t).or_default(),
                };
                if !reserved && entries.len() >= TOUCH && entries.len() == entries.capacity() {
                    // Usually most of a batch goes to one bucket (one
                    // interval): the first bucket to fill up with some
                    // entries gets room for the rest of the batch at once,
                    // rather than copies at every doubling. Not one that a
                    // few renewals go to (retries, another interval), and
                    // once a batch, so that many intervals cannot each
                    // take as much.
                    entries.reserve(size - placed + 1);
                    reserved = true;
                }
                entries.push((r.slot, r.number));
                bucket = Some((t, entries));
            }
        }
        drop(st);
        // Every renewal of the batch that failed was taken back above.
        self.progress.finish(number);
        drop(gone);
        let events = &self.router.counters().events;
        if events.is_on() {
            events.renewal_batch(size, now - sent, lost.len());
        }
        for (hold, why) in lost {
            self.lose(&hold, why);
        }
    }

    /// Holds that were held for their `max_hold`: renewed no more (their
    /// lease, which no renewal took past the cap, runs out) and reported
    /// lost. Their renewals were taken without a bound to raise.
    fn stop_capped(&self, capped: Vec<Renewal>) {
        let mut lost = Vec::with_capacity(capped.len());
        {
            let mut st = self.state.lock();
            for r in capped {
                let hold = Arc::clone(&r.hold);
                match st.slots.take_back((r.slot, r.number), r.hold) {
                    // Let go meanwhile, or given new terms (its new entry
                    // finds it lost).
                    Ok(_) => {}
                    Err(hold) => {
                        hold.take_watch_slot();
                        st.slots.let_go(r.slot);
                    }
                }
                lost.push(hold);
            }
        }
        for hold in lost {
            self.lose(
                &hold,
                "it was held for its max_hold, so the watchdog renewed it no more",
            );
        }
    }

    fn lose(&self, hold: &Hold, why: &str) {
        if hold.mark_lost() {
            self.report(hold, why);
        }
    }

    /// Counts, logs and calls back a hold that was just marked lost.
    fn report(&self, hold: &Hold, why: &str) {
        self.counters.lost.fetch_add(1, Ordering::Relaxed);
        log::error!("lock {:?} was lost: {why}", hold.name());
        self.router
            .counters()
            .events
            .lost(hold.kind.label(), hold.name());
        let cb = self.on_lost.lock().clone();
        if let Some(cb) = cb {
            if catch_unwind(AssertUnwindSafe(|| cb(hold.name()))).is_err() {
                log::error!("the on_lock_lost callback panicked");
            }
        }
        hold.tell_lost();
    }
}

impl Inner {
    /// Renews `batch`: the locks grouped per node, and per slot within a
    /// node ([`Router::group`]), one pipeline of renewal scripts per node,
    /// all nodes at once ([`fan_out`]): one round trip per node however many
    /// slots. A script Redis did not run where it was sent (its script cache
    /// was lost, its slot moved or is moving, the node is busy) is run once
    /// more on its own through the router, which follows the redirection.
    /// `None` for a lock whose renewal failed. The pipelines are encoded
    /// into `buffers` (those of earlier batches), which get them back.
    fn renew_all(&self, batch: &[Renewal], buffers: &mut Vec<Vec<u8>>) -> Vec<Option<Outcome>> {
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        let mut outcomes: Vec<Option<Outcome>> = batch.iter().map(|_| None).collect();
        let mut groups = self
            .router
            .group(batch.iter().map(|r| r.hold.name()), CHUNK);
        // Each chunk's sections, per group.
        let arranged: Vec<Vec<Vec<Section>>> = groups
            .iter_mut()
            .map(|g| g.chunks.iter_mut().map(|c| arrange(batch, c)).collect())
            .collect();
        let jobs: Vec<Job<'_>> = groups
            .iter()
            .zip(&arranged)
            .map(|(g, sections)| {
                // A buffer of an earlier batch (its pages already mapped),
                // with the whole pipeline's room: grown chunk by chunk, it
                // would be copied again at every doubling. One far larger
                // than needed (after many locks were released) is let go.
                let room: usize = g.chunks.iter().map(|c| packed_room(c.len(), 1)).sum();
                let mut packed = buffers.pop().unwrap_or_default();
                if packed.capacity() > 4 * room.max(1 << 16) {
                    packed = Vec::new();
                }
                packed.clear();
                packed.reserve(room);
                for (chunk, sections) in g.chunks.iter().zip(sections) {
                    pack_renewal(&mut packed, batch, chunk, sections, self.flags(false));
                }
                Job {
                    redis: &g.node.redis,
                    packed,
                    count: g.chunks.len(),
                }
            })
            .collect();
        self.counters
            .round_trips
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        let results = fan_out(&jobs);
        // This batch's buffers are kept, not those of nodes it did not
        // renew on.
        buffers.clear();
        buffers.extend(jobs.into_iter().map(|j| j.packed));
        // Once a renewal run again on its own fails, the others wait for
        // the next try (soon): one bad node must not cost this thread a
        // response timeout per redirected chunk.
        let mut retry_failed = false;
        for (group, result) in groups.iter().zip(results) {
            let replies = match result {
                Ok((_, Synced::No { wanted, acked })) => {
                    // Renewals too few replicas confirmed count as failed.
                    warn_limited!(
                        &format!("renewals unsynced on {}", group.node.name),
                        "renewals of {} leases not confirmed by replicas \
                         ({acked} of {wanted} acknowledged); retrying",
                        group.chunks.iter().map(Vec::len).sum::<usize>()
                    );
                    continue;
                }
                Ok((replies, _)) if replies.len() == group.chunks.len() => replies,
                Ok(_) => {
                    warn_limited!(
                        "renewal reply length",
                        "renewal reply has the wrong length; retrying"
                    );
                    continue;
                }
                Err(e) => {
                    if e.is_connection_error() {
                        self.router.node_failed();
                    }
                    warn_limited!(
                        &format!("renewals failed on {}", group.node.name),
                        "renewing {} leases on {} failed: {e}; retrying",
                        group.chunks.iter().map(Vec::len).sum::<usize>(),
                        group.node.name
                    );
                    continue;
                }
            };
            let mut replies = replies;
            self.load_and_renew(group, batch, &mut replies);
            for (chunk, reply) in group.chunks.iter().zip(replies) {
                let reply = match reply {
                    redis::Value::ServerError(e)
                        if matches!(e.code(), "ASK" | "TRYAGAIN") && chunk.len() > 1 =>
                    {
                        // The slot is migrating: a script on several keys
                        // fails while they are split between the nodes, one
                        // on a single key follows it. One by one, then.
                        for &i in chunk {
                            if retry_failed {
                                break;
                            }
                            match self.renew_again(batch, &[i], false) {
                                Some(v) => match self.parse(v, 1) {
                                    Ok(mut one) => outcomes[i] = one.pop(),
                                    Err(e) => warn_limited!("renewal reply", "{e}; retrying"),
                                },
                                None => retry_failed = true,
                            }
                        }
                        continue;
                    }
                    redis::Value::ServerError(e)
                        if (scripts::not_run_there(e.code())
                            || wrong_type(e.code(), e.details()))
                            && !retry_failed =>
                    {
                        // A key of the chunk is no longer a hash (someone
                        // overwrote it): run again reading the owner fields
                        // with pcall, so that it fails alone.
                        let careful = wrong_type(e.code(), e.details());
                        match self.renew_again(batch, chunk, careful) {
                            Some(v) => v,
                            None => {
                                retry_failed = true;
                                continue;
                            }
                        }
                    }
                    redis::Value::ServerError(e) => {
                        warn_limited!(
                            &format!("renewals refused: {}", e.code()),
                            "renewing {} leases failed: {}; retrying",
                            chunk.len(),
                            redis::RedisError::from(e)
                        );
                        continue;
                    }
                    v => v,
                };
                match self.parse(reply, chunk.len()) {
                    Ok(list) => {
                        for (i, o) in chunk.iter().zip(list) {
                            outcomes[*i] = Some(o);
                        }
                    }
                    Err(e) => warn_limited!("renewal reply", "{e}; retrying"),
                }
            }
        }
        outcomes
    }

    /// The chunks of `group` that found the renewal script missing from the
    /// node's cache (a restart, a new node) run again in one pipeline whose
    /// first call carries the script's source; their replies replace the
    /// NOSCRIPT errors.
    fn load_and_renew(&self, group: &Group, batch: &[Renewal], replies: &mut [redis::Value]) {
        let missing: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, redis::Value::ServerError(e) if e.code() == "NOSCRIPT"))
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for (k, &i) in missing.iter().enumerate() {
            pipe.add_command(renew_command(
                batch,
                &group.chunks[i],
                k == 0,
                self.flags(false),
            ));
        }
        let packed = pipe.get_packed_pipeline();
        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let result = group.node.redis.run_synced(|conn| {
            conn.send_all(&packed)?;
            conn.receive_all(missing.len())
        });
        match result {
            Ok((values, Synced::Yes | Synced::NotNeeded)) if values.len() == missing.len() => {
                for (i, v) in missing.into_iter().zip(values) {
                    replies[i] = v;
                }
            }
            Ok(_) => warn_limited!(
                &format!("renewals after load on {}", group.node.name),
                "renewals after loading the script failed"
            ),
            Err(e) => warn_limited!(
                &format!("renewals after load on {}", group.node.name),
                "renewals after loading the script on {} failed: {e}",
                group.node.name
            ),
        }
    }

    /// One chunk of renewals run again on its own, through the router
    /// (`careful`: reading the owner fields with pcall).
    fn renew_again(
        &self,
        batch: &[Renewal],
        chunk: &[usize],
        careful: bool,
    ) -> Option<redis::Value> {
        let key = &batch[*chunk.first()?].hold.name();
        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let result = self.router.run_synced_within(key, Duration::ZERO, |conn| {
            let mut run = |careful| {
                let flags = self.flags(careful);
                match renew_command(batch, chunk, false, flags).query(conn) {
                    Err(e) if scripts::is_noscript(&e) => {
                        renew_command(batch, chunk, true, flags).query(conn)
                    }
                    other => other,
                }
            };
            match run(careful) {
                Err(e) if !careful && wrong_type(e.code().unwrap_or(""), e.detail()) => run(true),
                other => other,
            }
        });
        match result {
            Ok((v, Synced::Yes | Synced::NotNeeded)) => Some(v),
            Ok((_, Synced::No { .. })) => None,
            Err(e) => {
                warn_limited!(
                    "renewal run again",
                    "renewing {} leases failed: {e}; retrying",
                    chunk.len()
                );
                None
            }
        }
    }

    /// The renewal script's flags: `careful`, and `PEXPIRE` once found
    /// needed.
    fn flags(&self, careful: bool) -> Flags {
        Flags {
            careful,
            relative: self.relative.load(Ordering::Relaxed),
        }
    }

    /// [`parse_renewal`], taking note when the script says that
    /// `PEXPIREAT` cannot be used here.
    fn parse(&self, reply: redis::Value, n: usize) -> redis::RedisResult<Vec<Outcome>> {
        let (outcomes, relative) = parse_renewal(reply, n)?;
        if relative && !self.relative.swap(true, Ordering::Relaxed) {
            log::info!(
                "renewals use PEXPIRE: the ACL forbids TIME or PEXPIREAT, or the server \
                 refuses PEXPIREAT's GT (older than 7.0)"
            );
        }
        Ok(outcomes)
    }
}

/// The renewal script's first argument (see renew.lua).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Flags {
    /// Owner fields read with pcall (a key of the chunk is not a hash).
    careful: bool,
    /// Leases extended with `PEXPIRE`, without reading Redis's clock.
    relative: bool,
}

impl Flags {
    fn arg(self) -> &'static [u8] {
        match (self.careful, self.relative) {
            (false, false) => b"0",
            (true, false) => b"1",
            (false, true) => b"2",
            (true, true) => b"3",
        }
    }
}

/// [`State::due`] of tick `t` for a schedule that began at `base`.
fn due_at(base: Instant, t: u64) -> Instant {
    base.checked_add(Duration::from_millis(t))
        .unwrap_or_else(|| far_future(base))
}

/// [`State::tick`] of `at` for a schedule that began at `base`.
fn tick_of(base: Instant, at: Instant) -> u64 {
    let ns = at.saturating_duration_since(base).as_nanos();
    u64::try_from(ns.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// When `hold`'s next renewal is due if its turn is `at`, and the interval
/// its entry keeps: a hold capped before then is due at its cap, where it
/// stops, with no interval (so no slack: it is taken once the cap has
/// come, see `next_batch`).
fn next_turn(hold: &Hold, at: Instant, interval: Duration) -> (Instant, Duration) {
    if !hold.capped {
        return (at, interval);
    }
    match hold.cap {
        Some(cap) if cap <= at => (cap, Duration::ZERO),
        _ => (at, interval),
    }
}

/// What failed, for grouping settle failures by cause: no connection, the
/// connection failing, or what Redis answered.
fn cause(e: &crate::error::Error) -> &'static str {
    use crate::error::Error;
    match e {
        Error::Pool(_) => "no connection",
        Error::Redis(r) if r.is_timeout() => "no reply in time",
        Error::Redis(r) if r.is_io_error() || r.is_connection_dropped() => "connection failed",
        Error::Redis(r) => r.code().map_or("refused", |code| match code {
            "READONLY" | "MASTERDOWN" | "LOADING" | "CLUSTERDOWN" | "TRYAGAIN" => "servers moving",
            "BUSY" => "busy",
            "NOPERM" | "NOAUTH" => "not allowed",
            "OOM" => "out of memory",
            _ => "refused",
        }),
        _ => "other",
    }
}

/// Holds read ahead at a time by [`touch`]: the run's misses overlap, and
/// each run waits for its slowest once. 32 rather than 16: 6 % less client
/// CPU per renewal at 100,000 locks (six interleaved rounds, one binary);
/// 64 measured as 32.
const TOUCH: usize = 32;

/// Reads a word of each cache line of a hold that taking it for a renewal
/// and scheduling it again use ([`Hold::warm`]; or, with `names`, the first
/// byte of its framed name, which is what encoding reads of it) without
/// using it, a block at a time before the block is worked on: with many
/// locks the holds are not in the cache, and their misses then overlap
/// instead of coming one after another. (Reading the first line alone left
/// a hold's other lines to miss one at a time, after each lock's atomic
/// operation.)
fn touch<'a>(holds: impl Iterator<Item = &'a Arc<Hold>>, names: bool) {
    let mut x = 0usize;
    for h in holds {
        x ^= if names {
            usize::from(h.framed_name().first().copied().unwrap_or(0))
        } else {
            Arc::strong_count(h) ^ h.warm()
        };
    }
    std::hint::black_box(x);
}

/// A renewal script call failed because a key of it is not a hash (Redis
/// 7 passes the command's error on; older servers wrap it in `ERR`).
fn wrong_type(code: &str, details: Option<&str>) -> bool {
    code == "WRONGTYPE" || details.is_some_and(|d| d.contains("WRONGTYPE"))
}

/// The owner prefix of an owner field (`<client-uuid>:`), and the rest.
fn split_owner(field: &str) -> (&str, &str) {
    field.split_at(field.find(':').map_or(0, |i| i + 1))
}

/// Whether two renewals can share a section of the renewal script: same
/// lease, same script mode, `GT` or not alike, same owner prefix (the
/// client's, for every field of the usual shape: see `Hold::owner`).
fn same_terms(a: &Renewal, b: &Renewal) -> bool {
    a.lease_ms == b.lease_ms
        && (a.kind == Kind::Read) == (b.kind == Kind::Read)
        && a.keep_longer == b.keep_longer
        && (a.owner.is_some() && b.owner.is_some()
            || split_owner(a.hold.field()).0 == split_owner(b.hold.field()).0)
}

/// Whether two renewals are for one owner field.
fn same_field(a: &Renewal, b: &Renewal) -> bool {
    match (a.owner, b.owner) {
        (Some(x), Some(y)) => x == y,
        _ => a.hold.field() == b.hold.field(),
    }
}

/// Orders a chunk so that renewals sharing a section of the renewal script
/// are next to each other (read holds last, then by lease, `GT` and owner):
/// a batch of one owner's locks is one section with one argument per lock.
/// The schedule hands them over mostly in that order already, and the sort
/// keeps the runs it finds. Only numbers are compared: no field is read.
fn sort_chunk(batch: &[Renewal], chunk: &mut [usize]) {
    let key = |&i: &usize| {
        let r = &batch[i];
        (r.kind == Kind::Read, r.lease_ms, r.keep_longer, r.owner)
    };
    // Usually in order already (one owner's locks of one lease): a check
    // costs less than a sort that finds it so.
    if !chunk.is_sorted_by_key(key) {
        chunk.sort_by_key(key);
    }
}

/// One section of a renewal script call: `chunk[start..end]`, in `mode`
/// (see renew.lua), its locks' leases extended with `GT` if `keep_longer`
/// (see [`Hold::take_due`]).
#[derive(Debug, PartialEq, Eq)]
struct Section {
    start: usize,
    end: usize,
    mode: Mode,
    keep_longer: bool,
}

/// A section's mode (see renew.lua).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `f`: locks of one owner field (the field once, a generation per lock).
    Field,
    /// `e`: locks of one owner prefix, each with its own field.
    Each,
    /// `r`: read holds.
    Read,
}

impl Mode {
    /// As renew.lua reads it: upper case for a section whose leases cannot
    /// be shorter than those their keys carry (no `GT`).
    fn arg(self, keep_longer: bool) -> &'static [u8] {
        match (self, keep_longer) {
            (Mode::Field, true) => b"f",
            (Mode::Field, false) => b"F",
            (Mode::Each, true) => b"e",
            (Mode::Each, false) => b"E",
            (Mode::Read, _) => b"r",
        }
    }

    /// The arguments each lock of such a section has.
    fn per_lock(self) -> usize {
        match self {
            Mode::Field => 1,
            Mode::Each => 2,
            Mode::Read => 3,
        }
    }
}

/// Orders `chunk` ([`sort_chunk`]) and gives its [`sections`]. The usual
/// chunk, one section, is found so in one pass, with no sort.
fn arrange(batch: &[Renewal], chunk: &mut [usize]) -> Vec<Section> {
    if let Some(one) = one_section(batch, chunk) {
        return vec![one];
    }
    sort_chunk(batch, chunk);
    sections_by_runs(batch, chunk)
}

/// The sections of `chunk`, in its order: a read hold's section (`r`), a run
/// of locks of one owner field (`f`: the field once, a generation per lock),
/// or locks of one owner prefix that each have their own field (`e`).
fn sections(batch: &[Renewal], chunk: &[usize]) -> Vec<Section> {
    match one_section(batch, chunk) {
        Some(one) => vec![one],
        None => sections_by_runs(batch, chunk),
    }
}

/// The usual chunk: locks of one owner field and one lease, no read hold:
/// one section, found in one pass (what [`sections_by_runs`] makes of it
/// too).
fn one_section(batch: &[Renewal], chunk: &[usize]) -> Option<Section> {
    if let [first, rest @ ..] = chunk {
        let f = &batch[*first];
        let one = |r: &Renewal| {
            r.owner == f.owner
                && r.lease_ms == f.lease_ms
                && r.keep_longer == f.keep_longer
                && r.kind != Kind::Read
        };
        if f.owner.is_some() && !rest.is_empty() && one(f) && rest.iter().all(|&i| one(&batch[i])) {
            return Some(Section {
                start: 0,
                end: chunk.len(),
                mode: Mode::Field,
                keep_longer: f.keep_longer,
            });
        }
    }
    None
}

/// [`sections`] of any chunk.
fn sections_by_runs(batch: &[Renewal], chunk: &[usize]) -> Vec<Section> {
    let mut out = Vec::new();
    let mut s = 0;
    while s < chunk.len() {
        let first = &batch[chunk[s]];
        let mut e = s + 1;
        while e < chunk.len() && same_terms(first, &batch[chunk[e]]) {
            e += 1;
        }
        let keep_longer = first.keep_longer;
        if first.kind == Kind::Read {
            out.push(Section {
                start: s,
                end: e,
                mode: Mode::Read,
                keep_longer,
            });
            s = e;
            continue;
        }
        let mut singles: Option<usize> = None;
        let mut r = s;
        while r < e {
            let mut q = r + 1;
            while q < e && same_field(&batch[chunk[r]], &batch[chunk[q]]) {
                q += 1;
            }
            if q - r >= 2 {
                if let Some(from) = singles.take() {
                    out.push(Section {
                        start: from,
                        end: r,
                        mode: Mode::Each,
                        keep_longer,
                    });
                }
                out.push(Section {
                    start: r,
                    end: q,
                    mode: Mode::Field,
                    keep_longer,
                });
            } else {
                singles.get_or_insert(r);
            }
            r = q;
        }
        if let Some(from) = singles {
            out.push(Section {
                start: from,
                end: e,
                mode: Mode::Each,
                keep_longer,
            });
        }
        s = e;
    }
    out
}

/// The rest of a renewal's owner field after `<client-uuid>:`, written from
/// its owner key when it has one (without reading the field).
struct RestArg<'a>(&'a Renewal);

impl redis::ToRedisArgs for RestArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self.0.owner {
            Some((id, false)) => id.write_redis_args(out),
            Some((id, true)) => out.write_arg_fmt(format_args!("{id}:write")),
            None => out.write_arg(split_owner(self.0.hold.field()).1.as_bytes()),
        }
    }
}

/// A renewal's generation as the kind's scripts write it: `g<id>` when the
/// flag says the read-write lock's (see rw_lib.lua), else the id; empty when
/// unknown (matches nothing).
struct GenArg(bool, Option<u64>);

impl redis::ToRedisArgs for GenArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match *self {
            GenArg(_, None) => out.write_arg(b""),
            GenArg(true, Some(gen)) => out.write_arg_fmt(format_args!("g{gen}")),
            GenArg(false, Some(gen)) => gen.write_redis_args(out),
        }
    }
}

/// Where a renewal script call is written: a `redis::Cmd`, or a
/// pipeline's bytes ([`Packed`]), which writes the two arguments every lock
/// has in fewer steps.
trait RenewalWrite: redis::RedisWrite {
    /// The lock's key.
    fn write_key(&mut self, hold: &Hold) {
        self.write_arg(hold.name().as_bytes());
    }

    /// A generation written as a number (not the read-write lock's).
    fn write_gen(&mut self, gen: u64) {
        use redis::ToRedisArgs;
        gen.write_redis_args(self);
    }
}

impl RenewalWrite for redis::Cmd {}

/// The renewal script call for the locks at `chunk` (indices into `batch`),
/// with `flags`. For a chunk run on its own (a redirection, a reload, a key
/// that is not a hash); a batch's pipeline is encoded by [`pack_renewal`].
fn renew_command(batch: &[Renewal], chunk: &[usize], eval: bool, flags: Flags) -> redis::Cmd {
    let sections = sections(batch, chunk);
    let size = packed_room(chunk.len(), sections.len());
    let fill = |cmd: &mut redis::Cmd| write_renewal(cmd, batch, chunk, &sections, flags);
    if eval {
        scripts::RENEW.eval(chunk.len(), size, fill)
    } else {
        scripts::RENEW.evalsha(chunk.len(), size, fill)
    }
}

/// The room a renewal script call for `locks` locks in `sections` sections
/// needs, about: an estimate (names of some 50 bytes), as measuring each
/// would read every hold once more.
fn packed_room(locks: usize, sections: usize) -> usize {
    locks * 80 + sections * 64 + 96
}

/// Appends the renewal script call for the locks at `chunk` (EVALSHA, with
/// `flags`) to a pipeline's bytes, encoded as Redis reads it (RESP): the
/// same call as [`renew_command`]'s, with every argument copied once, not
/// twice (into a `redis::Cmd`, then into the pipeline).
fn pack_renewal(
    out: &mut Vec<u8>,
    batch: &[Renewal],
    chunk: &[usize],
    sections: &[Section],
    flags: Flags,
) {
    use redis::{RedisWrite, ToRedisArgs};
    // EVALSHA, the SHA, the key count, the keys, the flags, the sections.
    let args = 4
        + chunk.len()
        + sections
            .iter()
            .map(|s| 4 + (s.end - s.start) * s.mode.per_lock())
            .sum::<usize>();
    out.reserve(packed_room(chunk.len(), sections.len()));
    out.push(b'*');
    push_number(out, args as u64);
    out.extend_from_slice(b"\r\n");
    let mut packed = Packed {
        out,
        scratch: Vec::new(),
    };
    packed.write_arg(b"EVALSHA");
    packed.write_arg(scripts::RENEW.sha().as_bytes());
    chunk.len().write_redis_args(&mut packed);
    write_renewal(&mut packed, batch, chunk, sections, flags);
}

/// The keys and arguments of a renewal script call (see renew.lua).
fn write_renewal<W: RenewalWrite>(
    w: &mut W,
    batch: &[Renewal],
    chunk: &[usize],
    sections: &[Section],
    flags: Flags,
) {
    use redis::ToRedisArgs;
    for block in chunk.chunks(TOUCH) {
        touch(block.iter().map(|&i| &batch[i].hold), true);
        for &i in block {
            w.write_key(&batch[i].hold);
        }
    }
    w.write_arg(flags.arg());
    for sec in sections {
        let first = &batch[chunk[sec.start]];
        let (prefix, _) = split_owner(first.hold.field());
        first.lease_ms.write_redis_args(w);
        (sec.end - sec.start).write_redis_args(w);
        w.write_arg(sec.mode.arg(sec.keep_longer));
        w.write_arg(if sec.mode == Mode::Field {
            first.hold.field().as_bytes()
        } else {
            prefix.as_bytes()
        });
        for &i in &chunk[sec.start..sec.end] {
            let r = &batch[i];
            if sec.mode != Mode::Field {
                RestArg(r).write_redis_args(w);
            }
            match (r.kind.is_rw(), r.token.gen) {
                (false, Some(gen)) => w.write_gen(gen),
                (rw, gen) => GenArg(rw, gen).write_redis_args(w),
            }
            if sec.mode == Mode::Read {
                w.write_arg(r.hold.prefix().as_bytes());
            }
        }
    }
}

/// Writes arguments as RESP bulk strings (`$<len>\r\n<bytes>\r\n`) onto a
/// pipeline's bytes.
struct Packed<'a> {
    out: &'a mut Vec<u8>,
    /// An argument written through `write_arg_fmt` or `writer_for_next_arg`
    /// before its length is known.
    scratch: Vec<u8>,
}

impl redis::RedisWrite for Packed<'_> {
    fn write_arg(&mut self, arg: &[u8]) {
        // One capacity check for the whole argument (a length has at most
        // 20 digits).
        self.out.reserve(arg.len() + 25);
        self.out.push(b'$');
        push_number(self.out, arg.len() as u64);
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(arg);
        self.out.extend_from_slice(b"\r\n");
    }

    fn write_arg_fmt(&mut self, arg: impl std::fmt::Display) {
        use std::io::Write;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let _ = write!(scratch, "{arg}");
        self.write_arg(&scratch);
        self.scratch = scratch;
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        self.scratch.clear();
        NextArg { packed: self }
    }
}

impl RenewalWrite for Packed<'_> {
    /// One copy: the hold keeps its name framed.
    fn write_key(&mut self, hold: &Hold) {
        self.out.extend_from_slice(hold.framed_name());
    }

    /// The frame and the digits in one copy.
    fn write_gen(&mut self, gen: u64) {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(gen).as_bytes();
        // `$`, at most 2 digits of length, CRLF, at most 20 digits, CRLF.
        let mut arg = [0u8; 27];
        arg[0] = b'$';
        let mut n = 1;
        if digits.len() >= 10 {
            arg[n] = b'0' + (digits.len() / 10) as u8;
            n += 1;
        }
        arg[n] = b'0' + (digits.len() % 10) as u8;
        arg[n + 1] = b'\r';
        arg[n + 2] = b'\n';
        n += 3;
        arg[n..n + digits.len()].copy_from_slice(digits);
        n += digits.len();
        arg[n] = b'\r';
        arg[n + 1] = b'\n';
        // The whole array and back: a copy of a known size is a few moves,
        // one of a length known only here a call of memcpy.
        let len = self.out.len() + n + 2;
        self.out.extend_from_slice(&arg);
        self.out.truncate(len);
    }
}

/// [`Packed::writer_for_next_arg`]: the argument is written out when done.
struct NextArg<'a, 'b> {
    packed: &'a mut Packed<'b>,
}

impl std::io::Write for NextArg<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.packed.scratch.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for NextArg<'_, '_> {
    fn drop(&mut self) {
        let scratch = std::mem::take(&mut self.packed.scratch);
        redis::RedisWrite::write_arg(self.packed, &scratch);
        self.packed.scratch = scratch;
    }
}

/// Appends `n` in decimal. The short cases are worth their lines: itoa
/// alone for every length cost about 120 more instructions per renewal
/// (`bench_compare.sh ... watchdog-instructions`: 825 against 948).
fn push_number(out: &mut Vec<u8>, n: u64) {
    match n {
        // Most lengths: a name, a generation's digits.
        0..=9 => out.push(b'0' + n as u8),
        10..=99 => out.extend_from_slice(&[b'0' + (n / 10) as u8, b'0' + (n % 10) as u8]),
        _ => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
    }
}

/// What the renewal script says of each of its `n` locks, and whether it
/// says that `PEXPIREAT` cannot be used on its server.
fn parse_renewal(reply: redis::Value, n: usize) -> redis::RedisResult<(Vec<Outcome>, bool)> {
    let redis::Value::Array(pairs) = reply else {
        return Err(bad_reply("renewal reply is not a list"));
    };
    let mut outcomes: Vec<Outcome> = (0..n).map(|_| Outcome::Renewed).collect();
    let mut relative = false;
    for pair in pairs.chunks(2) {
        let [redis::Value::Int(i), code] = pair else {
            return Err(bad_reply("renewal reply is not a list of pairs"));
        };
        if *i == 0 {
            // Not a lock: PEXPIREAT cannot be used here.
            relative = true;
            continue;
        }
        // 1-based position within the chunk.
        let Some(slot) = usize::try_from(*i)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| outcomes.get_mut(i))
        else {
            return Err(bad_reply("renewal reply names a lock not in the batch"));
        };
        *slot = match code {
            redis::Value::Int(_) => Outcome::Gone,
            redis::Value::BulkString(gen) => Outcome::Stale(
                std::str::from_utf8(gen)
                    .ok()
                    .map(|g| g.strip_prefix('g').unwrap_or(g))
                    .and_then(|g| g.parse().ok()),
            ),
            _ => return Err(bad_reply("renewal reply has an unknown code")),
        };
    }
    Ok((outcomes, relative))
}

fn bad_reply(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Parse, what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::LockRef;

    #[test]
    fn the_scripts_note_is_not_a_lock() {
        use redis::Value::{Array, BulkString, Int};
        let reply = Array(vec![
            Int(2),
            Int(0),
            Int(0),
            BulkString(b"pexpire".to_vec()),
        ]);
        let (outcomes, relative) = parse_renewal(reply, 2).unwrap();
        assert_eq!(outcomes, vec![Outcome::Renewed, Outcome::Gone]);
        assert!(relative, "the note says PEXPIREAT cannot be used");
        let (outcomes, relative) = parse_renewal(Array(vec![]), 1).unwrap();
        assert_eq!(outcomes, vec![Outcome::Renewed]);
        assert!(!relative);
    }

    #[test]
    fn one_owners_chunk_is_one_section_either_way() {
        let u = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a";
        let one: Vec<Renewal> = (0..5)
            .map(|i| {
                renewal(
                    &format!("k{i}"),
                    &format!("{u}:3"),
                    Kind::Plain,
                    30_000,
                    Some(i),
                )
            })
            .collect();
        let chunk: Vec<usize> = (0..one.len()).collect();
        assert_eq!(
            sections(&one, &chunk),
            vec![Section {
                start: 0,
                end: 5,
                mode: Mode::Field,
                keep_longer: false,
            }]
        );
        assert_eq!(sections(&one, &chunk), sections_by_runs(&one, &chunk));
        // A lone lock, another lease, a read hold, another owner: the
        // general case.
        let mut odd = vec![renewal(
            "x",
            &format!("{u}:3"),
            Kind::Plain,
            30_000,
            Some(1),
        )];
        assert_eq!(sections(&odd, &[0]), sections_by_runs(&odd, &[0]));
        for (field, kind, lease) in [
            (format!("{u}:3"), Kind::Plain, 9_000),
            (format!("{u}:3"), Kind::Read, 30_000),
            (format!("{u}:4"), Kind::Plain, 30_000),
        ] {
            odd.truncate(1);
            odd.push(renewal("y", &field, kind, lease, Some(2)));
            assert_eq!(sections(&odd, &[0, 1]), sections_by_runs(&odd, &[0, 1]));
            assert!(
                sections(&odd, &[0, 1])
                    .iter()
                    .all(|s| s.mode != Mode::Field),
                "{kind:?} {lease}"
            );
        }
    }

    /// A renewal; one with an odd lease (or of the read-write lock) keeps a
    /// longer lease (`GT`).
    fn renewal(name: &str, field: &str, kind: Kind, lease_ms: u64, gen: Option<u64>) -> Renewal {
        let hold = Arc::new(Hold::new(
            1,
            LockRef {
                name,
                channel: "chan",
                field,
                kind,
            },
            Instant::now(),
            lease_ms,
            7,
            None,
            false,
        ));
        Renewal {
            kind,
            owner: hold.owner,
            hold,
            interval: Duration::from_secs(1),
            lease_ms,
            token: RenewToken { epoch: None, gen },
            keep_longer: kind.is_rw() || lease_ms % 2 == 1,
            capped: false,
            has_cap: false,
            slot: 0,
            number: 0,
        }
    }

    /// A batch's pipeline carries, byte for byte, the calls `renew_command`
    /// builds through `redis::Cmd`: every section mode, read holds, the
    /// write lock's field, a generation not known, names with odd bytes.
    #[test]
    fn packed_renewals_are_the_commands_byte_for_byte() {
        let u = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a";
        let long = "n".repeat(150);
        let mut batch = vec![
            renewal(&long, &format!("{u}:5"), Kind::Plain, 30_000, Some(100)),
            renewal("a", &format!("{u}:1"), Kind::Plain, 30_000, Some(11)),
            renewal("b", &format!("{u}:1"), Kind::Plain, 30_000, Some(12)),
            renewal("c\r\n$", &format!("{u}:2"), Kind::Fenced, 30_000, None),
            renewal("d", &format!("{u}:3:write"), Kind::Write, 30_000, Some(1)),
            renewal("e", &format!("{u}:4"), Kind::Read, 9_000, Some(123_456_789)),
            renewal("f", "someone-else:9", Kind::Plain, 5, Some(u64::MAX)),
            renewal("", &format!("{u}:1"), Kind::Plain, 30_000, Some(0)),
            renewal("g", &format!("{u}:6"), Kind::Plain, 30_001, Some(1)),
            renewal("h", &format!("{u}:6"), Kind::Plain, 30_001, Some(2)),
        ];
        // Enough locks for a call of more than 99 arguments, so that every
        // width of number is written.
        for i in 0..40 {
            let field = format!("{u}:{}", 10 + i % 3);
            batch.push(renewal(
                &format!("k{i}"),
                &field,
                Kind::Plain,
                30_000,
                Some(i),
            ));
        }
        let mut chunk: Vec<usize> = (0..batch.len()).collect();
        let arranged = arrange(&batch, &mut chunk);
        assert_eq!(arranged, sections(&batch, &chunk));
        let modes: String = arranged
            .iter()
            .map(|s| String::from_utf8_lossy(s.mode.arg(s.keep_longer)).into_owned())
            .collect();
        assert!(
            "fFeEr".chars().all(|m| modes.contains(m)),
            "every section mode: {modes}"
        );
        for relative in [false, true] {
            let flags = Flags {
                careful: false,
                relative,
            };
            let mut packed = Vec::new();
            pack_renewal(&mut packed, &batch, &chunk, &arranged, flags);
            let one = arrange(&batch, &mut chunk[..1]);
            pack_renewal(&mut packed, &batch, &chunk[..1], &one, flags);
            let mut expected = renew_command(&batch, &chunk, false, flags).get_packed_command();
            expected.extend(renew_command(&batch, &chunk[..1], false, flags).get_packed_command());
            assert_eq!(
                String::from_utf8_lossy(&packed),
                String::from_utf8_lossy(&expected)
            );
        }
    }
}
