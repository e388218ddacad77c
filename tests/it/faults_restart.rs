//! Fault injection, issue 4: Redis killed and restarted (same port, empty dataset) while
//! clients hold locks, wait for locks and keep idle pooled connections.
//!
//! Figures are printed as `FIGURE:` lines (run with `--nocapture` to see them).

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::faults_common::{
    figure, is_acquire_of, ms, server_lock_keys, timed, warm_subscriber, Monitor, MARGIN,
};
use crate::support::{wait_until, RedisServer};
use redlease::{Client, ClientBuilder};

const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

fn builder(url: &str) -> ClientBuilder {
    crate::faults_common::builder(url, RESPONSE_TIMEOUT).connection_timeout(CONNECTION_TIMEOUT)
}

fn client(url: &str) -> Client {
    builder(url).build().expect("build client")
}

/// Idle pooled connections die with the server. After the restart, the first
/// operation of each client succeeds, and the pool keeps no dead connection.
#[test]
fn pool_recovers_after_restart() {
    let srv = RedisServer::start();
    // `used`: its pooled connections all served a request before the kill.
    let used = builder(&srv.url())
        .pool_size(4)
        .build()
        .expect("build client");
    let barrier = Barrier::new(4);
    thread::scope(|s| {
        for i in 0..4 {
            let (used, barrier) = (&used, &barrier);
            s.spawn(move || {
                let lock = used.lock(format!("pool:warm:{i}"));
                let g = lock.lock().expect("warm-up lock");
                barrier.wait(); // four connections checked out at once
                g.unlock().expect("warm-up unlock");
            });
        }
    });
    // `fresh`: built before the kill, never used (only r2d2's own idle connection).
    let fresh = client(&srv.url());
    // `busy`: keeps calling while Redis is down.
    let busy = client(&srv.url());
    drop(busy.lock("pool:busy").try_lock().expect("busy warm-up"));

    srv.kill();
    for _ in 0..3 {
        let (r, took) = timed(|| busy.lock("pool:busy").try_lock());
        assert!(r.is_err(), "try_lock with redis down must fail, got {r:?}");
        crate::faults_common::assert_within(
            "try_lock with redis down",
            took,
            CONNECTION_TIMEOUT + RESPONSE_TIMEOUT + MARGIN,
        );
    }
    srv.restart();
    let back = Instant::now();

    let mut report = Vec::new();
    for (name, c) in [("used", &used), ("fresh", &fresh), ("busy", &busy)] {
        let (first, done) = timed(|| c.lock(format!("pool:after:{name}")).try_lock());
        match first {
            Ok(Some(g)) => {
                g.unlock().expect("unlock after restart");
                report.push(format!(
                    "{name} client: first operation after restart succeeded in {} ms",
                    ms(done)
                ));
            }
            other => panic!(
                "{name} client: the first operation after redis came back must succeed, \
                 got {other:?} after {done:?}"
            ),
        }
        assert!(
            done <= CONNECTION_TIMEOUT + MARGIN,
            "{name} client: first operation after restart took {done:?}"
        );
    }
    for r in &report {
        figure(r);
    }
    figure(&format!(
        "all three clients succeeded within {} ms after redis answered again",
        ms(back.elapsed())
    ));

    // The pool holds no dead connection: with every pooled connection checked
    // out at once, repeatedly, nothing fails and no failure is counted.
    let failures_before = used.stats().connection_failures;
    thread::scope(|s| {
        for i in 0..4 {
            let used = &used;
            s.spawn(move || {
                for n in 0..50 {
                    let lock = used.lock(format!("pool:after:{i}"));
                    let g = lock
                        .try_lock()
                        .unwrap_or_else(|e| panic!("op {n} of thread {i} after recovery: {e}"))
                        .expect("lock is free");
                    g.unlock().expect("unlock after recovery");
                }
            });
        }
    });
    assert_eq!(
        used.stats().connection_failures,
        failures_before,
        "a dead connection was handed out after the pool had recovered"
    );
}

