//! Fault injection, issue 4: holders that die or misbehave. A holder process
//! SIGKILLed with waiters in other processes; a panic inside a guarded
//! section; client handles dropped while guards live; an explicit lease that
//! runs out while the holder still has its guard.
//!
//! Multi-process tests re-run this binary as a worker (`worker` below, driven
//! by the `REDLEASE_FAULTS_WORKER` environment variable). Figures are printed
//! as `FIGURE:` lines (run with `--nocapture` to see them).

use std::io::{BufRead, BufReader, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::faults_common::{figure, is_acquire_of, numsub, server_count, Monitor};
use crate::support::{wait_until, RedisServer};
use redlease::Client;

const WORKER_ENV: &str = "REDLEASE_FAULTS_WORKER";

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}

// ---------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------

/// Starts this test binary as a worker doing `task` (`role|url|args...`).
fn spawn_worker(task: &str) -> Child {
    crate::worker_process("faults_lifecycle::worker")
        .env(WORKER_ENV, task)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn worker process")
}

/// Forwards a worker's stdout lines that start with an upper-case tag
/// (`HELD`, `ACQUIRED ...`, `OK ...`) to `tx`, tagged with `who`.
fn forward_lines(who: usize, child: &mut Child, tx: mpsc::Sender<(usize, String)>) {
    let out = child.stdout.take().expect("worker stdout");
    thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            // libtest prints "test faults_lifecycle::worker ... " without a
            // newline before the worker's own first line.
            let line = line
                .strip_prefix("test faults_lifecycle::worker ... ")
                .map_or(line.clone(), str::to_owned);
            if line.starts_with("HELD") || line.starts_with("ACQUIRED") || line.starts_with("OK") {
                if tx.send((who, line)).is_err() {
                    break;
                }
            } else if line.starts_with("WORKER") {
                println!("[worker {who}] {line}");
            }
        }
    });
}

/// The worker side; a no-op in a normal test run.
#[test]
fn worker() {
    let Ok(task) = std::env::var(WORKER_ENV) else {
        return;
    };
    let parts: Vec<&str> = task.split('|').collect();
    match parts[..] {
        ["holder", url, name, lease_ms] => {
            let client = Client::builder(url)
                .watchdog_timeout(Duration::from_millis(lease_ms.parse().unwrap()))
                .build()
                .expect("worker client");
            let _g = client.lock(name).lock().expect("holder lock");
            println!("HELD");
            std::io::stdout().flush().unwrap();
            // Hold until killed (or until the parent goes away: stdin closes).
            let mut buf = String::new();
            let _ = std::io::stdin().read_line(&mut buf);
        }
        ["waiter", url, name] => {
            let client = Client::open(url).expect("worker client");
            let g = client.lock(name).lock().expect("waiter lock()");
            println!("ACQUIRED {}", unix_ms());
            std::io::stdout().flush().unwrap();
            thread::sleep(Duration::from_millis(20)); // the guarded work
            g.unlock().expect("waiter unlock");
        }
        ["handles", url] => handles_worker(url),
        _ => panic!("unknown worker task {task:?}"),
    }
}

// ---------------------------------------------------------------------------
// Scenario 5: a holder process dies
// ---------------------------------------------------------------------------

/// A holder process SIGKILLed while three other processes wait: the first
/// waiter takes the lock within the lease (it expires; nobody renews it), the
/// others follow one after another.
#[test]
fn killed_holder_process_frees_lock_within_lease() {
    const LEASE_MS: u64 = 3000;
    const NAME: &str = "life:killed";
    let srv = RedisServer::start();
    let (tx, rx) = mpsc::channel();
    let mut holder = spawn_worker(&format!("holder|{}|{NAME}|{LEASE_MS}", srv.url()));
    forward_lines(0, &mut holder, tx.clone());
    let (who, line) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the holder process to take the lock");
    assert_eq!((who, line.as_str()), (0, "HELD"));

    let mut waiters = Vec::new();
    for i in 1..=3 {
        let mut w = spawn_worker(&format!("waiter|{}|{NAME}", srv.url()));
        forward_lines(i, &mut w, tx.clone());
        waiters.push(w);
    }
    drop(tx);
    let channel = "redisson_lock__channel:{life:killed}";
    wait_until(
        "the three waiter processes to subscribe",
        Duration::from_secs(30),
        || numsub(&srv, channel) == 3,
    );

    let pttl: i64 = srv.cmd(&["PTTL", NAME]).parse().unwrap();
    let killed_ms = unix_ms();
    holder.kill().expect("SIGKILL the holder");
    let _ = holder.wait();

    let mut acquired = Vec::new();
    for _ in 0..3 {
        let (who, line) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("every waiter process to acquire");
        let at: u128 = line
            .strip_prefix("ACQUIRED ")
            .unwrap_or_else(|| panic!("worker {who}: unexpected line {line:?}"))
            .parse()
            .unwrap();
        acquired.push(at);
    }
    for mut w in waiters {
        let status = w.wait().expect("waiter exit");
        assert!(status.success(), "waiter process failed: {status}");
    }
    acquired.sort();
    let first = acquired[0].saturating_sub(killed_ms);
    let last = acquired[2].saturating_sub(killed_ms);
    assert!(
        first <= u128::from(LEASE_MS) + 2000,
        "first waiter acquired {first} ms after the kill; lease {LEASE_MS} ms"
    );
    assert!(
        last <= first + 5000,
        "the other waiters followed by release messages, not leases ({acquired:?})"
    );
    figure(&format!(
        "holder process SIGKILLed (lease {LEASE_MS} ms, {pttl} ms left at the kill): first of 3 \
         waiter processes acquired {first} ms after the kill, the last {last} ms after"
    ));
}

