//! Semaphores, both kinds: never more permits out than set under contention
//! from many threads and clients, waiters woken by pub/sub, permits returned
//! exactly once across lost replies, expirable permits coming back when
//! their lease runs out, bad input refused, and Redisson's layout shared
//! both ways (a raw connection running Redisson's scripts from the wire
//! notes takes, waits for and releases against redlease).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, Fault, Proxy, RedisServer, RuleId};
use redlease::{Client, ExpirableSemaphore, Semaphore};

const WAIT: Duration = Duration::from_secs(20);

fn client(url: &str) -> Client {
    Client::open(url).expect("client")
}

use crate::faults_common::impatient;

fn available(srv: &RedisServer, name: &str) -> i64 {
    srv.cmd(&["GET", name]).parse().unwrap_or(0)
}

fn sha(source: &str) -> String {
    redis::Script::new(source).get_hash().to_owned()
}

/// The oracle: `threads` threads on two clients take permits (`take` asks
/// for 1 or 2 and says how many it got) of a semaphore of `limit` again and
/// again, and count the permits inside their section; the count never
/// passes the limit (and does reach it: the test sees contention).
fn never_over_the_limit(
    srv: &RedisServer,
    limit: usize,
    threads: usize,
    rounds: usize,
    take: impl Fn(&Client, usize) -> (usize, Box<dyn FnOnce() + Send>) + Send + Sync + 'static,
) -> usize {
    let clients = [client(&srv.url()), client(&srv.url())];
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let take = Arc::new(take);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let c = clients[t % 2].clone();
            let (inside, peak, take, start) = (
                Arc::clone(&inside),
                Arc::clone(&peak),
                Arc::clone(&take),
                Arc::clone(&start),
            );
            thread::spawn(move || {
                start.wait();
                for r in 0..rounds {
                    let (n, release) = take(&c, 1 + (t + r) % 2);
                    let now = inside.fetch_add(n, Ordering::SeqCst) + n;
                    peak.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_micros(300));
                    inside.fetch_sub(n, Ordering::SeqCst);
                    release();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker");
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= limit, "{peak} permits out at once, limit {limit}");
    assert_eq!(peak, limit, "the workers never filled the semaphore");
    peak
}

#[test]
fn semaphore_never_hands_out_more_permits_than_set() {
    let srv = RedisServer::start();
    let sem = client(&srv.url()).semaphore("pool");
    assert!(sem.try_set_permits(3).expect("set"));
    assert!(!sem.try_set_permits(5).expect("set again"), "it exists");
    never_over_the_limit(&srv, 3, 8, 40, |c, n| {
        let p = c.semaphore("pool").acquire(n as u64).expect("acquire");
        assert_eq!(p.permits(), n as u64);
        (n, Box::new(move || p.release().expect("release")))
    });
    assert_eq!(sem.available_permits().expect("available"), 3);
    assert_eq!(
        srv.cmd(&["HLEN", "redlease_semaphore_permits:{pool}"]),
        "0",
        "every record went with its permits"
    );
}

#[test]
fn expirable_semaphore_never_hands_out_more_permits_than_set() {
    let srv = RedisServer::start();
    let sem = client(&srv.url()).permit_expirable_semaphore("slots");
    assert!(sem.try_set_permits(2).expect("set"));
    never_over_the_limit(&srv, 2, 6, 30, |c, _| {
        let p = c
            .permit_expirable_semaphore("slots")
            .acquire(Duration::from_secs(60))
            .expect("acquire");
        (1, Box::new(move || p.release().expect("release")))
    });
    assert_eq!(sem.available_permits().expect("available"), 2);
    assert_eq!(srv.cmd(&["ZCARD", "{slots}:timeout"]), "0");
}

#[test]
fn a_waiter_is_woken_by_a_release_on_another_client() {
    let srv = RedisServer::start();
    let a = client(&srv.url());
    let b = client(&srv.url());
    a.semaphore("pool").try_set_permits(2).expect("set");
    let held = a.semaphore("pool").acquire(2).expect("all of them");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let p = b.semaphore("pool").try_acquire_for(1, WAIT).expect("wait");
        tx.send((p.map(|p| p.permits()), Instant::now()))
            .expect("report");
    });
    wait_until("the waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_sc:{pool}") == 1
    });
    assert!(rx.try_recv().is_err(), "it waits while none is free");
    let released = Instant::now();
    held.release().expect("release");
    let (got, at) = rx.recv_timeout(WAIT).expect("the waiter returns");
    assert_eq!(got, Some(1));
    let took = at.duration_since(released);
    eprintln!("figure: semaphore waiter woken {took:?} after the release");
    assert!(
        took < redlease::PERMIT_RECHECK / 2,
        "woken by the message, not the re-check ({took:?})"
    );
}

#[test]
fn try_acquire_for_times_out_and_try_acquire_does_not_wait() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.semaphore("pool");
    assert!(sem.try_acquire(1).expect("try").is_none(), "never set: 0");
    sem.try_set_permits(1).expect("set");
    let _held = sem.try_acquire(1).expect("try").expect("free");
    let t = Instant::now();
    assert!(sem
        .try_acquire_for(1, Duration::from_millis(300))
        .expect("try_for")
        .is_none());
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(sem.try_acquire(2).expect("more than set").is_none());
}

