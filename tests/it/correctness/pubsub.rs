//! The subscriber under single injected faults: a silent (half-open)
//! subscriber link, a server that accepts and then drops every connection,
//! two lock names sharing one release channel, a woken waiter whose retry
//! fails, and a SUBSCRIBE that Redis refuses.
//!
//! Each test names the defect it pins and fails on the code before the fix.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::{Client, Result};

use crate::faults_common::{
    builder, figure, is_acquire_of, numsub, warm_subscriber, Monitor, MARGIN,
};
use crate::support::{wait_until, Fault, Proxy, RedisServer};

/// A bound for waits on something that happens within a few hundred ms.
const WAIT: Duration = Duration::from_secs(10);
/// The waiters' response timeout where a test depends on it.
const RT: Duration = Duration::from_millis(300);

/// Redisson's release channel of lock `name` (a name with a hash tag is used
/// as it is, so `k` and `{k}` share one channel).
fn channel(name: &str) -> String {
    if name.contains('{') {
        format!("redisson_lock__channel:{name}")
    } else {
        format!("redisson_lock__channel:{{{name}}}")
    }
}

/// A server with the library's acquire script loaded, so that every acquire
/// is one EVALSHA (a rule on its SHA then matches exactly the acquires).
fn server() -> RedisServer {
    let srv = RedisServer::start();
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(concat!(
            include_str!("../../../src/scripts/queue_lib.lua"),
            include_str!("../../../src/scripts/acquire.lua")
        ))
        .query(&mut srv.conn())
        .expect("SCRIPT LOAD");
    srv
}

fn acquire_sha() -> Vec<u8> {
    redis::Script::new(concat!(
        include_str!("../../../src/scripts/queue_lib.lua"),
        include_str!("../../../src/scripts/acquire.lua")
    ))
    .get_hash()
    .as_bytes()
    .to_vec()
}

/// A holder client straight to the server, with a 30 s watchdog lease: a
/// waiter woken by the lease instead of the release takes 30 s.
fn holder(srv: &RedisServer) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(Duration::from_secs(30))
        .build()
        .expect("holder client")
}

/// One waiter thread: `try_lock_for(wait)` on `name`; reports when it
/// returned and whether it got the lock (the guard is released at once).
fn spawn_waiter(
    client: &Client,
    name: &str,
    wait: Duration,
    tx: &mpsc::Sender<(String, Instant, Result<bool>)>,
) -> thread::JoinHandle<()> {
    let (client, name, tx) = (client.clone(), name.to_owned(), tx.clone());
    thread::spawn(move || {
        let got = client.lock(name.as_str()).try_lock_for(wait);
        let at = Instant::now();
        let got = got.map(|g| g.is_some());
        let _ = tx.send((name, at, got));
    })
}

/// Waits until `count` more acquire attempts on `name` by `client` ran.
fn wait_attempts(monitor: &mut Monitor, client: &Client, name: &str, count: usize) {
    monitor.wait_for(
        &format!("{count} acquire attempt(s) on {name}"),
        |l| is_acquire_of(l, name) && l.contains(client.id()),
        count,
    );
}

