//! The client's background threads (`redlease-watchdog`, `redlease-pubsub`,
//! `redlease-connect`) live while any `Client` clone or `LockGuard` does, and
//! stop once the last of them is gone. Threads are found by name in
//! `/proc/self/task/*/comm` (truncated by Linux to 15 bytes), so this file has
//! a single test: other tests in the same process would disturb the counts.

use redlease_testkit as support;

use std::thread;
use std::time::{Duration, Instant};

use redlease::Client;
use support::RedisServer;

const WATCHDOG: &str = "redlease-watchd";
const PUBSUB: &str = "redlease-pubsub";
const CONNECT: &str = "redlease-connec";
const LEASE: Duration = Duration::from_millis(600);
const WAIT: Duration = Duration::from_secs(10);

/// How many threads of this process carry `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

fn counts() -> (usize, usize, usize) {
    (
        threads_named(WATCHDOG),
        threads_named(PUBSUB),
        threads_named(CONNECT),
    )
}

/// Waits until the named threads are `want`; the message shows what is left.
fn wait_for_counts(what: &str, want: (usize, usize, usize)) {
    let deadline = Instant::now() + WAIT;
    while counts() != want {
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}: (watchdog, pubsub, connect) threads are \
             {:?}, want {want:?}; all threads: {:?}",
            counts(),
            thread_names()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_owned())
        .collect()
}

fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).expect("PTTL")
}

/// Makes `client`'s subscriber thread start: another thread waits briefly
/// for `name`, which the calling thread holds.
fn start_subscriber(client: &Client, name: &str) {
    thread::scope(|s| {
        s.spawn(|| {
            let got = client
                .lock(name)
                .try_lock_for(Duration::from_millis(300))
                .expect("try_lock_for");
            assert!(got.is_none(), "{name} is held by the other thread");
        });
    });
}

#[test]
fn background_threads_stop_with_the_last_client_and_guard() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    // Never watches or waits: only its connect thread runs.
    let observer = Client::builder(srv.url())
        .pool_size(1)
        .build()
        .expect("build observer");
    wait_for_counts("only the observer's connect thread", (0, 0, 1));

    // --- The guard outlives the client. ---
    let client = Client::builder(srv.url())
        .watchdog_timeout(LEASE)
        .build()
        .expect("build client");
    let name = "sd:guard-outlives";
    let guard = client.lock(name).lock().expect("lock");
    start_subscriber(&client, name);
    wait_for_counts(
        "one watchdog, one subscriber, two connect threads",
        (1, 1, 2),
    );
    println!(
        "FIGURE: threads with a client holding a lock (plus an observer client): {:?}",
        task_count()
    );

    drop(client);
    assert_eq!(counts(), (1, 1, 2), "the guard keeps the client's threads");
    let start = Instant::now();
    let mut min = i64::MAX;
    while start.elapsed() < LEASE * 5 / 2 {
        let ms = pttl(&mut conn, name);
        assert!(
            ms > 0,
            "the lease must still be renewed after the client was dropped (PTTL {ms})"
        );
        min = min.min(ms);
        thread::sleep(Duration::from_millis(50));
    }
    println!("FIGURE: min PTTL over 2.5 leases with only the guard alive: {min} ms");
    guard.ensure_held().expect("held after 2.5 leases");
    assert_eq!(
        counts(),
        (1, 1, 2),
        "the guard still keeps the client's threads"
    );

    drop(guard);
    assert!(
        !observer.lock(name).is_locked().expect("is_locked"),
        "dropping the guard releases the lock at once"
    );
    wait_for_counts("the dropped client's threads to stop", (0, 0, 1));

    // --- The client (two clones) outlives the guard. ---
    let client = Client::builder(srv.url())
        .watchdog_timeout(LEASE)
        .build()
        .expect("build client");
    let clone = client.clone();
    let name = "sd:client-outlives";
    let guard = client.lock(name).lock().expect("lock");
    start_subscriber(&clone, name);
    wait_for_counts("the new client's watchdog and subscriber", (1, 1, 2));
    drop(guard);
    assert!(!observer.lock(name).is_locked().unwrap());
    drop(client);
    // The remaining clone still owns its threads (give a wrongly stopping
    // thread a renewal interval to go).
    thread::sleep(LEASE / 3);
    assert_eq!(counts(), (1, 1, 2), "a clone keeps the client's threads");
    let guard = clone
        .lock(name)
        .lock()
        .expect("lock again through the clone");
    guard.unlock().expect("unlock");
    drop(clone);
    wait_for_counts("the last clone's threads to stop", (0, 0, 1));

    drop(observer);
    wait_for_counts("the observer's connect thread to stop", (0, 0, 0));
}

fn task_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .count()
}