#[test]
fn permits_counts_drain_add_and_forget() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.semaphore("pool");
    sem.try_set_permits(5).expect("set");
    let p = sem.acquire(2).expect("acquire");
    assert_eq!(sem.available_permits().expect("available"), 3);
    assert_eq!(sem.drain_permits().expect("drain"), 3);
    assert_eq!(sem.drain_permits().expect("drain again"), 0);
    sem.add_permits(-2).expect("take two away");
    assert_eq!(sem.available_permits().expect("available"), -2);
    assert_eq!(sem.drain_permits().expect("drain below zero"), 0);
    assert_eq!(available(&srv, "pool"), -2, "draining hands nothing out");
    p.forget();
    assert_eq!(
        srv.cmd(&["HLEN", "redlease_semaphore_permits:{pool}"]),
        "0",
        "forget drops the record, not the permits"
    );
    assert_eq!(sem.available_permits().expect("available"), -2);
    sem.release(4).expect("release by count");
    assert_eq!(sem.available_permits().expect("available"), 2);
    assert!(sem.delete().expect("delete"));
    assert_eq!(sem.available_permits().expect("available"), 0);
}

#[test]
fn a_release_after_delete_reports_the_permits_lost() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.semaphore("pool");
    sem.try_set_permits(1).expect("set");
    let p = sem.acquire(1).expect("acquire");
    assert!(sem.delete().expect("delete"));
    let e = p.release().expect_err("the record went with the semaphore");
    assert!(e.is_lock_lost(), "{e}");
    assert_eq!(available(&srv, "pool"), 0, "nothing comes back");
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.semaphore("pool");
    let pes = c.permit_expirable_semaphore("slots");
    let invalid = |r: redlease::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert!(e.is_invalid_argument(), "{what}: {e}");
        e.to_string()
    };
    let msg = invalid(sem.acquire(0).map(drop), "acquire 0");
    assert!(msg.contains("permits must be at least 1, got 0"), "{msg}");
    invalid(sem.try_acquire(0).map(drop), "try_acquire 0");
    invalid(sem.release(0), "release 0");
    invalid(sem.acquire((1 << 53) + 1).map(drop), "acquire too many");
    invalid(sem.try_acquire(u64::MAX).map(drop), "try_acquire u64::MAX");
    invalid(sem.release(u64::MAX), "release u64::MAX");
    invalid(sem.try_set_permits((1 << 53) + 1).map(drop), "too many");
    invalid(sem.add_permits(i64::MIN), "too large a change");
    let msg = invalid(c.semaphore("").acquire(1).map(drop), "empty name");
    assert!(msg.contains("semaphore name must not be empty"), "{msg}");
    invalid(pes.acquire(Duration::ZERO).map(drop), "zero lease");
    let msg = invalid(
        pes.acquire(ExpirableSemaphore::MAX_LEASE + Duration::from_secs(1))
            .map(drop),
        "over-long lease",
    );
    assert!(
        msg.contains("permit lease must be at most ExpirableSemaphore::MAX_LEASE"),
        "{msg}"
    );
    // Above both caps, the permit's own (100 years) is the one named.
    let msg = invalid(pes.acquire(Duration::MAX).map(drop), "Duration::MAX");
    assert!(msg.contains("100 years"), "{msg}");
    let msg = invalid(pes.release("nope").map(drop), "bad id");
    assert!(msg.contains("32 hex digits"), "{msg}");
    assert!(msg.contains("got \"nope\""), "{msg}");
    invalid(
        c.permit_expirable_semaphore("")
            .try_set_permits(1)
            .map(drop),
        "empty name",
    );
    assert_eq!(srv.cmd(&["DBSIZE"]), "0", "nothing was written");
}

/// An acquisition whose reply is lost ran on Redis: its permits are
/// returned in the background, and the caller, told it failed, holds none.
#[test]
fn a_lost_acquire_reply_leaves_no_permits_out() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = impatient(&proxy.url());
    let sem = c.semaphore("pool");
    sem.try_set_permits(2).expect("set");
    // Scripts loaded first: the lost reply is that of an acquisition that ran.
    drop(sem.acquire(1).expect("warm"));
    proxy.add_rule(b"redlease_semaphore_cancel", Fault::DropReply, 1);
    assert!(sem.try_acquire(2).is_err(), "the reply is lost");
    wait_until("the lost acquisition's permits to come back", WAIT, || {
        available(&srv, "pool") == 2 && c.stats().unsettled_requests == 0
    });
    assert_eq!(srv.cmd(&["HLEN", "redlease_semaphore_permits:{pool}"]), "0");
    let p = sem.try_acquire(2).expect("try").expect("all free again");
    drop(p);
    assert_eq!(available(&srv, "pool"), 2);
}

