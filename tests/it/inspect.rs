//! Who holds and who waits (`holders()`, `FairLock::queue()`,
//! `Client::inspect`, `Client::list`): every kind's holders with their
//! client, owner, count, lease and process; a Redisson-layout holder
//! written by a raw script; the fair line in order; the process key.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::{Client, HoldMode, Holder, ObjectKind};

use crate::support::{wait_until, Cluster, RedisServer};

const WAIT: Duration = Duration::from_secs(10);

fn client(srv: &RedisServer, name: &str) -> Client {
    Client::builder(srv.url())
        .name(name)
        .build()
        .expect("client connects to the test server")
}

/// This machine's host name, as the process key gives it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The process key of `c` (its first 16 hex digits).
fn process_key(c: &Client) -> String {
    crate::support::process_key(c.id())
}

/// Waits until `c` has published its process key on `srv`.
fn wait_published(srv: &RedisServer, c: &Client) {
    let key = process_key(c);
    wait_until(&format!("the process key {key}"), WAIT, || {
        srv.cmd(&["EXISTS", &key]) == "1"
    });
}

/// Checks that `h` is `c`'s holder in this process, named `name`.
fn assert_ours(h: &Holder, c: &Client, name: &str) {
    assert_eq!(h.client_id.as_deref(), Some(c.id()), "{h:?}");
    let p = h.process.as_ref().expect("a redlease holder's process");
    assert_eq!(p.client_id, c.id());
    assert_eq!(p.pid, std::process::id());
    assert_eq!(p.host, host());
    assert_eq!(p.name.as_deref(), Some(name));
    assert_eq!(p.version, env!("CARGO_PKG_VERSION"));
    assert!(p.started <= std::time::SystemTime::now());
}

#[test]
fn holders_of_a_reentrant_fenced_and_owned_lock() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-a");
    let lock = c.lock("inspect:plain");
    assert!(lock.holders().expect("holders").is_empty(), "free");
    let g1 = lock.lock().expect("lock");
    let g2 = lock.lock().expect("re-entry");
    wait_published(&srv, &c);
    let h = lock.holders().expect("holders");
    assert_eq!(h.len(), 1, "one owner, not its generation: {h:?}");
    assert_eq!(h[0].count, 2);
    assert_eq!(h[0].mode, HoldMode::Exclusive);
    assert!(h[0].owner_id.is_some());
    assert!(h[0].owner.starts_with(c.id()));
    let lease = h[0].remaining_lease.expect("a lease");
    assert!(lease > Duration::ZERO && lease <= c.watchdog_timeout());
    assert_ours(&h[0], &c, "svc-a");
    drop((g2, g1));
    assert!(lock.holders().expect("holders").is_empty());

    // Fenced: the same layout; owned: the guard's own id, not the thread's.
    let fenced = c.fenced_lock("inspect:fenced");
    let _g = fenced.lock().expect("fenced");
    let h = fenced.holders().expect("holders");
    assert_eq!(h.len(), 1);
    assert_ours(&h[0], &c, "svc-a");
    let owned = c.lock("inspect:owned").owned();
    let og = owned.lock().expect("owned");
    let thread_hold = c.lock("inspect:thread").lock().expect("lock");
    let oh = owned.holders().expect("holders");
    let th = c.lock("inspect:thread").holders().expect("holders");
    assert_eq!(oh.len(), 1);
    assert_ne!(
        oh[0].owner_id, th[0].owner_id,
        "an owned guard is no thread"
    );
    assert_ours(&oh[0], &c, "svc-a");
    // It moves to another thread; it is still the same holder.
    let owner = oh[0].owner.clone();
    thread::spawn(move || drop(og))
        .join()
        .expect("drop on another thread");
    assert!(
        owned.holders().expect("holders").is_empty(),
        "{owner} released"
    );
    drop(thread_hold);
}

