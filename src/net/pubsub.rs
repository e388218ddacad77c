//! The one subscriber connection of a client (`redlease-pubsub`).
//!
//! Waiters subscribe to a lock's release channel before their retry, so no
//! release can slip between "busy" and "waiting". Subscriptions are counted per
//! channel: the first waiter sends SUBSCRIBE, the last one to leave sends
//! UNSUBSCRIBE. Two lock names can share one channel (Redisson names the
//! channel of `k` and of `{k}` alike), so wake-ups are kept per (channel, lock
//! name): a release message, which does not say which lock was released, adds
//! one permit to the latch of every lock name waited on over that channel and
//! wakes one waiter of each in this process (no thundering herd); a permit that
//! arrives while nobody sleeps is kept for the next wait. A woken waiter holds
//! its wake-up until its retry got an answer from Redis; a wake-up it could not
//! use (the retry failed) is passed on to another waiter of the same lock when
//! its subscription is dropped, so a failed retry strands nobody.
//!
//! Commands go out through an outbox: whoever finds the outbox idle writes
//! everything queued, others just queue and leave, so no thread ever waits on a
//! lock of ours that is held across socket I/O. Replies come back in order, and
//! the outbox remembers what each reply answers: replies to SUBSCRIBE and
//! UNSUBSCRIBE, error replies included, advance an acknowledgement counter
//! that tells each waiter when its SUBSCRIBE has been applied. A refused
//! SUBSCRIBE (say `NOPERM` for an ACL user without the channel) fails the
//! channel's waiters with an error that says what to grant, and the channel is
//! forgotten so that a later waiter tries again. PINGs take no number.
//!
//! Liveness: a connection that has received nothing for a ping interval (the
//! response timeout, clamped to [`MIN_PING_INTERVAL`, `MAX_PING_INTERVAL`])
//! gets a PING, and so does one on which a waiter's SUBSCRIBE went
//! unacknowledged for its wait. If no PONG comes within the response timeout,
//! the connection is declared dead, even if it never reports an error (a
//! silent, half-open link). The socket's read timeout is set to the next such
//! event and handled inside the reader, so the RESP parser only ever sees data
//! or a fatal error, never a timeout in the middle of a frame.
//!
//! Reconnecting: a new connection proves itself before it is used (AUTH if
//! configured, then PING, both answered within the response timeout); an
//! error reply there (such as `ERR max number of clients reached`) is logged
//! at warn. Until a connection has proven itself, attempts are spaced by a
//! backoff that doubles from 20 ms to 1 s with ±50 % jitter, so a server or
//! proxy that accepts and then closes does not make the thread spin. A proven
//! connection that is lost is replaced at once (at most once a second; more
//! often, the backoff applies). Then every channel that still has waiters is
//! subscribed again, and once Redis has answered, all of them are woken to
//! retry, because a release may have been missed meanwhile.
//!
//! Confirmation: a channel is confirmed once Redis acknowledged its SUBSCRIBE
//! on the current connection, and no longer once that connection is lost.
//! A waiter never counts on a message its channel may not get: while its
//! subscription is not confirmed, its wait ends after a short re-check
//! interval that doubles up to the response timeout
//! ([`Subscription::bound`]), and a lost connection wakes every waiter to
//! take that bound. On a confirmed subscription a waiter waits for the
//! message (no polling on a healthy link).

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::events::Events;
use crate::net::target::Target;
use crate::net::transport::Stream;
use crate::time::{jitter, warn_limited};

/// First wait before retrying a connection that has not proven itself.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
/// Longest wait between connection attempts (before jitter).
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// A lost proven connection is replaced at once at most this often.
const FAST_RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// The first re-check of a waiter whose subscription is not confirmed (see
/// [`Subscription::bound`]); it doubles up to the response timeout.
const UNCONFIRMED_RECHECK: Duration = Duration::from_millis(100);
/// Bounds of the ping interval, which is the response timeout clamped to
/// them: often enough to find a silent link within about two response
/// timeouts, never more than 10 PINGs a second on an idle connection.
const MIN_PING_INTERVAL: Duration = Duration::from_millis(100);
const MAX_PING_INTERVAL: Duration = Duration::from_secs(1);
/// The hint in the error of a SUBSCRIBE refused for lack of permissions.
const GRANT_HINT: &str = "grant the user the release channels, e.g. ACL SETUSER <user> \
     &redisson_lock__channel:* (and &redlease_wake:*, a reentrant lock's waiters' own)";

/// Reads from the serving connection while other threads write to it, and
/// keeps it honest: the socket's read timeout is the next liveness event
/// (time to PING an idle connection, or the deadline of the outstanding
/// PONG), handled here. The parser above sees data, end of stream, or a fatal
/// error (a PONG overdue, the subscriber stopping), never a plain timeout.
struct LiveReader<'a> {
    inner: &'a Inner,
    stream: &'a Stream,
    /// When data last arrived.
    last_rx: Instant,
}

