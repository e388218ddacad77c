//! Fault injection, issue 4: the connection is cut right after a lock script
//! reached Redis, so it ran but its reply is lost ("maybe applied"). Releases
//! retried after such a cut never count twice nor report "not held"; acquires
//! either succeed with the right count or fail without leaving the lock held.
//!
//! Figures are printed as `FIGURE:` lines (run with `--nocapture` to see them).

use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::faults_common::{
    figure, is_acquire_of, lock_keys, ms, server_count, server_lock_keys, warm_subscriber, Monitor,
};
use crate::support::{wait_until, Fault, Proxy, RedisServer};
use redlease::{Client, Lock, LockGuard};

/// Cycles per test: each of the six ways to cut (1-3 holds, the cut at each
/// of them) at least 33 times. Each costs a few round trips through the proxy plus a
/// reconnect (about 2-4 ms on a 2-core machine).
const CYCLES: usize = 300;

/// A unique part of each request of the kind cut: the release's unlock latch
/// key, or the acquire's cancel marker key.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    Release,
    Acquire,
}

impl Cut {
    fn pattern(self) -> &'static [u8] {
        match self {
            // Both releases (with a latch and without) carry the channel.
            Cut::Release => b"redisson_lock__channel",
            Cut::Acquire => b"redlease_acquire_cancel",
        }
    }
}

#[derive(Default, Debug)]
struct Tally {
    cuts: usize,
    ok: usize,
    lost: usize,
    failed: usize,
    /// Of `failed`: full releases (sent without a latch), whose outcome a
    /// cut after the request leaves unknown.
    failed_full: usize,
    count_mismatch: usize,
    spurious_lost: usize,
}

struct Rig {
    srv: RedisServer,
    proxy: Proxy,
    client: Client,
    direct: redis::Connection,
}

fn rig() -> Rig {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let client = Client::builder(proxy.url())
        .response_timeout(Duration::from_secs(1))
        .connection_timeout(Duration::from_secs(1))
        .build()
        .expect("build client");
    let direct = srv.conn();
    Rig {
        srv,
        proxy,
        client,
        direct,
    }
}

impl Rig {
    /// Checks that Redis counts exactly the live guards and none is lost.
    fn check(&mut self, name: &str, guards: &[LockGuard], tally: &mut Tally) {
        if server_count(&mut self.direct, name) != guards.len() as u32 {
            tally.count_mismatch += 1;
        }
        if guards.iter().any(LockGuard::is_lost) {
            tally.spurious_lost += 1;
        }
        if guards
            .last()
            .is_some_and(|g| g.hold_count() != guards.len() as u32)
        {
            tally.count_mismatch += 1;
        }
    }

    /// One acquisition; with `cut`, the connection is cut right after the
    /// request reached Redis.
    fn acquire(&mut self, lock: &Lock, cut: bool, guards: &mut Vec<LockGuard>, tally: &mut Tally) {
        if cut {
            self.proxy.cut_after_request(Cut::Acquire.pattern());
        }
        match lock.lock() {
            Ok(g) => {
                tally.ok += usize::from(cut);
                guards.push(g);
            }
            Err(e) => {
                assert!(cut, "acquire without a fault failed: {e}");
                tally.failed += 1;
                println!("acquire cut and failed: {e}");
                // Told "failed": the possible effect is undone in the
                // background; the count must come back to the live guards.
                let want = guards.len() as u32;
                let direct = &mut self.direct;
                wait_until(
                    "a failed acquire to be undone",
                    Duration::from_secs(10),
                    || server_count(direct, lock.name()) == want,
                );
            }
        }
        if cut {
            assert!(!self.proxy.armed(), "the cut did not fire");
            tally.cuts += 1;
        }
    }

