//! The core lock against a real redis-server: mutual exclusion across threads
//! and clients, re-entry counts, try_lock and its timed forms, pub/sub
//! hand-off, lease-bounded waits, force_unlock, explicit leases, bad input,
//! Redis error replies, binary-safe names, the Redisson key/channel layout and
//! the compile-time Send/Sync pins.

use std::collections::HashMap;
use std::fmt::Debug;
use std::mem;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{free_port, wait_until, RedisServer};
use redlease::{Client, Error, Lock, LockGuard, MAX_LEASE, MIN_RENEW_INTERVAL};

/// Bound on waiting for a thread to report that something happened.
const WAIT: Duration = Duration::from_secs(10);
/// A release must reach a waiter through pub/sub well within this; the
/// holder's lease (watchdog_timeout) is 30 s, so only a wake-up explains it.
const HANDOFF_BOUND: Duration = Duration::from_secs(5);
/// The watchdog timeout of most clients here: far longer than any bound.
const WATCHDOG: Duration = Duration::from_secs(30);

fn client(srv: &RedisServer) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(WATCHDOG)
        .build()
        .expect("client connects to the test server")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A thread that acquires a lock with `acquire`, reports when, keeps it until
/// told to release (or until the `Holder` is dropped), then reports the
/// outcome of `unlock()`.
struct Holder {
    acquired: mpsc::Receiver<redlease::Result<Option<Instant>>>,
    release: Option<mpsc::Sender<()>>,
    unlocked: mpsc::Receiver<redlease::Result<()>>,
}

impl Holder {
    fn spawn<F>(lock: Lock, acquire: F) -> Holder
    where
        F: FnOnce(&Lock) -> redlease::Result<Option<LockGuard>> + Send + 'static,
    {
        let (acquired_tx, acquired) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let (unlocked_tx, unlocked) = mpsc::channel();
        thread::spawn(move || {
            let guard = match acquire(&lock) {
                Ok(Some(g)) => g,
                Ok(None) => {
                    let _ = acquired_tx.send(Ok(None));
                    return;
                }
                Err(e) => {
                    let _ = acquired_tx.send(Err(e));
                    return;
                }
            };
            let _ = acquired_tx.send(Ok(Some(Instant::now())));
            // Released when told, or when the test is gone (disconnected).
            let _ = release_rx.recv_timeout(Duration::from_secs(120));
            let _ = unlocked_tx.send(guard.unlock());
        });
        Holder {
            acquired,
            release: Some(release),
            unlocked,
        }
    }

    /// Spawns a thread that takes `lock` with `lock()` and waits until it has.
    fn holding(lock: Lock) -> Holder {
        let h = Holder::spawn(lock, |l| l.lock().map(Some));
        h.wait_acquired("the holder thread to acquire", WAIT);
        h
    }

    /// Waits for the acquisition; panics on error, on `None`, or on timeout.
    fn wait_acquired(&self, what: &str, within: Duration) -> Instant {
        match self.acquired.recv_timeout(within) {
            Ok(Ok(Some(at))) => at,
            Ok(Ok(None)) => panic!("{what}: the thread gave up without the lock"),
            Ok(Err(e)) => panic!("{what}: the thread failed: {e}"),
            Err(e) => panic!("timed out after {within:?} waiting for {what} ({e})"),
        }
    }

    /// `true` if the thread has acquired by now (no waiting).
    fn has_acquired(&self) -> bool {
        match self.acquired.try_recv() {
            Ok(r) => panic!("the waiter finished early: {r:?}"),
            Err(mpsc::TryRecvError::Empty) => false,
            Err(mpsc::TryRecvError::Disconnected) => panic!("the waiter thread died"),
        }
    }

    /// Tells the thread to release and returns what `unlock()` said.
    fn release(mut self) -> redlease::Result<()> {
        drop(self.release.take());
        self.unlocked
            .recv_timeout(WAIT)
            .expect("the holder thread to report its unlock() result")
    }
}

/// Runs `try_lock` on `lock` from a fresh thread; `true` if it got the lock
/// (released at once).
fn other_thread_gets(lock: &Lock) -> bool {
    let lock = lock.clone();
    thread::spawn(move || {
        lock.try_lock()
            .expect("try_lock from another thread")
            .is_some()
    })
    .join()
    .expect("the try_lock thread panicked")
}

/// The lock hash as Redis holds it: field -> value, including the
/// generation field `<owner field>:gen` redlease writes next to each owner.
fn raw_hgetall(conn: &mut redis::Connection, name: &str) -> HashMap<Vec<u8>, Vec<u8>> {
    redis::cmd("HGETALL")
        .arg(name)
        .query(conn)
        .expect("HGETALL on the test server")
}

/// The owner fields of the lock hash (Redisson's part of the layout): field
/// -> hold count. Checks that each has its generation field and nothing else
/// is there.
fn hgetall(conn: &mut redis::Connection, name: &str) -> HashMap<Vec<u8>, Vec<u8>> {
    let mut all = raw_hgetall(conn, name);
    let owners: HashMap<Vec<u8>, Vec<u8>> = all
        .iter()
        .filter(|(f, _)| !f.ends_with(b":gen"))
        .map(|(f, v)| (f.clone(), v.clone()))
        .collect();
    for field in owners.keys() {
        let mut gen = field.clone();
        gen.extend_from_slice(b":gen");
        assert!(
            all.remove(&gen).is_some(),
            "owner field {:?} of {name:?} has no generation field",
            String::from_utf8_lossy(field)
        );
    }
    assert_eq!(all.len(), owners.len(), "unexpected fields in {name:?}");
    owners
}