/// A release whose reply is lost is completed in the background, and its
/// permits come back once, not twice.
#[test]
fn a_lost_release_reply_returns_the_permits_once() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = impatient(&proxy.url());
    let sem = c.semaphore("pool");
    sem.try_set_permits(3).expect("set");
    let p = sem.acquire(2).expect("acquire");
    let release = sha(include_str!("../../src/scripts/semaphore_release.lua"));
    proxy.add_rule(release.as_bytes(), Fault::DropReply, 1);
    let again = proxy.add_rule(release.as_bytes(), Fault::DelayReply(Duration::ZERO), 1);
    assert!(p.release().is_err(), "the reply is lost");
    proxy.wait_hits(again, 1, WAIT);
    wait_until("the background release to be answered", WAIT, || {
        c.stats().unsettled_requests == 0
    });
    assert_eq!(available(&srv, "pool"), 3, "returned once");
}

#[test]
fn a_waiter_survives_its_subscriber_being_cut() {
    let srv = RedisServer::start();
    let a = client(&srv.url());
    let b = client(&srv.url());
    a.semaphore("pool").try_set_permits(1).expect("set");
    let held = a.semaphore("pool").acquire(1).expect("acquire");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let p = b.semaphore("pool").try_acquire_for(1, WAIT).expect("wait");
        tx.send(p.is_some()).expect("report");
    });
    wait_until("the waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_sc:{pool}") == 1
    });
    assert!(srv.client_kill_type("pubsub") >= 1, "the subscriber cut");
    held.release().expect("release while it reconnects");
    assert!(rx.recv_timeout(WAIT).expect("the waiter returns"));
}

#[test]
fn a_waiter_rides_out_a_redis_restart() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let (tx, rx) = mpsc::channel();
    let waiter = c.clone();
    thread::spawn(move || {
        let p = waiter
            .semaphore("pool")
            .try_acquire_for(1, WAIT)
            .expect("wait");
        tx.send(p.is_some()).expect("report");
    });
    wait_until("the waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_sc:{pool}") == 1
    });
    srv.restart();
    wait_until("the waiter to subscribe again", WAIT, || {
        srv.subscribers("redisson_sc:{pool}") == 1
    });
    // A new Redis (script cache empty): setting the permits wakes it. Set
    // from a client of its own: `c`'s pool may still hold a connection made
    // before the restart, on which a send-once call reports "may have run"
    // (documented); the waiter is what this test is about.
    let setter = client(&srv.url());
    setter.semaphore("pool").try_set_permits(1).expect("set");
    assert!(rx.recv_timeout(WAIT).expect("the waiter returns"));
}

/// Redisson's RSemaphore scripts (redisson-family.md §5), on a raw
/// connection: a Redisson release wakes a redlease waiter, a redlease
/// release is heard by a Redisson listener with the new total, and both
/// count the same permits.
#[test]
fn redisson_semaphore_interoperates() {
    const TRY_ACQUIRE: &str = "local value = redis.call('get', KEYS[1]); if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then local val = redis.call('decrby', KEYS[1], ARGV[1]); return 1; end; return 0;";
    const RELEASE: &str = "local value = redis.call('incrby', KEYS[1], ARGV[1]); redis.call(ARGV[2], KEYS[2], value);";
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem: Semaphore = c.semaphore("shared");
    sem.try_set_permits(1).expect("set");
    let mut java = srv.conn();
    let took: i64 = redis::cmd("EVAL")
        .arg(TRY_ACQUIRE)
        .arg(1)
        .arg("shared")
        .arg(1)
        .query(&mut java)
        .expect("redisson acquire");
    assert_eq!(took, 1);
    assert!(
        sem.try_acquire(1).expect("try").is_none(),
        "Redisson has it"
    );
    let (tx, rx) = mpsc::channel();
    let waiter = sem.clone();
    thread::spawn(move || {
        let p = waiter.try_acquire_for(1, WAIT).expect("wait");
        tx.send(p.map(|p| p.forget())).expect("report");
    });
    wait_until("the redlease waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_sc:{shared}") == 1
    });
    let () = redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(2)
        .arg("shared")
        .arg("redisson_sc:{shared}")
        .arg(1)
        .arg("publish")
        .query(&mut java)
        .expect("redisson release");
    assert_eq!(
        rx.recv_timeout(WAIT).expect("woken by Redisson's message"),
        Some(())
    );
    // And the other way: a Redisson listener hears redlease's release.
    let heard = srv.listen("redisson_sc:{shared}");
    sem.release(1).expect("release");
    assert_eq!(heard.recv_timeout(WAIT).expect("message"), b"1");
    let took: i64 = redis::cmd("EVAL")
        .arg(TRY_ACQUIRE)
        .arg(1)
        .arg("shared")
        .arg(1)
        .query(&mut java)
        .expect("redisson acquire");
    assert_eq!(took, 1, "Redisson takes what redlease released");
}

#[test]
fn expirable_permits_come_back_when_their_lease_runs_out() {
    let srv = RedisServer::start();
    let a = client(&srv.url());
    let b = client(&srv.url());
    let sem = a.permit_expirable_semaphore("slots");
    sem.try_set_permits(1).expect("set");
    // A holder that vanishes: its permit is never released.
    let lease = Duration::from_millis(400);
    let crashed = sem.acquire(lease).expect("acquire").forget();
    assert_eq!(crashed.len(), 32);
    let t = Instant::now();
    let p = b
        .permit_expirable_semaphore("slots")
        .try_acquire_for(WAIT, Duration::from_secs(30))
        .expect("wait")
        .expect("the vanished holder's permit comes back");
    let took = t.elapsed();
    eprintln!("figure: expired permit taken over after {took:?} (lease {lease:?})");
    assert!(took >= lease - Duration::from_millis(50), "{took:?}");
    assert!(!sem.release(&crashed).expect("release by id"), "not out");
    assert!(!p.is_expired());
    drop(p);
    assert_eq!(sem.available_permits().expect("available"), 1);
}