/// Held watchdog locks report lost soon after Redis comes back empty; the
/// watchdog never re-creates them nor displaces the new holder; a waiter
/// blocked in `lock()` since before the kill acquires after the restart,
/// woken by the re-subscription rather than by the (30 s) lease.
#[test]
fn restart_loses_held_locks_and_wakes_waiters() {
    const LEASE: Duration = Duration::from_secs(30);
    const RENEW: Duration = Duration::from_secs(1);
    const DOWNTIME: Duration = Duration::from_millis(1500);
    let srv = RedisServer::start();
    let (lost_tx, lost_rx) = mpsc::channel::<(String, Instant)>();
    let lost_tx = std::sync::Mutex::new(lost_tx);
    let holder = builder(&srv.url())
        .watchdog_timeout(LEASE)
        .on_lock_lost(move |name: &str| {
            let _ = lost_tx
                .lock()
                .unwrap()
                .send((name.to_owned(), Instant::now()));
        })
        .build()
        .expect("build holder");
    let waiter = Arc::new(client(&srv.url()));

    let contested = holder.lock("restart:contested").with_renew_interval(RENEW);
    let alone = holder.lock("restart:alone").with_renew_interval(RENEW);
    let g_contested = contested.lock().expect("lock contested");
    let g_alone = alone.lock().expect("lock alone");
    let g_alone2 = alone.lock().expect("re-enter alone");
    assert_eq!(alone.hold_count().unwrap(), 2);

    warm_subscriber(&holder, &waiter);

    let mut monitor = Monitor::start(&srv);
    let (acq_tx, acq_rx) = mpsc::channel::<Instant>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let waiter_thread = {
        let waiter = Arc::clone(&waiter);
        thread::spawn(move || {
            let lock = waiter.lock("restart:contested");
            let g = lock.lock().expect("waiter lock() across the restart");
            acq_tx.send(Instant::now()).unwrap();
            let count = lock.hold_count().expect("waiter hold_count");
            release_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("test tells the waiter to release");
            g.unlock().expect("waiter unlock");
            count
        })
    };
    // The waiter is blocked in its wait once Redis has run its second acquire
    // attempt (the one after subscribing) and one more event-loop round has
    // passed (the PING), so the busy reply has been written to it.
    monitor.wait_for(
        "the waiter's acquire attempt after subscribing",
        |line| is_acquire_of(line, "restart:contested") && line.contains(waiter.id()),
        2,
    );
    assert!(srv.ping(Duration::from_secs(5)));
    assert_eq!(waiter.stats().subscribed_channels, 2);

    srv.kill();
    let killed = Instant::now();
    // Down long enough for renewals and subscriber reconnects to fail and
    // back off (the fault's duration, not a way to order threads).
    thread::sleep(DOWNTIME);
    srv.restart();
    let back = Instant::now();

    // Both held locks are reported lost, each within one renewal interval
    // (plus the margin) after Redis answered again.
    let mut lost = Vec::new();
    for _ in 0..2 {
        let (name, at) = lost_rx
            .recv_timeout(RENEW + CONNECTION_TIMEOUT + MARGIN + Duration::from_secs(5))
            .expect("on_lock_lost for both held locks");
        lost.push((name, at.saturating_duration_since(back)));
    }
    lost.sort();
    for (name, after) in &lost {
        assert!(
            *after <= RENEW + MARGIN,
            "{name}: lost reported {after:?} after restart, renew interval {RENEW:?}"
        );
        figure(&format!(
            "held watchdog lock {name:?} reported lost {} ms after redis came back empty \
             (renew interval {} ms, redis down {} ms)",
            ms(*after),
            ms(RENEW),
            ms(back - killed)
        ));
    }
    assert!(g_contested.is_lost() && g_alone.is_lost() && g_alone2.is_lost());
    assert!(g_alone.ensure_held().unwrap_err().is_lock_lost());

    let acquired = acq_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter to acquire after the restart");
    let after = acquired.saturating_duration_since(back);
    assert!(
        after <= Duration::from_secs(5),
        "waiter acquired {after:?} after restart; it should be woken by the re-subscription, \
         not by the {LEASE:?} lease"
    );
    figure(&format!(
        "waiter blocked in lock() before the kill acquired {} ms after redis came back \
         (holder lease {} s)",
        ms(after),
        LEASE.as_secs()
    ));

    // The watchdog neither re-creates the lost locks nor displaces the new
    // holder: watch over a few renewal rounds of a live lock of the holder.
    let witness = holder.lock("restart:witness").with_renew_interval(RENEW);
    let g_witness = witness.lock().expect("lock witness");
    let rounds = holder.stats().renewal_round_trips;
    wait_until(
        "two more renewal rounds of the holder's watchdog",
        Duration::from_secs(10),
        || holder.stats().renewal_round_trips >= rounds + 2,
    );
    assert!(!g_witness.is_lost());
    assert_eq!(
        srv.cmd(&["EXISTS", "restart:alone"]),
        "0",
        "watchdog re-created a lost lock"
    );
    let fields = srv.cmd(&["HGETALL", "restart:contested"]);
    let fields: Vec<&str> = fields.lines().collect();
    // Skip redlease's generation field `<owner>:gen`.
    let fields: Vec<&str> = fields
        .chunks(2)
        .filter(|kv| !kv[0].ends_with(":gen"))
        .flatten()
        .copied()
        .collect();
    assert_eq!(
        fields.len(),
        2,
        "exactly one owner of the contested lock: {fields:?}"
    );
    assert!(
        fields[0].starts_with(waiter.id()),
        "the new holder is the waiter: {fields:?}"
    );
    assert_eq!(fields[1], "1");

    // The lost guards report it and touch nothing of the new holder's (the
    // release they send is checked against this owner's field).
    assert!(g_contested.unlock().unwrap_err().is_lock_lost());
    drop(g_alone2);
    assert!(g_alone.unlock().unwrap_err().is_lock_lost());
    // The waiter's owner field and its generation field.
    assert_eq!(srv.cmd(&["HLEN", "restart:contested"]), "2");

    release_tx.send(()).unwrap();
    let count = waiter_thread.join().expect("waiter thread");
    assert_eq!(count, 1);
    g_witness.unlock().expect("unlock witness");
    assert_eq!(
        server_lock_keys(&srv),
        Vec::<String>::new(),
        "no lock left behind"
    );
}

