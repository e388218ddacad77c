//! Hand-off inside one client: a release by one thread hands the lock
//! straight to a thread of the same client that sleeps waiting for it (the
//! grant travels with the release, and the waiter holds the lock when it
//! wakes, with no round trip of its own). A waiter whose deadline passes
//! while the release that chose it is under way takes that release's
//! outcome; a grant whose reply is lost is taken or undone, never left
//! held in the name of a waiter that was told it failed.
//!
//! Each test makes sure the waiter sleeps before the release: Redis ran its
//! queued try (MONITOR), and then its thread waits on a futex.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::Client;

use crate::faults_common::{is_acquire_of, warm_subscriber, Monitor};
use crate::support::{wait_until, Fault, Proxy, RedisServer};

const WAIT: Duration = Duration::from_secs(10);

fn client(url: &str, response_timeout: Duration) -> Client {
    Client::builder(url)
        .watchdog_timeout(Duration::from_secs(30))
        .response_timeout(response_timeout)
        .build()
        .expect("client connects to the test server")
}

/// What a waiter thread reports: whether it got the lock (and its hold
/// count, from its own guard), its fencing token, and how long its call
/// took.
struct Report {
    got: Option<u32>,
    token: Option<u64>,
    took: Duration,
}

/// Which of the reentrant locks a thread takes (they share the hash).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Plain,
    Fenced,
    /// Owned by the acquisition (`Lock::owned`), not the thread.
    Owned,
}

fn lock_of(c: &Client, name: &str, kind: Kind) -> redlease::Lock {
    match kind {
        Kind::Plain | Kind::Owned => c.lock(name),
        Kind::Fenced => c.fenced_lock(name),
    }
}

/// A waiter's guard, of either ownership.
enum Guard {
    Thread(redlease::LockGuard),
    Owned(redlease::OwnedLockGuard),
}

impl Guard {
    /// Its holds (an owned guard's is always one).
    fn count(&self) -> u32 {
        match self {
            Guard::Thread(g) => g.hold_count(),
            Guard::Owned(_) => 1,
        }
    }

    fn token(&self) -> Option<u64> {
        match self {
            Guard::Thread(g) => g.token(),
            Guard::Owned(g) => g.token(),
        }
    }
}