// ---------------------------------------------------------------------------
// Scenario 6: a panic inside a guarded section
// ---------------------------------------------------------------------------

/// A panic while holding releases the lock during unwinding, and a waiter
/// (another client) is woken by the release message, long before the lease.
#[test]
fn panic_while_holding_releases_and_wakes_a_waiter() {
    const NAME: &str = "life:panic";
    let srv = RedisServer::start();
    let holder = Client::open(srv.url()).expect("holder client");
    let waiter = Client::open(srv.url()).expect("waiter client");
    let lease = holder.watchdog_timeout();

    for how in ["catch_unwind", "thread dies"] {
        let (held_tx, held_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let holder2 = holder.clone();
        let body = move || {
            let g = holder2.lock(NAME).lock().expect("holder lock");
            held_tx.send(()).unwrap();
            go_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the go signal");
            assert!(!g.is_lost());
            panic!("boom inside the guarded section (expected by the test)");
        };
        let holder_thread = if how == "catch_unwind" {
            thread::spawn(move || {
                let r = catch_unwind(AssertUnwindSafe(body));
                assert!(r.is_err(), "the closure panicked");
            })
        } else {
            thread::spawn(body)
        };
        held_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("holder to take the lock");

        let mut monitor = Monitor::start(&srv);
        let (acq_tx, acq_rx) = mpsc::channel::<Instant>();
        let w = waiter.clone();
        let waiter_thread = thread::spawn(move || {
            let g = w.lock(NAME).lock().expect("waiter lock()");
            acq_tx.send(Instant::now()).unwrap();
            g.unlock().expect("waiter unlock");
        });
        monitor.wait_for(
            "the waiter's attempt after subscribing",
            |l| is_acquire_of(l, NAME) && l.contains(waiter.id()),
            2,
        );

        let panicked = Instant::now();
        go_tx.send(()).unwrap();
        let got = acq_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiter to be woken by the release during unwinding");
        let after = got - panicked;
        assert!(
            after < Duration::from_secs(5),
            "waiter acquired {after:?} after the panic (lease {lease:?})"
        );
        let joined = holder_thread.join();
        assert_eq!(joined.is_err(), how == "thread dies");
        waiter_thread.join().expect("waiter thread");
        assert_eq!(srv.cmd(&["EXISTS", NAME]), "0");
        figure(&format!(
            "panic while holding ({how}): the lock was released during unwinding and a waiter \
             acquired {} ms after panic!() (time includes the panic hook printing a backtrace; \
             lease {} s)",
            after.as_millis(),
            lease.as_secs()
        ));
    }
}

// ---------------------------------------------------------------------------
// Scenario 7: client handles dropped while guards live
// ---------------------------------------------------------------------------

/// Names of this process's threads that belong to redlease.
fn redlease_threads() -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = entry.expect("task entry").path().join("comm");
        if let Ok(name) = std::fs::read_to_string(path) {
            let name = name.trim().to_owned();
            if name.starts_with("redlease-") {
                names.push(name);
            }
        }
    }
    names.sort();
    names
}