fn assert_invalid<T: Debug>(result: redlease::Result<T>, call: &str, mentions: &[&str]) {
    let err = match result {
        Ok(v) => panic!("{call}: expected an invalid-argument error, got Ok({v:?})"),
        Err(e) => e,
    };
    assert!(
        err.is_invalid_argument(),
        "{call}: expected an invalid-argument error, got {err:?}"
    );
    let msg = err.to_string().to_lowercase();
    for word in mentions {
        assert!(
            msg.contains(&word.to_lowercase()),
            "{call}: the message {msg:?} does not mention {word:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Exclusion
// ---------------------------------------------------------------------------

/// `threads` threads each run `rounds` critical sections that read the counter
/// with GET and write it back +1 with SET, under `locks[i % locks.len()]`.
/// Also checks in-process that no two sections overlap.
fn run_counter(srv: &RedisServer, locks: &[Lock], threads: usize, rounds: usize) -> u64 {
    let inside = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let lock = locks[i % locks.len()].clone();
            let (inside, barrier) = (Arc::clone(&inside), Arc::clone(&barrier));
            let mut conn = srv.conn();
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..rounds {
                    let guard = lock.lock().expect("lock() in the counter loop");
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two threads inside the critical section"
                    );
                    let n: Option<u64> = redis::cmd("GET").arg("counter").query(&mut conn).unwrap();
                    let _: () = redis::cmd("SET")
                        .arg("counter")
                        .arg(n.unwrap_or(0) + 1)
                        .query(&mut conn)
                        .unwrap();
                    guard.ensure_held().expect("the lock is still held");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().expect("unlock() in the counter loop");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a counter thread panicked");
    }
    let n: u64 = redis::cmd("GET")
        .arg("counter")
        .query(&mut srv.conn())
        .unwrap();
    n
}

#[test]
fn exclusion_across_threads() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let lock = client.lock("counter-lock");
    let started = Instant::now();
    let n = run_counter(&srv, std::slice::from_ref(&lock), 8, 200);
    assert_eq!(
        n,
        8 * 200,
        "lost updates: the lock let two sections overlap"
    );
    eprintln!(
        "FIGURE: exclusion_across_threads: 8 threads x 200 sections in {:.0} ms",
        ms(started.elapsed())
    );
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn exclusion_across_clients() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    assert_ne!(a.id(), b.id());
    let locks = [a.lock("counter-lock"), b.lock("counter-lock")];
    let started = Instant::now();
    let n = run_counter(&srv, &locks, 8, 100);
    assert_eq!(
        n,
        8 * 100,
        "lost updates: the lock let two sections overlap"
    );
    eprintln!(
        "FIGURE: exclusion_across_clients: 2 clients x 4 threads x 100 sections in {:.0} ms",
        ms(started.elapsed())
    );
    assert!(!locks[0].is_locked().unwrap());
}

// ---------------------------------------------------------------------------
// Re-entry and try_lock
// ---------------------------------------------------------------------------

#[test]
fn reentry_counts_and_release_in_any_order() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let mut conn = srv.conn();
    let lock = client.lock("reentrant");

    let g1 = lock.lock().unwrap();
    let g2 = lock.lock().unwrap();
    let g3 = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 3);
    for g in [&g1, &g2, &g3] {
        assert_eq!(g.hold_count(), 3);
    }
    let hash = hgetall(&mut conn, "reentrant");
    assert_eq!(hash.len(), 1, "one owner field: {hash:?}");
    assert_eq!(hash.values().next().unwrap(), b"3");
    assert!(lock.is_held_by_current_thread().unwrap());
    assert!(!other_thread_gets(&lock));

    // A waiter on another thread of the same client.
    let waiter = Holder::spawn(lock.clone(), |l| l.lock().map(Some));
    wait_until("the waiter to subscribe", WAIT, || {
        client.stats().subscribed_channels == 2
    });

    g2.unlock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert_eq!(g1.hold_count(), 2);
    assert!(!other_thread_gets(&lock));

    drop(g1);
    assert_eq!(lock.hold_count().unwrap(), 1);
    assert_eq!(g3.hold_count(), 1);
    assert!(lock.is_locked().unwrap());
    assert!(!other_thread_gets(&lock));
    assert!(
        !waiter.has_acquired(),
        "the waiter got a lock still held once"
    );

    let released = Instant::now();
    g3.unlock().unwrap();
    let got = waiter.wait_acquired(
        "the waiter to acquire after the last release",
        HANDOFF_BOUND,
    );
    assert!(got >= released);
    assert_eq!(
        lock.hold_count().unwrap(),
        0,
        "this thread no longer holds it"
    );
    assert!(!lock.is_held_by_current_thread().unwrap());
    assert!(lock.is_locked().unwrap(), "the waiter holds it");
    waiter.release().unwrap();
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn try_lock_free_busy_and_reentrant() {
    let srv = RedisServer::start();
    let (client, other_client) = (client(&srv), self::client(&srv));
    let lock = client.lock("try");

    // Free: acquired.
    let g = lock.try_lock().unwrap().expect("a free lock is acquired");
    assert_eq!(g.hold_count(), 1);
    // Same thread: re-entry.
    let again = lock
        .try_lock()
        .unwrap()
        .expect("re-entry by the same thread");
    assert_eq!(again.hold_count(), 2);
    assert_eq!(lock.hold_count().unwrap(), 2);
    // Another client (any thread): busy.
    assert!(other_client.lock("try").try_lock().unwrap().is_none());
    drop(again);
    drop(g);
    assert!(!lock.is_locked().unwrap());

    // Held by another thread: None, and nothing changed on the server.
    let holder = Holder::holding(lock.clone());
    assert!(lock.try_lock().unwrap().is_none());
    assert!(lock.try_lock_for(Duration::ZERO).unwrap().is_none());
    assert!(lock
        .try_lock_until(Instant::now() - Duration::from_millis(1))
        .unwrap()
        .is_none());
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert_eq!(hgetall(&mut srv.conn(), "try").len(), 1);
    holder.release().unwrap();

    // Free again: even a deadline in the past acquires a free lock.
    let g = lock
        .try_lock_until(Instant::now() - Duration::from_millis(1))
        .unwrap()
        .expect("a free lock is acquired whatever the deadline");
    drop(g);
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn try_lock_for_and_until_give_up_at_their_deadline() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let lock = client.lock("timed");
    let holder = Holder::holding(lock.clone());
    let wait = Duration::from_millis(600);
    let slack = Duration::from_millis(5);

    let t0 = Instant::now();
    assert!(lock.try_lock_for(wait).unwrap().is_none());
    let took = t0.elapsed();
    assert!(
        took + slack >= wait,
        "try_lock_for returned early: {took:?}"
    );
    assert!(
        took < wait + HANDOFF_BOUND,
        "try_lock_for overslept: {took:?}"
    );
    eprintln!(
        "FIGURE: try_lock_for({wait:?}) on a busy lock returned after {:.0} ms",
        ms(took)
    );

    let deadline = Instant::now() + wait;
    assert!(lock.try_lock_until(deadline).unwrap().is_none());
    let now = Instant::now();
    assert!(now + slack >= deadline, "try_lock_until returned early");
    assert!(now < deadline + HANDOFF_BOUND, "try_lock_until overslept");
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert_eq!(
        client.stats().subscribed_channels,
        0,
        "the waits unsubscribed"
    );

    // Duration::MAX is "no deadline": acquires once the holder lets go.
    let forever = Holder::spawn(lock.clone(), |l| l.try_lock_for(Duration::MAX));
    wait_until("the try_lock_for(MAX) waiter to subscribe", WAIT, || {
        client.stats().subscribed_channels == 2
    });
    assert!(!forever.has_acquired());
    holder.release().unwrap();
    forever.wait_acquired("try_lock_for(Duration::MAX) to acquire", HANDOFF_BOUND);
    forever.release().unwrap();

    // A far deadline (no overflow trouble) on a free lock.
    let g = lock
        .try_lock_until(Instant::now() + Duration::from_secs(365 * 24 * 3600))
        .unwrap()
        .expect("free lock");
    drop(g);
}