/// The calling thread's id in the OS (its `/proc/self/task/` entry).
fn os_thread_id() -> String {
    std::fs::read_link("/proc/thread-self")
        .map(|p| {
            p.to_string_lossy()
                .rsplit('/')
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

/// Starts a thread of `c` that waits for `name` (`wait`: `None` for
/// `lock()`), reports, then holds what it got until told (or 30 s).
/// Returns its OS thread id, the report channel and the "let go" sender.
fn spawn_waiter(
    c: &Client,
    name: &'static str,
    wait: Option<Duration>,
) -> (String, mpsc::Receiver<Report>, mpsc::Sender<()>) {
    spawn_waiter_of(c, name, wait, Kind::Plain)
}

/// [`spawn_waiter`], the waiter's lock of `kind`.
fn spawn_waiter_of(
    c: &Client,
    name: &'static str,
    wait: Option<Duration>,
    kind: Kind,
) -> (String, mpsc::Receiver<Report>, mpsc::Sender<()>) {
    let lock = lock_of(c, name, kind);
    let (tid_tx, tid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let tid = os_thread_id();
        let _ = tid_tx.send(tid);
        let started = Instant::now();
        let got = match (kind, wait) {
            (Kind::Owned, None) => lock.owned().lock().map(|g| Some(Guard::Owned(g))),
            (Kind::Owned, Some(w)) => lock.owned().try_lock_for(w).map(|g| g.map(Guard::Owned)),
            (_, None) => lock.lock().map(|g| Some(Guard::Thread(g))),
            (_, Some(w)) => lock.try_lock_for(w).map(|g| g.map(Guard::Thread)),
        };
        let took = started.elapsed();
        // An error counts as not acquired.
        let got = got.unwrap_or(None);
        let _ = tx.send(Report {
            got: got.as_ref().map(Guard::count),
            token: got.as_ref().and_then(Guard::token),
            took,
        });
        if got.is_some() {
            let _ = go_rx.recv_timeout(Duration::from_secs(30));
        }
        drop(got);
    });
    let tid = tid_rx.recv_timeout(WAIT).expect("the waiter thread starts");
    (tid, rx, go)
}

/// Waits until Redis ran the waiter's second (queued) try, then until its
/// thread sleeps on a futex (the wake-up it waits for).
fn wait_asleep(monitor: &mut Monitor, name: &str, tid: &str) {
    monitor.wait_for("the waiter's two tries", |l| is_acquire_of(l, name), 2);
    let path = format!("/proc/self/task/{tid}/syscall");
    wait_until("the waiter thread to sleep on a futex", WAIT, || {
        std::fs::read_to_string(&path).is_ok_and(|s| s.starts_with("202 "))
    });
}

/// A server behind a proxy; a client through it (response timeout `rt`)
/// whose first thread holds `name`; a second thread of it asleep waiting
/// for `name` (`wait`: see [`spawn_waiter`]).
struct Rig {
    srv: RedisServer,
    proxy: Proxy,
    held: Option<redlease::LockGuard>,
    monitor: Monitor,
    rx: mpsc::Receiver<Report>,
    go: mpsc::Sender<()>,
}

fn rig(name: &'static str, rt: Duration, wait: Option<Duration>) -> Rig {
    rig_of(name, rt, wait, Kind::Plain, Kind::Plain)
}

/// [`rig`], the holder's lock of kind `holder`, the waiter's of `waiter`.
fn rig_of(
    name: &'static str,
    rt: Duration,
    wait: Option<Duration>,
    holder: Kind,
    waiter: Kind,
) -> Rig {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = client(&proxy.url(), rt);
    // The scripts loaded (so that a late copy runs as sent, EVALSHA): a
    // partial release loads the release with a latch (which a hand-off
    // uses), the full one the release without.
    let warm = c.lock("grant:warm-up");
    let outer = warm.lock().expect("warm-up");
    warm.lock()
        .expect("warm-up re-entry")
        .unlock()
        .expect("warm-up partial release");
    outer.unlock().expect("warm-up release");
    // Its subscriber's first connection wakes every waiter once: before.
    warm_subscriber(&client(&srv.url(), Duration::from_secs(2)), &c);
    let held = lock_of(&c, name, holder)
        .lock()
        .expect("the first thread takes the lock");
    let mut monitor = Monitor::start(&srv);
    let (tid, rx, go) = spawn_waiter_of(&c, name, wait, waiter);
    wait_asleep(&mut monitor, name, &tid);
    Rig {
        srv,
        proxy,
        held: Some(held),
        monitor,
        rx,
        go,
    }
}

impl Rig {
    /// The first thread releases the lock.
    fn release(&mut self) -> redlease::Result<()> {
        self.held.take().expect("held until released").unlock()
    }

    /// What the waiter reported.
    fn report(&self) -> Report {
        self.rx.recv_timeout(WAIT).expect("the waiter returns")
    }

    /// Lets the waiter go, and waits for its release.
    fn let_go(&self, name: &str) {
        let _ = self.go.send(());
        wait_until("the lock to be free", WAIT, || {
            self.srv.cmd(&["EXISTS", name]) == "0"
        });
    }
}

#[test]
fn a_release_hands_the_lock_to_a_sleeping_thread_of_the_same_client() {
    let name = "grant:same-client";
    let mut r = rig(name, Duration::from_secs(2), None);
    r.monitor.lines_until_echo(&r.srv, "before-release");
    r.release().expect("release");
    assert_eq!(r.report().got, Some(1), "the waiter holds the lock once");
    let after = r.monitor.lines_until_echo(&r.srv, "after-grant");
    let tries: Vec<_> = after.iter().filter(|l| is_acquire_of(l, name)).collect();
    assert!(
        tries.is_empty(),
        "the waiter held the lock without a try of its own after the release: {tries:?}"
    );
    assert!(
        !after.iter().any(|l| l.contains("lua] \"publish\"")),
        "a release that hands the lock over wakes nobody: {after:?}"
    );
    assert_eq!(r.srv.cmd(&["EXISTS", name]), "1", "held by the waiter");
    assert_eq!(
        r.srv.cmd(&["ZCARD", &crate::handoff::queue(name)]),
        "0",
        "the waiter was its process's last: its process left the lock's queue"
    );
    r.let_go(name);
}

/// A fenced lock is handed over too: the release takes the next token for
/// the waiter (Redisson's RFencedLock counts every acquisition), and the
/// waiter's guard carries it. So is a reentrant lock released by a thread
/// that took it without fencing: the two share the hash, and the waiter's
/// kind decides.
#[test]
fn a_release_hands_a_fenced_lock_over_with_the_next_token() {
    for (name, holder) in [
        ("grant:fenced", Kind::Fenced),
        ("grant:fenced-after-plain", Kind::Plain),
    ] {
        let mut r = rig_of(name, Duration::from_secs(2), None, holder, Kind::Fenced);
        let token_key = format!("redisson_lock_token:{{{name}}}");
        let before: u64 = r.srv.cmd(&["GET", &token_key]).trim().parse().unwrap_or(0);
        r.monitor.lines_until_echo(&r.srv, "before-release");
        r.release().expect("release");
        let report = r.report();
        assert_eq!(
            report.got,
            Some(1),
            "{name}: the waiter holds the lock once"
        );
        assert_eq!(
            report.token,
            Some(before + 1),
            "{name}: the waiter's token is the next one"
        );
        assert_eq!(
            r.srv.cmd(&["GET", &token_key]).trim(),
            (before + 1).to_string(),
            "{name}: one token taken, for the waiter"
        );
        let after = r.monitor.lines_until_echo(&r.srv, "after-grant");
        let tries: Vec<_> = after.iter().filter(|l| is_acquire_of(l, name)).collect();
        assert!(
            tries.is_empty(),
            "{name}: the waiter held the lock without a try of its own: {tries:?}"
        );
        r.let_go(name);
    }
}

/// A fenced lock's waiter whose token cannot be taken (the token key is
/// not a number, or a negative one: someone else wrote it) is not handed
/// the lock: the release releases as usual (its caller told it did) and
/// wakes it at once, and its own try fails with nothing held.
#[test]
fn a_release_that_cannot_take_a_token_for_its_waiter_releases_as_usual() {
    for (name, value) in [
        ("grant:fenced-bad-token", "x"),
        ("grant:fenced-negative-token", "-5"),
    ] {
        let mut r = rig_of(
            name,
            Duration::from_secs(2),
            None,
            Kind::Plain,
            Kind::Fenced,
        );
        r.srv
            .cmd(&["SET", &format!("redisson_lock_token:{{{name}}}"), value]);
        r.release().expect("the release succeeds");
        let report = r.report();
        assert_eq!(report.got, None, "{value}: the waiter's own try fails");
        assert!(
            report.took < Duration::from_secs(5),
            "{value}: woken by the release, not at the end of the lease it saw: {:?}",
            report.took
        );
        assert_eq!(
            r.srv.cmd(&["EXISTS", name]),
            "0",
            "{value}: nothing held in anyone's name"
        );
    }
}

/// A fenced lock's hand-off whose connection is cut after the request:
/// the client sends the release again on a new connection, and its latch
/// answers "handed over" without the token; the waiter counts that as a
/// lost answer, undoes the hand-off and takes the lock with a token of its
/// own, the latest.
#[test]
fn a_fenced_grant_answered_from_the_latch_is_undone_and_taken_again() {
    let name = "grant:fenced-cut";
    let mut r = rig_of(
        name,
        Duration::from_secs(2),
        None,
        Kind::Fenced,
        Kind::Fenced,
    );
    let token_key = format!("redisson_lock_token:{{{name}}}");
    r.proxy
        .add_rule(b"redisson_unlock_latch:", Fault::CutAfterRequest, 1);
    r.release().expect("the release, sent again, succeeds");
    let report = r.report();
    assert_eq!(report.got, Some(1), "the waiter holds the lock once");
    let now: u64 = r.srv.cmd(&["GET", &token_key]).trim().parse().unwrap();
    assert_eq!(report.token, Some(now), "the waiter's token is the latest");
    thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        r.srv.cmd(&["EXISTS", name]),
        "1",
        "still held by the waiter"
    );
    r.let_go(name);
}

/// A fenced lock's hand-off whose reply is lost: the waiter undoes it and
/// takes the lock itself, with a token of its own (later than the one the
/// lost grant took: tokens only grow).
#[test]
fn a_fenced_grant_whose_reply_is_lost_leaves_the_waiter_a_token_of_its_own() {
    let name = "grant:fenced-lost-reply";
    let mut r = rig_of(
        name,
        Duration::from_millis(500),
        None,
        Kind::Fenced,
        Kind::Fenced,
    );
    let token_key = format!("redisson_lock_token:{{{name}}}");
    r.proxy
        .add_rule(b"redisson_unlock_latch:", Fault::DropReply, 1);
    assert!(
        r.release().is_err(),
        "a release without a reply is not reported done"
    );
    let report = r.report();
    assert_eq!(report.got, Some(1), "the waiter holds the lock once");
    let token = report.token.expect("the waiter's guard has a token");
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        r.srv.cmd(&["EXISTS", name]),
        "1",
        "still held by the waiter"
    );
    assert_eq!(
        r.srv.cmd(&["GET", &token_key]).trim(),
        token.to_string(),
        "the waiter's token is the latest one taken"
    );
    r.let_go(name);
}

