//! The read-write lock (Redisson's RReadWriteLock layout): readers share,
//! a writer excludes everyone (oracle across threads and clients), re-entry,
//! read under write and downgrade, no silent upgrade deadlock, a write
//! release waking every waiting reader, the watchdog renewing read holds'
//! own keys (a vanished reader's holds run out), lost replies undone or
//! completed, renewals of every kind in one round trip, and Redisson's own
//! scripts sharing the lock both ways.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, Fault, Proxy, RedisServer};
use redlease::Client;

const WAIT: Duration = Duration::from_secs(20);
const CHANNEL: &str = "redisson_rwlock:{rw}";

// Redisson's scripts (redisson-family.md §4), without the unlock latch.
const REDISSON_READ: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call('hset', KEYS[1], 'mode', 'read'); redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('set', KEYS[2] .. ':1', 1); redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1); local key = KEYS[2] .. ':' .. ind; redis.call('set', key, 1); redis.call('pexpire', key, ARGV[1]); local remainTime = redis.call('pttl', KEYS[1]); redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1])); return nil; end; return redis.call('pttl', KEYS[1]);";
const REDISSON_READ_UNLOCK: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call(ARGV[3], KEYS[2], ARGV[1]); return 1; end; local lockExists = redis.call('hexists', KEYS[1], ARGV[2]); if (lockExists == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1); if (counter == 0) then redis.call('hdel', KEYS[1], ARGV[2]); end; redis.call('del', KEYS[3] .. ':' .. (counter+1)); if (redis.call('hlen', KEYS[1]) > 1) then local maxRemainTime = -3; local keys = redis.call('hkeys', KEYS[1]); for n, key in ipairs(keys) do local c = tonumber(redis.call('hget', KEYS[1], key)); if type(c) == 'number' then for i=c, 1, -1 do local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i); maxRemainTime = math.max(remainTime, maxRemainTime); end; end; end; if maxRemainTime > 0 then redis.call('pexpire', KEYS[1], maxRemainTime); return 0; end; if mode == 'write' then return 0; end; end; redis.call('del', KEYS[1]); redis.call(ARGV[3], KEYS[2], ARGV[1]); return 1;";
const REDISSON_WRITE: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call('hset', KEYS[1], 'mode', 'write'); redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (mode == 'write') then if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); local currentExpire = redis.call('pttl', KEYS[1]); redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]); return nil; end; end; return redis.call('pttl', KEYS[1]);";
const REDISSON_WRITE_UNLOCK: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call(ARGV[4], KEYS[2], ARGV[1]); return 1; end; if (mode == 'write') then local lockExists = redis.call('hexists', KEYS[1], ARGV[3]); if (lockExists == 0) then return nil; else local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; else redis.call('hdel', KEYS[1], ARGV[3]); if (redis.call('hlen', KEYS[1]) == 1) then redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); else redis.call('hset', KEYS[1], 'mode', 'read'); end; return 1; end; end; end; return nil;";
const JAVA: &str = "6f1c2b1a-0000-4000-8000-00000000beef:7";

fn client(url: &str) -> Client {
    Client::open(url).expect("client")
}

fn eval(conn: &mut redis::Connection, script: &str, keys: &[&str], args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(conn).expect("EVAL")
}

