//! During an outage redlease's warnings come at most once a second per
//! cause (renewals retried every 250 ms, guards dropped one after another,
//! the subscriber reconnecting), each under its module's target and
//! without a text prefix. In its own binary: it installs a global logger
//! that keeps every warning.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redlease::Client;
use redlease_testkit::{wait_until, RedisServer};

/// Keeps redlease's `warn` lines: when, the target, the message.
struct Keeper {
    lines: Mutex<Vec<(Instant, String, String)>>,
}

impl log::Log for Keeper {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.level() == log::Level::Warn && record.target().starts_with("redlease") {
            self.lines.lock().unwrap().push((
                Instant::now(),
                record.target().to_owned(),
                record.args().to_string(),
            ));
        }
    }

    fn flush(&self) {}
}

static KEEPER: Keeper = Keeper {
    lines: Mutex::new(Vec::new()),
};

/// What a warning is about, without what varies from one time to the next:
/// its target and the words of its message before the first parenthesis
/// or colon, digits left out.
fn cause(target: &str, message: &str) -> String {
    let head = message.split(['(', ':']).next().unwrap_or(message);
    let words: String = head.chars().filter(|c| !c.is_ascii_digit()).collect();
    format!("{target} {}", words.trim())
}

/// Installs [`KEEPER`] (once for the binary).
fn keep_warnings() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&KEEPER).expect("the only logger of this binary");
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// A user whose ACL forbids the process key: locks work, the key is not
/// written, and one warning says so, however many renewals follow.
#[test]
fn an_acl_that_forbids_the_process_key_warns_once() {
    keep_warnings();
    let server = RedisServer::start();
    let rule = "on >pw resetkeys ~acl:* ~redisson_lock__channel:* ~redisson_unlock_latch:* \
        ~redlease_acquire_cancel:* resetchannels &redisson_lock__channel:* -@all +eval \
        +evalsha +exists +get +set +del +hset +hget +hmget +hexists +hdel +pexpire +pexpireat \
        +pttl +time +publish +subscribe +unsubscribe +ping +role +wait";
    let mut args = vec!["ACL", "SETUSER", "nokey"];
    args.extend(rule.split_whitespace());
    assert_eq!(server.cmd(&args), "OK");
    let client = Client::builder(format!("redis://nokey:pw@127.0.0.1:{}/", server.port()))
        .watchdog_timeout(Duration::from_millis(150))
        .build()
        .expect("client");
    let noperm = || {
        let stats = server.cmd(&["INFO", "errorstats"]);
        let line = stats.lines().find(|l| l.starts_with("errorstat_NOPERM:"));
        line.unwrap_or_default().to_owned()
    };
    let guard = client.lock("acl:1").lock().expect("lock as the user");
    wait_until("the refused write", Duration::from_secs(10), || {
        !noperm().is_empty()
    });
    let refused = noperm();
    // Renewals every 50 ms; a process key written again would be as often
    // (every 50 ms) and refused again.
    wait_until("20 renewals", Duration::from_secs(10), || {
        client.stats().renewals >= 20
    });
    assert_eq!(noperm(), refused, "the key was not tried again");
    guard.ensure_held().expect("held all along");
    drop(guard);
    let key = redlease_testkit::process_key(client.id());
    assert_eq!(server.cmd(&["EXISTS", &key]), "0");
    let warned: Vec<String> = KEEPER
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, m)| m.contains(&key))
        .map(|(_, _, m)| m.clone())
        .collect();
    assert_eq!(warned.len(), 1, "one warning: {warned:?}");
    assert!(warned[0].contains("redlease_client:*"), "{}", warned[0]);
}

#[test]
fn an_outage_warns_at_most_once_a_second_per_cause() {
    keep_warnings();
    let server = RedisServer::start();
    let patient = |lease: Duration| {
        Client::builder(server.url())
            .watchdog_timeout(lease)
            .response_timeout(Duration::from_millis(200))
            .connection_timeout(Duration::from_millis(200))
            .build()
            .expect("client")
    };
    let a = patient(Duration::from_secs(20));
    let b = patient(Duration::from_secs(20));
    // Locks that ran out before their guards were dropped: each is named,
    // however close together (a lost lock is never held back).
    let overran: Vec<_> = ["lost-a", "lost-b"]
        .iter()
        .map(|name| {
            a.lock(*name)
                .lock_with_lease(Duration::from_millis(200))
                .expect("lock")
        })
        .collect();
    wait_until("both leases to run out", Duration::from_secs(5), || {
        overran.iter().all(|g| g.is_lost())
    });
    drop(overran);
    for name in ["lost-a", "lost-b"] {
        assert!(
            KEEPER
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|(_, _, m)| m.contains(name)),
            "no warning names {name:?}"
        );
    }
    // Watched locks (renewed every ~6.7 s; retried every 250 ms once a
    // renewal fails), guards to drop while Redis is down, and a waiter
    // whose subscriber reconnects.
    let watched: Vec<_> = (0..5)
        .map(|i| {
            a.lock(format!("w:{i}"))
                .with_renew_interval(Duration::from_millis(200))
                .lock()
                .expect("lock")
        })
        .collect();
    let dropped: Vec<_> = (0..10)
        .map(|i| {
            a.lock(format!("d:{i}"))
                .lock_with_lease(Duration::from_secs(60))
                .expect("lock")
        })
        .collect();
    let held = b.lock("busy").lock().expect("busy");
    let waiter = {
        let lock = a.lock("busy");
        thread::spawn(move || {
            lock.try_lock_for(Duration::from_secs(6))
                .map(|g| g.is_some())
        })
    };
    wait_until("the waiter to subscribe", Duration::from_secs(10), || {
        a.stats().subscribed_channels > 0
    });

    let down = Instant::now();
    server.kill();
    for g in dropped {
        drop(g); // each release fails and warns, one after another
    }
    // The outage goes on (the drops above took about 2 s): renewals fail and
    // are retried, the subscriber reconnects.
    thread::sleep(Duration::from_millis(1500));
    server.restart();
    // Its release wakes the waiter (or it finds the lock free on a re-check).
    drop(held);
    let _ = waiter.join().expect("the waiter");
    drop(watched);

    let lines = KEEPER.lines.lock().unwrap().clone();
    println!("{} warnings in the outage and after:", lines.len());
    for (at, target, message) in &lines {
        println!(
            "  +{:>6.3}s {target}: {message}",
            at.duration_since(down).as_secs_f64()
        );
    }
    assert!(!lines.is_empty(), "the outage was noticed");
    let mut last: HashMap<String, Instant> = HashMap::new();
    for (at, target, message) in &lines {
        assert!(
            target.starts_with("redlease::"),
            "a warning under target {target:?}, not its module's"
        );
        assert!(
            !message.starts_with("redlease"),
            "a text prefix in {message:?}: the target says where it comes from"
        );
        if message.contains("is no longer held") {
            // A lost lock: told for each lock, each time.
            continue;
        }
        let cause = cause(target, message);
        if let Some(before) = last.insert(cause.clone(), *at) {
            let gap = at.duration_since(before);
            assert!(
                gap >= Duration::from_millis(990),
                "{cause:?} warned twice within {gap:?}"
            );
        }
    }
}
