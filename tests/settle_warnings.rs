//! Settling requests whose reply was lost warns once per cause, not once
//! per request: twenty releases that fail while Redis is down are one or
//! two `warn` lines (no connection, the connection failing), and are all
//! completed once Redis is back. In its own binary: it installs a global
//! logger that counts the warnings.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use redlease::Client;
use redlease_testkit::{wait_until, RedisServer};

/// Counts redlease's `warn` lines about failed settles, and keeps them.
struct Counter {
    settle_warnings: AtomicUsize,
    lines: Mutex<Vec<String>>,
}

impl log::Log for Counter {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = record.args().to_string();
        if record.level() == log::Level::Warn && line.contains("settling a request") {
            self.settle_warnings.fetch_add(1, Ordering::Relaxed);
            self.lines.lock().unwrap().push(line);
        }
    }

    fn flush(&self) {}
}

static COUNTER: Counter = Counter {
    settle_warnings: AtomicUsize::new(0),
    lines: Mutex::new(Vec::new()),
};

#[test]
fn failed_settles_warn_once_per_cause() {
    log::set_logger(&COUNTER).expect("the only logger of this binary");
    log::set_max_level(log::LevelFilter::Warn);
    const LOCKS: usize = 20;
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    // Twenty threads, each with a lock, release one after another after the
    // kill, each release failing within its timeouts.
    let held = Arc::new(Barrier::new(LOCKS + 1));
    let killed = Arc::new(Barrier::new(LOCKS + 1));
    let holders: Vec<_> = (0..LOCKS)
        .map(|i| {
            let (client, held, killed) = (client.clone(), held.clone(), killed.clone());
            thread::spawn(move || {
                let g = client
                    .lock(format!("warn:{i}"))
                    .lock_with_lease(Duration::from_secs(60))
                    .expect("lock");
                held.wait();
                killed.wait();
                // Staggered, so that the requests reach the settling thread
                // at different points of its back-off (all at once, it only
                // ever tries the first one or two of them).
                thread::sleep(Duration::from_millis(100) * i as u32);
                g.unlock().is_err()
            })
        })
        .collect();
    held.wait();
    server.kill();
    killed.wait();
    for h in holders {
        assert!(h.join().expect("a holder"), "redis is down");
    }
    wait_until(
        "every release handed to settlement",
        Duration::from_secs(10),
        || client.stats().unsettled_requests == LOCKS as u64,
    );
    // Six passes of the settling thread (its back-off doubles from 50 ms to
    // at most 1 s: 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1 s).
    thread::sleep(Duration::from_secs(3));
    let warned = COUNTER.settle_warnings.load(Ordering::Relaxed);
    println!("{warned} warnings for {LOCKS} pending settles:");
    for l in COUNTER.lines.lock().unwrap().iter() {
        println!("  {l}");
    }
    assert!(
        (1..=2).contains(&warned),
        "one warning per cause, not per request ({warned} for {LOCKS})"
    );
    server.restart();
    wait_until("every release completed", Duration::from_secs(20), || {
        client.stats().unsettled_requests == 0
    });
    assert_eq!(COUNTER.settle_warnings.load(Ordering::Relaxed), warned);
}