#[test]
fn expirable_release_by_id_is_idempotent_and_leases_can_be_updated() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.permit_expirable_semaphore("slots");
    sem.try_set_permits(2).expect("set");
    let p = sem.acquire(Duration::from_millis(300)).expect("acquire");
    p.update_lease(Duration::from_secs(30)).expect("extend");
    assert!(p.valid_until() > Instant::now() + Duration::from_secs(20));
    thread::sleep(Duration::from_millis(400));
    assert_eq!(
        sem.available_permits().expect("available"),
        1,
        "the extended permit is still out"
    );
    let id = p.forget();
    assert!(sem.release(&id).expect("release"), "it was out");
    assert!(!sem.release(&id).expect("release again"), "once only");
    assert_eq!(sem.available_permits().expect("available"), 2);
    // A permit whose lease ran out cannot be renewed.
    let short = sem.acquire(Duration::from_millis(100)).expect("acquire");
    thread::sleep(Duration::from_millis(200));
    assert!(short.is_expired());
    let e = short
        .update_lease(Duration::from_secs(5))
        .expect_err("gone");
    assert!(e.is_lock_lost(), "{e}");
    assert_eq!(sem.available_permits().expect("available"), 2);
}

#[test]
fn a_lost_expirable_acquire_reply_leaves_no_permit_out() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = impatient(&proxy.url());
    let sem = c.permit_expirable_semaphore("slots");
    sem.try_set_permits(1).expect("set");
    // Scripts loaded first: the lost reply is that of an acquisition that ran.
    drop(sem.acquire(Duration::from_secs(60)).expect("warm"));
    proxy.add_rule(b"redlease_permit_cancel", Fault::DropReply, 1);
    assert!(
        sem.try_acquire(Duration::from_secs(600)).is_err(),
        "the reply is lost"
    );
    wait_until("the lost acquisition's permit to come back", WAIT, || {
        available(&srv, "slots") == 1 && c.stats().unsettled_requests == 0
    });
    assert_eq!(srv.cmd(&["ZCARD", "{slots}:timeout"]), "0");
    let release = sha(concat!(
        include_str!("../../src/scripts/permit_lib.lua"),
        include_str!("../../src/scripts/permit_release.lua")
    ));
    let p = sem
        .try_acquire(Duration::from_secs(600))
        .expect("try")
        .expect("free again");
    proxy.add_rule(release.as_bytes(), Fault::DropReply, 1);
    let again = proxy.add_rule(release.as_bytes(), Fault::DelayReply(Duration::ZERO), 1);
    assert!(p.release().is_err(), "the release reply is lost");
    proxy.wait_hits(again, 1, WAIT);
    wait_until("the background release to be answered", WAIT, || {
        c.stats().unsettled_requests == 0
    });
    assert_eq!(available(&srv, "slots"), 1, "returned once");
}

/// A release whose requests Redis does not answer is completed in the
/// background; the client dropped meanwhile, it still is once Redis
/// answers again (a plain semaphore's permits have no lease: given up, they
/// would be out for good). Meanwhile the watchdog thread keeps nothing of
/// the caller's: the `on_lock_lost` callback (and what it owns, here a
/// channel's sender) goes with the client, not up to 15 minutes later.
#[test]
fn a_pending_release_is_completed_after_the_client_is_dropped() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let (tx, rx) = mpsc::channel::<String>();
    let tx = std::sync::Mutex::new(tx);
    let c = crate::faults_common::builder(&proxy.url(), Duration::from_millis(300))
        .retry_attempts(0)
        .on_lock_lost(move |name: &str| {
            let _ = tx.lock().map(|t| t.send(name.to_owned()));
        })
        .build()
        .expect("client");
    let sem = c.semaphore("gone");
    sem.try_set_permits(1).expect("set");
    sem.acquire(1).expect("warm").release().expect("warm");
    let p = sem.acquire(1).expect("acquire");
    let rule = proxy.add_rule(b"redlease_semaphore_released", Fault::BlackHole, usize::MAX);
    assert!(p.release().is_err(), "the request is swallowed");
    // The background has tried again (and failed) at least once.
    proxy.wait_hits(rule, 2, WAIT);
    assert_eq!(c.stats().unsettled_requests, 1);
    drop(sem);
    drop(c);
    assert_eq!(
        rx.recv_timeout(WAIT),
        Err(mpsc::RecvTimeoutError::Disconnected),
        "the callback's sender is dropped with the client"
    );
    proxy.remove_rule(rule);
    wait_until(
        "the pending release to be completed once Redis answers again",
        WAIT,
        || available(&srv, "gone") == 1,
    );
}