/// A holder written as Redisson writes it (no generation, no process key):
/// listed with its field, count and lease, and no process.
#[test]
fn a_redisson_holder_is_listed_with_what_the_layout_tells() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-b");
    let java = "0b6e7c3a-5d1f-4c2e-9a8b-7f6e5d4c3b2a:57";
    // RLock's tryLockInnerAsync, as Redisson sends it.
    let script = "if ((redis.call('exists', KEYS[1]) == 0) or \
                  (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then \
                  redis.call('hincrby', KEYS[1], ARGV[2], 1); \
                  redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
                  return redis.call('pttl', KEYS[1]);";
    for _ in 0..3 {
        srv.cmd(&["EVAL", script, "1", "inspect:java", "30000", java]);
    }
    let h = c.lock("inspect:java").holders().expect("holders");
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].owner, java);
    assert_eq!(
        h[0].client_id.as_deref(),
        Some("0b6e7c3a-5d1f-4c2e-9a8b-7f6e5d4c3b2a")
    );
    assert_eq!(h[0].owner_id, Some(57));
    assert_eq!(h[0].count, 3);
    assert!(h[0]
        .remaining_lease
        .is_some_and(|l| l <= Duration::from_secs(30)));
    assert_eq!(h[0].process, None, "Redisson publishes no process key");
    let found = c.inspect("inspect:java").expect("inspect");
    assert_eq!(found.kind, ObjectKind::Lock);
    assert_eq!(found.holders[0].owner, java);
}

#[test]
fn holders_of_a_read_write_lock_by_mode() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-rw");
    let rw = c.read_write_lock("inspect:rw");
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let reader = {
        let rw = rw.clone();
        thread::spawn(move || {
            let _a = rw.read_lock().lock().expect("read");
            let _b = rw.read_lock().lock().expect("read again");
            tx.send(()).expect("report");
            done_rx.recv_timeout(WAIT).ok();
        })
    };
    rx.recv_timeout(WAIT).expect("the reader holds");
    let _r = rw.read_lock().lock().expect("a second reader");
    let h = rw.holders().expect("holders");
    assert_eq!(h.len(), 2, "{h:?}");
    assert!(h.iter().all(|h| h.mode == HoldMode::Read));
    let mut counts: Vec<u64> = h.iter().map(|h| h.count).collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2]);
    assert!(h.iter().all(|h| h.remaining_lease.is_some()), "{h:?}");
    done_tx.send(()).expect("let the reader go");
    reader.join().expect("reader");
    drop(_r);
    let w = rw.write_lock().lock().expect("write");
    let h = rw.holders().expect("holders");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].mode, HoldMode::Write);
    assert!(h[0].owner.ends_with(":write"));
    wait_published(&srv, &c);
    assert_ours(&rw.holders().expect("holders")[0], &c, "svc-rw");
    assert_eq!(
        c.inspect("inspect:rw").expect("inspect").kind,
        ObjectKind::ReadWriteLock
    );
    drop(w);
}

#[test]
fn holders_of_both_semaphores() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-sem");
    let sem = c.semaphore("inspect:sem");
    assert!(sem.try_set_permits(5).expect("set"));
    let p3 = sem.acquire(3).expect("3 permits");
    let p1 = sem.acquire(1).expect("1 permit");
    wait_published(&srv, &c);
    let mut h = sem.holders().expect("holders");
    h.sort_by_key(|h| h.count);
    assert_eq!(h.iter().map(|h| h.count).collect::<Vec<_>>(), [1, 3]);
    for holder in &h {
        assert_eq!(holder.mode, HoldMode::Permits);
        assert_eq!(holder.remaining_lease, None);
        assert_ours(holder, &c, "svc-sem");
    }
    let found = c.inspect("inspect:sem").expect("inspect");
    assert_eq!(found.kind, ObjectKind::Semaphore);
    assert_eq!(found.value, Some(1));
    drop((p3, p1));
    assert!(sem.holders().expect("holders").is_empty());

    let ex = c.permit_expirable_semaphore("inspect:ex");
    assert!(ex.try_set_permits(2).expect("set"));
    let permit = ex.acquire(Duration::from_secs(60)).expect("permit");
    let h = ex.holders().expect("holders");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].owner, permit.id());
    assert_eq!(h[0].count, 1);
    assert!(h[0]
        .remaining_lease
        .is_some_and(|l| l > Duration::from_secs(50) && l <= Duration::from_secs(60)));
    assert_ours(&h[0], &c, "svc-sem");
    let found = c.inspect("inspect:ex").expect("inspect");
    assert_eq!(found.kind, ObjectKind::ExpirableSemaphore);
    assert_eq!(found.holders[0].owner, permit.id());
}