/// Runs in its own process (threads are counted per process).
fn handles_worker(url: &str) {
    const LEASE: Duration = Duration::from_millis(1500);
    let mut direct = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    let pttl = |c: &mut redis::Connection, k: &str| -> i64 {
        redis::cmd("PTTL").arg(k).query(c).expect("PTTL")
    };
    let client = Client::builder(url)
        .watchdog_timeout(LEASE)
        .build()
        .expect("worker client");
    // Start the subscriber too: wait briefly on a lock held by someone else.
    let other = Client::open(url).unwrap();
    let busy = other.lock("life:busy").lock().unwrap();
    assert!(client
        .lock("life:busy")
        .try_lock_for(Duration::from_millis(100))
        .unwrap()
        .is_none());
    busy.unlock().unwrap();
    drop(other);

    let lock_a = client.lock("life:a");
    let lock_b = client.lock("life:b");
    let a = lock_a.lock().unwrap();
    let b = lock_b.lock().unwrap();
    let b2 = lock_b.lock().unwrap();
    drop((lock_a, lock_b, client)); // every handle gone; only the guards remain
                                    // A thread spawned a moment ago may not show its name in /proc yet: wait
                                    // for it (bounded) rather than read once.
    wait_until(
        "the watchdog thread to run on while only guards live",
        Duration::from_secs(5),
        || {
            redlease_threads()
                .iter()
                .any(|t| t.starts_with("redlease-watchd"))
        },
    );
    let threads_while_held = redlease_threads();
    println!("WORKER threads while only guards live: {threads_while_held:?}");

    // The leases stay up over more than two lease periods.
    let until = Instant::now() + LEASE * 2 + LEASE / 2;
    let mut min_a = i64::MAX;
    let mut min_b = i64::MAX;
    while Instant::now() < until {
        min_a = min_a.min(pttl(&mut direct, "life:a"));
        min_b = min_b.min(pttl(&mut direct, "life:b"));
        assert!(min_a > 0 && min_b > 0, "a lease ran out: {min_a} / {min_b}");
        assert!(!a.is_lost() && !b.is_lost());
        thread::sleep(Duration::from_millis(20)); // sampling period
    }
    println!("WORKER min PTTL over 2.5 leases: a {min_a} ms, b {min_b} ms");

    // Dropping the guards releases at once (one hold at a time for b).
    drop(a);
    assert_eq!(server_count(&mut direct, "life:a"), 0, "a released on drop");
    drop(b2);
    assert_eq!(
        server_count(&mut direct, "life:b"),
        1,
        "one hold of b remains"
    );
    drop(b);
    assert_eq!(server_count(&mut direct, "life:b"), 0, "b released on drop");

    // And then the client's threads exit.
    let t = Instant::now();
    wait_until(
        "redlease's threads to exit after the last guard",
        Duration::from_secs(10),
        || redlease_threads().is_empty(),
    );
    println!(
        "OK min_pttl={} threads_exit_ms={}",
        min_a.min(min_b),
        t.elapsed().as_millis()
    );
}

/// Client handles dropped while guards live: renewal continues (the lease
/// never runs out over 2.5 lease periods), dropping the guards releases at
/// once, and the client's threads exit afterwards.
#[test]
fn guards_outlive_client_handles() {
    let srv = RedisServer::start();
    let mut w = spawn_worker(&format!("handles|{}", srv.url()));
    let (tx, rx) = mpsc::channel();
    forward_lines(0, &mut w, tx);
    let (_, line) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the worker to finish its checks");
    let status = w.wait().expect("worker exit");
    assert!(status.success(), "worker failed: {status}");
    let fields: Vec<&str> = line.split_whitespace().collect();
    figure(&format!(
        "client handles dropped while guards live (lease 1500 ms, renewed every 500 ms): lowest PTTL over 2.5 leases {} \
         ms, released at once on guard drop, background threads gone {} ms later",
        fields[1].trim_start_matches("min_pttl="),
        fields[2].trim_start_matches("threads_exit_ms=")
    ));
}

// ---------------------------------------------------------------------------
// Scenario 8: an explicit lease runs out under the holder
// ---------------------------------------------------------------------------

/// A holds with a 500 ms lease and overstays; B takes the lock after it
/// expired; A's unlock reports the loss and leaves B's lock untouched.
#[test]
fn expired_lease_unlock_reports_lost_and_spares_new_holder() {
    const NAME: &str = "life:lease";
    let srv = RedisServer::start();
    let a = Client::open(srv.url()).expect("client A");
    let b = Client::open(srv.url()).expect("client B");
    let ga = a
        .lock(NAME)
        .lock_with_lease(Duration::from_millis(500))
        .expect("A lock_with_lease");
    assert!(!ga.is_lost());
    wait_until("A's lease to run out", Duration::from_secs(5), || {
        srv.cmd(&["EXISTS", NAME]) == "0"
    });
    let gb = b
        .lock(NAME)
        .try_lock()
        .expect("B try_lock")
        .expect("free after A's lease");
    assert!(ga.is_lost(), "A's guard knows its lease has passed");
    assert!(ga.ensure_held().unwrap_err().is_lock_lost());

    let err = ga.unlock().expect_err("A's unlock after its lease ran out");
    assert!(err.is_lock_lost(), "unlock reports the loss: {err}");

    assert_eq!(b.lock(NAME).hold_count().unwrap(), 1);
    // B's owner field and its generation field.
    assert_eq!(srv.cmd(&["HLEN", NAME]), "2");
    let pttl: i64 = srv.cmd(&["PTTL", NAME]).parse().unwrap();
    assert!(pttl > 0, "B's lock keeps its lease");
    assert!(!gb.is_lost());
    gb.unlock().expect("B unlock");
    assert_eq!(srv.cmd(&["EXISTS", NAME]), "0");
}
