//! The renewal scheduler (`redlease-watchdog`): one thread per client keeps
//! every watched lock alive, whatever their number.
//!
//! The schedule is an ordered map by due time; each entry points (weakly) at
//! the [`Hold`] it renews, which re-entries of one owner share, and carries
//! that lock's own interval and lease. A release removes its entry at once (a
//! map operation), so released locks cost the thread nothing. A wake-up takes
//! every entry that is due, plus those due within a tenth of their interval,
//! and renews them all in one round trip: a pipeline of multi-key renewal
//! scripts of at most [`CHUNK`] locks each.
//!
//! A lock the renewal script reports gone (key or owner field missing) is
//! lost at once. A renewal that fails on the connection is retried every
//! [`RETRY_DELAY`] (or its interval, if shorter) until the last confirmed
//! renewal plus the lease has passed; then the hold is lost. Nothing is
//! locked across the round trip.
//!
//! The same thread settles requests whose reply was lost ([`Unsettled`]).
//! When the client goes away, requests still unsettled are left to their
//! lease.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::connection::Redis;
use crate::guard::{Hold, Lost, Unsettled};
use crate::scripts;

/// Locks per renewal script call; a pipeline carries as many calls as needed.
pub(crate) const CHUNK: usize = 1000;
/// Upper bound on the wait between retries of a failed renewal.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(250);
/// The longest wait between tries to settle a request whose reply was lost.
pub(crate) const MAX_SETTLE_DELAY: Duration = Duration::from_secs(2);

pub(crate) type LostCallback = Arc<dyn Fn(&str) + Send + Sync + 'static>;

/// A scheduled renewal; keyed in the schedule by (due time, sequence).
struct Entry {
    interval: Duration,
    lease_ms: u64,
    hold: Weak<Hold>,
}

type Key = (Instant, u64);

struct State {
    schedule: BTreeMap<Key, Entry>,
    /// Requests to settle, with the time of their next try and the number
    /// of tries so far.
    unsettled: Vec<(Instant, u32, Arc<Unsettled>)>,
    /// While the thread sleeps: when it wakes by itself (`None` while it
    /// works; it reads the schedule again before it sleeps). A new entry due
    /// earlier than this wakes it; any other lets it sleep.
    sleeping_until: Option<Instant>,
    seq: u64,
    started: bool,
    shutdown: bool,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) round_trips: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) lost: AtomicU64,
}

struct Inner {
    redis: Arc<Redis>,
    on_lost: Option<LostCallback>,
    state: Mutex<State>,
    wake: Condvar,
    counters: Counters,
}

/// The client's handle on the scheduler; stops the thread on drop.
pub(crate) struct Watchdog {
    inner: Arc<Inner>,
}

struct Renewal {
    hold: Arc<Hold>,
    interval: Duration,
    lease_ms: u64,
}

