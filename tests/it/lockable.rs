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
    exercise(
        "OwnedLock",
        &a.lock("gen:owned").owned(),
        &b.lock("gen:owned").owned(),
        true,
    );
    // Two owned acquisitions through one client are two owners too.
    exercise(
        "OwnedLock, one client",
        &a.lock("gen:owned1").owned(),
        &a.lock("gen:owned1").owned(),
        true,
    );

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

/// The queries a plain lock has, on the kinds where they make sense, read
/// from Redis: free, held by this thread (twice), force-unlocked.
#[test]
fn every_lock_kind_answers_the_plain_locks_queries() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    let lease = |left: Option<Duration>, what: &str| {
        let left = left.unwrap_or_else(|| panic!("{what}: held, but no lease left"));
        assert!(
            left > LEASE / 2 && left <= LEASE,
            "{what}: remaining lease {left:?} not about the watchdog lease"
        );
    };

    let fair = a.fair_lock("q:fair");
    assert_eq!(fair.remaining_lease().expect("fair"), None, "fair: free");
    let g1 = fair.lock().expect("fair lock");
    let g2 = fair.lock().expect("fair re-entry");
    assert!(fair.is_locked().expect("fair"));
    assert_eq!(fair.hold_count().expect("fair"), 2);
    assert!(fair.is_held_by_current_thread().expect("fair"));
    lease(fair.remaining_lease().expect("fair"), "fair");
    drop((g2, g1));

    let rw = a.read_write_lock("q:rw");
    let (read, write) = (rw.read_lock(), rw.write_lock());
    assert!(!read.is_locked().expect("read") && !write.is_locked().expect("write"));
    let r = read.lock().expect("read lock");
    assert!(read.is_locked().expect("read"), "read-locked");
    assert!(!write.is_locked().expect("write"), "not write-locked");
    assert_eq!(read.hold_count().expect("read"), 1);
    assert_eq!(write.hold_count().expect("write"), 0);
    lease(read.remaining_lease().expect("read"), "read");
    drop(r);
    let w = write.lock().expect("write lock");
    assert!(write.is_locked().expect("write") && !read.is_locked().expect("read"));
    assert!(write.is_held_by_current_thread().expect("write"));
    lease(write.remaining_lease().expect("write"), "write");
    lease(rw.remaining_lease().expect("rw"), "the read-write lock");
    // force_unlock per mode, as Redisson's: a read lock's leaves a writer.
    assert!(
        !read.force_unlock().expect("read force_unlock"),
        "not read-locked"
    );
    assert!(write.is_locked().expect("write"), "the writer keeps it");
    assert!(
        write.force_unlock().expect("write force_unlock"),
        "write-locked"
    );
    drop(w);
    assert_eq!(rw.remaining_lease().expect("rw"), None, "free");
    let r = read.lock().expect("read lock");
    assert!(
        !write.force_unlock().expect("write force_unlock"),
        "not write-locked"
    );
    assert!(
        read.force_unlock().expect("read force_unlock"),
        "read-locked"
    );
    assert!(!rw.is_locked().expect("rw"), "deleted");
    drop(r);
    assert_eq!(write.remaining_lease().expect("write"), None, "free again");

    // A MultiLock is locked when any member is; held when all are.
    let multi =
        |c: &Client| MultiLock::new(vec![c.lock("q:m:1"), c.lock("q:m:2")]).expect("MultiLock");
    let (ma, mb) = (multi(&a), multi(&b));
    assert!(!ma.is_locked().expect("multi") && ma.remaining_lease().expect("multi").is_none());
    let one = b
        .lock("q:m:2")
        .lock_with_lease(Duration::from_secs(5))
        .expect("one member");
    assert!(ma.is_locked().expect("multi"), "a member is held");
    assert!(
        !mb.is_held_by_current_thread().expect("multi"),
        "one member is not all"
    );
    assert_eq!(mb.hold_count().expect("multi"), 0);
    let left = ma.remaining_lease().expect("multi").expect("locked");
    assert!(
        left <= Duration::from_secs(5),
        "the held member's lease: {left:?}"
    );
    drop(one);
    let g = ma.lock().expect("multi lock");
    let g2 = ma.lock().expect("multi re-entry");
    assert_eq!(ma.hold_count().expect("multi"), 2);
    assert!(ma.is_held_by_current_thread().expect("multi"));
    lease(ma.remaining_lease().expect("multi"), "multi");
    assert!(mb.force_unlock().expect("force"), "it was held");
    assert!(
        !ma.is_locked().expect("multi"),
        "force_unlock freed every member"
    );
    assert!(!mb.force_unlock().expect("force"), "nothing left to delete");
    drop((g2, g));

    // A RedLock is locked when too few members are free for a majority.
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let cs: Vec<Client> = masters.iter().map(client).collect();
    let red = RedLock::new(cs.iter().map(|c| c.lock("q:red")).collect()).expect("RedLock");
    let other = client(&masters[0]);
    let minority = other
        .lock("q:red")
        .lock_with_lease(Duration::from_secs(5))
        .expect("one");
    assert!(
        !red.is_locked().expect("red"),
        "two of three masters are free"
    );
    assert_eq!(red.remaining_lease().expect("red"), None);
    let g = red.lock().expect("red lock");
    assert!(red.is_locked().expect("red"));
    assert!(
        red.is_held_by_current_thread().expect("red"),
        "a majority is ours"
    );
    assert_eq!(red.hold_count().expect("red"), 1);
    // Free once the sooner of our two members' leases runs out.
    lease(red.remaining_lease().expect("red"), "red");
    drop(g);
    drop(minority);
    assert!(!red.is_locked().expect("red"));
}