impl Read for LiveReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let inner = self.inner;
        loop {
            if inner.shutdown.load(Ordering::Acquire) {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the subscriber is stopping",
                ));
            }
            let now = Instant::now();
            let next = {
                let mut out = inner.out.lock();
                match out.ping_sent {
                    Some(sent) => {
                        let overdue = sent.checked_add(inner.response_timeout).unwrap_or(sent);
                        if now >= overdue {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!(
                                    "no PONG within the response timeout ({:?}): the \
                                     connection went silent",
                                    inner.response_timeout
                                ),
                            ));
                        }
                        overdue
                    }
                    None => {
                        let due = self.last_rx.checked_add(inner.ping_interval).unwrap_or(now);
                        if now >= due {
                            if !out.ping(now) {
                                return Err(io::Error::new(
                                    io::ErrorKind::NotConnected,
                                    "the connection was taken down",
                                ));
                            }
                            drop(out);
                            inner.flush();
                            continue;
                        }
                        due
                    }
                }
            };
            let wait = next
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            self.stream.set_read_timeout(Some(wait))?;
            match self.stream.read(buf) {
                Ok(n) => {
                    if n > 0 {
                        self.last_rx = Instant::now();
                    }
                    return Ok(n);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The waiters of one lock name on one channel, and their wake-ups.
struct Latch {
    state: Mutex<LatchState>,
    /// How many waiters a message wakes.
    rule: WakeRule,
}

/// One subscription's own wake-up: a waiter sleeps on its own condition
/// variable (with the latch's lock), so that a wake-up for one waiter
/// wakes that one alone.
#[derive(Default)]
struct Sleeper {
    cv: Condvar,
    /// Set by [`Poker::poke`] (under the latch's lock), taken by the
    /// waiter.
    poked: AtomicBool,
}

/// How many of one name's waiters in this process a message on its channel
/// wakes (a reconnect wakes them all, whatever the rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WakeRule {
    /// One: a lock was released (Redisson's `0`).
    One,
    /// All: a count-down latch reached zero or was deleted.
    All,
    /// By the payload: all for `1` (a write lock released or downgraded:
    /// every reader may go), one for anything else (a read lock released).
    OneOrAll,
    /// All when the payload is a positive count (permits came back; each
    /// waiter tries for what it needs), none otherwise (Redisson's listeners
    /// read the count; a negative one means none are available).
    Permits,
}

impl WakeRule {
    /// The wake-up a message with `payload` gives: `None` for none,
    /// `Some(true)` for every waiter, `Some(false)` for one.
    fn wakes(self, payload: &[u8]) -> Option<bool> {
        match self {
            WakeRule::One => Some(false),
            WakeRule::All => Some(true),
            WakeRule::OneOrAll => Some(payload == b"1"),
            WakeRule::Permits => std::str::from_utf8(payload)
                .ok()
                .and_then(|p| p.trim().parse::<i64>().ok())
                .is_none_or(|n| n > 0)
                .then_some(true),
        }
    }
}

struct LatchState {
    /// Subscriptions of this lock in this process; changed only under the
    /// channel map's lock.
    waiters: usize,
    /// Wake-ups not yet taken, at most one per waiter.
    permits: usize,
    /// Set when Redis refused the channel's SUBSCRIBE.
    failed: Option<redis::RedisError>,
    /// Set when the channel left this node (Cluster): `Some(addr)` when
    /// Redis named the node that has it now.
    moved: Option<Option<String>>,
    /// Waiters of several locks at once (RedLock, MultiLock), told of any
    /// change of this latch.
    watchers: Vec<Weak<Notify>>,
    /// The waiters asleep in [`Subscription::wait_until`], longest first:
    /// a wake-up for one wakes the first.
    sleeping: VecDeque<Arc<Sleeper>>,
}

impl LatchState {
    /// Wakes every sleeping waiter.
    fn wake_all(&mut self) {
        for s in self.sleeping.drain(..) {
            s.cv.notify_one();
        }
    }

    /// Wakes the waiter that has slept longest, if any.
    fn wake_one(&mut self) {
        if let Some(s) = self.sleeping.pop_front() {
            s.cv.notify_one();
        }
    }

    fn tell_watchers(&mut self) {
        self.watchers.retain(|w| match w.upgrade() {
            Some(n) => {
                n.notify();
                true
            }
            None => false,
        });
    }
}

/// Wakes a thread that waits for any of several subscriptions (see
/// [`Subscription::watch`]).
#[derive(Default)]
pub(crate) struct Notify {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Notify {
    fn notify(&self) {
        *self.woken.lock() = true;
        self.cv.notify_all();
    }

    /// Waits until notified or `until`; `true` if notified (and clears it).
    pub(crate) fn wait_until(&self, until: Instant) -> bool {
        let mut woken = self.woken.lock();
        while !*woken {
            if self.cv.wait_until(&mut woken, until).timed_out() {
                break;
            }
        }
        std::mem::replace(&mut *woken, false)
    }
}

impl Latch {
    fn new(rule: WakeRule) -> Latch {
        Latch {
            rule,
            state: Mutex::new(LatchState {
                waiters: 0,
                permits: 0,
                failed: None,
                moved: None,
                watchers: Vec::new(),
                sleeping: VecDeque::new(),
            }),
        }
    }

    /// A release message (one waiter may go) or a reconnect (all retry).
    fn release(&self, all: bool) {
        let mut state = self.state.lock();
        let cap = state.waiters.max(1);
        if all {
            state.permits = cap;
            state.wake_all();
        } else {
            state.permits = (state.permits + 1).min(cap);
            state.wake_one();
        }
        state.tell_watchers();
    }

    /// The subscriber's connection was lost: its waiters take their wait's
    /// bound again (their subscription is not confirmed any more), waiters
    /// of several locks (`watchers`) too.
    fn recheck(&self) {
        let mut state = self.state.lock();
        state.wake_all();
        state.tell_watchers();
    }

    fn moved(&self, to: Option<&str>) {
        let mut state = self.state.lock();
        state.moved = Some(to.map(str::to_owned));
        state.wake_all();
        state.tell_watchers();
    }

    fn fail(&self, e: &redis::RedisError) {
        let mut state = self.state.lock();
        // The first refusal stands (the lock's release channel comes first).
        if state.failed.is_none() {
            state.failed = Some(e.clone());
        }
        state.wake_all();
        state.tell_watchers();
    }
}

/// One subscribed channel: the SUBSCRIBE that created it and a latch per lock
/// name waited on over it.
struct Channel {
    name: String,
    /// Sequence number of the SUBSCRIBE that created this entry.
    sub_seq: u64,
    /// Redis acknowledged its SUBSCRIBE on the current connection: a
    /// release published from now on reaches this process. Cleared when the
    /// connection is lost or replaced, set again by the new acknowledgement.
    confirmed: AtomicBool,
    /// Keyed by lock name; changed only under the channel map's lock.
    latches: Mutex<HashMap<String, Arc<Latch>>>,
}

impl Channel {
    fn latches(&self) -> Vec<Arc<Latch>> {
        self.latches.lock().values().cloned().collect()
    }
}

/// What a reply on the current connection answers, in the order sent.
enum Sent {
    /// A numbered command; `Some` for a SUBSCRIBE.
    Command {
        seq: u64,
        subscribe: Option<Arc<Channel>>,
    },
    /// An UNSUBSCRIBE of the channel named (its reply looks like the
    /// `sunsubscribe` Redis pushes when a slot migrates).
    Unsubscribe {
        seq: u64,
        channel: String,
    },
    Ping,
}

struct Outbox {
    buf: Vec<u8>,
    next_seq: u64,
    /// Commands queued or written on the current connection whose reply has
    /// not come yet.
    sent: VecDeque<Sent>,
    /// When the PING awaiting its PONG was queued.
    ping_sent: Option<Instant>,
    stream: Option<Arc<Stream>>,
}

impl Outbox {
    /// Queues a numbered command; returns its sequence number. Callers of
    /// SUBSCRIBE and UNSUBSCRIBE hold the channel map's lock, so commands for
    /// one channel are queued in map order. Without a
    /// connection it is only numbered: the next connection starts with every
    /// number used so far acknowledged and subscribes every channel anew.
    fn push(&mut self, cmd: &[u8], subscribe: Option<Arc<Channel>>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.stream.is_some() {
            self.buf.extend_from_slice(cmd);
            self.sent.push_back(Sent::Command { seq, subscribe });
        }
        seq
    }

    /// Queues the UNSUBSCRIBE of `channel` (see [`push`](Outbox::push)).
    fn push_unsubscribe(&mut self, cmd: &[u8], channel: &str) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.stream.is_some() {
            self.buf.extend_from_slice(cmd);
            self.sent.push_back(Sent::Unsubscribe {
                seq,
                channel: channel.to_owned(),
            });
        }
    }

    /// Queues a PING (unnumbered) unless one is awaiting its PONG; `false`
    /// without a connection.
    fn ping(&mut self, now: Instant) -> bool {
        if self.stream.is_none() {
            return false;
        }
        if self.ping_sent.is_none() {
            self.buf
                .extend_from_slice(&redis::cmd("PING").get_packed_command());
            self.sent.push_back(Sent::Ping);
            self.ping_sent = Some(now);
        }
        true
    }
}

struct Inner {
    target: Target,
    /// On a cluster node: whether channels are sharded (`SSUBSCRIBE`),
    /// decided by the cluster; and channels follow their slot (a channel
    /// that leaves this node, or whose node fails, is handed back to its
    /// waiters to subscribe again where the slot is now).
    cluster: Option<Arc<AtomicBool>>,
    /// Set by [`PubSub::kicker`]'s closure (the master moved): reconnect at
    /// once. The channel wakes a reconnect backoff.
    kicked: AtomicBool,
    kick: (Sender<()>, Receiver<()>),
    connect_timeout: Duration,
    response_timeout: Duration,
    ping_interval: Duration,
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    out: Mutex<Outbox>,
    writing: AtomicBool,
    /// Every command numbered below this has been answered (or voided by a
    /// reconnect).
    acked: Mutex<u64>,
    acked_cv: Condvar,
    shutdown: AtomicBool,
    reconnects: AtomicU64,
    events: Events,
}

/// The subscriber; owned by the client, stops its thread on drop.
pub(crate) struct PubSub {
    inner: Arc<Inner>,
    /// `Some` once the thread runs; dropping the sender stops it.
    thread: Mutex<Option<Sender<()>>>,
}

impl PubSub {
    pub(crate) fn new(
        target: Target,
        connect_timeout: Duration,
        response_timeout: Duration,
        cluster: Option<Arc<AtomicBool>>,
        events: Events,
    ) -> PubSub {
        PubSub {
            inner: Arc::new(Inner {
                events,
                target,
                cluster,
                kicked: AtomicBool::new(false),
                kick: crossbeam_channel::bounded(1),
                connect_timeout,
                response_timeout,
                ping_interval: response_timeout.clamp(MIN_PING_INTERVAL, MAX_PING_INTERVAL),
                channels: Mutex::new(HashMap::new()),
                out: Mutex::new(Outbox {
                    buf: Vec::new(),
                    next_seq: 0,
                    sent: VecDeque::new(),
                    ping_sent: None,
                    stream: None,
                }),
                writing: AtomicBool::new(false),
                acked: Mutex::new(0),
                acked_cv: Condvar::new(),
                shutdown: AtomicBool::new(false),
                reconnects: AtomicU64::new(0),
            }),
            thread: Mutex::new(None),
        }
    }

    /// A closure that makes the subscriber drop its connection and connect
    /// again at once (the master moved); it wakes every waiter once the new
    /// connection has subscribed.
    pub(crate) fn kicker(&self) -> impl Fn() + Send + Sync + 'static {
        let inner = Arc::downgrade(&self.inner);
        move || {
            if let Some(inner) = inner.upgrade() {
                inner.kicked.store(true, Ordering::Release);
                let _ = inner.kick.0.try_send(());
                let stream = inner.out.lock().stream.clone();
                if let Some(s) = stream {
                    s.shutdown();
                }
            }
        }
    }

    /// How many times the subscriber connection was re-established (counting
    /// connections that proved themselves only).
    pub(crate) fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// Number of channels subscribed (with at least one waiter).
    pub(crate) fn channels(&self) -> usize {
        self.inner.channels.lock().len()
    }

    fn ensure_started(&self) -> Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_some() {
            return Ok(());
        }
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let inner = Arc::clone(&self.inner);
        std::thread::Builder::new()
            .name("redlease-pubsub".into())
            .spawn(move || inner.run(rx))
            .map_err(Error::Thread)?;
        *thread = Some(tx);
        Ok(())
    }

    /// Subscribes a waiter of lock `lock` to `channels` (one wake-up for
    /// the lock's waiters of this process, whichever channel brings it) and
    /// waits (until `deadline`, at most one response timeout) for Redis to
    /// confirm. An unconfirmed subscription still works once the connection
    /// is back (it is sent again then); until then waits are bounded by the
    /// holder's lease, and the connection is checked with a PING at once.
    ///
    /// Errors: Redis refused a SUBSCRIBE (the message names the channel and
    /// what to grant), or the subscriber thread cannot start.
    pub(crate) fn subscribe(
        &self,
        channels: &[&str],
        lock: &str,
        rule: WakeRule,
        deadline: Option<Instant>,
    ) -> Result<Subscription> {
        self.ensure_started()?;
        let inner = &*self.inner;
        let (chans, latch, created) = {
            let mut map = inner.channels.lock();
            let mut chans: Vec<Arc<Channel>> = Vec::with_capacity(channels.len());
            let mut created = false;
            for channel in channels {
                let chan = match map.get(*channel) {
                    Some(c) => Arc::clone(c),
                    None => {
                        let cmd = inner.command(true, channel);
                        let mut out = inner.out.lock();
                        let c = Arc::new(Channel {
                            name: (*channel).to_owned(),
                            sub_seq: out.next_seq,
                            confirmed: AtomicBool::new(false),
                            latches: Mutex::new(HashMap::new()),
                        });
                        out.push(&cmd, Some(Arc::clone(&c)));
                        drop(out);
                        map.insert((*channel).to_owned(), Arc::clone(&c));
                        created = true;
                        c
                    }
                };
                chans.push(chan);
            }
            // One latch for the lock over all its channels: the first
            // channel's, unless it has moved (another of its channels left
            // this node first: its waiters are on their way elsewhere).
            let latch = match chans.first() {
                Some(first) => {
                    let mut latches = first.latches.lock();
                    let latch = latches
                        .entry(lock.to_owned())
                        .or_insert_with(|| Arc::new(Latch::new(rule)));
                    if latch.state.lock().moved.is_some() {
                        *latch = Arc::new(Latch::new(rule));
                    }
                    Arc::clone(latch)
                }
                None => Arc::new(Latch::new(rule)),
            };
            for chan in chans.iter().skip(1) {
                chan.latches
                    .lock()
                    .insert(lock.to_owned(), Arc::clone(&latch));
            }
            latch.state.lock().waiters += 1;
            (chans, latch, created)
        };
        if created {
            inner.flush();
            // A cluster node's subscriber idles without channels: wake it.
            let _ = inner.kick.0.try_send(());
        }
        let last_seq = chans.iter().map(|c| c.sub_seq).max().unwrap_or(0);
        let subscription = Subscription {
            inner: Arc::clone(&self.inner),
            channels: chans,
            lock: lock.to_owned(),
            latch,
            sleeper: Arc::new(Sleeper::default()),
            held: Cell::new(false),
            recheck: Cell::new(UNCONFIRMED_RECHECK),
            closed: Cell::new(false),
        };
        let now = Instant::now();
        let mut until = now.checked_add(inner.response_timeout).unwrap_or(now);
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let acked = inner.wait_acked(last_seq, until);
        subscription.check()?;
        if !acked {
            // No answer in time: the link may be silent. Find out now rather
            // than at the next idle PING.
            inner.suspect();
        }
        Ok(subscription)
    }
}