/// An acquisition that ran but whose reply was lost is undone in the
/// background; the client dropped meanwhile, it still is once Redis
/// answers again: no permit stays out in the name of a caller that was
/// told it failed.
#[test]
fn a_pending_undo_is_completed_after_the_client_is_dropped() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = impatient(&proxy.url());
    let sem = c.semaphore("undone");
    sem.try_set_permits(2).expect("set");
    sem.acquire(1).expect("warm").release().expect("warm");
    // The acquisition runs; its reply is lost.
    proxy.add_rule(b"redlease_semaphore_cancel", Fault::DropReply, 1);
    // Every undo (it carries its marker's ":undo" latch) is swallowed.
    let undo = proxy.add_rule(b":undo", Fault::BlackHole, usize::MAX);
    assert!(sem.try_acquire(2).is_err(), "told it failed");
    assert_eq!(available(&srv, "undone"), 0, "the acquisition ran");
    proxy.wait_hits(undo, 1, WAIT);
    drop(sem);
    drop(c);
    proxy.remove_rule(undo);
    wait_until(
        "the failed acquisition's permits to come back once Redis answers again",
        WAIT,
        || available(&srv, "undone") == 2,
    );
}

/// The calls of EVALSHA the server has run.
fn evalsha_calls(srv: &RedisServer) -> u64 {
    srv.command_stat("evalsha", "calls")
}

/// The permit's lease left in Redis, in ms (Redis's clock).
fn permit_left_ms(srv: &RedisServer, name: &str, raw: &[u8]) -> f64 {
    let mut conn = srv.conn();
    let expiry: f64 = redis::cmd("ZSCORE")
        .arg(format!("{{{name}}}:timeout"))
        .arg(raw)
        .query(&mut conn)
        .expect("the permit is out");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("time");
    expiry - (secs * 1000 + micros / 1000) as f64
}

/// A permit of `c`'s semaphore `name` (through `proxy` to `srv`) has a
/// 300 ms lease update whose first copy the proxy holds back 3 s (`short`
/// makes the update, `rule` the proxy's rule for it); a 60 s update
/// follows, then the held-back copy lands: it must not shorten the lease,
/// in Redis or by the guard's bound, nor let another client take the
/// permit.
fn a_late_copy_cannot_shorten_a_later_lease(
    srv: &RedisServer,
    proxy: &Proxy,
    c: &Client,
    name: &str,
    short: impl FnOnce(&redlease::Permit, RuleId),
) {
    let sem = c.permit_expirable_semaphore(name);
    sem.try_set_permits(1).expect("set");
    let p = sem.acquire(Duration::from_secs(60)).expect("acquire");
    p.update_lease(Duration::from_secs(60))
        .expect("script loaded");
    let raw: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&p.id()[2 * i..2 * i + 2], 16).expect("hex id"))
        .collect();
    let rule = proxy.add_rule(&raw, Fault::LateCopy(Duration::from_secs(3)), 1);
    short(&p, rule);
    let calls = evalsha_calls(srv);
    p.update_lease(Duration::from_secs(60))
        .expect("a later update");
    assert_eq!(
        evalsha_calls(srv),
        calls + 1,
        "the late copy reached Redis before the later update: this test needs it after"
    );
    wait_until("the late copy to reach Redis", WAIT, || {
        evalsha_calls(srv) >= calls + 2
    });
    let left_ms = permit_left_ms(srv, name, &raw);
    assert!(
        left_ms > 50_000.0,
        "the late copy set the permit's lease to {left_ms} ms in Redis"
    );
    assert!(p.valid_until() > Instant::now() + Duration::from_secs(50));
    assert!(
        client(&srv.url())
            .permit_expirable_semaphore(name)
            .try_acquire(Duration::from_secs(60))
            .expect("try")
            .is_none(),
        "another client took the permit the guard holds"
    );
}

/// A lease update whose reply is lost and whose copy reaches Redis after a
/// later update succeeded does nothing: before, it set the permit's short
/// lease in Redis while the guard went by the later, long one, and another
/// client took the only permit while the guard said it was still out.
#[test]
fn a_late_copy_of_a_lost_lease_update_cannot_shorten_a_later_lease() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = impatient(&proxy.url());
    a_late_copy_cannot_shorten_a_later_lease(&srv, &proxy, &c, "late", |p, rule| {
        assert!(
            p.update_lease(Duration::from_millis(300)).is_err(),
            "the reply is lost"
        );
        assert_eq!(proxy.hits(rule), 1);
    });
}

/// As above, with the lease update answered: its first copy is held back
/// and its connection cut, so the pool sends it again on a new one, which
/// is answered. The first copy still comes, after a later update.
#[test]
fn a_late_copy_of_a_lease_update_the_pool_sent_again_cannot_shorten_a_later_lease() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    // The default retry_attempts: a dropped connection's request is sent
    // again.
    let c = Client::builder(proxy.url())
        .response_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    a_late_copy_cannot_shorten_a_later_lease(&srv, &proxy, &c, "resent", |p, rule| {
        let short = thread::scope(|s| {
            s.spawn(|| {
                proxy.wait_hits(rule, 1, WAIT);
                proxy.cut();
            });
            p.update_lease(Duration::from_millis(300))
        });
        assert!(short.is_ok(), "the copy sent again was answered: {short:?}");
    });
}

