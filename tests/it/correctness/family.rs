//! Randomized safety tests of the read-write lock, the fair lock and the
//! fenced lock, in the manner of `safety.rs`: threads of three clients take
//! two locks of the kind (timed and single tries, fixed leases and watched
//! ones, re-entries), while a fault injector delays, drops, cuts and copies
//! late random single requests and replies of that kind's scripts (one rule
//! at a time, replaced every 10-40 ms). The oracle records, for each guard,
//! the span in which its owner believed it held the lock (from the
//! acquire's return to the start of its last `ensure_held()` that said Ok,
//! both conservative, so a reported overlap is a real one) and flags:
//!
//! - read-write lock: a write span overlapping any other owner's span;
//! - fair lock: two owners' spans overlapping;
//! - fenced lock: two owners' spans overlapping, a token handed out twice,
//!   or a span that starts after another ended with a token not above
//!   that one's;
//! - every kind: a thread's release that said Ok and left it nothing of the
//!   lock, after which Redis still records the thread's hold
//!   (`is_held_by_current_thread()`).
//!
//! Then, faults removed and everything released, once every client has
//! settled its lost requests and stopped renewing, Redis must hold no lock
//! key, read hold key, fair line entry or process queue entry.
//!
//! Each test runs `REDLEASE_FAMILY_SECS` seconds (default 7, at most 600);
//! the seed is printed and can be replayed with `REDLEASE_FAMILY_SEED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redlease::{Client, LockGuard, OwnedLockGuard, ReadWriteLock};

use super::randomized::{client, lock_scripts, run_params, sha, Injector, Rng};
use crate::faults_common::{figure, lock_keys};
use crate::support::{wait_until, Proxy, RedisServer};

/// The clients' watchdog leases: two short ones, so that watched holds
/// run out under the faults, and a longer one, whose holds a failure to
/// release or undo would leave behind long enough for the final check to
/// see.
const WATCHDOG_LEASES: [Duration; 3] = [
    Duration::from_millis(400),
    Duration::from_millis(400),
    Duration::from_millis(2000),
];
/// The longest a late copy of a request (`Fault::LateCopy`) is held back.
const LATE_COPY_MAX: Duration = Duration::from_millis(300);

/// How long (`REDLEASE_FAMILY_SECS`) and with which seed
/// (`REDLEASE_FAMILY_SEED`, else the clock) a test runs; printed.
fn params(test: &str) -> (u64, u64) {
    run_params(test, "REDLEASE_FAMILY_SECS", "REDLEASE_FAMILY_SEED", 7, 600)
}

/// An interval in which one owner believed it held a lock (see the module
/// doc).
#[derive(Clone, Debug)]
struct Span {
    owner: (usize, usize),
    /// Excludes every other owner (a write hold; any hold of the fair and
    /// the fenced lock).
    exclusive: bool,
    /// A fenced lock's token.
    token: Option<u64>,
    from: Instant,
    to: Instant,
    /// How it was taken (for a report).
    how: String,
    /// What its owner did up to the end of the span (for a report).
    log: Arc<Vec<String>>,
}

/// A guard of a thread or of an acquisition (`Lock::owned`).
enum Guard {
    Thread(LockGuard),
    Owned(OwnedLockGuard),
}

impl Guard {
    fn ensure_held(&self) -> redlease::Result<()> {
        match self {
            Guard::Thread(g) => g.ensure_held(),
            Guard::Owned(g) => g.ensure_held(),
        }
    }

    fn valid_until(&self) -> Instant {
        match self {
            Guard::Thread(g) => g.valid_until(),
            Guard::Owned(g) => g.valid_until(),
        }
    }

    fn token(&self) -> Option<u64> {
        match self {
            Guard::Thread(g) => g.token(),
            Guard::Owned(g) => g.token(),
        }
    }

    /// Releases it; an owned one on another thread when `elsewhere`.
    fn unlock(self, elsewhere: bool) -> redlease::Result<()> {
        match self {
            Guard::Thread(g) => g.unlock(),
            Guard::Owned(g) if elsewhere => thread::spawn(move || g.unlock())
                .join()
                .expect("the releasing thread"),
            Guard::Owned(g) => g.unlock(),
        }
    }
}

/// Which owner field of its thread a guard's hold is under: a write
/// hold's (`<uuid>:<thread>:write`), or the thread's own; `None` for an
/// owned acquisition (a field of its own).
type Field = Option<bool>;

