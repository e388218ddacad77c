//! The cost of keeping many locks alive (issue 3), beside a baseline measured
//! in the same run.
//!
//! Redis runs on core 0, this process on core 1. For N = 1,000, 10,000 and
//! 100,000:
//!
//! * redlease: one thread takes N locks with `try_lock` on a client with a
//!   3 s `watchdog_timeout` (renewed every 1 s) and then sleeps; over a 10 s
//!   window we measure renewals and renewal round trips per second
//!   (`ClientStats`), Redis commands per second (`INFO`), the CPU of this
//!   process in % of one core (time on CPU of its threads from
//!   `/proc/self/task/*/schedstat`, ns resolution, with `/proc/self/stat`
//!   utime + stime beside it as a cross-check; only the watchdog works, the
//!   holder and this thread sleep), the CPU of Redis, the thread count
//!   (`/proc/self/task`) and the locks lost.
//! * limit: N hashes of the same shape whose leases a bare `PEXPIRE` Lua
//!   loop extends once a second (1,000 keys per call, pipelined): what
//!   extending a lease costs Redis at the least, measured in the same run.
//!   Redis CPU per renewal is judged against it (goal <= 1.5 x), client CPU
//!   per renewal against 0.2 us; the memory this process grew by per lock
//!   taken is reported. Redis CPU of the two comes from separate windows
//!   and moves from run to run; so a second, 5 s window runs the bare loop
//!   (sent with EVAL) beside the watchdog (EVALSHA) and compares their
//!   script execution times (INFO commandstats) under the same conditions.
//! * baseline (up to N = 10,000): the same N leases renewed the way a watchdog without batching
//!   does (Redisson's renewal script, one EVALSHA and one round trip per lock
//!   per renewal, on a raw connection), N renewals per second, same window.
//!
//! Plain `main` (`harness = false`): no statistics needed. Run with
//! `cargo bench --bench watchdog` (about 2 minutes); the `SUMMARY:` lines are the
//! result. Without `--bench` (`cargo test --benches`) it runs a short smoke
//! pass.
//!
//! With `--instructions` it only holds [`INSTRUCTIONS_N`] locks and prints
//! `READY`, waits for the file named by `REDLEASE_BENCH_GO` to appear,
//! prints the renewals made in the next [`INSTRUCTIONS_WINDOW`] and waits
//! for the file to go before it ends: run under
//! callgrind with instrumentation switched on in between (what
//! `scripts/bench_compare.sh` does for the pseudo-bench
//! `watchdog-instructions`), it counts the instructions and simulated cache
//! misses of the window per renewal: figures that do not depend on what
//! else the machine is doing.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{Mode, RedisServer};

/// Redisson's renewal script (`renewExpirationAsync`): one lock per call.
const RENEW_ONE_LUA: &str = "\
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
    redis.call('pexpire', KEYS[1], ARGV[1]); \
    return 1; \
end; \
return 0;";

/// The limit: the same keys' leases extended by a bare `PEXPIRE` in a Lua
/// loop, as many keys per call as the watchdog puts in one (no check of the
/// owner: what extending a lease costs Redis at the least).
const BARE_LOOP_LUA: &str = "\
for _, key in ipairs(KEYS) do redis.call('pexpire', key, ARGV[1]) end \
return 0";
const BARE_CHUNK: usize = 1000;

const LEASE: Duration = Duration::from_secs(3);
/// Locks held in `--instructions` mode.
const INSTRUCTIONS_N: usize = 20_000;
/// The window counted in `--instructions` mode.
const INSTRUCTIONS_WINDOW: Duration = Duration::from_secs(5);
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// One snapshot of everything measured.
struct Snapshot {
    at: Instant,
    /// Process CPU, ns resolution (schedstat of the live threads).
    cpu: Duration,
    /// Process CPU from /proc/self/stat (10 ms ticks), as a cross-check.
    cpu_ticks: Duration,
    /// CPU of the redlease-watchdog thread.
    watchdog_cpu: Duration,
    redis_cpu: Duration,
    total_commands: u64,
    evalsha: u64,
}