/// Redisson's RPermitExpirableSemaphore layout: a permit redlease takes is a
/// 16-byte member of `{name}:timeout` scored with its expiry; one Redisson
/// takes (same layout, raw connection) counts against redlease, and its
/// release by id wakes a redlease waiter.
#[test]
fn redisson_expirable_semaphore_shares_the_layout() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.permit_expirable_semaphore("shared");
    sem.try_set_permits(1).expect("set");
    let p = sem.acquire(Duration::from_secs(60)).expect("acquire");
    let mut conn = srv.conn();
    let members: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg("{shared}:timeout")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut conn)
        .expect("zrange");
    assert_eq!(members.len(), 1);
    let hex: String = members[0].0.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, p.id(), "member = the id's 16 raw bytes");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as f64;
    assert!(
        (members[0].1 - (now_ms + 60_000.0)).abs() < 5_000.0,
        "score = expiry in epoch ms"
    );
    p.release().expect("release");
    // Redisson's tryAcquire then release by id (§6), with a raw id.
    let id = [7u8; 16];
    let redisson_acquire = "local value = redis.call('get', KEYS[1]); if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then redis.call('decrby', KEYS[1], ARGV[1]); redis.call('zadd', KEYS[2], ARGV[2], ARGV[6]); return 'OK'; end; return nil;";
    let took: Option<String> = redis::cmd("EVAL")
        .arg(redisson_acquire)
        .arg(3)
        .arg("shared")
        .arg("{shared}:timeout")
        .arg("redisson_sc:{shared}")
        .arg(1)
        .arg(now_ms as u64 + 60_000)
        .arg(now_ms as u64)
        .arg(922_337_203_685_477u64)
        .arg("publish")
        .arg(&id[..])
        .query(&mut conn)
        .expect("redisson acquire");
    assert_eq!(took.as_deref(), Some("OK"));
    assert_eq!(sem.available_permits().expect("available"), 0);
    let (tx, rx) = mpsc::channel();
    let waiter = sem.clone();
    thread::spawn(move || {
        let p = waiter
            .try_acquire_for(WAIT, Duration::from_secs(60))
            .expect("wait");
        tx.send(p.is_some()).expect("report");
    });
    wait_until("the redlease waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_sc:{shared}") == 1
    });
    let redisson_release = "local expire = redis.call('zscore', KEYS[3], ARGV[1]); local removed = redis.call('zrem', KEYS[3], ARGV[1]); if tonumber(removed) ~= 1 then return 0; end; local value = redis.call('incrby', KEYS[1], ARGV[2]); redis.call(ARGV[4], KEYS[2], value); return 1;";
    let released: i64 = redis::cmd("EVAL")
        .arg(redisson_release)
        .arg(3)
        .arg("shared")
        .arg("redisson_sc:{shared}")
        .arg("{shared}:timeout")
        .arg(&id[..])
        .arg(1)
        .arg(now_ms as u64)
        .arg("publish")
        .query(&mut conn)
        .expect("redisson release");
    assert_eq!(released, 1);
    assert!(rx.recv_timeout(WAIT).expect("woken by Redisson's release"));
}

// Found by an adversarial review; each failed before its fix.

/// A count below zero is not an answer code: at -1 (add_permits below zero)
/// nothing is handed out (the acquire script used to return the count, read
/// as -1 "acquired").
#[test]
fn negative_count_is_not_read_as_acquired() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.semaphore("neg");
    assert!(sem.try_set_permits(1).expect("set"));
    sem.add_permits(-2).expect("take two away");
    assert_eq!(sem.available_permits().expect("available"), -1);
    let got = sem.try_acquire(1).expect("try");
    assert!(
        got.is_none(),
        "a permit handed out while the count is -1: {got:?}"
    );
}

/// At -3 a waiter waits for a message or PERMIT_RECHECK (the count used to
/// be read as "cancelled", and the waiter retried every millisecond).
#[test]
fn count_of_minus_three_does_not_spin() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.semaphore("neg3");
    assert!(sem.try_set_permits(0).expect("set"));
    sem.add_permits(-3).expect("take three away");
    let calls = |srv: &RedisServer| -> u64 {
        let s = srv.info_field("commandstats", "cmdstat_evalsha");
        s.split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let before = calls(&srv);
    let got = sem
        .try_acquire_for(1, Duration::from_secs(2))
        .expect("wait");
    assert!(got.is_none());
    let n = calls(&srv) - before;
    assert!(n < 20, "{n} acquire scripts in 2 s (PERMIT_RECHECK is 1 s)");
}

/// An acquisition that too few replicas confirmed is undone in the
/// background, and each retry is a new request (it used to reuse the record
/// field and marker: a retry landing before the undo took permits again and
/// one acquisition's worth stayed out for good).
#[test]
fn unconfirmed_semaphore_acquisition_leaves_no_permits_out() {
    let (master, replica) = crate::replica_sync::master_and_replica();
    let proxy = Proxy::start(master.addr());
    let c = Client::builder(proxy.url())
        .sync_replicas(1, Duration::from_millis(200))
        .retry_attempts(2)
        .build()
        .expect("client");
    let sem = c.semaphore("sync:pool");
    assert!(sem.try_set_permits(3).expect("set"));
    wait_until("a first confirmed acquisition", WAIT, || {
        sem.try_acquire(1)
            .is_ok_and(|p| p.is_some_and(|p| p.release().is_ok()))
    });
    // Hold the background undos back a little (the watchdog thread's
    // requests; the retries go on other connections).
    let undo = sha(include_str!("../../src/scripts/semaphore_release.lua"));
    proxy.add_rule(
        undo.as_bytes(),
        Fault::DelayRequest(Duration::from_secs(1)),
        3,
    );
    replica.pause();
    let r = sem.try_acquire(1);
    eprintln!("unconfirmed: {r:?}");
    assert!(r.is_err() || r.as_ref().is_ok_and(Option::is_none));
    drop(r);
    replica.resume();
    thread::sleep(Duration::from_millis(300));
    wait_until("the undos to settle", WAIT, || {
        c.stats().unsettled_requests == 0
    });
    assert_eq!(
        available(&master, "sync:pool"),
        3,
        "permits out after a failed acquire"
    );
}

