//! Redis Cluster: locks on every master through one client, the watchdog's
//! per-node batches, sharded pub/sub, a master killed while locks are held
//! on every master, a held lock's slot migrated while a waiter waits, and
//! the Redisson layout on a cluster.
//!
//! The tests that leave the cluster as they found it share one 3+3 cluster
//! (started once for this binary); the ones that kill a master or move a
//! slot start their own.

use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::redisson_interop::{redisson_channel as channel, Redisson};
use crate::support::{wait_until, Cluster, RedisServer};
use redlease::Client;

const WAIT: Duration = Duration::from_secs(20);
/// A wake-up by pub/sub comes well within this; the holders' leases here
/// are 30 s, so only a release message explains a hand-off inside it.
const HANDOFF_BOUND: Duration = Duration::from_secs(5);

/// The cluster the non-destructive tests share.
fn shared() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start(3, 1))
}

fn client(cluster: &Cluster) -> Client {
    Client::cluster_builder(cluster.seeds())
        .build()
        .expect("client connects to the test cluster")
}

/// Sharded subscribers of `channel` on `node` (`PUBSUB SHARDNUMSUB`).
fn shard_subscribers(node: &RedisServer, channel: &str) -> u64 {
    let out = node.cmd(&["PUBSUB", "SHARDNUMSUB", channel]);
    out.lines()
        .nth(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn locks_on_every_master_exclude_reenter_and_wake() {
    let cluster = shared();
    let names = cluster.names_on_each_master("every-master", 2);
    assert_eq!(names.len(), 3, "one group of names per master");
    let c1 = client(cluster);
    let c2 = client(cluster);
    for name in names.iter().flatten() {
        let master = cluster.master_of_slot(cluster.slot_of(name));
        let g = c1.lock(name).lock().expect("lock");
        assert_eq!(
            master.cmd(&["EXISTS", name]),
            "1",
            "{name}: the lock hash is on its slot's master"
        );
        assert!(
            c2.lock(name).try_lock().expect("try_lock").is_none(),
            "{name}: another client is excluded"
        );
        let again = c1.lock(name).lock().expect("re-entry");
        assert_eq!(again.hold_count(), 2);
        assert_eq!(c1.lock(name).hold_count().expect("hold_count"), 2);
        drop(again);
        assert!(c2.lock(name).try_lock().expect("try_lock").is_none());
        drop(g);
        let g2 = c2.lock(name).try_lock().expect("try_lock");
        assert!(g2.is_some(), "{name}: free once released");
    }
    // A waiter per master, each woken by its own release (sharded pub/sub
    // at its slot's master).
    let holders: Vec<_> = names
        .iter()
        .map(|group| c1.lock(&group[0]).lock().expect("lock"))
        .collect();
    let (tx, rx) = mpsc::channel();
    for group in &names {
        let name = group[0].clone();
        let c2 = c2.clone();
        let tx = tx.clone();
        thread::spawn(move || {
            let got = c2
                .lock(&name)
                .try_lock_for(WAIT)
                .expect("waiter")
                .map(|g| (Instant::now(), g.hold_count()));
            tx.send((name, got)).expect("report");
        });
    }
    for group in &names {
        let master = cluster.master_of_slot(cluster.slot_of(&group[0]));
        wait_until(
            &format!("a sharded subscriber of {} on its master", group[0]),
            WAIT,
            || shard_subscribers(master, &channel(&group[0])) == 1,
        );
    }
    let released = Instant::now();
    drop(holders);
    for _ in 0..names.len() {
        let (name, got) = rx.recv_timeout(WAIT).expect("a waiter reports");
        let (at, count) = got.unwrap_or_else(|| panic!("{name}: the waiter acquired"));
        assert_eq!(count, 1);
        let took = at.duration_since(released);
        println!("{name}: hand-off {took:?}");
        assert!(
            took < HANDOFF_BOUND,
            "{name}: woken by the release ({took:?})"
        );
    }
    let stats = c2.stats();
    assert_eq!(stats.connection_failures, 0);
}

#[test]
fn thousands_of_watched_locks_renewed_in_one_round_trip_per_master() {
    const LOCKS: usize = 5000;
    let lease = Duration::from_secs(2);
    let cluster = shared();
    let c = Client::cluster_builder(cluster.seeds())
        .watchdog_timeout(lease)
        .build()
        .expect("client");
    let crossslot_before = cluster.errorstat("CROSSSLOT");
    let started = Instant::now();
    let guards: Vec<_> = (0..LOCKS)
        .map(|i| c.lock(format!("watched:{i}")).lock().expect("lock"))
        .collect();
    println!("{LOCKS} watched locks taken in {:?}", started.elapsed());
    // One lease for the scripts to be loaded on every master, then three
    // leases measured.
    thread::sleep(lease);
    // Read between batches, so that no batch is counted half.
    let before = crate::quiet_stats(&c);
    thread::sleep(lease * 3);
    let after = crate::quiet_stats(&c);
    for g in &guards {
        g.ensure_held().expect("every lock still held");
    }
    let wakeups = after.renewal_batches - before.renewal_batches;
    let trips = after.renewal_round_trips - before.renewal_round_trips;
    let renewals = after.renewals - before.renewals;
    println!(
        "{wakeups} wake-ups, {trips} round trips ({:.2} per wake-up), {renewals} renewals",
        trips as f64 / wakeups.max(1) as f64
    );
    assert_eq!(after.locks_lost, 0, "no lock lost");
    assert!(wakeups > 0, "the watchdog renewed");
    // One batch under way when `before` was read counts its round trips
    // here but not its wake-up (see quiet_stats).
    assert!(
        trips <= 3 * (wakeups + 1),
        "at most one round trip per master per wake-up: {trips} for {wakeups} wake-ups"
    );
    // Every lock renewed about every lease / 3.
    assert!(
        renewals >= LOCKS as u64 * 6,
        "every lock was renewed several times ({renewals} renewals)"
    );
    assert_eq!(
        cluster.errorstat("CROSSSLOT"),
        crossslot_before,
        "no CROSSSLOT error from a batch"
    );
    // Spot-check the leases on the servers.
    for i in (0..LOCKS).step_by(499) {
        let name = format!("watched:{i}");
        let left = c.lock(&name).remaining_lease().expect("pttl");
        assert!(
            left.is_some_and(|l| l > lease / 3),
            "{name}: lease kept up ({left:?})"
        );
    }
    drop(guards);
}

#[test]
fn a_killed_master_fails_over_and_its_locks_survive() {
    // Without full coverage required, the other masters keep serving while
    // one has failed (by default the whole cluster refuses with CLUSTERDOWN
    // until the failover is done).
    let cluster = Cluster::start_with_args(3, 1, &["--cluster-require-full-coverage", "no"]);
    let names = cluster.names_on_each_master("failover", 10);
    let holder = Client::cluster_builder(cluster.seeds())
        .watchdog_timeout(Duration::from_secs(6))
        .build()
        .expect("client");
    let other = client(&cluster);
    let guards: Vec<_> = names
        .iter()
        .flatten()
        .map(|n| holder.lock(n).lock().expect("lock"))
        .collect();
    let victim_name = names[0][0].clone();
    let victim = cluster.master_of_slot(cluster.slot_of(&victim_name));
    let victim_port = victim.port();
    let fresh_on_victim = cluster
        .names_on_each_master("after-kill", 40)
        .into_iter()
        .flatten()
        .find(|n| cluster.master_of_slot(cluster.slot_of(n)).port() == victim_port)
        .expect("a name on the victim's slots");
    let watcher = cluster
        .masters()
        .into_iter()
        .find(|m| m.port() != victim_port)
        .expect("a surviving master");
    cluster.kill_node(victim);
    let killed = Instant::now();

    // Once the cluster has declared the master failed, and before its
    // replica took over, locks on the other masters work as before: one
    // attempt each, no waiting.
    wait_until("the cluster marks the killed master failed", WAIT, || {
        watcher
            .cmd(&["CLUSTER", "NODES"])
            .lines()
            .any(|l| l.contains(&format!(":{victim_port}@")) && l.contains(" master,fail "))
    });
    println!("master marked failed {:?} after the kill", killed.elapsed());
    for group in &names[1..] {
        // The tag keeps the slot (and the master) of group[0].
        let name = format!("{{{}}}-fresh", group[0]);
        let g = other
            .lock(&name)
            .try_lock()
            .unwrap_or_else(|e| panic!("{name}: a lock on a surviving master: {e}"));
        assert!(g.is_some(), "{name}: acquired at once");
    }

    // Operations on the dead master's slots resume after the failover.
    let g = other
        .lock(&fresh_on_victim)
        .try_lock_for(WAIT)
        .expect("a lock on the failed master's slots")
        .expect("acquired");
    let resumed = killed.elapsed();
    println!("first lock on the failed master's slots {resumed:?} after the kill");
    // cluster-node-timeout (1 s) + election + our refresh.
    assert!(
        resumed < Duration::from_secs(8),
        "operations resume soon after the failover ({resumed:?})"
    );
    drop(g);
    let promoted = cluster.wait_failover_of(victim_port);

    // Two renewal intervals on the new master; then every lock is still held,
    // by its owner only.
    thread::sleep(Duration::from_secs(4));
    for (g, name) in guards.iter().zip(names.iter().flatten()) {
        g.ensure_held()
            .unwrap_or_else(|e| panic!("{name} survived the failover: {e}"));
        assert!(
            other.lock(name).try_lock().expect("try_lock").is_none(),
            "{name}: still held on the servers"
        );
    }
    assert_eq!(
        promoted.cmd(&["EXISTS", &victim_name]),
        "1",
        "the lock is on the promoted replica"
    );
    assert_eq!(holder.stats().locks_lost, 0);
    drop(guards);
    for name in names.iter().flatten() {
        assert!(
            other.lock(name).try_lock().expect("try_lock").is_some(),
            "{name}: released after the failover"
        );
    }
}

#[test]
fn a_held_lock_follows_its_slot_and_its_waiter_is_woken() {
    let cluster = Cluster::start(3, 0);
    let name = "migrating:1";
    let slot = cluster.slot_of(name);
    let from = cluster.master_of_slot(slot);
    let to = cluster
        .masters()
        .into_iter()
        .find(|m| m.port() != from.port())
        .expect("another master");
    let holder = client(&cluster);
    let waiter = client(&cluster);
    // A 30 s lease renewed every 300 ms: renewals cross the migration, and
    // only a release message explains a fast hand-off.
    let guard = holder
        .lock(name)
        .with_renew_interval(Duration::from_millis(300))
        .lock()
        .expect("lock");
    let (tx, rx) = mpsc::channel();
    let w = waiter.clone();
    thread::spawn(move || {
        let got = w
            .lock(name)
            .try_lock_for(Duration::from_secs(60))
            .expect("waiter")
            .map(|_| Instant::now());
        tx.send(got).expect("report");
    });
    wait_until(
        "the waiter subscribed and queued at the source",
        WAIT,
        || {
            shard_subscribers(from, &channel(name)) == 1
                && from.cmd(&["EXISTS", &format!("redlease_waiting:{{{name}}}:{name}")]) == "1"
        },
    );

    // The key moves; the slot is still the source's (ASK).
    cluster.begin_migration(slot, to);
    assert_eq!(
        cluster.migrate_keys(slot),
        2,
        "the lock hash and its queue of waiting processes moved"
    );
    let renewed = holder.stats().renewals;
    wait_until("a renewal during the migration", WAIT, || {
        holder.stats().renewals >= renewed + 2
    });
    assert!(
        cluster.errorstat("ASK") > 0,
        "the renewal was redirected with ASK"
    );
    guard.ensure_held().expect("held while its key migrates");

    // The slot moves: Redis drops the waiter's sharded subscription, and it
    // subscribes again at the new master.
    cluster.finish_migration(slot, to);
    wait_until("the waiter subscribed at the destination", WAIT, || {
        shard_subscribers(to, &channel(name)) == 1
    });
    let renewed = holder.stats().renewals;
    wait_until("a renewal after the migration", WAIT, || {
        holder.stats().renewals >= renewed + 2
    });
    guard.ensure_held().expect("held after its slot moved");
    assert_eq!(holder.stats().locks_lost, 0);
    assert_eq!(
        to.cmd(&["EXISTS", name]),
        "1",
        "the lock is at the new master"
    );

    let released = Instant::now();
    guard.unlock().expect("release after the migration");
    let at = rx
        .recv_timeout(WAIT)
        .expect("the waiter reports")
        .expect("the waiter acquired");
    let took = at.duration_since(released);
    println!("hand-off after the slot moved: {took:?}");
    assert!(took < HANDOFF_BOUND, "woken by the release ({took:?})");
}

#[test]
fn names_without_a_complete_hash_tag_are_refused_on_a_cluster() {
    let c = client(shared());
    for name in ["a{b", "x{}y", "{}", "a}b"] {
        let e = c
            .lock(name)
            .try_lock()
            .expect_err("a name whose keys would span slots");
        assert!(e.to_string().contains("hash tag"), "{name}: {e}");
    }
    let g = c.lock("tagged{t}1").lock().expect("a complete tag works");
    drop(g);
}

#[test]
fn redisson_on_a_cluster_excludes_and_wakes_through_sharded_channels() {
    let cluster = shared();
    let name = "interop:cluster";
    let master = cluster.master_of_slot(cluster.slot_of(name));
    let mut redisson = Redisson::sharded(master);
    let c = client(cluster);

    // Redisson holds; redlease waits on the sharded channel and is woken by
    // Redisson's SPUBLISH.
    assert_eq!(redisson.acquire(name, 30_000), None, "Redisson acquires");
    assert!(c.lock(name).try_lock().expect("try_lock").is_none());
    let (tx, rx) = mpsc::channel();
    let w = c.clone();
    thread::spawn(move || {
        let got = w.lock(name).try_lock_for(WAIT).expect("waiter").map(|g| {
            let at = Instant::now();
            g.unlock().expect("unlock");
            at
        });
        tx.send(got).expect("report");
    });
    wait_until("redlease's sharded subscriber", WAIT, || {
        shard_subscribers(master, &channel(name)) == 1
    });
    let released = Instant::now();
    assert_eq!(redisson.release(name), Some(1), "Redisson releases");
    let at = rx
        .recv_timeout(WAIT)
        .expect("report")
        .expect("redlease acquired");
    assert!(
        at.duration_since(released) < HANDOFF_BOUND,
        "woken by Redisson's SPUBLISH"
    );

    // redlease holds; Redisson is excluded, and a sharded subscriber (what
    // Redisson's waiter does) gets redlease's release message.
    let g = c.lock(name).lock().expect("lock");
    let busy = redisson.acquire(name, 30_000);
    assert!(busy.is_some_and(|ttl| ttl > 0), "Redisson sees it held");
    let mut sub = master.conn();
    let ch = channel(name);
    redis::cmd("SSUBSCRIBE")
        .arg(&ch)
        .exec(&mut sub)
        .expect("SSUBSCRIBE");
    sub.set_read_timeout(Some(WAIT)).expect("read timeout");
    drop(g);
    let msg: Vec<redis::Value> = sub.recv_response().map_or_else(
        |e| panic!("no message on {ch}: {e}"),
        |v| redis::from_redis_value(v).expect("a push"),
    );
    let text: Vec<String> = msg
        .iter()
        .map(|v| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(text, ["smessage", ch.as_str(), "0"], "Redisson's message");
}

#[test]
fn classic_pubsub_on_a_cluster_for_redisson_in_classic_mode() {
    let cluster = shared();
    let name = "classic:1";
    let c = Client::cluster_builder(cluster.seeds())
        .classic_pubsub(true)
        .build()
        .expect("client");
    let holder = Client::cluster_builder(cluster.seeds())
        .classic_pubsub(true)
        .build()
        .expect("client");
    let g = holder.lock(name).lock().expect("lock");
    let (tx, rx) = mpsc::channel();
    let w = c.clone();
    thread::spawn(move || {
        let got = w
            .lock(name)
            .try_lock_for(WAIT)
            .expect("waiter")
            .map(|_| Instant::now());
        tx.send(got).expect("report");
    });
    let master = cluster.master_of_slot(cluster.slot_of(name));
    wait_until("a classic subscriber of the channel", WAIT, || {
        master.subscribers(&channel(name)) == 1
    });
    assert_eq!(shard_subscribers(master, &channel(name)), 0);
    let released = Instant::now();
    drop(g);
    let at = rx.recv_timeout(WAIT).expect("report").expect("acquired");
    assert!(at.duration_since(released) < HANDOFF_BOUND);
}

/// The minimal ACL rule of docs/production.md plus what a cluster needs (the slot map,
/// ASK redirections, sharded pub/sub), set on every node: locks, re-entry,
/// the watchdog and a waiter woken through a sharded channel.
#[test]
fn readme_acl_rule_on_a_cluster() {
    let cluster = shared();
    let rule = format!(
        "{} +cluster|slots +asking +spublish +ssubscribe +sunsubscribe",
        crate::acl::LOCKER_RULE
    );
    for node in cluster.nodes() {
        crate::acl::acl(node, "locker", &rule);
    }
    let seeds: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://locker:lockpw@127.0.0.1:{}/", n.port()))
        .collect();
    let client = || {
        Client::cluster_builder(seeds.clone())
            .watchdog_timeout(Duration::from_millis(900))
            .build()
            .expect("the minimal user reads the slot map")
    };
    let (a, b) = (client(), client());
    let names = cluster.names_on_each_master("orders:acl", 1);
    for name in names.iter().flatten() {
        let g = a.lock(name).lock().expect("lock as the minimal user");
        let again = a.lock(name).lock().expect("re-entry");
        drop(again);
        let started = Instant::now();
        let (tx, rx) = mpsc::channel();
        let b = b.clone();
        let n = name.clone();
        thread::spawn(move || {
            tx.send(b.lock(&n).try_lock_for(WAIT).map(|g| g.is_some()))
                .expect("report");
        });
        let master = cluster.master_of_slot(cluster.slot_of(name));
        wait_until("the waiter's sharded subscription", WAIT, || {
            shard_subscribers(master, &channel(name)) == 1
        });
        // Past one lease: the watchdog renewed as the minimal user.
        while started.elapsed() < Duration::from_millis(1200) {
            thread::sleep(Duration::from_millis(100));
            g.ensure_held().expect("renewed as the minimal user");
        }
        g.unlock().expect("release as the minimal user");
        let got = rx.recv_timeout(WAIT).expect("the waiter reports");
        assert!(got.expect("no error as the minimal user"), "{name}: woken");
    }
    assert_eq!(a.stats().locks_lost, 0);
}

/// A master that stops answering (SIGSTOP: connections are accepted, never
/// answered) holds back neither the renewals on the other masters nor lock
/// operations there.
#[test]
fn a_silent_master_does_not_hold_back_the_others() {
    // Full coverage not required: the cluster marks the silent master failed
    // after a second, and the others keep serving.
    let cluster = Cluster::start_with_args(3, 0, &["--cluster-require-full-coverage", "no"]);
    // Renewed every 2 s; a silent node may hold the watchdog for one
    // response timeout (1 s) once, before it is known unreachable.
    let lease = Duration::from_secs(6);
    let c = Client::cluster_builder(cluster.seeds())
        .watchdog_timeout(lease)
        .response_timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    let names = cluster.names_on_each_master("silent", 1);
    let guards: Vec<_> = names
        .iter()
        .flatten()
        .map(|n| c.lock(n).lock().expect("lock"))
        .collect();
    let stalled = cluster.master_of_slot(cluster.slot_of(&names[0][0]));
    let others: Vec<(&RedisServer, String)> = names[1..]
        .iter()
        .map(|g| (cluster.master_of_slot(cluster.slot_of(&g[0])), g[0].clone()))
        .collect();
    stalled.pause();
    // A call on the silent master ends within its deadline plus about one
    // response timeout (1 s); the slot map is read again in the background.
    let started = Instant::now();
    let r = c
        .lock(&names[0][0])
        .try_lock_for(Duration::from_millis(300));
    let took = started.elapsed();
    println!(
        "try_lock_for(300 ms) on the silent master: {:?} after {took:?}",
        r.as_ref().map(Option::is_some).map_err(ToString::to_string)
    );
    assert!(
        took < Duration::from_millis(300) + Duration::from_secs(2),
        "bounded by the deadline and the response timeout ({took:?})"
    );
    // Three renewal intervals with one master silent: the others' leases are
    // renewed on time (never below a third of the lease: an interval late at
    // most), and locks there are taken and released.
    let mut lowest = lease;
    let started = Instant::now();
    let mut ops = 0;
    while started.elapsed() < lease {
        for (node, name) in &others {
            let out = node.cmd(&["PTTL", name]);
            let ms: u64 = out.parse().unwrap_or_else(|_| panic!("PTTL {name}: {out}"));
            lowest = lowest.min(Duration::from_millis(ms));
            let fresh = format!("{{{name}}}:fresh");
            let g = c.lock(&fresh).try_lock().expect("a lock on a live master");
            assert!(g.is_some(), "{fresh}: free");
            ops += 1;
        }
        thread::sleep(Duration::from_millis(50));
    }
    stalled.resume();
    println!("lowest lease left on the live masters: {lowest:?}; {ops} lock operations there");
    assert!(
        lowest > lease / 3,
        "renewals on the live masters kept on time ({lowest:?} left at worst)"
    );
    for (g, name) in guards.iter().zip(names.iter().flatten()).skip(1) {
        g.ensure_held()
            .unwrap_or_else(|e| panic!("{name} on a live master: {e}"));
    }
}

/// While a slot migrates, scripts on several keys get `ASK` (all keys still
/// missing at the source) and then `TRYAGAIN` (keys split between the
/// nodes): `lock()` waits the migration out instead of failing, and an
/// `unlock()` whose key has moved is completed (at once or in the
/// background), never left to the lease.
#[test]
fn lock_and_unlock_ride_out_a_slot_migration() {
    let cluster = Cluster::start(3, 0);
    let c = client(&cluster);
    let other_master = |slot: u16| {
        let from = cluster.master_of_slot(slot).port();
        cluster
            .masters()
            .into_iter()
            .find(|m| m.port() != from)
            .expect("another master")
    };

    // A free lock whose slot starts migrating: lock() blocks until the slot
    // has moved, then takes it.
    let free = "migration:free";
    let slot = cluster.slot_of(free);
    let to = other_master(slot);
    cluster.begin_migration(slot, to);
    let (tx, rx) = mpsc::channel();
    let c2 = c.clone();
    thread::spawn(move || {
        let r = c2.lock(free).lock().map(|g| g.hold_count());
        tx.send(r).expect("report");
    });
    thread::sleep(Duration::from_millis(500));
    assert!(
        rx.try_recv().is_err(),
        "lock() does not give up while the slot migrates"
    );
    cluster.migrate_keys(slot);
    cluster.finish_migration(slot, to);
    let r = rx
        .recv_timeout(WAIT)
        .expect("lock() returns once the slot moved");
    assert_eq!(r.expect("lock() after the migration"), 1);

    // A held lock whose key moved, its slot still migrating: the release
    // goes through once the migration is done, long before the 30 s lease.
    let held = "migration:held";
    let slot = cluster.slot_of(held);
    let to = other_master(slot);
    let g = c.lock(held).lock().expect("lock");
    cluster.begin_migration(slot, to);
    assert_eq!(cluster.migrate_keys(slot), 1);
    let started = Instant::now();
    let r = g.unlock();
    println!(
        "unlock with the key migrated: {:?} after {:?}",
        r.as_ref().map_err(ToString::to_string),
        started.elapsed()
    );
    if let Err(e) = &r {
        assert!(!e.is_lock_lost(), "not reported lost: {e}");
    }
    cluster.finish_migration(slot, to);
    wait_until(
        "the release completed after the migration",
        Duration::from_secs(10),
        || to.cmd(&["EXISTS", held]) == "0",
    );
    let other = client(&cluster);
    assert!(other.lock(held).try_lock().expect("try_lock").is_some());
}

/// A lazily built client used by many threads at once: the first slot map
/// is read once, and every caller waits for it instead of failing.
#[test]
fn a_lazy_client_reads_the_slot_map_once_for_concurrent_first_callers() {
    let cluster = shared();
    for round in 0..5 {
        let c = Client::cluster_builder(cluster.seeds())
            .build_lazy()
            .expect("lazy client");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let c = c.clone();
                let b = std::sync::Arc::clone(&barrier);
                thread::spawn(move || {
                    b.wait();
                    c.lock(format!("lazy:{round}:{i}")).is_locked()
                })
            })
            .collect();
        for t in threads {
            let r = t.join().expect("thread");
            assert!(!r.expect("first use of a lazy client"), "nothing held");
        }
    }
}

/// A silent master (accepts connections, never answers) with calls piling
/// up on its slots does not starve the healthy masters of connections: a
/// lost reply on a healthy master (its pooled connections discarded) is
/// followed by new connections there at once, and a watched lock there stays
/// held.
#[test]
fn a_silent_master_does_not_starve_the_others_of_connections() {
    let cluster = Cluster::start_behind_proxies(3, 0, &["--cluster-require-full-coverage", "no"]);
    let names = cluster.names_on_each_master("starve", 1);
    let (a_name, b_name) = (names[0][0].clone(), names[1][0].clone());
    let a = cluster.master_of_slot(cluster.slot_of(&a_name));
    let b = cluster.master_of_slot(cluster.slot_of(&b_name));
    // A short lease: the window below needs several renewals on B.
    let c = Client::cluster_builder(cluster.seeds())
        .watchdog_timeout(Duration::from_millis(1500))
        .build()
        .expect("client");
    let g = c.lock(&b_name).lock().expect("lock on B");
    a.pause();
    let window = Duration::from_secs(5);
    let started = Instant::now();
    // Twenty callers keep calling silent A for the whole window, each call
    // held up by its response or connection timeout.
    let on_a: Vec<_> = (0..20)
        .map(|i| {
            let c = c.clone();
            let name = format!("{{{a_name}}}:{i}");
            thread::spawn(move || {
                while started.elapsed() < window {
                    let _ = c.lock(name.as_str()).try_lock();
                    thread::sleep(Duration::from_millis(10));
                }
            })
        })
        .collect();
    cluster
        .proxy_of(b)
        .add_rule(b"lostreply", crate::support::Fault::DropReply, 1);
    let _ = c.lock(format!("{{{b_name}}}:lostreply")).try_lock();
    let mut ok = 0;
    let mut tries = 0;
    while started.elapsed() < window {
        tries += 1;
        // B's connections cut every half second: B needs new ones at every
        // phase of the dials to A, not only once after the lost reply.
        if tries % 5 == 0 {
            cluster.proxy_of(b).cut();
        }
        if c.lock(format!("{{{b_name}}}:after"))
            .try_lock()
            .is_ok_and(|g| g.is_some())
        {
            ok += 1;
        }
        assert!(!g.is_lost(), "the lock on healthy B is kept");
        thread::sleep(Duration::from_millis(100));
    }
    for t in on_a {
        t.join().expect("a caller on A");
    }
    a.resume();
    println!("{ok} of {tries} locks on B while A was silent");
    assert!(
        tries >= 20 && ok * 4 >= tries * 3,
        "locks on B work while A is silent ({ok} of {tries})"
    );
    g.ensure_held().expect("held on B");
}

/// The rest of the family on a cluster, one name per master: each kind's
/// keys land in its name's slot (no CROSSSLOT), and its waiters are woken
/// by sharded messages: a fair lock's waiter on its own channel, readers by
/// a write release, a semaphore's and an expirable semaphore's waiters by
/// a release.
#[test]
fn the_lock_family_works_on_every_master() {
    let cluster = shared();
    let names = cluster.names_on_each_master("family", 1);
    let crossslot_before = cluster.errorstat("CROSSSLOT");
    let c1 = client(cluster);
    let c2 = client(cluster);
    let woken = |f: Box<dyn FnOnce() -> bool + Send>,
                 subscribed: &dyn Fn() -> bool,
                 release: Box<dyn FnOnce()>| {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || tx.send((f(), Instant::now())).expect("report"));
        wait_until("the waiter to subscribe", WAIT, subscribed);
        let released = Instant::now();
        release();
        let (ok, at) = rx.recv_timeout(WAIT).expect("the waiter returns");
        assert!(ok, "the waiter got it");
        assert!(
            at.duration_since(released) < HANDOFF_BOUND,
            "woken by the message"
        );
    };
    for group in &names {
        let name = &group[0];
        let master = cluster.master_of_slot(cluster.slot_of(name));
        // Fair lock.
        let g = c1.fair_lock(name.as_str()).lock().expect("fair lock");
        let fair = c2.fair_lock(name.as_str());
        let line = format!("redisson_lock_queue:{{{name}}}");
        woken(
            Box::new(move || fair.try_lock_for(WAIT).expect("fair wait").is_some()),
            &|| master.cmd(&["LLEN", &line]) == "1",
            Box::new(move || drop(g)),
        );
        // Read-write lock: a write release wakes a reader.
        let rw = format!("{name}:rw");
        let w = c1
            .read_write_lock(rw.as_str())
            .write_lock()
            .lock()
            .expect("write");
        let reader = c2.read_write_lock(rw.as_str());
        let chan = format!("redisson_rwlock:{{{rw}}}");
        let rw_master = cluster.master_of_slot(cluster.slot_of(&rw));
        woken(
            Box::new(move || {
                reader
                    .read_lock()
                    .try_lock_for(WAIT)
                    .expect("read wait")
                    .is_some()
            }),
            &|| shard_subscribers(rw_master, &chan) == 1,
            Box::new(move || drop(w)),
        );
        // Semaphores.
        let sem = format!("{name}:sem");
        c1.semaphore(sem.as_str()).try_set_permits(1).expect("set");
        let p = c1.semaphore(sem.as_str()).acquire(1).expect("acquire");
        let waiter = c2.semaphore(sem.as_str());
        let chan = format!("redisson_sc:{{{sem}}}");
        let sem_master = cluster.master_of_slot(cluster.slot_of(&sem));
        woken(
            Box::new(move || waiter.try_acquire_for(1, WAIT).expect("wait").is_some()),
            &|| shard_subscribers(sem_master, &chan) == 1,
            Box::new(move || p.release().expect("release")),
        );
        let pes = format!("{name}:pes");
        c1.permit_expirable_semaphore(pes.as_str())
            .try_set_permits(1)
            .expect("set");
        let p = c1
            .permit_expirable_semaphore(pes.as_str())
            .acquire(Duration::from_secs(60))
            .expect("acquire");
        let waiter = c2.permit_expirable_semaphore(pes.as_str());
        let chan = format!("redisson_sc:{{{pes}}}");
        let pes_master = cluster.master_of_slot(cluster.slot_of(&pes));
        woken(
            Box::new(move || {
                waiter
                    .try_acquire_for(WAIT, Duration::from_secs(60))
                    .expect("wait")
                    .is_some()
            }),
            &|| shard_subscribers(pes_master, &chan) == 1,
            Box::new(move || p.release().expect("release")),
        );
    }
    assert_eq!(
        cluster.errorstat("CROSSSLOT"),
        crossslot_before,
        "no script touched two slots"
    );
}

