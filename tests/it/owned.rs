//! Locks owned by the acquisition (`Lock::owned`): the guard moves between
//! threads and is released on any of them; every acquisition is its own
//! owner (no re-entry); the watchdog renews it; lost replies are settled.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, Fault, Proxy, RedisServer};
use redlease::{Client, OwnedLockGuard};

/// Bound on every wait here.
const WAIT: Duration = Duration::from_secs(10);

fn client(srv: &RedisServer, lease: Duration) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(lease)
        .build()
        .expect("client connects to the test server")
}

fn hash(srv: &RedisServer, key: &str) -> HashMap<String, String> {
    let mut conn = srv.conn();
    redis::cmd("HGETALL")
        .arg(key)
        .query(&mut conn)
        .expect("HGETALL")
}

/// Taken on one thread, checked and released on another; meanwhile a second
/// acquisition waits, whether from the same thread (owned or thread-owned)
/// or from another.
#[test]
fn an_owned_guard_moves_to_another_thread_and_is_released_there() {
    let srv = RedisServer::start();
    let c = client(&srv, Duration::from_secs(30));
    let lock = c.lock("jobs");
    let owned = lock.owned();
    let g = owned.lock().expect("owned lock");
    // Redisson's layout: one field <client-uuid>:<id>, count 1, and a
    // generation beside it; the id is not this thread's.
    let fields = hash(&srv, "jobs");
    let field = fields
        .keys()
        .find(|f| !f.ends_with(":gen"))
        .expect("an owner field")
        .clone();
    assert_eq!(fields[&field], "1", "hold count 1: {fields:?}");
    assert!(field.starts_with(&format!("{}:", c.id())), "{field}");
    assert!(
        !lock.is_held_by_current_thread().expect("query"),
        "not the thread's"
    );
    // No re-entry: another owned acquisition and the thread's own wait.
    assert!(
        owned.try_lock().expect("try_lock").is_none(),
        "a second owned acquisition"
    );
    assert!(
        lock.try_lock().expect("try_lock").is_none(),
        "the thread's own acquisition"
    );
    let (tx, rx) = mpsc::channel::<OwnedLockGuard>();
    let worker = thread::spawn(move || {
        let g = rx.recv_timeout(WAIT).expect("the guard arrives");
        g.ensure_held().expect("held on the worker");
        assert!(!g.is_lost());
        assert!(g.valid_until() > Instant::now() + Duration::from_secs(20));
        g.unlock().expect("unlock on the worker");
    });
    tx.send(g).expect("send the guard");
    worker.join().expect("the worker thread");
    assert!(
        !owned.is_locked().expect("is_locked"),
        "released by the worker"
    );
    // Dropped on another thread releases as well.
    let g = owned
        .try_lock_for(Duration::from_secs(5))
        .expect("try_lock_for")
        .expect("free");
    thread::spawn(move || drop(g))
        .join()
        .expect("dropping thread");
    assert!(
        !lock.is_locked().expect("is_locked"),
        "released by the drop"
    );
    // Nothing left behind but the releases' latches, which expire.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut srv.conn())
        .expect("KEYS");
    for k in keys {
        let ttl: i64 = srv.cmd(&["PTTL", &k]).parse().expect("PTTL");
        assert!(ttl > 0, "{k} left without a TTL");
    }
}

/// A thread-owned holder and an owned one exclude each other, and a release
/// of either wakes a waiter of the other.
#[test]
fn owned_and_thread_owned_holders_exclude_and_wake_each_other() {
    let srv = RedisServer::start();
    let c = client(&srv, Duration::from_secs(30));
    let lock = c.lock("mixed");
    let g = lock.lock().expect("thread-owned");
    let owned = lock.owned();
    let waiter = thread::spawn(move || {
        let started = Instant::now();
        let g = owned.lock().expect("owned waits and gets it");
        (g, started.elapsed())
    });
    wait_until("the owned waiter to subscribe", WAIT, || {
        c.stats().subscribed_channels > 0
    });
    drop(g);
    let (g, waited) = waiter.join().expect("waiter");
    assert!(waited < WAIT, "woken by the release, not the 30 s lease");
    // A thread-owned waiter of another client, woken by the owned release.
    let c2 = client(&srv, Duration::from_secs(30));
    let lock2 = c2.lock("mixed");
    let waiter = thread::spawn(move || lock2.try_lock_for(WAIT).map(|g| g.is_some()));
    wait_until("the thread-owned waiter to subscribe", WAIT, || {
        c2.stats().subscribed_channels > 0
    });
    g.unlock().expect("unlock");
    assert!(
        waiter.join().expect("waiter").expect("try_lock_for"),
        "woken by the owned release"
    );
}