/// A guard and the span its owner believed it held so far.
struct Watched {
    guard: Guard,
    how: String,
    exclusive: bool,
    field: Field,
    from: Instant,
    /// The start of its last `ensure_held()` that said Ok.
    to: Option<Instant>,
}

impl Watched {
    fn new(guard: Guard, how: String, exclusive: bool, write_field: bool) -> Watched {
        let field = matches!(guard, Guard::Thread(_)).then_some(write_field);
        Watched {
            guard,
            how,
            exclusive,
            field,
            from: Instant::now(),
            to: None,
        }
    }

    /// `ensure_held()`; when Ok, the span reaches the start of this check.
    fn check(&mut self) -> bool {
        let before = Instant::now();
        let ok = self.guard.ensure_held().is_ok();
        if ok {
            self.to = Some(before);
        }
        ok
    }

    fn left(&self) -> Duration {
        self.guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    }
}

/// A fenced token handed out: to whom, for which lock, how.
struct Token {
    name: &'static str,
    token: u64,
    owner: (usize, usize),
    how: String,
}

/// What every worker of a test reports.
#[derive(Default)]
struct Record {
    spans: Mutex<HashMap<&'static str, Vec<Span>>>,
    /// Every fenced token handed out.
    tokens: Mutex<Vec<Token>>,
    /// Things wrong at once (a fenced guard without a token).
    wrong: Mutex<Vec<String>>,
    acquisitions: AtomicU64,
    checks: AtomicU64,
    /// Releases followed by a look at what Redis records.
    released: AtomicU64,
    errors: AtomicU64,
}

/// Asks Redis (`is_held_by_current_thread`) whether this thread's owner
/// field, its write lock's when `true`, is recorded.
type Held<'a> = dyn Fn(bool) -> redlease::Result<bool> + 'a;

/// One worker thread: its client, its owner id, its generator and its log.
struct Worker {
    client: Client,
    /// A read-write lock's worker: only write holds exclude everyone.
    shared_lock: bool,
    owner: (usize, usize),
    rng: Rng,
    t0: Instant,
    log: Vec<String>,
    record: Arc<Record>,
}

impl Worker {
    fn note(&mut self, what: String) {
        if self.log.len() > 60 {
            self.log.drain(..self.log.len() - 30);
        }
        self.log
            .push(format!("{:>8} us {what}", self.t0.elapsed().as_micros()));
    }

    /// The outcome of an acquire call: a watched guard, or `None` (busy,
    /// or an error, counted). `write`: a write lock's (its own owner field,
    /// and it excludes everyone); any hold of the fair and fenced lock
    /// excludes everyone too.
    fn taken(
        &mut self,
        name: &'static str,
        how: String,
        write: bool,
        r: redlease::Result<Option<Guard>>,
    ) -> Option<Watched> {
        match r {
            Ok(Some(g)) => {
                self.record.acquisitions.fetch_add(1, Ordering::Relaxed);
                if let Some(t) = g.token() {
                    self.record.tokens.lock().unwrap().push(Token {
                        name,
                        token: t,
                        owner: self.owner,
                        how: how.clone(),
                    });
                }
                let w = Watched::new(g, how, write || !self.shared_lock, write);
                let (left, token) = (w.left(), w.guard.token());
                self.note(format!(
                    "{name} {} acquired, token {token:?}, valid {left:?}",
                    w.how
                ));
                Some(w)
            }
            Ok(None) => {
                self.note(format!("{name} {how} busy"));
                None
            }
            Err(e) => {
                self.record.errors.fetch_add(1, Ordering::Relaxed);
                self.note(format!("{name} {how} error {e}"));
                None
            }
        }
    }

    /// Checks every live guard (all of them, even after one fails);
    /// `false` if any said lost.
    fn check_all(&mut self, live: &mut [Watched]) -> bool {
        let mut all = true;
        for w in live.iter_mut() {
            if w.check() {
                self.record.checks.fetch_add(1, Ordering::Relaxed);
            } else {
                all = false;
            }
        }
        let states: Vec<String> = live
            .iter()
            .map(|w| format!("{} valid {:?}", w.how, w.left()))
            .collect();
        self.note(format!(
            "check {}: {}",
            if all { "ok" } else { "LOST" },
            states.join(", ")
        ));
        all
    }