/// The fair line in arrival order, with the places' deadlines and the
/// waiters' processes; a Redisson waiter in it keeps its own deadline.
#[test]
fn a_fair_lock_lists_its_line_in_order() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-fair");
    let fair = c.fair_lock("inspect:fair");
    let g = fair.lock().expect("lock");
    assert!(fair.queue().expect("queue").is_empty());
    let (tx, rx) = mpsc::channel();
    let mut waiters = Vec::new();
    let mut owners = Vec::new();
    for i in 0..3 {
        let lock = fair.clone();
        let tx = tx.clone();
        waiters.push(thread::spawn(move || {
            let g = lock.try_lock_for(WAIT).expect("wait").expect("its turn");
            tx.send(i).expect("report");
            drop(g);
        }));
        wait_until(&format!("waiter {i} in line"), WAIT, || {
            fair.queue().expect("queue").len() == i + 1
        });
        owners.push(fair.queue().expect("queue")[i].owner.clone());
    }
    wait_published(&srv, &c);
    let q = fair.queue().expect("queue");
    assert_eq!(
        q.iter().map(|w| w.owner.clone()).collect::<Vec<_>>(),
        owners
    );
    for w in &q {
        assert_eq!(w.client_id.as_deref(), Some(c.id()));
        assert!(w.place_kept_for > Duration::ZERO, "{w:?}");
        let p = w.process.as_ref().expect("process");
        assert_eq!(p.name.as_deref(), Some("svc-fair"));
    }
    let found = c.inspect("inspect:fair").expect("inspect");
    assert_eq!(found.kind, ObjectKind::FairLock);
    assert_eq!(found.queue.len(), 3);
    assert_eq!(found.holders.len(), 1);
    drop(g);
    let order: Vec<usize> = (0..3)
        .map(|_| rx.recv_timeout(WAIT).expect("turn"))
        .collect();
    assert_eq!(order, [0, 1, 2]);
    for w in waiters {
        w.join().expect("waiter");
    }
    assert!(fair.queue().expect("queue").is_empty());
}

#[test]
fn inspect_and_list_tell_the_kinds_apart() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-list");
    let _l = c.lock("app:lock").lock().expect("lock");
    let _f = c.fenced_lock("app:fenced").lock().expect("fenced");
    let _fair = c.fair_lock("app:fair").lock().expect("fair");
    let _w = c
        .read_write_lock("app:rw")
        .write_lock()
        .lock()
        .expect("write");
    let sem = c.semaphore("app:sem");
    sem.try_set_permits(2).expect("set");
    let _p = sem.acquire(1).expect("permit");
    let latch = c.count_down_latch("app:latch");
    latch.try_set_count(3).expect("set");
    srv.cmd(&["SET", "app:text", "hello"]);
    srv.cmd(&["HSET", "app:hash", "a", "b"]);
    srv.cmd(&["SET", "other:lock", "1"]);
    let kinds: Vec<(String, ObjectKind)> = c
        .list("app:*")
        .expect("list")
        .into_iter()
        .map(|i| (i.name, i.kind))
        .collect();
    let expect = |n: &str, k: ObjectKind| (n.to_owned(), k);
    assert_eq!(
        kinds,
        [
            // Nobody in line: a fair lock's keys are a plain lock's.
            expect("app:fair", ObjectKind::Lock),
            expect("app:fenced", ObjectKind::FencedLock),
            expect("app:latch", ObjectKind::Counter),
            expect("app:lock", ObjectKind::Lock),
            expect("app:rw", ObjectKind::ReadWriteLock),
            expect("app:sem", ObjectKind::Semaphore),
        ],
        "the family's objects, not their parts, not other keys"
    );
    let fenced = c.inspect("app:fenced").expect("inspect");
    assert_eq!(fenced.value, Some(1), "the last token");
    assert!(fenced.remaining_lease.is_some());
    let text = c.inspect("app:text").expect("inspect");
    assert_eq!(text.kind, ObjectKind::Other("string".into()));
    assert_eq!(
        c.inspect("app:none").expect("inspect").kind,
        ObjectKind::Missing
    );
    assert!(c.inspect("").is_err(), "an empty name is refused");
}

