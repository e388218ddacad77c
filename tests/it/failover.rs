//! Topology faults, every kind through the one call path: a Cluster master
//! SIGKILLed and its replica promoted while a client sits idle, holds locks
//! and permits it releases during the failover, or waits on a latch; and
//! waiters whose subscription Redis never confirms.
//!
//! Each cluster test starts its own 3+3 cluster (`cluster-node-timeout`
//! 1 s, `cluster-require-full-coverage no`, as in production setups where
//! the other masters keep serving) and kills the first master.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, Cluster, Fault, Proxy, RedisServer};
use redlease::Client;

const WAIT: Duration = Duration::from_secs(30);

fn cluster() -> Cluster {
    Cluster::start_with_args(3, 1, &["--cluster-require-full-coverage", "no"])
}

/// Names whose slots the first master serves (the victim's), and that
/// master's port.
fn victim_names(cluster: &Cluster, prefix: &str, n: usize) -> (Vec<String>, u16) {
    let names = cluster.names_on_each_master(prefix, n);
    let victim = cluster.masters()[0].port();
    for name in &names[0] {
        assert_eq!(
            cluster.master_of_slot(cluster.slot_of(name)).port(),
            victim,
            "{name} is on the first master"
        );
    }
    (names[0].clone(), victim)
}

fn kill_master(cluster: &Cluster, port: u16) -> Instant {
    let victim = cluster.node_by_port(port);
    cluster.kill_node(victim);
    Instant::now()
}

/// An idle client (it made calls of every kind on the master's slots
/// before, so its pools and slot map point at the old master, then made
/// none during the failover) calls every kind once, 2 s after the failover
/// completed: every call succeeds, none with a spurious error. Before the
/// one call path, 11 of 14 failed with a pool or connection error.
#[test]
fn an_idle_client_s_first_call_of_every_kind_after_a_failover_succeeds() {
    let cluster = cluster();
    let (names, victim) = victim_names(&cluster, "idle", 12);
    let setup = Client::cluster_builder(cluster.seeds())
        .build()
        .expect("setup client");
    let events = crate::events::Recorder::default();
    let idle = Client::cluster_builder(cluster.seeds())
        .event_handler(events.clone())
        .build()
        .expect("idle client");
    let [lock, fenced, fair, rw, sem, exp, latch, probe, forced, held, ..] = &names[..] else {
        unreachable!()
    };
    // Every kind used once on the victim's slots by the idle client.
    assert!(setup.semaphore(sem).try_set_permits(2).unwrap());
    assert!(setup
        .permit_expirable_semaphore(exp)
        .try_set_permits(2)
        .unwrap());
    assert!(setup.count_down_latch(latch).try_set_count(1).unwrap());
    drop(idle.lock(lock).try_lock().unwrap().expect("lock"));
    drop(
        idle.fenced_lock(fenced)
            .try_lock()
            .unwrap()
            .expect("fenced"),
    );
    drop(idle.fair_lock(fair).try_lock().unwrap().expect("fair"));
    drop(idle.read_write_lock(rw).write_lock().try_lock().unwrap());
    drop(idle.semaphore(sem).try_acquire(1).unwrap().expect("permit"));
    drop(
        idle.permit_expirable_semaphore(exp)
            .try_acquire(Duration::from_secs(60))
            .unwrap()
            .expect("expirable permit"),
    );
    assert_eq!(idle.count_down_latch(latch).count().unwrap(), 1);
    assert!(!idle.lock(probe).is_locked().unwrap());
    let guard = idle
        .lock(held)
        .lock_with_lease(Duration::from_secs(60))
        .expect("a held lock");
    setup
        .lock(forced)
        .lock_with_lease(Duration::from_secs(60))
        .map(std::mem::forget)
        .unwrap();

    let killed = kill_master(&cluster, victim);
    let promoted = cluster.wait_failover_of(victim);
    println!(
        "failover to port {} done {:?} after the kill",
        promoted.port(),
        killed.elapsed()
    );
    // A count-down is sent at most once: the setup client's pooled
    // connection to the dead master would make it "may have run". A client
    // made after the failover counts down.
    let after = Client::cluster_builder(cluster.seeds())
        .build()
        .expect("a client made after the failover");
    assert_eq!(after.count_down_latch(latch).count_down().unwrap(), 0);
    // Idle a while longer than the slot map's refresh (every second).
    thread::sleep(Duration::from_secs(2));

    let mut failed = Vec::new();
    let mut check = |what: &str, r: redlease::Result<bool>| match r {
        Ok(true) => {}
        Ok(false) => failed.push(format!("{what}: wrong answer")),
        Err(e) => failed.push(format!("{what}: {e}")),
    };
    let started = Instant::now();
    check("try_lock", idle.lock(lock).try_lock().map(|g| g.is_some()));
    check(
        "fenced try_lock",
        idle.fenced_lock(fenced).try_lock().map(|g| g.is_some()),
    );
    check(
        "fair try_lock",
        idle.fair_lock(fair).try_lock().map(|g| g.is_some()),
    );
    check(
        "write try_lock",
        idle.read_write_lock(rw)
            .write_lock()
            .try_lock()
            .map(|g| g.is_some()),
    );
    check(
        "Semaphore::try_acquire",
        idle.semaphore(sem).try_acquire(1).map(|p| p.is_some()),
    );
    check(
        "ExpirableSemaphore::try_acquire",
        idle.permit_expirable_semaphore(exp)
            .try_acquire(Duration::from_secs(60))
            .map(|p| p.is_some()),
    );
    check("force_unlock", idle.lock(forced).force_unlock());
    check("unlock of a held guard", guard.unlock().map(|()| true));
    check("is_locked", idle.lock(probe).is_locked().map(|l| !l));
    check(
        "CountDownLatch::count",
        idle.count_down_latch(latch).count().map(|n| n == 0),
    );
    check(
        "CountDownLatch::wait_for",
        idle.count_down_latch(latch)
            .wait_for(Duration::from_secs(5)),
    );
    check(
        "lock",
        idle.lock(probe)
            .lock_with_lease(Duration::from_secs(5))
            .map(|_| true),
    );
    println!("every call made in {:?}", started.elapsed());
    assert!(
        failed.is_empty(),
        "calls of an idle client after a failover failed: {failed:#?}"
    );
    // The failover it followed, as an event.
    assert_eq!(
        events.lines_of("failover"),
        [format!("failover to 127.0.0.1:{}", promoted.port())],
        "one failover event, naming the promoted replica"
    );
}

