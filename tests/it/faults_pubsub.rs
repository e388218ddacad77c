//! Fault injection, issue 4: the subscriber connection is killed
//! (`CLIENT KILL TYPE pubsub`) while 20 threads wait for one lock; it
//! reconnects, re-subscribes, every waiter retries, and the release later
//! still hands the lock from waiter to waiter by message, not by lease.
//!
//! Figures are printed as `FIGURE:` lines (run with `--nocapture` to see them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::faults_common::{
    figure, is_acquire_of, is_script_call, numsub, warm_subscriber, Monitor,
};
use crate::support::{wait_until, Proxy, RedisServer};
use redlease::Client;

const WAITERS: usize = 20;
const HOLD: Duration = Duration::from_millis(10);

#[test]
fn subscriber_killed_with_twenty_waiters() {
    let srv = RedisServer::start();
    let holder = Client::open(srv.url()).expect("holder client");
    let waiters = Client::builder(srv.url())
        .pool_size(WAITERS as u32)
        .build()
        .expect("waiter client");
    const NAME: &str = "pubsub:contested";

    warm_subscriber(&holder, &waiters);

    let guard = holder.lock(NAME).lock().expect("holder lock");
    let lease = holder.lock(NAME).remaining_lease().unwrap().expect("held");

    let mut monitor = Monitor::start(&srv);
    let is_attempt = |line: &str| is_script_call(line, waiters.id()) && line.contains(NAME);
    let inside = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<(usize, Instant, Instant)>();
    let mut threads = Vec::new();
    for i in 0..WAITERS {
        let (waiters, inside, tx) = (waiters.clone(), Arc::clone(&inside), tx.clone());
        threads.push(thread::spawn(move || {
            let lock = waiters.lock(NAME);
            let g = lock.lock().expect("waiter lock()");
            let got = Instant::now();
            assert!(
                !inside.swap(true, Ordering::SeqCst),
                "two waiters inside at once"
            );
            assert_eq!(lock.hold_count().unwrap(), 1);
            thread::sleep(HOLD); // the guarded work
            inside.store(false, Ordering::SeqCst);
            let left = Instant::now();
            g.unlock().expect("waiter unlock");
            tx.send((i, got, left)).unwrap();
        }));
    }
    drop(tx);
    // Every waiter tried, subscribed and tried again: now all of them wait.
    monitor.wait_for("two attempts of every waiter", is_attempt, 2 * WAITERS);
    assert!(srv.ping(Duration::from_secs(5)));
    assert_eq!(waiters.stats().subscribed_channels, 2);

    let reconnects = waiters.stats().subscriber_reconnects;
    let killed_at = Instant::now();
    assert!(
        srv.client_kill_type("pubsub") >= 1,
        "the waiter client's subscriber was killed"
    );
    wait_until(
        "the subscriber to reconnect",
        Duration::from_secs(10),
        || waiters.stats().subscriber_reconnects > reconnects,
    );
    let reconnected = killed_at.elapsed();
    // After re-subscribing, every waiter retries once at once.
    monitor.wait_for(
        "every waiter to retry after the re-subscription",
        is_attempt,
        WAITERS,
    );
    let retried = killed_at.elapsed();
    assert!(
        retried < Duration::from_secs(5),
        "waiters retried {retried:?} after the kill"
    );
    figure(&format!(
        "CLIENT KILL TYPE pubsub with {WAITERS} waiters: subscriber reconnected after {} ms, all \
         {WAITERS} waiters retried within {} ms of the kill",
        reconnected.as_millis(),
        retried.as_millis()
    ));

    let released = Instant::now();
    guard.unlock().expect("holder unlock");
    let mut events = Vec::new();
    for _ in 0..WAITERS {
        events.push(
            rx.recv_timeout(Duration::from_secs(20))
                .expect("every waiter to acquire in turn"),
        );
    }
    for t in threads {
        t.join().expect("waiter thread");
    }
    events.sort_by_key(|e| e.1);
    let mut prev_free = released;
    let mut worst_gap = Duration::ZERO;
    for (i, got, left) in &events {
        let gap = got.saturating_duration_since(prev_free);
        assert!(
            gap < Duration::from_secs(5),
            "waiter {i} acquired {gap:?} after the lock was freed (holder lease {lease:?}): \
             woken by its lease, not by the release"
        );
        worst_gap = worst_gap.max(gap);
        prev_free = *left;
    }
    let total = events.last().unwrap().1 - released;
    figure(&format!(
        "after the subscriber was killed and came back, {WAITERS} waiters acquired one after \
         another in {} ms (each held {} ms); slowest hand-off {} ms (holder lease {} s)",
        total.as_millis(),
        HOLD.as_millis(),
        worst_gap.as_millis(),
        lease.as_secs()
    ));
    assert_eq!(srv.cmd(&["EXISTS", NAME]), "0");
}

