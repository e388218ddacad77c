//! The watchdog (issue 3): leases of locks taken without one are renewed for as
//! long as they are held, each at its own interval, in batches of one round
//! trip; explicit leases are never renewed; a lost lease is reported once; a
//! killed holder's lock frees itself within its lease; 10,000 held locks cost
//! no extra threads.
//!
//! Figures are printed with a `FIGURE:` prefix (see them with
//! `cargo test --test it -- watchdog:: --nocapture`).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, RedisServer};
use redlease::{Client, LockGuard, MIN_RENEW_INTERVAL};

/// Generous bound for things that should happen at once.
const WAIT: Duration = Duration::from_secs(10);
/// How often PTTL is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Locks per renewal script call in `src/engine/watchdog.rs`.
const CHUNK: u64 = 1000;

/// Env vars of the worker-process pattern (see [`worker`]).
const WORKER_JOB: &str = "REDLEASE_WATCHDOG_WORKER";
const WORKER_URL: &str = "REDLEASE_WATCHDOG_URL";
/// Lease of the lock the killed worker holds.
const KILL_LEASE: Duration = Duration::from_secs(2);
const KILL_NAME: &str = "wd:killed-holder";
/// Locks held at once by the "many" worker.
const MANY: u64 = 10_000;

fn client(srv: &RedisServer, lease: Duration) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(lease)
        .build()
        .expect("build client")
}

/// A second client: its own id, so its own owner fields.
fn other_client(srv: &RedisServer) -> Client {
    Client::builder(srv.url())
        .pool_size(1)
        .build()
        .expect("build a second client")
}

fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(conn)
        .expect("PTTL from the observer connection")
}

/// Samples PTTL of `key` every [`SAMPLE_EVERY`] for `span`, calling `check`
/// with each sample; returns the smallest one.
fn min_pttl_over(
    conn: &mut redis::Connection,
    key: &str,
    span: Duration,
    mut check: impl FnMut(i64),
) -> i64 {
    let end = Instant::now() + span;
    let mut min = i64::MAX;
    while Instant::now() < end {
        let ms = pttl(conn, key);
        check(ms);
        min = min.min(ms);
        thread::sleep(SAMPLE_EVERY);
    }
    min
}

#[test]
fn watchdog_keeps_a_lock_for_three_leases() {
    let srv = RedisServer::start();
    let lease = Duration::from_secs(1);
    let client = client(&srv, lease);
    let observer = other_client(&srv);
    let mut conn = srv.conn();
    let name = "wd:three-leases";

    let guard = client.lock(name).lock().expect("lock");
    let held_for = lease * 3;
    let min = min_pttl_over(&mut conn, name, held_for, |ms| {
        assert!(ms > 0, "PTTL of a held lock must stay positive, got {ms}");
        assert!(
            observer.lock(name).is_locked().expect("is_locked"),
            "the lock must stay held while the watchdog renews it"
        );
        assert!(!guard.is_lost(), "the guard must not report a loss");
    });
    println!(
        "FIGURE: min PTTL over {held_for:?} of a {lease:?} lease at the default interval: {min} ms"
    );
    guard.ensure_held().expect("held after 3 leases");
    assert!(client.lock(name).is_held_by_current_thread().unwrap());
    assert!(client.stats().renewals >= 3, "{:?}", client.stats());
    assert_eq!(client.stats().locks_lost, 0);
    guard.unlock().expect("unlock after 3 leases");
    assert!(!observer.lock(name).is_locked().unwrap());
}

#[test]
fn custom_renew_interval_keeps_pttl_near_the_lease() {
    let srv = RedisServer::start();
    let lease = Duration::from_secs(3);
    let client = client(&srv, lease);
    let mut conn = srv.conn();
    let name = "wd:custom-interval";

    let guard = client
        .lock(name)
        .with_renew_interval(Duration::from_millis(200))
        .lock()
        .expect("lock");
    let min = min_pttl_over(&mut conn, name, Duration::from_secs(2), |_| {});
    println!("FIGURE: min PTTL of a 3 s lease renewed every 200 ms, sampled every 50 ms for 2 s: {min} ms");
    assert!(
        min >= 2_400,
        "PTTL fell to {min} ms; renewing every 200 ms should keep it near 2.8 s"
    );
    assert!(client.stats().renewals >= 5, "{:?}", client.stats());
    guard.unlock().expect("unlock");
}