#[test]
fn a_waiter_whose_deadline_passes_during_its_grant_takes_the_outcome() {
    let name = "grant:deadline";
    let mut r = rig(
        name,
        Duration::from_secs(3),
        Some(Duration::from_millis(1500)),
    );
    // The release (and only it) reaches Redis after the waiter's deadline,
    // within the response timeout.
    r.proxy.add_rule(
        b"redisson_unlock_latch:",
        Fault::DelayRequest(Duration::from_millis(2500)),
        1,
    );
    r.release().expect("the release is answered, late");
    let report = r.report();
    assert_eq!(
        report.got,
        Some(1),
        "the release chose the waiter before its deadline and handed it the lock"
    );
    assert!(
        report.took < Duration::from_secs(3) + Duration::from_millis(1500),
        "the waiter returned within the release's response timeout: {:?}",
        report.took
    );
    r.let_go(name);
}

#[test]
fn a_grant_whose_reply_is_lost_is_taken_by_the_waiter_and_never_stranded() {
    // The waiter's thread owns its hold, or its acquisition does (an owned
    // guard's: the undo runs in the background alone).
    for (name, waiter) in [
        ("grant:lost-reply", Kind::Plain),
        ("grant:lost-reply-owned", Kind::Owned),
    ] {
        let mut r = rig_of(name, Duration::from_millis(500), None, Kind::Plain, waiter);
        // The release runs (and hands the lock over), its reply is lost.
        r.proxy
            .add_rule(b"redisson_unlock_latch:", Fault::DropReply, 1);
        assert!(
            r.release().is_err(),
            "{waiter:?}: a release without a reply is not reported done"
        );
        assert_eq!(
            r.report().got,
            Some(1),
            "{waiter:?}: the waiter holds the lock once"
        );
        // Whatever the background undo of the grant did, the waiter's hold
        // is the one in Redis, and it stays.
        thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            r.srv.cmd(&["EXISTS", name]),
            "1",
            "{waiter:?}: still held by the waiter"
        );
        r.let_go(name);
    }
}