// ---------------------------------------------------------------------------
// Waiting: pub/sub hand-off, lease-bounded wait, force_unlock
// ---------------------------------------------------------------------------

#[test]
fn waiter_is_woken_by_pubsub_long_before_the_lease() {
    let srv = RedisServer::start();
    let (holder_client, waiter_client) = (client(&srv), client(&srv));
    let mut delays = Vec::new();
    for round in 0..5 {
        let holder = Holder::holding(holder_client.lock("handoff"));
        let waiter = Holder::spawn(waiter_client.lock("handoff"), |l| l.lock().map(Some));
        wait_until("the waiter to subscribe", WAIT, || {
            waiter_client.stats().subscribed_channels == 2
        });
        let remaining = waiter_client
            .lock("handoff")
            .remaining_lease()
            .unwrap()
            .expect("held");
        assert!(remaining > WATCHDOG - Duration::from_secs(10));
        let released = Instant::now();
        holder.release().unwrap();
        let got = waiter.wait_acquired(
            "the waiter to be woken by the release message",
            HANDOFF_BOUND,
        );
        let delay = got - released;
        assert!(delay < HANDOFF_BOUND, "round {round}: {delay:?}");
        delays.push(delay);
        waiter.release().unwrap();
        assert_eq!(waiter_client.stats().subscribed_channels, 0);
    }
    delays.sort();
    eprintln!(
        "FIGURE: pub/sub hand-off (release -> waiter acquired, other client), 5 rounds: \
         min {:.2} ms, median {:.2} ms, max {:.2} ms",
        ms(delays[0]),
        ms(delays[2]),
        ms(delays[4])
    );
}

#[test]
fn crashed_holder_is_waited_out_by_its_lease() {
    let srv = RedisServer::start();
    let (holder_client, waiter_client) = (client(&srv), client(&srv));
    let lease = Duration::from_secs(1);
    let (tx, rx) = mpsc::channel();
    let lock = holder_client.lock("abandoned");
    let started = Instant::now();
    thread::spawn(move || {
        let guard = lock.lock_with_lease(lease);
        let _ = tx.send(guard.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        // No release message will ever come: as if the process died.
        mem::forget(guard);
    });
    rx.recv_timeout(WAIT)
        .expect("the holder thread to report")
        .expect("the holder acquires");
    let waiter = waiter_client.lock("abandoned");
    let early = waiter.try_lock().unwrap();
    if started.elapsed() < lease / 2 {
        assert!(early.is_none(), "taken while the lease still ran");
    }
    drop(early);
    let g = waiter.lock().unwrap();
    let took = started.elapsed();
    assert!(
        took + Duration::from_millis(50) >= lease,
        "acquired before the lease ran out: {took:?}"
    );
    assert!(
        took < lease + Duration::from_secs(2),
        "the wait was not bounded by the lease: {took:?}"
    );
    eprintln!(
        "FIGURE: lease-bounded wait: 1 s lease, no release message, acquired {:.0} ms after the \
         holder's acquire call",
        ms(took)
    );
    assert_eq!(g.hold_count(), 1);
}

#[test]
fn force_unlock_frees_wakes_and_the_holder_learns() {
    let srv = RedisServer::start();
    let (a, b, c) = (client(&srv), client(&srv), client(&srv));
    let admin = c.lock("forced");
    assert!(
        !admin.force_unlock().unwrap(),
        "a free lock: nothing to delete"
    );

    let holder = Holder::holding(a.lock("forced"));
    let waiter = Holder::spawn(b.lock("forced"), |l| l.lock().map(Some));
    wait_until("the waiter to subscribe", WAIT, || {
        b.stats().subscribed_channels == 2
    });
    let forced = Instant::now();
    assert!(admin.force_unlock().unwrap(), "a held lock is deleted");
    let got = waiter.wait_acquired("force_unlock to wake the waiter", HANDOFF_BOUND);
    eprintln!(
        "FIGURE: force_unlock -> waiter acquired in {:.2} ms",
        ms(got - forced)
    );

    let err = holder
        .release()
        .expect_err("the former holder's unlock must fail");
    assert!(err.is_lock_lost(), "expected a lost lock, got {err:?}");
    assert!(err.to_string().contains("forced"), "{err}");

    // The new holder was not disturbed.
    let hash = hgetall(&mut srv.conn(), "forced");
    assert_eq!(hash.len(), 1);
    let (field, count) = hash.into_iter().next().unwrap();
    assert!(field.starts_with(format!("{}:", b.id()).as_bytes()));
    assert_eq!(count, b"1");
    waiter.release().unwrap();
    assert!(!admin.is_locked().unwrap());
}

#[test]
fn holder_without_a_lease_is_rechecked() {
    // A lock hash without a TTL (written by hand or by a foreign tool): the
    // waiter cannot bound its wait by a lease, so it re-checks (about every
    // second) and takes the lock once the hash is gone, even with no release
    // message.
    let srv = RedisServer::start();
    let client = client(&srv);
    assert_eq!(srv.cmd(&["HSET", "no-ttl", "someone:1", "1"]), "1");
    let lock = client.lock("no-ttl");
    assert_eq!(lock.remaining_lease().unwrap(), Some(Duration::MAX));
    assert!(lock.try_lock().unwrap().is_none());
    let waiter = Holder::spawn(lock.clone(), |l| l.lock().map(Some));
    wait_until("the waiter to subscribe", WAIT, || {
        client.stats().subscribed_channels == 2
    });
    let deleted = Instant::now();
    assert_eq!(srv.cmd(&["DEL", "no-ttl"]), "1"); // no PUBLISH
    let got = waiter.wait_acquired("the waiter to re-check a lease-less holder", HANDOFF_BOUND);
    eprintln!(
        "FIGURE: lease-less holder deleted without a message -> waiter acquired after {:.0} ms",
        ms(got - deleted)
    );
    waiter.release().unwrap();
    assert!(!lock.is_locked().unwrap());
}

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

#[test]
fn explicit_lease_expires_and_is_never_renewed() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let lock = client.lock("leased");
    let lease = Duration::from_millis(500);
    let t0 = Instant::now();
    let g = lock.lock_with_lease(lease).unwrap();
    let remaining = lock.remaining_lease().unwrap();
    if t0.elapsed() < lease - Duration::from_millis(100) {
        // Checked well inside the lease (skipped only on a stalled machine).
        let remaining = remaining.expect("held");
        assert!(remaining <= lease && !remaining.is_zero(), "{remaining:?}");
    }
    assert_eq!(client.stats().watchdog_entries, 0, "not watched");

    wait_until(
        "the 500 ms lease to run out",
        Duration::from_secs(5),
        || lock.remaining_lease().unwrap().is_none(),
    );
    let gone = t0.elapsed();
    assert!(
        gone >= lease - Duration::from_millis(50),
        "expired early: {gone:?}"
    );
    assert!(!lock.is_locked().unwrap());
    let stats = client.stats();
    assert_eq!(stats.renewals, 0, "{stats:?}");
    assert_eq!(stats.renewal_round_trips, 0, "{stats:?}");
    assert!(g.is_lost());
    assert!(g.ensure_held().unwrap_err().is_lock_lost());
    assert!(g.unlock().unwrap_err().is_lock_lost());

    // Re-entry with a lease re-applies it.
    let long = Duration::from_secs(20);
    let g1 = lock.lock_with_lease(long).unwrap();
    let remaining = lock.remaining_lease().unwrap().expect("held");
    assert!(remaining <= long && remaining > long / 2, "{remaining:?}");
    assert!(lock.is_locked().unwrap());
    let g2 = lock.lock_with_lease(lease).unwrap();
    assert_eq!(g2.hold_count(), 2);
    let remaining = lock.remaining_lease().unwrap();
    assert!(remaining.is_none_or(|r| r <= lease), "{remaining:?}");
    drop(g2);
    drop(g1);
}