    /// Releases the innermost guard; with `cut`, as [`Rig::acquire`].
    fn release(&mut self, guards: &mut Vec<LockGuard>, cut: bool, tally: &mut Tally) {
        if cut {
            self.proxy.cut_after_request(Cut::Release.pattern());
        }
        let g = guards.pop().expect("a guard");
        let full = guards.is_empty();
        match g.unlock() {
            Ok(()) => tally.ok += usize::from(cut),
            Err(e) if e.is_lock_lost() => tally.lost += 1,
            Err(e) => {
                assert!(cut, "release without a fault failed: {e}");
                tally.failed += 1;
                tally.failed_full += usize::from(full);
                println!("release cut and failed: {e}");
            }
        }
        if cut {
            assert!(!self.proxy.armed(), "the cut did not fire");
            tally.cuts += 1;
        }
    }
}

/// [`CYCLES`] cycles of 1-3 re-entrant holds on one lock; in each, one request of
/// kind `cut` (a different hold each cycle: partial and full releases, first
/// holds and re-entries) has its connection cut right after it reached Redis.
fn cut_cycles(cut: Cut) {
    let mut rig = rig();
    let name = format!("cut:{cut:?}");
    let lock = rig.client.lock(name.as_str());
    let mut tally = Tally::default();
    let started = Instant::now();
    for cycle in 0..CYCLES {
        let depth = 1 + (cycle % 3);
        let target = (cycle / 3) % depth;
        let mut guards = Vec::new();
        for i in 0..depth {
            rig.acquire(
                &lock,
                cut == Cut::Acquire && i == target,
                &mut guards,
                &mut tally,
            );
            rig.check(&name, &guards, &mut tally);
        }
        for i in 0..depth {
            rig.release(&mut guards, cut == Cut::Release && i == target, &mut tally);
            rig.check(&name, &guards, &mut tally);
        }
    }
    let took = started.elapsed();
    println!("{cut:?}: {tally:?}");
    assert_eq!(tally.cuts, CYCLES);
    assert_eq!(tally.lost, 0, "a release reported \"not held\"");
    assert_eq!(tally.spurious_lost, 0, "a live guard reported lost");
    assert_eq!(tally.count_mismatch, 0, "server count != live guards");
    if cut == Cut::Release {
        // A partial release's retry on a new connection finds its latch. A
        // full release goes without one: its retry finds the hold gone and
        // cannot tell whether the cut copy released it or the hold was gone
        // before, so the cut is reported (neither Ok nor "not held"), with
        // nothing left held.
        assert_eq!(
            tally.failed, tally.failed_full,
            "a partial release cut once must succeed on its retry"
        );
    }
    assert_eq!(
        lock_keys(&mut rig.direct),
        Vec::<String>::new(),
        "lock hash left behind"
    );
    figure(&format!(
        "{cut:?} cut after the request reached redis, {} cuts in {CYCLES} cycles of 1-3 \
         re-entrant holds: {} Ok with the right count, {} failed (and left nothing held), 0 \
         double decrements, 0 spurious lost, 0 keys left ({} ms, {:.1} ms per cycle)",
        tally.cuts,
        tally.ok,
        tally.failed,
        ms(took),
        took.as_secs_f64() * 1000.0 / CYCLES as f64
    ));
}

/// Releases cut right after the request reached Redis: no double decrement,
/// no spurious "not held", nothing left behind.
#[test]
fn release_cut_after_request() {
    cut_cycles(Cut::Release);
}

/// Acquires cut right after the request reached Redis: each either returns a
/// guard with the right count, or errs and leaves nothing held.
#[test]
fn acquire_cut_after_request() {
    cut_cycles(Cut::Acquire);
}

fn set_maxclients(conn: &mut redis::Connection, n: u32) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(n)
        .query::<()>(conn)
        .expect("CONFIG SET maxclients");
}