/// A waiting process shows as a subscriber of the lock's channel.
#[test]
fn inspect_counts_the_processes_waiting() {
    let srv = RedisServer::start();
    let c = client(&srv, "svc-wait");
    let other = client(&srv, "svc-wait-2");
    let g = c.lock("inspect:waited").lock().expect("lock");
    assert_eq!(
        c.inspect("inspect:waited")
            .expect("inspect")
            .waiting_processes,
        0
    );
    let lock = other.lock("inspect:waited");
    let waiter = thread::spawn(move || lock.try_lock_for(WAIT).expect("wait").is_some());
    wait_until("the other client's subscription", WAIT, || {
        c.inspect("inspect:waited")
            .expect("inspect")
            .waiting_processes
            == 1
    });
    drop(g);
    assert!(waiter.join().expect("waiter"), "the waiter gets it");
    // A latch's waiters count too (a counter may be either).
    let latch = c.count_down_latch("inspect:latch");
    latch.try_set_count(1).expect("set");
    let waiting = other.count_down_latch("inspect:latch");
    let waiter = thread::spawn(move || waiting.wait_for(WAIT).expect("wait"));
    wait_until("the latch waiter's subscription", WAIT, || {
        c.inspect("inspect:latch")
            .expect("inspect")
            .waiting_processes
            == 1
    });
    latch.count_down().expect("count down");
    assert!(waiter.join().expect("waiter"), "the latch opened");
}

/// The process key lives while its client does, and expires a watchdog
/// lease after the client is gone.
#[test]
fn the_process_key_expires_after_its_client() {
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(600))
        .build()
        .expect("client");
    let key = process_key(&c);
    assert_eq!(srv.cmd(&["EXISTS", &key]), "0", "not before the first hold");
    let g = c.lock("inspect:brief").lock().expect("lock");
    wait_published(&srv, &c);
    // Renewed: still there after three of its leases.
    let renewals = c.stats().renewals;
    wait_until("renewals for 3 leases", WAIT, || {
        c.stats().renewals >= renewals + 9
    });
    assert_eq!(srv.cmd(&["EXISTS", &key]), "1", "renewed with the client");
    assert_eq!(srv.cmd(&["HGET", &key, "name"]), "", "no name given");
    drop(g);
    drop(c);
    wait_until("the process key to expire", WAIT, || {
        srv.cmd(&["EXISTS", &key]) == "0"
    });
}

/// A key with binary data (an application's) among the keys a pattern
/// matches is no lock, and `list` goes on past it.
#[test]
fn list_and_inspect_survive_binary_values() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url().as_str()).expect("client");
    let _g = c.lock("rv:lock").lock().expect("lock");
    let mut r = srv.conn();
    let _: () = redis::cmd("SET")
        .arg("rv:blob")
        .arg(&[0xff_u8, 0xfe, 0x00][..])
        .query(&mut r)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("rv:binhash")
        .arg(&[0xc3_u8, 0x28][..])
        .arg(&[0xff_u8][..])
        .query(&mut r)
        .unwrap();

    let found = c.inspect("rv:blob");
    println!("inspect(rv:blob) = {found:?}");
    let found = c.inspect("rv:binhash");
    println!("inspect(rv:binhash) = {found:?}");
    let listed = c.list("rv:*");
    println!("list(rv:*) = {listed:?}");
    let listed = listed.expect("list skips keys that are no lock");
    let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["rv:lock"]);
    assert_eq!(
        c.inspect("rv:binhash").expect("inspect").kind,
        ObjectKind::Other("hash".into())
    );
}

