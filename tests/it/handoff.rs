//! The reentrant lock's queue of waiting processes (each `Client` here
//! stands for a process: its own client id, subscriber and wake-up channel):
//! a release wakes one queued client, not every waiting one; a waiter whose
//! try fails after its client was woken passes the wake-up on; a queued
//! client that is gone (no subscriber) is skipped; Redisson's waiters are
//! woken by the release that leaves nobody queued; nothing is left behind.
//!
//! Each test fails on the code before the part it pins: without the queue
//! every waiting client tries at each release; without leave.lua a waiter
//! behind one whose tries fail sleeps until the holder's lease; without the
//! subscriber count a release wakes a client that is gone and nobody else.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::{Client, LockGuard};

use crate::faults_common::{figure, is_acquire_of, warm_subscriber, Monitor};
use crate::support::{wait_until, Fault, Proxy, RedisServer};

pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// A hand-off by a release message comes well within this; every holder's
/// lease here is 30 s, so only a message explains an acquisition inside it.
const HANDOFF_BOUND: Duration = Duration::from_secs(5);

pub(crate) fn client(url: &str) -> Client {
    Client::builder(url)
        .watchdog_timeout(Duration::from_secs(30))
        .build()
        .expect("client connects to the test server")
}

/// What Redis hashes of `name` (its hash tag, or all of it).
fn tag(name: &str) -> &str {
    match (name.find('{'), name.find('}')) {
        (Some(open), Some(close)) if close > open + 1 => &name[open + 1..close],
        _ => name,
    }
}

pub(crate) fn queue(name: &str) -> String {
    format!("redlease_waiting:{{{}}}:{name}", tag(name))
}

pub(crate) fn wake_channel(name: &str, c: &Client) -> String {
    format!("redlease_wake:{{{}}}:{name}:{}", tag(name), c.id())
}

/// Waits for the lock on another thread: sends `(index, acquired at)` (or
/// `None` at the deadline), then holds it until told (or 30 s).
pub(crate) fn spawn_waiter(
    c: &Client,
    name: &'static str,
    index: usize,
    wait: Duration,
    tx: &mpsc::Sender<(usize, Option<Instant>)>,
) -> mpsc::Sender<()> {
    let lock = c.lock(name);
    let tx = tx.clone();
    let (go, go_rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        // An error counts as not acquired.
        let got = lock.try_lock_for(wait).ok().flatten();
        let _ = tx.send((index, got.as_ref().map(|_| Instant::now())));
        if got.is_some() {
            let _ = go_rx.recv_timeout(Duration::from_secs(30));
        }
        drop(got);
    });
    go
}

/// What a waiter of [`spawn_waiter`] sends: its index, and when it got the
/// lock (`None`: it did not).
pub(crate) type Returned = (usize, Option<Instant>);

/// A holder and a patient client on the server, a failing client through a
/// proxy (response timeout 500 ms), their subscribers warmed up.
pub(crate) struct Rig {
    pub(crate) holder: Client,
    pub(crate) failing: Client,
    pub(crate) patient: Client,
    pub(crate) proxy: Proxy,
    // Last: the server goes after the clients.
    pub(crate) srv: RedisServer,
}

impl Rig {
    /// The holder takes `name`; then `failing` waiters of the failing client
    /// (numbered from 0, each waiting `wait`) and one of the patient client
    /// (numbered `failing`, waiting 25 s) queue behind it, in that order.
    /// The holder's guard, the waiters' results (see [`spawn_waiter`]), and
    /// what tells the patient waiter to release.
    pub(crate) fn queue_up(
        &self,
        name: &'static str,
        failing: usize,
        wait: Duration,
    ) -> (LockGuard, mpsc::Receiver<Returned>, mpsc::Sender<()>) {
        let g = self.holder.lock(name).lock().expect("holder");
        let mut monitor = Monitor::start(&self.srv);
        let (tx, rx) = mpsc::channel();
        for i in 0..failing {
            // Not told to hold on: each releases once it has the lock.
            let _ = spawn_waiter(&self.failing, name, i, wait, &tx);
        }
        // Each failing waiter made its first try and its queued one.
        monitor.wait_for(
            "the failing client's waiters subscribed and queued",
            |l| is_acquire_of(l, name) && l.contains(self.failing.id()),
            2 * failing,
        );
        wait_until("the failing client queued", WAIT, || {
            !self
                .srv
                .cmd(&["ZSCORE", &queue(name), &wake_channel(name, &self.failing)])
                .is_empty()
        });
        let go = spawn_waiter(&self.patient, name, failing, Duration::from_secs(25), &tx);
        wait_until("both clients queued", WAIT, || {
            self.srv.cmd(&["ZCARD", &queue(name)]) == "2"
        });
        (g, rx, go)
    }
}