/// An owned guard's waiter (`Lock::owned`: the acquisition owns the hold,
/// under a field of its own) is handed the lock as a thread's is.
#[test]
fn a_release_hands_the_lock_to_an_owned_guard_s_waiter() {
    let name = "grant:owned";
    let mut r = rig_of(name, Duration::from_secs(2), None, Kind::Plain, Kind::Owned);
    let holder = r.srv.cmd(&["HKEYS", name]);
    r.monitor.lines_until_echo(&r.srv, "before-release");
    r.release().expect("release");
    assert_eq!(r.report().got, Some(1), "the owned waiter holds the lock");
    let after = r.monitor.lines_until_echo(&r.srv, "after-grant");
    let tries: Vec<_> = after.iter().filter(|l| is_acquire_of(l, name)).collect();
    assert!(
        tries.is_empty(),
        "the waiter held the lock without a try of its own after the release: {tries:?}"
    );
    let fields = r.srv.cmd(&["HKEYS", name]);
    assert!(
        !fields.is_empty() && fields != holder,
        "held under the owned acquisition's own field ({fields:?}, the releaser's: {holder:?})"
    );
    r.let_go(name);
}

/// A release whose answer was lost may still reach Redis later: the
/// waiter it chose treats the hand-off as a lost acquisition, and its next
/// try sets the cancel marker, so the late copy hands nothing over (it
/// releases, and its wake-up reaches the waiter). Handed over in silence,
/// the lock would be the waiter's without its knowing: it would sleep
/// until the lease it last saw (30 s).
#[test]
fn a_late_copy_of_a_release_whose_answer_was_lost_hands_nothing_over() {
    let name = "grant:late-copy";
    let mut r = rig(name, Duration::from_millis(500), None);
    // The release, and every background retry of it, reaches Redis 1.5 s
    // late, after its caller timed out.
    r.proxy.add_rule(
        b"redisson_unlock_latch:",
        Fault::LateCopy(Duration::from_millis(1500)),
        usize::MAX,
    );
    assert!(r.release().is_err(), "the release timed out");
    let report = r.report();
    assert_eq!(report.got, Some(1), "the waiter got the lock within 10 s");
    assert!(
        report.took < Duration::from_secs(5),
        "woken by the late release, not at the end of the lease it saw: {:?}",
        report.took
    );
    r.let_go(name);
}