/// What holders hold on the failed master's slots: a watchdog lock, a fair
/// lock, a write lock and the one permit of a semaphore, each through its
/// own client (`clients`, in that order).
struct Holdings {
    plain: redlease::LockGuard,
    fair: redlease::LockGuard,
    write: redlease::LockGuard,
    permit: redlease::SemaphorePermits,
    /// Released on another thread than the one that took it (with a fifth
    /// name).
    owned: Option<redlease::OwnedLockGuard>,
}

impl Holdings {
    fn take(clients: &[Client], setup: &Client, names: &[String]) -> Holdings {
        assert!(setup.semaphore(&names[3]).try_set_permits(1).unwrap());
        Holdings {
            plain: clients[0].lock(&names[0]).lock().expect("watchdog lock"),
            fair: clients[1].fair_lock(&names[1]).lock().expect("fair lock"),
            write: clients[2]
                .read_write_lock(&names[2])
                .write_lock()
                .lock()
                .expect("write lock"),
            permit: clients[3]
                .semaphore(&names[3])
                .acquire(1)
                .expect("the only permit"),
            owned: names
                .get(4)
                .map(|name| clients[4].lock(name).owned().lock().expect("owned lock")),
        }
    }

    /// Releases everything; what each release said.
    fn release(self) -> Vec<(&'static str, redlease::Result<()>)> {
        let mut outcomes = vec![
            ("watchdog lock", self.plain.unlock()),
            ("fair lock", self.fair.unlock()),
            ("write lock", self.write.unlock()),
            ("semaphore permit", self.permit.release()),
        ];
        if let Some(owned) = self.owned {
            outcomes.push((
                "owned lock",
                thread::spawn(move || owned.unlock())
                    .join()
                    .expect("the releasing thread"),
            ));
        }
        outcomes
    }