/// A hash of counters (an application's) is no lock: a holder's field is
/// `<client>:<number>`.
#[test]
fn a_hash_of_counts_is_not_a_lock() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url().as_str()).expect("client");
    srv.cmd(&["HSET", "rv:stats", "hits", "5", "misses", "2"]);
    let found = c.inspect("rv:stats").expect("inspect");
    println!(
        "inspect(rv:stats) = {:?} holders {:?}",
        found.kind, found.holders
    );
    let listed = c.list("rv:*").expect("list");
    println!(
        "list(rv:*) = {:?}",
        listed
            .iter()
            .map(|i| (&i.name, &i.kind))
            .collect::<Vec<_>>()
    );
    assert_eq!(found.kind, ObjectKind::Other("hash".into()));
    assert!(listed.is_empty());
}

/// A user who may read its locks (HGETALL, MULTI, EXEC added to the
/// minimal rule of docs/production.md) but not the process keys: the holders are listed, without
/// their process.
#[test]
fn holders_without_access_to_process_keys() {
    let srv = RedisServer::start();
    let rule = "on >lockpw resetkeys ~orders:* ~redisson_lock__channel:* \
        ~redisson_unlock_latch:* ~redlease_acquire_cancel:* ~redlease_force_unlock_latch:* \
        resetchannels &redisson_lock__channel:* -@all +eval +evalsha +exists +get +set +del \
        +hset +hget +hmget +hexists +hdel +pexpire +pexpireat +pttl +time +publish +subscribe \
        +unsubscribe +ping +role +wait +hgetall +multi +exec";
    crate::acl::acl(&srv, "reader", rule);
    let c = Client::builder(format!("redis://reader:lockpw@127.0.0.1:{}/", srv.port()))
        .build()
        .expect("client");
    let lock = c.lock("orders:2");
    let _g = lock.lock().expect("lock");
    let h = lock.holders();
    println!("holders() = {h:?}");
    let h = h.expect("the holders, without their process");
    assert_eq!(h.len(), 1);
}

/// The process key comes back after a restart that lost it.
#[test]
fn the_process_key_comes_back_after_a_restart() {
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .expect("client");
    drop(
        c.lock("rv:r")
            .lock_with_lease(Duration::from_secs(1))
            .expect("lock"),
    );
    let key = crate::support::process_key(c.id());
    crate::support::wait_until("published", Duration::from_secs(10), || {
        srv.cmd(&["EXISTS", &key]) == "1"
    });
    srv.cmd(&["FLUSHALL"]);
    srv.restart();
    crate::support::wait_until("published again", Duration::from_secs(10), || {
        srv.cmd(&["EXISTS", &key]) == "1"
    });
}