    /// Records `w`'s span (if any check said Ok) and releases it. When that
    /// released the last hold of its thread's owner field (`last`), and
    /// said Ok, Redis must no longer record that field (`held` asks it).
    fn release(&mut self, name: &'static str, w: Watched, last: bool, held: &Held<'_>) {
        if let Some(to) = w.to {
            let span = Span {
                owner: self.owner,
                exclusive: w.exclusive,
                token: w.guard.token(),
                from: w.from,
                to,
                how: w.how.clone(),
                log: Arc::new(self.log.clone()),
            };
            self.record
                .spans
                .lock()
                .unwrap()
                .entry(name)
                .or_default()
                .push(span);
        }
        let elsewhere = self.rng.below(2) == 0;
        let (how, field) = (w.how, w.field);
        let r = w.guard.unlock(elsewhere);
        self.note(format!("{name} {how} unlock {r:?}"));
        if let (Ok(()), true, Some(write)) = (&r, last, field) {
            let still = held(write);
            self.record.released.fetch_add(1, Ordering::Relaxed);
            self.note(format!("{name} still held by this thread: {still:?}"));
            if let Ok(true) = still {
                let log = self.log.join("\n");
                self.record.wrong.lock().unwrap().push(format!(
                    "{name}: owner {:?}'s release of {how} said Ok, but Redis still records \
                     its hold\n{log}",
                    self.owner
                ));
            }
        }
    }

    /// Holds `live` (outer guard first) for a few checks, the critical
    /// section's work between them, releasing one of them (`release_one`:
    /// its index) part way; then the rest, innermost first. Stops checking
    /// at the first check that says lost. `held` asks Redis whether this
    /// thread's field (write or not) is recorded.
    fn hold(
        &mut self,
        name: &'static str,
        mut live: Vec<Watched>,
        release_one: Option<usize>,
        held: &Held<'_>,
    ) {
        let rounds = self.rng.below(15) + 1;
        let at = self.rng.below(rounds);
        let mut release_one = release_one.filter(|&i| i < live.len());
        for round in 0..rounds {
            if !self.check_all(&mut live) {
                break;
            }
            if round == at {
                if let Some(i) = release_one.take() {
                    let w = live.remove(i);
                    let last = !live.iter().any(|o| o.field == w.field);
                    self.release(name, w, last, held);
                }
            }
            thread::sleep(self.rng.ms(0, 15)); // the critical section's work
        }
        while let Some(w) = live.pop() {
            let last = !live.iter().any(|o| o.field == w.field);
            self.release(name, w, last, held);
        }
    }
}

/// A test's Redis, proxy, clients, fault injector and record.
struct Rig {
    srv: RedisServer,
    proxy: Arc<Proxy>,
    clients: Vec<Client>,
    injector: Option<Injector>,
    record: Arc<Record>,
    seed: u64,
}

impl Rig {
    /// Starts Redis, the proxy, the clients (as safety.rs's: a short
    /// response timeout; see [`WATCHDOG_LEASES`]) and the injector of
    /// faults on `scripts` (SHAs).
    fn start(seed: u64, scripts: Vec<Vec<u8>>) -> Rig {
        let srv = RedisServer::start();
        let proxy = Arc::new(Proxy::start(srv.addr()));
        let clients: Vec<Client> = WATCHDOG_LEASES
            .iter()
            .map(|&lease| client(&proxy, lease))
            .collect();
        let injector = Injector::start(&proxy, scripts, seed, Some(LATE_COPY_MAX));
        Rig {
            srv,
            proxy,
            clients,
            injector: Some(injector),
            record: Arc::default(),
            seed,
        }
    }

    /// Runs `round` in a loop on `threads` threads per client for `secs`,
    /// then stops the injector; the faults fired.
    fn run(
        &mut self,
        secs: u64,
        threads: usize,
        shared_lock: bool,
        round: fn(&mut Worker),
    ) -> usize {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut workers = Vec::new();
        for (c, client) in self.clients.iter().enumerate() {
            for t in 0..threads {
                let mut w = Worker {
                    client: client.clone(),
                    shared_lock,
                    owner: (c, t),
                    rng: Rng::new(self.seed ^ (((c as u64) << 32) | (t as u64 + 1))),
                    t0: Instant::now(),
                    log: Vec::new(),
                    record: Arc::clone(&self.record),
                };
                workers.push(thread::spawn(move || {
                    while Instant::now() < deadline {
                        round(&mut w);
                    }
                }));
            }
        }
        for w in workers {
            w.join().expect("a worker panicked");
        }
        let fired = self.injector.take().expect("the injector").finish();
        self.proxy.clear_rules();
        fired
    }