    /// Every lock free and the permit back, as `fresh` sees it.
    fn all_free(names: &[String], fresh: &Client) -> bool {
        !fresh.lock(&names[0]).is_locked().unwrap_or(true)
            && !fresh.fair_lock(&names[1]).is_locked().unwrap_or(true)
            && !fresh.read_write_lock(&names[2]).is_locked().unwrap_or(true)
            && fresh.semaphore(&names[3]).available_permits().unwrap_or(0) == 1
            && names
                .get(4)
                .is_none_or(|name| !fresh.lock(name).is_locked().unwrap_or(true))
    }
}

/// Holders release a watchdog lock, a fair lock, a write lock and the one
/// permit of a semaphore on the failed master's slots (and, after the
/// failover, an owned lock, on another thread), each through its own
/// client: one set while the failover is under way (no master can take the
/// releases: they fail and are completed in the background), the other 1 s
/// after it completed (the releases go to the new master). Either way a fresh client finds every
/// lock free and the permit back soon after the failover, not after the
/// 30 s lease (or never, for the permit), and nothing is left to settle.
/// Before, the releases after the failover failed too (on the old master),
/// and everything was free only about 4 s after the failover.
#[test]
fn releases_during_and_after_a_failover_free_every_lock_and_permit() {
    let cluster = cluster();
    // The set released after the failover has an owned lock too, held
    // across the failover and released on another thread.
    let (names, victim) = victim_names(&cluster, "rel", 9);
    let (during_names, after_names) = names.split_at(4);
    let fresh = Client::cluster_builder(cluster.seeds())
        .build()
        .expect("fresh client");
    // Each release rides out a failover for one response timeout: short
    // here, so that all four fail before a replica can take over.
    let clients = |response: Duration| -> Vec<Client> {
        (0..5)
            .map(|_| {
                Client::cluster_builder(cluster.seeds())
                    .response_timeout(response)
                    .build()
                    .expect("a holder")
            })
            .collect()
    };
    let quick = clients(Duration::from_millis(200));
    let patient = clients(Duration::from_secs(2));
    let during = Holdings::take(&quick, &fresh, during_names);
    let after = Holdings::take(&patient, &fresh, after_names);

    let killed = kill_master(&cluster, victim);
    let outcomes = during.release();
    let released = Instant::now();
    println!(
        "releases during the failover made {:?} after the kill",
        released - killed
    );
    for (what, r) in &outcomes {
        println!("{what}: released during the failover: {r:?}");
        assert!(r.is_err(), "{what}: no master could take it yet");
    }
    cluster.wait_failover_of(victim);
    let failed_over = Instant::now();
    println!("failover done {:?} after the kill", failed_over - killed);
    thread::sleep(Duration::from_secs(1));
    let releasing = Instant::now();
    let outcomes = after.release();
    println!("releases after the failover took {:?}", releasing.elapsed());
    for (what, r) in outcomes {
        println!("{what}: released 1 s after the failover: {r:?}");
        assert!(r.is_ok(), "{what}: released on the new master: {r:?}");
    }

    for (when, names) in [("during", during_names), ("after", after_names)] {
        wait_until(
            &format!("the locks and the permit released {when} the failover to be free"),
            WAIT,
            || Holdings::all_free(names, &fresh),
        );
        let done = Instant::now();
        println!(
            "released {when} the failover: free {:?} after it completed",
            done - failed_over
        );
        // The 1 s pause plus one response timeout (2 s) of the holders
        // releasing after the failover; a lock left to its lease would take
        // 30 s.
        assert!(
            done - failed_over < Duration::from_secs(3),
            "released {when} the failover: free within seconds ({:?})",
            done - failed_over
        );
    }
    for c in quick.iter().chain(&patient) {
        wait_until("nothing left to settle", WAIT, || {
            c.stats().unsettled_requests == 0
        });
    }
}

