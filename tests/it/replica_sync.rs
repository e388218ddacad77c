//! Replica sync (`sync_replicas`): lock writes are followed by `WAIT` in the
//! same round trip, capped by the replicas the master has. The replica is
//! stopped (SIGSTOP) to make WAIT time out deterministically.

use std::time::{Duration, Instant};

use crate::support::{wait_until, RedisServer};
use redlease::Client;

pub(crate) fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    wait_until("the replica to sync", Duration::from_secs(20), || {
        replica.info_field("replication", "master_link_status") == "up"
    });
    // The master counts a replica (ROLE, which the client reads) once it is
    // online on its side too.
    wait_until(
        "the master to list its replica online",
        Duration::from_secs(20),
        || {
            master.info_field("replication", "connected_slaves") == "1"
                && master.cmd(&["ROLE"]).lines().count() > 2
        },
    );
    // And acknowledges writes: WAIT answers 1 (the first acknowledgements
    // after a full sync can take a while on a loaded machine).
    wait_until(
        "the replica to acknowledge a write",
        Duration::from_secs(20),
        || {
            master.cmd(&["SET", "replica:warm", "1"]) == "OK"
                && master.cmd(&["WAIT", "1", "1000"]) == "1"
        },
    );
    (master, replica)
}

fn client(master: &RedisServer, wait: Duration) -> Client {
    Client::builder(master.url())
        .sync_replicas(1, wait)
        .retry_attempts(2)
        .build()
        .expect("client")
}

/// With a live replica every lock write is confirmed: the replica has the
/// lock as soon as `lock()` returns, and has lost it once `unlock()` returns.
#[test]
fn confirmed_writes_are_on_the_replica_when_the_call_returns() {
    let (master, replica) = master_and_replica();
    let c = client(&master, Duration::from_secs(1));
    let mut r = replica.conn();
    for i in 0..50 {
        let name = format!("sync:{i}");
        let g = c.lock(name.as_str()).lock().unwrap();
        let on_replica: bool = redis::cmd("EXISTS").arg(&name).query(&mut r).unwrap();
        assert!(on_replica, "{name} on the replica when lock() returned");
        g.unlock().unwrap();
        let on_replica: bool = redis::cmd("EXISTS").arg(&name).query(&mut r).unwrap();
        assert!(
            !on_replica,
            "{name} gone from the replica when unlock() returned"
        );
    }
}

/// The rest of the family's writes are confirmed too: each is followed by a
/// `WAIT` (two when its script is loaded first), and the replica has a semaphore's returned permits, an
/// expirable semaphore's returned permit, a latch's count and a
/// semaphore's added permits as soon as the call returns (a failover then
/// cannot lose them: a plain semaphore's permits have no lease that would
/// bring them back). Before, only their acquisitions waited.
#[test]
fn semaphore_and_latch_writes_are_on_the_replica_when_the_call_returns() {
    let (master, replica) = master_and_replica();
    let c = client(&master, Duration::from_secs(1));
    let waits = || master.command_stat("wait", "calls");
    let mut r = replica.conn();
    let mut on_replica = |key: &str| -> Option<String> {
        redis::cmd("GET")
            .arg(key)
            .query(&mut r)
            .expect("GET on the replica")
    };
    let sem = c.semaphore("sync:sem");
    assert!(sem.try_set_permits(2).unwrap());
    for i in 0..20 {
        let p = sem.acquire(2).unwrap();
        assert_eq!(on_replica("sync:sem").as_deref(), Some("0"), "round {i}");
        let before = waits();
        p.release().unwrap();
        assert!(waits() > before, "the release waited for the replica");
        assert_eq!(
            on_replica("sync:sem").as_deref(),
            Some("2"),
            "the permits back on the replica when release() returned (round {i})"
        );
    }
    let before = waits();
    sem.add_permits(1).unwrap();
    assert!(waits() > before, "adding permits waited for the replica");
    assert_eq!(
        on_replica("sync:sem").as_deref(),
        Some("3"),
        "added permits"
    );
    let exp = c.permit_expirable_semaphore("sync:exp");
    assert!(exp.try_set_permits(1).unwrap());
    for i in 0..20 {
        let p = exp.acquire(Duration::from_secs(60)).unwrap();
        let before = waits();
        p.release().unwrap();
        assert!(waits() > before, "the release waited for the replica");
        assert_eq!(
            on_replica("sync:exp").as_deref(),
            Some("1"),
            "the permit back on the replica when release() returned (round {i})"
        );
    }
    let latch = c.count_down_latch("sync:latch");
    assert!(latch.try_set_count(20).unwrap());
    for left in (0..20).rev() {
        let before = waits();
        latch.count_down().unwrap();
        assert!(waits() > before, "the count-down waited for the replica");
        let want = (left > 0).then(|| left.to_string());
        assert_eq!(
            on_replica("sync:latch"),
            want,
            "the count on the replica when count_down() returned"
        );
    }
}

