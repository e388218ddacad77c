//! A cap on holding (`ClientBuilder::max_hold`, `Lock::with_max_hold`): the
//! watchdog renews a hold up to its cap and no further, so a stuck holder
//! frees the lock; the guard reports the loss and `on_lock_lost` fires.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{wait_until, RedisServer};
use redlease::{Client, Error, MAX_LEASE};

/// Bound on every wait here.
const WAIT: Duration = Duration::from_secs(10);

fn capped_client(
    srv: &RedisServer,
    lease: Duration,
    lost: mpsc::Sender<(String, Instant)>,
) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(lease)
        .on_lock_lost(move |name: &str| {
            let _ = lost.send((name.to_owned(), Instant::now()));
        })
        .build()
        .expect("client connects to the test server")
}

fn pttl(srv: &RedisServer, key: &str) -> i64 {
    srv.cmd(&["PTTL", key]).parse().expect("PTTL is a number")
}

/// The cap is several leases long: the hold is renewed until then (it
/// outlives its first leases), then not any more; the lock is free at the
/// cap, not before, and the loss is reported once.
#[test]
fn a_hold_is_renewed_up_to_its_cap_and_then_lost() {
    let srv = RedisServer::start();
    let (tx, lost) = mpsc::channel();
    let lease = Duration::from_millis(600);
    let cap = Duration::from_millis(2000);
    let c = capped_client(&srv, lease, tx);
    let lock = c.lock("capped").with_max_hold(cap);
    let started = Instant::now();
    let guard = lock.lock().expect("lock");
    // Renewed past three leases: the cap, not the lease, ends it.
    wait_until("a renewal after two leases", WAIT, || {
        started.elapsed() >= lease * 2 + Duration::from_millis(100)
    });
    guard.ensure_held().expect("renewed while under its cap");
    assert!(pttl(&srv, "capped") > 0, "the key lives on past two leases");
    // No renewal takes the lease past the cap.
    let ttl = Duration::from_millis(pttl(&srv, "capped").unsigned_abs());
    assert!(
        started.elapsed() + ttl <= cap + Duration::from_millis(50),
        "the lease reaches {:?} after the acquisition, past the cap of {cap:?}",
        started.elapsed() + ttl
    );
    let (name, at) = lost
        .recv_timeout(WAIT)
        .expect("on_lock_lost once the cap has come");
    assert_eq!(name, "capped");
    assert!(
        at >= started + cap - Duration::from_millis(5),
        "reported lost {:?} after the acquisition, before the cap",
        at - started
    );
    assert!(guard.is_lost(), "the guard reports the loss");
    let e = guard.ensure_held().expect_err("past the cap");
    assert!(e.is_lock_lost(), "{e}");
    assert!(guard.valid_until() <= started + cap + Duration::from_millis(5));
    wait_until("the key to expire at the cap", WAIT, || {
        pttl(&srv, "capped") == -2
    });
    assert!(
        started.elapsed() >= cap - Duration::from_millis(50),
        "the lock was free {:?} after the acquisition, before its cap",
        started.elapsed()
    );
    assert!(
        lost.recv_timeout(Duration::from_millis(300)).is_err(),
        "on_lock_lost called once"
    );
    assert_eq!(c.stats().locks_lost, 1);
    assert_eq!(c.stats().watchdog_entries, 0, "nothing left to renew");
    drop(guard);
}

