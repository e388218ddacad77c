//! Bench support: CPU pinning (Redis on one core, the bench on the other),
//! a pinned private `redis-server` (the test harness's [`RedisServer`]), and
//! small measuring helpers (process CPU time, thread count, INFO fields,
//! percentiles, run mode).
#![allow(dead_code)]

use redlease_testkit as harness;

use std::process::{Command, Stdio};
use std::time::Duration;

#[allow(unused_imports)] // each bench uses its part
pub use harness::{Proxy, RedisServer, Resp};

/// The core Redis runs on.
pub const REDIS_CORE: usize = 0;
/// The core the bench process (and anything it runs, e.g. redis-benchmark)
/// runs on.
pub const CLIENT_CORE: usize = 1;

/// How the bench binary was invoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `cargo bench`: full measurements.
    Bench,
    /// `cargo test --benches` or `cargo bench -- --test`: one quick pass to
    /// check that the bench still runs.
    Test,
    /// `--list`: criterion lists the benchmarks; nothing else runs.
    List,
}

/// The run mode, decided from the arguments the way criterion does.
pub fn mode() -> Mode {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") {
        Mode::List
    } else if has("--bench") && !has("--test") {
        Mode::Bench
    } else {
        Mode::Test
    }
}

/// `true` unless `REDLEASE_BENCH_NO_PIN` is set or the machine has fewer
/// than two cores.
fn pinning_wanted() -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::var_os("REDLEASE_BENCH_NO_PIN").is_none() && cores >= 2
}

/// Pins every thread of process `pid` to `core` with `taskset -a -p -c`.
/// Returns a line describing what happened.
fn taskset(pid: u32, core: usize) -> String {
    let out = Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => format!("pid {pid} pinned to core {core}"),
        Ok(o) => format!(
            "taskset for pid {pid} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run taskset for pid {pid}: {e}"),
    }
}

/// Pins this process (all its threads; call it first thing in `main`, so
/// every later thread inherits it) to [`CLIENT_CORE`].
pub fn pin_self() {
    if !pinning_wanted() {
        println!("PIN: not pinning (REDLEASE_BENCH_NO_PIN set or < 2 cores)");
        return;
    }
    println!("PIN: bench {}", taskset(std::process::id(), CLIENT_CORE));
    println!(
        "PIN: bench Cpus_allowed_list = {}",
        cpus_allowed(std::process::id())
    );
}

/// The `Cpus_allowed_list` of `pid`, for the log.
pub fn cpus_allowed(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "?".to_owned())
}

/// Starts a private `redis-server` (free port, no persistence) pinned to
/// [`REDIS_CORE`].
pub fn start_server() -> RedisServer {
    let server = RedisServer::start();
    pin(&server);
    server
}

/// Pins a running server to [`REDIS_CORE`] (when pinning).
pub fn pin(server: &RedisServer) {
    let pid = server.pid().expect("redis-server runs after start");
    if pinning_wanted() {
        println!("PIN: redis-server {}", taskset(pid, REDIS_CORE));
        println!(
            "PIN: redis-server Cpus_allowed_list = {}",
            cpus_allowed(pid)
        );
    }
}

/// `redis-benchmark`, pinned to [`CLIENT_CORE`] when pinning.
pub fn redis_benchmark_command() -> Command {
    if pinning_wanted() {
        let mut c = Command::new("taskset");
        c.args(["-c", &CLIENT_CORE.to_string(), "redis-benchmark"]);
        c
    } else {
        Command::new("redis-benchmark")
    }
}

/// Clock ticks per second of `/proc/*/stat` times (`getconf CLK_TCK`;
/// 100 on Linux in practice).
pub fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// utime + stime of process `pid` (all its threads, including exited
/// ones), from `/proc/<pid>/stat`, in clock ticks (10 ms) of resolution.
pub fn cpu_ticks_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may contain spaces: fields restart after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11, 12.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64)
}

