//! The lock family beside the plain lock, in the same run: uncontended
//! acquire + release pairs and hand-off latency of the semaphore and the
//! permit-expirable semaphore next to the reentrant lock's, with the Redis
//! limit (PING round trips) measured alongside. Run with
//! `cargo bench --bench family` (about 40 s); the `SUMMARY:` lines are the
//! result.
//!
//! 1. Pairs/s, interleaved (60 rounds of 20 ms bursts per routine, rotating
//!    order, medians of per-round ratios): PING round trips ÷ 2 (the floor
//!    of two round trips per pair), `Lock::lock_with_lease` + drop,
//!    `Semaphore::acquire(1)` + drop, `ExpirableSemaphore::acquire` + drop.
//! 2. Hand-off: this thread holds the lock (plain, fair) or the only permit
//!    while a thread on another client waits (`try_lock_with_lease` /
//!    `try_acquire_for`, 10 s); once the waiter's subscription shows on the
//!    server, the time from just before the release to the waiter holding.
//!    The kinds take turns, sample by sample.
//! 3. Readers: 1, 4 and 16 threads (one `Client`, a pool as large) take
//!    and release the read lock of one name (`lock_with_lease`) as fast as
//!    they can, beside as many threads taking plain locks of their own
//!    names (no contention: the ceiling), in alternating 1 s phases
//!    (3 each); acquisitions per second, medians.

mod support;

use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use support::{median, Mode, RedisServer};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);

fn client(server: &RedisServer) -> redlease::Client {
    redlease::Client::open(server.url()).expect("client")
}

fn pairs(mode: Mode, server: &RedisServer) {
    let c = client(server);
    let lock = c.lock("bench:pairs:lock");
    let sem = c.semaphore("bench:pairs:sem");
    sem.try_set_permits(1).expect("set");
    let pes = c.permit_expirable_semaphore("bench:pairs:pes");
    pes.try_set_permits(1).expect("set");
    let mut conn = server.conn();
    let mut ping = || {
        let _: String = redis::cmd("PING").query(&mut conn).expect("PING");
    };
    let mut plain = || drop(lock.lock_with_lease(LEASE).expect("lock"));
    let mut semaphore = || drop(sem.acquire(1).expect("acquire"));
    let mut expirable = || drop(pes.acquire(LEASE).expect("acquire"));
    let (rounds, burst) = match mode {
        Mode::Bench => (60, Duration::from_millis(20)),
        _ => (2, Duration::from_millis(5)),
    };
    let rates = support::interleaved(
        rounds,
        burst,
        &mut [&mut ping, &mut plain, &mut semaphore, &mut expirable],
    );
    println!(
        "SUMMARY: uncontended pairs/s: floor (PING/2) {:.0}; lock {:.0} ({:.2} of the floor); \
         semaphore {:.0} ({:.2}; {:.2}x the lock); expirable semaphore {:.0} ({:.2}; {:.2}x \
         the lock)",
        median(&rates[0]) / 2.0,
        median(&rates[1]),
        support::ratio(&rates, 1, 0, 0.5),
        median(&rates[2]),
        support::ratio(&rates, 2, 0, 0.5),
        support::ratio(&rates, 2, 1, 1.0),
        median(&rates[3]),
        support::ratio(&rates, 3, 0, 0.5),
        support::ratio(&rates, 3, 1, 1.0),
    );
}

/// A held lock or permit, released on drop.
type Held = Box<dyn std::any::Any>;

/// Acquires on a client, waiting at most the given time.
type Take = fn(&redlease::Client, Duration) -> Option<Held>;

/// One hand-off on `name`: `take(client, wait)` acquires on the given
/// client (`None` when it timed out); the waiter's subscription shows on
/// `channel`.
fn handoff(
    server: &RedisServer,
    holder: &redlease::Client,
    waiter: &redlease::Client,
    channel: &str,
    take: Take,
) -> Duration {
    let held = take(holder, WAIT).expect("the holder acquires");
    let (tx, rx) = mpsc::channel();
    let w = waiter.clone();
    let t = std::thread::spawn(move || {
        let got = take(&w, WAIT);
        let at = Instant::now();
        tx.send((got.is_some(), at)).expect("report");
    });
    let deadline = Instant::now() + WAIT;
    // A channel name ending in ':' is a prefix (a fair lock waiter's own
    // channel ends with its owner id).
    let subscribed = || {
        if channel.ends_with(':') {
            !server
                .cmd(&["PUBSUB", "CHANNELS", &format!("{channel}*")])
                .is_empty()
        } else {
            server.subscribers(channel) > 0
        }
    };
    while !subscribed() {
        assert!(Instant::now() < deadline, "the waiter did not subscribe");
        std::thread::sleep(Duration::from_micros(200));
    }
    let released = Instant::now();
    drop(held);
    let (ok, at) = rx.recv_timeout(WAIT).expect("hand-off");
    assert!(ok, "the waiter acquired");
    t.join().expect("waiter");
    at.duration_since(released)
}