pub(crate) fn rig() -> Rig {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let holder = client(&srv.url());
    let failing = Client::builder(proxy.url())
        .response_timeout(Duration::from_millis(500))
        .build()
        .expect("client through the proxy");
    let patient = client(&srv.url());
    warm_subscriber(&holder, &failing);
    warm_subscriber(&holder, &patient);
    Rig {
        holder,
        failing,
        patient,
        proxy,
        srv,
    }
}

#[test]
fn a_release_wakes_one_queued_client_not_every_waiting_one() {
    const NAME: &str = "q:one";
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let waiters: Vec<Client> = (0..3).map(|_| client(&srv.url())).collect();
    for w in &waiters {
        warm_subscriber(&holder, w);
    }
    let mut monitor = Monitor::start(&srv);
    let g = holder.lock(NAME).lock().expect("holder");
    let (tx, rx) = mpsc::channel();
    let go: Vec<_> = waiters
        .iter()
        .enumerate()
        .map(|(i, w)| spawn_waiter(w, NAME, i, Duration::from_secs(20), &tx))
        .collect();
    wait_until("three clients queued", WAIT, || {
        srv.cmd(&["ZCARD", &queue(NAME)]) == "3"
    });
    let mut released = Instant::now();
    drop(g);
    for n in 0..3 {
        let (i, at) = rx.recv_timeout(HANDOFF_BOUND * 2).expect("a hand-off");
        let at = at.unwrap_or_else(|| panic!("waiter {i} gave up"));
        assert!(
            at - released < HANDOFF_BOUND,
            "hand-off {n} took {:?}",
            at - released
        );
        released = Instant::now();
        go[i].send(()).expect("release");
    }
    wait_until("the last holder's release", WAIT, || {
        srv.cmd(&["EXISTS", NAME]) == "0"
    });
    assert_eq!(srv.cmd(&["EXISTS", &queue(NAME)]), "0", "the queue is gone");

    // Each waiter tried three times: at first, once subscribed (queued),
    // and once woken. With every waiting client woken by every release, the
    // two left after the first release would have tried again then, and
    // the last one after the second too.
    let lines = monitor.lines_until_echo(&srv, "end-of-q-one");
    for (i, w) in waiters.iter().enumerate() {
        let tries = lines
            .iter()
            .filter(|l| is_acquire_of(l, NAME) && l.contains(w.id()))
            .count();
        assert_eq!(tries, 3, "waiter {i}'s acquire attempts");
    }
}

/// The SHA1 of the script made of `parts` (queue_lib.lua first), as its
/// EVALSHA carries it.
fn sha(parts: &[&str]) -> Vec<u8> {
    redis::Script::new(&parts.concat())
        .get_hash()
        .as_bytes()
        .to_vec()
}

const QUEUE_LIB: &str = include_str!("../../src/scripts/queue_lib.lua");

pub(crate) fn acquire_sha() -> Vec<u8> {
    sha(&[QUEUE_LIB, include_str!("../../src/scripts/acquire.lua")])
}

fn leave_sha() -> Vec<u8> {
    sha(&[
        QUEUE_LIB,
        include_str!("../../src/scripts/queue_wake.lua"),
        include_str!("../../src/scripts/leave.lua"),
    ])
}

#[test]
fn a_woken_waiter_whose_tries_fail_passes_its_wake_up_on() {
    woken_client_fails_and_passes_on("q:failing", false);
}

/// The woken process's tries and its first leave all get no answer (its
/// link went silent): the leave is retried in the background until it runs,
/// and passes the wake-up on. (Found by review: a leave tried once left the
/// other process asleep until its deadline.)
#[test]
fn a_lost_leave_is_retried_and_passes_the_wake_up_on() {
    woken_client_fails_and_passes_on("q:silent-link", true);
}