/// A nested watched acquisition (lock() inside lock_with_lease()) is renewed
/// while it lasts; once it is released, the outer explicit lease must be
/// bounded again, not renewed for as long as the outer guard lives.
#[test]
fn explicit_lease_is_bounded_again_after_a_nested_watched_hold() {
    let srv = RedisServer::start();
    let client = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(600))
        .build()
        .unwrap();
    let lock = client.lock("nested");
    let outer = lock.lock_with_lease(Duration::from_secs(1)).unwrap();
    let inner = lock.lock().unwrap();
    assert_eq!(inner.hold_count(), 2);
    inner.unlock().unwrap();
    let released = Instant::now();
    wait_until(
        "the outer 1 s lease to run out once the nested watched hold is released",
        Duration::from_secs(5),
        || !lock.is_locked().unwrap(),
    );
    eprintln!(
        "FIGURE: outer explicit lease ran out {:.0} ms after the nested watched hold was released",
        ms(released.elapsed())
    );
    assert!(outer.unlock().unwrap_err().is_lock_lost());
}

#[test]
fn unlock_after_the_lease_ran_out_reports_lost_and_spares_the_new_holder() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    let lock = a.lock("overrun");

    // Nobody took it meanwhile.
    let g = lock.lock_with_lease(Duration::from_millis(300)).unwrap();
    wait_until(
        "the 300 ms lease to run out",
        Duration::from_secs(5),
        || !lock.is_locked().unwrap(),
    );
    let err = g.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(!err.is_connection_error());

    // Another client took it meanwhile: its lock is untouched.
    let g = lock.lock_with_lease(Duration::from_millis(300)).unwrap();
    let theirs = b.lock("overrun");
    let taken = theirs.lock().unwrap(); // waits the lease out
    let err = g.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err:?}");
    assert!(theirs.is_locked().unwrap());
    assert_eq!(theirs.hold_count().unwrap(), 1);
    assert_eq!(taken.hold_count(), 1);
    let hash = hgetall(&mut srv.conn(), "overrun");
    assert_eq!(hash.len(), 1);
    let (field, count) = hash.into_iter().next().unwrap();
    assert!(field.starts_with(format!("{}:", b.id()).as_bytes()));
    assert_eq!(count, b"1");
    taken.unlock().unwrap();
    assert!(!theirs.is_locked().unwrap());
}

/// A guard whose lease ran out while another client held the lock must stay
/// lost when its thread takes the lock again: the new acquisition is a fresh
/// one (hold count 1), not a re-entry that revives the old guard.
#[test]
fn reacquiring_after_an_expired_lease_does_not_revive_the_old_guard() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    let lock = a.lock("revive");
    let g1 = lock.lock_with_lease(Duration::from_millis(300)).unwrap();
    wait_until(
        "the 300 ms lease to run out",
        Duration::from_secs(5),
        || !lock.is_locked().unwrap(),
    );
    // Meanwhile another client holds it: g1's protection is broken for good.
    drop(b.lock("revive").lock().unwrap());
    assert!(g1.is_lost());

    let g2 = lock.lock_with_lease(Duration::from_secs(20)).unwrap();
    assert!(
        g1.is_lost(),
        "the old guard was revived by a new acquisition after another client held the lock"
    );
    assert_eq!(g2.hold_count(), 1, "a fresh acquisition, not a re-entry");
    assert_eq!(lock.hold_count().unwrap(), 1);
    g2.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "no phantom hold left behind");
    assert!(g1.unlock().unwrap_err().is_lock_lost());
}