impl Snapshot {
    fn take(server: &RedisServer) -> Snapshot {
        Snapshot {
            total_commands: support::total_commands(server),
            evalsha: support::command_calls(server, "evalsha"),
            cpu: support::cpu_time(),
            cpu_ticks: support::cpu_ticks_of(std::process::id()),
            watchdog_cpu: support::cpu_precise_of(std::process::id(), "redlease-watch")
                .unwrap_or_default(),
            redis_cpu: support::cpu_time_of(server.pid().expect("redis-server runs")),
            at: Instant::now(),
        }
    }
}

/// What one run measured over its window.
struct Figures {
    n: usize,
    what: &'static str,
    secs: f64,
    renewals: u64,
    round_trips: u64,
    /// Top-level EVALSHA calls Redis ran.
    evalsha: u64,
    /// `total_commands_processed` delta, less our two INFO reads.
    commands: u64,
    cpu: Duration,
    cpu_ticks: Duration,
    watchdog_cpu: Duration,
    redis_cpu: Duration,
    threads_before: usize,
    threads: usize,
    lost: u64,
    /// Growth of this process's resident memory per lock taken (redlease).
    mem_per_lock: Option<f64>,
    /// Redis's script execution time per renewal in µs (INFO commandstats):
    /// the watchdog's, and the bare loop's run beside it in the same window.
    exec_beside: Option<(f64, f64)>,
}

impl Figures {
    fn new(
        n: usize,
        what: &'static str,
        a: &Snapshot,
        b: &Snapshot,
        (renewals, round_trips, lost): (u64, u64, u64),
        (threads_before, threads): (usize, usize),
    ) -> Figures {
        Figures {
            n,
            what,
            secs: b.at.duration_since(a.at).as_secs_f64(),
            renewals,
            round_trips,
            evalsha: b.evalsha - a.evalsha,
            // The INFO stats and INFO commandstats of snapshot `a` are counted.
            commands: (b.total_commands - a.total_commands).saturating_sub(2),
            cpu: b.cpu.saturating_sub(a.cpu),
            cpu_ticks: b.cpu_ticks.saturating_sub(a.cpu_ticks),
            watchdog_cpu: b.watchdog_cpu.saturating_sub(a.watchdog_cpu),
            redis_cpu: b.redis_cpu.saturating_sub(a.redis_cpu),
            threads_before,
            threads,
            lost,
            mem_per_lock: None,
            exec_beside: None,
        }
    }

    fn redis_us_per_renewal(&self) -> f64 {
        if self.renewals == 0 {
            return 0.0;
        }
        self.redis_cpu.as_secs_f64() * 1e6 / self.renewals as f64
    }

    fn client_us_per_renewal(&self) -> f64 {
        if self.renewals == 0 {
            return 0.0;
        }
        self.cpu.as_secs_f64() * 1e6 / self.renewals as f64
    }

    fn per_sec(&self, x: u64) -> f64 {
        x as f64 / self.secs
    }

    fn cpu_pct(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 100.0 / self.secs
    }

    fn per_round_trip(&self) -> f64 {
        if self.round_trips == 0 {
            0.0
        } else {
            self.renewals as f64 / self.round_trips as f64
        }
    }
}

enum HolderMsg {
    Ready(Duration),
}

/// Waits (at most 5 s) until this process is down to `n` threads, e.g. until
/// the previous client's background threads have exited.
fn settle_threads(n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while support::thread_count() > n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    support::thread_count()
}