/// The oracle: 8 threads on two clients, each taking the read lock (two of
/// three rounds) or the write lock, count the readers and writers inside;
/// never a writer with anyone else, and readers do overlap.
#[test]
fn readers_share_and_a_writer_excludes_everyone() {
    let srv = RedisServer::start();
    let clients = [client(&srv.url()), client(&srv.url())];
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let peak_readers = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let rw = clients[t % 2].read_write_lock("rw");
            let (readers, writers, peak_readers, violations, start) = (
                Arc::clone(&readers),
                Arc::clone(&writers),
                Arc::clone(&peak_readers),
                Arc::clone(&violations),
                Arc::clone(&start),
            );
            thread::spawn(move || {
                start.wait();
                for r in 0..30 {
                    if (t + r) % 3 == 0 {
                        let g = rw.write_lock().lock().expect("write");
                        if writers.fetch_add(1, Ordering::SeqCst) != 0
                            || readers.load(Ordering::SeqCst) != 0
                        {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        thread::sleep(Duration::from_micros(500));
                        writers.fetch_sub(1, Ordering::SeqCst);
                        g.unlock().expect("write unlock");
                    } else {
                        let g = rw.read_lock().lock().expect("read");
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        peak_readers.fetch_max(now, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        thread::sleep(Duration::from_micros(500));
                        readers.fetch_sub(1, Ordering::SeqCst);
                        g.unlock().expect("read unlock");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker");
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "a writer overlapped");
    assert!(
        peak_readers.load(Ordering::SeqCst) >= 2,
        "readers never overlapped"
    );
    assert_eq!(srv.cmd(&["EXISTS", "rw"]), "0", "all released");
    assert_eq!(
        srv.cmd(&["KEYS", "*rwlock_timeout*"]),
        "",
        "no hold key left"
    );
}

#[test]
fn a_writer_reenters_reads_and_downgrades() {
    let srv = RedisServer::start();
    let a = client(&srv.url());
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let w1 = rw.write_lock().lock().expect("write");
    let w2 = rw.write_lock().lock().expect("re-entry");
    assert_eq!(w2.hold_count(), 2);
    assert!(rw.is_write_locked().expect("mode"));
    let r = rw.read_lock().lock().expect("the writer's thread reads");
    let other = b.read_write_lock("rw");
    assert!(other.read_lock().try_lock().expect("try").is_none());
    drop(w2);
    drop(w1);
    // Downgraded: this thread still reads, so others may read, not write.
    assert!(!rw.is_write_locked().expect("mode"));
    assert_eq!(srv.cmd(&["HGET", "rw", "mode"]), "read");
    let r2 = other
        .read_lock()
        .try_lock()
        .expect("try")
        .expect("another reader enters after the downgrade");
    assert!(other.write_lock().try_lock().expect("try").is_none());
    drop(r2);
    drop(r);
    assert!(!rw.is_locked().expect("locked"));
    assert!(other.write_lock().try_lock().expect("try").is_some());
}

#[test]
fn a_reader_never_silently_waits_for_itself_to_upgrade() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let rw = c.read_write_lock("rw");
    let _r = rw.read_lock().lock().expect("read");
    let t = Instant::now();
    assert!(rw
        .write_lock()
        .try_lock_for(Duration::from_millis(300))
        .expect("try_lock_for")
        .is_none());
    assert!(t.elapsed() >= Duration::from_millis(300));
    let e = rw.write_lock().lock().expect_err("no upgrade");
    assert!(e.is_invalid_argument(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("write lock of \"rw\""), "{msg}");
    assert!(msg.contains("release the read lock first"), "{msg}");
    let e = rw
        .write_lock()
        .lock_with_lease(Duration::from_secs(5))
        .expect_err("no upgrade");
    assert!(e.is_invalid_argument(), "{e}");
}

#[test]
fn a_write_release_wakes_every_waiting_reader() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let w = holder
        .read_write_lock("rw")
        .write_lock()
        .lock()
        .expect("write");
    let clients = [client(&srv.url()), client(&srv.url())];
    let inside = Arc::new(Barrier::new(5));
    let (tx, rx) = mpsc::channel();
    for i in 0..4 {
        let rw = clients[i % 2].read_write_lock("rw");
        let (tx, inside) = (tx.clone(), Arc::clone(&inside));
        thread::spawn(move || {
            let g = rw.read_lock().try_lock_for(WAIT).expect("wait");
            tx.send((g.is_some(), Instant::now())).expect("report");
            // All four hold it at once.
            inside.wait();
            drop(g);
        });
    }
    wait_until("the readers to subscribe", WAIT, || {
        srv.subscribers(CHANNEL) == 2
    });
    let released = Instant::now();
    w.unlock().expect("unlock");
    for _ in 0..4 {
        let (ok, at) = rx.recv_timeout(WAIT).expect("every reader returns");
        assert!(ok);
        let took = at.duration_since(released);
        assert!(
            took < Duration::from_secs(5),
            "woken by the message ({took:?})"
        );
    }
    inside.wait();
}

/// The watchdog renews a read hold's own keys (all of them, re-entries
/// too), never another reader's: a reader that vanished without releasing
/// runs out, and the last live reader's release frees the lock at once.
#[test]
fn the_watchdog_keeps_read_holds_alive_and_only_its_own() {
    let srv = RedisServer::start();
    let a = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .expect("client");
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let r1 = rw.read_lock().lock().expect("read");
    let r2 = rw.read_lock().lock().expect("re-entry");
    // A reader of another client that vanishes: its 900 ms holds never
    // get released.
    let vanished = b
        .read_write_lock("rw")
        .read_lock()
        .lock_with_lease(Duration::from_millis(900))
        .expect("read");
    std::mem::forget(vanished);
    let prefix = format!("{{rw}}:{}:", a.id());
    let keys = |pattern: &str| -> Vec<String> {
        let out = srv.cmd(&["KEYS", pattern]);
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    thread::sleep(Duration::from_millis(2500));
    let mine = keys(&format!("{prefix}*"));
    assert_eq!(mine.len(), 2, "both read holds' keys live: {mine:?}");
    for k in &mine {
        let ttl: i64 = srv.cmd(&["PTTL", k]).parse().expect("pttl");
        assert!(ttl > 0, "{k} renewed ({ttl})");
    }
    let theirs = keys(&format!("{{rw}}:{}:*", b.id()));
    assert!(
        theirs.is_empty(),
        "the vanished reader's keys ran out: {theirs:?}"
    );
    assert!(!r1.is_lost() && !r2.is_lost());
    drop(r2);
    drop(r1);
    assert_eq!(
        srv.cmd(&["EXISTS", "rw"]),
        "0",
        "the last live reader's release drops the dead reader's field too"
    );
    assert!(b
        .read_write_lock("rw")
        .write_lock()
        .try_lock()
        .expect("try")
        .is_some());
}

/// Watched holds of every kind (plain, fenced, read, write) on one client
/// are renewed together: one round trip per wake-up.
#[test]
fn renewals_of_every_kind_share_one_round_trip() {
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .expect("client");
    let rw = c.read_write_lock("rw");
    let _p = c.lock("plain").lock().expect("plain");
    let _f = c.fenced_lock("fenced").lock().expect("fenced");
    let _r = rw.read_lock().lock().expect("read");
    let _w = c.read_write_lock("rw2").write_lock().lock().expect("write");
    // After the first renewal (which loads the script: one more round trip).
    wait_until("the first renewal", WAIT, || c.stats().renewals >= 4);
    let before = crate::quiet_stats(&c);
    thread::sleep(Duration::from_millis(2000));
    let after = crate::quiet_stats(&c);
    let batches = after.renewal_batches - before.renewal_batches;
    let trips = after.renewal_round_trips - before.renewal_round_trips;
    assert!(batches >= 3, "renewed ({batches} batches)");
    // Give or take one batch under way at either end (see quiet_stats).
    assert!(
        trips.abs_diff(batches) <= 1,
        "one round trip per batch: {trips} for {batches} batches"
    );
    // Every 300 ms each: at least 4 renewals each in 2 s (holds taken far
    // enough apart on a loaded machine fall due in separate batches, so a
    // batch may renew fewer than four).
    let renewals = after.renewals - before.renewals;
    assert!(
        renewals >= 16 && renewals <= 4 * batches,
        "{renewals} renewals"
    );
    assert_eq!(after.locks_lost, 0);
}

#[test]
fn lost_replies_leave_no_hold_behind() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = crate::faults_common::impatient(&proxy.url());
    let rw = c.read_write_lock("rw");
    // A read acquisition whose reply is lost: undone, its hold key too.
    proxy.add_rule(b"rwlock_timeout", Fault::DropReply, 1);
    assert!(rw.read_lock().try_lock().is_err(), "the reply is lost");
    wait_until("the lost read acquisition to be undone", WAIT, || {
        srv.cmd(&["DBSIZE"]) == "1" && c.stats().unsettled_requests == 0
    });
    assert_eq!(srv.cmd(&["EXISTS", "rw"]), "0");
    // A write acquisition whose reply is lost: undone.
    proxy.add_rule(b"redlease_acquire_cancel", Fault::DropReply, 1);
    assert!(rw.write_lock().try_lock().is_err(), "the reply is lost");
    wait_until("the lost write acquisition to be undone", WAIT, || {
        srv.cmd(&["EXISTS", "rw"]) == "0" && c.stats().unsettled_requests == 0
    });
    // A release whose reply is lost: completed, once.
    let g = rw.read_lock().lock().expect("read");
    proxy.add_rule(b"redisson_unlock_latch", Fault::DropReply, 1);
    assert!(g.unlock().is_err(), "the reply is lost");
    wait_until("the lost release to be completed", WAIT, || {
        srv.cmd(&["EXISTS", "rw"]) == "0" && c.stats().unsettled_requests == 0
    });
    assert!(rw.write_lock().try_lock().expect("try").is_some());
}

/// Redisson's own scripts on a raw connection share the lock: readers of
/// both libraries read together, writers of either exclude the other's
/// readers, Redisson's read unlock keeps the lock for a live redlease reader
/// (its hold key is alive), and Redisson's write unlock wakes redlease's
/// waiting readers.
#[test]
fn redisson_readers_and_writers_share_the_lock() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let rw = c.read_write_lock("rw");
    let mut java = srv.conn();
    let java_prefix = format!("{{rw}}:{JAVA}:rwlock_timeout");
    let java_write = format!("{JAVA}:write");
    let ours = rw.read_lock().lock().expect("read");
    let read = |java: &mut redis::Connection| {
        eval(
            java,
            REDISSON_READ,
            &["rw", &java_prefix],
            &["30000", JAVA, &java_write],
        )
    };
    assert_eq!(read(&mut java), redis::Value::Nil, "Redisson reads too");
    let busy = eval(&mut java, REDISSON_WRITE, &["rw"], &["30000", &java_write]);
    assert!(
        matches!(busy, redis::Value::Int(t) if t > 0),
        "Redisson's writer waits"
    );
    // Redisson's reader leaves: our reader's key is alive, the lock stays.
    let left = eval(
        &mut java,
        REDISSON_READ_UNLOCK,
        &["rw", CHANNEL, &java_prefix, "{rw}"],
        &["0", JAVA, "publish"],
    );
    assert_eq!(left, redis::Value::Int(0));
    assert_eq!(srv.cmd(&["EXISTS", "rw"]), "1", "our reader still holds it");
    drop(ours);
    assert_eq!(srv.cmd(&["EXISTS", "rw"]), "0");
    // A Redisson writer excludes our readers and wakes them on release.
    assert_eq!(
        eval(&mut java, REDISSON_WRITE, &["rw"], &["30000", &java_write]),
        redis::Value::Nil
    );
    assert!(rw.read_lock().try_lock().expect("try").is_none());
    assert!(rw.write_lock().try_lock().expect("try").is_none());
    let (tx, rx) = mpsc::channel();
    let waiter = rw.clone();
    thread::spawn(move || {
        let g = waiter.read_lock().try_lock_for(WAIT).expect("wait");
        tx.send(g.is_some()).expect("report");
    });
    wait_until("our reader to subscribe", WAIT, || {
        srv.subscribers(CHANNEL) == 1
    });
    let released = eval(
        &mut java,
        REDISSON_WRITE_UNLOCK,
        &["rw", CHANNEL],
        &["1", "30000", &java_write, "publish"],
    );
    assert_eq!(released, redis::Value::Int(1));
    assert!(rx.recv_timeout(WAIT).expect("woken by Redisson's release"));
    // And our writer's release wakes a Redisson listener with '1'.
    let w = rw.write_lock().lock().expect("write");
    let heard = srv.listen(CHANNEL);
    w.unlock().expect("unlock");
    assert_eq!(heard.recv_timeout(WAIT).expect("message"), b"1");
}

// Found by an adversarial review; each failed before its fix.

/// A second client's reader enters and leaves (as any reader may): its
/// release frees the lock when it finds no other live read hold. Then its
/// writer tries. `Some` = the second client now writes.
fn other_reader_passes_then_writes(b: &Client) -> Option<redlease::LockGuard> {
    let rw = b.read_write_lock("rw");
    if let Some(r) = rw.read_lock().try_lock().expect("try read") {
        drop(r);
    }
    rw.write_lock().try_lock().expect("try write")
}

/// A write re-entry with a short lease never cuts the hash below the lease
/// of the same thread's read hold (it used to: the hash expired while the
/// read guard said held, and another client wrote).
#[test]
fn write_reentry_does_not_cut_the_threads_read_hold_short() {
    let srv = RedisServer::start();
    let a = client(&srv.url());
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let _w1 = rw
        .write_lock()
        .lock_with_lease(Duration::from_secs(20))
        .expect("write");
    let r = rw
        .read_lock()
        .lock_with_lease(Duration::from_secs(20))
        .expect("read under write");
    let _w2 = rw
        .write_lock()
        .try_lock_with_lease(Duration::ZERO, Duration::from_millis(300))
        .expect("re-entry")
        .expect("held");
    thread::sleep(Duration::from_millis(700));
    let read_ok = r.ensure_held().is_ok();
    let other = b
        .read_write_lock("rw")
        .write_lock()
        .try_lock()
        .expect("try");
    assert!(
        !(read_ok && other.is_some()),
        "our read guard says held (valid for {:?} more) while another client holds the write lock",
        r.valid_until().saturating_duration_since(Instant::now())
    );
}

/// A partial read release extends the remaining hold keys to the lease its
/// bound counts on (it used to leave them: once the old key ran out, another
/// reader's release deleted the hash and a writer got in while the
/// remaining read guard said held).
#[test]
fn partial_read_release_keeps_the_remaining_keys_alive() {
    let srv = RedisServer::start();
    let a = client(&srv.url());
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let lease = Duration::from_millis(1000);
    let r1 = rw.read_lock().lock_with_lease(lease).expect("read");
    thread::sleep(Duration::from_millis(600));
    let r2 = rw.read_lock().lock_with_lease(lease).expect("re-entry");
    drop(r2);
    thread::sleep(Duration::from_millis(600));
    let read_ok = r1.ensure_held().is_ok();
    let w = other_reader_passes_then_writes(&b);
    assert!(
        !(read_ok && w.is_some()),
        "our read guard says held ({:?} more) while another client writes",
        r1.valid_until().saturating_duration_since(Instant::now())
    );
}

/// The same with watched guards only, renewals stopped by a black-holed
/// link after the partial release: the remaining key lives as long as the
/// bound.
#[test]
fn partial_release_of_watched_reads_keeps_keys_to_the_bound() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = Client::builder(proxy.url())
        .watchdog_timeout(Duration::from_millis(1500))
        .response_timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let r1 = rw.read_lock().lock().expect("read");
    let r2 = rw.read_lock().lock().expect("re-entry");
    // Just before the next renewal (every 500 ms): the keys are ~450 ms old.
    wait_until("a renewal", WAIT, || a.stats().renewal_batches >= 1);
    let at = a.stats().renewal_batches;
    wait_until("another renewal", WAIT, || a.stats().renewal_batches > at);
    thread::sleep(Duration::from_millis(420));
    drop(r2);
    // From now on nothing more reaches Redis from the watchdog.
    proxy.add_rule(b"rwlock_timeout", Fault::BlackHole, 1000);
    let bound = r1.valid_until();
    let key = srv.cmd(&["KEYS", "{rw}:*:rwlock_timeout:*"]);
    assert_eq!(key.lines().count(), 1, "one hold key left: {key}");
    let key = key.trim().to_owned();
    let ttl: i64 = srv.cmd(&["PTTL", &key]).parse().expect("pttl");
    let claimed = bound.saturating_duration_since(Instant::now());
    // Past the key, within the bound.
    thread::sleep(Duration::from_millis(ttl.max(0) as u64 + 100));
    let read_ok = r1.ensure_held().is_ok();
    let w = other_reader_passes_then_writes(&b);
    assert!(
        !(read_ok && w.is_some()),
        "the guard claimed {claimed:?} with its only hold key living {ttl} ms: it still says \
         held ({:?} more) while another client writes",
        r1.valid_until().saturating_duration_since(Instant::now())
    );
}

/// A renewal of a watched read hold never shortens the hold key of an
/// explicit re-entry with a longer lease (it used to: once renewals
/// stopped, a writer got in long before the guard's bound).
#[test]
fn renewal_never_shortens_an_explicit_read_reentry() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = Client::builder(proxy.url())
        .watchdog_timeout(Duration::from_millis(900))
        .response_timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let r1 = rw.read_lock().lock().expect("watched read");
    let r2 = rw
        .read_lock()
        .lock_with_lease(Duration::from_secs(6))
        .expect("explicit re-entry");
    let at = a.stats().renewal_batches;
    wait_until("a renewal after the re-entry", WAIT, || {
        a.stats().renewal_batches > at
    });
    proxy.add_rule(b"rwlock_timeout", Fault::BlackHole, 1000);
    thread::sleep(Duration::from_millis(1500));
    let read_ok = r2.ensure_held().is_ok();
    let w = other_reader_passes_then_writes(&b);
    assert!(
        !(read_ok && w.is_some()),
        "our explicit read guard says held ({:?} more) while another client writes",
        r2.valid_until().saturating_duration_since(Instant::now())
    );
    drop(r1);
}

/// An explicit short read hold, then a watched re-entry: the re-entry
/// extends the first hold's key, and the hold is not found lost when the
/// short lease would have ended (it used to be, falsely).
#[test]
fn watched_read_reentry_is_not_lost_when_an_older_key_runs_out() {
    let srv = RedisServer::start();
    let a = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .expect("client");
    let rw = a.read_write_lock("rw");
    let r1 = rw
        .read_lock()
        .lock_with_lease(Duration::from_millis(200))
        .expect("explicit read");
    let r2 = rw.read_lock().lock().expect("watched re-entry");
    thread::sleep(Duration::from_millis(1500));
    drop(r1);
    assert!(
        !r2.is_lost(),
        "the watched read guard was declared lost (locks_lost = {})",
        a.stats().locks_lost
    );
}

/// A read holder asking for the write lock with a wait too large to
/// represent ("no deadline") is refused at once, as lock() is.
#[test]
fn no_upgrade_deadlock_with_an_unbounded_try_lock_for() {
    let srv = RedisServer::start();
    let url = srv.url();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let c = client(&url);
        let rw = c.read_write_lock("rw");
        let _r = rw.read_lock().lock().expect("read");
        let out = rw.write_lock().try_lock_for(Duration::MAX);
        let _ = tx.send(out.map(|g| g.is_some()).map_err(|e| e.to_string()));
    });
    let got = rx.recv_timeout(Duration::from_secs(5));
    assert!(
        got.is_ok(),
        "a reader's try_lock_for(Duration::MAX) on the write lock still waits for itself"
    );
}