/// Two threads of `c` that take turns on `name` until stopped (hold 40 ms,
/// rest 10 ms): at each release the other one sleeps waiting for it.
struct TakingTurns {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<thread::JoinHandle<usize>>,
}

impl TakingTurns {
    fn start(c: &Client, name: &'static str) -> TakingTurns {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..2)
            .map(|_| {
                let (lock, stop) = (c.lock(name), stop.clone());
                thread::spawn(move || {
                    let mut turns = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(Some(g)) = lock.try_lock_for(Duration::from_secs(20)) {
                            turns += 1;
                            thread::sleep(Duration::from_millis(40));
                            drop(g);
                        }
                        thread::sleep(Duration::from_millis(10));
                    }
                    turns
                })
            })
            .collect();
        // Both have taken the lock at least once.
        thread::sleep(Duration::from_millis(300));
        TakingTurns { stop, threads }
    }

    /// Stops them; how many turns they took.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("a turn-taking thread"))
            .sum()
    }
}

/// A waiter that cannot take a hand-off (a MultiLock's) keeps releases
/// waking it, and an owned guard's, which can, is handed the lock in turn:
/// threads of their client that hand the lock to each other never pass
/// them over.
#[test]
fn a_waiter_that_cannot_take_a_hand_off_is_not_passed_over() {
    let srv = RedisServer::start();
    let c = client(&srv.url(), Duration::from_secs(2));
    let name = "grant:not-passed-over";
    let turns = TakingTurns::start(&c, name);
    let owned = c
        .lock(name)
        .owned()
        .try_lock_for(WAIT)
        .expect("the owned waiter's call");
    assert!(owned.is_some(), "the owned waiter got the lock within 10 s");
    drop(owned);
    let multi = redlease::MultiLock::new(vec![c.lock(name)])
        .expect("a MultiLock of one")
        .try_lock_for(WAIT)
        .expect("the MultiLock waiter's call");
    assert!(
        multi.is_some(),
        "the MultiLock waiter got the lock within 10 s"
    );
    drop(multi);
    assert!(turns.stop() > 2, "the two threads took turns meanwhile");
}