/// redlease: N locks held by one thread, renewed by the watchdog.
fn redlease_run(server: &RedisServer, n: usize, settle: Duration, window: Duration) -> Figures {
    let threads_before = settle_threads(1);
    let client = redlease::Client::builder(server.url())
        .watchdog_timeout(LEASE)
        .build()
        .expect("client");
    let rss_before = support::rss_bytes();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = {
        let client = client.clone();
        std::thread::Builder::new()
            .name("bench-holder".into())
            .spawn(move || {
                let started = Instant::now();
                let guards = support::hold_fresh_locks(&client, &format!("bench:wd:{n}:"), n);
                ready_tx
                    .send(HolderMsg::Ready(started.elapsed()))
                    .expect("main waits for the holder");
                // Idle until told to release (or main went away).
                let _ = release_rx.recv_timeout(Duration::from_secs(600));
                let lost = guards.iter().filter(|g| g.is_lost()).count();
                drop(guards);
                lost
            })
            .expect("spawn holder")
    };
    let HolderMsg::Ready(took) = ready_rx
        .recv_timeout(Duration::from_secs(300))
        .expect("the holder took its locks within 300 s");
    println!(
        "DIAG: N={n}: took {n} locks with try_lock in {:.2} s; settling {:.1} s before measuring",
        took.as_secs_f64(),
        settle.as_secs_f64()
    );
    let mem_per_lock = (support::rss_bytes() as f64 - rss_before as f64) / n as f64;
    std::thread::sleep(settle);
    let s0 = client.stats();
    let a = Snapshot::take(server);
    std::thread::sleep(window);
    let b = Snapshot::take(server);
    let s1 = client.stats();
    // A second, shorter window with the bare loop beside the watchdog: their
    // script execution times compared under the same conditions.
    let bare = bare_keys(&mut server.conn(), &format!("bench:wd-beside:{n}"), n);
    let beside_window = window / 2;
    let (sha0, eval0, r0) = (
        support::command_stat(server, "evalsha"),
        support::command_stat(server, "eval"),
        client.stats().renewals,
    );
    let bare_renewals = std::thread::scope(|s| {
        let beside = s.spawn(|| bare_beside(server, &bare, Instant::now() + beside_window));
        std::thread::sleep(beside_window);
        beside.join().expect("the bare loop beside")
    });
    let (sha1, eval1, r1) = (
        support::command_stat(server, "evalsha"),
        support::command_stat(server, "eval"),
        client.stats().renewals,
    );
    for chunk in bare.chunks(1000) {
        let _: () = redis::cmd("DEL")
            .arg(chunk)
            .query(&mut server.conn())
            .expect("clean up");
    }
    let threads = support::thread_count();
    release_tx
        .send(())
        .expect("the holder waits for the release");
    let guards_lost = holder.join().expect("holder thread");
    println!("DIAG: N={n}: client stats at the end of the window: {s1:?}");
    if guards_lost > 0 {
        println!("DIAG: N={n}: {guards_lost} guards reported is_lost() before release");
    }
    let mut f = Figures::new(
        n,
        "redlease watchdog (batched)",
        &a,
        &b,
        (
            s1.renewals - s0.renewals,
            s1.renewal_round_trips - s0.renewal_round_trips,
            s1.locks_lost + guards_lost as u64,
        ),
        (threads_before, threads),
    );
    f.mem_per_lock = Some(mem_per_lock);
    // Script execution time per renewal, the watchdog's EVALSHA against the
    // bare loop's EVAL, both in this window.
    let per = |usec: u64, renewals: u64| usec as f64 / renewals.max(1) as f64;
    f.exec_beside = Some((
        per(sha1.1 - sha0.1, r1 - r0),
        per(eval1.1 - eval0.1, bare_renewals),
    ));
    f
}

/// The limit: N lock hashes of redlease's shape whose leases a bare `PEXPIRE`
/// loop extends once a second, [`BARE_CHUNK`] keys per script call, the calls
/// of one second in one pipeline.
fn bare_run(server: &RedisServer, n: usize, window: Duration) -> Figures {
    let threads_before = settle_threads(1);
    let mut conn = server.conn();
    let (keys, pipe) = bare_loop(&mut conn, &format!("bench:wd-bare:{n}"), n);
    let ticks = (window.as_secs_f64() / RENEW_EVERY.as_secs_f64()).round() as u32;
    let threads = support::thread_count();
    let a = Snapshot::take(server);
    let t0 = Instant::now();
    for tick in 0..ticks {
        let due = t0 + RENEW_EVERY * tick;
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
        }
        pipe.query::<()>(&mut conn).expect("bare PEXPIRE loop");
    }
    let end = t0 + RENEW_EVERY * ticks;
    let now = Instant::now();
    if now < end {
        std::thread::sleep(end - now);
    }
    let b = Snapshot::take(server);
    for chunk in keys.chunks(1000) {
        let _: () = redis::cmd("DEL")
            .arg(chunk)
            .query(&mut conn)
            .expect("clean up");
    }
    let renewals = n as u64 * u64::from(ticks);
    Figures::new(
        n,
        "limit: bare PEXPIRE Lua loop",
        &a,
        &b,
        (
            renewals,
            (n.div_ceil(BARE_CHUNK) as u64) * u64::from(ticks),
            0,
        ),
        (threads_before, threads),
    )
}