/// The release is published while the waiters' subscriber is cut off, so its
/// message is lost; once the subscriber is back, the waiters retry at once and
/// take the lock instead of sleeping out the holder's 30 s lease.
#[test]
fn release_missed_while_subscriber_is_down() {
    const N: usize = 5;
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let holder = Client::open(srv.url()).expect("holder client");
    let waiters = Client::open(proxy.url()).expect("waiter client (through the proxy)");
    const NAME: &str = "pubsub:missed";
    // Subscriber started first, so each waiter makes exactly two attempts
    // before it waits, and none is in flight during the stall.
    warm_subscriber(&holder, &waiters);
    let guard = holder.lock(NAME).lock().expect("holder lock");
    let lease = holder.lock(NAME).remaining_lease().unwrap().expect("held");

    let mut monitor = Monitor::start(&srv);
    let (tx, rx) = mpsc::channel::<Instant>();
    let mut threads = Vec::new();
    for _ in 0..N {
        let (waiters, tx) = (waiters.clone(), tx.clone());
        threads.push(thread::spawn(move || {
            let g = waiters.lock(NAME).lock().expect("waiter lock()");
            tx.send(Instant::now()).unwrap();
            thread::sleep(HOLD);
            g.unlock().expect("waiter unlock");
        }));
    }
    drop(tx);
    // Each waiter: first attempt, subscribe, second attempt.
    let channel = "redisson_lock__channel:{pubsub:missed}";
    monitor.wait_for(
        "the waiters to wait",
        |l| is_acquire_of(l, NAME) && l.contains(waiters.id()),
        2 * N,
    );
    assert!(srv.ping(Duration::from_secs(5)));
    wait_until(
        "the waiters to be subscribed",
        Duration::from_secs(10),
        || numsub(&srv, channel) == 1,
    );

    proxy.stall(true);
    let accepted = proxy.connections_total();
    assert!(proxy.cut() >= 1);
    wait_until(
        "the subscriber to reconnect (stalled) through the proxy",
        Duration::from_secs(10),
        || proxy.connections_total() > accepted,
    );
    guard.unlock().expect("holder unlock"); // published to nobody
    assert_eq!(
        numsub(&srv, channel),
        0,
        "the release message reached nobody"
    );
    let back = Instant::now();
    proxy.stall(false);

    let first = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a waiter to acquire after the subscriber came back");
    let after = first.saturating_duration_since(back);
    assert!(
        after < Duration::from_secs(5),
        "first waiter acquired {after:?} after the subscriber came back (holder lease {lease:?})"
    );
    for _ in 1..N {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the other waiters to acquire in turn");
    }
    for t in threads {
        t.join().expect("waiter thread");
    }
    figure(&format!(
        "release published while the subscriber was cut off: first of {N} waiters acquired {} ms \
         after the link came back (holder lease {} s)",
        after.as_millis(),
        lease.as_secs()
    ));
}