/// CPU time of the live threads of process `pid` whose name starts with
/// `prefix` ("" for all), in nanoseconds of resolution: the sum of
/// `/proc/<pid>/task/*/schedstat` (time on CPU). `None` if schedstat is not
/// available. Threads that exit between two readings drop out of the sum,
/// so compare readings only across a window in which no thread exits.
pub fn cpu_precise_of(pid: u32, prefix: &str) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    let mut any = false;
    for task in tasks.flatten() {
        let path = task.path();
        if !prefix.is_empty() {
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            if !comm.starts_with(prefix) {
                continue;
            }
        }
        let Ok(text) = std::fs::read_to_string(path.join("schedstat")) else {
            continue;
        };
        if let Some(ns) = text
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
        {
            total += ns;
            any = true;
        }
    }
    (any || !prefix.is_empty()).then(|| Duration::from_nanos(total))
}

/// CPU time of process `pid`: [`cpu_precise_of`] when available, else
/// [`cpu_ticks_of`].
pub fn cpu_time_of(pid: u32) -> Duration {
    cpu_precise_of(pid, "")
        .filter(|d| !d.is_zero())
        .unwrap_or_else(|| cpu_ticks_of(pid))
}

/// CPU time of this process (see [`cpu_time_of`]).
pub fn cpu_time() -> Duration {
    cpu_time_of(std::process::id())
}

/// Resident memory of this process in bytes (`VmRSS` of `/proc/self/status`).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Threads of this process (`/proc/self/task`).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// The whole `INFO <section>` text.
pub fn info(server: &RedisServer, section: &str) -> String {
    match server.raw(&["INFO", section]) {
        Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("INFO {section}: unexpected reply {other:?}"),
    }
}

/// `calls=` of `cmdstat_<command>` in INFO commandstats (0 if never called).
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    command_stat(server, command).0
}