/// A latch waiter (response timeout 500 ms) waits across a failover of the
/// latch's master and returns true once the count reaches zero on the new
/// master, long before its deadline. Before, it failed about 2 s after the
/// kill.
#[test]
fn a_latch_waiter_rides_out_a_failover() {
    let cluster = cluster();
    let (names, victim) = victim_names(&cluster, "latch", 1);
    let name = names[0].clone();
    let waiter_client = Client::cluster_builder(cluster.seeds())
        .response_timeout(Duration::from_millis(500))
        .build()
        .expect("waiter client");
    let other = Client::cluster_builder(cluster.seeds())
        .build()
        .expect("other client");
    assert!(other.count_down_latch(&name).try_set_count(1).unwrap());
    let (tx, rx) = mpsc::channel();
    let latch = waiter_client.count_down_latch(&name);
    let waiter = thread::spawn(move || {
        let r = latch.wait_for(Duration::from_secs(40));
        tx.send(Instant::now()).unwrap();
        r
    });
    wait_until("the waiter to subscribe", WAIT, || {
        waiter_client.stats().subscribed_channels == 1
    });
    kill_master(&cluster, victim);
    cluster.wait_failover_of(victim);
    assert!(
        rx.try_recv().is_err(),
        "the waiter is still waiting after the failover"
    );
    assert_eq!(
        other.count_down_latch(&name).count().unwrap(),
        1,
        "the count survived the failover"
    );
    let counted = Instant::now();
    assert_eq!(other.count_down_latch(&name).count_down().unwrap(), 0);
    let returned = rx.recv_timeout(WAIT).expect("the waiter returns");
    let opened = waiter.join().expect("waiter thread");
    assert!(
        matches!(opened, Ok(true)),
        "the waiter saw the latch open: {opened:?}"
    );
    println!(
        "waiter returned {:?} after the count-down",
        returned - counted
    );
    assert!(returned - counted < Duration::from_secs(10));
}

/// A proxy that forwards everything but swallows every reply on a
/// connection once it has sent SUBSCRIBE (a middlebox that breaks pub/sub):
/// the subscriber never gets a subscription confirmed.
fn pubsub_broken(server: &RedisServer) -> Proxy {
    let proxy = Proxy::start(server.addr());
    proxy.add_rule(b"SUBSCRIBE", Fault::DropReply, usize::MAX);
    proxy
}

/// With pub/sub broken for good, a waiter re-checks on its own (from
/// 100 ms, doubling up to the response timeout), so it takes a released
/// lock within a few response timeouts, not when the holder's 30 s lease
/// runs out as before.
#[test]
fn a_lock_waiter_does_not_count_on_a_subscription_it_cannot_confirm() {
    let server = RedisServer::start();
    let proxy = pubsub_broken(&server);
    let worst = worst_handoff(&server, &proxy, "unconfirmed");
    println!("worst hand-off with pub/sub broken for good: {worst:?}");
    assert!(
        worst < RESPONSE * 3,
        "a waiter re-checks within a few response timeouts ({worst:?})"
    );
}

/// The response timeout of the waiters behind a proxy that breaks pub/sub.
const RESPONSE: Duration = Duration::from_secs(1);