/// Defect 5: only the subscriber connection goes silent (no FIN, no RST, both
/// directions). Before the fix nothing noticed: the release message never
/// came and the waiter slept until its deadline (the holder's lease was 30 s).
/// Now an idle PING that gets no PONG within the response timeout declares
/// the link dead; the subscriber reconnects, re-subscribes and wakes the
/// waiter, which takes the lock within a few response timeouts.
#[test]
fn silent_subscriber_link_is_detected_and_replaced() {
    const NAME: &str = "pubsub:silent";
    let srv = server();
    let proxy = Proxy::start(srv.addr());
    let holder = holder(&srv);
    let waiters = builder(&proxy.url(), RT).build().expect("waiter client");
    warm_subscriber(&holder, &waiters);
    let guard = holder.lock(NAME).lock().expect("holder lock");
    let lease = holder.lock(NAME).remaining_lease().unwrap().expect("held");
    assert!(lease > Duration::from_secs(20), "{lease:?}");

    let mut monitor = Monitor::start(&srv);
    let (tx, rx) = mpsc::channel();
    let t = spawn_waiter(&waiters, NAME, Duration::from_secs(10), &tx);
    wait_attempts(&mut monitor, &waiters, NAME, 2);
    wait_until("the waiter to be subscribed", WAIT, || {
        numsub(&srv, &channel(NAME)) == 1
    });
    let subscribers = proxy.connections_that_sent(b"SUBSCRIBE");
    assert_eq!(subscribers.len(), 1, "one subscriber connection");
    assert!(
        proxy.black_hole(subscribers[0]),
        "the subscriber link is open"
    );

    let released = Instant::now();
    guard.unlock().expect("holder unlock");
    let (_, at, got) = rx.recv_timeout(Duration::from_secs(15)).expect("waiter");
    t.join().expect("waiter thread");
    assert!(got.expect("try_lock_for"), "the waiter got the lock");
    let took = at.saturating_duration_since(released);
    figure(&format!(
        "silent subscriber link (response timeout {RT:?}): waiter acquired {} ms after the release",
        took.as_millis()
    ));
    assert!(
        took < RT * 3 + MARGIN,
        "the waiter got the lock {took:?} after the release over a silent subscriber link \
         (response timeout {RT:?}, holder lease {lease:?})"
    );
    assert!(
        waiters.stats().subscriber_reconnects >= 1,
        "the silent link was replaced"
    );
}

/// Defect 6: the server (here a proxy whose backend is down) accepts each
/// connection and closes it at once. Before the fix the backoff was reset by
/// every successful TCP connect, so the subscriber reconnected thousands of
/// times a second. Now a connection must prove itself (answer a PING) before
/// the backoff resets: over 2 s only a handful of attempts are made, and
/// once the server takes connections again the waiter is woken by the
/// release as before.
#[test]
fn reconnects_back_off_while_connections_are_dropped_at_once() {
    const NAME: &str = "pubsub:reject";
    let srv = server();
    let proxy = Proxy::start(srv.addr());
    let holder = holder(&srv);
    // A response timeout long enough for the waiter's pool to reconnect after
    // the outage (r2d2 retries failed connects up to connection_timeout / 2
    // apart): the test is about the subscriber, not the pool.
    let waiters = builder(&proxy.url(), Duration::from_secs(2))
        .build()
        .expect("waiter client");
    warm_subscriber(&holder, &waiters);
    let guard = holder.lock(NAME).lock().expect("holder lock");

    let mut monitor = Monitor::start(&srv);
    let (tx, rx) = mpsc::channel();
    let t = spawn_waiter(&waiters, NAME, Duration::from_secs(25), &tx);
    wait_attempts(&mut monitor, &waiters, NAME, 2);
    wait_until("the waiter to be subscribed", WAIT, || {
        numsub(&srv, &channel(NAME)) == 1
    });

    let reconnects = waiters.stats().subscriber_reconnects;
    let before = proxy.connections_total();
    proxy.set_reject(true);
    // Only the subscriber's connection: the waiter's pooled connection may
    // still carry the answer to its last attempt.
    let subscriber = proxy.connections_that_sent(b"SUBSCRIBE");
    assert_eq!(subscriber.len(), 1, "one subscriber connection");
    assert!(proxy.cut_connection(subscriber[0]));
    thread::sleep(Duration::from_secs(2));
    let attempts = proxy.connections_total() - before;
    figure(&format!(
        "server accepting and closing every connection: {attempts} subscriber connection \
         attempts in 2 s"
    ));
    assert!(
        (1..40).contains(&attempts),
        "{attempts} connection attempts in 2 s while every connection was dropped at once"
    );
    assert_eq!(
        waiters.stats().subscriber_reconnects,
        reconnects,
        "a connection that never answered does not count as re-established"
    );

    proxy.set_reject(false);
    let back_from = proxy.connections_total();
    let t0 = Instant::now();
    while numsub(&srv, &channel(NAME)) != 1 {
        assert!(
            t0.elapsed() < WAIT,
            "the subscriber is not back after {WAIT:?}: {} connection attempts since, {:?}, \
             {} open; the waiter: {:?}",
            proxy.connections_total() - back_from,
            waiters.stats(),
            proxy.connections_open(),
            rx.try_recv()
        );
        thread::sleep(Duration::from_millis(20)); // polling a server-side count
    }
    // Coming back, the subscriber wakes the waiter once (it retries, finds
    // the lock busy and waits again).
    wait_attempts(&mut monitor, &waiters, NAME, 1);
    let released = Instant::now();
    guard.unlock().expect("holder unlock");
    let (_, at, got) = rx.recv_timeout(Duration::from_secs(30)).expect("waiter");
    t.join().expect("waiter thread");
    assert!(got.expect("try_lock_for"), "the waiter got the lock");
    let took = at.saturating_duration_since(released);
    assert!(took < MARGIN, "woken {took:?} after the release");
    assert!(waiters.stats().subscriber_reconnects > reconnects);
}

