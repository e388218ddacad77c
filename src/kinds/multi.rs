//! Locks over several member locks: [`RedLock`] (a majority of independent
//! masters) and [`MultiLock`] (all members or none).
//!
//! Both are built on the members' own machinery: each member is a
//! [`Lock`] of its own client, acquired with that lock's scripts, hold
//! bookkeeping, lost-reply settling and watchdog. What is shared here is the
//! round: every member's acquire request is sent before any reply is read
//! ([`fan_out`]), so an attempt costs about one round trip of the slowest
//! master, not one per member; a failed round gives back at once whatever it
//! took (or may have taken: lost replies are settled by the members'
//! clients); waiting is by pub/sub on every member's release channel, any of
//! which wakes the waiter, bounded by the holders' leases.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::hold::LostListener;
use crate::engine::waiting::Outage;
use crate::error::{Error, Result};
use crate::kinds::guard::{LockGuard, Release};
use crate::kinds::lock::{Attempt, Lock, Request, Terms, Wait};
use crate::kinds::lockable::{lease_guard_by_inherent, lockable_by_inherent};
use crate::net::node::Node;
use crate::net::pool::{fan_out, Job, Synced};
use crate::net::pubsub::{Notify, Subscription, Wake};
use crate::net::router::Router;
use crate::scripts::{self, AcquireReply};
use crate::time::{jitter, warn_limited};

/// A lock on a majority of independent Redis masters: the RedLock algorithm
/// (see [`guide::kinds`](crate::guide::kinds) for what it does and does
/// not guarantee).
///
/// Each member is a [`Lock`] on its own [`Client`](crate::Client), one per
/// master. An acquisition sends its request to every master at once and
/// holds when at least `n / 2 + 1` members were taken while the time spent
/// stays inside the lease: validity = lease − elapsed − drift, with drift =
/// 1 % of the lease + 2 ms (the Redis documentation's figure). Otherwise
/// every member taken is released at once and the attempt has failed. A busy
/// RedLock is waited for by pub/sub on every member's release channel, with a
/// random back-off after a split vote.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// let masters = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let clients = masters
///     .iter()
///     .map(|url| redlease::Client::open(*url))
///     .collect::<redlease::Result<Vec<_>>>()?;
/// let red = redlease::RedLock::new(clients.iter().map(|c| c.lock("orders:42")).collect())?;
/// if let Some(guard) = red.try_lock_for(std::time::Duration::from_secs(2))? {
///     guard.ensure_held()?; // a majority still held, within its validity
///     // ... work ...
///     guard.unlock()?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a RedLock does nothing until one of its methods is called"]
pub struct RedLock {
    group: Group,
}

/// A lock on all of its members or none (Redisson's `RedissonMultiLock`):
/// several locks, on one client or several, taken together.
///
/// An attempt sends every member's request at once; if any member is busy,
/// every member taken is released at once (no member is held while waiting
/// for another, so two threads taking overlapping sets in opposite orders
/// cannot deadlock, and a random back-off keeps them from livelocking). A
/// busy `MultiLock` is waited for by pub/sub on every member's release
/// channel.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let both = redlease::MultiLock::new(vec![client.lock("account:1"), client.lock("account:2")])?;
/// let guard = both.lock()?;
/// // ... move money between the two accounts ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a MultiLock does nothing until one of its methods is called"]
pub struct MultiLock {
    group: Group,
}

#[derive(Clone)]
struct Group {
    members: Vec<Lock>,
    /// Members needed: a majority (RedLock) or all (MultiLock).
    needed: usize,
    redlock: bool,
    /// Called once when a guard loses enough members to be lost.
    on_lost: Option<LostCallback>,
}

type LostCallback = Arc<dyn Fn(&str) + Send + Sync + 'static>;

/// Counts a guard's members as their clients report them lost, and calls the
/// lock's `on_lock_lost` callback once too few are left.
struct LossWatch {
    lost: std::sync::atomic::AtomicUsize,
    held: usize,
    needed: usize,
    fired: std::sync::atomic::AtomicBool,
    name: String,
    callback: LostCallback,
}

