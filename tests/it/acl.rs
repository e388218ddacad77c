//! ACL users: the minimal rule of docs/production.md end to end, wrong passwords and
//! missing permissions.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::Client;

use crate::error_chain;
use crate::support::{wait_until, RedisServer};

// ---------------------------------------------------------------------------

/// The minimal rule of docs/production.md for a lock user whose locks are named
/// `orders:*` (keep in sync with docs/production.md).
pub(crate) const LOCKER_RULE: &str = "on >lockpw resetkeys ~orders:* ~redisson_lock__channel:* \
    ~redisson_unlock_latch:* ~redlease_acquire_cancel:* ~redlease_force_unlock_latch:* \
    ~redlease_waiting:* ~redlease_client:* resetchannels &redisson_lock__channel:* \
    &redlease_wake:* -@all +eval +evalsha +exists +get +set +del +hset +hget +hmget +hexists \
    +hdel +pexpire +pexpireat +pttl +time +zadd +zrem +zcard +zpopmin +pubsub|numsub +publish +subscribe \
    +unsubscribe +ping +role +wait";

pub(crate) fn acl(srv: &RedisServer, user: &str, rule: &str) {
    let mut args = vec!["ACL", "SETUSER", user];
    args.extend(rule.split_whitespace());
    let out = srv.cmd(&args);
    assert_eq!(out.trim(), "OK", "ACL SETUSER {user}: {out}");
}

/// User `nochan` (password `pw`): the minimal rule without the release
/// channel.
fn no_channel_user(srv: &RedisServer) {
    acl(
        srv,
        "nochan",
        &LOCKER_RULE
            .replace(">lockpw", ">pw")
            .replace("&redisson_lock__channel:*", ""),
    );
}

fn url_as(srv: &RedisServer, user: &str, pw: &str) -> String {
    format!("redis://{user}:{pw}@127.0.0.1:{}/", srv.port())
}

/// Lock, re-entry, wait/wake, watchdog and force_unlock as the README's
/// minimal user.
#[test]
fn readme_acl_rule_runs_every_operation() {
    let srv = RedisServer::start();
    acl(&srv, "locker", LOCKER_RULE);
    let client = || {
        Client::builder(url_as(&srv, "locker", "lockpw"))
            .watchdog_timeout(Duration::from_millis(900))
            .build()
            .expect("the minimal user connects")
    };
    let a = client();
    let b = client();
    let lock = a.lock("orders:1");
    let g = lock.lock().unwrap();
    let again = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_locked().unwrap());
    assert!(lock.remaining_lease().unwrap().is_some());
    drop(again);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2000) {
        thread::sleep(Duration::from_millis(100));
        g.ensure_held().expect("renewed as the minimal user");
    }
    // The rule lets the client publish its process key.
    let key = crate::support::process_key(a.id());
    wait_until("the process key", Duration::from_secs(10), || {
        srv.cmd(&["EXISTS", &key]) == "1"
    });
    // A waiter on the other client, woken by the release.
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let r = b.lock("orders:1").try_lock_for(Duration::from_secs(20));
        tx.send(r.map(|g| g.is_some())).unwrap();
        b
    });
    wait_until(
        "the waiter to subscribe and queue",
        Duration::from_secs(10),
        || {
            a.stats().subscribed_channels == 0
                && srv.subscribers("redisson_lock__channel:{orders:1}") == 1
                && srv.cmd(&["EXISTS", "redlease_waiting:{orders:1}:orders:1"]) == "1"
        },
    );
    g.unlock().unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("waiter ended");
    assert!(
        got.expect("no error as the minimal user"),
        "the waiter acquired"
    );
    let b = waiter.join().unwrap();
    let _held = a
        .lock("orders:2")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    assert!(b.lock("orders:2").force_unlock().unwrap());
    assert!(!a.lock("orders:2").is_locked().unwrap());
}