/// Defect 7: `k` and `{k}` share one release channel. Before the fix one
/// latch per channel took the release message of `k` and woke one waiter:
/// the waiter of `{k}` (first in line), which found `{k}` still held and
/// slept on, while the waiter of `k` slept until the 30 s lease ran out. Now
/// each lock name has its own latch and a message wakes one waiter of each.
#[test]
fn locks_sharing_a_channel_do_not_strand_each_others_waiters() {
    const K: &str = "pubsub:k";
    const BRACED: &str = "{pubsub:k}";
    assert_eq!(channel(K), channel(BRACED), "one channel for both");
    let srv = server();
    let holder = holder(&srv);
    let waiters = Client::open(srv.url()).expect("waiter client");
    warm_subscriber(&holder, &waiters);
    let guard_k = holder.lock(K).lock().expect("hold k");
    let guard_braced = holder.lock(BRACED).lock().expect("hold {k}");

    let mut monitor = Monitor::start(&srv);
    let (tx, rx) = mpsc::channel();
    // The waiter of {k} waits first, so it is first in line on a shared latch.
    let t_braced = spawn_waiter(&waiters, BRACED, Duration::from_secs(20), &tx);
    wait_attempts(&mut monitor, &waiters, BRACED, 2);
    let t_k = spawn_waiter(&waiters, K, Duration::from_secs(20), &tx);
    wait_attempts(&mut monitor, &waiters, K, 2);
    assert_eq!(
        waiters.stats().subscribed_channels,
        3,
        "one shared release channel, a wake-up channel per lock"
    );

    let released = Instant::now();
    guard_k.unlock().expect("release k");
    let (name, at, got) = rx.recv_timeout(Duration::from_secs(25)).expect("a waiter");
    assert_eq!(name, K, "the waiter of the released lock returns first");
    assert!(got.expect("try_lock_for"), "the waiter of k got it");
    let took = at.saturating_duration_since(released);
    figure(&format!(
        "k and {{k}} share a channel: k's waiter acquired {} ms after k's release",
        took.as_millis()
    ));
    assert!(
        took < MARGIN,
        "the waiter of k got it {took:?} after the release"
    );

    // And the other way round: the waiter of {k} (still waiting) is woken by
    // the release of {k}.
    let released = Instant::now();
    guard_braced.unlock().expect("release {k}");
    let (name, at, got) = rx.recv_timeout(Duration::from_secs(25)).expect("a waiter");
    assert_eq!(name, BRACED);
    assert!(got.expect("try_lock_for"), "the waiter of {{k}} got it");
    let took = at.saturating_duration_since(released);
    assert!(
        took < MARGIN,
        "the waiter of {{k}} got it {took:?} after the release"
    );
    t_k.join().expect("waiter thread");
    t_braced.join().expect("waiter thread");
}