/// SUBSCRIBE commands `server` has run (INFO commandstats).
fn subscribe_calls(server: &RedisServer) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_subscribe:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The worst of 3 hand-offs from a holder on `server` to a waiter (response
/// timeout [`RESPONSE`]) behind `proxy`, each released once the waiter has
/// waited long enough for its re-checks to back off to their cap (holder's
/// lease 20 s).
fn worst_handoff(server: &RedisServer, proxy: &Proxy, prefix: &str) -> Duration {
    let holder = Client::open(server.url()).expect("holder");
    let waiter_client = Client::builder(proxy.url())
        .response_timeout(RESPONSE)
        .build()
        .expect("waiter client behind the proxy");
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        let name = format!("{prefix}:{round}");
        let guard = holder
            .lock(&name)
            .lock_with_lease(Duration::from_secs(20))
            .expect("holder takes it");
        let (tx, rx) = mpsc::channel();
        let lock = waiter_client.lock(&name);
        let subscribes = subscribe_calls(server);
        thread::spawn(move || {
            let r = lock
                .try_lock_for(Duration::from_secs(25))
                .map(|g| g.is_some());
            tx.send((r, Instant::now())).unwrap();
        });
        let channel = format!("redisson_lock__channel:{{{name}}}");
        // A proxy that cuts the link after every SUBSCRIBE may leave the
        // subscription on redis too briefly to be seen: the count of
        // SUBSCRIBE calls tells as well.
        wait_until("the waiter's SUBSCRIBE to reach redis", WAIT, || {
            server.subscribers(&channel) > 0 || subscribe_calls(server) > subscribes
        });
        thread::sleep(RESPONSE * 3);
        let released = Instant::now();
        guard.unlock().expect("release");
        let (r, at) = rx.recv_timeout(WAIT).expect("the waiter returns");
        assert!(matches!(r, Ok(true)), "the waiter got the lock: {r:?}");
        let took = at - released;
        println!(
            "{prefix} round {round}: hand-off {took:?} ({} subscriber reconnects so far)",
            waiter_client.stats().subscriber_reconnects
        );
        worst = worst.max(took);
    }
    worst
}

/// The same for a count-down latch: `wait()` (no deadline) and
/// `wait_for` return soon after the count reaches zero although no message
/// can reach them.
#[test]
fn a_latch_waiter_does_not_count_on_a_subscription_it_cannot_confirm() {
    let server = RedisServer::start();
    let proxy = pubsub_broken(&server);
    let response = Duration::from_secs(1);
    let direct = Client::open(server.url()).expect("direct client");
    let waiter_client = Client::builder(proxy.url())
        .response_timeout(response)
        .build()
        .expect("waiter client behind the proxy");
    let latch = direct.count_down_latch("unconfirmed-latch");
    assert!(latch.try_set_count(1).unwrap());
    let (tx, rx) = mpsc::channel();
    for timed in [false, true] {
        let l = waiter_client.count_down_latch("unconfirmed-latch");
        let tx = tx.clone();
        thread::spawn(move || {
            let r = if timed {
                l.wait_for(Duration::from_secs(35))
            } else {
                l.wait().map(|()| true)
            };
            tx.send((timed, r, Instant::now())).unwrap();
        });
    }
    wait_until("the waiters' SUBSCRIBE to reach redis", WAIT, || {
        server.subscribers("redisson_countdownlatch__channel__{unconfirmed-latch}") > 0
    });
    thread::sleep(response * 3);
    let counted = Instant::now();
    assert_eq!(latch.count_down().unwrap(), 0);
    for _ in 0..2 {
        let (timed, r, at) = rx.recv_timeout(WAIT).expect("a waiter returns");
        let took = at - counted;
        println!("latch waiter (timed: {timed}) returned {took:?} after the count-down");
        assert!(matches!(r, Ok(true)), "it saw the latch open: {r:?}");
        assert!(
            took < response * 3,
            "within a few response timeouts ({took:?})"
        );
    }
}

/// Counts Redis cannot count exactly are refused at once, as the
/// semaphores refuse them; 2^53 itself is counted exactly.
#[test]
fn a_latch_refuses_counts_lua_cannot_count() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).expect("client");
    let latch = client.count_down_latch("big");
    for n in [u64::MAX, (1 << 53) + 1] {
        let e = latch.try_set_count(n).expect_err("refused");
        assert!(e.is_invalid_argument(), "{n}: {e}");
        assert!(e.to_string().contains("2^53"), "{e}");
    }
    assert!(!latch.count().map(|n| n > 0).unwrap(), "nothing was set");
    assert!(latch.try_set_count(1 << 53).unwrap());
    assert_eq!(latch.count_down().unwrap(), (1 << 53) - 1);
    assert_eq!(latch.count().unwrap(), (1 << 53) - 1);
}