/// The same on a plain lock: a renewal never shortens the lease of an
/// explicit longer re-entry.
#[test]
fn plain_renewal_never_shortens_an_explicit_reentry() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = Client::builder(proxy.url())
        .watchdog_timeout(Duration::from_millis(900))
        .response_timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let b = client(&srv.url());
    let l = a.lock("plain");
    let g1 = l.lock().expect("watched");
    let g2 = l
        .lock_with_lease(Duration::from_secs(6))
        .expect("explicit re-entry");
    let at = a.stats().renewal_batches;
    wait_until("a renewal after the re-entry", WAIT, || {
        a.stats().renewal_batches > at
    });
    proxy.add_rule(b"plain", Fault::BlackHole, 1000);
    thread::sleep(Duration::from_millis(1500));
    let ok = g2.ensure_held().is_ok();
    let other = b.lock("plain").try_lock().expect("try");
    assert!(
        !(ok && other.is_some()),
        "plain: guard says held while another client holds it"
    );
    drop(g1);
}

/// A downgrade whose request is held up, then the read hold released,
/// then the background completion: nothing left, nobody blocked.
#[test]
fn a_lost_downgrade_reply_is_completed() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = crate::faults_common::impatient(&proxy.url());
    let b = client(&srv.url());
    let rw = a.read_write_lock("rw");
    let w = rw.write_lock().lock().expect("write");
    let r = rw.read_lock().lock().expect("read");
    proxy.add_rule(
        b"redisson_unlock_latch",
        Fault::DelayRequest(Duration::from_millis(800)),
        1,
    );
    assert!(w.unlock().is_err());
    // The delayed release has not run: the lock is still write-locked.
    let br = b
        .read_write_lock("rw")
        .read_lock()
        .try_lock_for(WAIT)
        .expect("wait");
    assert!(br.is_some(), "B reads once the downgrade lands");
    assert!(r.ensure_held().is_ok());
    drop(br);
    drop(r);
    wait_until("everything settled", WAIT, || {
        a.stats().unsettled_requests == 0 && srv.cmd(&["EXISTS", "rw"]) == "0"
    });
    assert!(b
        .read_write_lock("rw")
        .write_lock()
        .try_lock()
        .expect("try")
        .is_some());
}