impl Drop for PubSub {
    fn drop(&mut self) {
        if self.inner.cluster.is_some() {
            // A cluster node that serves no slot any more: its waiters
            // subscribe where their slots are now.
            self.inner.move_all();
        }
        self.inner.shutdown.store(true, Ordering::Release);
        // Dropping the sender wakes a backoff wait; shutting the socket down
        // ends a blocking read.
        self.thread.lock().take();
        if let Some(s) = self.inner.out.lock().stream.take() {
            s.shutdown();
        }
    }
}

/// What ended a wait on a subscription.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A release message or a reconnect: retry.
    Woken,
    TimedOut,
    /// The channel is no longer served by this subscriber (Cluster): it
    /// moved to the node named, if Redis named one.
    Moved(Option<String>),
    /// Woken by this subscription's [`Poker`], for this waiter alone.
    Poked,
}

/// Wakes one waiter's [`Subscription::wait_until`] (with [`Wake::Poked`]),
/// and no other waiter of its lock; from any thread, while the
/// subscription lasts (after, it does nothing).
pub(crate) struct Poker {
    latch: Arc<Latch>,
    sleeper: Arc<Sleeper>,
}

impl Poker {
    /// How many waiters of its lock this process has (subscriptions, of
    /// any kind: a MultiLock's member too).
    pub(crate) fn waiters(&self) -> usize {
        self.latch.state.lock().waiters
    }