/// `(calls, usec)` of `cmdstat_<command>` in INFO commandstats (zeros if
/// never called). `usec` is Redis's own execution time of the command,
/// including the commands a script runs, excluding network and parsing.
pub fn command_stat(server: &RedisServer, command: &str) -> (u64, u64) {
    let text = info(server, "commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(fields) = text.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| {
        fields
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// Every `cmdstat_*` of INFO commandstats: command -> (calls, usec).
pub fn command_stats(server: &RedisServer) -> std::collections::BTreeMap<String, (u64, u64)> {
    let text = info(server, "commandstats");
    text.lines()
        .filter_map(|l| {
            let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> Option<u64> {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

/// Context switches (voluntary + involuntary) of this process's threads
/// whose name starts with `prefix` (e.g. `redlease-`): how often the
/// library's background threads woke up.
pub fn thread_switches(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

/// `total_commands_processed` (counts commands run inside scripts too, and
/// the INFO that reads it).
pub fn total_commands(server: &RedisServer) -> u64 {
    server.info_stat("total_commands_processed")
}

/// SCRIPT LOAD over a raw connection; returns the SHA1.
pub fn script_load(conn: &mut redis::Connection, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(conn)
        .expect("SCRIPT LOAD")
}

/// The `q`-quantile (0..=1) of sorted `samples`.
/// `n` fresh locks named `<prefix><i>`, taken with `try_lock` (watched by
/// the watchdog) and held until the guards are dropped.
pub fn hold_fresh_locks(
    client: &redlease::Client,
    prefix: &str,
    n: usize,
) -> Vec<redlease::LockGuard> {
    (0..n)
        .map(|i| {
            client
                .lock(format!("{prefix}{i}"))
                .try_lock()
                .expect("try_lock")
                .expect("a fresh lock is free")
        })
        .collect()
}

pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// The load average line, for the log (other processes share the machine).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

/// Rates measured interleaved, so that a noisy machine slows every routine
/// alike: `rounds` rounds, each running every routine for `burst` (ten
/// calls at a time), in an order that rotates from round to round. Returns,
/// per routine, its calls per second in each round.
pub fn interleaved(
    rounds: usize,
    burst: Duration,
    routines: &mut [&mut dyn FnMut()],
) -> Vec<Vec<f64>> {
    let k = routines.len();
    let mut rates = vec![Vec::with_capacity(rounds); k];
    for round in 0..rounds {
        for j in 0..k {
            let which = (round + j) % k;
            let start = std::time::Instant::now();
            let mut n = 0u64;
            while start.elapsed() < burst {
                for _ in 0..10 {
                    (routines[which])();
                }
                n += 10;
            }
            rates[which].push(n as f64 / start.elapsed().as_secs_f64());
        }
    }
    rates
}

/// The median of `xs` (0 if empty).
pub fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// The median over rounds of `rates[a] / (rates[b] * scale)`, from
/// [`interleaved`] rates.
pub fn ratio(rates: &[Vec<f64>], a: usize, b: usize, scale: f64) -> f64 {
    let per_round: Vec<f64> = rates[a]
        .iter()
        .zip(&rates[b])
        .map(|(x, y)| x / (y * scale))
        .collect();
    median(&per_round)
}

/// Whether the bench's Redis runs under callgrind: `REDLEASE_CALLGRIND_OUT`
/// names its `--callgrind-out-file` (what the pseudo-bench
/// `redis-instructions` of `scripts/bench_compare.sh` sets up, with
/// `REDIS_SERVER_BIN` a wrapper that starts redis-server under valgrind).
pub fn callgrind_out() -> Option<String> {
    std::env::var("REDLEASE_CALLGRIND_OUT")
        .ok()
        .filter(|s| !s.is_empty())
}

/// The instructions Redis (under callgrind, see [`callgrind_out`]) ran
/// while `f` ran: its counts zeroed before, dumped after and read from the
/// dump. They do not move with the machine's load, so a change to a script
/// shows in one run.
pub fn redis_instructions(server: &RedisServer, f: impl FnOnce()) -> u64 {
    let out = callgrind_out().expect("REDLEASE_CALLGRIND_OUT names the callgrind output");
    let pid = server.pid().expect("redis-server runs").to_string();
    let control = |what: &str| {
        let status = Command::new("callgrind_control")
            .args([what, &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("callgrind_control runs (valgrind is installed)");
        assert!(status.success(), "callgrind_control {what} {pid} failed");
    };
    let dumps = || -> Vec<std::path::PathBuf> {
        let path = std::path::Path::new(&out);
        let dir = path.parent().expect("the output file's directory");
        let name = path.file_name().expect("the output file's name");
        let prefix = format!("{}.", name.to_string_lossy());
        let mut found: Vec<_> = std::fs::read_dir(dir)
            .expect("the callgrind output directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
            })
            .collect();
        found.sort();
        found
    };
    let before = dumps();
    control("-z");
    f();
    control("-d");
    let started = std::time::Instant::now();
    loop {
        let new: Vec<_> = dumps()
            .into_iter()
            .filter(|d| !before.contains(d))
            .collect();
        if let Some(dump) = new.first() {
            let text = std::fs::read_to_string(dump).unwrap_or_default();
            let total = text.lines().find_map(|l| {
                l.strip_prefix("summary: ")
                    .or_else(|| l.strip_prefix("totals: "))
                    .and_then(|n| n.split_whitespace().next()?.parse().ok())
            });
            if let Some(total) = total {
                return total;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "waited 60 s for callgrind's dump of redis-server {pid} next to {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The window an `--instructions` mode counts (run under callgrind by
/// `scripts/bench_compare.sh`, instrumentation off until the file
/// `REDLEASE_BENCH_GO` names exists): prints `READY`, waits for that file
/// (at most 300 s), runs `f` (which prints its own result line), then waits
/// for the file to go (at most 60 s): the script switches the
/// instrumentation off before it removes it.
pub fn instructions_window<T>(f: impl FnOnce() -> T) -> T {
    use std::io::Write;
    use std::time::Instant;
    let go =
        std::env::var("REDLEASE_BENCH_GO").expect("REDLEASE_BENCH_GO names the file to wait for");
    println!("READY");
    std::io::stdout().flush().expect("stdout");
    let waited = Instant::now();
    while !std::path::Path::new(&go).exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(300),
            "waited 300 s for {go} (the instrumentation to be switched on)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = f();
    std::io::stdout().flush().expect("stdout");
    let waited = Instant::now();
    while std::path::Path::new(&go).exists() && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    out
}
