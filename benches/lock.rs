//! Lock throughput and hand-off latency, each beside the Redis limit measured
//! in the same run (issue 2). Run with `cargo bench --bench lock` (about
//! 1.5 minutes); the `SUMMARY:` lines at the end are the result.
//!
//! Redis runs on core 0, this process (and redis-benchmark) on core 1.
//!
//! 1. Redis limit: PING round trips on a raw `redis::Connection`; an
//!    uncontended acquire+release needs two round trips, so the floor is
//!    PING/s ÷ 2 pairs/s. Beside it: `redis-benchmark -c 1` with PING and with
//!    EVALSHA of a trivial script (the C client's view of the same limit);
//!    redlease's own two scripts sent on a raw connection (the floor including
//!    the scripts' server-side cost, without the library); Redisson's
//!    classic scripts (no cancel marker, no unlock latch) the same way, and
//!    its current ones (the release with an unlock latch, so that a retry
//!    after a lost reply is not applied twice: the protection redlease's
//!    release has), interleaved only; and the peer of issue 20, a raw non-reentrant lock (`SET NX PX`, Lua
//!    compare-and-delete) on one connection, interleaved only (goal:
//!    redlease at >= 0.95 of it). And two ceilings of any acquire + release
//!    sent as two scripts, beside that peer: two calls of a script that does
//!    nothing, and two that do nothing but take redlease's keys and
//!    arguments (what the arguments cost Redis before a script does any
//!    work).
//! 2. Uncontended `lock()` + drop (watchdog lock: registering with the
//!    watchdog is part of the cost) and `lock_with_lease()` + drop, in pairs/s
//!    and as a ratio to the floor (target >= 0.9).
//! 3. Hand-off: W waiter threads take turns on one lock (hold 1 ms, busy;
//!    after a release a thread does not compete again until another thread
//!    has acquired, waiting at most 1 s for that). A sample is the time from
//!    just before the release call to the return of the next holder's
//!    acquire (`try_lock_for(10 s)`, so a broken run cannot hang). Run with
//!    one `Client` shared by all threads (a release wakes one waiter of the
//!    process) and with one `Client` per thread (a release wakes one waiter
//!    per client, as with separate processes).
//!
//! (1) and (2) are measured twice: by criterion (one routine after the other;
//! `SUMMARY:` shows the median of its per-sample rates, warm-up excluded),
//! and interleaved: 60 rounds in which every routine runs a 20 ms burst, in
//! rotating order, so a change in machine load hits all of them alike; the
//! interleaved ratios are medians of per-round ratios, and the targets are
//! judged on them. The
//! `DIAG:` lines break an operation down: wall time, client and Redis CPU,
//! Redis's own execution time per command (INFO commandstats), round trips
//! (`ClientStats`), NOSCRIPT reloads (EVAL calls), wake-ups of redlease's
//! background threads, and the r2d2 checkout cost.

mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use support::{Mode, RedisServer};

const ACQUIRE_LUA: &str = concat!(
    include_str!("../src/scripts/queue_lib.lua"),
    include_str!("../src/scripts/acquire.lua")
);
/// The usual release: release_full.lua, with its library as the client
/// sends it.
const RELEASE_LUA: &str = concat!(
    include_str!("../src/scripts/queue_lib.lua"),
    include_str!("../src/scripts/queue_wake.lua"),
    include_str!("../src/scripts/release_full.lua")
);
const TRIVIAL_LUA: &str = "return 1";

/// Lease of `lock_with_lease` and the client's watchdog timeout (default).
const LEASE: Duration = Duration::from_secs(30);
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(5);
const HOLD: Duration = Duration::from_millis(1);

/// One criterion call of a routine: (started, iterations, elapsed).
type Call = (Instant, u64, Duration);

/// Every criterion call of each routine.
#[derive(Default)]
struct Rates {
    calls: RefCell<BTreeMap<&'static str, Vec<Call>>>,
}

impl Rates {
    fn record(&self, name: &'static str, started: Instant, iters: u64, elapsed: Duration) {
        self.calls
            .borrow_mut()
            .entry(name)
            .or_default()
            .push((started, iters, elapsed));
    }

    /// Operations per second: the median of the per-sample rates, leaving
    /// out the calls of criterion's warm-up (all calls if that leaves none).
    fn rate(&self, name: &str) -> Option<f64> {
        let calls = self.calls.borrow();
        let calls = calls.get(name)?;
        let first = calls.first()?.0;
        let measured: Vec<_> = calls
            .iter()
            .filter(|(at, _, _)| at.duration_since(first) >= WARM_UP)
            .collect();
        let used = if measured.is_empty() {
            calls.iter().collect()
        } else {
            measured
        };
        let mut rates: Vec<f64> = used
            .iter()
            .filter(|(_, _, el)| !el.is_zero())
            .map(|(_, n, el)| *n as f64 / el.as_secs_f64())
            .collect();
        if rates.is_empty() {
            return None;
        }
        rates.sort_by(f64::total_cmp);
        Some(rates[rates.len() / 2])
    }
}

/// Times `iters` runs of `op` and records them under `name`.
fn timed(rates: &Rates, name: &'static str, iters: u64, mut op: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..iters {
        op();
    }
    let elapsed = started.elapsed();
    rates.record(name, started, iters, elapsed);
    elapsed
}

/// Redisson's classic RLock scripts (before unlock latches), for comparison:
/// no cancel marker on acquire, no latch key on release. Its current acquire
/// is the same script.
const CLASSIC_ACQUIRE_LUA: &str = "\
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1); \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return nil; \
end; \
return redis.call('pttl', KEYS[1]);";
const CLASSIC_RELEASE_LUA: &str = "\
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
    return nil; \