/// The same through force_unlock on a watched lock: the thread that held it
/// and takes it again must not see its old guard as still valid.
#[test]
fn reacquiring_after_force_unlock_does_not_revive_the_old_guard() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    let lock = a.lock("revive-forced");
    let g1 = lock.lock().unwrap();
    assert!(b.lock("revive-forced").force_unlock().unwrap());
    drop(b.lock("revive-forced").lock().unwrap());

    let g2 = lock.lock().unwrap();
    assert_eq!(g2.hold_count(), 1, "a fresh acquisition, not a re-entry");
    assert_eq!(lock.hold_count().unwrap(), 1);
    assert!(
        g1.ensure_held().is_err(),
        "the force-unlocked guard passes ensure_held() after its thread re-acquired"
    );
    g2.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "no phantom hold left behind");
    assert!(g1.unlock().unwrap_err().is_lock_lost());
}

// ---------------------------------------------------------------------------
// Bad input and errors
// ---------------------------------------------------------------------------

#[test]
fn empty_name_is_rejected_everywhere() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let lock = client.lock("");
    let name = ["lock name must not be empty"];
    assert_invalid(lock.lock(), "lock", &name);
    assert_invalid(lock.try_lock(), "try_lock", &name);
    assert_invalid(
        lock.try_lock_for(Duration::from_secs(1)),
        "try_lock_for",
        &name,
    );
    assert_invalid(
        lock.try_lock_until(Instant::now() + Duration::from_secs(1)),
        "try_lock_until",
        &name,
    );
    assert_invalid(
        lock.lock_with_lease(Duration::from_secs(1)),
        "lock_with_lease",
        &name,
    );
    assert_invalid(
        lock.try_lock_with_lease(Duration::ZERO, Duration::from_secs(1)),
        "try_lock_with_lease",
        &name,
    );
    assert_invalid(lock.is_locked(), "is_locked", &name);
    assert_invalid(lock.hold_count(), "hold_count", &name);
    assert_invalid(
        lock.is_held_by_current_thread(),
        "is_held_by_current_thread",
        &name,
    );
    assert_invalid(lock.remaining_lease(), "remaining_lease", &name);
    assert_invalid(lock.force_unlock(), "force_unlock", &name);
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut srv.conn()).unwrap();
    assert!(keys.is_empty(), "nothing may be written: {keys:?}");
}

#[test]
fn bad_leases_and_renew_intervals_are_rejected() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let lock = client.lock("args");
    let cases = [
        (Duration::ZERO, "at least 1ms"),
        (Duration::from_micros(999), "at least 1ms"),
        (MAX_LEASE + Duration::from_millis(1), "at most MAX_LEASE"),
        (Duration::MAX, "at most MAX_LEASE"),
    ];
    for (lease, hint) in cases {
        assert_invalid(
            lock.lock_with_lease(lease),
            &format!("lock_with_lease({lease:?})"),
            &["lease", hint, &format!("got {lease:?}")],
        );
        assert_invalid(
            lock.try_lock_with_lease(Duration::ZERO, lease),
            &format!("try_lock_with_lease({lease:?})"),
            &["lease", hint, &format!("got {lease:?}")],
        );
    }
    // The bounds themselves are accepted.
    drop(lock.lock_with_lease(Duration::from_millis(1)).unwrap());
    wait_until("the 1 ms lease to run out", WAIT, || {
        !lock.is_locked().unwrap()
    });
    drop(lock.lock_with_lease(MAX_LEASE).unwrap());

    let intervals = [
        (Duration::ZERO, "at least"),
        (MIN_RENEW_INTERVAL - Duration::from_millis(1), "at least"),
        (WATCHDOG, "below the lease"),
        (WATCHDOG + Duration::from_secs(1), "below the lease"),
    ];
    for (interval, hint) in intervals {
        let l = client.lock("args").with_renew_interval(interval);
        let call = format!("with_renew_interval({interval:?})");
        let got = format!("got {interval:?}");
        let mentions = ["renew interval", hint, got.as_str()];
        assert_invalid(l.lock(), &format!("{call}.lock"), &mentions);
        assert_invalid(l.try_lock(), &format!("{call}.try_lock"), &mentions);
        assert_invalid(
            l.try_lock_for(Duration::from_millis(10)),
            &format!("{call}.try_lock_for"),
            &mentions,
        );
    }
    // The minimum is accepted.
    let l = client.lock("args").with_renew_interval(MIN_RENEW_INTERVAL);
    drop(l.lock().unwrap());
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn bad_client_settings_are_rejected() {
    let srv = RedisServer::start();
    let url = srv.url();
    let build = |f: fn(redlease::ClientBuilder) -> redlease::ClientBuilder| {
        f(Client::builder(url.as_str())).build()
    };
    assert_invalid(
        build(|b| b.pool_size(0)),
        "pool_size(0)",
        &["pool_size must be at least 1, got 0"],
    );
    assert_invalid(
        build(|b| b.connection_timeout(Duration::ZERO)),
        "connection_timeout(0)",
        &["connection_timeout must be positive"],
    );
    assert_invalid(
        build(|b| b.response_timeout(Duration::ZERO)),
        "response_timeout(0)",
        &["response_timeout must be positive"],
    );
    assert_invalid(
        build(|b| b.watchdog_timeout(Duration::ZERO)),
        "watchdog_timeout(0)",
        &["watchdog_timeout"],
    );
    assert_invalid(
        build(|b| b.watchdog_timeout(MIN_RENEW_INTERVAL * 2)),
        "watchdog_timeout(2 x MIN_RENEW_INTERVAL)",
        &["watchdog_timeout must be more than", "got"],
    );
    assert_invalid(
        build(|b| b.watchdog_timeout(MAX_LEASE + Duration::from_secs(1))),
        "watchdog_timeout(> MAX_LEASE)",
        &["watchdog_timeout must be at most MAX_LEASE"],
    );
    // The smallest watchdog timeout accepted works.
    let c = build(|b| b.watchdog_timeout(MIN_RENEW_INTERVAL * 2 + Duration::from_millis(1)))
        .expect("just above the minimum");
    drop(c.lock("x").lock().unwrap());

    for bad in [
        "not a url",
        "redis://",
        "redis://127.0.0.1:notaport/",
        "http://127.0.0.1/",
        "",
    ] {
        let err = Client::open(bad).expect_err(bad);
        assert!(err.is_invalid_argument(), "{bad:?}: {err:?}");
        assert!(!err.is_connection_error(), "{bad:?}: {err:?}");
        eprintln!("{bad:?} -> {err}");
    }
    // A TLS url with a fragment other than #insecure: refused up front
    // (without the tls feature, every rediss:// url is, naming the feature).
    let err = Client::open("rediss://127.0.0.1:1/#bogus").expect_err("rediss fragment");
    assert!(err.is_invalid_argument(), "{err:?}");
    let why = if cfg!(feature = "tls") {
        "insecure"
    } else {
        "tls"
    };
    assert!(err.to_string().contains(why), "{err}");
}