    /// Once every client has settled its lost requests (bounded wait) and
    /// renews nothing, Redis holds no key but those `kept` allows (and the
    /// expiring latches, markers and process keys).
    fn assert_nothing_left(&self, kept: impl Fn(&str) -> bool) {
        wait_until(
            "every client to settle its lost requests (unsettled_requests 0: undos, \
             releases, leaves) and to renew nothing (watchdog_entries 0)",
            Duration::from_secs(30),
            || {
                self.clients.iter().all(|c| {
                    let s = c.stats();
                    s.unsettled_requests == 0 && s.watchdog_entries == 0
                })
            },
        );
        let mut conn = self.srv.conn();
        let left: Vec<String> = lock_keys(&mut conn)
            .into_iter()
            .filter(|k| !kept(k))
            .collect();
        let shown: Vec<String> = left.iter().map(|k| describe(&mut conn, k)).collect();
        assert!(
            left.is_empty(),
            "keys left behind once everything was released and settled (seed {}):\n{}",
            self.seed,
            shown.join("\n")
        );
    }
}

/// A key's type, TTL and content, for a report.
fn describe(conn: &mut redis::Connection, key: &str) -> String {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).expect("PTTL");
    let content: Vec<String> = match kind.as_str() {
        "hash" => redis::cmd("HGETALL").arg(key).query(conn).expect("HGETALL"),
        "list" => redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(conn)
            .expect("LRANGE"),
        "zset" => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(conn)
            .expect("ZRANGE"),
        "string" => vec![redis::cmd("GET").arg(key).query(conn).expect("GET")],
        _ => Vec::new(),
    };
    format!("{key} ({kind}, pttl {ttl} ms): {content:?}")
}

/// Pairs of spans of different owners, one of them exclusive, that
/// overlap.
fn exclusion_violations(spans: &HashMap<&'static str, Vec<Span>>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, list) in spans {
        let mut list = list.clone();
        list.sort_by_key(|s| s.from);
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.from >= a.to {
                    break;
                }
                if a.owner != b.owner && (a.exclusive || b.exclusive) && b.to > a.from {
                    out.push(format!(
                        "{name}: [{}] and [{}] overlap\n--- first:\n{}\n--- second:\n{}",
                        show(a, a.from),
                        show(b, a.from),
                        a.log.join("\n"),
                        b.log.join("\n")
                    ));
                }
            }
        }
    }
    out
}

/// A fenced lock's tokens: each handed out once, and a span that starts
/// after another ended has a larger token.
fn token_violations(spans: &HashMap<&'static str, Vec<Span>>, tokens: &[Token]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: HashMap<(&str, u64), Vec<String>> = HashMap::new();
    for t in tokens {
        seen.entry((t.name, t.token))
            .or_default()
            .push(format!("{:?} {}", t.owner, t.how));
    }
    for ((name, t), who) in &seen {
        if who.len() > 1 {
            out.push(format!(
                "{name}: token {t} handed out {} times: {who:?}",
                who.len()
            ));
        }
    }
    for (name, list) in spans {
        let mut by_end: Vec<&Span> = list.iter().filter(|s| s.token.is_some()).collect();
        by_end.sort_by_key(|s| s.to);
        let mut by_start = by_end.clone();
        by_start.sort_by_key(|s| s.from);
        // The span with the largest token among those ended before the
        // current one started.
        let mut ended = 0;
        let mut top: Option<&Span> = None;
        for b in by_start {
            while ended < by_end.len() && by_end[ended].to <= b.from {
                let a = by_end[ended];
                if top.is_none_or(|t| a.token > t.token) {
                    top = Some(a);
                }
                ended += 1;
            }
            if let Some(a) = top.filter(|a| b.token <= a.token) {
                out.push(format!(
                    "{name}: token {:?} of [{}] is not above {:?} of [{}], which ended before \
                     it began\n--- earlier:\n{}\n--- later:\n{}",
                    b.token,
                    show(b, a.from),
                    a.token,
                    show(a, a.from),
                    a.log.join("\n"),
                    b.log.join("\n")
                ));
            }
        }
    }
    out
}