    /// Whether `other` wakes a waiter of the same lock's latch.
    pub(crate) fn same_latch(&self, other: &Poker) -> bool {
        Arc::ptr_eq(&self.latch, &other.latch)
    }

    /// Wakes the waiter, now if it sleeps, else at its next wait.
    pub(crate) fn poke(&self) {
        let mut state = self.latch.state.lock();
        self.sleeper.poked.store(true, Ordering::Relaxed);
        state.sleeping.retain(|s| !Arc::ptr_eq(s, &self.sleeper));
        self.sleeper.cv.notify_one();
    }
}

/// A waiter's subscription to one lock's release channel (and its
/// process's wake-up channel, if any); unsubscribes on drop, and passes on a
/// wake-up it took but did not use.
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    /// Never empty: the lock's channel first.
    channels: Vec<Arc<Channel>>,
    lock: String,
    latch: Arc<Latch>,
    /// This waiter's own wake-up.
    sleeper: Arc<Sleeper>,
    /// A wake-up was taken and its retry has not been answered yet.
    held: Cell<bool>,
    /// The next re-check while the subscription is not confirmed.
    recheck: Cell<Duration>,
    /// Ended by [`close`](Subscription::close) (dropping it does nothing
    /// more).
    closed: Cell<bool>,
}

impl Subscription {
    /// Waits for a wake-up (a release message on this lock's channel, or a
    /// reconnect) until `until`. [`Wake::Woken`]: the waiter now holds the
    /// wake-up and calls [`used`](Subscription::used) once its retry got an
    /// answer from Redis. A wake-up still held when the subscription is
    /// dropped is passed on to another waiter of the same lock in this
    /// process, if any. [`Wake::Moved`]: the channel left this node (a
    /// cluster slot moved, or the node failed); subscribe again through the
    /// router.
    ///
    /// Errors: Redis refused the channel's SUBSCRIBE.
    ///
    /// While the subscription is not confirmed the wait ends sooner, with
    /// [`Wake::TimedOut`] (see [`bound`](Subscription::bound)); the bound
    /// is taken again whenever the subscriber's connection is lost.
    pub(crate) fn wait_until(&self, until: Instant) -> Result<Wake> {
        // Waiting again means the retry after the last wake-up was answered.
        self.held.set(false);
        let mut state = self.latch.state.lock();
        // Taken once: a wake (a lost connection) may bring the re-check
        // forward, never push it back (a link that keeps dropping would
        // otherwise postpone it again and again).
        let mut at = self.bound(until);
        let me = &self.sleeper;
        loop {
            if me.poked.swap(false, Ordering::Relaxed) {
                return Ok(self.poked(&mut state));
            }
            if let Some(wake) = self.take(&mut state)? {
                return Ok(wake);
            }
            state.sleeping.push_back(Arc::clone(me));
            let timed_out = me.cv.wait_until(&mut state, at).timed_out();
            // Still listed unless a wake-up took it off.
            state.sleeping.retain(|s| !Arc::ptr_eq(s, me));
            if timed_out {
                if me.poked.swap(false, Ordering::Relaxed) {
                    return Ok(self.poked(&mut state));
                }
                return Ok(self.take(&mut state)?.unwrap_or(Wake::TimedOut));
            }
            if at == until && !self.confirmed() {
                at = self.bound(until);
            }
        }
    }