/// A failing client (through a proxy, waiting 20 s) queued first in line
/// (its entry runs out first) and a patient client (25 s) wait. While the
/// rule stands, every try of the failing one gets no answer: the release
/// wakes it, and it waits on within its bound, but its process leaves the
/// queue and so passes its wake-up on (`lose_leave`: the leave's first try
/// is lost too). The patient one must get the lock soon after the release:
/// without the wake-up passed on it would wait until the failing one gave
/// up at its deadline, or for the holder's 30 s lease. Once the rule is
/// gone, the failing one takes the lock after the patient one: it rode its
/// failed tries out.
fn woken_client_fails_and_passes_on(name: &'static str, lose_leave: bool) {
    let r = rig();
    let proxy = &r.proxy;
    let (g, rx, go_patient) = r.queue_up(name, 1, Duration::from_secs(20));
    let tried = proxy.add_rule(&acquire_sha(), Fault::BlackHole, usize::MAX);
    let left = lose_leave.then(|| proxy.add_rule(&leave_sha(), Fault::BlackHole, 1));

    let released = Instant::now();
    drop(g);
    let (first, at) = rx.recv_timeout(WAIT).expect("a waiter returns");
    assert_eq!(first, 1, "the patient waiter returns first");
    let at = at.expect("the patient waiter got the lock");
    assert!(
        proxy.hits(tried) >= 1,
        "the failing client was woken and tried"
    );
    if let Some(left) = left {
        assert_eq!(proxy.hits(left), 1, "the first leave was lost");
    }
    let took = at.saturating_duration_since(released);
    assert!(
        took < HANDOFF_BOUND,
        "the wake-up was passed on ({took:?} after the release)"
    );
    figure(&format!(
        "{name}: the woken client's tries fail; the other client took the lock {} ms \
         after the release (failing client's response timeout 500 ms)",
        took.as_millis()
    ));

    proxy.remove_rule(tried);
    go_patient.send(()).expect("the patient waiter releases");
    let (second, at) = rx.recv_timeout(WAIT).expect("the failing waiter returns");
    assert_eq!(second, 0);
    assert!(
        at.is_some(),
        "the failing waiter rode its failed tries out and got the lock"
    );
}

#[test]
fn a_queued_client_that_is_gone_is_skipped() {
    dead_client_is_skipped("q:gone", false);
}

/// A pattern subscriber (a monitoring tool's `PSUBSCRIBE *`) does not make a
/// dead process look alive: its own channel's subscribers are counted.
/// (Found by review: PUBLISH counted the pattern, and nobody was woken.)
#[test]
fn a_pattern_subscriber_does_not_make_a_dead_client_look_alive() {
    dead_client_is_skipped("q:pattern", true);
}

/// A client that queued and died (its entry first in line, nobody on its
/// channel; `pattern`: a `PSUBSCRIBE *` on the server) is skipped, and the
/// live waiter behind it is woken by the release, not the holder's lease.
fn dead_client_is_skipped(name: &'static str, pattern: bool) {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let waiter = client(&srv.url());
    warm_subscriber(&holder, &waiter);
    let mut mon = srv.conn();
    let mut psub = mon.as_pubsub();
    if pattern {
        psub.psubscribe("*").expect("psubscribe");
    }
    let g = holder.lock(name).lock().expect("holder");
    let (tx, rx) = mpsc::channel();
    let _w = spawn_waiter(&waiter, name, 0, Duration::from_secs(20), &tx);
    wait_until("the waiter queued", WAIT, || {
        srv.cmd(&["ZCARD", &queue(name)]) == "1"
    });
    let time = srv.cmd(&["TIME"]);
    let secs: u64 = time
        .lines()
        .next()
        .and_then(|l| l.parse().ok())
        .expect("TIME");
    let dead = format!("redlease_wake:{{{name}}}:{name}:dead-client");
    let score = (secs * 1000 + 5_000).to_string();
    assert_eq!(srv.cmd(&["ZADD", &queue(name), &score, &dead]), "1");

    let released = Instant::now();
    drop(g);
    let (_, at) = rx.recv_timeout(WAIT).expect("the waiter returns");
    let at = at.expect("the waiter got the lock");
    assert!(
        at - released < HANDOFF_BOUND,
        "the live client was woken at once ({:?}), not after the holder's lease",
        at - released
    );
    assert_eq!(
        srv.cmd(&["ZSCORE", &queue(name), &dead]),
        "",
        "the dead entry is gone"
    );
    drop(psub);
}

