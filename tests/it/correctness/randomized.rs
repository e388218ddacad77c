//! What the randomized safety tests share (`safety.rs`, `semaphores.rs`,
//! `family.rs`): a small deterministic generator, a script's SHA as the
//! client sends it, a run's length and seed from the environment, the
//! fault injector, the clients and the worker threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::Client;

use crate::faults_common::release_full_sha;
use crate::support::{Fault, Proxy};

/// xorshift64*: a small deterministic generator, one per thread.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// From `lo` to `hi` ms, both included.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// The SHA1 of a script as the client sends it (EVALSHA): the exact
/// concatenation of its files (see src/scripts.rs).
pub fn sha(source: &str) -> Vec<u8> {
    redis::Script::new(source).get_hash().as_bytes().to_vec()
}

/// How long a test runs, in seconds (`secs_var`, else `default`; from 1 to
/// `max`), and with which seed (`seed_var`, else the clock); printed, so
/// that a failed run can be replayed.
pub fn run_params(
    label: &str,
    secs_var: &str,
    seed_var: &str,
    default: u64,
    max: u64,
) -> (u64, u64) {
    let secs: u64 = std::env::var(secs_var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
        .clamp(1, max);
    let seed: u64 = std::env::var(seed_var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("randomized {label} safety test: {secs} s, seed {seed} ({seed_var} replays it)");
    (secs, seed)
}

/// The fault injector: one proxy rule at a time on one of its scripts
/// (SHAs), of a random kind, replaced every 10-40 ms until it is finished.
pub struct Injector {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<(usize, Option<Instant>)>,
}

impl Injector {
    /// Starts it. The faults: a reply or a request delayed 10-300 ms, a
    /// reply dropped, the connection cut after a request, a black hole,
    /// and, with `late_copy_max`, a request also delivered again 10 ms up
    /// to that much later (`Fault::LateCopy`).
    pub fn start(
        proxy: &Arc<Proxy>,
        scripts: Vec<Vec<u8>>,
        seed: u64,
        late_copy_max: Option<Duration>,
    ) -> Injector {
        let proxy = Arc::clone(proxy);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let mut rng = Rng::new(seed ^ 0xFA17);
        let kinds = if late_copy_max.is_some() { 6 } else { 5 };
        let thread = thread::spawn(move || {
            let mut fired = 0;
            // When the last late copy that was made has reached Redis.
            let mut late_until: Option<Instant> = None;
            let mut current = None;
            let mut retire = |rule, late: Option<Duration>, fired: &mut usize| {
                let hits = proxy.hits(rule);
                proxy.remove_rule(rule);
                *fired += hits;
                if let (Some(d), true) = (late, hits > 0) {
                    let at = Instant::now() + d;
                    late_until = Some(late_until.map_or(at, |u| u.max(at)));
                }
            };
            while !stopped.load(Ordering::Acquire) {
                if let Some((rule, late)) = current.take() {
                    retire(rule, late, &mut fired);
                }
                let script = &scripts[rng.below(scripts.len() as u64) as usize];
                let (fault, late) = match (rng.below(kinds), late_copy_max) {
                    (0, _) => (Fault::DelayReply(rng.ms(10, 300)), None),
                    (1, _) => (Fault::DelayRequest(rng.ms(10, 300)), None),
                    (2, _) => (Fault::DropReply, None),
                    (3, _) => (Fault::CutAfterRequest, None),
                    (5, Some(max)) => {
                        let d = rng.ms(10, max.as_millis() as u64);
                        (Fault::LateCopy(d), Some(d))
                    }
                    _ => (Fault::BlackHole, None),
                };
                current = Some((proxy.add_rule(script, fault, 1), late));
                thread::sleep(rng.ms(10, 40)); // pacing of the injected faults
            }
            if let Some((rule, late)) = current {
                retire(rule, late, &mut fired);
            }
            (fired, late_until)
        });
        Injector { stop, thread }
    }

    /// Stops it and removes its rule; waits until the late copies it made
    /// have reached Redis. Returns how many faults fired.
    pub fn finish(self) -> usize {
        self.stop.store(true, Ordering::Release);
        let (fired, late_until) = self.thread.join().expect("the injector panicked");
        if let Some(at) = late_until {
            // A copy is written on a fresh loopback connection as soon as
            // its delay has passed: a moment more and it has run.
            let at = at + Duration::from_millis(500);
            thread::sleep(at.saturating_duration_since(Instant::now()));
        }
        fired
    }
}

/// A client through the proxy with the short timeouts the randomized tests
/// use: a 120 ms response timeout, so that the injected faults time
/// requests out, and the watchdog lease given.
pub fn client(proxy: &Proxy, watchdog: Duration) -> Client {
    Client::builder(proxy.url())
        .response_timeout(Duration::from_millis(120))
        .connection_timeout(Duration::from_millis(500))
        .watchdog_timeout(watchdog)
        .build()
        .expect("client")
}

/// The SHAs of the reentrant lock's scripts that a holder's requests run:
/// the acquire, the release with a latch (partial, handing over,
/// unsettled), the usual full release without one, the renewal and the
/// undo of an acquisition whose reply was lost.
pub fn lock_scripts() -> Vec<Vec<u8>> {
    vec![
        sha(concat!(
            include_str!("../../../src/scripts/queue_lib.lua"),
            include_str!("../../../src/scripts/acquire.lua")
        )),
        sha(concat!(
            include_str!("../../../src/scripts/queue_lib.lua"),
            include_str!("../../../src/scripts/queue_wake.lua"),
            include_str!("../../../src/scripts/release_plain.lua"),
            include_str!("../../../src/scripts/release.lua")
        )),
        release_full_sha(),
        sha(include_str!("../../../src/scripts/renew.lua")),
        sha(include_str!("../../../src/scripts/cancel_acquire.lua")),
    ]
}

/// Runs `work` on `threads` threads of each client until they return, each
/// with its owner (client, thread) and a seed of its own made from `seed`;
/// what each returned, by owner.
pub fn run_workers<R: Send + 'static>(
    clients: &[Client],
    threads: usize,
    seed: u64,
    work: impl Fn(&Client, (usize, usize), u64) -> R + Send + Sync + 'static,
) -> HashMap<(usize, usize), R> {
    let work = Arc::new(work);
    let mut workers = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..threads {
            let client = client.clone();
            let work = Arc::clone(&work);
            let seed = seed ^ (((c as u64) << 32) | (t as u64 + 1));
            workers.push(((c, t), thread::spawn(move || work(&client, (c, t), seed))));
        }
    }
    workers
        .into_iter()
        .map(|(owner, w)| (owner, w.join().expect("a worker panicked")))
        .collect()
}