/// A waiter of another client (another process, or Redisson's) keeps
/// releases waking it, even where it cannot queue (an ACL rule without the
/// queue's commands): it listens on the lock's channel.
#[test]
fn a_waiter_of_another_client_is_not_passed_over_even_unqueued() {
    use crate::acl::{acl, LOCKER_RULE};
    let srv = RedisServer::start();
    let rule = LOCKER_RULE
        .split_whitespace()
        .filter(|t| !matches!(*t, "+time" | "+zadd" | "+zrem" | "+zcard" | "+zpopmin"))
        .collect::<Vec<_>>()
        .join(" ");
    acl(&srv, "locker", &rule);
    let url = format!("redis://locker:lockpw@127.0.0.1:{}/", srv.port());
    let (a, b) = (
        client(&url, Duration::from_secs(2)),
        client(&url, Duration::from_secs(2)),
    );
    let name = "orders:grant";
    let turns = TakingTurns::start(&a, name);
    for i in 0..5 {
        let got = b
            .lock(name)
            .try_lock_for(WAIT)
            .expect("the other client's call");
        assert!(
            got.is_some(),
            "the other client's wait {i} got the lock within 10 s"
        );
        drop(got);
        thread::sleep(Duration::from_millis(50));
    }
    assert!(turns.stop() > 2, "the two threads took turns meanwhile");
}

/// A release that finds another process queued wakes that one; the
/// releasing client's sleeping thread, told "no hand-off", sleeps on
/// rather than race it (the queued one is farther away: 20 ms each way).
#[test]
fn a_release_that_wakes_a_queued_process_leaves_its_own_waiter_asleep() {
    use crate::handoff::queue;
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = client(&srv.url(), Duration::from_secs(2));
    let b = client(&proxy.url(), Duration::from_secs(2));
    warm_subscriber(&client(&srv.url(), Duration::from_secs(2)), &a);
    warm_subscriber(&client(&srv.url(), Duration::from_secs(2)), &b);
    let name = "grant:queued-first";
    let held = a.lock(name).lock().expect("the holder takes the lock");
    proxy.set_delay(Duration::from_millis(20));
    let (tx, rx) = mpsc::channel();
    let spawn = |c: &Client, who: &'static str| {
        let (lock, tx) = (c.lock(name), tx.clone());
        let (tid_tx, tid_rx) = mpsc::channel();
        thread::spawn(move || {
            let tid = os_thread_id();
            let _ = tid_tx.send(tid);
            let got = lock.try_lock_for(WAIT).expect("the waiter's call");
            let _ = tx.send((who, got.is_some()));
            thread::sleep(Duration::from_millis(200));
            drop(got);
        });
        tid_rx.recv_timeout(WAIT).expect("the waiter thread starts")
    };
    let mut monitor = Monitor::start(&srv);
    spawn(&b, "the queued process");
    wait_until("the other process to queue", WAIT, || {
        srv.cmd(&["ZCARD", &queue(name)]) == "1"
    });
    monitor.lines_until_echo(&srv, "b-queued");
    let tid = spawn(&a, "the releasing client's thread");
    wait_asleep(&mut monitor, name, &tid);
    held.unlock().expect("release");
    let first = rx.recv_timeout(WAIT).expect("a waiter returns");
    let second = rx.recv_timeout(WAIT).expect("the other waiter returns");
    assert_eq!(
        first,
        ("the queued process", true),
        "the process the release woke got the lock first (then {second:?})"
    );
    assert!(second.1, "the other waiter got the lock after");
}