/// The watchdog renews an owned hold past several leases, whichever thread
/// holds the guard.
#[test]
fn an_owned_hold_is_renewed_by_the_watchdog() {
    let srv = RedisServer::start();
    let lease = Duration::from_millis(600);
    let c = client(&srv, lease);
    let g = c.lock("renewed").owned().lock().expect("lock");
    let started = Instant::now();
    let g = thread::spawn(move || {
        wait_until("three leases to pass", WAIT, || {
            started.elapsed() >= lease * 3
        });
        g
    })
    .join()
    .expect("holder thread");
    g.ensure_held().expect("renewed past three leases");
    assert!(c.stats().renewals >= 3, "renewed: {:?}", c.stats());
    let ttl: i64 = srv.cmd(&["PTTL", "renewed"]).parse().expect("PTTL");
    assert!(ttl > 0, "the key lives: PTTL {ttl}");
    drop(g);
    assert_eq!(c.stats().watchdog_entries, 0, "not renewed any more");
}

/// An acquisition whose reply is lost is undone in the background (the
/// caller was told it failed); a release that never reached Redis is
/// completed in the background. Neither leaves the lock held.
#[test]
fn lost_replies_of_an_owned_lock_leave_nothing_held() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = crate::faults_common::impatient(&proxy.url());
    let owned = c.lock("lossy").owned();
    proxy.add_rule(b"redlease_acquire_cancel", Fault::DropReply, 1);
    assert!(owned.try_lock().is_err(), "the acquisition's reply is lost");
    wait_until("the lost acquisition to be undone", WAIT, || {
        srv.cmd(&["EXISTS", "lossy"]) == "0"
    });
    let g = owned
        .try_lock_for(WAIT)
        .expect("try_lock_for")
        .expect("free once undone");
    let swallowed = proxy.add_rule(
        &crate::faults_common::release_full_sha(),
        Fault::BlackHole,
        1,
    );
    let e = thread::spawn(move || g.unlock())
        .join()
        .expect("releasing thread")
        .expect_err("the release is lost on its way");
    // (Not read from the key: the background release may already have run.)
    assert_eq!(proxy.hits(swallowed), 1, "the release never reached Redis");
    assert!(!e.is_invalid_argument(), "{e}");
    wait_until("the lost release to be completed", WAIT, || {
        srv.cmd(&["EXISTS", "lossy"]) == "0"
    });
    // The watchdog counts a settle done once its pass is over.
    wait_until("nothing left to settle", WAIT, || {
        c.stats().unsettled_requests == 0
    });
}

/// A lock lost while its owned guard is on another thread is reported
/// there, and the drop of the lost guard neither panics nor releases the
/// next holder's lock.
#[test]
fn a_lost_owned_hold_is_reported_wherever_the_guard_is() {
    let srv = RedisServer::start();
    let c = client(&srv, Duration::from_millis(600));
    let other = client(&srv, Duration::from_secs(30));
    let g = c.lock("lost").owned().lock().expect("lock");
    let g = thread::spawn(move || g).join().expect("moved");
    assert!(other.lock("lost").force_unlock().expect("force_unlock"));
    let next = other.lock("lost").lock().expect("another holder");
    wait_until("the watchdog to find the hold gone", WAIT, || g.is_lost());
    assert!(g.ensure_held().is_err());
    thread::spawn(move || drop(g))
        .join()
        .expect("drop of a lost guard");
    next.ensure_held().expect("the next holder keeps it");
    assert!(other.lock("lost").is_locked().expect("is_locked"));
}