/// The bare loop's `n` locks under `prefix` ([`bare_keys`]) and one round of
/// it over them: a pipeline of [`BARE_LOOP_LUA`] calls, [`BARE_CHUNK`] keys
/// each.
fn bare_loop(
    conn: &mut redis::Connection,
    prefix: &str,
    n: usize,
) -> (Vec<String>, redis::Pipeline) {
    let sha = support::script_load(conn, BARE_LOOP_LUA);
    let keys = bare_keys(conn, prefix, n);
    let mut pipe = redis::pipe();
    for chunk in keys.chunks(BARE_CHUNK) {
        pipe.cmd("EVALSHA")
            .arg(&sha)
            .arg(chunk.len())
            .arg(chunk)
            .arg(LEASE.as_millis() as u64)
            .ignore();
    }
    (keys, pipe)
}

/// `n` lock hashes of redlease's shape (owner field and generation) under
/// `prefix`, with the lease, for the bare `PEXPIRE` loop.
fn bare_keys(conn: &mut redis::Connection, prefix: &str, n: usize) -> Vec<String> {
    let field = "00000000-0000-0000-0000-000000000000:1";
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}:{i}")).collect();
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("HSET")
                .arg(k)
                .arg(field)
                .arg(1)
                .arg(format!("{field}:gen"))
                .arg(12345)
                .ignore();
            pipe.cmd("PEXPIRE")
                .arg(k)
                .arg(LEASE.as_millis() as u64)
                .ignore();
        }
        pipe.query::<()>(conn)
            .expect("set up the bare loop's locks");
    }
    keys
}

/// The bare `PEXPIRE` loop sent with `EVAL` (so that INFO commandstats
/// counts it apart from the watchdog's `EVALSHA`) over `keys` once every
/// [`RENEW_EVERY`] until `stop`, beside the watchdog in the same window;
/// the renewals it made.
fn bare_beside(server: &RedisServer, keys: &[String], stop: Instant) -> u64 {
    let mut conn = server.conn();
    let mut pipe = redis::pipe();
    for chunk in keys.chunks(BARE_CHUNK) {
        pipe.cmd("EVAL")
            .arg(BARE_LOOP_LUA)
            .arg(chunk.len())
            .arg(chunk)
            .arg(LEASE.as_millis() as u64)
            .ignore();
    }
    let mut renewals = 0;
    let mut due = Instant::now();
    while due < stop {
        pipe.query::<()>(&mut conn).expect("bare PEXPIRE loop");
        renewals += keys.len() as u64;
        due += RENEW_EVERY;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    renewals
}

/// Baseline: one renewal script call (one round trip) per lock per second.
fn baseline_run(server: &RedisServer, n: usize, window: Duration) -> Figures {
    let threads_before = settle_threads(1);
    let mut conn = server.conn();
    let sha = support::script_load(&mut conn, RENEW_ONE_LUA);
    let field = "00000000-0000-0000-0000-000000000000:1";
    let keys: Vec<String> = (0..n).map(|i| format!("bench:wd-base:{n}:{i}")).collect();
    let lease_ms = LEASE.as_millis() as u64;
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("HSET").arg(k).arg(field).arg(1).ignore();
            pipe.cmd("PEXPIRE").arg(k).arg(lease_ms).ignore();
        }
        pipe.query::<()>(&mut conn).expect("set up baseline locks");
    }
    let ticks = (window.as_secs_f64() / RENEW_EVERY.as_secs_f64()).round() as u32;
    let mut renewals = 0u64;
    let mut lost = 0u64;
    let threads = support::thread_count();
    let a = Snapshot::take(server);
    let t0 = Instant::now();
    let mut late = 0u32;
    for tick in 0..ticks {
        let due = t0 + RENEW_EVERY * tick;
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
        } else if tick > 0 {
            late += 1;
        }
        for k in &keys {
            let r: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(k)
                .arg(lease_ms)
                .arg(field)
                .query(&mut conn)
                .expect("renew one");
            if r == 1 {
                renewals += 1;
            } else {
                lost += 1;
            }
        }
    }
    let end = t0 + RENEW_EVERY * ticks;
    let now = Instant::now();
    if now < end {
        std::thread::sleep(end - now);
    }
    let b = Snapshot::take(server);
    if late > 0 {
        println!("DIAG: baseline N={n}: {late} of {ticks} renewal rounds started late");
    }
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("DEL").arg(k).ignore();
    }
    pipe.query::<()>(&mut conn)
        .expect("clean up baseline locks");
    Figures::new(
        n,
        "baseline: 1 EVALSHA per lock",
        &a,
        &b,
        (renewals, renewals + lost, lost),
        (threads_before, threads),
    )
}

