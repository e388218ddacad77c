//! Hand-off beside the fastest peer, measured in the same run (issue 20,
//! goal 3): the time from a release to the next holder's acquisition, with
//! W = 4 and 16 waiters, as threads of one process and as separate
//! processes, for redlease and for python-redis-lock (a `BLPOP` wake-up:
//! the release pushes a token onto a list that one waiter's `BLPOP`
//! returns, then it takes the lock with `SET NX`).
//!
//! Every waiter, of either library, runs the same loop: note the time, ask
//! for the lock (timeout 10 s), note the time it returns, hold it 1 ms
//! (busy), note the time, release, rest 2 ms (so that at a release others
//! are usually waiting), until the run's end. Times are the realtime clock
//! in ns (one clock for all processes). A sample is an acquisition's return
//! minus the latest release before it, counted only when the acquirer was
//! already waiting at that release. Variants run one after another, in
//! turns (redlease, peer, redlease, peer, ...), over the same Redis.
//!
//! The peer runs in a virtual environment this bench sets up once in the
//! temporary directory (`python3 -m venv`, `pip install` of pinned
//! versions); without Python or PyPI it is skipped with a `DIAG:` line.
//! Redlease's waiter processes are this bench binary started again with
//! [`WAITER_ENV`] set. Run with `cargo bench --bench handoff` (about a
//! minute, plus the first setup of the environment).

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::{Mode, RedisServer};

const HOLD: Duration = Duration::from_millis(1);
const REST: Duration = Duration::from_millis(2);
/// Set in a redlease waiter process: `<url>|<lock name>|<start ns>|<stop ns>`.
const WAITER_ENV: &str = "REDLEASE_BENCH_HANDOFF_WAITER";
const PEER_PACKAGES: &[&str] = &["redis==8.1.0", "python-redis-lock==4.0.0"];

/// The peer's waiters: `python3 peer.py PORT NAME START STOP THREADS`, one
/// line per acquisition on stdout: `<waiter> <asked> <acquired> <releasing>`.
const PEER_PY: &str = r#"
import sys, time, threading
import redis, redis_lock

port, name, start, stop, threads = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
HOLD_NS, REST_S = 1_000_000, 0.002
out, out_lock = [], threading.Lock()

def waiter(me):
    conn = redis.Redis(host="127.0.0.1", port=port)
    lock = redis_lock.Lock(conn, name, expire=30)
    events = []
    time.sleep(max(0, (start - time.time_ns()) / 1e9))
    while True:
        asked = time.time_ns()
        if asked >= stop:
            break
        if not lock.acquire(blocking=True, timeout=10):
            continue
        acquired = time.time_ns()
        end = acquired + HOLD_NS
        while time.time_ns() < end:
            pass
        releasing = time.time_ns()
        lock.release()
        events.append((asked, acquired, releasing))
        time.sleep(REST_S)
    with out_lock:
        out.extend("%d %d %d %d" % (me, a, b, c) for a, b, c in events)

ts = [threading.Thread(target=waiter, args=(i,)) for i in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
sys.stdout.write("\n".join(out) + "\n")
"#;

/// One acquisition: (waiter, asked, acquired, releasing), ns.
type Event = (usize, u128, u128, u128);

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn sleep_until_ns(t: u128) {
    let now = now_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos((t - now) as u64));
    }
}

/// The redlease waiter loop (see the module doc).
fn redlease_waiter(lock: &redlease::Lock, me: usize, start: u128, stop: u128) -> Vec<Event> {
    let mut events = Vec::new();
    sleep_until_ns(start);
    loop {
        let asked = now_ns();
        if asked >= stop {
            break;
        }
        let Ok(Some(guard)) = lock.try_lock_for(Duration::from_secs(10)) else {
            continue;
        };
        let acquired = now_ns();
        let end = acquired + HOLD.as_nanos();
        while now_ns() < end {
            std::hint::spin_loop();
        }
        let releasing = now_ns();
        drop(guard);
        events.push((me, asked, acquired, releasing));
        std::thread::sleep(REST);
    }
    events
}

fn parse_events(text: &str, me_offset: usize) -> Vec<Event> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let me: usize = it.next()?.parse().ok()?;
            let a = it.next()?.parse().ok()?;
            let b = it.next()?.parse().ok()?;
            let c = it.next()?.parse().ok()?;
            Some((me + me_offset, a, b, c))
        })
        .collect()
}