    /// A poke ends this wait: a wake-up for one waiter that may have
    /// picked this one goes to another.
    fn poked(&self, state: &mut LatchState) -> Wake {
        if state.permits > 0 {
            state.wake_one();
        }
        Wake::Poked
    }

    /// Forgets a poke not waited for yet (its cause was taken otherwise).
    pub(crate) fn unpoke(&self) {
        self.sleeper.poked.store(false, Ordering::Relaxed);
    }

    /// What wakes this waiter alone (see [`Poker`]).
    pub(crate) fn poker(&self) -> Poker {
        Poker {
            latch: Arc::clone(&self.latch),
            sleeper: Arc::clone(&self.sleeper),
        }
    }

    /// `until`, or sooner while the subscription is not confirmed (its
    /// SUBSCRIBE not acknowledged yet, or its connection lost or replaced
    /// since): a waiter must not count on a message that may never come, so
    /// it tries again after [`UNCONFIRMED_RECHECK`], doubling at each wait
    /// up to the response timeout. Once confirmed, `until` stands: on a
    /// healthy link a waiter waits for the message.
    pub(crate) fn bound(&self, until: Instant) -> Instant {
        if self.confirmed() {
            self.recheck.set(UNCONFIRMED_RECHECK);
            return until;
        }
        let d = self.recheck.get();
        let cap = self.inner.response_timeout.max(UNCONFIRMED_RECHECK);
        self.recheck.set(d.saturating_mul(2).min(cap));
        let now = Instant::now();
        now.checked_add(jitter(d, 0.25))
            .map_or(until, |at| at.min(until))
    }

    /// What happened to this subscription, if anything: a refusal, a move,
    /// or a wake-up (taken).
    fn take(&self, state: &mut LatchState) -> Result<Option<Wake>> {
        if let Some(e) = &state.failed {
            return Err(Error::Redis(e.clone()));
        }
        if let Some(to) = &state.moved {
            return Ok(Some(Wake::Moved(to.clone())));
        }
        if state.permits > 0 {
            state.permits -= 1;
            self.held.set(true);
            return Ok(Some(Wake::Woken));
        }
        Ok(None)
    }

    /// Has `notify` told of every change of this subscription (a release
    /// message, a reconnect, a move, a refusal), for a thread that waits for
    /// any of several; it then calls [`try_take`](Subscription::try_take).
    pub(crate) fn watch(&self, notify: &Arc<Notify>) {
        let mut state = self.latch.state.lock();
        state.watchers.retain(|w| w.strong_count() > 0);
        state.watchers.push(Arc::downgrade(notify));
        if state.permits > 0 || state.moved.is_some() || state.failed.is_some() {
            notify.notify();
        }
    }

    /// [`wait_until`](Subscription::wait_until) without waiting: `None` if
    /// nothing happened.
    pub(crate) fn try_take(&self) -> Result<Option<Wake>> {
        self.held.set(false);
        let mut state = self.latch.state.lock();
        self.take(&mut state)
    }

    /// The retry after the last wake-up got an answer: nothing to pass on.
    pub(crate) fn used(&self) {
        self.held.set(false);
    }

    /// Whether Redis acknowledged every channel's SUBSCRIBE on the current
    /// connection.
    fn confirmed(&self) -> bool {
        self.channels
            .iter()
            .all(|c| c.confirmed.load(Ordering::Acquire))
    }

    /// Other waiters of this lock in this process wait too.
    pub(crate) fn others_waiting(&self) -> bool {
        self.latch.state.lock().waiters > 1
    }

    fn check(&self) -> Result<()> {
        match &self.latch.state.lock().failed {
            Some(e) => Err(Error::Redis(e.clone())),
            None => Ok(()),
        }
    }
}

impl Subscription {
    /// Ends the subscription, as dropping it does; `true` if no other
    /// waiter of its lock is left in this process (decided under the
    /// subscriber's lock: of several waiters that end at once, one is last).
    pub(crate) fn close(self) -> bool {
        self.end() == 0
    }