/// `force_unlock` deletes locks only: a key of another type under the
/// lock's name (a list here) is left alone, with an error that names it;
/// the fair lock's likewise.
#[test]
fn force_unlock_leaves_a_key_that_is_not_a_lock() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url()).expect("client");
    srv.cmd(&["RPUSH", "jobs", "a", "b"]);
    let err = c
        .lock("jobs")
        .force_unlock()
        .expect_err("a list is no lock");
    let text = crate::error_chain(&err);
    assert!(text.contains("jobs is not a lock"), "{text}");
    assert_eq!(srv.cmd(&["LLEN", "jobs"]), "2", "the list is still there");
    let err = c
        .fair_lock("jobs")
        .force_unlock()
        .expect_err("a list is no lock");
    let text = crate::error_chain(&err);
    assert!(text.contains("jobs is not a lock"), "{text}");
    assert_eq!(srv.cmd(&["LLEN", "jobs"]), "2", "the list is still there");
    // A lock is deleted as before.
    let g = c.lock("real").lock().expect("lock");
    assert!(c.lock("real").force_unlock().expect("force"));
    assert!(g.is_lost() || g.unlock().is_err());
}

/// A database the server does not have is refused at once, with Redis's
/// reason and what to change, not after the connection timeout as if
/// Redis were unreachable.
#[test]
fn a_database_the_server_does_not_have_is_refused_with_its_reason() {
    let srv = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/16", srv.port());
    let err = Client::builder(url.as_str())
        .connection_timeout(Duration::from_secs(5))
        .build()
        .map(|_| ())
        .expect_err("the server has 16 databases, 0 to 15");
    let text = crate::error_chain(&err);
    assert!(text.contains("DB index is out of range"), "{text}");
    assert!(text.contains("databases"), "{text}");
    assert!(
        !err.is_timeout() && !err.is_connection_error(),
        "a refusal, not an outage: {text}"
    );
}

/// A negative database number is refused when the client is built, lazily
/// or not, with what to write instead (before, `build_lazy` took it and the
/// first call failed at the handshake).
#[test]
fn a_negative_database_is_refused_at_build_time() {
    let err = Client::builder("redis://127.0.0.1:1/-1")
        .build_lazy()
        .map(|_| ())
        .expect_err("database -1");
    assert!(matches!(err, Error::InvalidUrl(_)), "{err:?}");
    assert!(err.to_string().contains("0 or more"), "{err}");
    let err = Client::sentinel_builder(["redis://127.0.0.1:1/"], "mymaster")
        .master_db(-1)
        .build_lazy()
        .map(|_| ())
        .expect_err("master_db(-1)");
    assert!(err.is_invalid_argument(), "{err:?}");
    assert!(err.to_string().contains("0 or more"), "{err}");
}

/// The client's name is at most 256 bytes, as documented: a longer one is
/// refused at build time (it would be written into the process key on
/// every announce and read by every `holders()`).
#[test]
fn a_client_name_over_256_bytes_is_refused() {
    let ok = Client::builder("redis://127.0.0.1:1/")
        .name("n".repeat(256))
        .build_lazy();
    assert!(ok.is_ok(), "256 bytes: {:?}", ok.err());
    let err = Client::builder("redis://127.0.0.1:1/")
        .name("n".repeat(257))
        .build_lazy()
        .map(|_| ())
        .expect_err("a 257-byte name");
    assert!(err.is_invalid_argument(), "{err:?}");
    assert!(err.to_string().contains("at most 256 bytes"), "{err}");
}

/// Huge timeouts are either refused with a message or work; they never
/// panic (e.g. on `Instant + Duration` overflow in the pool or subscriber).
#[test]
fn huge_timeouts_never_panic() {
    let srv = RedisServer::start();
    type Setter = fn(redlease::ClientBuilder) -> redlease::ClientBuilder;
    let cases: [(&str, Setter); 2] = [
        ("connection_timeout", |b| {
            b.connection_timeout(Duration::MAX)
        }),
        ("response_timeout", |b| b.response_timeout(Duration::MAX)),
    ];
    for (setting, set) in cases {
        let built = thread::spawn({
            let url = srv.url();
            move || set(Client::builder(url.as_str())).build().map(|_| ())
        })
        .join();
        let built =
            built.unwrap_or_else(|_| panic!("build() panicked with {setting}(Duration::MAX)"));
        if let Err(e) = built {
            assert!(e.is_invalid_argument(), "{setting}: {e:?}");
            assert!(e.to_string().contains(setting), "{setting}: {e}");
            continue;
        }
        let client = set(Client::builder(srv.url())).build().unwrap();
        let lock = client.lock("huge");
        let g = lock.lock().unwrap();
        // A wait on a busy lock subscribes: the subscriber uses the timeouts.
        let waited = thread::spawn({
            let lock = lock.clone();
            move || {
                lock.try_lock_for(Duration::from_millis(200))
                    .map(|g| g.is_some())
            }
        })
        .join()
        .unwrap_or_else(|_| panic!("a wait panicked with {setting}(Duration::MAX)"));
        assert!(!waited.unwrap(), "{setting}: the lock is held");
        g.unlock().unwrap();
    }
}