#[test]
fn explicit_lease_is_never_renewed() {
    let srv = RedisServer::start();
    let client = client(&srv, Duration::from_secs(3));
    let mut conn = srv.conn();
    let name = "wd:explicit-lease";
    let lease = Duration::from_secs(1);

    let guard = client
        .lock(name)
        .lock_with_lease(lease)
        .expect("lock_with_lease");
    assert_eq!(
        client.stats().watchdog_entries,
        0,
        "an explicit lease is not watched"
    );
    let start = Instant::now();
    let mut last = i64::MAX;
    wait_until(
        "the explicit 1 s lease to run out",
        lease + Duration::from_secs(2),
        || {
            let ms = pttl(&mut conn, name);
            if ms == -2 {
                return true;
            }
            // 0 in the last millisecond before the key expires.
            assert!(ms >= 0, "PTTL {ms}: the lock must carry its lease");
            assert!(
                ms <= last,
                "PTTL went up from {last} to {ms} ms: the lease was renewed"
            );
            last = ms;
            false
        },
    );
    let gone_after = start.elapsed();
    println!("FIGURE: an explicit 1 s lease expired {gone_after:?} after acquisition");

    let stats = client.stats();
    assert_eq!(stats.renewals, 0, "{stats:?}");
    assert_eq!(stats.renewal_round_trips, 0, "{stats:?}");
    assert!(guard.is_lost(), "the guard must know its lease ran out");
    let err = guard.ensure_held().expect_err("ensure_held after expiry");
    assert!(err.is_lock_lost(), "{err}");
    // A new holder is not disturbed by the expired guard's release.
    let other = other_client(&srv);
    let new_holder = other
        .lock(name)
        .try_lock()
        .unwrap()
        .expect("free after expiry");
    let err = guard.unlock().expect_err("unlock after expiry");
    assert!(err.is_lock_lost(), "{err}");
    assert_eq!(other.lock(name).hold_count().unwrap(), 1);
    assert!(pttl(&mut conn, name) > 0);
    new_holder.unlock().expect("the new holder unlocks");
}

#[test]
fn default_interval_is_a_third_of_the_lease() {
    let srv = RedisServer::start();
    let client = client(&srv, Duration::from_secs(3));
    let guard = client.lock("wd:default-interval").lock().expect("lock");
    // Time passing is the subject here: a 1 s interval renews 3 times in 3.5 s
    // (2 if the machine is slow), a flattened short one would renew dozens.
    thread::sleep(Duration::from_millis(3_500));
    let stats = client.stats();
    println!(
        "FIGURE: renewals in 3.5 s of a 3 s lease at the default interval: {}",
        stats.renewals
    );
    assert!(
        (2..=5).contains(&stats.renewals),
        "expected about one renewal per second (lease / 3): {stats:?}"
    );
    guard.ensure_held().expect("still held");
    guard.unlock().expect("unlock");
}