    /// Unsubscribes this waiter; the waiters of its lock left in this
    /// process (`usize::MAX` once ended before).
    fn end(&self) -> usize {
        if self.closed.replace(true) {
            return usize::MAX;
        }
        let inner = &*self.inner;
        let (queued, remaining) = {
            let mut map = inner.channels.lock();
            let remaining = {
                let mut state = self.latch.state.lock();
                state.waiters = state.waiters.saturating_sub(1);
                if self.held.get() && state.waiters > 0 && state.failed.is_none() {
                    // The wake-up was not used (the retry failed): another
                    // waiter of this lock may find it free.
                    state.permits = (state.permits + 1).min(state.waiters);
                    state.wake_one();
                }
                state.waiters
            };
            let mut queued = false;
            for channel in &self.channels {
                let mut latches = channel.latches.lock();
                if remaining == 0
                    && latches
                        .get(&self.lock)
                        .is_some_and(|l| Arc::ptr_eq(l, &self.latch))
                {
                    latches.remove(&self.lock);
                }
                if latches.is_empty()
                    && map
                        .get(&channel.name)
                        .is_some_and(|c| Arc::ptr_eq(c, channel))
                {
                    map.remove(&channel.name);
                    let cmd = inner.command(false, &channel.name);
                    inner.out.lock().push_unsubscribe(&cmd, &channel.name);
                    queued = true;
                }
            }
            (queued, remaining)
        };
        if queued {
            inner.flush();
        }
        remaining
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.end();
    }
}

enum Reply {
    /// The reply to a SUBSCRIBE (or SSUBSCRIBE).
    Ack,
    /// An `unsubscribe` (or `sunsubscribe`) of the channel named: the reply
    /// to our UNSUBSCRIBE, or pushed by Redis when the channel's slot
    /// migrates.
    Unsubscribed(String),
    /// The reply to a PING (`+PONG`, or `pong` in subscribed mode).
    Pong,
    /// An error reply to whatever command is next in line.
    Refused(redis::ServerError),
    /// A message: its channel and payload.
    Message(String, Vec<u8>),
    Other,
}

fn classify(v: redis::Value) -> Reply {
    let items = match v {
        redis::Value::Array(items) => items,
        redis::Value::Push { kind, data } => {
            let mut items = vec![redis::Value::BulkString(kind.to_string().into_bytes())];
            items.extend(data);
            items
        }
        redis::Value::SimpleString(s) if s.eq_ignore_ascii_case("pong") => return Reply::Pong,
        redis::Value::ServerError(e) => return Reply::Refused(e),
        _ => return Reply::Other,
    };
    let kind = match items.first() {
        Some(redis::Value::BulkString(k)) => k.as_slice(),
        _ => return Reply::Other,
    };
    let channel = || match items.get(1) {
        Some(redis::Value::BulkString(ch)) => String::from_utf8(ch.clone()).ok(),
        _ => None,
    };
    match kind {
        b"subscribe" | b"ssubscribe" => Reply::Ack,
        b"unsubscribe" | b"sunsubscribe" => channel().map_or(Reply::Other, Reply::Unsubscribed),
        b"pong" => Reply::Pong,
        b"message" | b"smessage" => match (channel(), items.get(2)) {
            (Some(ch), Some(redis::Value::BulkString(payload))) => {
                Reply::Message(ch, payload.clone())
            }
            (Some(ch), _) => Reply::Message(ch, Vec::new()),
            _ => Reply::Other,
        },
        _ => Reply::Other,
    }
}

/// `+PONG`, the reply to a PING outside subscribed mode.
fn is_pong(v: &redis::Value) -> bool {
    matches!(v, redis::Value::SimpleString(s) if s.eq_ignore_ascii_case("pong"))
}

/// An error reply as Redis wrote it, e.g. `NOPERM User u has no permissions ...`.
fn server_error_text(e: &redis::ServerError) -> String {
    match e.details() {
        Some(d) => format!("{} {d}", e.code()),
        None => e.code().to_owned(),
    }
}

/// The error the waiters of a refused SUBSCRIBE get.
fn refused_error(channel: &str, e: &redis::ServerError) -> redis::RedisError {
    let kind = e
        .kind()
        .map_or(redis::ErrorKind::Extension, redis::ErrorKind::Server);
    let what = server_error_text(e);
    let hint = if e.code() == "NOPERM" {
        GRANT_HINT
    } else {
        "waiting for this lock needs its release channel"
    };
    redis::RedisError::from((
        kind,
        "redis refused SUBSCRIBE",
        format!("{channel}: {what}; {hint}"),
    ))
}