/// The hand-off samples of one run's events, sorted.
fn samples(events: &[Event]) -> Vec<Duration> {
    let mut releases: Vec<(u128, usize)> = events.iter().map(|e| (e.3, e.0)).collect();
    releases.sort_unstable();
    let mut out: Vec<Duration> = events
        .iter()
        .filter_map(|&(me, asked, acquired, _)| {
            let i = releases.partition_point(|r| r.0 < acquired);
            let &(released, by) = releases.get(i.checked_sub(1)?)?;
            (by != me && asked <= released)
                .then(|| Duration::from_nanos((acquired - released) as u64))
        })
        .collect();
    out.sort_unstable();
    out
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    Threads,
    Processes,
}

/// redlease: `w` waiters as threads sharing one `Client`, or as processes.
fn run_redlease(
    server: &RedisServer,
    name: &str,
    w: usize,
    shape: Shape,
    span: Duration,
) -> Vec<Event> {
    let start = now_ns() + 500_000_000 + 50_000_000 * w as u128;
    let stop = start + span.as_nanos();
    match shape {
        Shape::Threads => {
            let client = redlease::Client::builder(server.url())
                .pool_size(w as u32 + 2)
                .build()
                .expect("client");
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..w)
                    .map(|me| {
                        let lock = client.lock(name);
                        s.spawn(move || redlease_waiter(&lock, me, start, stop))
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().expect("waiter thread"))
                    .collect()
            })
        }
        Shape::Processes => {
            let exe = std::env::current_exe().expect("this bench's path");
            let spec = format!("{}|{name}|{start}|{stop}", server.url());
            run_processes(w, 1, || {
                let mut cmd = Command::new(&exe);
                cmd.env(WAITER_ENV, &spec);
                cmd
            })
        }
    }
}

/// Starts `procs` waiter processes (`command` makes each, with `threads`
/// waiters in it) and gathers their events, waiters numbered across them.
fn run_processes(procs: usize, threads: usize, command: impl Fn() -> Command) -> Vec<Event> {
    let children: Vec<_> = (0..procs)
        .map(|_| {
            command()
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a waiter process")
        })
        .collect();
    let mut events = Vec::new();
    for (p, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("a waiter process");
        events.extend(parse_events(
            &String::from_utf8_lossy(&out.stdout),
            p * threads,
        ));
    }
    events
}

/// A redlease waiter process: one waiter, its events on stdout.
fn waiter_process(spec: &str) {
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, name, start, stop] = parts[..] else {
        panic!("{WAITER_ENV}={spec:?}: want url|name|start|stop");
    };
    let client = redlease::Client::open(url).expect("client");
    let lock = client.lock(name);
    let events = redlease_waiter(&lock, 0, start.parse().unwrap(), stop.parse().unwrap());
    let mut out = String::new();
    for (_, a, b, c) in events {
        out.push_str(&format!("0 {a} {b} {c}\n"));
    }
    print!("{out}");
}

/// The peer's Python, set up once: `None` (with why) when it cannot be.
fn peer_python() -> Result<PathBuf, String> {
    let venv = std::env::temp_dir().join("redlease-bench-venv");
    let python = venv.join("bin/python3");
    let stamp = venv.join(".redlease-packages");
    let wanted = PEER_PACKAGES.join(" ");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    println!("DIAG: setting up the peer's Python in {}", venv.display());
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "-q"])
        .args(PEER_PACKAGES))?;
    std::fs::write(&stamp, &wanted).map_err(|e| e.to_string())?;
    Ok(python)
}

/// python-redis-lock: `w` waiters as threads of one process, or as
/// processes of one waiter each.
fn run_peer(
    python: &PathBuf,
    server: &RedisServer,
    name: &str,
    w: usize,
    shape: Shape,
    span: Duration,
) -> Vec<Event> {
    let script =
        std::env::temp_dir().join(format!("redlease-bench-peer-{}.py", std::process::id()));
    std::fs::write(&script, PEER_PY).expect("write the peer's script");
    let (procs, threads) = match shape {
        Shape::Threads => (1, w),
        Shape::Processes => (w, 1),
    };
    // Python starts slower (each process imports its modules on the one
    // client core): a longer lead before the common start.
    let start = now_ns() + 1_000_000_000 + 250_000_000 * procs as u128;
    let stop = start + span.as_nanos();
    let events = run_processes(procs, threads, || {
        let mut cmd = Command::new(python);
        cmd.arg(&script).args([
            server.port().to_string(),
            name.to_owned(),
            start.to_string(),
            stop.to_string(),
            threads.to_string(),
        ]);
        cmd
    });
    let _ = std::fs::remove_file(&script);
    events
}