fn show(s: &Span, origin: Instant) -> String {
    format!(
        "owner {:?} {} token {:?} held {} ms from +{} ms",
        s.owner,
        s.how,
        s.token,
        s.to.saturating_duration_since(s.from).as_millis(),
        s.from.saturating_duration_since(origin).as_millis()
    )
}

/// Asserts the test did something and found nothing wrong.
fn verdict(test: &str, secs: u64, seed: u64, fired: usize, record: &Record, fenced: bool) {
    let spans = record.spans.lock().unwrap();
    let mut violations = exclusion_violations(&spans);
    if fenced {
        violations.extend(token_violations(&spans, &record.tokens.lock().unwrap()));
    }
    violations.extend(record.wrong.lock().unwrap().iter().cloned());
    let total: usize = spans.values().map(Vec::len).sum();
    figure(&format!(
        "randomized {test} safety ({secs} s, seed {seed}): {} acquisitions, {total} spans, \
         {} ensure_held checks, {} releases checked on Redis, {fired} injected faults fired, \
         {} call errors, {} violations",
        record.acquisitions.load(Ordering::Relaxed),
        record.checks.load(Ordering::Relaxed),
        record.released.load(Ordering::Relaxed),
        record.errors.load(Ordering::Relaxed),
        violations.len()
    ));
    assert!(total > 0, "no lock was ever held: the test tested nothing");
    assert!(fired > 0, "no fault was ever injected");
    assert!(
        violations.is_empty(),
        "{} violations (seed {seed}):\n{}",
        violations.len(),
        violations[..violations.len().min(3)].join("\n=====\n")
    );
}

const RW_LOCKS: [&str; 2] = ["family:rw", "family:{rw}"];

/// A read or write acquisition of `rw`: `kind` 0 a timed try, 1 a single
/// try, else a timed try with a fixed lease.
fn rw_try(
    rw: &ReadWriteLock,
    write: bool,
    kind: u64,
    wait: Duration,
    lease: Duration,
) -> redlease::Result<Option<Guard>> {
    let r = match (write, kind) {
        (true, 0) => rw.write_lock().try_lock_for(wait),
        (true, 1) => rw.write_lock().try_lock(),
        (true, _) => rw.write_lock().try_lock_with_lease(wait, lease),
        (false, 0) => rw.read_lock().try_lock_for(wait),
        (false, 1) => rw.read_lock().try_lock(),
        (false, _) => rw.read_lock().try_lock_with_lease(wait, lease),
    };
    r.map(|g| g.map(Guard::Thread))
}

/// One round of a read-write lock worker: a read or write hold, maybe
/// with a second one of the same thread (a re-entry, a read under the
/// write, then maybe a downgrade; or an upgrade try, which must wait).
fn rw_round(w: &mut Worker) {
    let name = w.rng.pick(&RW_LOCKS);
    let rw = w.client.read_write_lock(name);
    let write = w.rng.below(5) < 2;
    let kind = w.rng.below(4);
    let (wait, lease) = (w.rng.ms(0, 200), w.rng.ms(30, 200));
    let mode = if write { "W" } else { "R" };
    let taken = rw_try(&rw, write, kind, wait, lease);
    let Some(outer) = w.taken(name, format!("{mode}{kind}"), write, taken) else {
        return;
    };
    let mut live = vec![outer];
    let mut release_one = Some(1);
    match w.rng.below(6) {
        // A re-entry of the same mode, a single try or a short fixed lease.
        k @ (0 | 1) => {
            let lease = w.rng.ms(20, 200);
            let r = rw_try(&rw, write, 1 + k, Duration::ZERO, lease);
            live.extend(w.taken(name, format!("{mode}{kind}+{mode}{}", 1 + k), write, r));
        }
        // A writer reads too; then maybe lets go of the write (a
        // downgrade: the read goes on alone).
        k @ (2 | 3) if write => {
            let r = rw_try(&rw, false, 1, Duration::ZERO, lease);
            live.extend(w.taken(name, format!("W{kind}+R"), false, r));
            if k == 3 {
                release_one = Some(0);
            }
        }
        // A reader asks for the write lock: no upgrade, it waits for
        // itself (unless its read hold is gone: then it may get it).
        2 => {
            let r = rw_try(&rw, true, 0, w.rng.ms(0, 30), lease);
            live.extend(w.taken(name, format!("R{kind}+W"), true, r));
        }
        _ => {}
    }
    let held = |write: bool| {
        if write {
            rw.write_lock().is_held_by_current_thread()
        } else {
            rw.read_lock().is_held_by_current_thread()
        }
    };
    w.hold(name, live, release_one, &held);
}

