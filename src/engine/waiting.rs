//! The acquire loop every kind shares: try once; if busy, subscribe to the
//! kind's channel, try again (a release between the first try and the
//! subscription is not missed), then wait for a message or for the hint the
//! busy reply gave (the holder's remaining lease, the next permit's expiry),
//! whichever comes first, and try again, until acquired or the deadline.
//! Each kind brings its attempt (a script call and what its reply means),
//! its channel and its wake rule.
//!
//! A try that fails the way an outage looks does not end the wait within
//! the bound of the last answered try ([`Outage`]): the waiter steps out
//! (unsubscribes, passing on a wake-up it took), tries again after a pause,
//! and subscribes again once a try is answered.
//!
//! A reentrant lock's waiter also listens on its process's own wake-up
//! channel and, from its second try on, queues its process in the lock's
//! queue (see queue_lib.lua): a release then wakes one queued process
//! instead of every process that waits. A process whose last waiter gives
//! up or steps out leaves the queue, passing on a wake-up it was given; a
//! release skips a queued process that nobody listens for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::grants::{Offer, Outcome};
use crate::engine::shared::Shared;
use crate::engine::unsettled::{Lost, Unsettled};
use crate::error::{Error, Result};
use crate::net::pubsub::{Poker, Subscription, Wake, WakeRule};
use crate::net::router::Router;
use crate::scripts::{self, Kind, LockRef, Queued};
use crate::time::{far_future, jitter};

/// The longest a waiter without a deadline says it waits before trying
/// again (its queue entry outlives that; a holder's lease usually bounds
/// the wait sooner).
const QUEUE_WAIT_CAP_MS: u64 = 3_600_000;

/// How long a caller is prepared to wait.
pub(crate) enum Wait {
    No,
    Until(Instant),
    Forever,
}

impl Wait {
    pub(crate) fn after(d: Duration) -> Wait {
        match Instant::now().checked_add(d) {
            Some(at) => Wait::Until(at),
            None => Wait::Forever,
        }
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self {
            Wait::No => Some(Instant::now()),
            Wait::Until(at) => Some(*at),
            Wait::Forever => None,
        }
    }
}

/// What one try gave.
pub(crate) enum Attempt<T> {
    Acquired(T),
    /// Busy; try again after at most this long even without a message
    /// (`None`: the kind's default re-check).
    Busy(Option<Duration>),
}

/// Where the waiters of one name listen: its channel on the node that serves
/// it, and how many waiters a message wakes.
pub(crate) struct Waiters<'a> {
    pub(crate) router: &'a Router,
    /// The name (key) waited for.
    pub(crate) name: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) rule: WakeRule,
    /// The longest wait without a message when a busy reply gives no hint
    /// (`Duration::MAX`: none but the subscription's own bound while it is
    /// not confirmed).
    pub(crate) recheck: Duration,
    /// The longest wait between tries, whatever the hint (`Duration::MAX`:
    /// none): a fair lock's tries keep its place in line.
    pub(crate) every: Duration,
    /// How long after its last answered try a wait rides out an outage at
    /// most, when the hint's bound comes later (`Duration::MAX`: up to that
    /// bound, the holder's lease): a fair lock's failed tries do not keep
    /// its place, and a latch has no lease to bound the wait.
    pub(crate) ride_out: Duration,
    /// The kind, for the acquisition's event (`None`: a wait that acquires
    /// nothing, the latch's).
    pub(crate) kind: Option<&'static str>,
    /// A reentrant lock's waiter: its client, whose uuid names its
    /// process's wake-up channel and whose watchdog leaves the queue when
    /// the process's last waiter gives up (`None`: the kind has no queue).
    pub(crate) client: Option<&'a Shared>,
    /// How long a wait without a deadline rides out a failover at least
    /// (Sentinel, Cluster), counted from its first failed try since the
    /// last answered one, whatever that try's bound: the client's watchdog
    /// timeout, the lease a holder keeps its lock by through an outage.
    pub(crate) failover: Duration,
}

/// A waiter that a release by another thread of its client may hand the
/// lock to (engine/grants.rs).
pub(crate) trait Grantee<T> {
    /// The acquisition to offer while the waiter sleeps (woken through
    /// `poker`; `wake`: its process's wake-up channel, its entry in the
    /// lock's queue), if it may take one now.
    fn offer(&mut self, poker: Poker, wake: &str) -> Option<Offer>;

    /// The offer was granted, leased from `sent` (a fenced lock's with
    /// `token`): the waiter's hold.
    fn granted(&mut self, offer: &Offer, sent: Instant, token: Option<u64>) -> Result<T>;
}