/// The samples of one run's `events`, with a `DIAG:` line.
fn sampled(what: &str, who: &str, events: &[Event]) -> Vec<Duration> {
    let s = samples(events);
    println!(
        "DIAG: {what}: {who} {} acquisitions, {} samples, p50 {} ms, p99 {} ms",
        events.len(),
        s.len(),
        support::ms(support::quantile(&s, 0.5)),
        support::ms(support::quantile(&s, 0.99))
    );
    s
}

fn main() {
    if let Ok(spec) = std::env::var(WAITER_ENV) {
        waiter_process(&spec);
        return;
    }
    support::pin_self();
    let mode = support::mode();
    if mode == Mode::List {
        return;
    }
    let full = mode == Mode::Bench;
    println!("LOAD: {}", support::load_average());
    let server = support::start_server();
    let python = peer_python();
    if let Err(why) = &python {
        println!("DIAG: python-redis-lock peer skipped: {why}");
    }
    let (span, rounds) = if full {
        (Duration::from_secs(3), 2)
    } else {
        (Duration::from_millis(300), 1)
    };
    // (waiters, shape) -> p50s of each round: (redlease, peer)
    let mut rows = Vec::new();
    for w in [4, 16] {
        for shape in [Shape::Threads, Shape::Processes] {
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            for round in 0..rounds {
                let name = format!("bench:handoff:{w}:{shape:?}:{round}");
                let what = format!("W={w} {shape:?} round {round}");
                ours.push(sampled(
                    &what,
                    "redlease",
                    &run_redlease(&server, &name, w, shape, span),
                ));
                if let Ok(py) = &python {
                    let name = format!("bench:handoff-peer:{w}:{shape:?}:{round}");
                    let events = run_peer(py, &server, &name, w, shape, span);
                    theirs.push(sampled(&what, "python-redis-lock", &events));
                }
            }
            rows.push((w, shape, ours, theirs));
        }
    }
    println!();
    println!(
        "SUMMARY: hand-off bench ({mode:?} mode), hold 1 ms, rest 2 ms, {rounds} rounds of {span:?} per variant; load average at end: {}",
        support::load_average()
    );
    let merged = |runs: &[Vec<Duration>]| {
        let mut all: Vec<Duration> = runs.iter().flatten().copied().collect();
        all.sort_unstable();
        all
    };
    for (w, shape, ours, theirs) in rows {
        // Each round's ratio of medians too: the spread says how far one
        // run's figure can be trusted on this machine.
        let rounds_ratios: Vec<f64> = ours
            .iter()
            .zip(&theirs)
            .filter(|(o, t)| !o.is_empty() && !t.is_empty())
            .map(|(o, t)| {
                let (mut o, mut t) = (o.clone(), t.clone());
                o.sort_unstable();
                t.sort_unstable();
                support::quantile(&o, 0.5).as_secs_f64() / support::quantile(&t, 0.5).as_secs_f64()
            })
            .collect();
        let (ours, theirs) = (merged(&ours), merged(&theirs));
        let p50 = support::quantile(&ours, 0.5);
        let mut line = format!(
            "SUMMARY: hand-off    | W={w:<2} {:<9} | redlease p50 {} ms p99 {} ms ({} samples)",
            format!("{shape:?}"),
            support::ms(p50),
            support::ms(support::quantile(&ours, 0.99)),
            ours.len()
        );
        if !theirs.is_empty() {
            let peer = support::quantile(&theirs, 0.5);
            let ratio = p50.as_secs_f64() / peer.as_secs_f64();
            line.push_str(&format!(
                " | python-redis-lock p50 {} ms p99 {} ms ({} samples) | ratio {ratio:.2} (goal <= 0.5: {})",
                support::ms(peer),
                support::ms(support::quantile(&theirs, 0.99)),
                theirs.len(),
                if ratio <= 0.5 { "PASS" } else { "MISS" }
            ));
            let each: Vec<String> = rounds_ratios.iter().map(|r| format!("{r:.2}")).collect();
            line.push_str(&format!(" | each round {}", each.join(", ")));
        }
        println!("{line}");
    }
}
