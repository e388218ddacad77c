//! One API across the lock family: the `Lockable` and `LeaseGuard` traits
//! drive every kind through the same generic code, and the names every kind
//! shares mean the same thing.

use std::time::{Duration, Instant};

use crate::support::RedisServer;
use redlease::{Client, LeaseGuard, LockGuard, Lockable, MultiLock, RedLock};

/// Longer than any wait here: only a bug makes a lock outlive it.
const LEASE: Duration = Duration::from_secs(30);

fn client(srv: &RedisServer) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(LEASE)
        .build()
        .expect("client connects to the test server")
}

/// Drives `mine` (this test's handle) and `theirs` (the same lock through
/// another client, so another owner) through every method of the traits, as
/// code written once for any kind would. `exclusive`: `theirs` must be shut
/// out while `mine` holds it (not so for two readers).
fn exercise<L: Lockable>(what: &str, mine: &L, theirs: &L, exclusive: bool) {
    // lock(): watched, valid for about the watchdog lease.
    let g = mine.lock().unwrap_or_else(|e| panic!("{what}: lock: {e}"));
    g.ensure_held()
        .unwrap_or_else(|e| panic!("{what}: ensure_held right after lock: {e}"));
    assert!(!g.is_lost(), "{what}: lost right after lock");
    assert!(
        g.valid_until() > Instant::now() + LEASE / 2,
        "{what}: valid_until not about a lease away"
    );
    assert!(!g.name().is_empty(), "{what}: a guard without a name");
    let other = theirs.try_lock().map(|g| g.is_some());
    assert_eq!(
        other.unwrap_or_else(|e| panic!("{what}: try_lock by another owner: {e}")),
        !exclusive,
        "{what}: another owner's try_lock while held"
    );
    LeaseGuard::unlock(g).unwrap_or_else(|e| panic!("{what}: unlock: {e}"));

    // try_lock_for / try_lock_until: free now, taken at once.
    let g = theirs
        .try_lock_for(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{what}: try_lock_for: {e}"))
        .unwrap_or_else(|| panic!("{what}: try_lock_for found the released lock busy"));
    drop(g);
    let g = mine
        .try_lock_until(Instant::now() + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{what}: try_lock_until: {e}"))
        .unwrap_or_else(|| panic!("{what}: try_lock_until found the released lock busy"));
    drop(g);

    // The fixed-lease forms: valid for at most the lease.
    let lease = Duration::from_secs(5);
    let before = Instant::now();
    let g = mine
        .lock_with_lease(lease)
        .unwrap_or_else(|e| panic!("{what}: lock_with_lease: {e}"));
    assert!(
        g.valid_until() <= Instant::now() + lease && g.valid_until() > before,
        "{what}: valid_until of a 5 s lease not within it"
    );
    drop(g);
    let g = theirs
        .try_lock_with_lease(Duration::from_secs(5), lease)
        .unwrap_or_else(|e| panic!("{what}: try_lock_with_lease: {e}"))
        .unwrap_or_else(|| panic!("{what}: try_lock_with_lease found the lock busy"));
    g.ensure_held()
        .unwrap_or_else(|e| panic!("{what}: ensure_held: {e}"));
    LeaseGuard::unlock(g).unwrap_or_else(|e| panic!("{what}: unlock: {e}"));
}

#[test]
fn every_lock_kind_runs_through_the_same_generic_code() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    exercise("Lock", &a.lock("gen:plain"), &b.lock("gen:plain"), true);
    exercise(
        "fenced Lock",
        &a.fenced_lock("gen:fenced"),
        &b.fenced_lock("gen:fenced"),
        true,
    );
    exercise(
        "FairLock",
        &a.fair_lock("gen:fair"),
        &b.fair_lock("gen:fair"),
        true,
    );
    exercise(
        "ReadLock",
        &a.read_write_lock("gen:rw").read_lock(),
        &b.read_write_lock("gen:rw").read_lock(),
        false,
    );
    exercise(
        "WriteLock",
        &a.read_write_lock("gen:rw").write_lock(),
        &b.read_write_lock("gen:rw").write_lock(),
        true,
    );
    let multi = |c: &Client| {
        MultiLock::new(vec![c.lock("gen:multi:1"), c.lock("gen:multi:2")]).expect("MultiLock")
    };
    exercise("MultiLock", &multi(&a), &multi(&b), true);

    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let (ma, mb): (Vec<Client>, Vec<Client>) = (
        masters.iter().map(client).collect(),
        masters.iter().map(client).collect(),
    );
    let red = |cs: &[Client]| {
        RedLock::new(cs.iter().map(|c| c.lock("gen:red")).collect()).expect("RedLock")
    };
    exercise("RedLock", &red(&ma), &red(&mb), true);
}

/// The trait is object safe: one list holds kinds of several types.
#[test]
fn lock_kinds_of_several_types_share_one_list() {
    let srv = RedisServer::start();
    let c = client(&srv);
    let rw = c.read_write_lock("dyn:rw");
    let kinds: Vec<(&str, Box<dyn Lockable<Guard = LockGuard>>)> = vec![
        ("plain", Box::new(c.lock("dyn:plain"))),
        ("fair", Box::new(c.fair_lock("dyn:fair"))),
        ("write", Box::new(rw.write_lock())),
        ("read", Box::new(c.read_write_lock("dyn:rw2").read_lock())),
    ];
    for (what, lock) in &kinds {
        let g = lock
            .try_lock()
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .unwrap_or_else(|| panic!("{what}: busy"));
        g.ensure_held().unwrap_or_else(|e| panic!("{what}: {e}"));
        g.unlock().unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    assert!(
        !rw.is_locked().expect("is_locked"),
        "the write lock was released"
    );
}