#[test]
fn deleted_lock_is_reported_lost_once() {
    let srv = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let (tx, names) = mpsc::channel::<String>();
    let client = {
        let calls = Arc::clone(&calls);
        Client::builder(srv.url())
            .watchdog_timeout(Duration::from_secs(3))
            .on_lock_lost(move |name: &str| {
                calls.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(name.to_owned());
            })
            .build()
            .expect("build client")
    };
    let interval = Duration::from_millis(200);
    let name = "wd:deleted";
    let lock = client.lock(name).with_renew_interval(interval);
    let first = lock.lock().expect("lock");
    let second = lock.lock().expect("re-enter");
    assert_eq!(second.hold_count(), 2);
    // Keeps the watchdog busy afterwards, to show the callback is not repeated.
    let keepalive = client
        .lock("wd:keepalive")
        .with_renew_interval(Duration::from_millis(100))
        .lock()
        .expect("lock keepalive");

    let mut conn = srv.conn();
    let deleted: i64 = redis::cmd("DEL").arg(name).query(&mut conn).unwrap();
    assert_eq!(deleted, 1);
    let start = Instant::now();
    wait_until(
        "the guard to see its deleted lock as lost (one renewal interval + slack)",
        interval + Duration::from_secs(2),
        || first.is_lost(),
    );
    println!(
        "FIGURE: a deleted lock (renew interval {interval:?}) was reported lost after {:?}",
        start.elapsed()
    );
    assert!(second.is_lost(), "re-entries share the loss");
    let reported = names
        .recv_timeout(WAIT)
        .expect("the on_lock_lost callback to be called");
    assert_eq!(reported, name);

    let err = first.ensure_held().expect_err("ensure_held of a lost lock");
    assert!(err.is_lock_lost(), "{err}");

    // Someone else takes the lock; the lost guards must not touch it.
    let other = other_client(&srv);
    let new_holder: LockGuard = other
        .lock(name)
        .try_lock()
        .unwrap()
        .expect("free for a new holder");
    let err = first.unlock().expect_err("unlock of a lost lock");
    assert!(err.is_lock_lost(), "{err}");
    drop(second); // the other lost guard: nothing happens
    assert!(other.lock(name).is_locked().unwrap());
    assert_eq!(
        other.lock(name).hold_count().unwrap(),
        1,
        "the new holder's hold is intact"
    );
    let fields: i64 = redis::cmd("HLEN").arg(name).query(&mut conn).unwrap();
    // The owner field and its generation field.
    assert_eq!(fields, 2, "only the new holder's fields remain");
    assert!(pttl(&mut conn, name) > 0);
    new_holder.ensure_held().expect("new holder still holds");

    // Several more renewal rounds: the loss is not reported again.
    let rounds = client.stats().renewal_round_trips;
    wait_until("three more renewal round trips", WAIT, || {
        client.stats().renewal_round_trips >= rounds + 3
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "on_lock_lost called exactly once"
    );
    assert!(matches!(names.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(client.stats().locks_lost, 1);
    keepalive.ensure_held().expect("keepalive held");
    keepalive.unlock().expect("unlock keepalive");
    new_holder.unlock().expect("new holder unlocks");
}

#[test]
fn late_renewal_never_marks_a_new_acquisition_lost() {
    // Per thread; at 40..70 ms a cycle, every phase of the 50 ms renewal is
    // hit many times (240 cycles in all, on four threads).
    const THREADS: u64 = 4;
    const CYCLES: u64 = 60;
    let srv = RedisServer::start();
    let client = client(&srv, Duration::from_secs(1));
    // Four threads, each cycling its own lock; holds of 40..70 ms put the
    // releases around the first renewal (due 50 ms after the acquisition), at
    // many phases of it, including with a renewal in flight.
    thread::scope(|s| {
        for t in 0..THREADS {
            let client = &client;
            s.spawn(move || {
                let lock = client
                    .lock(format!("wd:cycle:{t}"))
                    .with_renew_interval(MIN_RENEW_INTERVAL);
                let mut guard = lock.lock().expect("lock");
                for i in 0..CYCLES {
                    thread::sleep(Duration::from_millis(40 + (i * 7 + t * 3) % 30));
                    assert!(
                        !guard.is_lost(),
                        "iteration {i}: a fresh acquisition was marked lost"
                    );
                    guard.ensure_held().expect("held before release");
                    guard.unlock().expect("release");
                    guard = lock.lock().expect("re-acquire");
                }
                // Let any renewal sent before the last release come back.
                let rounds = client.stats().renewal_round_trips;
                wait_until("three more renewal round trips", WAIT, || {
                    client.stats().renewal_round_trips >= rounds + 3
                });
                guard.ensure_held().expect("the last acquisition is held");
                guard.unlock().expect("final release");
            });
        }
    });
    let stats = client.stats();
    println!(
        "FIGURE: {} release/re-acquire cycles at a 50 ms renew interval: {} renewals, {} lost",
        THREADS * CYCLES,
        stats.renewals,
        stats.locks_lost
    );
    assert_eq!(stats.locks_lost, 0, "{stats:?}");
}

#[test]
fn per_lock_intervals_are_not_flattened() {
    let srv = RedisServer::start();
    let client = client(&srv, Duration::from_secs(3));
    let mut conn = srv.conn();
    let fast = client
        .lock("wd:fast")
        .with_renew_interval(Duration::from_millis(100))
        .lock()
        .expect("lock fast");
    let slow = client
        .lock("wd:slow")
        .with_renew_interval(Duration::from_secs(1))
        .lock()
        .expect("lock slow");
    let before = client.stats().renewals;
    let (mut fast_min, mut slow_min) = (i64::MAX, i64::MAX);
    let end = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < end {
        fast_min = fast_min.min(pttl(&mut conn, "wd:fast"));
        slow_min = slow_min.min(pttl(&mut conn, "wd:slow"));
        thread::sleep(SAMPLE_EVERY);
    }
    let renewals = client.stats().renewals - before;
    println!(
        "FIGURE: 3 s lease, min PTTL over 2.5 s: 100 ms interval {fast_min} ms, 1 s interval \
         {slow_min} ms ({renewals} renewals in all)"
    );
    assert!(
        fast_min >= 2_500,
        "the 100 ms lock decayed to {fast_min} ms"
    );
    assert!(
        slow_min <= 2_300,
        "the 1 s lock never decayed below {slow_min} ms: was it renewed at the 100 ms interval?"
    );
    assert!(
        (15..=45).contains(&renewals),
        "about 25 (fast) + 2 (slow) renewals expected, got {renewals}"
    );
    fast.unlock().expect("unlock fast");
    slow.unlock().expect("unlock slow");
}

// ---------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------

/// Not a test on its own: the body of the worker processes that other tests
/// start from this binary. Returns at once unless [`WORKER_JOB`] is set.
#[test]
fn worker() {
    let Ok(job) = std::env::var(WORKER_JOB) else {
        return;
    };
    let url = std::env::var(WORKER_URL).expect("worker: REDLEASE_WATCHDOG_URL");
    match job.as_str() {
        "hold" => worker_hold(&url),
        "many" => worker_many(&url),
        other => panic!("worker: unknown job {other:?}"),
    }
}

/// Takes [`KILL_NAME`] under the watchdog, says so, and waits to be killed.
fn worker_hold(url: &str) {
    let client = Client::builder(url)
        .watchdog_timeout(KILL_LEASE)
        .build()
        .expect("worker: build client");
    let guard = client.lock(KILL_NAME).lock().expect("worker: lock");
    println!("WORKER LOCKED");
    std::io::stdout().flush().unwrap();
    // Parked until killed; stdin closes if the parent dies first.
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(Duration::from_secs(60));
    drop(guard);
}

/// The names of the process's threads, but the short-lived one that writes
/// a client's process key (`redlease-process`, a round trip every third of
/// the watchdog's lease, whatever the number of locks).
fn thread_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_owned())
        .filter(|n| n != "redlease-proces")
        .collect();
    names.sort();
    names
}

/// [`thread_names`] at a moment when no process-key writer is starting: a
/// new thread carries its creator's name (`redlease-watchd`) for a moment
/// before it takes its own.
fn settled_thread_names() -> Vec<String> {
    let mut names = Vec::new();
    wait_until(
        "a moment with one thread named redlease-watchd",
        WAIT,
        || {
            names = thread_names();
            names.iter().filter(|n| *n == "redlease-watchd").count() == 1
        },
    );
    names
}

fn evalsha_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no cmdstat_evalsha calls in INFO commandstats:\n{info}"))
}