/// A server, and a client holding `n` fresh watched locks named from
/// `prefix`, past their first renewals (which come in small batches as the
/// locks were taken one after another).
fn watched_locks(
    prefix: &str,
    n: usize,
) -> (RedisServer, redlease::Client, Vec<redlease::LockGuard>) {
    let server = support::start_server();
    let client = redlease::Client::builder(server.url())
        .watchdog_timeout(LEASE)
        .build()
        .expect("client");
    let guards = support::hold_fresh_locks(&client, prefix, n);
    std::thread::sleep(RENEW_EVERY * 2);
    (server, client, guards)
}

/// `--instructions`: see the module's doc.
fn instructions_run() {
    let (server, client, guards) = watched_locks("bench:wd-instr:", INSTRUCTIONS_N);
    support::instructions_window(|| {
        let s0 = client.stats();
        std::thread::sleep(INSTRUCTIONS_WINDOW);
        let s1 = client.stats();
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        println!(
            "RENEWALS: {} in {INSTRUCTIONS_WINDOW:?}, {} round trips, {INSTRUCTIONS_N} locks, {lost} lost",
            s1.renewals - s0.renewals,
            s1.renewal_round_trips - s0.renewal_round_trips
        );
    });
    // Not released one by one: the server goes with them.
    std::mem::forget(guards);
    drop(client);
    drop(server);
}

/// Locks held in `--redis-instructions` mode (Redis under callgrind runs
/// some 30 times slower: few enough to renew every second). Not fewer: Lua
/// keeps a script's argument strings until a garbage collection sweeps
/// them, and a call that passes the same string finds it instead of
/// allocating it again. With 2,000 locks the bare loop made too little
/// garbage for a collection to sweep its keys between rounds (44
/// instructions per lock in Lua's allocator, 408 with 10,000 locks; the
/// watchdog's batches 916 and 852), and the work Redis does whatever the
/// load (its timers) weighed on five times fewer renewals: figures for a
/// few locks, not for the many the goal is about.
const REDIS_INSTRUCTIONS_N: usize = 10_000;
/// Renewal rounds counted in `--redis-instructions` mode: enough that a
/// batch more or less at the window's edges (the watchdog renews on its own
/// schedule) moves the count by about 1 %.
const REDIS_INSTRUCTIONS_ROUNDS: u32 = 10;