/// The process key's node is slow (it answers within the response
/// timeout): its writes must not hold up the renewals of a lock on another,
/// healthy node (they did: the lock lost its lease after 2.8 s).
#[test]
fn a_slow_process_key_node_loses_a_lock_on_a_healthy_node() {
    let cluster = Cluster::start_behind_proxies(3, 0, &[]);
    let lease = Duration::from_millis(1500);
    let response = Duration::from_millis(1400);
    let c = Client::cluster_builder(cluster.seeds())
        .watchdog_timeout(lease)
        .response_timeout(response)
        .build()
        .expect("client");
    let key = crate::support::process_key(c.id());
    let key_node = cluster.master_of_slot(cluster.slot_of(&key));
    // A lock on another master.
    let name = cluster
        .names_on_each_master("rv-healthy", 1)
        .into_iter()
        .flatten()
        .find(|n| cluster.master_of_slot(cluster.slot_of(n)).port() != key_node.port())
        .expect("a name on another master");
    let g = c.lock(&name).lock().expect("lock");
    crate::support::wait_until("the process key", Duration::from_secs(10), || {
        key_node.cmd(&["EXISTS", &key]) == "1"
    });
    // The key's node becomes slow: each round trip 1.3 s late (within the
    // response timeout: no failure, no fail-fast).
    cluster
        .proxy_of(key_node)
        .set_delay(Duration::from_millis(650));
    let node = cluster.master_of_slot(cluster.slot_of(&name));
    let started = Instant::now();
    let mut gone_at = None;
    let mut seemed_lost_at = None;
    while started.elapsed() < Duration::from_secs(6) {
        if seemed_lost_at.is_none() && g.is_lost() {
            seemed_lost_at = Some(started.elapsed());
        }
        if gone_at.is_none() && node.cmd(&["EXISTS", &name]) == "0" {
            gone_at = Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.proxy_of(key_node).set_delay(Duration::ZERO);
    let stats = c.stats();
    println!(
        "key gone from redis at {gone_at:?}; guard seemed lost at {seemed_lost_at:?}; \
         lost now: {}; locks_lost {} renewals {} batches {}",
        g.is_lost(),
        stats.locks_lost,
        stats.renewals,
        stats.renewal_batches
    );
    assert_eq!(
        gone_at, None,
        "a lock on a healthy node lost its lease in redis"
    );
    assert_eq!(stats.locks_lost, 0);
}

/// One odd key does not hide the rest: a fair lock whose timeouts key is a
/// string (a key of the wrong type where a part of the family belongs) is
/// left out of `list`, which lists the other locks; `inspect` on it says
/// what is wrong.
#[test]
fn list_leaves_out_a_name_whose_parts_cannot_be_read() {
    let srv = RedisServer::start();
    let c = client(&srv, "odd-parts");
    srv.cmd(&[
        "HSET",
        "good",
        "8d1f3b9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b:1",
        "1",
    ]);
    srv.cmd(&["HSET", "odd", "u:1", "1"]);
    srv.cmd(&["RPUSH", "redisson_lock_queue:{odd}", "w:1"]);
    srv.cmd(&["SET", "redisson_lock_timeout:{odd}", "not-a-zset"]);
    let found = c.list("*").expect("list despite one odd key");
    let names: Vec<&str> = found.iter().map(|i| i.name.as_str()).collect();
    assert!(names.contains(&"good"), "{names:?}");
    assert!(!names.contains(&"odd"), "{names:?}");
    assert!(c.inspect("odd").is_err(), "inspect names the problem");
}

/// Parts of a lock or semaphore that someone else overwrote with text that is
/// no number (a fencing token, a permit record's count) do not fail the
/// inspection with a conversion error naming no key: the token is left out,
/// the record names no holder, and the rest is read as usual.
#[test]
fn inspect_survives_a_token_and_a_permit_record_that_are_no_numbers() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url().as_str()).expect("client");
    let _g = c.fenced_lock("gt:fenced").lock().expect("fenced lock");
    srv.cmd(&["SET", "redisson_lock_token:{gt:fenced}", "not-a-number"]);
    let found = c
        .inspect("gt:fenced")
        .expect("inspect of a fenced lock whose token is text");
    assert_eq!(found.kind, ObjectKind::FencedLock);
    assert_eq!(found.value, None, "no token read from text");
    assert_eq!(found.holders.len(), 1, "{found:?}");

    let sem = c.semaphore("gt:sem");
    assert!(sem.try_set_permits(3).expect("set permits"));
    let _permits = sem.acquire(2).expect("two permits");
    srv.cmd(&[
        "HSET",
        "redlease_semaphore_permits:{gt:sem}",
        "someone:1",
        "lots",
    ]);
    let found = c
        .inspect("gt:sem")
        .expect("inspect of a semaphore with a text record");
    assert_eq!(
        found.holders.len(),
        1,
        "only the readable record: {found:?}"
    );
    assert_eq!(found.holders[0].count, 2);
}