/// The holder re-enters after Redis came back empty, before its watchdog
/// noticed the loss: the re-entry starts a fresh hold (count 1 on the
/// server), and the old guard reports the loss without touching it.
#[test]
fn reentry_after_restart_starts_afresh() {
    let srv = RedisServer::start();
    let c = client(&srv.url()); // 30 s lease: no renewal during the test
    let lock = c.lock("restart:reentry");
    let g1 = lock.lock().expect("first hold");
    assert_eq!(lock.hold_count().unwrap(), 1);
    srv.restart();
    let g2 = lock.lock().expect("re-entry after the restart");
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "a fresh hold, not a re-entry"
    );
    assert_eq!(g2.hold_count(), 1);
    assert!(g1.is_lost(), "the hold from before the restart is lost");
    assert!(!g2.is_lost());
    assert!(g1.unlock().unwrap_err().is_lock_lost());
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "the old guard left the new hold alone"
    );
    g2.unlock().expect("unlock the fresh hold");
    assert_eq!(server_lock_keys(&srv), Vec::<String>::new());
}

/// CLIENT KILL TYPE normal drops every pooled connection: the next calls
/// succeed on their first try, and a held lock keeps being renewed.
#[test]
fn killed_pool_connections_are_replaced() {
    let srv = RedisServer::start();
    let c = builder(&srv.url())
        .watchdog_timeout(Duration::from_secs(1))
        .build()
        .expect("build client");
    let held = c.lock("kill:held").lock().expect("held lock");
    let renewals = c.stats().renewals;
    for round in 0..5 {
        assert!(srv.client_kill_type("normal") >= 1, "round {round}: killed");
        let g = c
            .lock("kill:other")
            .try_lock()
            .unwrap_or_else(|e| panic!("round {round}: first call after CLIENT KILL: {e}"))
            .expect("free");
        g.unlock().expect("unlock");
        assert!(c.lock("kill:held").is_locked().expect("query"));
    }
    wait_until(
        "two renewals after the kills",
        Duration::from_secs(5),
        || c.stats().renewals >= renewals + 2,
    );
    assert!(!held.is_lost());
    held.unlock().expect("unlock held");
}

/// An idle client's pooled connection that the server closed (killed and
/// restarted) is found closed before a request goes out on it: the first
/// operation that is sent at most once (a latch's count-down, a semaphore's
/// added permits) runs, instead of failing as "may have run" on the end of
/// the stream it met.
#[test]
fn an_idle_clients_first_sent_once_operation_after_a_restart_runs() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let latch = c.count_down_latch("restart:latch");
    assert!(latch.try_set_count(5).expect("set the count"));
    let sem = c.semaphore("restart:sem");
    assert!(sem.try_set_permits(1).expect("set the permits"));
    srv.kill();
    srv.restart();
    wait_until("redis to answer again", Duration::from_secs(10), || {
        srv.ping(Duration::from_millis(200))
    });
    // Idle longer than the pool's check of idle connections (10 ms) asks
    // for, however fast the restart was.
    thread::sleep(Duration::from_millis(50));
    // The restarted server is empty: the counts again, behind the client.
    srv.cmd(&["SET", "restart:latch", "5"]);
    srv.cmd(&["SET", "restart:sem", "1"]);
    latch
        .count_down()
        .expect("count down on an idle client after the restart");
    assert_eq!(srv.cmd(&["GET", "restart:latch"]), "4");
    sem.add_permits(1)
        .expect("add permits on an idle client after the restart");
    assert_eq!(srv.cmd(&["GET", "restart:sem"]), "2");
}