#[test]
fn unconfirmed_expirable_acquisition_leaves_no_permit_out() {
    let (master, replica) = crate::replica_sync::master_and_replica();
    let proxy = Proxy::start(master.addr());
    let c = Client::builder(proxy.url())
        .sync_replicas(1, Duration::from_millis(200))
        .retry_attempts(2)
        .build()
        .expect("client");
    let sem = c.permit_expirable_semaphore("sync:slots");
    assert!(sem.try_set_permits(3).expect("set"));
    wait_until("a first confirmed acquisition", WAIT, || {
        sem.try_acquire(Duration::from_secs(60))
            .is_ok_and(|p| p.is_some_and(|p| p.release().is_ok()))
    });
    let undo = sha(concat!(
        include_str!("../../src/scripts/permit_lib.lua"),
        include_str!("../../src/scripts/permit_release.lua")
    ));
    proxy.add_rule(
        undo.as_bytes(),
        Fault::DelayRequest(Duration::from_secs(1)),
        3,
    );
    replica.pause();
    let r = sem.try_acquire(Duration::from_secs(600));
    eprintln!("unconfirmed: {r:?}");
    assert!(r.is_err() || r.as_ref().is_ok_and(Option::is_none));
    drop(r);
    replica.resume();
    thread::sleep(Duration::from_millis(300));
    wait_until("the undos to settle", WAIT, || {
        c.stats().unsettled_requests == 0
    });
    assert_eq!(
        srv_zcard(&master, "{sync:slots}:timeout"),
        0,
        "a permit out after a failed acquire"
    );
    assert_eq!(
        available(&master, "sync:slots"),
        3,
        "permits out after a failed acquire (and not in the set: they never expire)"
    );
}

fn srv_zcard(srv: &RedisServer, key: &str) -> i64 {
    srv.cmd(&["ZCARD", key]).parse().unwrap_or(-1)
}

/// A permit id with a sign is refused (u8::from_str_radix accepts '+').
#[test]
fn permit_id_with_a_sign_is_refused() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.permit_expirable_semaphore("ids");
    let id = format!("+a{}", "0".repeat(30));
    let r = sem.release(&id);
    assert!(
        r.as_ref().is_err_and(|e| e.is_invalid_argument()),
        "{id:?} is not 32 hex digits: {r:?}"
    );
}

/// The same as unconfirmed_semaphore_acquisition_leaves_no_permits_out
/// without any proxy rule: the natural race.
#[test]
fn unconfirmed_semaphore_acquisition_no_fault_injection() {
    let (master, replica) = crate::replica_sync::master_and_replica();
    let c = Client::builder(master.url())
        .sync_replicas(1, Duration::from_millis(200))
        .retry_attempts(2)
        .build()
        .expect("client");
    let sem = c.semaphore("sync:pool");
    assert!(sem.try_set_permits(3).expect("set"));
    wait_until("a first confirmed acquisition", WAIT, || {
        sem.try_acquire(1)
            .is_ok_and(|p| p.is_some_and(|p| p.release().is_ok()))
    });
    replica.pause();
    let r = sem.try_acquire(1);
    eprintln!("unconfirmed: {r:?}");
    drop(r);
    replica.resume();
    thread::sleep(Duration::from_millis(300));
    wait_until("the undos to settle", WAIT, || {
        c.stats().unsettled_requests == 0
    });
    assert_eq!(
        available(&master, "sync:pool"),
        3,
        "permits out after a failed acquire"
    );
}

/// A server behind a proxy, and a client through it that resends a request
/// on a new connection when the old one dropped after sending it (the
/// default `retry_attempts`).
fn behind_proxy() -> (RedisServer, Proxy, Client) {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = client(&proxy.url());
    (srv, proxy, c)
}

/// The connection layer resends a request whose connection dropped after it
/// was sent; the acquire script finds its own record and does not take the
/// permits twice.
#[test]
fn cut_acquire_retried_takes_permits_once() {
    let (srv, proxy, c) = behind_proxy();
    let sem = c.semaphore("cut");
    assert!(sem.try_set_permits(3).expect("set"));
    // Scripts loaded first: the cut must hit an EVALSHA that runs.
    sem.acquire(1).expect("warm").release().expect("warm");
    let rule = proxy.add_rule(b"redlease_semaphore_cancel", Fault::CutAfterRequest, 1);
    let p = sem
        .acquire(1)
        .expect("acquire (retried on a new connection)");
    eprintln!("hits {} stats {:?}", proxy.hits(rule), c.stats());
    eprintln!("available while 1 is held: {}", available(&srv, "cut"));
    p.release().expect("release");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(c.stats().unsettled_requests, 0);
    assert_eq!(available(&srv, "cut"), 3, "a permit is out for good");
}