/// Durations that make no sense (zero, `Duration::MAX`) are refused with
/// `InvalidArgument` by every kind, before anything is written; those that
/// mean "no limit" (a wait of `Duration::MAX`) are taken as such. Nothing
/// panics.
#[test]
fn durations_out_of_range_are_refused_at_once_by_every_kind() {
    let srv = RedisServer::start();
    let c = client(&srv);
    let invalid = |what: &str, r: redlease::Result<()>| {
        let e = r.expect_err(what);
        assert!(e.is_invalid_argument(), "{what}: {e}");
    };
    for bad in [Duration::ZERO, Duration::MAX] {
        let lock = c.lock("bad");
        invalid("lease", lock.lock_with_lease(bad).map(drop));
        invalid(
            "lease, timed",
            lock.try_lock_with_lease(Duration::MAX, bad).map(drop),
        );
        invalid(
            "renew interval",
            lock.clone().with_renew_interval(bad).lock().map(drop),
        );
        invalid(
            "max_hold",
            lock.clone().with_max_hold(bad).try_lock().map(drop),
        );
        invalid("owned lease", lock.owned().lock_with_lease(bad).map(drop));
        invalid(
            "owned renew interval",
            lock.owned().with_renew_interval(bad).lock().map(drop),
        );
        invalid(
            "fair lease",
            c.fair_lock("bad").lock_with_lease(bad).map(drop),
        );
        invalid(
            "write lease",
            c.read_write_lock("bad")
                .write_lock()
                .lock_with_lease(bad)
                .map(drop),
        );
        invalid(
            "read max_hold",
            c.read_write_lock("bad")
                .read_lock()
                .with_max_hold(bad)
                .lock()
                .map(drop),
        );
        let multi = MultiLock::new(vec![c.lock("bad:1"), c.lock("bad:2")]).expect("MultiLock");
        invalid("multi lease", multi.lock_with_lease(bad).map(drop));
        invalid(
            "expirable lease",
            c.permit_expirable_semaphore("bad")
                .try_acquire_for(Duration::MAX, bad)
                .map(drop),
        );
    }
    assert_eq!(srv.cmd(&["DBSIZE"]), "0", "nothing refused was written");
    // A wait of Duration::MAX is a wait without a deadline.
    let g = c
        .lock("bad")
        .try_lock_for(Duration::MAX)
        .expect("a wait without deadline")
        .expect("free");
    drop(g);
    let g = c
        .lock("bad")
        .owned()
        .try_lock_with_lease(Duration::MAX, Duration::from_secs(1))
        .expect("a wait without deadline")
        .expect("free");
    drop(g);
    assert!(c
        .count_down_latch("bad")
        .wait_for(Duration::MAX)
        .expect("an open latch"));
}