/// A subscriber link that keeps dropping (a middlebox that hangs up on
/// every SUBSCRIBE): each lost connection wakes the waiters, and that must
/// bring their re-check forward, never push it back, so a hand-off still
/// takes at most about one response timeout (before the fix: 10-16 s, up
/// to the holder's 20 s lease).
#[test]
fn a_waiter_re_checks_while_its_subscriber_link_keeps_dropping() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    proxy.add_rule(b"SUBSCRIBE", Fault::CutAfterRequest, usize::MAX);
    let worst = worst_handoff(&server, &proxy, "flap");
    assert!(
        worst < RESPONSE * 3,
        "hand-off with a subscriber link that keeps dropping: {worst:?}"
    );
}

/// Pub/sub breaks after the waiters' subscriptions were confirmed (the
/// subscriber's connection is cut, and the SUBSCRIBE of every new one is
/// never answered): a lock waiter and a MultiLock waiter both re-check on
/// their own (before the fix, the MultiLock waiter slept until the 30 s
/// lease ran out).
#[test]
fn lock_and_multilock_waiters_re_check_after_pubsub_breaks() {
    let server = RedisServer::start();
    let response = Duration::from_secs(1);
    let holder = Client::open(server.url()).expect("holder");
    let mut results = Vec::new();
    for multi in [false, true] {
        let proxy = Proxy::start(server.addr());
        let waiter_client = Client::builder(proxy.url())
            .response_timeout(response)
            .build()
            .expect("waiter client behind the proxy");
        let name = format!("broken-later:{multi}");
        let other = format!("{name}:other");
        let g1 = holder
            .lock(&name)
            .lock_with_lease(Duration::from_secs(30))
            .expect("holder takes it");
        let g2 = holder
            .lock(&other)
            .lock_with_lease(Duration::from_secs(30))
            .expect("holder takes the other");
        let (tx, rx) = mpsc::channel();
        let (a, b) = (waiter_client.lock(&name), waiter_client.lock(&other));
        thread::spawn(move || {
            let r = if multi {
                redlease::MultiLock::new(vec![a, b])
                    .and_then(|m| m.try_lock_for(Duration::from_secs(28)))
                    .map(|g| g.is_some())
            } else {
                a.try_lock_for(Duration::from_secs(28)).map(|g| g.is_some())
            };
            tx.send((r, Instant::now())).unwrap();
        });
        let channel = format!("redisson_lock__channel:{{{name}}}");
        wait_until("the waiter to subscribe", WAIT, || {
            server.subscribers(&channel) > 0
        });
        // Confirmed by now; then pub/sub breaks for good.
        thread::sleep(Duration::from_millis(500));
        proxy.add_rule(b"SUBSCRIBE", Fault::DropReply, usize::MAX);
        for id in proxy.connections_that_sent(b"SUBSCRIBE") {
            proxy.cut_connection(id);
        }
        thread::sleep(response * 3);
        let released = Instant::now();
        g1.unlock().expect("release");
        g2.unlock().expect("release the other");
        let (r, at) = rx.recv_timeout(WAIT).expect("the waiter returns");
        println!("multi {multi}: {r:?}, hand-off {:?}", at - released);
        results.push((multi, r, at - released));
    }
    for (multi, r, took) in results {
        assert!(matches!(r, Ok(true)), "multi {multi}: {r:?}");
        assert!(
            took < response * 3,
            "multi {multi}: hand-off {took:?} after pub/sub broke"
        );
    }
}

