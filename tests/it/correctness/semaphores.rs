//! Randomized safety tests for both semaphores, in the manner of
//! `safety.rs`: threads of three clients take permits of a semaphore of
//! [`PERMITS`] (one or two of a `Semaphore`, one with a lease of an
//! `ExpirableSemaphore`, whose lease they may update), hold them briefly
//! and give them back (dropped, released, a permit also by id, some on
//! another thread), while a fault injector delays, drops,
//! cuts and copies late random single requests and replies of the
//! semaphore's scripts (one rule at a time, replaced every 10-40 ms).
//!
//! The oracle records, for every acquisition, the span in which its caller
//! believed it held its permits (from the return of the acquire call to the
//! start of the release; for an expirable permit, no later than the
//! guard's `valid_until()`), and flags any instant at which the permits of
//! the spans open exceed [`PERMITS`]. At the end, with every guard released
//! and every request the clients settle in the background settled, the
//! permits available are [`PERMITS`] again and no permit is recorded as out.
//!
//! Each runs `REDLEASE_SEMAPHORE_SAFETY_SECS` seconds (default 7, at most
//! 600); the seed is printed and can be replayed with
//! `REDLEASE_SEMAPHORE_SAFETY_SEED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redlease::{Client, Error, ExpirableSemaphore, Permit, Semaphore, SemaphorePermits};

use super::randomized::{client, run_params, run_workers, sha, Injector, Rng};
use crate::faults_common::figure;
use crate::support::{wait_until, Proxy, RedisServer};

/// The permits each semaphore is set to.
const PERMITS: u64 = 3;
const CLIENTS: usize = 3;
const THREADS_PER_CLIENT: usize = 3;
/// The longest a late copy of a request (`Fault::LateCopy`) is held back.
const LATE_COPY_MAX: Duration = Duration::from_millis(1500);

/// How long to run and with which seed (from the environment).
fn settings(what: &str) -> (u64, u64) {
    run_params(
        what,
        "REDLEASE_SEMAPHORE_SAFETY_SECS",
        "REDLEASE_SEMAPHORE_SAFETY_SEED",
        7,
        600,
    )
}

/// Clients through the proxy, with short timeouts (as in `safety.rs`).
fn clients(proxy: &Proxy) -> Vec<Client> {
    (0..CLIENTS)
        .map(|_| client(proxy, Duration::from_millis(400)))
        .collect()
}

/// One thread of one client.
type Owner = (usize, usize);

/// A span in which an owner believed it held `permits` permits: from the
/// return of its acquire call to the start of its release (or the guard's
/// bound, if earlier). Both ends are conservative: the permits were out in
/// Redis all along if the library keeps its promises.
#[derive(Clone, Debug)]
struct Span {
    owner: Owner,
    permits: u64,
    from: Instant,
    to: Instant,
    /// How the permits were taken and given back (for a report).
    how: String,
}

/// What one worker thread leaves behind.
#[derive(Default)]
struct Record {
    spans: Vec<Span>,
    /// What it did, timed, for a report.
    log: Vec<(Instant, String)>,
    /// Findings that are violations on their own (a release or an update
    /// told "not out" before the guard's bound).
    findings: Vec<String>,
}

impl Record {
    fn note(&mut self, what: String) {
        self.log.push((Instant::now(), what));
    }
}

/// How many times the spans open came to hold more than `limit` permits,
/// and a report of the first few: the spans open then and each owner's log
/// around them.
fn overlaps(records: &HashMap<Owner, Record>, limit: u64, t0: Instant) -> (usize, Vec<String>) {
    let spans: Vec<&Span> = records.values().flat_map(|r| &r.spans).collect();
    // Ends before starts at the same instant: a span that ends when another
    // begins does not overlap it.
    let mut events: Vec<(Instant, bool, usize)> = Vec::with_capacity(2 * spans.len());
    for (i, s) in spans.iter().enumerate() {
        if s.to > s.from {
            events.push((s.from, true, i));
            events.push((s.to, false, i));
        }
    }
    events.sort_by_key(|&(at, start, _)| (at, start));
    let at = |i: Instant| i.saturating_duration_since(t0).as_micros();
    let mut open: Vec<usize> = Vec::new();
    let mut held = 0;
    let mut reports = Vec::new();
    let mut times = 0;
    let mut over = false;
    for (when, start, i) in events {
        if start {
            open.push(i);
            held += spans[i].permits;
        } else {
            open.retain(|&j| j != i);
            held -= spans[i].permits;
        }
        if held > limit && !over {
            times += 1;
        }
        if held > limit && !over && reports.len() < 3 {
            let mut text = format!("{held} permits believed held at +{} us:", at(when));
            let mut from = when;
            for &j in &open {
                let s = spans[j];
                from = from.min(s.from);
                text.push_str(&format!(
                    "\n  owner {:?}: {} permit(s) from +{} us to +{} us ({})",
                    s.owner,
                    s.permits,
                    at(s.from),
                    at(s.to),
                    s.how
                ));
            }
            for &j in &open {
                let owner = spans[j].owner;
                text.push_str(&format!("\n--- owner {owner:?}:"));
                for (t, what) in &records[&owner].log {
                    if *t + Duration::from_millis(300) >= from && *t <= when {
                        text.push_str(&format!("\n{:>10} us {what}", at(*t)));
                    }
                }
            }
            reports.push(text);
        }
        over = held > limit;
    }
    (times, reports)
}