#[test]
fn unreachable_redis_fails_within_the_connection_timeout() {
    let port = free_port(); // nothing listens there
    let timeout = Duration::from_millis(500);
    let t0 = Instant::now();
    let err = Client::builder(format!("redis://127.0.0.1:{port}/"))
        .connection_timeout(timeout)
        .build()
        .expect_err("nothing listens on the port");
    let took = t0.elapsed();
    assert!(took < timeout + Duration::from_secs(1), "took {took:?}");
    assert!(err.is_connection_error(), "{err:?}");
    assert!(err.is_timeout(), "{err:?}");
    assert!(!err.is_invalid_argument() && !err.is_lock_lost(), "{err:?}");
    assert!(
        err.to_string().contains(&format!(
            "timed out waiting for a connection to redis at 127.0.0.1:{port}"
        )),
        "{err}"
    );
    eprintln!(
        "FIGURE: build() against a closed port failed after {:.0} ms (connection_timeout 500 ms): {err}",
        ms(took)
    );
}

#[test]
fn pool_exhaustion_times_out_with_a_pool_error() {
    // With one pooled connection held by a command that Redis (frozen with
    // SIGSTOP) does not answer, a second command cannot get a connection.
    let srv = RedisServer::start();
    let client = Client::builder(srv.url())
        .pool_size(1)
        .connection_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = client.lock("pooled");
    assert!(!lock.is_locked().unwrap());
    let before = client.stats().round_trips;
    srv.pause();
    let (tx, rx) = mpsc::channel();
    let busy = lock.clone();
    thread::spawn(move || {
        let _ = tx.send(busy.is_locked());
    });
    wait_until(
        "the first command to take the only connection",
        WAIT,
        || client.stats().round_trips > before,
    );
    let t0 = Instant::now();
    let err = lock.is_locked().expect_err("no connection is free");
    let took = t0.elapsed();
    srv.resume();
    assert!(err.is_timeout() && err.is_connection_error(), "{err:?}");
    assert!(matches!(err, Error::Pool(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("timed out waiting for a connection to redis at 127.0.0.1:"),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with(": all 1 pooled connections in use"),
        "{err}"
    );
    assert!(
        took < Duration::from_millis(300) + Duration::from_secs(2),
        "{took:?}"
    );
    let first = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the first command to finish once Redis runs again");
    assert!(!first.unwrap());
    drop(lock.lock().unwrap());
}

#[test]
fn redis_error_replies_are_errors() {
    let srv = RedisServer::start();
    let client = client(&srv);
    assert_eq!(srv.cmd(&["SET", "a-string", "x"]), "OK");
    let lock = client.lock("a-string");
    let check = |r: redlease::Result<_>, call: &str| {
        let err: Error = match r {
            Ok(()) => panic!("{call}: expected a WRONGTYPE error"),
            Err(e) => e,
        };
        assert!(matches!(err, Error::Redis(_)), "{call}: {err:?}");
        assert!(err.to_string().contains("WRONGTYPE"), "{call}: {err}");
        assert!(
            !err.is_invalid_argument() && !err.is_connection_error(),
            "{call}"
        );
    };
    check(lock.lock().map(drop), "lock");
    check(lock.try_lock().map(drop), "try_lock");
    check(
        lock.try_lock_for(Duration::from_secs(1)).map(drop),
        "try_lock_for",
    );
    check(
        lock.lock_with_lease(Duration::from_secs(1)).map(drop),
        "lock_with_lease",
    );
    check(lock.hold_count().map(drop), "hold_count");
    check(
        lock.is_held_by_current_thread().map(drop),
        "is_held_by_current_thread",
    );
    assert_eq!(srv.cmd(&["GET", "a-string"]), "x", "the key is untouched");
    assert_eq!(client.stats().subscribed_channels, 0);
    // The client still works.
    drop(client.lock("fine").lock().unwrap());
}

// ---------------------------------------------------------------------------
// Names and layout
// ---------------------------------------------------------------------------

#[test]
fn binary_safe_names() {
    let srv = RedisServer::start();
    let (a, b) = (client(&srv), client(&srv));
    let mut conn = srv.conn();
    let names = [
        "a{b}c",
        "{tag}x",
        "line\nbreak",
        "nul\0byte",
        "clé-ключ-鍵-🔒",
        " spaced ",
    ];
    for name in names {
        let lock = a.lock(name);
        assert_eq!(lock.name(), name);
        let g1 = lock.lock().unwrap();
        let g2 = lock.lock().unwrap();
        assert_eq!(lock.hold_count().unwrap(), 2, "{name:?}");
        // The hash key is the exact name, and it is the only hash (but for
        // the client's process key).
        let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        keys.retain(|k| !k.starts_with(b"redlease_client:"));
        let hashes: Vec<&Vec<u8>> = keys
            .iter()
            .filter(|k| {
                let t: String = redis::cmd("TYPE")
                    .arg(k.as_slice())
                    .query(&mut conn)
                    .unwrap();
                t == "hash"
            })
            .collect();
        assert_eq!(hashes, [&name.as_bytes().to_vec()], "{name:?}");
        let hash = hgetall(&mut conn, name);
        assert_eq!(hash.len(), 1, "{name:?}");
        assert_eq!(hash.values().next().unwrap(), b"2", "{name:?}");

        // Hand-off to another client through pub/sub.
        let waiter = Holder::spawn(b.lock(name), |l| l.lock().map(Some));
        wait_until("the waiter to subscribe", WAIT, || {
            b.stats().subscribed_channels == 2
        });
        g2.unlock().unwrap();
        assert!(!waiter.has_acquired());
        g1.unlock().unwrap();
        waiter.wait_acquired(&format!("hand-off of {name:?}"), HANDOFF_BOUND);
        assert_eq!(lock.hold_count().unwrap(), 0);
        waiter.release().unwrap();
        assert!(!lock.is_locked().unwrap(), "{name:?}");
    }
}

#[test]
fn redis_layout_matches_redisson() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let mut conn = srv.conn();
    for (name, channel) in [
        ("orders:42", "redisson_lock__channel:{orders:42}"),
        ("a{b}c", "redisson_lock__channel:a{b}c"),
    ] {
        let lock = client.lock(name);
        let g1 = lock.lock().unwrap();
        // Redisson's owner field, and redlease's generation field beside it
        // (Redisson reads and writes only its own owner field, so it is
        // invisible to Redisson clients).
        let raw = raw_hgetall(&mut conn, name);
        assert_eq!(raw.len(), 2, "{raw:?}");
        let hash = hgetall(&mut conn, name);
        assert_eq!(hash.len(), 1, "{hash:?}");
        let (field, value) = hash.into_iter().next().unwrap();
        let field = String::from_utf8(field).unwrap();
        let thread_part = field
            .strip_prefix(client.id())
            .and_then(|rest| rest.strip_prefix(':'))
            .unwrap_or_else(|| panic!("field {field:?} is not <client id>:<n>"));
        thread_part
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("field {field:?}: {thread_part:?} is not a number"));
        assert_eq!(value, b"1");
        let pttl: i64 = redis::cmd("PTTL").arg(name).query(&mut conn).unwrap();
        let wd = WATCHDOG.as_millis() as i64;
        assert!(pttl <= wd && pttl > wd - 10_000, "PTTL {pttl}");

        assert!(
            !other_thread_gets(&lock),
            "another thread of the same client"
        );

        let messages = srv.listen(channel);
        let g2 = lock.lock().unwrap();
        assert_eq!(
            hgetall(&mut conn, name).get(field.as_bytes()).unwrap(),
            b"2"
        );
        drop(g2); // partial release: nothing published
        let _: i64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg("marker")
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            messages.recv_timeout(WAIT).expect("the marker"),
            b"marker",
            "a partial release published something"
        );
        drop(g1); // full release
        assert_eq!(
            messages.recv_timeout(WAIT).expect("the release message"),
            b"0"
        );
        let exists: bool = redis::cmd("EXISTS").arg(name).query(&mut conn).unwrap();
        assert!(!exists);
        // force_unlock publishes on the same channel.
        let g = lock.lock().unwrap();
        assert!(client.lock(name).force_unlock().unwrap());
        assert_eq!(
            messages.recv_timeout(WAIT).expect("force_unlock's message"),
            b"0"
        );
        assert!(g.unlock().unwrap_err().is_lock_lost());

        // Another thread of the same client: <same client id>:<another number>.
        let other = Holder::holding(lock.clone());
        let hash = hgetall(&mut conn, name);
        assert_eq!(hash.len(), 1);
        let other_field = String::from_utf8(hash.into_keys().next().unwrap()).unwrap();
        assert!(other_field.starts_with(&format!("{}:", client.id())));
        assert_ne!(other_field, field, "each thread has its own owner field");
        other.release().unwrap();
    }
}