impl LostListener for LossWatch {
    fn lost(&self) {
        use std::sync::atomic::Ordering;
        let lost = self.lost.fetch_add(1, Ordering::AcqRel) + 1;
        if self.held.saturating_sub(lost) < self.needed && !self.fired.swap(true, Ordering::AcqRel)
        {
            log::error!("{:?} was lost: too few members held", self.name);
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (self.callback)(&self.name)
            }))
            .is_err()
            {
                log::error!("an on_lock_lost callback panicked");
            }
        }
    }
}

/// The longest random back-off after a round that took some members but not
/// enough (contenders splitting the members between them).
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// When waiting for a holder that set no lease, re-check at least this often.
const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

macro_rules! acquire_methods {
    () => {
        /// Acquires, waiting as long as it takes; the members' watchdogs
        /// renew them until the guard is released.
        ///
        /// # Errors
        ///
        /// Redis errors and [`Error::NoQuorum`] as for
        /// [`try_lock`](Self::try_lock).
        pub fn lock(&self) -> Result<MultiGuard> {
            let guard = self.group.acquire(Wait::Forever, None)?;
            guard.ok_or_else(|| Error::invalid("a wait without deadline ended without the lock"))
        }

        /// One attempt, no waiting: `None` if busy.
        ///
        /// # Errors
        ///
        /// A MultiLock: the first member's error (nothing stays held). A
        /// RedLock: [`Error::NoQuorum`] when too few masters answered for a
        /// majority.
        pub fn try_lock(&self) -> Result<Option<MultiGuard>> {
            self.group.acquire(Wait::No, None)
        }

        /// Waits up to `wait`.
        ///
        /// # Errors
        ///
        /// As for [`try_lock`](Self::try_lock).
        pub fn try_lock_for(&self, wait: Duration) -> Result<Option<MultiGuard>> {
            self.group.acquire(Wait::after(wait), None)
        }

        /// Waits until `deadline`.
        ///
        /// # Errors
        ///
        /// As for [`try_lock`](Self::try_lock).
        pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<MultiGuard>> {
            self.group.acquire(Wait::Until(deadline), None)
        }

        /// Acquires with a fixed `lease` (never renewed), waiting as long as
        /// it takes.
        ///
        /// # Errors
        ///
        /// As for [`lock`](Self::lock), and [`Error::InvalidArgument`] for a
        /// lease out of range.
        pub fn lock_with_lease(&self, lease: Duration) -> Result<MultiGuard> {
            let guard = self.group.acquire(Wait::Forever, Some(lease))?;
            guard.ok_or_else(|| Error::invalid("a wait without deadline ended without the lock"))
        }

        /// Waits up to `wait` for the lock, then holds it for `lease`.
        ///
        /// # Errors
        ///
        /// As for [`lock_with_lease`](Self::lock_with_lease).
        pub fn try_lock_with_lease(
            &self,
            wait: Duration,
            lease: Duration,
        ) -> Result<Option<MultiGuard>> {
            self.group.acquire(Wait::after(wait), Some(lease))
        }

        /// The member locks.
        pub fn members(&self) -> &[Lock] {
            &self.group.members
        }

        /// `true` if the lock cannot be taken now because members are held
        /// (by anyone, this thread included): a MultiLock when any member
        /// is held, a RedLock when too few members are free for a majority.
        /// One round trip per member.
        ///
        /// # Errors
        ///
        /// The first member's error (as for [`Lock::is_locked`]).
        pub fn is_locked(&self) -> Result<bool> {
            Ok(self.group.remaining_lease()?.is_some())
        }

        /// How many times this thread holds the lock: the hold count that
        /// the needed members (all of a MultiLock's, a majority of a
        /// RedLock's) each have at least, as Redis records it; 0 if it is
        /// not held.
        ///
        /// # Errors
        ///
        /// The first member's error (as for [`Lock::hold_count`]).
        pub fn hold_count(&self) -> Result<u32> {
            let mut counts = self
                .group
                .members
                .iter()
                .map(Lock::hold_count)
                .collect::<Result<Vec<u32>>>()?;
            counts.sort_unstable_by(|a, b| b.cmp(a));
            Ok(counts.get(self.group.needed - 1).copied().unwrap_or(0))
        }

        /// `true` if this thread holds the needed members (all of a
        /// MultiLock's, a majority of a RedLock's), as Redis records it.
        ///
        /// # Errors
        ///
        /// As for [`hold_count`](Self::hold_count).
        pub fn is_held_by_current_thread(&self) -> Result<bool> {
            Ok(self.hold_count()? > 0)
        }

        /// How long the members' holders keep the lock from being taken, at
        /// most: `None` if it is not locked (see
        /// [`is_locked`](Self::is_locked)), else the time until enough
        /// members' leases run out (a MultiLock: the longest; a RedLock:
        /// until a majority is free), `Duration::MAX` if that takes a
        /// member held without a lease.
        ///
        /// # Errors
        ///
        /// The first member's error (as for [`Lock::remaining_lease`]).
        pub fn remaining_lease(&self) -> Result<Option<Duration>> {
            self.group.remaining_lease()
        }

        /// Deletes every member whoever holds it, waking their waiters;
        /// `true` if any was held. The former holders' guards report the loss
        /// at their next renewal, check or release.
        ///
        /// # Errors
        ///
        /// The first member's error, after every member was tried (as for
        /// [`Lock::force_unlock`]).
        pub fn force_unlock(&self) -> Result<bool> {
            let mut any = false;
            let mut first_error = None;
            for m in &self.group.members {
                match m.force_unlock() {
                    Ok(held) => any |= held,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            first_error.map_or(Ok(any), Err)
        }

        /// Calls `f` (with the members' names, comma-separated) once a guard
        /// of this lock is lost: fewer members than needed are still held,
        /// as the members' clients find out (a renewal that finds a member
        /// gone, or that could not be made before its lease ran out). The
        /// members' clients' own `on_lock_lost` callbacks are called for each
        /// member too. Only reported losses count: a guard with a fixed lease
        /// that simply runs out calls nothing (check
        /// [`MultiGuard::ensure_held`]). `f` runs on a watchdog thread: keep
        /// it short.
        pub fn on_lock_lost(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
            self.group.on_lost = Some(Arc::new(f));
            self
        }
    };
}

impl RedLock {
    /// A RedLock over `members`, each on its own client (master).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list, or for two members on
    /// the same client or server (a majority of one server is no majority):
    /// pass one lock per independent master, three or more, each on its own
    /// client.
    pub fn new(members: Vec<Lock>) -> Result<RedLock> {
        if members.is_empty() {
            return Err(Error::invalid(
                "redlock needs at least one member lock, got none",
            ));
        }
        if let Some((a, b)) = same_server(&members, false) {
            return Err(Error::invalid(format!(
                "redlock members {:?} and {:?} share a server ({})",
                a.name(),
                b.name(),
                a.shared().server
            )));
        }
        let needed = members.len() / 2 + 1;
        Ok(RedLock {
            group: Group {
                members,
                needed,
                redlock: true,
                on_lost: None,
            },
        })
    }

    /// Members that must be held: `n / 2 + 1`.
    #[must_use]
    pub fn quorum(&self) -> usize {
        self.group.needed
    }

    acquire_methods!();
}

impl MultiLock {
    /// A MultiLock over `members` (on one client or several).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list, or for a lock listed
    /// twice, through one client or two of the same server (it could never
    /// be held twice).
    pub fn new(members: Vec<Lock>) -> Result<MultiLock> {
        if members.is_empty() {
            return Err(Error::invalid(
                "multilock needs at least one member lock, got none",
            ));
        }
        if let Some((a, _)) = same_server(&members, true) {
            return Err(Error::invalid(format!(
                "multilock lists lock {:?} on {} twice",
                a.name(),
                a.shared().server
            )));
        }
        let needed = members.len();
        Ok(MultiLock {
            group: Group {
                members,
                needed,
                redlock: false,
                on_lost: None,
            },
        })
    }

    acquire_methods!();
}

/// The first two members on one client or one server (with the same name,
/// when `same_name`).
fn same_server(members: &[Lock], same_name: bool) -> Option<(&Lock, &Lock)> {
    members.iter().enumerate().find_map(|(i, a)| {
        let sa = a.shared();
        members[i + 1..]
            .iter()
            .find(|b| {
                let sb = b.shared();
                (!same_name || a.name() == b.name())
                    && (Arc::ptr_eq(sa, sb) || sa.server == sb.server)
            })
            .map(|b| (a, b))
    })
}

/// What one round gave.
struct Round {
    guards: Vec<LockGuard>,
    /// Busy members and their holders' remaining leases.
    busy: Vec<(usize, Option<Duration>)>,
    errors: Vec<(usize, Error)>,
    /// When the round's requests went out.
    sent: Instant,
}

impl Group {
    /// The name of the whole, for errors.
    fn name(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for m in &self.members {
            if !names.contains(&m.name()) {
                names.push(m.name());
            }
        }
        names.join(",")
    }

    /// Until enough members are free for the lock to be taken: `None` if
    /// they are now (see `is_locked`).
    fn remaining_lease(&self) -> Result<Option<Duration>> {
        let mut held = self
            .members
            .iter()
            .filter_map(|m| m.remaining_lease().transpose())
            .collect::<Result<Vec<Duration>>>()?;
        let free = self.members.len() - held.len();
        // Members that must come free: the lock needs `needed` free ones.
        let Some(more) = self.needed.checked_sub(free).filter(|&n| n > 0) else {
            return Ok(None);
        };
        held.sort_unstable();
        Ok(held.get(more - 1).copied())
    }

    fn terms(&self, lease: Option<Duration>) -> Result<Vec<Terms>> {
        self.members
            .iter()
            .map(|m| match lease {
                Some(l) => m.lease_terms(l),
                None => m.watchdog_terms(),
            })
            .collect()
    }

    /// The acquire loop: a round; if it fails for want of members, give
    /// back what it took, subscribe to every member's channel, and wait for
    /// a release (or the earliest holder's lease) before the next round.
    fn acquire(&self, wait: Wait, lease: Option<Duration>) -> Result<Option<MultiGuard>> {
        let terms = self.terms(lease)?;
        let deadline = wait.deadline();
        // Each member's acquisition is told on its own client's handler
        // (its release is, by its guard).
        let started = self
            .members
            .iter()
            .any(|m| m.shared().events.is_on())
            .then(Instant::now);
        let mut rounds = 0u32;
        let notify = Arc::new(Notify::default());
        let mut subs: Vec<Option<Subscription>> = self.members.iter().map(|_| None).collect();
        let mut backoff = Duration::from_millis(5);
        // A round that fails the way an outage looks does not end the wait
        // while the bound of the last answered round lasts (without a
        // deadline, where servers can move: nor before the longest watchdog
        // timeout of the members' clients has passed since it failed).
        let floor = match deadline {
            None => self
                .members
                .iter()
                .filter(|m| m.router().can_move())
                .map(|m| m.shared().watchdog_timeout)
                .max()
                .unwrap_or(Duration::ZERO),
            Some(_) => Duration::ZERO,
        };
        let mut outage = Outage::new(floor);
        // The bound of a busy round: the holders' leases (a crashed holder
        // publishes nothing), within the deadline.
        let bound = |busy: Option<Duration>, now: Instant| {
            let ttl = busy.unwrap_or(NO_TTL_RECHECK).max(Duration::from_millis(1));
            let until = now.checked_add(ttl).unwrap_or(now + NO_TTL_RECHECK);
            deadline.map_or(until, |d| until.min(d))
        };
        loop {
            let round = self.round(&terms);
            rounds += 1;
            for s in subs.iter().flatten() {
                s.used();
            }
            let until = match self.settle_round(round, &terms) {
                Ok(Ok(guard)) => {
                    for g in &guard.guards {
                        g.tell_acquired(started, rounds > 1);
                    }
                    return Ok(Some(guard));
                }
                Ok(Err((split, busy))) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Ok(None);
                    }
                    // The round that follows rides out an outage within
                    // the holders' leases this one saw.
                    outage.answered(bound(busy, now));
                    // Subscribed from the first failed round on, then a round
                    // before any wait: a release between the failed round
                    // and the subscription is seen by that round. A
                    // subscription that fails the way an outage looks is
                    // made again after the pause, as a round would be (the
                    // other members' are made meanwhile).
                    let mut subscribed = false;
                    let mut failed = None;
                    for (i, m) in self.members.iter().enumerate() {
                        if subs[i].is_none() {
                            match m.subscribe(deadline) {
                                Ok(s) => {
                                    s.watch(&notify);
                                    subs[i] = Some(s);
                                    subscribed = true;
                                }
                                Err(e) => failed = failed.or(Some(e)),
                            }
                        }
                    }
                    if let Some(e) = failed {
                        let at = outage.failed(e, &self.name())?;
                        std::thread::sleep(at.saturating_duration_since(Instant::now()));
                        continue;
                    }
                    if subscribed {
                        continue;
                    }
                    // Answered, and listening on every member's channel.
                    outage.calm();
                    if split {
                        // Contenders took some members each: step aside for
                        // a random while so that one of them wins the next
                        // round.
                        let pause = jitter(backoff, 1.0);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        let pause = match deadline {
                            Some(d) => pause.min(d.saturating_duration_since(now)),
                            None => pause,
                        };
                        std::thread::sleep(pause);
                    }
                    let until = bound(busy, Instant::now());
                    outage.answered(until);
                    until
                }
                Err(e) => outage.failed(e, &self.name())?,
            };
            // Sooner while a subscription is not confirmed.
            let at = subs.iter().flatten().fold(until, |at, s| s.bound(at));
            notify.wait_until(at);
            for (i, m) in self.members.iter().enumerate() {
                let moved = match &subs[i] {
                    Some(s) => match s.try_take()? {
                        Some(Wake::Moved(to)) => Some(to),
                        _ => None,
                    },
                    None => None,
                };
                if let Some(to) = moved {
                    // The channel's slot moved or its node failed
                    // (Cluster): subscribe where it is now.
                    // One that fails the way an outage looks is made again
                    // after the next round (see above).
                    subs[i] = None;
                    m.router().channel_moved(m.channel(), to.as_deref());
                    match m.subscribe(deadline) {
                        Ok(s) => {
                            s.watch(&notify);
                            subs[i] = Some(s);
                        }
                        Err(e) if e.is_failover_symptom() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }

    /// One round: every member's request sent before any reply is read.
    fn round(&self, terms: &[Terms]) -> Round {
        let sent = Instant::now();
        let requests: Vec<Request> = self
            .members
            .iter()
            .zip(terms)
            .map(|(m, t)| m.prepare(t))
            .collect();
        let targets: Vec<(&Router, &str)> = self
            .members
            .iter()
            .map(|m| (m.router(), m.name()))
            .collect();
        let packed: Vec<Vec<u8>> = self
            .members
            .iter()
            .zip(&requests)
            .map(|(m, r)| m.command(r).get_packed_command())
            .collect();
        let replies = one_round_trip(&targets, packed, AcquireReply::parse, |i| {
            self.members[i].send(&requests[i], None)
        });
        let mut round = Round {
            guards: Vec::new(),
            busy: Vec::new(),
            errors: Vec::new(),
            sent,
        };
        for (i, ((m, r), (t, reply))) in self
            .members
            .iter()
            .zip(requests)
            .zip(terms.iter().zip(replies))
            .enumerate()
        {
            match m.finish(t, r, reply) {
                Ok(Attempt::Acquired(g)) => round.guards.push(g),
                Ok(Attempt::Busy(ttl)) => round.busy.push((i, ttl)),
                Err(e) => round.errors.push((i, e)),
            }
        }
        round
    }

    /// Decides a round: `Ok(guard)` when it holds; else what it took is
    /// released, and `Err((split, ttl))` says whether it had taken some
    /// members (contenders split them) and the earliest busy holder's lease.
    /// An error when a MultiLock member failed, or too few RedLock masters
    /// answered.
    #[allow(clippy::type_complexity)]
    fn settle_round(
        &self,
        round: Round,
        terms: &[Terms],
    ) -> Result<std::result::Result<MultiGuard, (bool, Option<Duration>)>> {
        let n = self.members.len();
        let lease_ms = terms
            .iter()
            .map(Terms::new_hold_lease_ms)
            .min()
            .unwrap_or(0);
        let lease = Duration::from_millis(lease_ms);
        let drift = lease / 100 + Duration::from_millis(2);
        let elapsed = round.sent.elapsed();
        let in_time = !self.redlock || elapsed + drift < lease;
        if round.guards.len() >= self.needed && in_time {
            let watch = self.on_lost.as_ref().map(|cb| {
                let watch = Arc::new(LossWatch {
                    lost: std::sync::atomic::AtomicUsize::new(0),
                    held: round.guards.len(),
                    needed: self.needed,
                    fired: std::sync::atomic::AtomicBool::new(false),
                    name: self.name(),
                    callback: Arc::clone(cb),
                });
                for g in &round.guards {
                    let listener: Arc<dyn LostListener> = watch.clone();
                    g.on_lost(Arc::downgrade(&listener));
                }
                watch
            });
            return Ok(Ok(MultiGuard {
                guards: round.guards,
                members: n,
                needed: self.needed,
                drift: if self.redlock { drift } else { Duration::ZERO },
                name: self.name(),
                _watch: watch,
            }));
        }
        let split = !round.guards.is_empty();
        // Give back what the round took (a release that fails is completed
        // by its client in the background).
        let mut given_back = round.guards;
        for g in &mut given_back {
            g.untold();
        }
        if let Err(e) = release_all(given_back) {
            log::debug!("giving back {:?} after a failed round: {e}", self.name());
        }
        let answered = n - round.errors.len();
        let mut errors = round.errors.into_iter().map(|(_, e)| e);
        if !self.redlock {
            if let Some(e) = errors.next() {
                return Err(e);
            }
        } else if answered < self.needed {
            return Err(Error::NoQuorum {
                name: self.name(),
                masters: n,
                answered,
                needed: self.needed,
                first: errors.next().map(Box::new),
            });
        }
        let ttl = round.busy.iter().filter_map(|(_, t)| *t).min();
        Ok(Err((split, ttl)))
    }
}

/// Releases `guards` in one round trip to all their nodes, attempting
/// every one; the first error (a release that failed is completed in the
/// background by its client).
fn release_all(guards: Vec<LockGuard>) -> Result<()> {
    let mut first = None;
    let mut sending = Vec::new();
    for mut g in guards {
        match g.begin_release() {
            Release::Done(Err(e)) => {
                first.get_or_insert(e);
            }
            Release::Done(Ok(())) => {}
            Release::Send(step) => sending.push((g, step)),
        }
    }
    let targets: Vec<(&Router, &str)> = sending
        .iter()
        .map(|(g, _)| (&*g.shared().router, g.name()))
        .collect();
    let packed = sending
        .iter()
        .map(|(g, step)| g.release_command(&step.request).get_packed_command())
        .collect();
    let replies = one_round_trip(&targets, packed, release_reply, |i| {
        let (g, step) = &sending[i];
        g.send_release(&step.request)
    });
    drop(targets);
    for ((g, step), reply) in sending.into_iter().zip(replies) {
        if let Err(e) = g.end_release(step, reply) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// release.lua's reply: nil, or an integer.
fn release_reply(v: redis::Value) -> redis::RedisResult<Option<i64>> {
    match v {
        redis::Value::Nil => Ok(None),
        redis::Value::Int(n) => Ok(Some(n)),
        _ => Err((
            redis::ErrorKind::Parse,
            "unexpected reply to the release script",
        )
            .into()),
    }
}

/// Sends one script request per target (request `i` to the node of
/// `targets[i]`'s key) before reading any reply: about one round trip of
/// the slowest node. Returns each script's reply (nil or an integer) with
/// what replica sync said; a request Redis did not run there and then
/// (script cache lost, slot moved or migrating, a passing refusal) is run
/// again on its own with `rerun(i)`, routed.
fn one_round_trip<T>(
    targets: &[(&Router, &str)],
    packed: Vec<Vec<u8>>,
    parse: impl Fn(redis::Value) -> redis::RedisResult<T>,
    mut rerun: impl FnMut(usize) -> Result<(T, Synced)>,
) -> Vec<Result<(T, Synced)>> {
    let nodes: Vec<Result<Arc<Node>>> = targets.iter().map(|(r, k)| r.node(k)).collect();
    // One job per node: its requests pipelined on one connection (a
    // MultiLock of many locks on one client needs one pooled connection,
    // not one per member).
    let mut jobs: Vec<Job<'_>> = Vec::new();
    let mut job_nodes: Vec<&Arc<Node>> = Vec::new();
    // Per request: its job and its place in the job's replies.
    let mut place: Vec<Option<(usize, usize)>> = Vec::with_capacity(targets.len());
    for (node, packed) in nodes.iter().zip(packed) {
        let Ok(node) = node else {
            place.push(None);
            continue;
        };
        let j = match job_nodes.iter().position(|n| Arc::ptr_eq(n, node)) {
            Some(j) => j,
            None => {
                job_nodes.push(node);
                jobs.push(Job {
                    redis: &node.redis,
                    packed: Vec::new(),
                    count: 0,
                });
                jobs.len() - 1
            }
        };
        place.push(Some((j, jobs[j].count)));
        jobs[j].packed.extend_from_slice(&packed);
        jobs[j].count += 1;
    }
    let mut results: Vec<Result<(Vec<Option<redis::Value>>, Synced)>> = fan_out(&jobs)
        .into_iter()
        .map(|r| r.map(|(values, synced)| (values.into_iter().map(Some).collect(), synced)))
        .collect();
    let mut replies = Vec::with_capacity(targets.len());
    for (i, node) in nodes.iter().enumerate() {
        let taken = place[i].map(|(j, k)| match &mut results[j] {
            Ok((values, synced)) => Ok((values.get_mut(k).and_then(Option::take), *synced)),
            Err(e) => Err(e.duplicate()),
        });
        let reply = match (taken, node) {
            (Some(Ok((value, synced))), _) => match value {
                Some(redis::Value::ServerError(e)) if scripts::not_run_there(e.code()) => rerun(i),
                Some(redis::Value::ServerError(e)) => Err(Error::Redis(e.into())),
                Some(v) => parse(v).map(|t| (t, synced)).map_err(Error::Redis),
                None => Err(Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "a reply of a lock script is missing",
                )))),
            },
            (Some(Err(e)), _) => Err(e),
            (None, Err(e)) => Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no node for the lock",
                e.to_string(),
            )))),
            (None, Ok(_)) => rerun(i),
        };
        replies.push(reply);
    }
    replies
}

