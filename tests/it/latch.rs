//! The count-down latch (Redisson's RCountDownLatch layout): waiters across
//! threads and clients wake when the count reaches zero or the latch is
//! deleted, a missed message strands nobody, Redisson's scripts and
//! listeners interoperate.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, RedisServer};
use redlease::Client;

const WAIT: Duration = Duration::from_secs(20);
const CHANNEL: &str = "redisson_countdownlatch__channel__{batch}";

/// Starts `n` waiters (alternating between two clients) on latch `batch`;
/// each reports `wait_for(WAIT)`'s result and when it returned.
fn waiters(srv: &RedisServer, n: usize) -> mpsc::Receiver<(bool, Instant)> {
    let (tx, rx) = mpsc::channel();
    let clients = [
        Client::open(srv.url()).expect("client"),
        Client::open(srv.url()).expect("client"),
    ];
    for i in 0..n {
        let latch = clients[i % 2].count_down_latch("batch");
        let tx = tx.clone();
        thread::spawn(move || {
            let r = latch.wait_for(WAIT).expect("wait_for");
            tx.send((r, Instant::now())).expect("report");
        });
    }
    wait_until("the waiters to subscribe", WAIT, || {
        srv.subscribers(CHANNEL) == n.min(2)
    });
    rx
}

#[test]
fn waiters_wake_when_the_count_reaches_zero() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url()).expect("client");
    let latch = c.count_down_latch("batch");
    assert!(latch.try_set_count(3).expect("set"));
    assert!(!latch.try_set_count(5).expect("set again"), "it exists");
    assert_eq!(latch.count().expect("count"), 3);
    let rx = waiters(&srv, 4);
    assert_eq!(latch.count_down().expect("down"), 2);
    assert_eq!(latch.count_down().expect("down"), 1);
    assert!(rx.try_recv().is_err(), "nobody wakes before zero");
    let zero = Instant::now();
    assert_eq!(latch.count_down().expect("down"), 0);
    for _ in 0..4 {
        let (ok, at) = rx.recv_timeout(WAIT).expect("every waiter returns");
        assert!(ok);
        assert!(
            at.duration_since(zero) < Duration::from_secs(5),
            "woken by the message"
        );
    }
    assert_eq!(srv.cmd(&["EXISTS", "batch"]), "0", "gone at zero");
    assert_eq!(latch.count_down().expect("down past zero"), 0);
    assert_eq!(srv.cmd(&["EXISTS", "batch"]), "0", "nothing left");
}

#[test]
fn deleting_the_latch_wakes_its_waiters() {
    let srv = RedisServer::start();
    let latch = Client::open(srv.url())
        .expect("client")
        .count_down_latch("batch");
    latch.try_set_count(5).expect("set");
    let rx = waiters(&srv, 2);
    assert!(latch.delete().expect("delete"));
    for _ in 0..2 {
        let (ok, _) = rx.recv_timeout(WAIT).expect("every waiter returns");
        assert!(ok, "a deleted latch is open");
    }
    assert!(!latch.delete().expect("delete again"));
}

#[test]
fn wait_for_and_wait_until_time_out_and_bad_input_is_refused() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url()).expect("client");
    let latch = c.count_down_latch("batch");
    assert!(latch.wait_for(Duration::ZERO).expect("open: no latch"));
    latch.try_set_count(1).expect("set");
    let started = Instant::now();
    assert!(!latch
        .wait_for(Duration::from_millis(200))
        .expect("wait_for"));
    assert!(started.elapsed() >= Duration::from_millis(200));
    let deadline = Instant::now() + Duration::from_millis(200);
    assert!(!latch.wait_until(deadline).expect("wait_until"));
    assert!(
        Instant::now() >= deadline,
        "wait_until returned before its deadline"
    );
    assert!(
        !latch.wait_until(Instant::now()).expect("a past deadline"),
        "a deadline already past still reads the count: 1"
    );
    latch.count_down().expect("down");
    assert!(
        latch
            .wait_until(Instant::now() + Duration::from_secs(10))
            .expect("wait_until, open"),
        "the count is zero"
    );
    let e = latch.try_set_count(0).expect_err("zero");
    assert!(e.is_invalid_argument(), "{e}");
    let e = c.count_down_latch("").count().expect_err("empty name");
    assert!(e.is_invalid_argument(), "{e}");
}

/// The subscriber loses its connection and the count reaches zero before it
/// is back (the message is missed): the reconnect wakes the waiters to look
/// again.
#[test]
fn a_missed_message_strands_nobody() {
    let srv = RedisServer::start();
    let latch = Client::open(srv.url())
        .expect("client")
        .count_down_latch("batch");
    latch.try_set_count(1).expect("set");
    let rx = waiters(&srv, 2);
    assert!(srv.client_kill_type("pubsub") >= 1, "the subscribers cut");
    latch.count_down().expect("down");
    for _ in 0..2 {
        let (ok, _) = rx.recv_timeout(WAIT).expect("every waiter returns");
        assert!(ok);
    }
}

/// Redisson's count-down (its script, from the wire notes) wakes redlease's
/// waiters; redlease's reaching zero publishes what Redisson listens for.
#[test]
fn redisson_interop() {
    const REDISSON_COUNT_DOWN: &str = "local v = redis.call('decr', KEYS[1]); if v <= 0 then redis.call('del', KEYS[1]) end; if v == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end;";
    let srv = RedisServer::start();
    let latch = Client::open(srv.url())
        .expect("client")
        .count_down_latch("batch");
    latch.try_set_count(1).expect("set");
    let rx = waiters(&srv, 1);
    let _: () = redis::cmd("EVAL")
        .arg(REDISSON_COUNT_DOWN)
        .arg(2)
        .arg("batch")
        .arg(CHANNEL)
        .arg(0)
        .arg("publish")
        .query(&mut srv.conn())
        .expect("Redisson's countDown");
    let (ok, _) = rx.recv_timeout(WAIT).expect("the waiter returns");
    assert!(ok);
    // Redisson's listener decodes the payload as a long: 0 = zero count.
    let heard = srv.listen(CHANNEL);
    latch.try_set_count(1).expect("set");
    assert_eq!(heard.recv_timeout(WAIT).expect("new count"), b"1");
    latch.count_down().expect("down");
    assert_eq!(heard.recv_timeout(WAIT).expect("zero"), b"0");
}

/// A count-down whose connection drops after it reached Redis is not sent
/// again on a new connection: it counts once (the caller gets the error).
#[test]
fn a_count_down_cut_after_it_ran_counts_once() {
    let srv = RedisServer::start();
    let proxy = crate::support::Proxy::start(srv.addr());
    let c = Client::builder(proxy.url())
        .retry_attempts(3)
        .build()
        .expect("client");
    let latch = c.count_down_latch("batch");
    latch.try_set_count(3).expect("set");
    assert_eq!(latch.count_down().expect("warm the script"), 2);
    let count_down = redis::Script::new(include_str!("../../src/scripts/latch_count_down.lua"))
        .get_hash()
        .to_owned();
    proxy.add_rule(
        count_down.as_bytes(),
        crate::support::Fault::CutAfterRequest,
        1,
    );
    assert!(latch.count_down().is_err(), "the reply is cut");
    assert_eq!(srv.cmd(&["GET", "batch"]), "1", "counted once");
}