/// Acquire + release pairs per second of `threads` threads for `phase`,
/// each running `pair(thread)`.
fn throughput(threads: usize, phase: Duration, pair: &(dyn Fn(usize) + Sync)) -> f64 {
    let start = Barrier::new(threads + 1);
    let done = std::sync::atomic::AtomicBool::new(false);
    let count = std::sync::atomic::AtomicU64::new(0);
    let elapsed = std::thread::scope(|s| {
        for t in 0..threads {
            let (start, done, count) = (&start, &done, &count);
            s.spawn(move || {
                start.wait();
                let mut n = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    pair(t);
                    n += 1;
                }
                count.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            });
        }
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(phase);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        t0.elapsed()
    });
    count.load(std::sync::atomic::Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

fn readers(mode: Mode, server: &RedisServer) {
    let (phases, phase) = match mode {
        Mode::Bench => (3, Duration::from_secs(1)),
        _ => (1, Duration::from_millis(100)),
    };
    let mut line = String::from(
        "SUMMARY: readers (acquire + release/s, one name) vs plain locks (one name per thread):",
    );
    for threads in [1usize, 4, 16] {
        let c = redlease::Client::builder(server.url())
            .pool_size(threads as u32 + 2)
            .build()
            .expect("client");
        let rw = c.read_write_lock("bench:readers");
        let read = |_: usize| drop(rw.read_lock().lock_with_lease(LEASE).expect("read"));
        let names: Vec<String> = (0..threads).map(|t| format!("bench:plain:{t}")).collect();
        let plain = |t: usize| drop(c.lock(&names[t]).lock_with_lease(LEASE).expect("lock"));
        let (mut r, mut p) = (Vec::new(), Vec::new());
        for _ in 0..phases {
            r.push(throughput(threads, phase, &read));
            p.push(throughput(threads, phase, &plain));
        }
        let (r, p) = (median(&r), median(&p));
        line.push_str(&format!(
            " {threads} readers {r:.0}/s vs {p:.0}/s ({:.2});",
            r / p
        ));
    }
    println!("{line}");
}

fn main() {
    support::pin_self();
    let mode = support::mode();
    if mode == Mode::List {
        return;
    }
    let server = support::start_server();
    pairs(mode, &server);

    let holder = client(&server);
    let waiter = client(&server);
    holder
        .semaphore("bench:handoff:sem")
        .try_set_permits(1)
        .expect("set");
    holder
        .permit_expirable_semaphore("bench:handoff:pes")
        .try_set_permits(1)
        .expect("set");
    let kinds: [(&str, &str, Take); 4] = [
        (
            "lock",
            "redisson_lock__channel:{bench:handoff:lock}",
            |c, w| {
                c.lock("bench:handoff:lock")
                    .try_lock_with_lease(w, LEASE)
                    .expect("lock")
                    .map(|g| Box::new(g) as Held)
            },
        ),
        (
            "fair lock",
            "redisson_lock__channel:{bench:handoff:fair}:",
            |c, w| {
                c.fair_lock("bench:handoff:fair")
                    .try_lock_with_lease(w, LEASE)
                    .expect("lock")
                    .map(|g| Box::new(g) as Held)
            },
        ),
        ("semaphore", "redisson_sc:{bench:handoff:sem}", |c, w| {
            c.semaphore("bench:handoff:sem")
                .try_acquire_for(1, w)
                .expect("acquire")
                .map(|g| Box::new(g) as Held)
        }),
        (
            "expirable semaphore",
            "redisson_sc:{bench:handoff:pes}",
            |c, w| {
                c.permit_expirable_semaphore("bench:handoff:pes")
                    .try_acquire_for(w, LEASE)
                    .expect("acquire")
                    .map(|g| Box::new(g) as Held)
            },
        ),
    ];
    let n = if mode == Mode::Bench { 300 } else { 3 };
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); kinds.len()];
    for _ in 0..n {
        for (k, (_, channel, take)) in kinds.iter().enumerate() {
            samples[k].push(handoff(&server, &holder, &waiter, channel, *take));
        }
    }
    let mut line =
        String::from("SUMMARY: hand-off (release -> the waiter on another client holds):");
    for (k, (what, _, _)) in kinds.iter().enumerate() {
        samples[k].sort();
        line.push_str(&format!(
            " {what} p50 {} p99 {};",
            support::ms(support::quantile(&samples[k], 0.5)),
            support::ms(support::quantile(&samples[k], 0.99)),
        ));
    }
    line.push_str(&format!(" ({n} hand-offs each)"));
    println!("{line}");

    readers(mode, &server);
}