/// A cap shorter than the watchdog's lease is the hold's lease; re-entries
/// (of either kind) do not take the lease past the cap either.
#[test]
fn a_cap_shorter_than_the_lease_bounds_every_acquisition() {
    let srv = RedisServer::start();
    let (tx, lost) = mpsc::channel();
    let c = capped_client(&srv, Duration::from_secs(30), tx);
    let lock = c.lock("short").with_max_hold(Duration::from_millis(1500));
    let started = Instant::now();
    let g1 = lock.lock().expect("lock");
    let ttl = pttl(&srv, "short");
    assert!(ttl > 0 && ttl <= 1500, "the lease is the cap: PTTL {ttl}");
    let g2 = lock.lock().expect("re-entry");
    let g3 = lock
        .lock_with_lease(Duration::from_millis(1400))
        .expect("re-entry with a lease");
    let ttl = pttl(&srv, "short");
    assert!(
        started.elapsed() + Duration::from_millis(ttl.unsigned_abs())
            <= Duration::from_millis(1550),
        "a re-entry took the lease to PTTL {ttl} ms"
    );
    let (name, _) = lost.recv_timeout(WAIT).expect("reported lost at the cap");
    assert_eq!(name, "short");
    assert!(g1.is_lost() && g2.is_lost() && g3.is_lost());
    drop((g3, g2, g1));
    // The next hold is capped afresh.
    let g = lock
        .try_lock()
        .expect("try_lock")
        .expect("free after the cap");
    g.ensure_held().expect("a new hold, a new cap");
}

/// The client's cap applies to every lock; a lock's own overrides it; a
/// fixed lease longer than the cap and out-of-range caps are refused at
/// once.
#[test]
fn caps_are_checked_and_fixed_leases_beyond_them_refused() {
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .max_hold(Duration::from_secs(5))
        .build()
        .expect("client");
    let invalid = |r: redlease::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert!(matches!(e, Error::InvalidArgument(_)), "{what}: {e}");
        e.to_string()
    };
    let msg = invalid(
        c.lock("fixed")
            .lock_with_lease(Duration::from_secs(6))
            .map(drop),
        "a lease past the client's cap",
    );
    assert!(msg.contains("max_hold"), "{msg}");
    invalid(
        c.fair_lock("fixed")
            .try_lock_with_lease(Duration::ZERO, Duration::from_secs(6))
            .map(drop),
        "a fair lock's lease past the cap",
    );
    invalid(
        c.fair_lock("fixed")
            .with_max_hold(Duration::from_secs(1))
            .lock_with_lease(Duration::from_secs(2))
            .map(drop),
        "a fair lock's lease past its own cap",
    );
    let g = c
        .lock("fixed")
        .lock_with_lease(Duration::from_secs(5))
        .expect("a lease of the cap is fine");
    drop(g);
    let own = c.lock("own").with_max_hold(Duration::from_secs(60));
    let _g = own
        .lock_with_lease(Duration::from_secs(30))
        .expect("the lock's own cap replaces the client's");
    for bad in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_LEASE + Duration::from_millis(1),
        Duration::MAX,
    ] {
        let msg = invalid(
            c.lock("bad").with_max_hold(bad).lock().map(drop),
            "an out-of-range cap",
        );
        assert!(msg.contains("max_hold"), "{msg}");
        let e = Client::builder(srv.url())
            .max_hold(bad)
            .build()
            .expect_err("an out-of-range client cap");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    assert_eq!(
        srv.cmd(&["EXISTS", "bad", "fixed"]),
        "0",
        "nothing refused was written"
    );
}

/// The time from `started` until the key's lease runs out, as Redis has it
/// now.
fn lease_end(srv: &RedisServer, key: &str, started: Instant) -> Duration {
    let ttl = pttl(srv, key);
    assert!(ttl > 0, "{key} held with a lease: PTTL {ttl}");
    started.elapsed() + Duration::from_millis(ttl.unsigned_abs())
}