/// An expirable semaphore's lease update waits for the replicas too, as a
/// lock's renewal: confirmed, the guard goes by the new lease; with the
/// replica stopped it is reported (`ReplicaSync`) and the guard goes by the
/// shorter lease, which a failover could bring back.
#[test]
fn a_permits_lease_update_is_confirmed_by_the_replicas() {
    let (master, replica) = master_and_replica();
    let wait = Duration::from_millis(200);
    let c = client(&master, wait);
    let sem = c.permit_expirable_semaphore("sync:lease");
    assert!(sem.try_set_permits(1).unwrap());
    let p = sem.acquire(Duration::from_secs(5)).unwrap();
    p.update_lease(Duration::from_secs(5)).unwrap(); // script loaded
    let waits = || master.command_stat("wait", "calls");
    let before = waits();
    p.update_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(waits(), before + 1, "the update waited for the replica");
    assert!(p.valid_until() > Instant::now() + Duration::from_secs(50));
    let short = p.valid_until();
    // A shorter lease first (confirmed), then a longer one nobody confirms.
    p.update_lease(Duration::from_secs(10)).unwrap();
    let confirmed = p.valid_until();
    assert!(confirmed < short);
    replica.pause();
    let err = p
        .update_lease(Duration::from_secs(120))
        .expect_err("no replica confirms");
    replica.resume();
    assert!(err.is_replica_sync(), "{err:?}");
    assert!(
        p.valid_until() <= confirmed,
        "the guard went by a lease no replica confirmed"
    );
}

/// A replica that does not answer: the acquisition is undone, retried, and
/// reported as `ReplicaSync`; the lock is not left held. With sync off the
/// same lock is taken at once.
#[test]
fn unconfirmed_acquisition_is_undone_and_reported() {
    let (master, replica) = master_and_replica();
    let wait = Duration::from_millis(200);
    let c = client(&master, wait);
    // Replica count read, and a first write confirmed (the first WAITs of a
    // new connection after a full sync are sometimes slow; pre-existing,
    // seen with the code before the cluster work too).
    wait_until(
        "a first confirmed acquisition",
        Duration::from_secs(20),
        || c.lock("warm").lock().is_ok_and(|g| g.unlock().is_ok()),
    );
    replica.pause();
    let started = Instant::now();
    let err = c
        .lock("sync:stuck")
        .try_lock()
        .expect_err("no replica confirms");
    let took = started.elapsed();
    eprintln!("unconfirmed acquisition ({took:?}): {err}");
    assert!(err.is_replica_sync(), "{err:?}");
    assert!(
        took < wait * 3 + Duration::from_secs(2),
        "three tries of {wait:?} ({took:?})"
    );
    wait_until(
        "the unconfirmed acquisition to be undone",
        Duration::from_secs(10),
        || master.cmd(&["EXISTS", "sync:stuck"]) == "0",
    );
    let off = Client::builder(master.url())
        .sync_replicas(0, Duration::ZERO)
        .build()
        .unwrap();
    let started = Instant::now();
    let g = off.lock("sync:stuck").lock().unwrap();
    assert!(started.elapsed() < wait, "no WAIT with sync off");
    drop(g);
    replica.resume();
    c.lock("sync:stuck")
        .lock()
        .expect("confirmed again")
        .unlock()
        .unwrap();
}

/// A master whose replica is gone takes lock writes without WAIT rather than
/// failing every lock.
#[test]
fn a_master_without_replicas_takes_writes_without_wait() {
    let (master, replica) = master_and_replica();
    let c = client(&master, Duration::from_millis(300));
    wait_until(
        "a first confirmed acquisition",
        Duration::from_secs(20),
        || c.lock("warm").lock().is_ok_and(|g| g.unlock().is_ok()),
    );
    drop(replica); // killed
    wait_until(
        "the master to see its replica gone",
        Duration::from_secs(10),
        || master.info_field("replication", "connected_slaves") == "0",
    );
    for i in 0..5 {
        let g = c
            .lock(format!("nosync:{i}"))
            .lock()
            .unwrap_or_else(|e| panic!("lock {i} with no replica left: {e:?}"));
        g.unlock().unwrap();
    }
}

/// Watched locks are renewed with WAIT too; a stuck replica makes renewals
/// fail (unconfirmed) without losing a lock whose lease has time left.
#[test]
fn renewals_are_synced_and_unconfirmed_ones_count_as_failed() {
    let (master, replica) = master_and_replica();
    // WAIT timeouts in these tests leave a loaded machine's replica time to
    // answer when it runs; a stopped one never does.
    let c = Client::builder(master.url())
        .sync_replicas(1, Duration::from_millis(500))
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let g = c
        .lock("sync:watched")
        .with_renew_interval(Duration::from_millis(200))
        .lock()
        .unwrap();
    wait_until("a renewal", Duration::from_secs(10), || {
        c.stats().renewals >= 2
    });
    replica.pause();
    let before = c.stats().renewals;
    std::thread::sleep(Duration::from_millis(1000));
    let during = c.stats().renewals - before;
    assert!(g.ensure_held().is_ok(), "the lease has time left");
    replica.resume();
    wait_until(
        "renewals to be confirmed again",
        Duration::from_secs(10),
        || c.stats().renewals >= before + during + 2,
    );
    eprintln!("confirmed renewals while the replica was stopped: {during}");
    assert!(
        during <= 1,
        "unconfirmed renewals are not counted ({during})"
    );
    g.unlock().unwrap();
}

/// A user whose ACL lacks `WAIT` still takes locks (without replica sync,
/// with a warning), rather than having every acquisition reported
/// unconfirmed.
#[test]
fn a_user_without_wait_locks_without_replica_sync() {
    let (master, _replica) = master_and_replica();
    let ok = master.cmd(&[
        "ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all", "-wait",
    ]);
    assert_eq!(ok, "OK");
    let c = Client::builder(format!("redis://nowait:pw@127.0.0.1:{}/", master.port()))
        .sync_replicas(1, Duration::from_millis(200))
        .build()
        .unwrap();
    for i in 0..3 {
        let g = c
            .lock(format!("nowait:{i}"))
            .try_lock()
            .unwrap_or_else(|e| panic!("lock {i}: {e:?}"))
            .expect("free");
        g.unlock().unwrap();
    }
}