/// A held [`RedLock`] or [`MultiLock`]: the member guards it took. Releases
/// every member on drop.
#[must_use = "if unused the lock is released at once"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
    members: usize,
    needed: usize,
    /// A RedLock's clock-drift allowance (zero for a MultiLock).
    drift: Duration,
    name: String,
    /// Kept alive while the guard is: the members' loss listeners hold it
    /// weakly.
    _watch: Option<Arc<LossWatch>>,
}

impl MultiGuard {
    /// Members held now: not lost, and inside their confirmed lease (for a
    /// RedLock, less the clock-drift allowance: a master whose clock runs
    /// a little fast may expire a member that early).
    #[must_use]
    pub fn held(&self) -> usize {
        let now = Instant::now();
        self.guards
            .iter()
            .filter(|g| !g.is_lost() && now + self.drift < g.valid_until())
            .count()
    }

    /// Members the lock needs held: all for a MultiLock, a majority for a
    /// RedLock.
    #[must_use]
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// How many members the lock has (a count; the member locks themselves
    /// are [`RedLock::members`] / [`MultiLock::members`]).
    #[must_use]
    pub fn member_count(&self) -> usize {
        self.members
    }

    /// The lock's name: its members' names, comma-separated.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `true` once fewer members than needed are held: a RedLock that lost
    /// its majority (members lost, or not renewed in time), a MultiLock that
    /// lost any member.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.held() < self.needed
    }

    /// Checks, without a round trip, that enough members are held.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when [`is_lost`](Self::is_lost) is true.
    pub fn ensure_held(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::LockLost {
                name: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Until when enough members are known to be held: for a MultiLock the
    /// earliest of its members' [`LockGuard::valid_until`]; for a RedLock
    /// the latest instant by which a majority is still within its lease,
    /// less the clock-drift allowance (1 % of the lease + 2 ms). Right after
    /// acquisition that is the RedLock algorithm's validity (send time +
    /// lease − drift); the members' renewals move it on. Members found lost
    /// do not count (once too few are left, [`is_lost`](Self::is_lost) is
    /// true and this is the earliest member's bound).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let (a, b, c) = (redlease::Client::open("redis://10.0.0.1/")?,
    /// #     redlease::Client::open("redis://10.0.0.2/")?, redlease::Client::open("redis://10.0.0.3/")?);
    /// use std::time::Duration;
    /// let red = redlease::RedLock::new(vec![a.lock("job"), b.lock("job"), c.lock("job")])?;
    /// let guard = red.lock_with_lease(Duration::from_secs(10))?;
    /// let left = guard.valid_until().saturating_duration_since(std::time::Instant::now());
    /// assert!(left < Duration::from_secs(10)); // the drift allowance is taken off
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        let mut bounds: Vec<Instant> = self
            .guards
            .iter()
            .filter(|g| !g.is_lost())
            .map(|g| {
                let until = g.valid_until();
                until.checked_sub(self.drift).unwrap_or(until)
            })
            .collect();
        if self.needed == 0 || bounds.len() < self.needed {
            return self
                .guards
                .iter()
                .map(LockGuard::valid_until)
                .min()
                .map_or_else(Instant::now, |until| {
                    until.checked_sub(self.drift).unwrap_or(until)
                });
        }
        // The needed-th latest bound: until then, `needed` members hold.
        bounds.sort_unstable_by(|a, b| b.cmp(a));
        bounds[self.needed - 1]
    }

    /// Releases every member, attempting each; reports the first error (a
    /// member whose release failed is completed in the background by its
    /// client).
    ///
    /// # Errors
    ///
    /// The first member's error, as for [`LockGuard::unlock`].
    pub fn unlock(mut self) -> Result<()> {
        release_all(std::mem::take(&mut self.guards))
    }
}

lease_guard_by_inherent!(MultiGuard);

lockable_by_inherent!(RedLock, MultiGuard);
lockable_by_inherent!(MultiLock, MultiGuard);

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if let Err(e) = release_all(std::mem::take(&mut self.guards)) {
            // A lost lock (or permit) is told each time.
            warn_limited!(
                unless e.is_lock_lost(),
                "multi release on drop",
                "releasing {:?} on drop failed: {e}",
                self.name
            );
        }
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("name", &self.name)
            .field("members", &self.members)
            .field("needed", &self.needed)
            .field("held", &self.held())
            .finish()
    }
}

impl fmt::Debug for RedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLock")
            .field("members", &self.group.name())
            .field("quorum", &self.group.needed)
            .finish()
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("members", &self.group.name())
            .finish()
    }
}