impl Inner {
    /// The packed (S)SUBSCRIBE or (S)UNSUBSCRIBE of `channel`.
    fn command(&self, subscribe: bool, channel: &str) -> Vec<u8> {
        let sharded = self
            .cluster
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Acquire));
        let verb = match (subscribe, sharded) {
            (true, false) => "SUBSCRIBE",
            (true, true) => "SSUBSCRIBE",
            (false, false) => "UNSUBSCRIBE",
            (false, true) => "SUNSUBSCRIBE",
        };
        redis::cmd(verb).arg(channel).get_packed_command()
    }

    /// The channel left this node (a cluster slot moved, to `to` if Redis
    /// said where): its entry goes (without an UNSUBSCRIBE: Redis dropped
    /// it), and its waiters are told to subscribe again through the router.
    fn move_channel(&self, channel: &Channel, to: Option<&str>) {
        let latches = self.forget(channel);
        log::info!(
            "channel {:?} left this node{}; its waiters follow it",
            channel.name,
            to.map(|a| format!(" for {a}")).unwrap_or_default()
        );
        for latch in latches {
            latch.moved(to);
        }
    }

    /// A cluster node's subscriber lost its connection: every channel is
    /// handed back to its waiters, who subscribe again where their slot is
    /// now (on this node again if it is back).
    fn move_all(&self) {
        let channels: Vec<Arc<Channel>> = self.channels.lock().values().cloned().collect();
        for c in channels {
            self.move_channel(&c, None);
        }
    }

    /// Writes what is queued, unless another thread is already doing so (it
    /// will take our commands too). No lock is held during the write.
    fn flush(&self) {
        loop {
            if self
                .writing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return;
            }
            loop {
                let (buf, stream) = {
                    let mut out = self.out.lock();
                    (std::mem::take(&mut out.buf), out.stream.clone())
                };
                if buf.is_empty() {
                    break;
                }
                // Without a connection the commands are dropped: the reconnect
                // subscribes every channel that still has waiters.
                if let Some(stream) = stream {
                    if let Err(e) = stream.write_all(&buf) {
                        log::debug!("write failed: {e}");
                        stream.shutdown();
                    }
                }
            }
            self.writing.store(false, Ordering::Release);
            if self.out.lock().buf.is_empty() {
                return;
            }
        }
    }

    fn wait_acked(&self, seq: u64, until: Instant) -> bool {
        let mut acked = self.acked.lock();
        while *acked <= seq {
            if self.acked_cv.wait_until(&mut acked, until).timed_out() {
                return *acked > seq;
            }
        }
        true
    }

    fn set_acked(&self, seq: u64) {
        let mut acked = self.acked.lock();
        *acked = (*acked).max(seq + 1);
        self.acked_cv.notify_all();
    }

    /// Checks the connection with a PING now (unless one is on its way).
    fn suspect(&self) {
        let queued = {
            let mut out = self.out.lock();
            out.ping_sent.is_none() && out.ping(Instant::now())
        };
        if queued {
            self.flush();
        }
    }

    /// Removes `channel`'s entry (if it is still this one), so that a later
    /// waiter subscribes anew; returns its latches.
    fn forget(&self, channel: &Channel) -> Vec<Arc<Latch>> {
        let mut map = self.channels.lock();
        if map
            .get(&channel.name)
            .is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), channel))
        {
            map.remove(&channel.name);
        }
        channel.latches()
    }

    /// Redis refused the SUBSCRIBE of `channel`: its waiters get the error
    /// and the entry goes, so that a later waiter tries again.
    fn fail_channel(&self, channel: &Channel, e: &redis::ServerError) {
        let err = refused_error(&channel.name, e);
        warn_limited!("subscribe refused", "{err}");
        let latches = self.forget(channel);
        for latch in latches {
            latch.fail(&err);
        }
    }

    fn run(self: Arc<Self>, stop: Receiver<()>) {
        let mut backoff = MIN_BACKOFF;
        let mut connected_before = false;
        let mut last_fast: Option<Instant> = None;
        let mut pause: Option<Duration> = None;
        while !self.shutdown.load(Ordering::Acquire) {
            if self.cluster.is_some() && self.channels.lock().is_empty() {
                // A cluster node's subscriber connects only for channels
                // (a node that failed is not dialled on and on); a new
                // channel kicks it.
                crossbeam_channel::select! {
                    recv(stop) -> _ => break,
                    recv(self.kick.1) -> _ => {}
                }
                if self.channels.lock().is_empty() {
                    continue;
                }
            }
            if let Some(d) = pause.take() {
                // Only a moved master ends the back-off early; a new
                // channel's kick waits for it (a server that drops us after
                // each SUBSCRIBE must not be dialled more often).
                let until = Instant::now() + d;
                let mut stopped = false;
                loop {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    crossbeam_channel::select! {
                        recv(stop) -> _ => {
                            stopped = true;
                            break;
                        }
                        recv(self.kick.1) -> _ => {
                            if self.kicked.load(Ordering::Acquire) {
                                break;
                            }
                        }
                        default(left) => break,
                    }
                }
                if stopped {
                    break;
                }
                continue;
            }
            match self.connect() {
                Ok((stream, parser)) => {
                    if connected_before {
                        self.reconnects.fetch_add(1, Ordering::Relaxed);
                        log::info!("reconnected to redis");
                        if self.events.is_on() {
                            self.events.subscriber_reconnected(&self.target.describe());
                        }
                    }
                    connected_before = true;
                    let err = self.serve(&stream, parser);
                    stream.shutdown();
                    if self.shutdown.load(Ordering::Acquire) {
                        break;
                    }
                    if self.cluster.is_some() {
                        // The node failed, or its link did: the waiters
                        // find where their slots are now.
                        self.move_all();
                    }
                    if self.kicked.swap(false, Ordering::AcqRel) {
                        // The master moved: go to the new one now.
                        while self.kick.1.try_recv().is_ok() {}
                        backoff = MIN_BACKOFF;
                        log::info!("the master moved; reconnecting");
                        continue;
                    }
                    // The connection had proven itself: replace it at once,
                    // unless that was done less than a second ago (a server
                    // that answers and then drops us must not make us spin).
                    let now = Instant::now();
                    if last_fast.is_none_or(|t| now.duration_since(t) >= FAST_RECONNECT_EVERY) {
                        last_fast = Some(now);
                        backoff = MIN_BACKOFF;
                        warn_limited!(
                            "pubsub connection lost",
                            "connection lost ({err}); reconnecting"
                        );
                    } else {
                        let d = jitter(backoff, 0.5);
                        warn_limited!(
                            "pubsub connection lost",
                            "connection lost ({err}); reconnecting in {d:?}"
                        );
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        pause = Some(d);
                    }
                }
                Err(e) => {
                    self.target.suspect();
                    if self.cluster.is_some() {
                        self.move_all();
                    }
                    let d = jitter(backoff, 0.5);
                    warn_limited!("pubsub connect", "{e}; retrying in {d:?}");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    pause = Some(d);
                }
            }
        }
        log::debug!("stopped");
    }

    /// Connects and has the connection prove itself: AUTH (if configured)
    /// and PING, both answered within the response timeout. On failure,
    /// returns what to log.
    fn connect(&self) -> std::result::Result<(Arc<Stream>, redis::Parser), String> {
        let ping = redis::cmd("PING").get_packed_command();
        let endpoint = self
            .target
            .endpoint()
            .map_err(|e| format!("cannot find redis ({e})"))?;
        let (stream, parser, replies) = endpoint
            .connect(
                self.connect_timeout,
                self.response_timeout,
                &[("PING", ping)],
            )
            .map_err(|e| format!("cannot connect to redis at {} ({e})", endpoint.addr))?;
        if !replies.first().is_some_and(is_pong) {
            return Err("unexpected reply to PING from redis".to_owned());
        }
        // Reads are bounded by the liveness checks from here on; writes stay
        // bounded by the response timeout.
        Ok((Arc::new(stream), parser))
    }

    /// Subscribes every channel with waiters on the new connection, then reads
    /// until the connection fails; returns that failure.
    fn serve(&self, stream: &Arc<Stream>, mut parser: redis::Parser) -> redis::RedisError {
        let resubscribed_at = {
            let map = self.channels.lock();
            let mut out = self.out.lock();
            out.buf.clear();
            out.sent.clear();
            out.ping_sent = None;
            out.stream = Some(Arc::clone(stream));
            // Whatever was queued for the old connection is void: let its
            // waiters go (they retry and then wait bounded by the lease).
            {
                let mut acked = self.acked.lock();
                *acked = out.next_seq;
                self.acked_cv.notify_all();
            }
            // In the order they were first subscribed: a lock's release
            // channel before its waiters' wake-up channel, so that a refusal
            // of both names the release channel first.
            let mut channels: Vec<&Arc<Channel>> = map.values().collect();
            channels.sort_by_key(|c| c.sub_seq);
            for c in channels {
                c.confirmed.store(false, Ordering::Release);
                out.push(&self.command(true, &c.name), Some(Arc::clone(c)));
            }
            (!map.is_empty()).then_some(out.next_seq)
        };
        if self.shutdown.load(Ordering::Acquire) || self.kicked.load(Ordering::Acquire) {
            // Stopping, or the master moved while this connection was being
            // made (it may be to the old one): go round again.
            stream.shutdown();
        }
        self.flush();
        let mut pending_wake = resubscribed_at;
        let mut reader = LiveReader {
            inner: self,
            stream,
            last_rx: Instant::now(),
        };
        let err = loop {
            let value = match parser.parse_value(&mut reader) {
                Ok(v) => v,
                Err(e) => break e,
            };
            let reply = classify(value);
            let answered = match reply {
                Reply::Message(name, payload) => {
                    let channel = self.channels.lock().get(&name).cloned();
                    if let Some(c) = channel {
                        // The payload does not say which name it is about:
                        // the waiters of each name on the channel retry, as
                        // many as its rule says.
                        for latch in c.latches() {
                            if let Some(all) = latch.rule.wakes(&payload) {
                                latch.release(all);
                            }
                        }
                    }
                    continue;
                }
                Reply::Other => continue,
                Reply::Unsubscribed(ref name) => {
                    // Ours if the next reply due is to our UNSUBSCRIBE of
                    // that channel; else Redis pushed it: the channel's slot
                    // migrated away from this node.
                    let mut out = self.out.lock();
                    let ours = matches!(
                        out.sent.front(),
                        Some(Sent::Unsubscribe { channel, .. }) if channel == name
                    );
                    if ours {
                        out.sent.pop_front()
                    } else {
                        drop(out);
                        let channel = self.channels.lock().get(name).cloned();
                        if let Some(c) = channel {
                            self.move_channel(&c, None);
                        }
                        continue;
                    }
                }
                Reply::Ack | Reply::Pong | Reply::Refused(_) => {
                    let mut out = self.out.lock();
                    let front = out.sent.pop_front();
                    if matches!(front, Some(Sent::Ping)) {
                        // Any answer to the PING shows the link is alive.
                        out.ping_sent = None;
                    }
                    front
                }
            };
            match (reply, answered) {
                (Reply::Ack, Some(Sent::Command { seq, subscribe })) => {
                    if let Some(c) = subscribe {
                        c.confirmed.store(true, Ordering::Release);
                    }
                    self.set_acked(seq)
                }
                (Reply::Unsubscribed(_), Some(Sent::Unsubscribe { seq, .. })) => {
                    self.set_acked(seq)
                }
                (Reply::Refused(e), Some(Sent::Command { seq, subscribe })) => {
                    match subscribe {
                        // The channel's slot is served elsewhere (Cluster):
                        // its waiters follow it.
                        Some(c) if e.code() == "MOVED" => {
                            let to = e.details().and_then(|d| d.split_whitespace().nth(1));
                            self.move_channel(&c, to);
                        }
                        // A cluster failing over or reconfiguring: the
                        // waiters subscribe again (where the slot is then)
                        // rather than fail.
                        Some(c)
                            if self.cluster.is_some()
                                && matches!(
                                    e.code(),
                                    "CLUSTERDOWN" | "TRYAGAIN" | "LOADING" | "MASTERDOWN"
                                ) =>
                        {
                            self.move_channel(&c, None);
                        }
                        Some(c) => self.fail_channel(&c, &e),
                        None => warn_limited!("pubsub refused", "redis refused a command ({e})"),
                    }
                    self.set_acked(seq);
                }
                (Reply::Refused(e), Some(Sent::Unsubscribe { seq, .. })) => {
                    warn_limited!("unsubscribe refused", "redis refused UNSUBSCRIBE ({e})");
                    self.set_acked(seq);
                }
                (Reply::Pong, Some(Sent::Ping)) => {}
                (Reply::Refused(e), Some(Sent::Ping)) => {
                    log::debug!("redis refused PING ({e})");
                }
                _ => {
                    break redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "reply out of order on the subscriber connection",
                    ))
                }
            }
            if pending_wake.is_some_and(|at| *self.acked.lock() >= at) {
                pending_wake = None;
                // A release may have been published while we were away:
                // every waiter retries once.
                let channels: Vec<_> = self.channels.lock().values().cloned().collect();
                for c in channels {
                    for latch in c.latches() {
                        latch.release(true);
                    }
                }
            }
        };
        {
            let mut out = self.out.lock();
            if out.stream.as_ref().is_some_and(|s| Arc::ptr_eq(s, stream)) {
                out.stream = None;
                out.buf.clear();
                out.sent.clear();
                out.ping_sent = None;
            }
        }
        // No message reaches this process until the next connection's
        // SUBSCRIBEs are acknowledged: every waiter re-checks on its own
        // until its subscription is confirmed again (the acknowledgement
        // then wakes them all, for a release missed meanwhile).
        let channels: Vec<_> = self.channels.lock().values().cloned().collect();
        for c in channels {
            c.confirmed.store(false, Ordering::Release);
            for latch in c.latches() {
                latch.recheck();
            }
        }
        err
    }
}
