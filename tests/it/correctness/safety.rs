//! A randomized safety test: threads of three clients take two locks with
//! mixed lease kinds, re-entries, tiny leases and owned acquisitions (some
//! released on another thread), while a fault injector
//! delays, drops and cuts random single requests and replies (one rule at a
//! time, replaced every 10-40 ms). The oracle
//! flags any instant at which two holders both believed (by `ensure_held()`)
//! that they held the same lock.
//!
//! Runs `REDLEASE_SAFETY_SECS` seconds (default 12, at most 60); the seed is
//! printed and can be replayed with `REDLEASE_SAFETY_SEED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redlease::{Client, LeaseGuard, LockGuard, OwnedLockGuard};

use super::randomized::{client, lock_scripts, run_params, Injector, Rng};
use crate::faults_common::figure;
use crate::support::{Proxy, RedisServer};

const LOCKS: [&str; 2] = ["safety:a", "safety:{a}"];
const CLIENTS: usize = 3;
const THREADS_PER_CLIENT: usize = 2;

/// An interval in which one owner believed it held a lock: from the return
/// of the acquire call to the start of its last `ensure_held()` that said Ok
/// (both conservative, so a reported overlap is a real one).
#[derive(Clone, Debug)]
struct Span {
    owner: (usize, usize),
    from: Instant,
    to: Instant,
    /// How the lock was taken, and what happened in the span (for a report).
    how: [u8; 4],
    /// `valid_until()` at the last check that said Ok, after `from`.
    valid_ms: u128,
    /// What this owner did in this span and the one before, for a report.
    log: Arc<Vec<String>>,
}

/// A thread-owned or an owned acquisition.
enum Taken {
    Thread(LockGuard),
    Owned(OwnedLockGuard),
}

impl Taken {
    fn guard(&self) -> &dyn LeaseGuard {
        match self {
            Taken::Thread(g) => g,
            Taken::Owned(g) => g,
        }
    }

    /// Releases it; an owned one on another thread when `elsewhere`.
    fn unlock(self, elsewhere: bool) -> redlease::Result<()> {
        match self {
            Taken::Thread(g) => g.unlock(),
            Taken::Owned(g) if elsewhere => thread::spawn(move || g.unlock())
                .join()
                .expect("the releasing thread"),
            Taken::Owned(g) => g.unlock(),
        }
    }
}