/// Holds 10,000 locks on one thread: same threads as for one lock, and the
/// watchdog renews them in a handful of round trips per cycle.
fn worker_many(url: &str) {
    let client = Client::builder(url)
        .pool_size(2)
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .expect("worker: build client");
    let mut admin = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(WAIT))
        .expect("worker: admin connection");
    admin.set_read_timeout(Some(WAIT)).unwrap();

    let mut guards = Vec::with_capacity(MANY as usize);
    guards.push(
        client
            .lock("many:0")
            .try_lock()
            .unwrap()
            .expect("many:0 is free"),
    );
    // A new thread carries its creator's name until it sets its own.
    wait_until("the watchdog thread to run and take its name", WAIT, || {
        thread_names().iter().any(|n| n == "redlease-watchd")
    });
    let names_one = settled_thread_names();
    let threads_one = names_one.len();
    let start = Instant::now();
    for i in 1..MANY {
        let guard = client.lock(format!("many:{i}")).try_lock().unwrap();
        guards.push(guard.unwrap_or_else(|| panic!("many:{i} is free")));
    }
    let acquire_time = start.elapsed();
    let names_many = settled_thread_names();
    let threads_many = names_many.len();
    println!("FIGURE: threads in the process holding 1 lock: {threads_one}; holding {MANY}: {threads_many}");
    println!("FIGURE: acquiring {MANY} locks with try_lock on one thread took {acquire_time:?}");
    assert_eq!(
        threads_one, threads_many,
        "holding {MANY} locks must not add threads:\n1 lock: {names_one:?}\n{MANY} locks: {names_many:?}"
    );
    let watchdogs = names_many
        .iter()
        .filter(|n| *n == "redlease-watchd")
        .count();
    assert_eq!(watchdogs, 1, "one watchdog thread: {names_many:?}");

    // Two full renewal cycles (interval 1 s) after the acquisitions.
    let evalsha_before = evalsha_calls(&mut admin);
    let before = client.stats();
    wait_until(
        "two renewal cycles of all 10,000 locks",
        Duration::from_secs(20),
        || client.stats().renewals >= before.renewals + 2 * MANY,
    );
    let after = client.stats();
    let evalsha_after = evalsha_calls(&mut admin);
    let renewals = after.renewals - before.renewals;
    let round_trips = after.renewal_round_trips - before.renewal_round_trips;
    let evalsha = evalsha_after - evalsha_before;
    let cycles = renewals.div_ceil(MANY);
    println!(
        "FIGURE: {renewals} renewals in {round_trips} watchdog round trips ({} renewals per round trip, \
         {:.1} round trips per 1 s cycle)",
        renewals / round_trips.max(1),
        round_trips as f64 * MANY as f64 / renewals as f64
    );
    println!(
        "FIGURE: {evalsha} EVALSHA calls for {renewals} renewals ({:.1} per cycle of {MANY} locks; \
         CHUNK = {CHUNK})",
        evalsha as f64 * MANY as f64 / renewals as f64
    );
    assert!(renewals >= MANY, "{before:?} -> {after:?}");
    // Due times spread over the acquisition; each wake-up takes everything due
    // within a tenth of the interval, so a cycle has at most about 11 batches
    // whatever the number of locks.
    assert!(
        round_trips <= 15 * cycles,
        "{round_trips} round trips for {renewals} renewals ({cycles} cycles): not batched"
    );
    // One EVALSHA per chunk of a batch (plus a batch in flight at either end).
    assert!(
        evalsha <= renewals.div_ceil(CHUNK) + round_trips + 2 * (MANY / CHUNK),
        "{evalsha} EVALSHA calls for {renewals} renewals in {round_trips} round trips"
    );
    assert!(
        evalsha * 100 <= renewals,
        "{evalsha} EVALSHA calls for {renewals} renewals"
    );
    assert_eq!(after.locks_lost, 0, "{after:?}");

    let start = Instant::now();
    drop(guards);
    println!(
        "FIGURE: releasing {MANY} locks by dropping their guards took {:?}",
        start.elapsed()
    );
    let left: Vec<String> = redis::cmd("KEYS").arg("many:*").query(&mut admin).unwrap();
    assert!(
        left.is_empty(),
        "{} locks still held after release",
        left.len()
    );
}