/// A call without a deadline rides out a failover for one response timeout
/// and no more: a resend gets only what is left of it. Here the master's
/// proxy refuses connections for half the budget, then accepts but never
/// answers in time (before the fix: 3.4 s for a 2 s response timeout).
#[test]
fn riding_out_a_failover_stays_within_one_response_timeout() {
    let cluster = Cluster::start_behind_proxies(3, 0, &[]);
    let name = cluster.names_on_each_master("budget", 1)[0][0].clone();
    let proxy = cluster.proxy_of(cluster.master_of_slot(cluster.slot_of(&name)));
    let response = Duration::from_secs(2);
    let client = Client::cluster_builder(cluster.seeds())
        .response_timeout(response)
        .build()
        .expect("client");
    assert!(!client.lock(&name).is_locked().unwrap());
    proxy.set_reject(true);
    proxy.cut();
    let (tx, rx) = mpsc::channel();
    let lock = client.lock(&name);
    let started = Instant::now();
    thread::spawn(move || {
        let r = lock.is_locked();
        tx.send((r, Instant::now())).unwrap();
    });
    thread::sleep(response / 2);
    proxy.add_rule(
        b"EXISTS",
        Fault::DelayReply(Duration::from_secs(20)),
        usize::MAX,
    );
    proxy.set_reject(false);
    let (r, at) = rx.recv_timeout(WAIT).expect("the call returns");
    let took = at - started;
    println!("is_locked: {r:?} after {took:?} (response timeout {response:?})");
    assert!(r.is_err(), "no answer came in time");
    assert!(
        took < response + Duration::from_millis(500),
        "within one response timeout (and a little): {took:?}"
    );
}

/// A wait without a deadline whose Cluster node stays away (every
/// connection refused) does not wait without end: `lock()` and a
/// MultiLock's `lock()` make their tries again for the waiter's watchdog
/// timeout (a failover takes its time, whatever lease the waiter saw),
/// then end with an error; a `lock()` that has had no answer at all does
/// the same. Before, all of them retried the failover without end.
#[test]
fn a_wait_without_deadline_ends_when_the_cluster_stays_away() {
    let cluster = Cluster::start_behind_proxies(3, 0, &[]);
    let names = cluster.names_on_each_master("away", 2);
    let (name, multi_name) = (names[0][0].clone(), names[0][1].clone());
    let proxy = cluster.proxy_of(cluster.master_of_slot(cluster.slot_of(&name)));
    let holder = Client::cluster_builder(cluster.seeds())
        .build()
        .expect("holder client");
    let lease = Duration::from_secs(1);
    let guard = holder
        .lock(&name)
        .lock_with_lease(lease)
        .expect("the holder takes the lock");
    let multi_guard = holder
        .lock(&multi_name)
        .lock_with_lease(lease)
        .expect("the holder takes the MultiLock's member");
    let response = Duration::from_millis(500);
    let floor = Duration::from_secs(3);
    let waiter = Client::cluster_builder(cluster.seeds())
        .response_timeout(response)
        .watchdog_timeout(floor)
        .build()
        .expect("waiter client");
    let (tx, rx) = mpsc::channel();
    let lock = waiter.lock(&name);
    let tx2 = tx.clone();
    thread::spawn(move || {
        let r = lock.lock().map(|g| g.hold_count());
        tx2.send(("lock()", r.map(|_| ()), Instant::now())).unwrap();
    });
    let multi = redlease::MultiLock::new(vec![waiter.lock(&multi_name)]).expect("MultiLock");
    thread::spawn(move || {
        let r = multi.lock().map(|_| ());
        tx.send(("MultiLock::lock()", r, Instant::now())).unwrap();
    });
    // The lock() waiter listens on two channels (the lock's and its
    // process's wake-up channel), the MultiLock's on one.
    wait_until("both waiters to subscribe", WAIT, || {
        waiter.stats().subscribed_channels >= 3
    });
    let cut = Instant::now();
    proxy.set_reject(true);
    proxy.cut();
    for _ in 0..2 {
        let (what, r, at) = rx
            .recv_timeout(WAIT)
            .expect("each waiter returns once its ride-out has passed");
        println!(
            "{what} returned {r:?} {:?} after the node went away",
            at - cut
        );
        assert!(r.is_err(), "{what}: the node never came back: {r:?}");
        assert!(
            at - cut >= floor,
            "{what} rode the outage out for the watchdog timeout, not just the lease it saw: {:?}",
            at - cut
        );
        // Its first failed try comes within the lease it saw.
        assert!(
            at - cut < lease + floor + response + Duration::from_secs(3),
            "{what} within the watchdog timeout from its first failed try: {:?}",
            at - cut
        );
    }

    // No answer at all: the same ride-out, then an error.
    let (tx, rx) = mpsc::channel();
    let lock = waiter.lock(&name);
    let started = Instant::now();
    thread::spawn(move || {
        let r = lock.lock().map(|g| g.hold_count());
        tx.send((r, Instant::now())).unwrap();
    });
    let (r, at) = rx
        .recv_timeout(WAIT)
        .expect("a lock() that no try of which is answered returns");
    println!("a new lock() returned {r:?} after {:?}", at - started);
    assert!(r.is_err(), "the node never came back: {r:?}");
    assert!(
        at - started >= floor && at - started < floor + response + Duration::from_secs(3),
        "within the watchdog timeout (and a response timeout): {:?}",
        at - started
    );
    proxy.set_reject(false);
    drop(guard);
    drop(multi_guard);
}

