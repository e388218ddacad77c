//! The lock across OS processes: worker processes (this test binary run
//! again, see `worker`) increment a shared counter under the lock with no lost
//! update, and a holder process killed with SIGKILL is waited out by its lease
//! (explicit or watchdog) within the lease + 2 s.

use std::env;
use std::fs::{self, File};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{self, wait_until, RedisServer};
use redlease::Client;

/// Selects the worker's job; absent in a normal test run.
const ROLE: &str = "REDLEASE_MP_ROLE";
const URL: &str = "REDLEASE_MP_URL";
const THREADS: &str = "REDLEASE_MP_THREADS";
const ROUNDS: &str = "REDLEASE_MP_ROUNDS";
/// What a holder worker prints once it holds the lock.
const ACQUIRED: &str = "REDLEASE-WORKER-ACQUIRED";
const LOCK: &str = "mp:lock";
const FAIR: &str = "mp:fair";
const SEMAPHORE: &str = "mp:semaphore";
/// A fair-lock worker's number.
const INDEX: &str = "REDLEASE_MP_INDEX";
const COUNTER: &str = "mp:counter";
/// The application name of the `hold-named` worker.
const NAMED: &str = "mp-named-holder";
const WAIT: Duration = Duration::from_secs(10);
/// Lease of the killed holder (explicit, or its watchdog_timeout).
const HOLDER_LEASE: Duration = Duration::from_secs(2);