/// Renewals as a user whose rule lacks `+pexpireat` (a rule written before
/// renewals used it) or `+time`: each lock's lease is still renewed, with
/// `PEXPIRE` (`GT` once a longer explicit re-entry's lease must be kept; no
/// `PTTL` read first either way), and the refused command is tried once, not
/// on every renewal (each refusal is counted in the server's error stats and
/// ACL LOG).
#[test]
fn renewals_work_without_time_or_pexpireat() {
    let srv = RedisServer::start();
    for (user, missing) in [("noat", "pexpireat"), ("notime", "time")] {
        acl(
            &srv,
            user,
            &LOCKER_RULE
                .replace(">lockpw", ">pw")
                .replace(&format!("+{missing} "), ""),
        );
        let client = Client::builder(url_as(&srv, user, "pw"))
            .watchdog_timeout(Duration::from_millis(900))
            .build()
            .expect("the user connects");
        assert_eq!(srv.cmd(&["CONFIG", "RESETSTAT"]), "OK");
        let mut monitor = crate::faults_common::Monitor::start(&srv);
        let g = client.lock("orders:renewed").lock().unwrap();
        // Three leases long: renewed, or lost.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(2700) {
            thread::sleep(Duration::from_millis(100));
            g.ensure_held()
                .unwrap_or_else(|e| panic!("renewed as a user without {missing}: {e}"));
        }
        // A re-entry with a longer lease than the watchdog's, which the
        // renewals must keep. Three renewals on: one may have been under
        // way during the re-entry (counted after it, sent before it).
        let longer = client
            .lock("orders:renewed")
            .lock_with_lease(Duration::from_secs(10))
            .unwrap();
        let at = client.stats().renewals;
        wait_until(
            "three renewals after the longer re-entry",
            Duration::from_secs(10),
            || client.stats().renewals >= at + 3,
        );
        let renewals = client.stats().renewals;
        assert!(renewals >= 6, "{user}: {renewals} renewals");
        let refused = srv.command_stat(missing, "rejected_calls");
        assert_eq!(
            refused, 1,
            "{user}: {missing} refused in {renewals} renewals"
        );
        let lines = monitor.lines_until_echo(&srv, &format!("end-of-{user}"));
        let inner: Vec<&String> = lines
            .iter()
            .filter(|l| crate::faults_common::Monitor::client_of(l).is_none())
            .collect();
        let extended = |gt: bool| {
            inner
                .iter()
                .filter(|l| {
                    l.contains("\"pexpire\" \"orders:renewed\"") && l.contains("\"gt\"") == gt
                })
                .count()
        };
        assert!(
            extended(false) >= 2 && extended(true) >= 2,
            "{user}: renewals extend with PEXPIRE, then PEXPIRE GT: {inner:?}"
        );
        assert!(
            !inner.iter().any(|l| l.contains("\"pttl\"")),
            "{user}: no TTL read: {inner:?}"
        );
        longer.unlock().unwrap();
        g.unlock().unwrap();
    }
}