/// A waiter's process's place in a reentrant lock's queue: the queue's key
/// and the process's wake-up channel.
#[derive(Clone)]
struct QueueNames {
    key: String,
    channel: String,
}

impl Waiters<'_> {
    /// Try; if busy, subscribe, then retry and wait for a message or the
    /// hint, whichever comes first, until `deadline`. Every try rides out a
    /// failover ([`through_failover`]), and the wait rides out an outage
    /// within the bound of its last answered try ([`Outage`]). `try_once`
    /// is told, from the second try on, where its process queues (a kind
    /// with a queue only).
    pub(crate) fn acquire<T>(
        &self,
        deadline: Option<Instant>,
        try_once: impl FnMut(Option<&Queued>) -> Result<Attempt<T>>,
    ) -> Result<Option<T>> {
        self.acquire_with(deadline, try_once, None)
    }

    /// [`acquire`](Waiters::acquire), where a release by another thread of
    /// this client may hand the lock to this waiter while it sleeps
    /// (`grantee`, a reentrant lock's waiter; see engine/grants.rs).
    pub(crate) fn acquire_with<T>(
        &self,
        deadline: Option<Instant>,
        mut try_once: impl FnMut(Option<&Queued>) -> Result<Attempt<T>>,
        mut grantee: Option<&mut dyn Grantee<T>>,
    ) -> Result<Option<T>> {
        let events = &self.router.counters().events;
        let started = self.kind.and(events.start());
        let acquired = |waited: bool| {
            if let Some(kind) = self.kind {
                events.acquired(kind, self.name, started, waited);
            }
        };
        // A wait with a deadline rides out a failover within each try (and
        // each subscription) up to it. One without makes each a single call
        // (which rides out a failover for a response timeout, as any call)
        // and leaves the rest to `Outage`, with its floor.
        let mut attempt = |q: Option<&Queued>| self.ride(deadline, || try_once(q));
        let floor = match deadline {
            None if self.router.can_move() => self.failover,
            _ => Duration::ZERO,
        };
        let mut outage = Outage::new(floor);
        // An answered busy try: the wait's bound (the hint, within `every`:
        // a crashed holder publishes nothing, but its lease runs out), and
        // the ride-out's (the hint, within `ride_out`), each within the
        // deadline.
        let answered = |outage: &mut Outage, hint: Option<Duration>| {
            let now = Instant::now();
            let after = |d: Duration| {
                let until = now.checked_add(d).unwrap_or_else(|| far_future(now));
                deadline.map_or(until, |d| until.min(d))
            };
            let hint = hint.unwrap_or(self.recheck).max(Duration::from_millis(1));
            outage.answered(after(hint.min(self.ride_out)));
            after(hint.min(self.every))
        };
        // The first try; one that fails the way a failover looks is made
        // again within the floor (a wait without a deadline).
        loop {
            match attempt(None) {
                Ok(Attempt::Acquired(g)) => {
                    acquired(false);
                    return Ok(Some(g));
                }
                Ok(Attempt::Busy(hint)) => {
                    answered(&mut outage, hint);
                    break;
                }
                Err(e) => {
                    let at = outage.failed(e, self.name)?;
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                }
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let queue = self.client.map(|client| QueueNames {
            key: scripts::queue_name(self.name),
            channel: scripts::wake_channel_name(self.name, &client.uuid),
        });
        // `None` while the waiter has stepped out after a failed try or
        // subscription (see below), until a try is answered again.
        let mut subscription = None;
        // Whether a try may have queued this process.
        let mut joined = false;
        // What ended a step of the wait: a failed subscription, or a failed
        // try.
        let mut failure = match self.subscribe_queued(deadline, queue.as_ref()) {
            Ok(s) => {
                subscription = Some(s);
                None
            }
            Err(e) => Some(e),
        };
        let mut wait = || -> Result<Option<T>> {
            loop {
                if let Some(e) = failure.take() {
                    let at = outage.failed(e, self.name)?;
                    // The wait goes on, but the waiter steps out as one
                    // that gives up does: a wake-up it took goes to
                    // another waiter of this process or, from its last,
                    // to the next queued process (this one leaves the
                    // queue, and a release skips a process that nobody
                    // listens for). Either may find the lock free while
                    // this one's link fails. It subscribes again once a
                    // try is answered.
                    if let Some(sub) = subscription.take() {
                        if let (Some(client), Some(q), true) = (self.client, &queue, sub.close()) {
                            if joined {
                                self.leave(client, q.clone());
                            }
                        }
                    }
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                }
                // Only a subscribed waiter queues its process: a release
                // that wakes the process must find it listening.
                let queued = match (&queue, &subscription) {
                    (Some(q), Some(sub)) => Some(Queued {
                        key: &q.key,
                        channel: &q.channel,
                        stay: sub.others_waiting(),
                        wait_ms: deadline.map_or(QUEUE_WAIT_CAP_MS, |d| {
                            u64::try_from(d.saturating_duration_since(Instant::now()).as_millis())
                                .unwrap_or(u64::MAX)
                                .min(QUEUE_WAIT_CAP_MS)
                        }),
                    }),
                    _ => None,
                };
                joined |= queued.is_some();
                let tried = attempt(queued.as_ref());
                if let (Ok(_), Some(sub)) = (&tried, &subscription) {
                    sub.used();
                }
                let until = match tried {
                    Ok(Attempt::Acquired(g)) => {
                        acquired(true);
                        return Ok(Some(g));
                    }
                    Ok(Attempt::Busy(hint)) => {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            return Ok(None);
                        }
                        answered(&mut outage, hint)
                    }
                    // An error that ends the wait drops the subscription,
                    // which passes a wake-up this retry took on to another
                    // waiter.
                    Err(e) => {
                        failure = Some(e);
                        continue;
                    }
                };
                let Some(sub) = &subscription else {
                    // Answered again: listen, then try once more before
                    // waiting (a release in between is not missed).
                    match self.subscribe_queued(deadline, queue.as_ref()) {
                        Ok(s) => subscription = Some(s),
                        Err(e) => failure = Some(e),
                    }
                    continue;
                };
                outage.calm();
                // While it sleeps, a release by another thread of this
                // client may hand it the lock.
                let woke = loop {
                    let offer = match (grantee.as_deref_mut(), self.client, &queue) {
                        (Some(g), Some(client), Some(q)) => {
                            g.offer(sub.poker(), &q.channel).map(|o| {
                                let o = Arc::new(o);
                                client.grants.park(&o);
                                o
                            })
                        }
                        _ => None,
                    };
                    let woke = sub.wait_until(until);
                    let (Some(o), Some(client)) = (offer, self.client) else {
                        break woke;
                    };
                    let outcome = client.grants.withdraw(&o);
                    if outcome.is_some() {
                        // The release's poke, if not waited for yet.
                        sub.unpoke();
                    }
                    match outcome {
                        Some(Outcome::Granted { sent, token }) => {
                            if let Some(g) = grantee.as_deref_mut() {
                                let got = g.granted(&o, sent, token)?;
                                // Granted by a release while the channel's
                                // slot moved: the next subscription goes
                                // where it is now.
                                if let Ok(Wake::Moved(to)) = &woke {
                                    self.router.channel_moved(self.channel, to.as_deref());
                                }
                                acquired(true);
                                return Ok(Some(got));
                            }
                        }
                        // The release's reply was lost: what it may have
                        // granted is undone (and this thread's next try
                        // sets the cancel marker first).
                        Some(Outcome::Unknown { sent }) if o.owned => {
                            client.settle_owned_later(o.lost(sent))
                        }
                        Some(Outcome::Unknown { sent }) => client.settle_later(o.lost(sent)),
                        Some(Outcome::Declined | Outcome::Missed) | None => {}
                    }
                    if outcome.is_some() && deadline.is_some_and(|d| Instant::now() >= d) {
                        // Past the deadline while the release that chose
                        // it ran: its round trip was this wait's last.
                        return Ok(None);
                    }
                    if outcome == Some(Outcome::Declined) && matches!(woke, Ok(Wake::Poked)) {
                        // The release ran without a hand-off (it woke a
                        // queued process, this one's if first in line):
                        // woken by nothing else, this waiter sleeps on
                        // rather than race the one woken.
                        continue;
                    }
                    break woke;
                };
                match woke? {
                    Wake::Woken | Wake::TimedOut | Wake::Poked => {}
                    Wake::Moved(to) => {
                        // The channel's slot moved or its node failed
                        // (Cluster): subscribe where it is now, then retry (a
                        // release between the two is not missed).
                        self.router.channel_moved(self.channel, to.as_deref());
                        match self.subscribe_queued(deadline, queue.as_ref()) {
                            Ok(s) => subscription = Some(s),
                            Err(e) => failure = Some(e),
                        }
                    }
                }
            }
        };
        let got = wait();
        if let (Some(client), Some(q), Some(sub), true, false) = (
            self.client,
            queue,
            subscription,
            joined,
            matches!(got, Ok(Some(_))),
        ) {
            if sub.close() {
                self.leave(client, q);
            }
        }
        got
    }

    /// This process's last waiter gave up, or stepped out after a failed
    /// try: its process leaves the queue, passing on a wake-up a release
    /// already gave it (see leave.lua), in the background (the wait goes on
    /// or returns now) and retried until it has run.
    /// A leave that runs after a new waiter of this process queued again
    /// takes that entry too: the new waiter is then woken by a release that
    /// finds nobody queued, or tries again at the bound of its wait.
    fn leave(&self, client: &Shared, q: QueueNames) {
        let lock = LockRef {
            name: self.name,
            channel: self.channel,
            field: &client.uuid,
            kind: Kind::Plain,
        };
        client.settle_owned_later(Unsettled::new(
            lock,
            q.key,
            Lost::Dequeue { wake: q.channel },
            None,
            Instant::now(),
        ));
    }

    /// Subscribes to the lock's channel and, with a queue, to this process's
    /// wake-up channel (see [`subscribe`](Waiters::subscribe)).
    fn subscribe_queued(
        &self,
        deadline: Option<Instant>,
        queue: Option<&QueueNames>,
    ) -> Result<Subscription> {
        self.ride(deadline, || {
            let node = self.router.node(self.channel)?;
            match queue {
                Some(q) => node.pubsub.subscribe(
                    &[self.channel, &q.channel],
                    self.name,
                    self.rule,
                    deadline,
                ),
                None => node
                    .pubsub
                    .subscribe(&[self.channel], self.name, self.rule, deadline),
            }
        })
    }

    /// Subscribes to the channel on the node serving it, riding out a
    /// failover (no node for the slot yet) until `deadline`; without one,
    /// once (the caller's [`Outage`] rides the failover out).
    pub(crate) fn subscribe(&self, deadline: Option<Instant>) -> Result<Subscription> {
        self.ride(deadline, || {
            let node = self.router.node(self.channel)?;
            node.pubsub
                .subscribe(&[self.channel], self.name, self.rule, deadline)
        })
    }

    /// `f` riding out a failover up to `deadline`, or once without one.
    fn ride<T>(&self, deadline: Option<Instant>, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        match deadline {
            Some(_) => through_failover(self.router, self.name, deadline, f),
            None => f(),
        }
    }
}