#[test]
fn cut_expirable_acquire_retried_takes_one_permit() {
    let (srv, proxy, c) = behind_proxy();
    let sem = c.permit_expirable_semaphore("cutx");
    assert!(sem.try_set_permits(3).expect("set"));
    sem.acquire(Duration::from_secs(60))
        .expect("warm")
        .release()
        .expect("warm");
    proxy.add_rule(b"redlease_permit_cancel", Fault::CutAfterRequest, 1);
    let p = sem
        .acquire(Duration::from_secs(600))
        .expect("acquire (retried on a new connection)");
    eprintln!("available while 1 is held: {}", available(&srv, "cutx"));
    p.release().expect("release");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(available(&srv, "cutx"), 3, "a permit is out for good");
}

/// Semaphore::release(n) and add_permits are not idempotent: never resent
/// after a dropped connection (they used to be applied twice; Redisson
/// sends them without retry too).
#[test]
fn cut_release_n_is_not_applied_twice() {
    let (srv, proxy, c) = behind_proxy();
    let sem = c.semaphore("add");
    assert!(sem.try_set_permits(1).expect("set"));
    sem.add_permits(0).expect("warm the script");
    let add = sha(include_str!("../../src/scripts/semaphore_add.lua"));
    proxy.add_rule(add.as_bytes(), Fault::CutAfterRequest, 1);
    let r = sem.release(1);
    eprintln!("release(1): {r:?}");
    assert_eq!(
        available(&srv, "add"),
        2,
        "release(1) added {}",
        available(&srv, "add") - 1
    );
}

/// drain_permits is not resent either (a resent drain found 0 and the
/// caller was told 0, the drained permits out in nobody's name).
#[test]
fn cut_drain_reports_what_it_took() {
    let (srv, proxy, c) = behind_proxy();
    let sem = c.semaphore("drain");
    assert!(sem.try_set_permits(0).expect("set"));
    assert_eq!(sem.drain_permits().expect("warm"), 0);
    sem.add_permits(5).expect("add");
    let drain = sha(include_str!("../../src/scripts/semaphore_drain.lua"));
    proxy.add_rule(drain.as_bytes(), Fault::CutAfterRequest, 1);
    let r = sem.drain_permits();
    eprintln!("drain: {r:?}, available {}", available(&srv, "drain"));
    assert!(
        r.is_err() || r.as_ref().is_ok_and(|n| *n == 5),
        "drained 5, told {r:?}"
    );
}

/// A guard's release resent after a cut finds its latch (the first copy
/// ran) and reports success, not PermitLost.
#[test]
fn cut_guard_release_is_not_reported_lost() {
    let (srv, proxy, c) = behind_proxy();
    let sem = c.semaphore("rel");
    assert!(sem.try_set_permits(1).expect("set"));
    sem.acquire(1).expect("warm").release().expect("warm");
    let p = sem.acquire(1).expect("acquire");
    let rel = sha(include_str!("../../src/scripts/semaphore_release.lua"));
    proxy.add_rule(rel.as_bytes(), Fault::CutAfterRequest, 1);
    let r = p.release();
    assert_eq!(available(&srv, "rel"), 1);
    assert!(r.is_ok(), "released once, told {r:?}");
}

/// An expirable waiter re-checks within PERMIT_RECHECK even when the first
/// permit out expires much later: a permit returned without a message is
/// found (the expiry used to replace the re-check, up to the holder's
/// lease).
#[test]
fn expirable_waiter_rechecks_within_permit_recheck() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let sem = c.permit_expirable_semaphore("quiet");
    assert!(sem.try_set_permits(1).expect("set"));
    let id = sem
        .acquire(Duration::from_secs(3600))
        .expect("acquire")
        .forget();
    let (tx, rx) = mpsc::channel();
    let waiter = sem.clone();
    thread::spawn(move || {
        let t = Instant::now();
        let p = waiter
            .try_acquire_for(Duration::from_secs(8), Duration::from_secs(60))
            .expect("wait");
        tx.send((p.is_some(), t.elapsed())).expect("report");
    });
    wait_until("the waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_sc:{quiet}") == 1
    });
    thread::sleep(Duration::from_millis(200));
    // The permit comes back with no message.
    let raw: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut conn = srv.conn();
    let removed: i64 = redis::cmd("ZREM")
        .arg("{quiet}:timeout")
        .arg(&raw[..])
        .query(&mut conn)
        .unwrap();
    assert_eq!(removed, 1);
    let _: i64 = redis::cmd("INCRBY")
        .arg("quiet")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let returned = Instant::now();
    let (got, _) = rx.recv_timeout(WAIT).expect("the waiter returns");
    let after = returned.elapsed();
    assert!(got, "the waiter never saw the free permit");
    assert!(
        after < Duration::from_secs(3),
        "took the free permit {after:?} after it came back (PERMIT_RECHECK is 1 s)"
    );
}