/// A user without the queue's commands (a rule written before the queue of
/// waiting processes, with its key and channel added): waits work as before,
/// every release waking the waiters on the lock's channel, also one that
/// finds the hash marked by a waiter of the same process.
#[test]
fn a_rule_without_the_queue_commands_still_wakes_waiters() {
    let srv = RedisServer::start();
    let rule = LOCKER_RULE
        .split_whitespace()
        .filter(|t| {
            !matches!(
                *t,
                "+time" | "+zadd" | "+zrem" | "+zcard" | "+zpopmin" | "+pubsub|numsub"
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    acl(&srv, "locker", &rule);
    let client = || {
        Client::builder(url_as(&srv, "locker", "lockpw"))
            .build()
            .expect("the user connects")
    };
    let (a, b) = (client(), client());
    let g = a.lock("orders:7").lock().unwrap();
    // Two waiters of one client: the first to get the lock knows the other
    // still waits and marks the hash; its release must still wake it.
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let lock = b.lock("orders:7");
        let tx = tx.clone();
        thread::spawn(move || {
            let r = lock.try_lock_for(Duration::from_secs(20)).map(|g| {
                let held = g.is_some();
                thread::sleep(Duration::from_millis(50));
                drop(g);
                held
            });
            tx.send((r, Instant::now())).unwrap();
        });
    }
    wait_until("both waiters to try twice", Duration::from_secs(10), || {
        b.stats().subscribed_channels == 2 && b.stats().round_trips >= 4
    });
    let released = Instant::now();
    g.unlock().unwrap();
    for _ in 0..2 {
        let (r, at) = rx
            .recv_timeout(Duration::from_secs(15))
            .expect("waiter ended");
        assert!(
            r.expect("no error without the queue"),
            "the waiter acquired"
        );
        assert!(
            at - released < Duration::from_secs(5),
            "woken by a release, not the 30 s lease ({:?})",
            at - released
        );
    }
    assert_eq!(
        srv.cmd(&["EXISTS", "redlease_waiting:{orders:7}:orders:7"]),
        "0"
    );
    assert_eq!(srv.cmd(&["EXISTS", "orders:7"]), "0", "no mark left behind");
}

/// A wrong password is an `is_auth()` error at once, from `build()` and
/// from the first call of a lazily built client, never a pool timeout.
#[test]
fn wrong_password_is_an_auth_error_at_once() {
    let srv = RedisServer::start();
    acl(&srv, "locker", LOCKER_RULE);
    let bad = url_as(&srv, "locker", "wrong");
    let started = Instant::now();
    let err = Client::builder(bad.as_str())
        .connection_timeout(Duration::from_secs(5))
        .build()
        .expect_err("a wrong password must fail");
    let took = started.elapsed();
    eprintln!("wrong password, build() ({took:?}): {}", error_chain(&err));
    assert!(err.is_auth(), "{err:?}");
    assert!(!err.is_connection_error(), "{err:?}");
    // Well short of the 5 s connection timeout a pool timeout would take
    // (the bound leaves room for a loaded machine).
    assert!(
        took < Duration::from_secs(1),
        "at once, not after 5 s ({took:?})"
    );
    assert!(
        error_chain(&err).contains("WRONGPASS"),
        "what redis said is kept: {}",
        error_chain(&err)
    );

    let lazy = Client::builder(bad.as_str())
        .connection_timeout(Duration::from_secs(5))
        .build_lazy()
        .expect("build_lazy opens no connection");
    for i in 0..3 {
        let started = Instant::now();
        let err = lazy
            .lock("orders:1")
            .try_lock()
            .expect_err("wrong password");
        let took = started.elapsed();
        assert!(err.is_auth(), "call {i}: {err:?}");
        assert!(
            took < Duration::from_secs(1),
            "call {i} at once, not after the 5 s connection timeout ({took:?})"
        );
    }
    // An unknown user too.
    let err = Client::open(url_as(&srv, "nobody", "x")).expect_err("unknown user");
    assert!(err.is_auth(), "{err:?}");
}

/// A user without the lock's keys, or without the release channel, gets
/// `is_auth()` errors, not a hang.
#[test]
fn missing_permissions_are_auth_errors() {
    let srv = RedisServer::start();
    acl(&srv, "locker", LOCKER_RULE);
    let c = Client::builder(url_as(&srv, "locker", "lockpw"))
        .connection_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // A lock name outside ~orders:*.
    let started = Instant::now();
    let err = c.lock("invoices:1").lock().expect_err("key not granted");
    assert!(err.is_auth(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "at once");
    eprintln!("key not granted: {}", error_chain(&err));

    // The channel not granted: taking a free lock works, waiting for a
    // busy one fails at the SUBSCRIBE, and releasing changes nothing.
    no_channel_user(&srv);
    let holder = Client::open(url_as(&srv, "locker", "lockpw")).unwrap();
    let held = holder
        .lock("orders:busy")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    let n = Client::builder(url_as(&srv, "nochan", "pw"))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = n
        .lock("orders:busy")
        .try_lock_for(Duration::from_secs(20))
        .expect_err("cannot wait without the channel");
    assert!(err.is_auth(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "no hang");
    eprintln!("channel not granted, waiting: {}", error_chain(&err));
    drop(held);

    let g = n
        .lock("orders:free")
        .lock()
        .expect("a free lock needs no channel");
    let err = g.unlock().expect_err("the release publishes");
    assert!(err.is_auth(), "{err:?}");
    eprintln!("channel not granted, releasing: {}", error_chain(&err));
    assert!(
        n.lock("orders:free").is_locked().unwrap(),
        "a release that failed changed nothing"
    );
}

/// A release the ACL refuses leaves no answer in its unlock latch: a retry
/// of the same request (same latch, as after a lost reply) is refused the
/// same way, never told "released" while the lock is still held. Refused at
/// the publish (the release channel not granted) and at the last command
/// that removes the lock (`+del` not granted). Run on the script
/// itself, twice with the same keys. (A release that wrote its latch before
/// its work, to save a call, failed both.)
#[test]
fn a_refused_release_leaves_no_answer_for_its_retry() {
    let srv = RedisServer::start();
    no_channel_user(&srv);
    acl(
        &srv,
        "nodel",
        &LOCKER_RULE.replace(">lockpw", ">pw").replace(" +del ", " "),
    );
    let owner = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a:1";
    let release = redis::Script::new(concat!(
        include_str!("../../src/scripts/queue_lib.lua"),
        include_str!("../../src/scripts/queue_wake.lua"),
        include_str!("../../src/scripts/release_plain.lua"),
        include_str!("../../src/scripts/release.lua")
    ));
    let run = |conn: &mut redis::Connection, latch: &str| {
        release
            .key("orders:r")
            .key("redisson_lock__channel:{orders:r}")
            .key(latch)
            .key("redlease_waiting:{orders:r}:orders:r")
            .arg(owner)
            .arg(0)
            .arg(30_000)
            .arg(8_000)
            .arg(9)
            .arg("publish")
            .invoke::<Option<i64>>(conn)
    };
    let admin = redis::Client::open(srv.url()).unwrap();
    let mut admin = admin.get_connection().unwrap();
    // Loaded by a user who may: these may only run it.
    release.prepare_invoke().load(&mut admin).unwrap();
    for (n, (name, refusal)) in [("nochan", "can't publish"), ("nodel", "can't run")]
        .into_iter()
        .enumerate()
    {
        let latch = format!("redisson_unlock_latch:{{orders:r}}:{owner}:{n}");
        srv.cmd(&["HSET", "orders:r", owner, "1", &format!("{owner}:gen"), "7"]);
        srv.cmd(&["PEXPIRE", "orders:r", "30000"]);
        let user = redis::Client::open(url_as(&srv, name, "pw")).unwrap();
        let mut user = user.get_connection().unwrap();
        for attempt in 1..=2 {
            let err = run(&mut user, &latch).expect_err("refused");
            assert!(
                err.to_string().contains(refusal),
                "{name}, try {attempt}: {err}"
            );
            assert_eq!(srv.cmd(&["HEXISTS", "orders:r", owner]).trim(), "1");
            assert_eq!(
                srv.cmd(&["EXISTS", &latch]).trim(),
                "0",
                "{name}, try {attempt}: the refused release left an answer in its latch"
            );
        }
        // Allowed: released, and a retry gets that answer again.
        assert_eq!(run(&mut admin, &latch).unwrap(), Some(1));
        assert_eq!(srv.cmd(&["EXISTS", "orders:r"]).trim(), "0");
        assert_eq!(
            run(&mut admin, &latch).unwrap(),
            Some(1),
            "the retry's answer"
        );
    }
}

/// docs/production.md's rule plus what it says reading holders needs: `holders()`
/// with each holder's process, and `Client::inspect`.
#[test]
fn readme_acl_rule_with_inspection_lists_holders() {
    let srv = RedisServer::start();
    let rule = format!("{LOCKER_RULE} +hgetall +multi +exec");
    acl(&srv, "locker", &rule);
    let c = Client::builder(url_as(&srv, "locker", "lockpw"))
        .name("acl-inspector")
        .build()
        .expect("the user connects");
    let lock = c.lock("orders:9");
    let _g = lock.lock().expect("lock");
    let mut holders = Vec::new();
    wait_until(
        "the holder with its process",
        Duration::from_secs(10),
        || {
            holders = lock.holders().expect("holders as the README's user");
            holders.len() == 1 && holders[0].process.is_some()
        },
    );
    let p = holders[0].process.as_ref().expect("process");
    assert_eq!(p.name.as_deref(), Some("acl-inspector"));
    // inspect() reads the family's other keys too: read access to all.
    acl(
        &srv,
        "locker",
        "%R~* +type +hlen +getrange +lrange +zrange +time +pubsub +scan",
    );
    let found = c.inspect("orders:9").expect("inspect as the README's user");
    assert_eq!(found.kind, redlease::ObjectKind::Lock);
    assert_eq!(found.holders[0].owner, holders[0].owner);
    assert_eq!(found.holders[0].process.as_ref(), Some(p));
    assert_eq!(c.list("orders:*").expect("list").len(), 1);
}