#[test]
fn read_write_lock_randomized_faults_never_let_a_writer_overlap() {
    let (secs, seed) = params("read-write lock");
    let scripts = vec![
        sha(concat!(
            include_str!("../../../src/scripts/rw_lib.lua"),
            include_str!("../../../src/scripts/rw_acquire.lua")
        )),
        sha(concat!(
            include_str!("../../../src/scripts/rw_lib.lua"),
            include_str!("../../../src/scripts/rw_release.lua")
        )),
        sha(concat!(
            include_str!("../../../src/scripts/rw_lib.lua"),
            include_str!("../../../src/scripts/rw_cancel.lua")
        )),
        sha(include_str!("../../../src/scripts/renew.lua")),
    ];
    let mut rig = Rig::start(seed, scripts);
    let fired = rig.run(secs, 3, true, rw_round);
    verdict("read-write lock", secs, seed, fired, &rig.record, false);
    // The latches and cancel markers expire (lock_keys leaves them out).
    rig.assert_nothing_left(|_| false);
}

const FAIR_LOCKS: [&str; 2] = ["family:fair", "family:{fair}"];

/// One round of a fair lock worker: a timed wait in line (often given up
/// at its deadline), a single try or a fixed lease, maybe with a re-entry.
fn fair_round(w: &mut Worker) {
    let name = w.rng.pick(&FAIR_LOCKS);
    let lock = w.client.fair_lock(name);
    let kind = w.rng.below(4);
    let wait = w.rng.ms(0, 300);
    let r = match kind {
        0 | 1 => lock.try_lock_for(wait),
        2 => lock.try_lock(),
        _ => lock.try_lock_with_lease(wait, w.rng.ms(30, 200)),
    };
    let Some(outer) = w.taken(
        name,
        format!("F{kind}"),
        false,
        r.map(|g| g.map(Guard::Thread)),
    ) else {
        return;
    };
    let mut live = vec![outer];
    let inner = w.rng.below(4);
    let r = match inner {
        0 | 1 => lock.try_lock(),
        2 => lock.try_lock_with_lease(Duration::ZERO, w.rng.ms(20, 200)),
        _ => Ok(None),
    };
    if inner < 3 {
        let how = format!("F{kind}+F{inner}");
        live.extend(w.taken(name, how, false, r.map(|g| g.map(Guard::Thread))));
    }
    w.hold(name, live, Some(1), &|_| lock.is_held_by_current_thread());
}

#[test]
fn fair_lock_randomized_faults_never_let_two_holders_believe_at_once() {
    let (secs, seed) = params("fair lock");
    let scripts = vec![
        sha(concat!(
            include_str!("../../../src/scripts/fair_lib.lua"),
            include_str!("../../../src/scripts/fair_acquire.lua")
        )),
        sha(concat!(
            include_str!("../../../src/scripts/fair_lib.lua"),
            include_str!("../../../src/scripts/fair_release.lua"),
            include_str!("../../../src/scripts/release.lua")
        )),
        sha(concat!(
            include_str!("../../../src/scripts/fair_lib.lua"),
            include_str!("../../../src/scripts/fair_cancel.lua")
        )),
        sha(concat!(
            include_str!("../../../src/scripts/fair_lib.lua"),
            include_str!("../../../src/scripts/fair_leave.lua")
        )),
        sha(include_str!("../../../src/scripts/renew.lua")),
    ];
    let mut rig = Rig::start(seed, scripts);
    let fired = rig.run(secs, 2, false, fair_round);
    verdict("fair lock", secs, seed, fired, &rig.record, false);
    // The line, the places and the deadlines must be empty (no departed
    // waiter left in them); the leave markers expire.
    rig.assert_nothing_left(|k| k.starts_with("redlease_fair_leave:"));
}

const FENCED_LOCKS: [&str; 2] = ["family:fenced", "family:{fenced}"];

/// A fenced lock only the first client's threads take: its release
/// hands it to a waiting thread of that client (nobody else listens).
const SOLO: &str = "family:fenced:solo";