// ---------------------------------------------------------------------------
// Compile-time pins
// ---------------------------------------------------------------------------

#[test]
fn send_sync_pins() {
    fn client_like<T: Clone + Send + Sync + Debug + 'static>() {}
    fn lock_like<T: Clone + Send + Sync + Debug>() {}
    fn sync<T: Sync + Debug>() {}
    fn error_like<T: std::error::Error + Send + Sync + 'static>() {}
    client_like::<Client>();
    lock_like::<Lock>();
    sync::<LockGuard>();
    error_like::<Error>();
    // LockGuard is !Send: a compile_fail doctest in src/kinds/guard.rs pins it.
}

/// Re-entering with a shorter explicit lease shortens the lock's life on
/// Redis (PEXPIRE), and the guards' local check follows: `ensure_held()`
/// must not vouch for the longer, earlier lease.
#[test]
fn shorter_reentry_lease_bounds_ensure_held() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let lock = client.lock("short:reentry");
    let outer = lock.lock_with_lease(Duration::from_secs(60)).unwrap();
    let inner = lock.lock_with_lease(Duration::from_millis(300)).unwrap();
    wait_until("the re-entered lock to expire", WAIT, || {
        !lock.is_locked().unwrap()
    });
    assert!(
        outer.is_lost(),
        "the outer guard vouches for an expired lock"
    );
    assert!(inner.ensure_held().unwrap_err().is_lock_lost());
    // A partial release re-applies the remaining (explicit) lease too.
    let a = lock.lock_with_lease(Duration::from_secs(60)).unwrap();
    let b = lock.lock_with_lease(Duration::from_millis(300)).unwrap();
    drop(a);
    assert!(b.ensure_held().is_ok());
    wait_until("the partially released lock to expire", WAIT, || {
        !lock.is_locked().unwrap()
    });
    assert!(b.is_lost());
}

/// A release of a hold whose generation the client is sure of goes without
/// an unlock latch (release.lua: it releases only that generation, so a late
/// copy cannot touch a later hold): nothing is left behind but the release.
/// A hold whose owner field carries another generation than the client
/// recorded (one written by a request the client could not follow) is
/// still released, with a latch, and not reported lost.
#[test]
fn a_release_leaves_no_latch_and_releases_a_hold_of_another_generation() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let mut conn = srv.conn();
    let lock = client.lock("gen:other");
    lock.lock().unwrap().unlock().expect("first release");
    lock.lock_with_lease(Duration::from_secs(30))
        .unwrap()
        .unlock()
        .expect("second release");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let keys: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with("redlease_client:"))
        .collect();
    assert!(keys.is_empty(), "keys left after two releases: {keys:?}");

    let g = lock.lock().unwrap();
    let owners = hgetall(&mut conn, "gen:other");
    let field = String::from_utf8(owners.keys().next().expect("the owner field").clone()).unwrap();
    let _: () = redis::cmd("HSET")
        .arg("gen:other")
        .arg(format!("{field}:gen"))
        .arg("123456789")
        .query(&mut conn)
        .unwrap();
    g.unlock()
        .expect("a hold of another generation is released, not reported lost");
    let exists: i64 = redis::cmd("EXISTS")
        .arg("gen:other")
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, 0, "the lock hash is still there");
    assert!(lock.try_lock().unwrap().is_some(), "the lock is free again");
}