/// Fails with the overlaps' reports and the workers' findings, if any.
fn verdict(seed: u64, overlaps: &(usize, Vec<String>), records: &HashMap<Owner, Record>) {
    let findings: Vec<&str> = records
        .values()
        .flat_map(|r| &r.findings)
        .map(String::as_str)
        .collect();
    assert!(
        overlaps.0 == 0 && findings.is_empty(),
        "seed {seed}: {} times more permits believed held than set, {} findings:\n{}\n\
         =====\n{}",
        overlaps.0,
        findings.len(),
        overlaps.1.join("\n=====\n"),
        findings.join("\n")
    );
}

/// Runs `worker` on [`THREADS_PER_CLIENT`] threads of each client for
/// `secs` while the injector faults `scripts` (SHAs), then waits for the
/// clients to settle what they left: the records by owner, the counts, when
/// the workers started and how many faults fired.
fn run(
    proxy: &Arc<Proxy>,
    clients: &[Client],
    scripts: Vec<Vec<u8>>,
    (secs, seed): (u64, u64),
    worker: impl Fn(&Client, Owner, Instant, u64, &Counts) -> Record + Send + Sync + 'static,
) -> (HashMap<Owner, Record>, Arc<Counts>, Instant, usize) {
    let injector = Injector::start(proxy, scripts, seed, Some(LATE_COPY_MAX));
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(secs);
    let counts = Arc::new(Counts::default());
    let records = {
        let counts = Arc::clone(&counts);
        run_workers(
            clients,
            THREADS_PER_CLIENT,
            seed,
            move |client, owner, seed| worker(client, owner, deadline, seed, &counts),
        )
    };
    let fired = injector.finish();
    wait_for_settles(clients);
    (records, counts, t0, fired)
}

/// Waits (bounded) until no client has a request left to settle in the
/// background: the undone acquisitions and completed releases have run.
fn wait_for_settles(clients: &[Client]) {
    wait_until(
        "every client's requests whose reply was lost to be settled \
         (ClientStats::unsettled_requests 0)",
        Duration::from_secs(30),
        || clients.iter().all(|c| c.stats().unsettled_requests == 0),
    );
}

/// Permits taken from a `Semaphore`, and the permits of an inner
/// acquisition made while they were held.
fn plain_worker(
    sem: &Semaphore,
    owner: Owner,
    deadline: Instant,
    seed: u64,
    counts: &Counts,
) -> Record {
    let mut rng = Rng::new(seed);
    let mut rec = Record::default();
    while Instant::now() < deadline {
        let Some((outer, from)) = take_plain(sem, &mut rng, &mut rec, counts) else {
            continue;
        };
        thread::sleep(rng.ms(0, 15)); // the critical section's work
        let inner = if rng.below(4) == 0 {
            take_plain(sem, &mut rng, &mut rec, counts)
        } else {
            None
        };
        if let Some((inner, from)) = inner {
            thread::sleep(rng.ms(0, 10));
            give_back_plain(inner, from, owner, "inner", &mut rng, &mut rec, counts);
        }
        thread::sleep(rng.ms(0, 10));
        give_back_plain(outer, from, owner, "outer", &mut rng, &mut rec, counts);
    }
    rec
}