end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
if (counter > 0) then \
    redis.call('pexpire', KEYS[1], ARGV[2]); \
    return 0; \
else \
    redis.call('del', KEYS[1]); \
    redis.call('publish', KEYS[2], ARGV[1]); \
    return 1; \
end;";

/// Redisson's current RLock release (`unlockInnerAsync`, 3.2x): the answer
/// is kept in an unlock latch, so that a retry after a lost reply returns it
/// again rather than applying the release twice.
const CURRENT_RELEASE_LUA: &str = "\
local val = redis.call('get', KEYS[3]); \
if val ~= false then return tonumber(val); end; \
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then \
    return nil; \
end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
if (counter > 0) then \
    redis.call('pexpire', KEYS[1], ARGV[2]); \
    redis.call('set', KEYS[3], 0, 'px', ARGV[5]); \
    return 0; \
else \
    redis.call('del', KEYS[1]); \
    redis.call(ARGV[4], KEYS[2], ARGV[1]); \
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]); \
    return 1; \
end;";

/// The peer of issue 20: a raw non-reentrant lock on one connection, `SET
/// NX PX` to acquire and a Lua compare-and-delete to release (no re-entry,
/// no lost-reply protection, no waking of waiters): what a lock costs with
/// the least work Redis can do for it in two round trips.
struct NonReentrant {
    cad_sha: String,
    name: String,
    token: String,
}

const CAD_LUA: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end \
return 0";

impl NonReentrant {
    fn new(conn: &mut redis::Connection, name: &str) -> NonReentrant {
        NonReentrant {
            cad_sha: support::script_load(conn, CAD_LUA),
            name: name.to_owned(),
            token: "00000000-0000-0000-0000-000000000000:1".to_owned(),
        }
    }

    fn run(&mut self, conn: &mut redis::Connection) {
        let set: Option<String> = redis::cmd("SET")
            .arg(&self.name)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(LEASE.as_millis() as u64)
            .query(conn)
            .expect("SET NX PX");
        assert!(set.is_some(), "the non-reentrant lock was busy");
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&self.cad_sha)
            .arg(1)
            .arg(&self.name)
            .arg(&self.token)
            .query(conn)
            .expect("compare-and-delete");
        assert_eq!(deleted, 1, "the non-reentrant release deleted nothing");
    }
}

/// Whose scripts a [`RawPair`] sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scripts {
    Redlease,
    /// Redisson's classic ones.
    Classic,
    /// Redisson's current ones (the release with an unlock latch).
    Current,
    /// Two scripts that do nothing, sent with redlease's keys and arguments
    /// (what the arguments alone cost, beside any work the scripts do).
    Hollow,
}

/// One raw acquire + release (two EVALSHA round trips on a raw connection),
/// with redlease's scripts and argument shapes, or Redisson's.
struct RawPair {
    scripts: Scripts,
    acquire_sha: String,
    release_sha: String,
    name: String,
    channel: String,
    field: String,
    n: u64,
}

impl RawPair {
    fn new(conn: &mut redis::Connection, name: &str, scripts: Scripts) -> RawPair {
        let (acquire, release) = match scripts {
            Scripts::Redlease => (ACQUIRE_LUA, RELEASE_LUA),
            Scripts::Classic => (CLASSIC_ACQUIRE_LUA, CLASSIC_RELEASE_LUA),
            Scripts::Current => (CLASSIC_ACQUIRE_LUA, CURRENT_RELEASE_LUA),
            Scripts::Hollow => ("return nil", "return 1"),
        };
        RawPair {
            scripts,
            acquire_sha: support::script_load(conn, acquire),
            release_sha: support::script_load(conn, release),
            name: name.to_owned(),
            channel: format!("redisson_lock__channel:{{{name}}}"),
            field: "00000000-0000-0000-0000-000000000000:1".to_owned(),
            n: 0,
        }
    }

    fn run(&mut self, conn: &mut redis::Connection) {
        self.n += 1;
        let lease_ms = LEASE.as_millis() as u64;
        let mut acquire = redis::cmd("EVALSHA");
        let mut release = redis::cmd("EVALSHA");
        if !matches!(self.scripts, Scripts::Redlease | Scripts::Hollow) {
            acquire
                .arg(&self.acquire_sha)
                .arg(1)
                .arg(&self.name)
                .arg(lease_ms)
                .arg(&self.field);
            release.arg(&self.release_sha);
            if self.scripts == Scripts::Classic {
                release
                    .arg(2)
                    .arg(&self.name)
                    .arg(&self.channel)
                    .arg(0)
                    .arg(lease_ms)
                    .arg(&self.field);
            } else {
                // Redisson's latch: the lock's name and a request id.
                let latch = format!(
                    "redisson_unlock_latch:{{{}}}:{}:{}",
                    self.name, self.field, self.n
                );
                release
                    .arg(3)
                    .arg(&self.name)
                    .arg(&self.channel)
                    .arg(latch)
                    .arg(0)
                    .arg(lease_ms)
                    .arg(&self.field)
                    .arg("publish")
                    .arg(8000);
            }
        } else {
            let cancel = format!(
                "redlease_acquire_cancel:{{{}}}:{}:{}",
                self.name, self.field, self.n
            );
            acquire
                .arg(&self.acquire_sha)
                .arg(2)
                .arg(&self.name)
                .arg(cancel)
                .arg(lease_ms)
                .arg(&self.field)
                .arg(self.n); // generation (the count, 1, is left out)
            release
                .arg(&self.release_sha)
                .arg(3)
                .arg(&self.name)
                .arg(&self.channel)
                .arg(format!("redlease_waiting:{{{0}}}:{0}", self.name))
                .arg(&self.field)
                .arg(self.n);
        }
        let acquired: Option<i64> = acquire.query(conn).expect("raw acquire");
        assert_eq!(acquired, None, "raw acquire found the lock busy");
        let released: Option<i64> = release.query(conn).expect("raw release");
        assert_eq!(released, Some(1), "raw release did not release");
    }
}