/// A waiter chosen by a release that gets no answer returns within its
/// deadline plus that release's round trip (one response timeout): it
/// makes no try of its own after it.
#[test]
fn a_waiter_chosen_by_a_release_without_answer_returns_after_its_round_trip() {
    let name = "grant:bounded";
    let response = Duration::from_millis(1500);
    // The release's round trip ends past the deadline.
    let deadline = Duration::from_millis(600);
    let mut r = rig(name, response, Some(deadline));
    // Redis never answers what names a cancel marker from now on: the
    // release that carries the hand-off, and any try of the waiter's.
    r.proxy
        .add_rule(b"redlease_acquire_cancel:", Fault::BlackHole, usize::MAX);
    assert!(r.release().is_err(), "the release got no answer");
    let report = r.report();
    assert_eq!(report.got, None, "the waiter did not get the lock");
    assert!(
        report.took < deadline + response + Duration::from_millis(500),
        "the waiter returned {:?} after its call (deadline {deadline:?}, response timeout \
         {response:?}): one round trip past its deadline at most",
        report.took
    );
}

/// The waiter a release chose waits for that release's round trip, not for
/// what the releasing thread does after it (here a slow event handler).
#[test]
fn a_waiter_is_told_its_outcome_before_the_releaser_s_event_handler_runs() {
    struct Slow;
    impl redlease::HandleEvent for Slow {
        fn handle_release(&self, _: redlease::ReleaseEvent<'_>) {
            thread::sleep(Duration::from_secs(4));
        }
    }
    let srv = RedisServer::start();
    let response = Duration::from_millis(500);
    let c = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_secs(30))
        .response_timeout(response)
        .event_handler(Slow)
        .build()
        .expect("client connects to the test server");
    warm_subscriber(&client(&srv.url(), response), &c);
    let name = "grant:slow-handler";
    let held = c
        .lock(name)
        .lock()
        .expect("the first thread takes the lock");
    let mut monitor = Monitor::start(&srv);
    let (tid, rx, go) = spawn_waiter(&c, name, Some(Duration::from_millis(800)));
    wait_asleep(&mut monitor, name, &tid);
    // Returns once the handler has run (4 s).
    held.unlock().expect("the release");
    let report = rx.recv_timeout(WAIT).expect("the waiter returns");
    assert_eq!(report.got, Some(1), "the waiter holds the lock");
    assert!(
        report.took < Duration::from_millis(800) + response,
        "the waiter returned {:?} after its call, within its deadline plus one round trip",
        report.took
    );
    let _ = go.send(());
}

/// A release that finds its owner's field gone (the key deleted behind its
/// back: nobody was told) tells the waiter it chose, which tries at once
/// and finds the lock free, rather than sleep until the lease it saw (30 s).
#[test]
fn a_release_that_finds_the_lock_gone_sends_its_waiter_to_try_at_once() {
    let name = "grant:deleted";
    let mut r = rig(name, Duration::from_secs(2), None);
    assert_eq!(
        r.srv.cmd(&["DEL", name]),
        "1",
        "deleted behind the holder's back"
    );
    assert!(r.release().is_err(), "the holder had lost the lock");
    let report = r.report();
    assert_eq!(report.got, Some(1), "the waiter got the lock within 10 s");
    r.let_go(name);
}