/// The lock's slot moved to another master and the hold was then deleted
/// there (as a force-unlock would). The release goes to the old master, is
/// refused with MOVED (it did not run), follows it and finds the hold gone:
/// `unlock()` reports `LockLost`, as on a single server (found by review: a
/// release sent more than once that found nothing was taken for
/// "released", even when the first try was refused).
#[test]
fn a_release_redirected_to_a_deleted_hold_reports_lost() {
    let cluster = Cluster::start(3, 0);
    let a = Client::cluster_builder(cluster.seeds())
        .build()
        .expect("client a");
    let name = "moved:deleted";
    let g = a
        .lock(name)
        .lock_with_lease(Duration::from_secs(30))
        .expect("a holds");
    let slot = cluster.slot_of(name);
    let from = cluster.master_of_slot(slot);
    let to = cluster
        .masters()
        .into_iter()
        .find(|m| !std::ptr::eq(*m, from))
        .expect("another master");
    cluster.migrate_slot(slot, to);
    assert_eq!(to.cmd(&["DEL", name]), "1", "the lock moved with its slot");
    let moved_before = cluster.errorstat("MOVED");
    let r = g.unlock();
    let moved = cluster.errorstat("MOVED") - moved_before;
    assert!(
        moved >= 1,
        "inconclusive: the client's slot map was read again first"
    );
    assert!(
        matches!(&r, Err(e) if e.is_lock_lost()),
        "a's hold was deleted before its release, yet unlock() returned {r:?}"
    );
}