fn bench_redis_limit(c: &mut Criterion, server: &RedisServer, rates: &Rates) {
    let mut conn = server.conn();
    let trivial = support::script_load(&mut conn, TRIVIAL_LUA);
    let mut pair = RawPair::new(&mut conn, "bench:raw", Scripts::Redlease);
    let mut classic = RawPair::new(&mut conn, "bench:raw-classic", Scripts::Classic);
    let mut group = c.benchmark_group("redis_limit");
    group.throughput(Throughput::Elements(1));
    group.bench_function("ping", |b| {
        b.iter_custom(|iters| {
            timed(rates, "ping", iters, || {
                redis::cmd("PING").query::<()>(&mut conn).expect("PING");
            })
        })
    });
    group.bench_function("evalsha_trivial", |b| {
        b.iter_custom(|iters| {
            timed(rates, "evalsha_trivial", iters, || {
                redis::cmd("EVALSHA")
                    .arg(&trivial)
                    .arg(0)
                    .query::<()>(&mut conn)
                    .expect("EVALSHA trivial");
            })
        })
    });
    group.bench_function("acquire_release_scripts_raw", |b| {
        b.iter_custom(|iters| timed(rates, "raw_pair", iters, || pair.run(&mut conn)))
    });
    group.bench_function("acquire_release_classic_scripts_raw", |b| {
        b.iter_custom(|iters| timed(rates, "classic_pair", iters, || classic.run(&mut conn)))
    });
    group.finish();
}

fn bench_redlease(c: &mut Criterion, client: &redlease::Client, rates: &Rates) {
    let lock = client.lock("bench:uncontended");
    let mut group = c.benchmark_group("redlease");
    group.throughput(Throughput::Elements(1));
    group.bench_function("lock_unlock_watchdog", |b| {
        b.iter_custom(|iters| {
            timed(rates, "watchdog_pair", iters, || {
                let g = lock.lock().expect("lock");
                drop(g);
            })
        })
    });
    group.bench_function("lock_with_lease_unlock", |b| {
        b.iter_custom(|iters| {
            timed(rates, "lease_pair", iters, || {
                let g = lock.lock_with_lease(LEASE).expect("lock_with_lease");
                drop(g);
            })
        })
    });
    group.finish();
}