/// A child process running [`worker`] with `job`.
struct Worker {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Worker {
    fn start(job: &str, url: &str) -> Worker {
        let mut child = crate::worker_process("watchdog::worker")
            .env(WORKER_JOB, job)
            .env(WORKER_URL, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn worker process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Worker {
            child,
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// Waits for a stdout line equal to `want`.
    fn expect_line(&mut self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest prints "test watchdog::worker ... " without a newline
                // first.
                Ok(line) if line.ends_with(want) => return,
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("timed out after {timeout:?} waiting for worker line {want:?}; so far: {:?}", self.seen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let err = self.stderr.take().map(|h| h.join().unwrap_or_default());
                    panic!(
                        "worker exited before printing {want:?}; stdout: {:?}; stderr: {err:?}",
                        self.seen
                    )
                }
            }
        }
    }

    /// Waits for the worker to exit; panics unless it succeeded. Returns its
    /// stdout lines.
    fn finish(mut self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait worker") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "worker did not finish within {timeout:?}; stdout: {:?}",
                    self.seen
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends at EOF, which follows the exit.
        while let Ok(line) = self.lines.recv_timeout(WAIT) {
            self.seen.push(line);
        }
        let err = self.stderr.take().map(|h| h.join().unwrap_or_default());
        assert!(
            status.success(),
            "worker failed ({status}):\nstdout:\n{}\nstderr:\n{}",
            self.seen.join("\n"),
            err.unwrap_or_default()
        );
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn killed_holder_is_replaced_within_its_lease() {
    let srv = RedisServer::start();
    let client = client(&srv, Duration::from_secs(3));
    let mut conn = srv.conn();
    let mut worker = Worker::start("hold", &srv.url());
    worker.expect_line("WORKER LOCKED", Duration::from_secs(30));
    assert!(
        client.lock(KILL_NAME).try_lock().unwrap().is_none(),
        "the worker holds the lock"
    );
    // Its watchdog works: the lease goes back up at least once.
    let mut last = pttl(&mut conn, KILL_NAME);
    wait_until("the worker's watchdog to renew its lease", WAIT, || {
        let ms = pttl(&mut conn, KILL_NAME);
        let renewed = ms > last;
        last = ms;
        renewed
    });

    worker.child.kill().expect("SIGKILL the worker");
    let killed = Instant::now();
    worker.child.wait().expect("reap the worker");
    let bound = KILL_LEASE + Duration::from_secs(2);
    let guard = client
        .lock(KILL_NAME)
        .try_lock_for(bound)
        .expect("try_lock_for")
        .unwrap_or_else(|| {
            panic!("not acquired within the lease ({KILL_LEASE:?}) + 2 s of the kill")
        });
    let delay = killed.elapsed();
    println!("FIGURE: lock of a SIGKILLed holder ({KILL_LEASE:?} lease) acquired {delay:?} after the kill");
    assert!(delay <= bound, "{delay:?}");
    guard.unlock().expect("unlock");
}

#[test]
fn ten_thousand_locks_one_watchdog_batched_renewals() {
    let srv = RedisServer::start();
    // Its own process, so that other tests' threads do not disturb the count.
    let worker = Worker::start("many", &srv.url());
    let lines = worker.finish(Duration::from_secs(90));
    let figures: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.find("FIGURE:").map(|at| &l[at..]))
        .collect();
    assert!(
        figures.len() >= 4,
        "the worker printed its figures: {lines:?}"
    );
    for line in figures {
        println!("{line}");
    }
}

/// A lock whose key someone overwrote with a string is lost alone: the
/// renewal of the other locks in the same batch goes on.
#[test]
fn overwritten_key_does_not_fail_the_other_renewals() {
    let srv = RedisServer::start();
    let (lost_tx, lost_rx) = std::sync::mpsc::channel::<String>();
    let lost_tx = std::sync::Mutex::new(lost_tx);
    let client = redlease::Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .on_lock_lost(move |name: &str| {
            let _ = lost_tx.lock().unwrap().send(name.to_owned());
        })
        .build()
        .expect("client connects to the test server");
    let guards: Vec<_> = (0..5)
        .map(|i| client.lock(format!("batch:{i}")).lock().unwrap())
        .collect();
    let mut conn = srv.conn();
    let _: () = redis::cmd("SET")
        .arg("batch:2")
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();
    let lost = lost_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("timed out waiting for the overwritten lock to be reported lost");
    assert_eq!(lost, "batch:2");
    // Three more lease periods: the other four stay renewed and held.
    let until = Instant::now() + Duration::from_millis(2700);
    while Instant::now() < until {
        for (i, g) in guards.iter().enumerate() {
            if i != 2 {
                assert!(!g.is_lost(), "lock batch:{i} was lost with batch:2");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(guards[2].is_lost());
    assert!(lost_rx.try_recv().is_err(), "only batch:2 is lost");
    assert_eq!(client.stats().locks_lost, 1);
}