impl Watchdog {
    pub(crate) fn new(redis: Arc<Redis>, on_lost: Option<LostCallback>) -> Watchdog {
        Watchdog {
            inner: Arc::new(Inner {
                redis,
                on_lost,
                state: Mutex::new(State {
                    schedule: BTreeMap::new(),
                    unsettled: Vec::new(),
                    sleeping_until: None,
                    seq: 0,
                    started: false,
                    shutdown: false,
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
        self.inner.state.lock().schedule.len()
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
        self.schedule(|st| {
            let due = Instant::now() + interval;
            st.insert(due, hold, interval, lease_ms);
            st.sleeping_until.is_some_and(|t| due < t)
        })
    }

    /// Stops renewing `hold`. The caller has already released it or dropped
    /// its last watched guard, so a renewal in flight does not schedule it
    /// again (see `Hold::is_watched`).
    pub(crate) fn unwatch(&self, hold: &Hold) {
        let mut st = self.inner.state.lock();
        if let Some(key) = hold.take_schedule_key() {
            st.schedule.remove(&key);
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
        let result = self.schedule(|st| {
            st.unsettled.push((Instant::now(), 0, Arc::clone(&request)));
            true
        });
        if let Err(e) = result {
            log::warn!(
                "redlease: cannot start the watchdog thread ({e}); a request on {:?} whose \
                 reply was lost is left to the lease",
                request.name
            );
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
        self.inner.state.lock().shutdown = true;
        self.inner.wake.notify_all();
    }
}

impl State {
    fn insert(&mut self, at: Instant, hold: &Arc<Hold>, interval: Duration, lease_ms: u64) {
        self.seq += 1;
        let key = (at, self.seq);
        hold.set_schedule_key(Some(key));
        self.schedule.insert(
            key,
            Entry {
                interval,
                lease_ms,
                hold: Arc::downgrade(hold),
            },
        );
    }
}

impl Inner {
    fn run(self: Arc<Self>) {
        while let Some((renewals, unsettled)) = self.next_batch() {
            if !unsettled.is_empty() {
                self.settle(unsettled);
            }
            if !renewals.is_empty() {
                self.renew(renewals);
            }
        }
        log::debug!("redlease-watchdog: stopped");
    }

    /// Sleeps until something is due; takes what is due (renewals within
    /// their slack). `None` on shutdown.
    #[allow(clippy::type_complexity)]
    fn next_batch(&self) -> Option<(Vec<Renewal>, Vec<(u32, Arc<Unsettled>)>)> {
        let mut st = self.state.lock();
        loop {
            if st.shutdown {
                return None;
            }
            let renewal = st.schedule.first_key_value().map(|(k, _)| k.0);
            let settle = st.unsettled.iter().map(|(at, _, _)| *at).min();
            let next = match (renewal, settle) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match next {
                None => {
                    st.sleeping_until = Some(far_future());
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
        while let Some(entry) = st.schedule.first_entry() {
            if entry.key().0 > now + entry.get().interval / 10 {
                break;
            }
            let e = entry.remove();
            if let Some(hold) = e.hold.upgrade().filter(|h| h.is_watched()) {
                hold.set_schedule_key(None);
                batch.push(Renewal {
                    hold,
                    interval: e.interval,
                    lease_ms: e.lease_ms,
                });
            }
        }
        Some((batch, unsettled))
    }

    /// Settles each request not settled meanwhile by its owner: undoes a
    /// lost acquisition, completes a lost release. A copy of the request may
    /// still be on its way, so this is retried (backing off to
    /// [`MAX_SETTLE_DELAY`]) until it has run once; from then on the request's
    /// key makes a late copy a no-op.
    ///
    /// After a connection failure the rest of the pass is deferred untried:
    /// one stalled server must not hold the thread (and the renewals behind
    /// it) for a response timeout per request.
    fn settle(&self, requests: Vec<(u32, Arc<Unsettled>)>) {
        let mut again = Vec::new();
        let mut failed = false;
        for (tries, u) in requests {
            if u.is_done() {
                continue;
            }
            let backoff = RETRY_DELAY
                .saturating_mul(1 << tries.min(6))
                .min(MAX_SETTLE_DELAY);
            if failed {
                again.push((Instant::now() + backoff, tries, u));
                continue;
            }
            let result = self.redis.run(|conn| match u.kind {
                Lost::Acquire { held, lease_ms } => {
                    scripts::cancel_acquire(conn, u.lock_ref(), &u.key, held, lease_ms)
                }
                // A release runs with the window as its latch TTL: a copy of
                // it may still arrive.
                Lost::Release { left, lease_ms } => scripts::release(
                    conn,
                    u.lock_ref(),
                    &u.key,
                    &[],
                    left,
                    lease_ms,
                    scripts::LATE_REQUEST_WINDOW_MS,
                )
                .map(|r| r.unwrap_or(0)),
            });
            match result {
                Ok(applied) => {
                    u.set_done();
                    let what = match u.kind {
                        Lost::Acquire { .. } => "undid an acquisition",
                        Lost::Release { .. } => "completed a release",
                    };
                    if applied == 1 {
                        log::info!("redlease: {what} of {:?} whose reply was lost", u.name);
                    }
                }
                Err(e) => {
                    if tries == 0 {
                        log::warn!(
                            "redlease: settling a request on {:?} whose reply was lost failed \
                             ({e}); retrying until redis answers",
                            u.name
                        );
                    }
                    failed = e.is_connection_error();
                    again.push((Instant::now() + backoff, tries.saturating_add(1), u));
                }
            }
        }
        if !again.is_empty() {
            self.state.lock().unsettled.extend(again);
        }
    }

    fn renew(&self, batch: Vec<Renewal>) {
        let sent = Instant::now();
        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let result = self.redis.run(|conn| renew_batch(conn, &batch));
        let mut again = Vec::with_capacity(batch.len());
        match result {
            Ok(flags) => {
                let renewed = flags.iter().filter(|f| **f).count();
                log::debug!(
                    "redlease-watchdog: renewed {renewed} of {} leases",
                    batch.len()
                );
                self.counters
                    .renewals
                    .fetch_add(renewed as u64, Ordering::Relaxed);
                for (r, renewed) in batch.into_iter().zip(flags) {
                    if renewed {
                        r.hold.confirm(sent, r.lease_ms);
                        again.push((sent + r.interval, r));
                    } else {
                        self.lose(&r.hold, "its key or owner field is gone from redis");
                    }
                }
            }
            Err(e) => {
                let now = Instant::now();
                log::warn!(
                    "redlease-watchdog: renewing {} leases failed: {e}; retrying",
                    batch.len()
                );
                for r in batch {
                    if now >= r.hold.valid_until() {
                        self.lose(&r.hold, "it could not be renewed before its lease ran out");
                    } else {
                        let retry = RETRY_DELAY.min(r.interval);
                        again.push((now + retry, r));
                    }
                }
            }
        }
        if again.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        for (at, r) in again {
            // Checked under the lock that `unwatch` takes: a hold released
            // during the round trip is not scheduled again.
            if r.hold.is_watched() {
                st.insert(at, &r.hold, r.interval, r.lease_ms);
            }
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
        log::error!("redlease: lock {:?} was lost: {why}", hold.name);
        if let Some(cb) = &self.on_lost {
            if catch_unwind(AssertUnwindSafe(|| cb(&hold.name))).is_err() {
                log::error!("redlease: the on_lock_lost callback panicked");
            }
        }
    }
}

fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// One round trip: a pipeline of renewal scripts, [`CHUNK`] locks each.
/// Grouping by connection target (Redis Cluster node / slot) goes in front of
/// this function; it renews what it is given on one connection.
fn renew_batch(conn: &mut redis::Connection, batch: &[Renewal]) -> redis::RedisResult<Vec<bool>> {
    let build = |eval: bool| {
        let mut pipe = redis::pipe();
        for chunk in batch.chunks(CHUNK) {
            let size = chunk
                .iter()
                .map(|r| r.hold.name.len() + r.hold.field.len() + 24)
                .sum();
            let fill = |cmd: &mut redis::Cmd| {
                for r in chunk {
                    cmd.arg(&r.hold.name);
                }
                for r in chunk {
                    cmd.arg(&r.hold.field).arg(r.lease_ms);
                }
            };
            pipe.add_command(if eval {
                scripts::RENEW.eval(chunk.len(), size, fill)
            } else {
                scripts::RENEW.evalsha(chunk.len(), size, fill)
            });
        }
        pipe
    };
    let replies: Vec<Vec<usize>> = match build(false).query(conn) {
        Err(e) if scripts::is_noscript(&e) => build(true).query(conn)?,
        other => other?,
    };
    if replies.len() != batch.len().div_ceil(CHUNK) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "renewal reply has the wrong length",
        )));
    }
    let mut flags = vec![true; batch.len()];
    for (chunk, gone) in replies.into_iter().enumerate() {
        for i in gone {
            // 1-based position within the chunk.
            if let Some(flag) = i
                .checked_sub(1)
                .and_then(|i| flags.get_mut(chunk * CHUNK + i))
            {
                *flag = false;
            }
        }
    }
    Ok(flags)
}