/// Defect 8: two waiters of one lock in one process; the release wakes one,
/// and its retry fails (its acquire request vanishes, so it times out). Before
/// the fix the wake-up it had consumed was gone and the other waiter slept
/// until the 30 s lease ran out. Now the failed waiter passes the wake-up on
/// and waits on (a failed try does not end a wait within the holder's
/// lease): one of the two takes the lock within about one response timeout
/// of the release, and the other after it. (Which one first is not pinned
/// here: the failed one tries again after a pause of its own. The hand-off
/// tests pin the passing on between processes, where it is the only way.)
#[test]
fn wake_up_of_a_failed_retry_is_passed_on() {
    const NAME: &str = "pubsub:passed";
    let srv = server();
    let proxy = Proxy::start(srv.addr());
    let holder = holder(&srv);
    let waiters = builder(&proxy.url(), RT).build().expect("waiter client");
    warm_subscriber(&holder, &waiters);
    let guard = holder.lock(NAME).lock().expect("holder lock");

    let mut monitor = Monitor::start(&srv);
    let (tx, rx) = mpsc::channel();
    let threads = [
        spawn_waiter(&waiters, NAME, Duration::from_secs(20), &tx),
        spawn_waiter(&waiters, NAME, Duration::from_secs(20), &tx),
    ];
    wait_attempts(&mut monitor, &waiters, NAME, 4);
    // The next acquire request (the woken waiter's retry) never reaches Redis.
    let rule = proxy.add_rule(&acquire_sha(), Fault::BlackHole, 1);

    let released = Instant::now();
    guard.unlock().expect("holder unlock");
    let mut results = Vec::new();
    for _ in 0..2 {
        results.push(rx.recv_timeout(Duration::from_secs(25)).expect("waiter"));
    }
    for t in threads {
        t.join().expect("waiter thread");
    }
    assert_eq!(proxy.hits(rule), 1, "exactly one retry was swallowed");
    assert!(
        results.iter().all(|(_, _, r)| matches!(r, Ok(true))),
        "both waiters got the lock, the one whose retry failed too: {results:?}"
    );
    let (_, at, _) = results[0];
    let took = at.saturating_duration_since(released);
    figure(&format!(
        "woken waiter's retry failed: the lock was taken {} ms after the release",
        took.as_millis()
    ));
    assert!(
        took < RT * 2 + MARGIN,
        "the other waiter got the lock {took:?} after the release (holder lease 30 s)"
    );
}

/// SUBSCRIBE refused: an ACL user without channel permissions (Redis 7's
/// default for new users). Before the fix the error reply was ignored: the
/// waiter slept until its deadline and returned "busy", and the error broke
/// the acknowledgement count, so each later subscription waited a full
/// response timeout. Now the waiter gets an error naming the channel and what
/// to grant, at once, and so does the next one.
#[test]
fn refused_subscribe_is_an_error_naming_the_channel() {
    const NAME: &str = "pubsub:noperm";
    let srv = server();
    let ok = srv.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">secret",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    assert_eq!(ok, "OK");
    let holder = holder(&srv);
    let _guard = holder.lock(NAME).lock().expect("holder lock");
    let url = format!("redis://locker:secret@127.0.0.1:{}/", srv.port());
    let rt = Duration::from_secs(2);
    let waiters = builder(&url, rt).build().expect("waiter client");

    for which in ["first", "second"] {
        let started = Instant::now();
        let got = waiters.lock(NAME).try_lock_for(Duration::from_secs(10));
        let took = started.elapsed();
        let err = match got {
            Err(e) => e,
            Ok(g) => panic!(
                "the {which} waiter got {:?} after {took:?}, not the SUBSCRIBE error",
                g.is_some()
            ),
        };
        assert!(err.is_auth(), "{which}: {err:?}");
        // What redis said, and what to grant, is in the cause.
        let mut text = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            text = format!("{text} <- {c}");
            cause = c.source();
        }
        assert!(text.contains(&channel(NAME)), "{which}: {text}");
        assert!(text.contains("NOPERM"), "{which}: {text}");
        assert!(
            text.contains("&redisson_lock__channel:*"),
            "{which}: {text}"
        );
        assert!(
            took < rt / 2,
            "the {which} waiter's error took {took:?} (response timeout {rt:?})"
        );
    }
    assert_eq!(waiters.stats().subscribed_channels, 0);
}