#[test]
fn redisson_waiters_are_woken_once_nobody_is_queued() {
    const NAME: &str = "q:redisson";
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let waiter = client(&srv.url());
    warm_subscriber(&holder, &waiter);
    // Redisson's waiters listen on the lock's channel.
    let mut redisson = srv.conn();
    let mut sub = redisson.as_pubsub();
    sub.subscribe(format!("redisson_lock__channel:{{{NAME}}}"))
        .expect("subscribe");
    sub.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("read timeout");

    let g = holder.lock(NAME).lock().expect("holder");
    let (tx, rx) = mpsc::channel();
    let go = spawn_waiter(&waiter, NAME, 0, Duration::from_secs(20), &tx);
    wait_until("the waiter queued", WAIT, || {
        srv.cmd(&["ZCARD", &queue(NAME)]) == "1"
    });
    drop(g);
    let (_, at) = rx.recv_timeout(WAIT).expect("the waiter returns");
    at.expect("the queued waiter got the lock");
    // Handed to the queued client: the lock never fell free, so Redisson's
    // waiters were not told.
    assert!(
        sub.get_message().is_err(),
        "no message on the lock's channel while the lock passed to a queued client"
    );
    go.send(()).expect("release");
    sub.set_read_timeout(Some(WAIT)).expect("read timeout");
    let msg = sub
        .get_message()
        .expect("the last release tells Redisson's waiters");
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    wait_until("the lock free", WAIT, || srv.cmd(&["EXISTS", NAME]) == "0");
    assert_eq!(srv.cmd(&["EXISTS", &queue(NAME)]), "0");
}

/// A waiter that gives up returns within its deadline plus one response
/// timeout (the bound docs/guarantees.md gives): its process leaves the
/// queue in the background. (Found by review: a leave run after the wait
/// added a round trip, up to another response timeout.)
#[test]
fn a_queued_waiter_that_gives_up_returns_within_its_bound() {
    const NAME: &str = "q:slow";
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let holder = client(&srv.url());
    let w = Client::builder(proxy.url())
        .response_timeout(Duration::from_millis(500))
        .build()
        .expect("client through the proxy");
    warm_subscriber(&holder, &w);
    let _g = holder.lock(NAME).lock().expect("holder");
    let lock = w.lock(NAME);
    let started = Instant::now();
    let h = thread::spawn(move || {
        let r = lock.try_lock_for(Duration::from_secs(2));
        (r.map(|g| g.is_some()), Instant::now())
    });
    wait_until("the waiter queued", WAIT, || {
        srv.cmd(&["ZCARD", &queue(NAME)]) == "1"
    });
    // The last try is answered slowly but in time; the leave gets no answer.
    let slow = proxy.add_rule(
        &acquire_sha(),
        Fault::DelayReply(Duration::from_millis(450)),
        1,
    );
    let lost = proxy.add_rule(&leave_sha(), Fault::BlackHole, 1);
    let (r, at) = h.join().expect("waiter thread");
    let took = at - started;
    assert!(!r.expect("no error"), "the lock stays held");
    assert_eq!(proxy.hits(slow), 1);
    assert!(
        took < Duration::from_millis(2_600),
        "returned {took:?} after the call: past its 2 s deadline plus one 500 ms response timeout"
    );
    // The leave reaches Redis in the background all the same.
    proxy.wait_hits(lost, 1, WAIT);
    wait_until("the process out of the queue", WAIT, || {
        srv.cmd(&["EXISTS", &queue(NAME)]) == "0"
    });
}

/// Locks `k` and `{k}` share Redisson's channel, but each has its own queue:
/// a release of `k` wakes a waiter of `k`, never one of `{k}`. (Found by
/// review: with one queue, `k`'s waiter slept while `k` was free.)
#[test]
fn k_and_braced_k_have_a_queue_each() {
    let srv = RedisServer::start();
    let (ha, hb) = (client(&srv.url()), client(&srv.url()));
    let (c, d) = (client(&srv.url()), client(&srv.url()));
    warm_subscriber(&ha, &c);
    warm_subscriber(&ha, &d);
    let ga = ha.lock("k").lock().expect("holder of k");
    let _gb = hb.lock("{k}").lock().expect("holder of {k}");
    let (tx, rx) = mpsc::channel();
    // d waits for {k} 6 s (its entry would score lower), c for k 20 s.
    let _d = spawn_waiter(&d, "{k}", 1, Duration::from_secs(6), &tx);
    wait_until("d queued", WAIT, || {
        srv.cmd(&["ZCARD", &queue("{k}")]) == "1"
    });
    let _c = spawn_waiter(&c, "k", 0, Duration::from_secs(20), &tx);
    wait_until("c queued", WAIT, || srv.cmd(&["ZCARD", &queue("k")]) == "1");
    let released = Instant::now();
    drop(ga);
    let (i, at) = rx.recv_timeout(WAIT).expect("a waiter returns");
    assert_eq!(i, 0, "c, the waiter of k, returns first");
    let at = at.expect("c gets k");
    assert!(
        at - released < HANDOFF_BOUND,
        "c got k {:?} after its release",
        at - released
    );
}