/// Waits without a deadline (a latch's `wait()` idle for longer than its
/// 10 s ride-out, a semaphore's `acquire()` that re-checks every second,
/// and a `lock()` that saw a lease of 1.5 s) all ride out a failover of
/// their master that takes longer than the bound of their last answered
/// try, and get what they waited for once it is given on the new master
/// (the lock may have expired there before the failover ended: its waiter
/// may take it as soon as the failover is over).
#[test]
fn waits_without_deadline_ride_out_a_failover_longer_than_their_last_bound() {
    let cluster = cluster();
    let (names, victim) = victim_names(&cluster, "longwait", 3);
    let (latch_name, sem_name, lock_name) = (&names[0], &names[1], &names[2]);
    let other = Client::cluster_builder(cluster.seeds())
        .watchdog_timeout(Duration::from_millis(1500))
        .build()
        .expect("other client");
    assert!(other.count_down_latch(latch_name).try_set_count(1).unwrap());
    assert!(other.semaphore(sem_name).try_set_permits(0).unwrap());
    let guard = other
        .lock(lock_name)
        .lock()
        .expect("the holder takes the lock");
    let waiter = Client::cluster_builder(cluster.seeds())
        .response_timeout(Duration::from_millis(500))
        .build()
        .expect("waiter client");
    let (tx, rx) = mpsc::channel();
    let latch = waiter.count_down_latch(latch_name);
    let t = tx.clone();
    thread::spawn(move || {
        t.send(("latch wait()", latch.wait().map(|_| ()))).unwrap();
    });
    let sem = waiter.semaphore(sem_name);
    let t = tx.clone();
    thread::spawn(move || {
        t.send(("semaphore acquire(1)", sem.acquire(1).map(|p| p.forget())))
            .unwrap();
    });
    let lock = waiter.lock(lock_name);
    thread::spawn(move || {
        tx.send(("lock()", lock.lock().map(|_| ()))).unwrap();
    });
    wait_until("the three waiters to subscribe", WAIT, || {
        waiter.stats().subscribed_channels >= 3
    });
    // Past the latch's ride-out since its last read.
    thread::sleep(Duration::from_millis(10_500));
    let killed = kill_master(&cluster, victim);
    cluster.wait_failover_of(victim);
    println!("failover took {:?}", killed.elapsed());
    let mut results = Vec::new();
    while let Ok((what, r)) = rx.try_recv() {
        println!(
            "{what} returned {r:?} {:?} after the kill",
            killed.elapsed()
        );
        results.push((what, r));
    }
    assert_eq!(other.count_down_latch(latch_name).count_down().unwrap(), 0);
    other
        .semaphore(sem_name)
        .release(1)
        .expect("a permit given");
    drop(guard);
    while results.len() < 3 {
        let (what, r) = rx.recv_timeout(WAIT).expect("every waiter returns");
        println!(
            "{what} returned {r:?} {:?} after the kill",
            killed.elapsed()
        );
        results.push((what, r));
    }
    for (what, r) in results {
        assert!(r.is_ok(), "{what} got what it waited for: {r:?}");
    }
}