/// Every request that re-applies a lease for the holds that remain cuts it
/// to the cap too: a partial release, and one after a fixed-lease re-entry
/// once no watched guard remains (the watchdog is no longer there to stop
/// it). Before, both set the full lease again, past the cap.
#[test]
fn leases_re_applied_for_the_remaining_holds_end_at_the_cap() {
    let srv = RedisServer::start();
    let (tx, _lost) = mpsc::channel();
    let c = capped_client(&srv, Duration::from_secs(30), tx);
    let cap = Duration::from_millis(1500);
    // Slack for the latency between a request's send and its run.
    let slack = Duration::from_millis(50);

    let lock = c.lock("partial").with_max_hold(cap);
    let started = Instant::now();
    let outer = lock.lock().expect("lock");
    let inner = lock.lock().expect("re-entry");
    wait_until("most of the cap to pass", WAIT, || {
        started.elapsed() >= Duration::from_millis(1000)
    });
    drop(inner);
    let end = lease_end(&srv, "partial", started);
    assert!(
        end <= cap + slack,
        "a partial release took the lease to {end:?}"
    );
    wait_until("the cap", WAIT, || outer.is_lost());
    drop(outer);

    let lock = c.lock("fixed").with_max_hold(cap);
    let started = Instant::now();
    let watched = lock.lock().expect("lock");
    wait_until("most of the cap to pass", WAIT, || {
        started.elapsed() >= Duration::from_millis(1000)
    });
    let fixed = lock.lock_with_lease(cap).expect("a fixed-lease re-entry");
    let end = lease_end(&srv, "fixed", started);
    assert!(end <= cap + slack, "the re-entry took the lease to {end:?}");
    drop(watched);
    let end = lease_end(&srv, "fixed", started);
    assert!(
        end <= cap + slack,
        "the partial release took the lease to {end:?}"
    );
    assert!(fixed.valid_until() <= started + cap + slack);
    wait_until("the fixed-lease guard to find the cap", WAIT, || {
        fixed.is_lost()
    });
    wait_until("the key to expire", WAIT, || pttl(&srv, "fixed") == -2);
}

/// The undo of a re-entry whose reply was lost re-applies what the holds
/// that remain need, no further than the cap. Before, it set the full
/// lease again.
#[test]
fn the_undo_of_a_lost_re_entry_ends_at_the_cap() {
    let srv = RedisServer::start();
    let proxy = crate::support::Proxy::start(srv.addr());
    let c = crate::faults_common::impatient(&proxy.url());
    let cap = Duration::from_millis(2000);
    let lock = c.lock("undo").with_max_hold(cap);
    let started = Instant::now();
    let outer = lock.lock().expect("lock");
    wait_until("most of the cap to pass", WAIT, || {
        started.elapsed() >= Duration::from_millis(1200)
    });
    proxy.add_rule(
        b"redlease_acquire_cancel",
        crate::support::Fault::DropReply,
        1,
    );
    assert!(lock.try_lock().is_err(), "the re-entry's reply is lost");
    wait_until("the undo", WAIT, || c.stats().unsettled_requests == 0);
    let end = lease_end(&srv, "undo", started);
    assert!(
        end <= cap + Duration::from_millis(100),
        "the undo took the lease to {end:?}"
    );
    assert!(outer.valid_until() <= started + cap + Duration::from_millis(100));
    drop(outer);
}

/// A hold's cap is its first acquisition's: a re-entry through a handle
/// with another (shorter) cap neither shortens the live hold's lease nor
/// caps it. Before, the re-entry set the shorter lease and the hold was
/// lost with both guards alive.
#[test]
fn a_re_entry_through_another_cap_changes_nothing() {
    let srv = RedisServer::start();
    let (tx, lost) = mpsc::channel();
    let c = capped_client(&srv, Duration::from_secs(30), tx);
    let outer = c.lock("nested").lock().expect("lock, no cap");
    let inner = c
        .lock("nested")
        .with_max_hold(Duration::from_millis(300))
        .lock()
        .expect("re-entry with a cap");
    assert!(pttl(&srv, "nested") > 20_000, "the re-entry kept the lease");
    drop(inner);
    assert!(
        pttl(&srv, "nested") > 20_000,
        "the partial release kept the lease"
    );
    assert!(
        lost.recv_timeout(Duration::from_millis(800)).is_err(),
        "nothing lost past the other handle's cap"
    );
    outer.ensure_held().expect("still held");
}