/// One round of a fenced lock worker: thread-owned or owned acquisitions
/// (some released on another thread), timed or single tries, fixed leases,
/// now and then a plain lock of the same name (no token); re-entries,
/// fenced or plain.
fn fenced_round(w: &mut Worker) {
    let name = if w.owner.0 == 0 && w.rng.below(3) == 0 {
        SOLO
    } else {
        w.rng.pick(&FENCED_LOCKS)
    };
    let fenced = w.client.fenced_lock(name);
    let kind = w.rng.below(7);
    let (wait, lease) = (w.rng.ms(0, 200), w.rng.ms(30, 200));
    let thread = |g: Option<LockGuard>| g.map(Guard::Thread);
    let owned = |g: Option<OwnedLockGuard>| g.map(Guard::Owned);
    let r = match kind {
        0 => fenced.try_lock_for(wait).map(thread),
        1 => fenced.try_lock().map(thread),
        2 => fenced.try_lock_with_lease(wait, lease).map(thread),
        3 => fenced.owned().try_lock_for(wait).map(owned),
        4 => fenced.owned().try_lock_with_lease(wait, lease).map(owned),
        // A plain lock shares the hash (and takes no token).
        5 => w.client.lock(name).try_lock_for(wait).map(thread),
        _ => w
            .client
            .lock(name)
            .try_lock_with_lease(wait, lease)
            .map(thread),
    };
    let how = format!("{}{kind}", b"ffFooPP"[kind as usize] as char);
    let Some(outer) = w.taken(name, how, false, r) else {
        return;
    };
    if kind < 5 && outer.guard.token().is_none() {
        w.record
            .wrong
            .lock()
            .unwrap()
            .push(format!("{name}: a fenced guard ({kind}) without a token"));
    }
    let mut live = vec![outer];
    // An owned acquisition is never re-entered (this thread's try is
    // another owner's, and waits while it holds).
    let inner = if (3..5).contains(&kind) {
        3
    } else {
        w.rng.below(4)
    };
    let r = match inner {
        0 => fenced.try_lock().map(thread),
        1 => fenced
            .try_lock_with_lease(Duration::ZERO, w.rng.ms(20, 200))
            .map(thread),
        2 => w.client.lock(name).try_lock().map(thread),
        _ => Ok(None),
    };
    if inner < 3 {
        let how = format!("{}+{}", live[0].how, ["f", "F", "p"][inner as usize]);
        let taken = w.taken(name, how, false, r);
        if let Some(g) = &taken {
            if inner < 2 && g.guard.token().is_none() {
                w.record
                    .wrong
                    .lock()
                    .unwrap()
                    .push(format!("{name}: a fenced re-entry without a token"));
            }
        }
        live.extend(taken);
    }
    w.hold(name, live, Some(1), &|_| fenced.is_held_by_current_thread());
}

#[test]
fn fenced_lock_randomized_faults_never_overlap_nor_reorder_tokens() {
    let (secs, seed) = params("fenced lock");
    let mut scripts = lock_scripts();
    scripts.push(sha(concat!(
        include_str!("../../../src/scripts/queue_lib.lua"),
        include_str!("../../../src/scripts/queue_wake.lua"),
        include_str!("../../../src/scripts/leave.lua")
    )));
    let mut rig = Rig::start(seed, scripts);
    let fired = rig.run(secs, 3, false, fenced_round);
    verdict("fenced lock", secs, seed, fired, &rig.record, true);
    // The token key stays (it never expires), above every token handed out.
    let top = rig
        .record
        .tokens
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.token)
        .max();
    for name in FENCED_LOCKS.into_iter().chain([SOLO]) {
        let key = if name.contains('{') {
            format!("redisson_lock_token:{name}")
        } else {
            format!("redisson_lock_token:{{{name}}}")
        };
        let mine = rig
            .record
            .tokens
            .lock()
            .unwrap()
            .iter()
            .filter(|t| t.name == name)
            .map(|t| t.token)
            .max();
        if let Some(mine) = mine {
            let at: u64 = rig.srv.cmd(&["GET", &key]).parse().expect("a token key");
            assert!(at >= mine, "{key} at {at}, below token {mine} handed out");
        }
    }
    assert!(top.is_some(), "no fenced token was handed out");
    rig.assert_nothing_left(|k| k.starts_with("redisson_lock_token:"));
}