/// Counters shared by the workers of one test.
#[derive(Default)]
struct Counts {
    acquisitions: AtomicU64,
    busy: AtomicU64,
    acquire_errors: AtomicU64,
    release_errors: AtomicU64,
    updates: AtomicU64,
    update_errors: AtomicU64,
    expired_held: AtomicU64,
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn take_plain(
    sem: &Semaphore,
    rng: &mut Rng,
    rec: &mut Record,
    counts: &Counts,
) -> Option<(SemaphorePermits, Instant)> {
    let want = 1 + rng.below(2);
    let wait = rng.ms(0, 300);
    let kind = rng.below(3);
    let got = match kind {
        0 => sem.try_acquire(want),
        1 => sem.try_acquire_for(want, wait),
        _ => sem.try_acquire_until(want, Instant::now() + wait),
    };
    let from = Instant::now();
    match got {
        Ok(Some(p)) => {
            assert_eq!(p.permits(), want, "the guard holds what was asked for");
            count(&counts.acquisitions);
            rec.note(format!("acquire {kind} of {want}: taken"));
            Some((p, from))
        }
        Ok(None) => {
            count(&counts.busy);
            rec.note(format!("acquire {kind} of {want}: busy"));
            None
        }
        Err(e) => {
            count(&counts.acquire_errors);
            rec.note(format!("acquire {kind} of {want}: error {e}"));
            None
        }
    }
}

/// Gives `p` back (dropped or released, on this thread or another) and
/// records its span, which ends where the release begins.
fn give_back_plain(
    p: SemaphorePermits,
    from: Instant,
    owner: Owner,
    what: &str,
    rng: &mut Rng,
    rec: &mut Record,
    counts: &Counts,
) {
    let permits = p.permits();
    let how = rng.below(4);
    let release = move |p: SemaphorePermits| {
        let to = Instant::now();
        let r = match how {
            0 | 2 => {
                drop(p);
                Ok(())
            }
            _ => p.release(),
        };
        (to, r)
    };
    let (to, r) = if how < 2 {
        release(p)
    } else {
        thread::spawn(move || release(p))
            .join()
            .expect("the releasing thread")
    };
    let how = ["drop", "release", "drop elsewhere", "release elsewhere"][how as usize];
    rec.note(format!("{what} {how} of {permits}: {r:?}"));
    if let Err(e) = &r {
        count(&counts.release_errors);
        if matches!(e, Error::PermitLost { .. }) {
            // Nothing deletes the semaphore or forgets a guard here.
            rec.findings.push(format!(
                "owner {owner:?}: a release was told its permits were lost ({e})"
            ));
        }
    }
    rec.spans.push(Span {
        owner,
        permits,
        from,
        to,
        how: format!("{what}, {how}"),
    });
}

#[test]
fn randomized_faults_never_let_semaphore_holders_exceed_the_permits() {
    const NAME: &str = "safety:sem";
    let (secs, seed) = settings("semaphore");
    let srv = RedisServer::start();
    let proxy = Arc::new(Proxy::start(srv.addr()));
    let admin = Client::open(srv.url().as_str()).expect("admin client");
    assert!(admin.semaphore(NAME).try_set_permits(PERMITS).expect("set"));
    let clients = clients(&proxy);

    let scripts = vec![
        sha(include_str!("../../../src/scripts/semaphore_acquire.lua")),
        // Releases, and the undo of acquisitions whose reply was lost.
        sha(include_str!("../../../src/scripts/semaphore_release.lua")),
    ];
    let (records, counts, t0, fired) = run(
        &proxy,
        &clients,
        scripts,
        (secs, seed),
        move |client, owner, deadline, seed, counts| {
            plain_worker(&client.semaphore(NAME), owner, deadline, seed, counts)
        },
    );

    let overlaps = overlaps(&records, PERMITS, t0);
    let findings: usize = records.values().map(|r| r.findings.len()).sum();
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    figure(&format!(
        "randomized semaphore safety ({secs} s, seed {seed}): {} acquisitions, {} busy, \
         {} acquire errors, {} release errors, {fired} injected faults fired, {} violations",
        c(&counts.acquisitions),
        c(&counts.busy),
        c(&counts.acquire_errors),
        c(&counts.release_errors),
        overlaps.0 + findings
    ));
    assert!(c(&counts.acquisitions) > 0, "no permit was ever taken");
    assert!(fired > 0, "no fault was ever injected");
    verdict(seed, &overlaps, &records);
    // Every guard is released and nothing is left to settle: every permit
    // is back, and no acquisition is recorded as holding any.
    let records_key = format!("redlease_semaphore_permits:{{{NAME}}}");
    let left: HashMap<String, u64> = redis::cmd("HGETALL")
        .arg(&records_key)
        .query(&mut srv.conn())
        .expect("HGETALL");
    let available = admin.semaphore(NAME).available_permits().expect("count");
    assert!(
        left.is_empty() && available == PERMITS as i64,
        "permits leaked or doubled (seed {seed}): {available} available of {PERMITS}, \
         records left {left:?}"
    );
}

/// What a permit's guard claims: taken with `lease`, valid until
/// `valid_until()`.
fn expirable_worker(
    sem: &ExpirableSemaphore,
    owner: Owner,
    deadline: Instant,
    seed: u64,
    counts: &Counts,
) -> Record {
    let mut rng = Rng::new(seed);
    let mut rec = Record::default();
    while Instant::now() < deadline {
        let lease = pick_lease(&mut rng);
        let wait = rng.ms(0, 300);
        let kind = rng.below(3);
        let got = match kind {
            0 => sem.try_acquire(lease),
            1 => sem.try_acquire_for(wait, lease),
            _ => sem.try_acquire_until(Instant::now() + wait, lease),
        };
        let from = Instant::now();
        let p = match got {
            Ok(Some(p)) => p,
            Ok(None) => {
                count(&counts.busy);
                rec.note(format!("acquire {kind} ({lease:?}): busy"));
                continue;
            }
            Err(e) => {
                count(&counts.acquire_errors);
                rec.note(format!("acquire {kind} ({lease:?}): error {e}"));
                continue;
            }
        };
        count(&counts.acquisitions);
        rec.note(format!(
            "acquire {kind} ({lease:?}): {}, valid {:?}",
            p.id(),
            p.valid_until().saturating_duration_since(from)
        ));
        for _ in 0..=rng.below(5) {
            thread::sleep(rng.ms(0, 25)); // the critical section's work
            match rng.below(8) {
                0 | 1 => update(&p, pick_lease(&mut rng), owner, &mut rec, counts),
                2 => {
                    // Two updates at once: their replies may come in
                    // another order than they ran.
                    let (a, b) = (pick_lease(&mut rng), pick_lease(&mut rng));
                    let (ra, rb) = thread::scope(|s| {
                        let other = s.spawn(|| p.update_lease(b));
                        (
                            p.update_lease(a),
                            other.join().expect("the updating thread"),
                        )
                    });
                    for r in [&ra, &rb] {
                        count(&counts.updates);
                        if r.is_err() {
                            count(&counts.update_errors);
                        }
                    }
                    rec.note(format!(
                        "updates {a:?} {ra:?} and {b:?} {rb:?} at once, valid {:?}",
                        p.valid_until().saturating_duration_since(Instant::now())
                    ));
                }
                _ => {}
            }
        }
        give_back_permit(sem, p, from, owner, &mut rng, &mut rec, counts);
    }
    rec
}

/// Mostly short leases (some run out while held), some long.
fn pick_lease(rng: &mut Rng) -> Duration {
    match rng.below(4) {
        0 => rng.ms(20, 80),
        1 | 2 => rng.ms(80, 400),
        _ => rng.ms(1000, 3000),
    }
}

/// One lease update; a permit found not out by a reply that came back
/// before the guard's bound (read before the update) is a violation.
fn update(p: &Permit, lease: Duration, owner: Owner, rec: &mut Record, counts: &Counts) {
    let bound = p.valid_until();
    let r = p.update_lease(lease);
    let back = Instant::now();
    count(&counts.updates);
    rec.note(format!(
        "update {lease:?}: {r:?}, valid {:?}",
        p.valid_until().saturating_duration_since(back)
    ));
    if let Err(e) = &r {
        count(&counts.update_errors);
        if matches!(e, Error::PermitLost { .. }) && back < bound {
            rec.findings.push(format!(
                "owner {owner:?}: permit {} found not out {:?} before its guard's bound",
                p.id(),
                bound - back
            ));
        }
    }
}

/// How a permit's release went: its first answer (`Ok(true)`: it was out
/// and is back; `Ok(false)`: Redis says it was not out, or its lease had run
/// out), the calls it took, and whether the last one was answered.
type Released = (Result<bool, Error>, u32, bool);

/// Releases `p`: by its guard (dropped or released) or by id after
/// `forget` (tried again while it fails: it is idempotent), on this
/// thread or another. Records its span, which ends where the release
/// begins or at the guard's bound, whichever comes first; a first answer
/// that the permit was not out, back before that bound, is a violation.
fn give_back_permit(
    sem: &ExpirableSemaphore,
    p: Permit,
    from: Instant,
    owner: Owner,
    rng: &mut Rng,
    rec: &mut Record,
    counts: &Counts,
) {
    let how = rng.below(6);
    let id = p.id().to_owned();
    let sem = sem.clone();
    let release = move |p: Permit| -> (Instant, Instant, Released, Instant) {
        let start = Instant::now();
        let bound = p.valid_until();
        let mut back = None;
        let r = match how {
            0 | 3 => {
                drop(p);
                (Ok(true), 1, true)
            }
            1 | 4 => (p.release().map(|()| true), 1, true),
            _ => {
                let id = p.forget();
                let mut first = None;
                let mut calls = 0;
                let mut answered = false;
                while calls < 20 && !answered {
                    calls += 1;
                    let r = sem.release(&id);
                    back.get_or_insert_with(Instant::now);
                    answered = r.is_ok();
                    first.get_or_insert(r);
                }
                (first.expect("one call"), calls, answered)
            }
        };
        let r = match r {
            (Err(Error::PermitLost { .. }), calls, a) => (Ok(false), calls, a),
            other => other,
        };
        (start, bound, r, back.unwrap_or_else(Instant::now))
    };
    let (start, bound, (r, calls, answered), back) = if how < 3 {
        release(p)
    } else {
        thread::spawn(move || release(p))
            .join()
            .expect("the releasing thread")
    };
    let how = [
        "drop",
        "release",
        "release by id",
        "drop elsewhere",
        "release elsewhere",
        "release by id elsewhere",
    ][how as usize];
    rec.note(format!(
        "{how} {id}: {r:?} after {calls} call(s) (bound {:?} after the start)",
        bound.saturating_duration_since(start)
    ));
    if bound <= start {
        count(&counts.expired_held);
    }
    match &r {
        Ok(true) => {}
        Ok(false) => {
            count(&counts.release_errors);
            if back < bound {
                rec.findings.push(format!(
                    "owner {owner:?}: permit {id} released as not out (or expired) {:?} \
                     before its guard's bound",
                    bound - back
                ));
            }
        }
        Err(_) => count(&counts.release_errors),
    }
    if !answered {
        // Not a broken promise (the caller is to retry), but the permit
        // would stay out until its lease ends and fail the final check.
        rec.findings.push(format!(
            "owner {owner:?}: a release by id of permit {id} failed 20 times in a row"
        ));
    }
    let ends = if bound < start { ", to its bound" } else { "" };
    rec.spans.push(Span {
        owner,
        permits: 1,
        from,
        to: start.min(bound),
        how: format!("{how}{ends}"),
    });
}

#[test]
fn randomized_faults_never_let_expirable_permit_holders_exceed_the_permits() {
    const NAME: &str = "safety:psem";
    let (secs, seed) = settings("expirable semaphore");
    let srv = RedisServer::start();
    let proxy = Arc::new(Proxy::start(srv.addr()));
    let admin = Client::open(srv.url().as_str()).expect("admin client");
    let sem = admin.permit_expirable_semaphore(NAME);
    assert!(sem.try_set_permits(PERMITS).expect("set"));
    let clients = clients(&proxy);

    let lib = include_str!("../../../src/scripts/permit_lib.lua");
    let scripts = vec![
        sha(&format!(
            "{lib}{}",
            include_str!("../../../src/scripts/permit_acquire.lua")
        )),
        // Releases, and the undo of acquisitions whose reply was lost.
        sha(&format!(
            "{lib}{}",
            include_str!("../../../src/scripts/permit_release.lua")
        )),
        sha(&format!(
            "{lib}{}",
            include_str!("../../../src/scripts/permit_lease.lua")
        )),
    ];
    let (records, counts, t0, fired) = run(
        &proxy,
        &clients,
        scripts,
        (secs, seed),
        move |client, owner, deadline, seed, counts| {
            expirable_worker(
                &client.permit_expirable_semaphore(NAME),
                owner,
                deadline,
                seed,
                counts,
            )
        },
    );

    let overlaps = overlaps(&records, PERMITS, t0);
    let findings: usize = records.values().map(|r| r.findings.len()).sum();
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    figure(&format!(
        "randomized expirable semaphore safety ({secs} s, seed {seed}): {} acquisitions, \
         {} busy, {} acquire errors, {} lease updates ({} failed), {} held past their bound, \
         {} release errors, {fired} injected faults fired, {} violations",
        c(&counts.acquisitions),
        c(&counts.busy),
        c(&counts.acquire_errors),
        c(&counts.updates),
        c(&counts.update_errors),
        c(&counts.expired_held),
        c(&counts.release_errors),
        overlaps.0 + findings
    ));
    assert!(c(&counts.acquisitions) > 0, "no permit was ever taken");
    assert!(fired > 0, "no fault was ever injected");
    verdict(seed, &overlaps, &records);
    // Every guard is released and nothing is left to settle: no permit is
    // out (one left out would come back only when its lease ran out), and
    // every permit is back. Read directly, before anything counts expired
    // permits back.
    let out_key = format!("{{{NAME}}}:timeout");
    let mut conn = srv.conn();
    let out: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(&out_key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut conn)
        .expect("ZRANGE");
    let available: i64 = redis::cmd("GET").arg(NAME).query(&mut conn).expect("GET");
    let out: Vec<String> = out
        .iter()
        .map(|(id, expiry)| format!("{} (expiry {expiry})", hex(id)))
        .collect();
    assert!(
        out.is_empty() && available == PERMITS as i64,
        "permits leaked or doubled (seed {seed}): {available} available of {PERMITS}, \
         permits left out {out:?}"
    );
}

fn hex(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// Redis's clock in whole milliseconds (`TIME`), as the permit scripts read it.
fn redis_ms(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    secs * 1000 + micros / 1000
}

/// Found by the randomized test above (seed 201: a permit handed out again
/// 264 us before its holder's bound). A permit taken in millisecond `T` of
/// Redis's clock has the score `T + lease`, though it was taken at some
/// point within `T`; its guard's bound is the send time plus the lease. So
/// counting it back within millisecond `T + lease` (as a score at or below
/// the clock did) can come up to 1 ms before its lease ends, and before its
/// guard's bound: another caller takes the permit while the holder still
/// believes it holds it. It must come back only once that millisecond has
/// passed. The probe runs entirely within that millisecond (Redis's clock
/// read before and after it); a round whose probe misses it is made again.
/// What is checked is Redis's side, the one thing Redis can know (it does
/// not know when the request was sent): whether a failing probe also came
/// before this holder's bound depends on where in its millisecond the
/// permit was taken, and the message tells.
#[test]
fn an_expirable_permit_is_not_counted_back_within_the_millisecond_its_lease_ends() {
    const NAME: &str = "boundary:psem";
    let srv = RedisServer::start();
    let holder = Client::open(srv.url().as_str()).expect("client");
    let other = Client::open(srv.url().as_str()).expect("client");
    let sem = holder.permit_expirable_semaphore(NAME);
    assert!(sem.try_set_permits(1).expect("set"));
    let probe = other.permit_expirable_semaphore(NAME);
    let mut conn = srv.conn();
    let out_key = format!("{{{NAME}}}:timeout");
    for _round in 0..50 {
        let p = sem.try_acquire(Duration::from_millis(20)).expect("acquire");
        let p = p.expect("the only permit is free");
        let ends: u64 = redis::cmd("ZSCORE")
            .arg(&out_key)
            .arg(hex_to_raw(p.id()))
            .query(&mut conn)
            .expect("ZSCORE");
        // Wait for the last millisecond of the lease on Redis's clock.
        let mut now = redis_ms(&mut conn);
        let give_up = Instant::now() + Duration::from_secs(5);
        while now < ends {
            assert!(
                Instant::now() < give_up,
                "Redis's clock did not reach the permit's expiry {ends} (at {now})"
            );
            now = redis_ms(&mut conn);
        }
        let taken = probe.try_acquire(Duration::from_millis(20)).expect("probe");
        let probed = Instant::now();
        let after = redis_ms(&mut conn);
        if now == ends && after == ends {
            let bound = p.valid_until();
            assert!(
                taken.is_none(),
                "the permit was counted back and handed out again within millisecond \
                 {ends}, in which its lease may still run (its holder's bound {})",
                if bound > probed {
                    format!("was {:?} ahead when the probe returned", bound - probed)
                } else {
                    format!("had passed {:?} before the probe returned", probed - bound)
                }
            );
            return;
        }
        // The probe missed that millisecond: again, with a new permit.
        drop(taken);
        drop(p);
    }
    panic!("no probe ran within the millisecond a permit's lease ended, in 50 rounds");
}

fn hex_to_raw(id: &str) -> Vec<u8> {
    (0..id.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&id[i..i + 2], 16).expect("hex"))
        .collect()
}