fn env_usize(name: &str) -> usize {
    env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

// ---------------------------------------------------------------------------
// The worker side
// ---------------------------------------------------------------------------

/// Not a test of its own: the entry point of the worker processes the other
/// tests start. Returns at once in a normal run.
#[test]
fn worker() {
    let Ok(role) = env::var(ROLE) else {
        return;
    };
    let url = env::var(URL).expect("REDLEASE_MP_URL");
    match role.as_str() {
        "count" => count_worker(&url),
        "hold-lease" => hold_worker(&url, true),
        "hold-watchdog" => hold_worker(&url, false),
        "hold-named" => named_worker(&url),
        "redlock-count" => redlock_worker(&url),
        "fenced-tokens" => fenced_worker(&url),
        "redlock-hold" => redlock_hold_worker(&url),
        "fair-in-line" => fair_worker(&url),
        "semaphore-count" => semaphore_worker(&url),
        other => panic!("unknown worker role {other:?}"),
    }
}

/// The worker side of [`start_workers`]: says this process is ready on the
/// server at `gate_url`, then runs THREADS threads that each wait for the
/// start signal and then run `body` (made per thread) with a connection to
/// that server.
fn gated_threads<F>(gate_url: &str, mut make: impl FnMut() -> F)
where
    F: FnOnce(&mut redis::Connection) + Send + 'static,
{
    let threads = env_usize(THREADS);
    let redis = redis::Client::open(gate_url).unwrap();
    let mut admin = redis.get_connection().unwrap();
    let _: i64 = redis::cmd("INCR")
        .arg("mp:ready")
        .query(&mut admin)
        .unwrap();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let body = make();
            let mut conn = redis.get_connection().unwrap();
            thread::spawn(move || {
                let go: Option<(String, String)> = redis::cmd("BLPOP")
                    .arg("mp:go")
                    .arg(30)
                    .query(&mut conn)
                    .unwrap();
                go.expect("the start signal within 30 s");
                body(&mut conn);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a worker thread panicked");
    }
}

/// Waits at the cross-process start gate, then each thread does ROUNDS
/// GET/SET increments of COUNTER under LOCK.
fn count_worker(url: &str) {
    let rounds = env_usize(ROUNDS);
    let client = Client::open(url).expect("worker client");
    gated_threads(url, || {
        let lock = client.lock(LOCK);
        move |conn: &mut redis::Connection| {
            for _ in 0..rounds {
                let guard = lock.lock().expect("lock() in a worker");
                let n: Option<u64> = redis::cmd("GET").arg(COUNTER).query(conn).unwrap();
                let _: () = redis::cmd("SET")
                    .arg(COUNTER)
                    .arg(n.unwrap_or(0) + 1)
                    .query(conn)
                    .unwrap();
                guard.ensure_held().expect("still held");
                guard.unlock().expect("unlock() in a worker");
            }
        }
    });
}

/// The RedLock's masters (comma-separated urls in `URL`): one client each.
fn redlock_clients(urls: &str) -> Vec<Client> {
    urls.split(',')
        .map(|u| {
            Client::builder(u)
                .response_timeout(Duration::from_millis(300))
                .connection_timeout(Duration::from_millis(300))
                .watchdog_timeout(HOLDER_LEASE)
                .sync_replicas(0, Duration::ZERO)
                .build_lazy()
                .expect("worker client")
        })
        .collect()
}

/// RedLock workers: `URL` holds the masters' urls and, last, the oracle
/// server's. Each thread does ROUNDS sections under a RedLock over the
/// masters; inside, INCR of an "inside" counter on the oracle must give 1
/// (else an overlap is counted), and a GET/SET increment must not be lost.
fn redlock_worker(urls: &str) {
    let rounds = env_usize(ROUNDS);
    let (masters, oracle) = urls.rsplit_once(',').expect("masters,oracle");
    let clients = redlock_clients(masters);
    gated_threads(oracle, || {
        let red = redlease::RedLock::new(clients.iter().map(|c| c.lock(LOCK)).collect())
            .expect("RedLock");
        move |conn: &mut redis::Connection| {
            let mut done = 0;
            while done < rounds {
                let guard = match red.try_lock_for(Duration::from_secs(20)) {
                    Ok(Some(g)) => g,
                    Ok(None) => panic!("no RedLock within 20 s"),
                    // A master stopped at the wrong moment: try again.
                    Err(e) if e.is_connection_error() => continue,
                    Err(e) => panic!("RedLock in a worker: {e}"),
                };
                let inside: i64 = redis::cmd("INCR").arg("rl:inside").query(conn).unwrap();
                if inside != 1 {
                    let _: i64 = redis::cmd("INCR").arg("rl:overlaps").query(conn).unwrap();
                }
                let n: Option<u64> = redis::cmd("GET").arg(COUNTER).query(conn).unwrap();
                let _: () = redis::cmd("SET")
                    .arg(COUNTER)
                    .arg(n.unwrap_or(0) + 1)
                    .query(conn)
                    .unwrap();
                let _: i64 = redis::cmd("DECR").arg("rl:inside").query(conn).unwrap();
                if let Err(e) = guard.unlock() {
                    // Completed in the background by the member's client.
                    eprintln!("unlock: {e}");
                }
                done += 1;
            }
        }
    });
}

/// Fenced-lock workers: each thread takes the fenced lock ROUNDS times and,
/// while holding it, appends its token to a list (in the order the lock was
/// held).
fn fenced_worker(url: &str) {
    let rounds = env_usize(ROUNDS);
    let client = Client::open(url).expect("worker client");
    gated_threads(url, || {
        let lock = client.fenced_lock(LOCK);
        move |conn: &mut redis::Connection| {
            for _ in 0..rounds {
                let guard = lock.lock().expect("lock() in a worker");
                let token = guard.token().expect("a fenced lock's token");
                let _: i64 = redis::cmd("RPUSH")
                    .arg("mp:tokens")
                    .arg(token)
                    .query(conn)
                    .unwrap();
                guard.unlock().expect("unlock() in a worker");
            }
        }
    });
}

/// Waits in line for the fair lock FAIR (up to 30 s); once it holds it,
/// appends its number (REDLEASE_MP_INDEX) to `mp:order`.
fn fair_worker(url: &str) {
    let index = env_usize(INDEX);
    let client = Client::open(url).expect("worker client");
    let guard = client
        .fair_lock(FAIR)
        .try_lock_for(Duration::from_secs(30))
        .expect("fair lock in a worker")
        .expect("its turn within 30 s");
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: i64 = redis::cmd("RPUSH")
        .arg("mp:order")
        .arg(index)
        .query(&mut conn)
        .unwrap();
    guard.unlock().expect("unlock in a worker");
}

/// Waits at the start gate, then each thread takes a permit of the
/// semaphore SEMAPHORE ROUNDS times; inside, it counts itself in
/// `mp:inside` and records the highest count seen in `mp:peak`.
fn semaphore_worker(url: &str) {
    const ENTER: &str = "local n = redis.call('incr', KEYS[1]); if n > tonumber(redis.call('get', KEYS[2]) or '0') then redis.call('set', KEYS[2], n) end; return n";
    let rounds = env_usize(ROUNDS);
    let client = Client::open(url).expect("worker client");
    gated_threads(url, || {
        let sem = client.semaphore(SEMAPHORE);
        move |conn: &mut redis::Connection| {
            for _ in 0..rounds {
                let permit = sem.acquire(1).expect("acquire in a worker");
                let _: i64 = redis::cmd("EVAL")
                    .arg(ENTER)
                    .arg(2)
                    .arg("mp:inside")
                    .arg("mp:peak")
                    .query(conn)
                    .unwrap();
                thread::sleep(Duration::from_micros(300));
                let _: i64 = redis::cmd("DECR").arg("mp:inside").query(conn).unwrap();
                permit.release().expect("release in a worker");
            }
        }
    });
}

/// Takes a watched RedLock over the masters in `URL`, says so, and holds it
/// until killed.
fn redlock_hold_worker(urls: &str) {
    let clients = redlock_clients(urls);
    let red = redlease::RedLock::new(clients.iter().map(|c| c.lock(LOCK)).collect()).unwrap();
    let guard = red.lock().expect("RedLock");
    let mut out = std::io::stdout();
    writeln!(out, "\n{ACQUIRED}").unwrap();
    out.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    drop(guard);
}

/// Takes LOCK (with an explicit lease, or watched with watchdog_timeout =
/// HOLDER_LEASE), says so on stdout, then holds it until killed (at most
/// 60 s).
fn hold_worker(url: &str, explicit_lease: bool) {
    let client = Client::builder(url)
        .watchdog_timeout(HOLDER_LEASE)
        .build()
        .expect("worker client");
    let lock = client.lock(LOCK);
    let guard = if explicit_lease {
        lock.lock_with_lease(HOLDER_LEASE).unwrap()
    } else {
        let g = lock.lock().unwrap();
        // Show the watchdog at work before the parent kills us.
        wait_until("two renewals", WAIT, || client.stats().renewals >= 2);
        g
    };
    let mut out = std::io::stdout();
    writeln!(out, "\n{ACQUIRED}").unwrap();
    out.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    drop(guard);
}

/// Holds LOCK and a permit of an expirable semaphore from a client named
/// `NAMED`, until killed.
fn named_worker(url: &str) {
    let client = Client::builder(url)
        .name(NAMED)
        .watchdog_timeout(HOLDER_LEASE)
        .build()
        .expect("worker client");
    let _guard = client.lock(LOCK).lock().unwrap();
    let sem = client.permit_expirable_semaphore(SEMAPHORE);
    sem.try_set_permits(1).unwrap();
    let _permit = sem.acquire(Duration::from_secs(60)).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "\n{ACQUIRED}").unwrap();
    out.flush().unwrap();
    thread::sleep(Duration::from_secs(60));
}

// ---------------------------------------------------------------------------
// The parent side
// ---------------------------------------------------------------------------

static WORKERS: AtomicUsize = AtomicUsize::new(0);

/// A worker process, killed and reaped on drop; its output goes to a file.
struct Worker {
    child: Child,
    out: PathBuf,
}

impl Worker {
    fn spawn(role: &str, url: &str, vars: &[(&str, String)]) -> Worker {
        let out = env::temp_dir().join(format!(
            "redlease-mp-{}-{}.log",
            std::process::id(),
            WORKERS.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::create(&out).expect("worker log file");
        let child = crate::worker_process("multiprocess::worker")
            .env(ROLE, role)
            .env(URL, url)
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn a worker process");
        Worker { child, out }
    }

    fn output(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits (bounded) for the process to exit and checks it succeeded.
    fn wait_success(&mut self, within: Duration) {
        let mut status = None;
        wait_until("a worker process to exit", within, || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        let status = status.unwrap();
        assert!(
            status.success(),
            "worker failed ({status}):\n{}",
            self.output()
        );
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.out);
    }
}

/// Waits until `processes` workers said they are ready on `srv`, then lets
/// their `threads` threads each go at once; returns when.
fn start_workers(srv: &RedisServer, processes: usize, threads: usize) -> Instant {
    wait_until(
        "every worker process to be ready",
        Duration::from_secs(30),
        || srv.cmd(&["GET", "mp:ready"]) == processes.to_string(),
    );
    let tokens = vec!["go"; processes * threads];
    let _: i64 = redis::cmd("RPUSH")
        .arg("mp:go")
        .arg(&tokens)
        .query(&mut srv.conn())
        .unwrap();
    Instant::now()
}

/// Runs `processes` workers of `role` (`threads` threads x `rounds` each)
/// against `url`, gated on `gate`, and waits (up to `within`) for all to
/// succeed; returns how long they ran.
fn run_workers(
    role: &str,
    url: &str,
    gate: &RedisServer,
    (processes, threads, rounds): (usize, usize, usize),
    within: Duration,
) -> Duration {
    let vars = [(THREADS, threads.to_string()), (ROUNDS, rounds.to_string())];
    let mut workers: Vec<Worker> = (0..processes)
        .map(|_| Worker::spawn(role, url, &vars))
        .collect();
    let started = start_workers(gate, processes, threads);
    for w in &mut workers {
        w.wait_success(within);
    }
    started.elapsed()
}

#[test]
fn no_lost_update_across_processes() {
    const PROCESSES: usize = 3;
    const THREADS_EACH: usize = 3;
    const ROUNDS_EACH: usize = 100;
    let srv = RedisServer::start();
    let took = run_workers(
        "count",
        &srv.url(),
        &srv,
        (PROCESSES, THREADS_EACH, ROUNDS_EACH),
        Duration::from_secs(60),
    );
    let mut conn = srv.conn();
    let n: u64 = redis::cmd("GET").arg(COUNTER).query(&mut conn).unwrap();
    assert_eq!(
        n,
        (PROCESSES * THREADS_EACH * ROUNDS_EACH) as u64,
        "lost updates across processes"
    );
    let exists: bool = redis::cmd("EXISTS").arg(LOCK).query(&mut conn).unwrap();
    assert!(!exists, "the lock is free at the end");
    eprintln!(
        "FIGURE: {PROCESSES} processes x {THREADS_EACH} threads x {ROUNDS_EACH} GET/SET sections \
         under one lock: {:.0} ms ({:.0} sections/s)",
        took.as_secs_f64() * 1000.0,
        n as f64 / took.as_secs_f64()
    );
}

/// Starts a holder worker of `role`, blocks a waiter of this process in
/// lock(), kills the holder with SIGKILL and returns kill -> acquired.
fn kill_holder_and_measure(role: &str) -> Duration {
    let srv = RedisServer::start();
    let mut holder = Worker::spawn(role, &srv.url(), &[]);
    wait_until(
        &format!("the {role} worker to acquire"),
        Duration::from_secs(30),
        || holder.output().contains(ACQUIRED),
    );

    let client = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = client.lock(LOCK);
    assert!(lock.is_locked().unwrap(), "the worker holds the lock");
    assert_eq!(lock.hold_count().unwrap(), 0);

    let (tx, rx) = mpsc::channel();
    let waiter = lock.clone();
    thread::spawn(move || {
        let result = waiter.lock().map(|g| {
            let at = Instant::now();
            drop(g);
            at
        });
        let _ = tx.send(result.map_err(|e| e.to_string()));
    });
    wait_until("the waiter to block in lock()", WAIT, || {
        client.stats().subscribed_channels == 2
    });
    let pttl: i64 = redis::cmd("PTTL").arg(LOCK).query(&mut srv.conn()).unwrap();
    assert!(
        pttl > 0,
        "the worker's lock expired before the kill (PTTL {pttl})"
    );
    assert!(
        matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "the waiter acquired while the worker held the lock"
    );

    let killed = Instant::now();
    holder.child.kill().expect("SIGKILL the holder");
    holder.child.wait().expect("reap the holder");
    let bound = HOLDER_LEASE + Duration::from_secs(2);
    let acquired = rx
        .recv_timeout(bound + WAIT)
        .expect("the waiter to acquire after the holder died")
        .expect("the waiter's lock()");
    let delay = acquired - killed;
    assert!(
        delay < bound,
        "{role}: acquired {delay:?} after the kill, beyond the lease + 2 s"
    );
    eprintln!(
        "FIGURE: {role}: holder killed with SIGKILL (PTTL {pttl} ms just before) -> \
         waiter in another process acquired after {:.0} ms (lease {HOLDER_LEASE:?})",
        delay.as_secs_f64() * 1000.0
    );
    delay
}

#[test]
fn killed_holder_with_explicit_lease_is_waited_out() {
    kill_holder_and_measure("hold-lease");
}

#[test]
fn killed_holder_with_watchdog_lease_is_waited_out() {
    kill_holder_and_measure("hold-watchdog");
}

/// Mutual exclusion of a RedLock across 3 processes x 4 threads while one of
/// its 3 masters is stopped (SIGSTOP) and continued again and again: no two
/// sections overlap, no update is lost.
#[test]
fn redlock_excludes_across_processes_while_a_master_stops_and_starts() {
    const PROCESSES: usize = 3;
    const THREADS_EACH: usize = 4;
    const ROUNDS_EACH: usize = 25;
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let oracle = RedisServer::start();
    let mut urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    urls.push(oracle.url());
    let urls = urls.join(",");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flapping = {
        let stop = std::sync::Arc::clone(&stop);
        let pid = masters[2].pid().expect("master runs");
        thread::spawn(move || {
            let mut cycles = 0;
            while !stop.load(Ordering::Acquire) {
                let _ = Command::new("kill")
                    .args(["-STOP", &pid.to_string()])
                    .status();
                thread::sleep(Duration::from_millis(400));
                let _ = Command::new("kill")
                    .args(["-CONT", &pid.to_string()])
                    .status();
                thread::sleep(Duration::from_millis(200));
                cycles += 1;
            }
            cycles
        })
    };
    let took = run_workers(
        "redlock-count",
        &urls,
        &oracle,
        (PROCESSES, THREADS_EACH, ROUNDS_EACH),
        Duration::from_secs(120),
    );
    stop.store(true, Ordering::Release);
    let cycles = flapping.join().expect("the flapping thread");
    let mut conn = oracle.conn();
    let n: u64 = redis::cmd("GET").arg(COUNTER).query(&mut conn).unwrap();
    let overlaps: Option<u64> = redis::cmd("GET")
        .arg("rl:overlaps")
        .query(&mut conn)
        .unwrap();
    eprintln!(
        "FIGURE: RedLock over 3 masters, {PROCESSES} processes x {THREADS_EACH} threads x \
         {ROUNDS_EACH} sections, one master stopped and continued {cycles} times: {n} sections \
         in {:.1} s, {} overlaps",
        took.as_secs_f64(),
        overlaps.unwrap_or(0)
    );
    assert_eq!(overlaps.unwrap_or(0), 0, "two holders at once");
    assert_eq!(
        n,
        (PROCESSES * THREADS_EACH * ROUNDS_EACH) as u64,
        "lost updates"
    );
    assert!(
        cycles >= 2,
        "the master was stopped and continued several times during the run ({cycles})"
    );
}

/// A process holding a watched RedLock is killed with SIGKILL: a waiter in
/// this process takes it once the members' leases run out.
#[test]
fn killed_redlock_holder_is_waited_out() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let urls = urls.join(",");
    let mut holder = Worker::spawn("redlock-hold", &urls, &[]);
    wait_until(
        "the RedLock worker to acquire",
        Duration::from_secs(30),
        || holder.output().contains(ACQUIRED),
    );
    let clients = redlock_clients(&urls);
    let red = redlease::RedLock::new(clients.iter().map(|c| c.lock(LOCK)).collect()).unwrap();
    assert!(
        red.try_lock().expect("try_lock").is_none(),
        "held by the worker"
    );
    let killed = Instant::now();
    holder.child.kill().expect("SIGKILL the holder");
    holder.child.wait().expect("reap the holder");
    let g = red
        .try_lock_for(HOLDER_LEASE + WAIT)
        .expect("waiter")
        .expect("acquired after the holder died");
    let delay = killed.elapsed();
    eprintln!(
        "FIGURE: RedLock holder killed with SIGKILL -> taken by another process after {:.0} ms \
         (lease {HOLDER_LEASE:?})",
        delay.as_secs_f64() * 1000.0
    );
    assert!(delay < HOLDER_LEASE + Duration::from_secs(2), "{delay:?}");
    g.unlock().expect("unlock");
}

/// Fencing tokens seen by successive holders of a fenced lock across 3
/// processes x 3 threads strictly increase.
#[test]
fn fenced_tokens_increase_across_processes() {
    const PROCESSES: usize = 3;
    const THREADS_EACH: usize = 3;
    const ROUNDS_EACH: usize = 30;
    let srv = RedisServer::start();
    run_workers(
        "fenced-tokens",
        &srv.url(),
        &srv,
        (PROCESSES, THREADS_EACH, ROUNDS_EACH),
        Duration::from_secs(60),
    );
    let tokens: Vec<u64> = redis::cmd("LRANGE")
        .arg("mp:tokens")
        .arg(0)
        .arg(-1)
        .query(&mut srv.conn())
        .unwrap();
    assert_eq!(tokens.len(), PROCESSES * THREADS_EACH * ROUNDS_EACH);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in the order the lock was held strictly increase"
    );
}

/// The fair lock's line of waiters across processes.
fn fair_line(srv: &RedisServer) -> usize {
    srv.cmd(&["LLEN", "redisson_lock_queue:{mp:fair}"])
        .parse()
        .unwrap_or(0)
}

/// Worker processes that came one after another get the fair lock in that
/// order; one SIGKILLed while in line holds up the others only until its
/// place runs out.
#[test]
fn fair_lock_serves_processes_in_arrival_order_past_a_crashed_one() {
    let srv = RedisServer::start();
    let parent = Client::open(srv.url()).expect("client");
    let guard = parent.fair_lock(FAIR).lock().expect("lock");
    let mut workers = Vec::new();
    for i in 0..4 {
        workers.push(Worker::spawn(
            "fair-in-line",
            &srv.url(),
            &[(INDEX, i.to_string())],
        ));
        wait_until(
            &format!("worker {i} to be in line"),
            Duration::from_secs(30),
            || fair_line(&srv) == i + 1,
        );
    }
    // The second in line crashes.
    let crashed = workers.remove(1);
    drop(crashed);
    let released = Instant::now();
    drop(guard);
    for w in &mut workers {
        w.wait_success(Duration::from_secs(40));
    }
    let took = released.elapsed();
    let order: Vec<usize> = redis::cmd("LRANGE")
        .arg("mp:order")
        .arg(0)
        .arg(-1)
        .query(&mut srv.conn())
        .unwrap();
    assert_eq!(
        order,
        vec![0, 2, 3],
        "arrival order, the crashed one skipped"
    );
    eprintln!("figure: 3 processes served in {took:?} past a crashed waiter");
    assert!(
        took < redlease::FAIR_PLACE + Duration::from_secs(6),
        "the crashed waiter held up the line {took:?}"
    );
}

/// A semaphore of 2 shared by 3 processes x 3 threads: never more than 2
/// inside, and 2 at times.
#[test]
fn semaphore_limit_holds_across_processes() {
    let srv = RedisServer::start();
    let setup = Client::open(srv.url()).expect("client");
    assert!(setup.semaphore(SEMAPHORE).try_set_permits(2).expect("set"));
    run_workers(
        "semaphore-count",
        &srv.url(),
        &srv,
        (3, 3, 20),
        Duration::from_secs(60),
    );
    assert_eq!(
        srv.cmd(&["GET", "mp:peak"]),
        "2",
        "at most (and at times) 2 inside"
    );
    assert_eq!(srv.cmd(&["GET", SEMAPHORE]), "2", "every permit back");
}

/// A holder in another process is listed with that process (host, pid,
/// name), for a lock and for a permit; once the process is killed, its
/// process key expires within its lease.
#[test]
fn holders_in_another_process_name_it() {
    let srv = RedisServer::start();
    let mut holder = Worker::spawn("hold-named", &srv.url(), &[]);
    wait_until(
        "the named worker to acquire",
        Duration::from_secs(30),
        || holder.output().contains(ACQUIRED),
    );
    let client = Client::open(srv.url()).unwrap();
    let pid = holder.child.id();
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let mut holders = Vec::new();
    wait_until("the worker's process key", WAIT, || {
        holders = client.lock(LOCK).holders().unwrap();
        holders.len() == 1 && holders[0].process.is_some()
    });
    let process = holders[0].process.clone().unwrap();
    assert_eq!(process.pid, pid, "{holders:?}");
    assert_eq!(process.host, host);
    assert_eq!(process.name.as_deref(), Some(NAMED));
    assert_ne!(holders[0].client_id.as_deref(), Some(client.id()));
    let permits = client
        .permit_expirable_semaphore(SEMAPHORE)
        .holders()
        .unwrap();
    assert_eq!(permits.len(), 1);
    assert_eq!(
        permits[0].client_id, holders[0].client_id,
        "the permit's client"
    );
    assert_eq!(permits[0].process.as_ref(), Some(&process));
    let key = support::process_key(&process.client_id);
    assert_eq!(srv.cmd(&["EXISTS", &key]), "1");
    holder.child.kill().expect("SIGKILL the holder");
    holder.child.wait().expect("reap the holder");
    wait_until(
        "the killed process's key to expire",
        HOLDER_LEASE + WAIT,
        || srv.cmd(&["EXISTS", &key]) == "0",
    );
    let left = client
        .permit_expirable_semaphore(SEMAPHORE)
        .holders()
        .unwrap();
    assert!(
        left.iter().all(|h| h.process.is_none()),
        "no process for a client that is gone: {left:?}"
    );
}