/// Readers waiting on a writer get the lock after their subscriber
/// connection is cut, and after a Redis restart (the write lock is gone
/// with it).
#[test]
fn readers_survive_a_cut_subscriber_and_a_restart() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let reader = client(&srv.url());
    for fault in ["cut", "restart"] {
        let w = holder
            .read_write_lock("rw")
            .write_lock()
            .lock()
            .expect("write");
        let (tx, rx) = mpsc::channel();
        let rw = reader.read_write_lock("rw");
        thread::spawn(move || {
            let g = rw.read_lock().try_lock_for(WAIT).expect("wait");
            tx.send(g.is_some()).expect("report");
        });
        wait_until("the reader to subscribe", WAIT, || {
            srv.subscribers(CHANNEL) == 1
        });
        if fault == "cut" {
            assert!(srv.client_kill_type("pubsub") >= 1, "the subscriber cut");
            w.unlock().expect("unlock");
        } else {
            srv.restart();
            assert!(w.unlock().is_err(), "the write lock went with the restart");
        }
        assert!(
            rx.recv_timeout(WAIT).expect("the reader returns"),
            "{fault}"
        );
    }
}

// Found by a second review.

/// A lost read re-entry whose undo runs after the reader's hold keys ran
/// out (another reader kept the hash alive): the hold is found lost (the
/// undo used to answer "undone", and the guard's bound was raised again).
#[test]
fn late_undo_of_a_read_reentry_does_not_revive_an_expired_hold() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = crate::faults_common::impatient(&proxy.url());
    let b = Client::open(srv.url()).expect("client");
    let b_read = b.read_write_lock("rw").read_lock().lock().expect("b reads");
    let rw = a.read_write_lock("rw");
    let lease = Duration::from_millis(1500);
    let g1 = rw
        .read_lock()
        .try_lock_with_lease(Duration::ZERO, lease)
        .expect("read")
        .expect("free for readers");
    // The re-entry runs, its reply is lost; its undo is held back.
    proxy.add_rule(b"rwlock_timeout", Fault::DropReply, 1);
    let hole = proxy.add_rule(b"redlease_acquire_cancel", Fault::BlackHole, usize::MAX);
    let t1 = Instant::now();
    assert!(rw
        .read_lock()
        .try_lock_with_lease(Duration::ZERO, lease)
        .is_err());
    proxy.wait_hits(hole, 1, WAIT);
    // Every hold key of A runs out (the hash lives: B renews it).
    std::thread::sleep(
        (t1 + lease + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
    );
    assert!(g1.ensure_held().is_err(), "past its lease");
    proxy.remove_rule(hole);
    wait_until("the undo to run", WAIT, || {
        a.stats().unsettled_requests == 0
    });
    let revived = g1.ensure_held().is_ok();
    // B leaves: A's keys are dead, so the hash goes and a writer gets in.
    drop(b_read);
    let w = b
        .read_write_lock("rw")
        .write_lock()
        .try_lock()
        .expect("try");
    assert!(
        !(revived && w.is_some() && g1.ensure_held().is_ok()),
        "A's read guard says held while B holds the write lock"
    );
}