/// A request cut after it reached Redis, whose retry then cannot even get a
/// connection (Redis refuses new clients: `maxclients`). An acquire told
/// "failed" must be undone; a release must not report "not held" and must
/// leave the lock free.
#[test]
fn cut_then_no_connection() {
    for cut in [Cut::Acquire, Cut::Release] {
        let mut rig = rig();
        let name = format!("refused:{cut:?}");
        let lock = rig.client.lock(name.as_str());
        lock.lock().unwrap().unlock().unwrap(); // scripts loaded
        let mut guards = Vec::new();
        if cut == Cut::Release {
            guards.push(lock.lock().unwrap());
        }
        // Existing connections stay (only `direct` matters); no new one is
        // accepted, so the connection the cut closes cannot be replaced.
        set_maxclients(&mut rig.direct, 1);
        let mut tally = Tally::default();
        match cut {
            Cut::Acquire => {
                rig.proxy.cut_after_request(cut.pattern());
                let r = lock.try_lock();
                println!("acquire cut, retry refused: {r:?}");
                if let Ok(Some(g)) = r {
                    guards.push(g);
                }
            }
            Cut::Release => rig.release(&mut guards, true, &mut tally),
        }
        assert!(!rig.proxy.armed(), "{cut:?}: the cut fired");
        set_maxclients(&mut rig.direct, 10000);
        assert_eq!(tally.lost, 0, "{cut:?}: the release reported \"not held\"");
        let want = guards.len() as u32;
        let t = Instant::now();
        let direct = &mut rig.direct;
        wait_until(
            "the lock to hold exactly the live guards (well before its 30 s lease)",
            Duration::from_secs(10),
            || server_count(direct, &name) == want,
        );
        println!("{cut:?}: settled after {:?}", t.elapsed());
        assert_eq!(lock.hold_count().unwrap(), want);
        drop(guards);
        assert!(!lock.is_locked().unwrap());
        drop(rig.srv);
    }
}

/// A waiter woken by a release whose next try is cut after it reached Redis
/// (and each retry on a new connection too) keeps waiting, and its next try
/// takes the lock: a wait rides out a try that failed the way an outage
/// looks while the holder's lease it last saw lasts, whatever woke it.
/// Before, only a re-check of an unconfirmed subscription did; a try after
/// a release message (or a reconnect, as after a restart) ended `lock()`
/// with the error.
#[test]
fn a_woken_waiter_whose_try_is_cut_waits_on() {
    const NAME: &str = "cut:woken";
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let holder = Client::builder(srv.url()).build().expect("build holder");
    let waiter = Arc::new(
        Client::builder(proxy.url())
            .response_timeout(Duration::from_secs(1))
            .connection_timeout(Duration::from_secs(1))
            .build()
            .expect("build waiter"),
    );
    warm_subscriber(&holder, &waiter);
    let g = holder.lock(NAME).lock().expect("holder lock");
    let mut monitor = Monitor::start(&srv);
    let (tx, rx) = mpsc::channel();
    let thread = {
        let waiter = Arc::clone(&waiter);
        thread::spawn(move || {
            let lock = waiter.lock(NAME);
            let got = lock.lock().map(|g| {
                let count = lock.hold_count();
                g.unlock().map(|()| count)
            });
            tx.send(format!("{got:?}")).unwrap();
        })
    };
    // Blocked in its wait once Redis ran its try after subscribing.
    monitor.wait_for(
        "the waiter's acquire try after subscribing",
        |line| is_acquire_of(line, NAME) && line.contains(waiter.id()),
        2,
    );
    assert!(srv.ping(Duration::from_secs(5)));
    // The try the release wakes, and each of its retries on a new
    // connection, run on Redis and lose their reply.
    let attempts = 1 + 3; // the client's default retry_attempts
    let rule = proxy.add_rule(b"redlease_acquire_cancel", Fault::CutAfterRequest, attempts);
    let released = Instant::now();
    g.unlock().expect("holder unlock");
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter's lock() to return");
    figure(&format!(
        "a woken waiter whose try was cut {attempts} times took the lock {} ms after the \
         release (holder lease 30 s)",
        ms(released.elapsed())
    ));
    thread.join().expect("waiter thread");
    assert_eq!(
        proxy.hits(rule),
        attempts,
        "the woken try and its retries were cut"
    );
    assert_eq!(
        got, "Ok(Ok(Ok(1)))",
        "the waiter takes the lock once (count 1) and releases it"
    );
    assert_eq!(
        server_lock_keys(&srv),
        Vec::<String>::new(),
        "no lock left behind"
    );
}