/// Runs `redis-benchmark -c 1` with one custom command; requests per second.
fn redis_benchmark(server: &RedisServer, requests: u64, command: &[&str]) -> Option<f64> {
    let out = support::redis_benchmark_command()
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(["-c", "1", "-n", &requests.to_string(), "-q"])
        .args(command)
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            println!("DIAG: cannot run redis-benchmark: {e}");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = text
        .split(['\r', '\n'])
        .filter_map(|seg| seg.split_once("requests per second"))
        .filter_map(|(before, _)| before.split_whitespace().last()?.parse::<f64>().ok())
        .next_back();
    if rate.is_none() {
        println!(
            "DIAG: could not parse redis-benchmark output ({}): {text:?} {:?}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    rate
}

/// Runs `op` for `span` and prints, per operation: client CPU, Redis CPU,
/// Redis's own EVALSHA execution time, round trips, script reloads, and
/// wake-ups of redlease's background threads.
fn diagnose(
    server: &RedisServer,
    what: &str,
    span: Duration,
    client: Option<&redlease::Client>,
    mut op: impl FnMut(),
) {
    let redis_pid = server.pid().expect("redis-server runs");
    let stats0 = support::command_stats(server);
    let rt0 = client.map_or(0, |c| c.stats().round_trips);
    let wake0 = support::thread_switches("redlease-");
    let cpu0 = support::cpu_time();
    let rcpu0 = support::cpu_time_of(redis_pid);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < span {
        for _ in 0..100 {
            op();
        }
        n += 100;
    }
    let elapsed = start.elapsed();
    let cpu = support::cpu_time().saturating_sub(cpu0);
    let rcpu = support::cpu_time_of(redis_pid).saturating_sub(rcpu0);
    let wake = support::thread_switches("redlease-").saturating_sub(wake0);
    let rt = client.map_or(0, |c| c.stats().round_trips) - rt0;
    let stats1 = support::command_stats(server);
    // Per command: (calls, usec) during the run.
    let delta = |name: &str| {
        let (c0, u0) = stats0.get(name).copied().unwrap_or((0, 0));
        let (c1, u1) = stats1.get(name).copied().unwrap_or((0, 0));
        (c1.saturating_sub(c0), u1.saturating_sub(u0))
    };
    let evalsha = delta("evalsha");
    let eval = delta("eval").0;
    let per_op = |x: f64| x / n as f64;
    let us = |d: Duration| per_op(d.as_secs_f64() * 1e6);
    println!(
        "DIAG: {what:<34} | {:>6.0} ops/s | per op: wall {:>5.1} us, client CPU {:>5.1} us, \
         redis CPU {:>5.1} us, EVALSHA {:.2} x {:>4.1} us exec | {} round trips | {:.4} EVAL \
         (NOSCRIPT reloads) | {:.3} redlease thread wake-ups",
        n as f64 / elapsed.as_secs_f64(),
        us(elapsed),
        us(cpu),
        us(rcpu),
        per_op(evalsha.0 as f64),
        if evalsha.0 > 0 {
            evalsha.1 as f64 / evalsha.0 as f64
        } else {
            0.0
        },
        client.map_or_else(|| "-".to_owned(), |_| format!("{:.2}", per_op(rt as f64))),
        per_op(eval as f64),
        per_op(wake as f64),
    );
    // Redis's execution time per op, by command (those run inside scripts
    // included; EVALSHA's own figure includes them).
    let mut by_command: Vec<(String, u64, u64)> = stats1
        .keys()
        .filter(|name| name.as_str() != "info")
        .map(|name| {
            let (calls, usec) = delta(name);
            (name.clone(), calls, usec)
        })
        .filter(|(_, calls, _)| *calls > 0)
        .collect();
    by_command.sort_by_key(|c| std::cmp::Reverse(c.2));
    let parts: Vec<String> = by_command
        .iter()
        .map(|(name, calls, usec)| {
            format!(
                "{name} {:.2}x{:.2}us",
                per_op(*calls as f64),
                *usec as f64 / *calls as f64
            )
        })
        .collect();
    println!(
        "DIAG: {what:<34} | redis exec per op by command: {}",
        parts.join(", ")
    );
}

/// A raw connection with TCP_NODELAY (redis-rs leaves Nagle on by default,
/// and so do redlease's pooled connections).
fn nodelay_conn(server: &RedisServer) -> redis::Connection {
    use redis::IntoConnectionInfo;
    let info = server
        .url()
        .into_connection_info()
        .expect("url")
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    redis::Client::open(info)
        .expect("client")
        .get_connection()
        .expect("connect")
}

/// An r2d2 manager whose connections cost nothing: measures the pool's own
/// checkout + check-in with redlease's settings.
struct NullManager;

impl r2d2::ManageConnection for NullManager {
    type Connection = ();
    type Error = std::io::Error;
    fn connect(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn is_valid(&self, _: &mut ()) -> std::io::Result<()> {
        Ok(())
    }
    fn has_broken(&self, _: &mut ()) -> bool {
        false
    }
}

/// Nanoseconds per r2d2 checkout + check-in (test_on_check_out, min_idle 1,
/// max 16, as redlease configures it).
fn pool_checkout_ns(span: Duration) -> f64 {
    let pool = r2d2::Pool::builder()
        .max_size(16)
        .min_idle(Some(1))
        .test_on_check_out(true)
        .build(NullManager)
        .expect("null pool");
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < span {
        for _ in 0..1000 {
            drop(pool.get().expect("checkout"));
        }
        n += 1000;
    }
    start.elapsed().as_secs_f64() * 1e9 / n as f64
}

struct HandoffState {
    last: usize,
    released_at: Option<Instant>,
    measuring: bool,
    stop: bool,
    warm_acquisitions: u64,
    acquisitions: u64,
    samples: Vec<Duration>,
    stalls: u64,
    timeouts: u64,
}

struct Handoff {
    state: Mutex<HandoffState>,
    /// Notified on every acquisition (the last releaser waits on it).
    acquired: Condvar,
    /// Notified when the warm-up or the measurement has enough.
    main: Condvar,
}

struct HandoffResult {
    label: String,
    waiters: usize,
    samples: Vec<Duration>,
    acquisitions: u64,
    elapsed: Duration,
    stalls: u64,
    timeouts: u64,
}

/// One hand-off run; `per_thread_client` gives each waiter its own Client;
/// `fenced`: of a fenced lock.
fn handoff(
    server: &RedisServer,
    waiters: usize,
    per_thread_client: bool,
    fenced: bool,
    warm_up: u64,
    target: usize,
) -> HandoffResult {
    let label = format!(
        "W={waiters} {}{}",
        if per_thread_client {
            "one Client per thread"
        } else {
            "one shared Client"
        },
        if fenced { ", fenced lock" } else { "" }
    );
    let name = format!("bench:handoff:{waiters}:{per_thread_client}:{fenced}");
    let shared_client = (!per_thread_client).then(|| {
        redlease::Client::builder(server.url())
            .pool_size(waiters as u32 + 2)
            .build()
            .expect("client")
    });
    let h = Handoff {
        state: Mutex::new(HandoffState {
            last: usize::MAX,
            released_at: None,
            measuring: false,
            stop: false,
            warm_acquisitions: 0,
            acquisitions: 0,
            samples: Vec::with_capacity(target + waiters),
            stalls: 0,
            timeouts: 0,
        }),
        acquired: Condvar::new(),
        main: Condvar::new(),
    };
    let barrier = Barrier::new(waiters + 1);
    let (elapsed, state) = std::thread::scope(|s| {
        for me in 0..waiters {
            let (h, barrier, name, shared_client) = (&h, &barrier, &name, &shared_client);
            s.spawn(move || {
                let client = match shared_client {
                    Some(c) => c.clone(),
                    None => redlease::Client::open(server.url()).expect("client"),
                };
                let lock = if fenced {
                    client.fenced_lock(name.as_str())
                } else {
                    client.lock(name.as_str())
                };
                barrier.wait();
                waiter(h, &lock, me, warm_up, target);
            });
        }
        barrier.wait();
        let mut st = h.state.lock().unwrap();
        // Warm-up, then measure; both bounded so a broken run still ends.
        let (guard, _) = h
            .main
            .wait_timeout_while(st, Duration::from_secs(60), |st| {
                st.warm_acquisitions < warm_up
            })
            .unwrap();
        st = guard;
        st.measuring = true;
        let started = Instant::now();
        let (guard, _) = h
            .main
            .wait_timeout_while(st, Duration::from_secs(120), |st| st.samples.len() < target)
            .unwrap();
        st = guard;
        let elapsed = started.elapsed();
        st.measuring = false;
        st.stop = true;
        let acquisitions = st.acquisitions;
        let samples = std::mem::take(&mut st.samples);
        let (stalls, timeouts) = (st.stalls, st.timeouts);
        drop(st);
        h.acquired.notify_all();
        (elapsed, (acquisitions, samples, stalls, timeouts))
    });
    let (acquisitions, mut samples, stalls, timeouts) = state;
    samples.sort();
    HandoffResult {
        label,
        waiters,
        samples,
        acquisitions,
        elapsed,
        stalls,
        timeouts,
    }
}

fn waiter(h: &Handoff, lock: &redlease::Lock, me: usize, warm_up: u64, target: usize) {
    loop {
        let guard = match lock
            .try_lock_for(Duration::from_secs(10))
            .expect("try_lock_for")
        {
            Some(g) => g,
            None => {
                let mut st = h.state.lock().unwrap();
                st.timeouts += 1;
                if st.stop {
                    return;
                }
                continue;
            }
        };
        let now = Instant::now();
        {
            let mut st = h.state.lock().unwrap();
            let released_at = st.released_at.take();
            st.last = me;
            if st.stop {
                drop(st);
                drop(guard);
                return;
            }
            if st.measuring {
                st.acquisitions += 1;
                if let Some(t) = released_at {
                    st.samples.push(now.duration_since(t));
                }
                if st.samples.len() == target {
                    h.main.notify_all();
                }
            } else {
                st.warm_acquisitions += 1;
                if st.warm_acquisitions == warm_up {
                    h.main.notify_all();
                }
            }
        }
        h.acquired.notify_all();
        let until = Instant::now() + HOLD;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        h.state.lock().unwrap().released_at = Some(Instant::now());
        drop(guard);
        // Do not compete again until another thread has taken the lock.
        let st = h.state.lock().unwrap();
        let (mut st, wait) = h
            .acquired
            .wait_timeout_while(st, Duration::from_secs(1), |st| st.last == me && !st.stop)
            .unwrap();
        if wait.timed_out() {
            st.stalls += 1;
        }
        if st.stop {
            return;
        }
    }
}

/// Per-round rates (ops/s) of each variant, measured in short bursts that
/// take turns (the order rotates every round), so that a change in machine
/// load hits every variant alike; ratios are taken within a round.
type Rounds = BTreeMap<&'static str, Vec<f64>>;

fn interleaved(
    rounds: usize,
    burst: Duration,
    variants: &mut [(&'static str, &mut dyn FnMut())],
) -> Rounds {
    let mut out = Rounds::new();
    let k = variants.len();
    for round in 0..rounds {
        for j in 0..k {
            let (name, op) = &mut variants[(round + j) % k];
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < burst {
                for _ in 0..10 {
                    op();
                }
                n += 10;
            }
            let rate = n as f64 / start.elapsed().as_secs_f64();
            out.entry(*name).or_default().push(rate);
        }
    }
    out
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

/// Median over rounds of `name`'s rate.
fn round_rate(rounds: &Rounds, name: &str) -> Option<f64> {
    median(rounds.get(name)?.clone())
}

/// Median over rounds of `name`'s rate divided by `base`'s rate (times
/// `scale`) in the same round.
fn round_ratio(rounds: &Rounds, name: &str, base: &str, scale: f64) -> Option<f64> {
    let (a, b) = (rounds.get(name)?, rounds.get(base)?);
    median(a.iter().zip(b).map(|(x, y)| x / (y * scale)).collect())
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.0}"))
}

fn fmt_ratio(r: Option<f64>, floor: Option<f64>) -> String {
    match (r, floor) {
        (Some(r), Some(f)) if f > 0.0 => format!("{:.2}", r / f),
        _ => "n/a".to_owned(),
    }
}

/// An event handler that counts acquisitions and releases.
#[derive(Default)]
struct Counting(std::sync::atomic::AtomicU64);

impl redlease::HandleEvent for Counting {
    fn handle_acquire(&self, _: redlease::AcquireEvent<'_>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn handle_release(&self, _: redlease::ReleaseEvent<'_>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Acquire + release pairs counted in `--redis-instructions` mode.
const INSTRUCTION_PAIRS: u64 = 2_000;

/// `--redis-instructions`: with Redis under callgrind (see
/// `support::callgrind_out`), the instructions Redis runs per acquire +
/// release for the peer, Redisson's current scripts sent raw and redlease
/// (both kinds of lease): counts that do not move with the machine's load.
fn redis_instructions_run() {
    let server = support::start_server();
    let client = redlease::Client::open(server.url()).expect("client");
    let mut conn = server.conn();
    let mut peer = NonReentrant::new(&mut conn, "bench:ri:nonreentrant");
    let mut current = RawPair::new(&mut conn, "bench:ri:current", Scripts::Current);
    let mut hollow = RawPair::new(&mut conn, "bench:ri:hollow", Scripts::Hollow);
    let lock = client.lock("bench:ri:redlease");
    let count = |name: &str, op: &mut dyn FnMut()| {
        // Warmed up first: connections made, scripts loaded.
        for _ in 0..100 {
            op();
        }
        let n = support::redis_instructions(&server, || {
            for _ in 0..INSTRUCTION_PAIRS {
                op();
            }
        });
        let per_pair = n as f64 / INSTRUCTION_PAIRS as f64;
        println!("COUNT: {name} {per_pair:.0}");
        per_pair
    };
    let peer = count("peer", &mut || peer.run(&mut conn));
    let current = count("current", &mut || current.run(&mut conn));
    let hollow = count("hollow", &mut || hollow.run(&mut conn));
    let lease = count("lease", &mut || {
        drop(lock.lock_with_lease(LEASE).expect("lock_with_lease"))
    });
    let watchdog = count("watchdog", &mut || drop(lock.lock().expect("lock")));
    println!(
        "SUMMARY: redis instructions per acquire + release (callgrind, {INSTRUCTION_PAIRS} pairs) | \
         peer (SET NX PX + compare-and-delete) {peer:.0} | Redisson current scripts raw {current:.0} \
         ({:.2} x peer) | redlease lock_with_lease()+drop {lease:.0} ({:.2} x peer, {:.2} x current) | \
         lock()+drop {watchdog:.0} ({:.2} x peer, {:.2} x current) | \
         two scripts that do nothing with redlease's keys and arguments {hollow:.0} ({:.2} x peer)",
        current / peer,
        lease / peer,
        lease / current,
        watchdog / peer,
        watchdog / current,
        hollow / peer,
    );
}

/// Acquire + release pairs counted in `--instructions` mode.
const CLIENT_INSTRUCTION_PAIRS: u64 = 5_000;

/// `--instructions` (run under callgrind by `scripts/bench_compare.sh`'s
/// pseudo-bench `lock-instructions`, instrumentation off until the file
/// `REDLEASE_BENCH_GO` names exists): [`CLIENT_INSTRUCTION_PAIRS`]
/// `lock_with_lease()` + drop pairs, the client's own work per pair (all
/// its threads; the idle watchdog and subscriber threads included), a
/// count that does not move with the machine's load.
fn client_instructions_run() {
    let server = support::start_server();
    let client = redlease::Client::open(server.url()).expect("client");
    let lock = client.lock("bench:ci:redlease");
    // Warmed up first: connections made, scripts loaded.
    for _ in 0..200 {
        drop(lock.lock_with_lease(LEASE).expect("lock_with_lease"));
    }
    support::instructions_window(|| {
        for _ in 0..CLIENT_INSTRUCTION_PAIRS {
            drop(lock.lock_with_lease(LEASE).expect("lock_with_lease"));
        }
        println!("PAIRS: {CLIENT_INSTRUCTION_PAIRS}");
    });
}

fn main() {
    if std::env::args().any(|a| a == "--redis-instructions") {
        return redis_instructions_run();
    }
    if std::env::args().any(|a| a == "--instructions") {
        return client_instructions_run();
    }
    support::pin_self();
    let mode = support::mode();
    let full = mode == Mode::Bench;
    println!("LOAD: {}", support::load_average());
    let server = support::start_server();
    let rates = Rates::default();

    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(WARM_UP)
        .measurement_time(MEASURE)
        .configure_from_args();
    bench_redis_limit(&mut c, &server, &rates);
    let client = redlease::Client::open(server.url()).expect("client");
    // The same with an event handler that counts what it hears: what the
    // events cost when someone listens (without one, nothing is measured).
    let observed = redlease::Client::builder(server.url())
        .event_handler(Counting::default())
        .build()
        .expect("client");
    bench_redlease(&mut c, &client, &rates);
    c.final_summary();
    if mode == Mode::List {
        return;
    }

    let requests = if full { 100_000 } else { 2_000 };
    let rb_ping = redis_benchmark(&server, requests, &["PING"]);
    let trivial = support::script_load(&mut server.conn(), TRIVIAL_LUA);
    let rb_evalsha = redis_benchmark(&server, requests, &["EVALSHA", &trivial, "0"]);

    let (rounds_n, burst) = if full {
        (60, Duration::from_millis(20))
    } else {
        (2, Duration::from_millis(5))
    };
    let rounds = {
        let mut c1 = server.conn();
        let mut c2 = server.conn();
        let mut c3 = server.conn();
        let mut c4 = server.conn();
        let mut c5 = server.conn();
        let mut c6 = server.conn();
        let trivial = support::script_load(&mut c2, TRIVIAL_LUA);
        let mut nonreentrant = NonReentrant::new(&mut c5, "bench:il:nonreentrant");
        let mut pair = RawPair::new(&mut c3, "bench:il:raw", Scripts::Redlease);
        let mut classic = RawPair::new(&mut c4, "bench:il:classic", Scripts::Classic);
        let mut current = RawPair::new(&mut c6, "bench:il:current", Scripts::Current);
        let mut c7 = server.conn();
        let mut hollow = RawPair::new(&mut c7, "bench:il:hollow", Scripts::Hollow);
        let lock = client.lock("bench:il:redlease");
        let observed = observed.lock("bench:il:observed");
        let mut ping = || redis::cmd("PING").query::<()>(&mut c1).expect("PING");
        let mut evalsha = || {
            redis::cmd("EVALSHA")
                .arg(&trivial)
                .arg(0)
                .query::<()>(&mut c2)
                .expect("EVALSHA")
        };
        let mut raw = || pair.run(&mut c3);
        let mut classic = || classic.run(&mut c4);
        let mut current = || current.run(&mut c6);
        let mut hollow = || hollow.run(&mut c7);
        let mut nonreentrant = || nonreentrant.run(&mut c5);
        let mut watchdog = || drop(lock.lock().expect("lock"));
        let mut lease = || drop(lock.lock_with_lease(LEASE).expect("lock_with_lease"));
        let mut events = || drop(observed.lock().expect("lock"));
        interleaved(
            rounds_n,
            burst,
            &mut [
                ("ping", &mut ping),
                ("evalsha_trivial", &mut evalsha),
                ("raw_pair", &mut raw),
                ("classic_pair", &mut classic),
                ("current_pair", &mut current),
                ("hollow_pair", &mut hollow),
                ("nonreentrant_pair", &mut nonreentrant),
                ("watchdog_pair", &mut watchdog),
                ("lease_pair", &mut lease),
                ("events_pair", &mut events),
            ],
        )
    };

    let span = if full {
        Duration::from_secs(2)
    } else {
        Duration::from_millis(100)
    };
    {
        let mut conn = server.conn();
        let trivial = support::script_load(&mut conn, TRIVIAL_LUA);
        diagnose(&server, "PING (1 round trip)", span, None, || {
            redis::cmd("PING").query::<()>(&mut conn).expect("PING")
        });
        diagnose(
            &server,
            "EVALSHA trivial (1 round trip)",
            span,
            None,
            || {
                redis::cmd("EVALSHA")
                    .arg(&trivial)
                    .arg(0)
                    .query::<()>(&mut conn)
                    .expect("EVALSHA")
            },
        );
        let mut pair = RawPair::new(&mut conn, "bench:diag:raw", Scripts::Redlease);
        diagnose(&server, "raw redlease scripts pair", span, None, || {
            pair.run(&mut conn)
        });
        let mut classic = RawPair::new(&mut conn, "bench:diag:classic", Scripts::Classic);
        diagnose(
            &server,
            "raw classic Redisson scripts pair",
            span,
            None,
            || classic.run(&mut conn),
        );
        let mut nd = nodelay_conn(&server);
        diagnose(&server, "PING, TCP_NODELAY", span, None, || {
            redis::cmd("PING").query::<()>(&mut nd).expect("PING")
        });
        let mut pair = RawPair::new(&mut nd, "bench:diag:raw-nodelay", Scripts::Redlease);
        diagnose(
            &server,
            "raw redlease scripts pair, NODELAY",
            span,
            None,
            || pair.run(&mut nd),
        );
    }
    println!(
        "DIAG: r2d2 checkout + check-in of a no-op connection (redlease's pool settings): {:.0} ns",
        pool_checkout_ns(span.min(Duration::from_secs(1)))
    );
    let lock = client.lock("bench:diag:redlease");
    diagnose(&server, "redlease lock()+drop", span, Some(&client), || {
        drop(lock.lock().expect("lock"))
    });
    diagnose(
        &server,
        "redlease lock_with_lease()+drop",
        span,
        Some(&client),
        || drop(lock.lock_with_lease(LEASE).expect("lock_with_lease")),
    );
    println!("DIAG: client stats after: {:?}", client.stats());
    drop(client);
    drop(observed);

    let (warm_up, target) = if full { (200, 2_500) } else { (20, 50) };
    let mut handoffs = Vec::new();
    // The fenced lock's hand-off inside one client, beside the plain one's.
    let runs = [
        (4, false, false),
        (4, false, true),
        (4, true, false),
        (16, false, false),
        (16, true, false),
    ];
    for (waiters, per_thread, fenced) in runs {
        let r = handoff(&server, waiters, per_thread, fenced, warm_up, target);
        println!(
            "DIAG: hand-off {}: {} samples, {} acquisitions in {:.2} s, {} stalls (no other \
                 thread acquired within 1 s of a release), {} acquire timeouts",
            r.label,
            r.samples.len(),
            r.acquisitions,
            r.elapsed.as_secs_f64(),
            r.stalls,
            r.timeouts
        );
        handoffs.push(r);
    }

    let ping = rates.rate("ping");
    let floor = ping.map(|p| p / 2.0);
    let il_ping = round_rate(&rounds, "ping");
    let il_floor = il_ping.map(|p| p / 2.0);
    let rtt = il_ping.or(ping).map(|p| Duration::from_secs_f64(1.0 / p));
    let pass = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!();
    println!(
        "SUMMARY: lock bench ({mode:?} mode); load average at end: {}",
        support::load_average()
    );
    println!(
        "SUMMARY: figures: 'interleaved' = median over {rounds_n} rounds of {burst:?} bursts taking turns \
         (ratios taken within a round: robust to load changes); 'criterion' = median of criterion's samples"
    );
    println!(
        "SUMMARY: redis limit | PING round trip, redis-rs raw connection | interleaved {} PING/s, RTT {} ms | criterion {} PING/s",
        fmt_rate(il_ping),
        rtt.map_or_else(|| "n/a".to_owned(), support::ms),
        fmt_rate(ping),
    );
    println!(
        "SUMMARY: redis limit | EVALSHA trivial, redis-rs raw connection | interleaved {} calls/s | criterion {} calls/s",
        fmt_rate(round_rate(&rounds, "evalsha_trivial")),
        fmt_rate(rates.rate("evalsha_trivial"))
    );
    println!(
        "SUMMARY: redis limit | redis-benchmark -c 1 PING | {} req/s",
        fmt_rate(rb_ping)
    );
    println!(
        "SUMMARY: redis limit | redis-benchmark -c 1 EVALSHA trivial | {} req/s",
        fmt_rate(rb_evalsha)
    );
    println!(
        "SUMMARY: floor       | acquire+release = 2 round trips (PING/s / 2) | interleaved {} pairs/s | criterion {} pairs/s",
        fmt_rate(il_floor),
        fmt_rate(floor)
    );
    for (key, what) in [
        (
            "raw_pair",
            "raw scripts | redlease acquire.lua+release_full.lua, raw connection",
        ),
        (
            "classic_pair",
            "raw scripts | classic Redisson scripts (no marker, no latch), raw connection",
        ),
    ] {
        let r = rates.rate(key);
        println!(
            "SUMMARY: {what} | interleaved {} pairs/s, ratio {} | criterion {} pairs/s, ratio {}",
            fmt_rate(round_rate(&rounds, key)),
            round_ratio(&rounds, key, "ping", 0.5)
                .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
            fmt_rate(r),
            fmt_ratio(r, floor),
        );
    }
    println!(
        "SUMMARY: raw scripts | current Redisson scripts (release with an unlock latch), raw connection | interleaved {} pairs/s, ratio {}, vs the non-reentrant peer {}",
        fmt_rate(round_rate(&rounds, "current_pair")),
        round_ratio(&rounds, "current_pair", "ping", 0.5)
            .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
        round_ratio(&rounds, "current_pair", "nonreentrant_pair", 1.0)
            .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
    );
    println!(
        "SUMMARY: peer        | raw non-reentrant lock (SET NX PX + Lua compare-and-delete), raw connection | interleaved {} pairs/s, ratio {}",
        fmt_rate(round_rate(&rounds, "nonreentrant_pair")),
        round_ratio(&rounds, "nonreentrant_pair", "ping", 0.5)
            .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
    );
    // What an acquire + release sent as two scripts can reach, against the
    // peer: two calls of a script that does nothing (no key, no argument),
    // and two that do nothing with redlease's keys and arguments. `calls`:
    // calls of `key` per pair.
    for (key, calls, what) in [
        (
            "evalsha_trivial",
            2.0,
            "two scripts that do nothing (2 x EVALSHA trivial)",
        ),
        (
            "hollow_pair",
            1.0,
            "the same with redlease's keys and arguments (2 + 3, 3 + 2)",
        ),
    ] {
        println!(
            "SUMMARY: ceiling     | {what}, raw connection | interleaved {} pairs/s, vs the non-reentrant peer {}",
            fmt_rate(round_rate(&rounds, key).map(|r| r / calls)),
            round_ratio(&rounds, key, "nonreentrant_pair", calls)
                .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
        );
    }
    for (key, what) in [
        ("watchdog_pair", "lock()+drop (watchdog)"),
        ("lease_pair", "lock_with_lease(30s)+drop"),
    ] {
        let r = rates.rate(key);
        let il_ratio = round_ratio(&rounds, key, "ping", 0.5);
        let ok = il_ratio.is_some_and(|x| x >= 0.9);
        let fmt = |x: Option<f64>| x.map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}"));
        let vs_peer = round_ratio(&rounds, key, "nonreentrant_pair", 1.0);
        println!(
            "SUMMARY: redlease    | {what} | interleaved {} pairs/s, ratio {} (target >= 0.90: {}), vs raw scripts {}, \
             vs the non-reentrant peer {} (goal >= 0.95: {}), vs current Redisson scripts raw {} | criterion {} pairs/s, \
             ratio {}, vs raw scripts {}",
            fmt_rate(round_rate(&rounds, key)),
            fmt(il_ratio),
            pass(ok),
            fmt(round_ratio(&rounds, key, "raw_pair", 1.0)),
            fmt(vs_peer),
            pass(vs_peer.is_some_and(|x| x >= 0.95)),
            fmt(round_ratio(&rounds, key, "current_pair", 1.0)),
            fmt_rate(r),
            fmt_ratio(r, floor),
            fmt_ratio(r, rates.rate("raw_pair"))
        );
    }
    println!(
        "SUMMARY: events      | lock()+drop with an event handler (counting) vs without | interleaved {} pairs/s, ratio {} (without a handler no clock is read)",
        fmt_rate(round_rate(&rounds, "events_pair")),
        round_ratio(&rounds, "events_pair", "watchdog_pair", 1.0)
            .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
    );
    for r in &handoffs {
        let p50 = support::quantile(&r.samples, 0.5);
        let p99 = support::quantile(&r.samples, 0.99);
        let acq = r.acquisitions as f64 / r.elapsed.as_secs_f64();
        let targets = if r.waiters == 4 {
            let ok = p50 <= Duration::from_micros(250)
                && p99 <= Duration::from_millis(1)
                && acq >= 720.0;
            format!(" | targets p50<=0.25 p99<=1 acq/s>=720: {}", pass(ok))
        } else {
            String::new()
        };
        println!(
            "SUMMARY: hand-off    | {} hold 1 ms | p50 {} ms p99 {} ms max {} ms | {:.0} acquisitions/s | {} samples | floor 2 RTT {} ms{targets}",
            r.label,
            support::ms(p50),
            support::ms(p99),
            support::ms(support::quantile(&r.samples, 1.0)),
            acq,
            r.samples.len(),
            rtt.map_or_else(|| "n/a".to_owned(), |d| support::ms(d * 2)),
        );
    }
}