/// `--redis-instructions`: with Redis under callgrind (see
/// `support::callgrind_out`), the instructions Redis runs per renewal for
/// [`REDIS_INSTRUCTIONS_N`] watched locks, beside the bare `PEXPIRE` loop
/// over as many hashes of the same shape, each over
/// [`REDIS_INSTRUCTIONS_ROUNDS`] seconds (so that Redis's own timers weigh
/// alike): counts that do not move with the machine's load.
fn redis_instructions_run() {
    let n = REDIS_INSTRUCTIONS_N;
    let window = RENEW_EVERY * REDIS_INSTRUCTIONS_ROUNDS;
    let (server, client, guards) = watched_locks("bench:wd-ri:", n);
    // The renewals counted inside the window Redis counts in (from just
    // after its counts were zeroed), so that none before it is counted.
    let mut renewals = 0;
    let counted = support::redis_instructions(&server, || {
        let s0 = client.stats();
        std::thread::sleep(window);
        renewals = client.stats().renewals - s0.renewals;
    });
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    drop(guards);
    let mut conn = server.conn();
    let (_, pipe) = bare_loop(&mut conn, "bench:wd-ri-bare", n);
    let bare = support::redis_instructions(&server, || {
        let t0 = Instant::now();
        for round in 0..REDIS_INSTRUCTIONS_ROUNDS {
            pipe.query::<()>(&mut conn).expect("bare PEXPIRE loop");
            let next = t0 + RENEW_EVERY * (round + 1);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    });
    let per_renewal = counted as f64 / renewals.max(1) as f64;
    let per_bare = bare as f64 / (n as f64 * f64::from(REDIS_INSTRUCTIONS_ROUNDS));
    println!(
        "SUMMARY: redis instructions per renewal (callgrind, {n} locks, {window:?}) | \
         redlease {per_renewal:.0} ({renewals} renewals, {lost} lost) | bare PEXPIRE loop \
         {per_bare:.0} | ratio {:.2} (goal <= 1.5 of Redis CPU)",
        per_renewal / per_bare
    );
}

fn main() {
    if std::env::args().any(|a| a == "--instructions") {
        return instructions_run();
    }
    if std::env::args().any(|a| a == "--redis-instructions") {
        return redis_instructions_run();
    }
    support::pin_self();
    let mode = support::mode();
    if mode == Mode::List {
        return;
    }
    let full = mode == Mode::Bench;
    println!("LOAD: {}", support::load_average());
    let server = support::start_server();
    let (sizes, settle, window): (&[usize], _, _) = if full {
        (
            &[1_000, 10_000, 100_000],
            Duration::from_millis(1500),
            Duration::from_secs(10),
        )
    } else {
        (&[100], Duration::from_millis(1200), Duration::from_secs(2))
    };
    let mut results = Vec::new();
    for &n in sizes {
        results.push(redlease_run(&server, n, settle, window));
        results.push(bare_run(&server, n, window));
        // One round trip per lock per second is beyond one connection at
        // 100,000 locks: the peer runs up to 10,000.
        if n <= 10_000 {
            results.push(baseline_run(&server, n, window));
        }
    }

    let pass = |ok: bool| if ok { "PASS" } else { "MISS" };
    // The client's threads: all threads during the run, less those before
    // the client was built, less the bench's holder thread.
    let client_threads = |f: &Figures| f.threads.saturating_sub(f.threads_before + 1);
    let client_threads_by_n: Vec<usize> = results
        .iter()
        .filter(|f| f.what.starts_with("redlease"))
        .map(client_threads)
        .collect();
    let threads_flat = client_threads_by_n.windows(2).all(|w| w[0] == w[1]);
    println!();
    println!(
        "SUMMARY: watchdog bench ({mode:?} mode), lease {:?}, renewal every {:?}; load average at end: {}",
        LEASE,
        RENEW_EVERY,
        support::load_average()
    );
    for f in &results {
        let cpu = f.cpu_pct(f.cpu);
        let mut line = format!(
            "SUMMARY: N={:<6} | {:<28} | {:>7.0} renewals/s | {:>7.1} round trips/s | {:>7.1} renewals/round trip | \
             redis {:>6.1} EVALSHA/s {:>7.0} cmds/s (incl. in scripts) | client CPU {:>5.2} % (stat ticks {:.1} %, \
             watchdog thread {:.2} %, {:.2} us per renewal) | redis CPU {:>5.2} % | \
             threads {} ({}) | lost {}",
            f.n,
            f.what,
            f.per_sec(f.renewals),
            f.per_sec(f.round_trips),
            f.per_round_trip(),
            f.per_sec(f.evalsha),
            f.per_sec(f.commands),
            cpu,
            f.cpu_pct(f.cpu_ticks),
            f.cpu_pct(f.watchdog_cpu),
            if f.renewals > 0 {
                f.cpu.as_secs_f64() * 1e6 / f.renewals as f64
            } else {
                0.0
            },
            f.cpu_pct(f.redis_cpu),
            f.threads,
            if f.what.starts_with("redlease") {
                format!("{} of the client, 1 holder", client_threads(f))
            } else {
                "no client".to_owned()
            },
            f.lost
        );
        if f.n == 10_000 && f.what.starts_with("redlease") {
            line.push_str(&format!(
                " | targets CPU<=1%: {}, renewals/rt>=300: {}, threads independent of N: {}, 0 lost: {}",
                pass(cpu <= 1.0),
                pass(f.per_round_trip() >= 300.0),
                pass(threads_flat),
                pass(f.lost == 0)
            ));
        }
        println!("{line}");
    }
    for n in sizes {
        let ours = results
            .iter()
            .find(|f| f.n == *n && f.what.starts_with("redlease"));
        let bare = results
            .iter()
            .find(|f| f.n == *n && f.what.starts_with("limit"));
        if let (Some(o), Some(b)) = (ours, bare) {
            let redis_ratio = o.redis_us_per_renewal() / b.redis_us_per_renewal();
            let client_us = o.client_us_per_renewal();
            println!(
                "SUMMARY: N={n:<6} | redlease / bare PEXPIRE loop | redis CPU per renewal {:.2} us / {:.2} us = \
                 ratio {redis_ratio:.2} (goal <= 1.5: {}) | client CPU per renewal {client_us:.3} us (goal <= 0.2: {}) \
                 | client memory per held lock {:.0} bytes",
                o.redis_us_per_renewal(),
                b.redis_us_per_renewal(),
                pass(redis_ratio <= 1.5),
                pass(client_us <= 0.2),
                o.mem_per_lock.unwrap_or(0.0),
            );
            if let Some((ours_us, bare_us)) = o.exec_beside {
                let r = ours_us / bare_us;
                println!(
                    "SUMMARY: N={n:<6} | redlease / bare PEXPIRE loop, same window | redis script execution per \
                     renewal {ours_us:.2} us / {bare_us:.2} us = ratio {r:.2} (goal <= 1.5: {})",
                    pass(r <= 1.5),
                );
            }
            if *n == 100_000 {
                let (redis_pct, client_pct) = (o.cpu_pct(o.redis_cpu), o.cpu_pct(o.cpu));
                println!(
                    "SUMMARY: N={n:<6} | redlease at lease {LEASE:?}, renewal every {RENEW_EVERY:?} | redis CPU \
                     {redis_pct:.1} % of a core (bare loop {:.1} %; goal <= 15: {}) | client CPU {client_pct:.2} % \
                     (goal <= 2: {}) | lost {} (goal 0: {})",
                    b.cpu_pct(b.redis_cpu),
                    pass(redis_pct <= 15.0),
                    pass(client_pct <= 2.0),
                    o.lost,
                    pass(o.lost == 0),
                );
            }
        }
        let ours = results
            .iter()
            .find(|f| f.n == *n && f.what.starts_with("redlease"));
        let base = results
            .iter()
            .find(|f| f.n == *n && f.what.starts_with("baseline"));
        if let (Some(o), Some(b)) = (ours, base) {
            let ratio = |x: f64, y: f64| {
                if y > 0.0 {
                    format!("{:.3}", x / y)
                } else {
                    "n/a".into()
                }
            };
            println!(
                "SUMMARY: N={n:<6} | redlease / baseline | round trips {} | client CPU {} | redis CPU {} (goal at \
                 10,000 <= 0.5) | redis cmds {}",
                ratio(o.per_sec(o.round_trips), b.per_sec(b.round_trips)),
                ratio(o.cpu.as_secs_f64(), b.cpu.as_secs_f64()),
                ratio(o.redis_cpu.as_secs_f64(), b.redis_cpu.as_secs_f64()),
                ratio(o.per_sec(o.commands), b.per_sec(b.commands)),
            );
        }
    }
}