/// Runs `f` until it succeeds, fails for another reason than a failover
/// (no connection, `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, no
/// master known yet), or the next try would pass `deadline`; the tries are
/// spaced by a growing pause (50 ms to 500 ms, jittered). Only where the
/// servers can move (Sentinel, Cluster): else `f` runs once. (A wait
/// without a deadline rides a failover out with [`Outage`] instead.)
fn through_failover<T>(
    router: &Router,
    name: &str,
    deadline: Option<Instant>,
    mut f: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut pause = Duration::from_millis(50);
    loop {
        match f() {
            Err(e) if router.can_move() && e.is_failover_symptom() => {
                let wait = jitter(pause, 0.5);
                if deadline.is_some_and(|d| Instant::now() + wait >= d) {
                    return Err(e);
                }
                log::debug!("{name:?}: {e}; trying again in {wait:?}");
                std::thread::sleep(wait);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// The first pause before a try that follows a failed one, within a wait.
const OUTAGE_FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest such pause.
const OUTAGE_MAX_PAUSE: Duration = Duration::from_millis(500);

/// How a wait rides out an outage: a try that fails the way an outage or a
/// failover looks (no connection, a connection lost, `LOADING`, ...) does
/// not end the wait while the bound of the last answered try (the holder's
/// lease it saw, within the kind's `ride_out`) is ahead, whatever ended the
/// wait before it (a release message, a reconnect, a re-check), nor before
/// the floor has passed since the first failed try after that answer (a
/// wait without a deadline where the servers can move: a failover takes
/// its time, whatever lease the waiter saw last); the next try comes after
/// a pause of about 50 ms, doubling up to about 500 ms (each jittered by
/// half), within that bound. Any other failure, or one past the bound,
/// ends the wait with its error. Shared by the acquire loop of every kind
/// and the MultiLock's.
pub(crate) struct Outage {
    /// The bound of the last answered try (`None` before one).
    bound: Option<Instant>,
    pause: Duration,
    /// How long at least a failed try is made again, from the first
    /// failure since the last answered try (`Duration::ZERO`: no floor).
    floor: Duration,
    /// The end of the floor: set by the first failure since the last
    /// answered try.
    floor_ends: Option<Instant>,
}

impl Outage {
    /// `floor`: see [`Waiters::failover`].
    pub(crate) fn new(floor: Duration) -> Outage {
        Outage {
            bound: None,
            pause: OUTAGE_FIRST_PAUSE,
            floor,
            floor_ends: None,
        }
    }

    /// A try was answered: a failed one rides out the outage until
    /// `until` (or the floor). The pause keeps growing until the wait is
    /// [`calm`](Outage::calm) again: a subscription that keeps failing
    /// between answered tries does not make them come every 50 ms.
    pub(crate) fn answered(&mut self, until: Instant) {
        self.bound = Some(until);
        self.floor_ends = None;
    }

    /// The waiter waits for a message again (answered and listening): the
    /// next failure starts with the first pause.
    pub(crate) fn calm(&mut self) {
        self.pause = OUTAGE_FIRST_PAUSE;
    }

    /// A try failed with `e`: when to try again, or `e` when the failure
    /// ends the wait.
    pub(crate) fn failed(&mut self, e: Error, name: &str) -> Result<Instant> {
        let now = Instant::now();
        let floor_ends = *self.floor_ends.get_or_insert_with(|| {
            now.checked_add(self.floor)
                .unwrap_or_else(|| far_future(now))
        });
        let bound = match self.bound {
            Some(b) => b.max(floor_ends),
            None => floor_ends,
        };
        if now < bound && e.is_failover_symptom() {
            let pause = jitter(self.pause, 0.5);
            self.pause = (self.pause * 2).min(OUTAGE_MAX_PAUSE);
            log::debug!("{name:?}: a try failed ({e}); trying again in {pause:?}");
            return Ok(now.checked_add(pause).map_or(bound, |at| at.min(bound)));
        }
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn down() -> Error {
        Error::Pool("no connection".into())
    }

    #[test]
    fn without_a_floor_a_failure_ends_the_wait_past_its_bound() {
        let mut o = Outage::new(Duration::ZERO);
        // No answered try yet: as any call.
        assert!(o.failed(down(), "t").is_err());
        // Within the bound of the last answered try: tried again.
        o.answered(Instant::now() + HOUR);
        assert!(o.failed(down(), "t").is_ok());
        // Past it: the error.
        o.answered(Instant::now());
        assert!(o.failed(down(), "t").is_err());
        // Not a failover symptom: the error at once.
        o.answered(Instant::now() + HOUR);
        assert!(o.failed(Error::invalid("bad"), "t").is_err());
    }

    #[test]
    fn a_floor_rides_a_failure_out_from_the_first_one_after_an_answer() {
        let mut o = Outage::new(HOUR);
        // Before any answer, and past the bound of the last one: the floor.
        assert!(o.failed(down(), "t").is_ok());
        o.answered(Instant::now());
        let at = o.failed(down(), "t").expect("within the floor");
        assert!(
            at <= Instant::now() + OUTAGE_MAX_PAUSE * 2,
            "a pause, not the floor's end"
        );
        // The floor counts from the first failure since the answer: it
        // does not move with later ones.
        let first_end = o.floor_ends.expect("set by the first failure");
        assert!(o.failed(down(), "t").is_ok());
        assert_eq!(o.floor_ends, Some(first_end));
        // An answered try starts it again.
        o.answered(Instant::now());
        assert_eq!(o.floor_ends, None);
        // Still only for failover symptoms.
        assert!(o.failed(Error::invalid("bad"), "t").is_err());
    }

    #[test]
    fn the_pause_grows_until_the_wait_is_calm_again() {
        let mut o = Outage::new(HOUR);
        o.answered(Instant::now() + HOUR);
        let pause = |o: &mut Outage| {
            let now = Instant::now();
            o.failed(down(), "t").expect("within the bound") - now
        };
        // About 50 ms, jittered by half.
        assert!(pause(&mut o) <= OUTAGE_FIRST_PAUSE * 3 / 2 + Duration::from_millis(5));
        for _ in 0..8 {
            pause(&mut o);
        }
        // Grown to about 500 ms, and no further.
        let grown = pause(&mut o);
        assert!(grown >= OUTAGE_MAX_PAUSE / 2, "{grown:?}");
        assert!(
            grown <= OUTAGE_MAX_PAUSE * 3 / 2 + Duration::from_millis(5),
            "{grown:?}"
        );
        // An answered try alone does not reset it (a subscription that
        // keeps failing between answered tries); waiting again does.
        o.answered(Instant::now() + HOUR);
        assert!(pause(&mut o) >= OUTAGE_MAX_PAUSE / 2);
        o.calm();
        assert!(pause(&mut o) <= OUTAGE_FIRST_PAUSE * 3 / 2 + Duration::from_millis(5));
    }
}