#[test]
fn randomized_faults_never_let_two_holders_believe_at_once() {
    let (secs, seed) = run_params(
        "lock",
        "REDLEASE_SAFETY_SECS",
        "REDLEASE_SAFETY_SEED",
        12,
        60,
    );

    let srv = RedisServer::start();
    let proxy = Arc::new(Proxy::start(srv.addr()));
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|_| client(&proxy, Duration::from_millis(400)))
        .collect();

    let deadline = Instant::now() + Duration::from_secs(secs);
    let spans: Arc<Mutex<HashMap<&'static str, Vec<Span>>>> = Arc::default();
    let acquisitions = Arc::new(AtomicU64::new(0));
    let checks = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));

    let injector = Injector::start(&proxy, lock_scripts(), seed, None);

    let mut workers = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..THREADS_PER_CLIENT {
            let client = client.clone();
            let spans = Arc::clone(&spans);
            let (acquisitions, checks, errors) = (
                Arc::clone(&acquisitions),
                Arc::clone(&checks),
                Arc::clone(&errors),
            );
            let mut rng = Rng::new(seed ^ (((c as u64) << 32) | (t as u64 + 1)));
            workers.push(thread::spawn(move || {
                let t0 = Instant::now();
                let mut log: Vec<String> = Vec::new();
                while Instant::now() < deadline {
                    if log.len() > 60 {
                        log.drain(..log.len() - 30);
                    }
                    let mut note = |what: String| {
                        log.push(format!("{:>8} us {what}", t0.elapsed().as_micros()));
                    };
                    let name = LOCKS[rng.below(2) as usize];
                    let lock = client.lock(name);
                    let wait = rng.ms(0, 200);
                    let kind = rng.below(6);
                    let acquired = match kind {
                        0 => lock.try_lock_for(wait).map(|g| g.map(Taken::Thread)),
                        1 => lock.try_lock().map(|g| g.map(Taken::Thread)),
                        2 | 3 => lock
                            .try_lock_with_lease(wait, rng.ms(30, 200))
                            .map(|g| g.map(Taken::Thread)),
                        4 => lock.owned().try_lock_for(wait).map(|g| g.map(Taken::Owned)),
                        _ => lock
                            .owned()
                            .try_lock_with_lease(wait, rng.ms(30, 200))
                            .map(|g| g.map(Taken::Owned)),
                    };
                    let taken = match acquired {
                        Ok(Some(g)) => g,
                        Ok(None) => continue,
                        Err(e) => {
                            note(format!("{name} outer {kind} error {e}"));
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    let guard = taken.guard();
                    note(format!(
                        "{name} outer {kind} acquired, valid {:?}",
                        guard
                            .valid_until()
                            .saturating_duration_since(Instant::now())
                    ));
                    let from = Instant::now();
                    acquisitions.fetch_add(1, Ordering::Relaxed);
                    // Mostly re-enter, with either lease kind: releasing the
                    // re-entry changes the lease the outer guard relies on.
                    // (An owned acquisition is never re-entered: this thread's
                    // try is another owner's, and fails while it holds.)
                    let inner_kind = if kind >= 4 { 3 } else { rng.below(4) };
                    let inner = match inner_kind {
                        0 | 1 => lock.try_lock().ok().flatten(),
                        2 => lock
                            .try_lock_with_lease(Duration::ZERO, rng.ms(20, 200))
                            .ok()
                            .flatten(),
                        _ => None,
                    };
                    note(format!(
                        "inner {inner_kind}: {}, valid {:?}",
                        inner.is_some(),
                        guard
                            .valid_until()
                            .saturating_duration_since(Instant::now())
                    ));
                    let mut inner = inner;
                    let mut to = None;
                    let mut valid_ms = 0;
                    let mut inner_released = b'-';
                    for _ in 0..rng.below(15) + 1 {
                        let before = Instant::now();
                        let valid = guard.valid_until();
                        if guard.ensure_held().is_err() {
                            note("check lost".into());
                            break;
                        }
                        note(format!(
                            "check ok, valid {:?}",
                            valid.saturating_duration_since(before)
                        ));
                        checks.fetch_add(1, Ordering::Relaxed);
                        to = Some(before);
                        valid_ms = valid.saturating_duration_since(from).as_millis();
                        if rng.below(3) == 0 {
                            if let Some(g) = inner.take() {
                                let r = g.unlock();
                                note(format!(
                                    "inner unlock {r:?}, valid {:?}",
                                    guard
                                        .valid_until()
                                        .saturating_duration_since(Instant::now())
                                ));
                                inner_released = if r.is_ok() { b'r' } else { b'e' };
                            }
                        }
                        thread::sleep(rng.ms(0, 15)); // the critical section's work
                    }
                    if let Some(to) = to {
                        spans.lock().unwrap().entry(name).or_default().push(Span {
                            owner: (c, t),
                            from,
                            to,
                            how: [
                                b"fnLLoO"[kind as usize],
                                b"wwL-"[inner_kind as usize],
                                if inner.is_some() { b'i' } else { b'-' },
                                inner_released,
                            ],
                            valid_ms,
                            log: Arc::new(log.clone()),
                        });
                    }
                    drop(inner);
                    let r = taken.unlock(rng.below(2) == 0);
                    log.push(format!("{:>8} us unlock {r:?}", t0.elapsed().as_micros()));
                }
            }));
        }
    }
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let fired = injector.finish();

    let spans = spans.lock().unwrap();
    let mut violations: Vec<String> = Vec::new();
    for (name, list) in spans.iter() {
        let mut list = list.clone();
        list.sort_by_key(|s| s.from);
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.from >= a.to {
                    break;
                }
                if a.owner != b.owner && a.to > b.from && b.to > a.from {
                    let show = |s: &Span| {
                        format!(
                            "owner {:?} how {} held {} ms (valid to +{} ms) from +{} ms",
                            s.owner,
                            String::from_utf8_lossy(&s.how),
                            s.to.duration_since(s.from).as_millis(),
                            s.valid_ms,
                            s.from.duration_since(a.from).as_millis()
                        )
                    };
                    violations.push(format!(
                        "{name}: [{}] and [{}]\n--- first:\n{}\n--- second:\n{}",
                        show(a),
                        show(b),
                        a.log.join("\n"),
                        b.log.join("\n")
                    ));
                }
            }
        }
    }
    let total: usize = spans.values().map(Vec::len).sum();
    figure(&format!(
        "randomized safety ({secs} s, seed {seed}): {} acquisitions, {} ensure_held checks, \
         {fired} injected faults fired, {} call errors, {} violations",
        acquisitions.load(Ordering::Relaxed),
        checks.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        violations.len()
    ));
    assert!(total > 0, "no lock was ever held: the test tested nothing");
    assert!(fired > 0, "no fault was ever injected");
    assert!(
        violations.is_empty(),
        "two holders believed they held the lock at once (seed {seed}):\n{}",
        violations[..violations.len().min(3)].join("\n=====\n")
    );
}
