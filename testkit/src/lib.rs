//! Integration-test support: real `redis-server` processes, a fault-injecting
//! TCP proxy, and the polling helpers tests use to wait for conditions.
//!
//! Use from an integration test or bench as `use redlease_testkit as support;`.
//!
//! * [`RedisServer`] — a private `redis-server` on a free loopback port, with
//!   kill / stop / restart (same port) / pause (SIGSTOP) / resume (SIGCONT)
//!   and a few admin helpers.
//! * [`Proxy`] — a blocking, thread-per-direction TCP proxy in front of a
//!   server that can cut connections, stall or delay traffic, and drop the
//!   reply to one chosen request ([`Proxy::cut_after_request`]).
//! * [`Cluster`] — a Redis Cluster of such servers (optionally each behind
//!   a [`Proxy`]), with slot-migration, failover and statistics helpers.
//! * [`wait_until`] — the only sanctioned way for a test to wait.
//!
//! Environment: `REDIS_SERVER_BIN` overrides the `redis-server` binary,
//! `REDIS_CLI_BIN` the `redis-cli` binary (default: a `redis-cli` next to
//! `REDIS_SERVER_BIN` if present, else `redis-cli` from `PATH`).
#![allow(dead_code)]

mod cluster;
pub use cluster::*;

use std::collections::{BTreeSet, HashMap};
use std::env;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a (re)started server gets to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout for the raw admin connections used by [`RedisServer`] helpers.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports [`RedisServer::start`] (and [`start_on_a_free_port`])
/// tries before giving up.
const START_ATTEMPTS: usize = 5;

// ---------------------------------------------------------------------------
// Free functions
// ---------------------------------------------------------------------------

/// The key where the redlease client `client_id` (`Client::id`) publishes
/// its process: `redlease_client:{<first 16 hex digits of the id>}`.
pub fn process_key(client_id: &str) -> String {
    let short: String = client_id.chars().filter(|c| *c != '-').take(16).collect();
    format!("redlease_client:{{{short}}}")
}

/// Why a process did not start on a port ([`start_on_a_free_port`]).
pub struct StartFailure {
    /// What happened, with the process's log.
    pub why: String,
    /// Another port can help (the port was taken); `false` for a failure
    /// that would repeat on any port (a bad configuration).
    pub another_port_helps: bool,
}

/// Starts a process with `start`, which gets a port from `pick_port` and a
/// fresh temp directory of its own (`redlease-<tag>-<pid>-<n>-<port>`;
/// `start` owns it from then on, and it is removed after a failure). A port
/// found free can be taken by another process before the new one binds
/// it: then the next port is tried, up to [`START_ATTEMPTS`] in all.
/// Panics with every try's failure when none started.
pub fn start_on_a_free_port<T>(
    what: &str,
    tag: &str,
    pick_port: &mut dyn FnMut() -> u16,
    mut start: impl FnMut(u16, PathBuf) -> Result<T, StartFailure>,
) -> T {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let mut failures = Vec::new();
    for _ in 0..START_ATTEMPTS {
        let port = pick_port();
        let dir = env::temp_dir().join(format!(
            "redlease-{tag}-{}-{}-{port}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        match start(port, dir.clone()) {
            Ok(started) => return started,
            Err(failure) => {
                let _ = fs::remove_dir_all(&dir);
                failures.push(format!("--- port {port}: {}", failure.why));
                if !failure.another_port_helps {
                    break;
                }
            }
        }
    }
    panic!(
        "{what} failed to start ({} attempt(s)):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A currently free TCP port on 127.0.0.1 (bind to port 0, read it, release
/// it), never one this process was handed before: the kernel may give the
/// port it just gave once more (two sentinels of one group were once
/// handed one port), and a test that asks for two ports at once (a
/// server's TLS and cluster bus ports) needs two. Still racy against other
/// processes: someone else may grab it before you bind it.
pub fn free_port() -> u16 {
    free_port_from(&mut || {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.local_addr().expect("local_addr").port()
    })
}

/// [`free_port`] with `pick` finding the ports: the first one this process
/// was not handed before.
pub fn free_port_from(pick: &mut dyn FnMut() -> u16) -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    const TRIES: usize = 1000;
    for _ in 0..TRIES {
        let port = pick();
        if lock(&HANDED_OUT).insert(port) {
            return port;
        }
    }
    panic!("no port in {TRIES} tries that this process was not handed before");
}

/// Polls `f` every 5 ms until it returns `true`.
///
/// Panics with `"timed out after {timeout:?} waiting for {what}"` if it does
/// not within `timeout`. `f` is always called at least once, and once more
/// after the deadline has passed.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return;
        }
        if Instant::now() >= deadline {
            // One last look, so a slow `f` does not cause a spurious failure.
            if f() {
                return;
            }
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The `redis-server` binary: `$REDIS_SERVER_BIN` if set, else `redis-server`
/// looked up on `PATH`.
///
/// Panics with "redis-server not found: install it (apt-get install
/// redis-server) or set REDIS_SERVER_BIN" if it cannot be found.
pub fn redis_server_path() -> PathBuf {
    let found = match env::var_os("REDIS_SERVER_BIN") {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            if p.components().count() > 1 {
                p.is_file().then_some(p)
            } else {
                find_in_path(&p)
            }
        }
        _ => find_in_path(Path::new("redis-server")),
    };
    found.unwrap_or_else(|| {
        panic!(
            "redis-server not found: install it (apt-get install redis-server) or set REDIS_SERVER_BIN"
        )
    })
}

/// The `redis-cli` binary: `$REDIS_CLI_BIN`, else a `redis-cli` next to the
/// server binary, else `redis-cli` (resolved by the OS via `PATH`).
pub fn redis_cli_path() -> PathBuf {
    if let Some(p) = env::var_os("REDIS_CLI_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(dir) = redis_server_path().parent() {
        let sibling = dir.join("redis-cli");
        if sibling.is_file() {
            return sibling;
        }
    }
    PathBuf::from("redis-cli")
}

fn find_in_path(name: &Path) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `true` if something at `addr` answers `PING` with `+PONG` within `timeout`
/// (used for connect, write and read separately).
pub fn ping(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(raw_command(addr, &["PING"], timeout), Ok(Resp::Simple(s)) if s == "PONG")
}

/// A RESP2 reply as read by [`raw_command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...` (`None` is the nil bulk string)
    Bulk(Option<Vec<u8>>),
    /// `*...` (`None` is the nil array)
    Array(Option<Vec<Resp>>),
}

/// Sends one command over a fresh raw TCP connection (no handshake, no
/// `CLIENT SETINFO`, so exactly one command is executed) and reads one reply.
pub fn raw_command(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<Resp> {
    let to_io = |e: redis::RedisError| io::Error::other(e.to_string());
    let client = redis::Client::open(format!("redis://{addr}/")).map_err(to_io)?;
    let mut conn = client.get_connection_with_timeout(timeout).map_err(to_io)?;
    conn.set_read_timeout(Some(timeout)).map_err(to_io)?;
    conn.set_write_timeout(Some(timeout)).map_err(to_io)?;
    let Some((name, rest)) = args.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    };
    let mut cmd = redis::cmd(name);
    for a in rest {
        cmd.arg(*a);
    }
    let reply = redis::ConnectionLike::req_command(&mut conn, &cmd).map_err(to_io)?;
    Ok(Resp::from(reply))
}

impl From<redis::Value> for Resp {
    fn from(v: redis::Value) -> Resp {
        match v {
            redis::Value::Nil => Resp::Bulk(None),
            redis::Value::Int(n) => Resp::Int(n),
            redis::Value::BulkString(b) => Resp::Bulk(Some(b)),
            redis::Value::Array(items) => {
                Resp::Array(Some(items.into_iter().map(Resp::from).collect()))
            }
            redis::Value::SimpleString(s) => Resp::Simple(s),
            redis::Value::Okay => Resp::Simple("OK".to_owned()),
            redis::Value::ServerError(e) => Resp::Error(match e.details() {
                Some(d) => format!("{} {d}", e.code()),
                None => e.code().to_owned(),
            }),
            other => Resp::Simple(format!("{other:?}")),
        }
    }
}

/// Encodes `args` as a RESP array of bulk strings.
pub fn encode_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends `-SIG` to `pid` with the `kill` utility (no libc in this crate).
fn signal(pid: u32, sig: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{sig} {pid}: {status}")))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("<cannot read {}: {e}>", path.display()))
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

struct ServerState {
    /// The spawned process: redis-server itself, or for a watched server
    /// the `sh` wrapper around it (see [`WATCH_SCRIPT`]).
    child: Option<Child>,
    /// Pid of the redis-server process itself (meaningful while `child` is
    /// `Some`; equal to the child's pid unless watched).
    pid: u32,
    paused: bool,
}

/// A private `redis-server` process bound to 127.0.0.1 on its own port, with
/// persistence disabled and its own temp dir (log file `redis.log`, plus
/// `stderr.log` for anything printed before the log file is opened).
///
/// All methods take `&self` (state is behind a mutex), so a server can be
/// shared with other threads through an `Arc`. Dropping it kills the process
/// and removes the temp dir; if the thread is panicking the last 50 log
/// lines are printed to stderr first.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// Launched through the parent-watch wrapper ([`WATCH_SCRIPT`]).
    watched: bool,
    state: Mutex<ServerState>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    pub fn start() -> RedisServer {
        Self::start_with_args(&[])
    }

    /// Like [`RedisServer::start`], appending `extra_args` (e.g.
    /// `["--enable-debug-command", "yes"]`) to the command line. They are
    /// reused by [`RedisServer::restart`].
    pub fn start_with_args(extra_args: &[&str]) -> RedisServer {
        Self::start_inner(extra_args, false, free_port)
    }

    /// Like [`RedisServer::start_with_args`], for a server that listens on
    /// `ports` more ports than its own (a TLS port, a cluster bus port):
    /// `args` makes the extra arguments from them. Each attempt takes fresh
    /// free ports, since one found free can be taken by another process
    /// before the server binds it (then the next attempt tries others).
    /// Returns the server and the ports it listens on beside its own.
    pub fn start_with_ports(
        ports: usize,
        args: impl Fn(&[u16]) -> Vec<String>,
    ) -> (RedisServer, Vec<u16>) {
        let mut pick_port = free_port;
        Self::start_attempts(false, &mut pick_port, || {
            let extra: Vec<u16> = (0..ports).map(|_| free_port()).collect();
            (args(&extra), extra)
        })
    }

    /// Like [`RedisServer::start_with_args`], but with `pick_port` choosing
    /// each attempt's port, and with `watched` launching the server through
    /// the parent-watch wrapper ([`WATCH_SCRIPT`]): then the server (and
    /// its temp dir) also goes away when this process exits without
    /// dropping it, e.g. when held in a `static`, or killed.
    pub(crate) fn start_inner(
        extra_args: &[&str],
        watched: bool,
        pick_port: fn() -> u16,
    ) -> RedisServer {
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut pick_port = pick_port;
        Self::start_attempts(watched, &mut pick_port, || (extra_args.clone(), ())).0
    }

    /// Starts a server on a port from `pick_port`, with the extra arguments
    /// `make` gives each attempt (and what it returns beside them).
    fn start_attempts<T>(
        watched: bool,
        pick_port: &mut dyn FnMut() -> u16,
        mut make: impl FnMut() -> (Vec<String>, T),
    ) -> (RedisServer, T) {
        let bin = redis_server_path(); // panics before any temp dir exists
        start_on_a_free_port("redis-server", "test", pick_port, |port, dir| {
            let (extra_args, made) = make();
            match launch(&bin, port, &dir, &extra_args, watched) {
                Ok((child, pid)) => Ok((
                    RedisServer {
                        port,
                        dir,
                        extra_args,
                        watched,
                        state: Mutex::new(ServerState {
                            child: Some(child),
                            pid,
                            paused: false,
                        }),
                    },
                    made,
                )),
                Err(e) => {
                    let logs = logs_of(&dir);
                    Err(StartFailure {
                        why: format!("{e}\n{logs}"),
                        // A bad setting fails on every port.
                        another_port_helps: !logs.contains("FATAL CONFIG"),
                    })
                }
            }
        })
    }

    /// Appends `args` to the command line [`RedisServer::restart`] uses
    /// (for settings made at runtime with `CONFIG SET` that a restart must
    /// keep).
    pub(crate) fn append_restart_args(&mut self, args: &[String]) {
        self.extra_args.extend_from_slice(args);
    }

    /// The TCP port (stable across [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:port/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's temp dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Current contents of the log file (and of `stderr.log`, if non-empty).
    pub fn log_contents(&self) -> String {
        logs_of(&self.dir)
    }

    /// Pid of the running process, if any.
    pub fn pid(&self) -> Option<u32> {
        let state = lock(&self.state);
        state.child.as_ref().map(|_| state.pid)
    }

    /// `true` while the process exists (a paused process counts as running).
    pub fn is_running(&self) -> bool {
        let mut state = lock(&self.state);
        let exited = match state.child.as_mut() {
            None => return false,
            Some(child) => !matches!(child.try_wait(), Ok(None)),
        };
        if exited {
            state.child = None;
            state.paused = false;
        }
        !exited
    }

    /// Kills the process with SIGKILL and reaps it. No-op if not running.
    pub fn kill(&self) {
        let mut state = lock(&self.state);
        kill_child(&mut state);
    }

    /// Graceful stop: `SHUTDOWN NOSAVE` (resuming first if paused), then waits
    /// up to 10 s for the process to exit. Falls back to SIGKILL and panics if
    /// it does not exit in time. No-op if not running.
    pub fn stop(&self) {
        let mut state = lock(&self.state);
        let Some(mut child) = state.child.take() else {
            return;
        };
        let pid = state.pid;
        if std::mem::take(&mut state.paused) {
            let _ = signal(pid, "CONT");
        }
        // The server closes the connection without replying; ignore the error.
        let _ = raw_command(self.addr(), &["SHUTDOWN", "NOSAVE"], ADMIN_TIMEOUT);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                _ => break,
            }
        }
        terminate(child, pid);
        drop(state);
        panic!(
            "redis-server on port {} did not exit within 10s after SHUTDOWN NOSAVE; log:\n{}",
            self.port,
            self.log_contents()
        );
    }

    /// Starts the server again on the same port and dir with an empty
    /// dataset, waiting until it answers `PING`. If it is still running it is
    /// killed (SIGKILL) first. Retries for up to 10 s if the port cannot be
    /// bound yet.
    pub fn restart(&self) {
        let mut state = lock(&self.state);
        kill_child(&mut state);
        let _ = fs::remove_file(self.dir.join("dump.rdb"));
        let bin = redis_server_path();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut last_error;
        loop {
            match launch(&bin, self.port, &self.dir, &self.extra_args, self.watched) {
                Ok((child, pid)) => {
                    state.child = Some(child);
                    state.pid = pid;
                    return;
                }
                Err(e) => last_error = e,
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        drop(state);
        panic!(
            "redis-server failed to restart on port {}: {last_error}\nlog:\n{}",
            self.port,
            self.log_contents()
        );
    }

    /// Freezes the process with SIGSTOP: connections are still accepted by
    /// the kernel, but nothing is answered. Panics if not running.
    pub fn pause(&self) {
        let mut state = lock(&self.state);
        let pid = state
            .child
            .as_ref()
            .map(|_| state.pid)
            .expect("pause: server not running");
        signal(pid, "STOP").expect("kill -STOP");
        state.paused = true;
    }

    /// Undoes [`RedisServer::pause`] with SIGCONT. Panics if not running.
    pub fn resume(&self) {
        let mut state = lock(&self.state);
        let pid = state
            .child
            .as_ref()
            .map(|_| state.pid)
            .expect("resume: server not running");
        signal(pid, "CONT").expect("kill -CONT");
        state.paused = false;
    }

    /// `true` between [`RedisServer::pause`] and [`RedisServer::resume`].
    pub fn is_paused(&self) -> bool {
        lock(&self.state).paused
    }

    /// `PING` over a fresh raw connection with the given timeout.
    pub fn ping(&self, timeout: Duration) -> bool {
        ping(self.addr(), timeout)
    }

    /// Runs one command over a fresh redis-rs connection (5 s timeouts; the
    /// one way tests talk to Redis, typed queries use [`RedisServer::conn`])
    /// and returns the reply. Panics on I/O errors; Redis error replies are
    /// returned as [`Resp::Error`].
    pub fn raw(&self, args: &[&str]) -> Resp {
        raw_command(self.addr(), args, ADMIN_TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "{args:?} on port {} failed: {e} (is the server paused or down?)",
                self.port
            )
        })
    }

    /// `CLIENT KILL TYPE <kind>` (`normal`, `pubsub`, `replica`, `master`);
    /// returns the number of clients killed. The admin connection itself is
    /// skipped (SKIPME yes is the default).
    pub fn client_kill_type(&self, kind: &str) -> i64 {
        match self.raw(&["CLIENT", "KILL", "TYPE", kind]) {
            Resp::Int(n) => n,
            other => panic!("CLIENT KILL TYPE {kind}: unexpected reply {other:?}"),
        }
    }

    /// `CLIENT PAUSE ms [WRITE]`.
    pub fn client_pause(&self, ms: u64, write_only: bool) {
        let ms = ms.to_string();
        let mut args = vec!["CLIENT", "PAUSE", ms.as_str()];
        if write_only {
            args.push("WRITE");
        }
        match self.raw(&args) {
            Resp::Simple(s) if s == "OK" => {}
            other => panic!("{args:?}: unexpected reply {other:?}"),
        }
    }

    /// `CLIENT UNPAUSE`.
    pub fn client_unpause(&self) {
        match self.raw(&["CLIENT", "UNPAUSE"]) {
            Resp::Simple(s) if s == "OK" => {}
            other => panic!("CLIENT UNPAUSE: unexpected reply {other:?}"),
        }
    }

    /// How many clients are subscribed to `channel` (`PUBSUB NUMSUB`).
    pub fn subscribers(&self, channel: &str) -> usize {
        self.cmd(&["PUBSUB", "NUMSUB", channel])
            .lines()
            .nth(1)
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Reads `field` from `INFO <section>` as a string. Panics if missing.
    pub fn info_field(&self, section: &str, field: &str) -> String {
        let text = match self.raw(&["INFO", section]) {
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
            other => panic!("INFO {section}: unexpected reply {other:?}"),
        };
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("INFO {section} has no field {field:?}:\n{text}"))
    }

    /// Reads a numeric field from `INFO stats`, e.g.
    /// `total_commands_processed`. Uses one raw connection and one command,
    /// and that `INFO` is itself counted in the *next* reading.
    pub fn info_stat(&self, field: &str) -> u64 {
        let v = self.info_field("stats", field);
        v.parse()
            .unwrap_or_else(|_| panic!("INFO stats {field} = {v:?} is not a u64"))
    }

    /// Runs one command on the admin connection path ([`RedisServer::raw`],
    /// bounded to 5 s) and returns the reply as `redis-cli --raw` prints it,
    /// trimmed: strings and integers bare (`GET k` -> `v`, `INCR k` -> `1`),
    /// a nil reply as the empty string, array elements one per line, and
    /// error replies as text (`ERR ...`). Panics if the server does not
    /// answer (paused or down).
    pub fn cmd(&self, args: &[&str]) -> String {
        fn render(r: &Resp, out: &mut Vec<String>) {
            match r {
                Resp::Simple(s) | Resp::Error(s) => out.push(s.clone()),
                Resp::Int(n) => out.push(n.to_string()),
                Resp::Bulk(Some(b)) => out.push(String::from_utf8_lossy(b).into_owned()),
                Resp::Bulk(None) | Resp::Array(None) => out.push(String::new()),
                Resp::Array(Some(items)) => items.iter().for_each(|i| render(i, out)),
            }
        }
        let mut out = Vec::new();
        render(&self.raw(args), &mut out);
        out.join("\n").trim().to_string()
    }

    /// A typed `redis` connection straight to the server (connect timeout
    /// 5 s; read/write timeouts 10 s so a broken test fails instead of
    /// hanging — override with `set_read_timeout` if needed).
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("redis::Client::open");
        let conn = client
            .get_connection_with_timeout(ADMIN_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()));
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set_read_timeout");
        conn.set_write_timeout(Some(Duration::from_secs(10)))
            .expect("set_write_timeout");
        conn
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if thread::panicking() {
            let log = fs::read(self.dir.join("redis.log"))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(50)..];
            let _ = writeln!(
                io::stderr(),
                "---- last {} lines of redis log (port {}) ----\n{}\n---- end of redis log ----",
                tail.len(),
                self.port,
                tail.join("\n")
            );
        }
        kill_child(state);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// SIGCONT (if paused), SIGKILL, reap. Never panics.
fn kill_child(state: &mut ServerState) {
    if let Some(child) = state.child.take() {
        if state.paused {
            let _ = signal(state.pid, "CONT");
        }
        terminate(child, state.pid);
    }
    state.paused = false;
}

/// SIGKILLs the redis-server process `pid` and reaps `child` (the server
/// itself, or its watch wrapper). Never panics.
///
/// For a watched server the wrapper exits (and takes its watcher down with
/// it) once the server is dead; only then is the watch pipe closed, so the
/// watcher never sees end-of-file while it is alive and never removes the
/// temp dir (which [`RedisServer::restart`] still needs).
/// `Child::wait` would close the pipe first, hence the `try_wait` loop.
fn terminate(mut child: Child, pid: u32) {
    if child.id() == pid {
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    let _ = signal(pid, "KILL");
    let deadline = Instant::now() + Duration::from_secs(10);
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= deadline {
            let _ = child.kill(); // the wrapper itself; should not happen
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let _ = child.wait();
}

fn logs_of(dir: &Path) -> String {
    let mut out = read_lossy(&dir.join("redis.log"));
    let stderr = fs::read(dir.join("stderr.log")).unwrap_or_default();
    if !stderr.is_empty() {
        out.push_str("\n--- stderr ---\n");
        out.push_str(&String::from_utf8_lossy(&stderr));
    }
    out
}

/// The parent-watch wrapper of a watched server, run as
/// `sh -c WATCH_SCRIPT redlease-watch <dir> <redis-server> <args>...` with
/// its stdin a pipe from this process.
///
/// It starts the server in the background (stdin `/dev/null`), prints the
/// server's pid on stdout (then closes stdout), and starts a watcher that
/// reads the pipe (moved to fd 3) until end-of-file. The pipe's write end
/// lives only in this process (Rust opens pipes close-on-exec), so
/// end-of-file means this process has exited — normally, by panic or by
/// SIGKILL — or dropped the pipe: the watcher then SIGKILLs the server and
/// removes its temp dir. The wrapper itself waits for the server and exits
/// with its status (so `Child::try_wait` on the wrapper tracks the server),
/// killing the watcher first, which is then past its `trap` only if it is
/// already cleaning up. Signals (kill, pause, resume) go to the server's
/// own pid.
const WATCH_SCRIPT: &str = r#"dir=$1; shift
exec 3<&0 </dev/null
"$@" 3<&- >/dev/null &
child=$!
echo "$child"
exec >/dev/null
( cat <&3; trap '' TERM; kill -9 "$child"; rm -rf "$dir" ) 2>/dev/null &
watcher=$!
exec 3<&-
wait "$child"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"#;

/// Spawns redis-server on `port` (through [`WATCH_SCRIPT`] if `watched`)
/// and waits until *it* (checked by pid) answers; returns the child and the
/// server's pid. On failure the child is killed and reaped.
fn launch(
    bin: &Path,
    port: u16,
    dir: &Path,
    extra_args: &[String],
    watched: bool,
) -> Result<(Child, u32), String> {
    let stderr = File::options()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .map_err(|e| format!("cannot create stderr.log: {e}"))?;
    let mut command = if watched {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(WATCH_SCRIPT)
            .arg("redlease-watch")
            .arg(dir)
            .arg(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        c
    } else {
        let mut c = Command::new(bin);
        c.stdin(Stdio::null()).stdout(Stdio::null());
        c
    };
    let mut child = command
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--logfile"])
        .arg(dir.join("redis.log"))
        .arg("--dir")
        .arg(dir)
        .args(extra_args)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot spawn redis-server: {e}"))?;
    let server_pid = if watched {
        // The wrapper prints the pid right after forking the server, then
        // closes its stdout: this read ends promptly either way.
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = io::BufRead::read_line(&mut io::BufReader::new(out), &mut line);
        }
        match line.trim().parse::<u32>() {
            Ok(pid) => pid,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("watch wrapper printed no pid (got {line:?})"));
            }
        }
    } else {
        child.id()
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let pid = server_pid.to_string();
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server exited early ({status})"));
        }
        if ping(addr, Duration::from_millis(200)) {
            // Make sure it is *our* process that answered, not some other
            // server that grabbed the port first.
            let info = raw_command(addr, &["INFO", "server"], ADMIN_TIMEOUT);
            let ours = matches!(&info, Ok(Resp::Bulk(Some(b)))
                if String::from_utf8_lossy(b).lines().any(|l| l.trim() == format!("process_id:{pid}")));
            if ours {
                return Ok((child, server_pid));
            }
        }
        if Instant::now() >= deadline {
            terminate(child, server_pid);
            return Err(format!(
                "redis-server did not answer PING within {STARTUP_TIMEOUT:?}"
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// Proxy
// ---------------------------------------------------------------------------

/// One client connection and its upstream connection.
struct Pair {
    id: u64,
    client: TcpStream,
    upstream: TcpStream,
    /// Set by `cut()` / teardown; wakes stalled forwarders.
    closed: AtomicBool,
    /// Set (before forwarding) when `cut_after_request` fires on this pair:
    /// nothing more is forwarded to the client.
    doomed: AtomicBool,
    /// What the client sent (the first [`SENT_KEPT`] bytes), for
    /// [`Proxy::connections_that_sent`].
    sent: Mutex<Vec<u8>>,
    /// Delays to apply before forwarding the next server->client chunks
    /// ([`Fault::DelayReply`]), in order.
    reply_delays: Mutex<std::collections::VecDeque<Duration>>,
    /// Server->client bytes are swallowed ([`Fault::DropReply`]).
    drop_replies: AtomicBool,
    /// Both directions are swallowed ([`Fault::BlackHole`]).
    black_holed: AtomicBool,
}

/// How many bytes of what a client sent are kept per connection.
const SENT_KEPT: usize = 64 * 1024;

/// What a rule does when a client->server chunk containing its pattern passes.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Forward the request, then hold back the reply to it (the next
    /// server->client bytes on that connection, and everything behind them,
    /// in order) for this long.
    DelayReply(Duration),
    /// Hold the request back this long before forwarding it (later requests
    /// on that connection queue behind it).
    DelayRequest(Duration),
    /// Forward the request, then swallow every byte the server sends back on
    /// that connection from then on, without closing anything (the client
    /// sees no reply and times out: "request executed, reply lost, link
    /// silent"). Client->server traffic keeps flowing.
    DropReply,
    /// Swallow the request itself and everything after it in both directions
    /// on that connection, without closing either socket (a half-open,
    /// silent link: no FIN, no RST).
    BlackHole,
    /// Forward the request, then close the connection before any reply
    /// reaches the client (what [`Proxy::cut_after_request`] does).
    CutAfterRequest,
    /// Swallow the request on the client's connection (the client sees no
    /// reply and times out), and deliver it to the server this long later
    /// on a connection of its own, its reply discarded: a copy of a request
    /// that reaches Redis after its caller gave up.
    LateCopy(Duration),
}

/// Handle of a rule installed with [`Proxy::add_rule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuleId(u64);

struct Rule {
    id: u64,
    pattern: Vec<u8>,
    fault: Fault,
    remaining: usize,
    hits: usize,
    /// For each hit, the local address of the connection to the server
    /// the chunk came on (what `MONITOR` shows as its client).
    fired_on: Vec<Option<SocketAddr>>,
}

impl Pair {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }
}

struct ProxyShared {
    upstream: SocketAddr,
    shutdown: AtomicBool,
    stalled: Mutex<bool>,
    stall_cv: Condvar,
    delay: Mutex<Duration>,
    pairs: Mutex<HashMap<u64, Arc<Pair>>>,
    next_id: AtomicU64,
    total: AtomicUsize,
    trigger: Mutex<Option<Vec<u8>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    rules: Mutex<Vec<Rule>>,
    next_rule: AtomicU64,
    reject: AtomicBool,
}

impl ProxyShared {
    /// Wakes everything waiting on the stall condvar (taking the lock first
    /// so a waiter cannot miss a flag set just before).
    fn wake(&self) {
        let _guard = lock(&self.stalled);
        self.stall_cv.notify_all();
    }

    /// Blocks while stalled; `false` if the pair was closed or the proxy is
    /// shutting down in the meantime.
    fn wait_not_stalled(&self, pair: &Pair) -> bool {
        let guard = lock(&self.stalled);
        let _guard = self
            .stall_cv
            .wait_while(guard, |stalled| {
                *stalled
                    && !self.shutdown.load(Ordering::SeqCst)
                    && !pair.closed.load(Ordering::SeqCst)
            })
            .unwrap_or_else(PoisonError::into_inner);
        !self.shutdown.load(Ordering::SeqCst) && !pair.closed.load(Ordering::SeqCst)
    }

    /// Sleeps `d` in short slices; `false` if the pair was closed or the
    /// proxy shut down meanwhile.
    fn sleep(&self, pair: &Pair, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            if self.shutdown.load(Ordering::SeqCst) || pair.closed.load(Ordering::SeqCst) {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            thread::sleep((until - now).min(Duration::from_millis(10)));
        }
    }

    /// The fault of the first rule with hits left whose pattern is in
    /// `window`, which `pair` sent (counted as a hit).
    fn take_fault(&self, window: &[u8], pair: &Pair) -> Option<Fault> {
        let mut rules = lock(&self.rules);
        let rule = rules
            .iter_mut()
            .find(|r| r.remaining > 0 && contains(window, &r.pattern))?;
        rule.remaining -= 1;
        rule.hits += 1;
        rule.fired_on.push(pair.upstream.local_addr().ok());
        Some(rule.fault.clone())
    }

    fn remove(&self, pair: &Pair) {
        pair.close();
        lock(&self.pairs).remove(&pair.id);
        self.wake();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

/// A TCP proxy on 127.0.0.1 in front of a Redis server, for fault injection.
///
/// Two blocking forwarding threads per connection. Chunks are forwarded as
/// read (up to 16 KiB); [`Proxy::cut_after_request`] matches within a single
/// chunk only, which is fine for commands a client writes in one go.
/// Dropping the proxy closes every connection and joins all threads.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    /// If `upstream` refuses a connection, the client connection is closed.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy local_addr");
        let shared = Arc::new(ProxyShared {
            upstream,
            shutdown: AtomicBool::new(false),
            stalled: Mutex::new(false),
            stall_cv: Condvar::new(),
            delay: Mutex::new(Duration::ZERO),
            pairs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            total: AtomicUsize::new(0),
            trigger: Mutex::new(None),
            workers: Mutex::new(Vec::new()),
            rules: Mutex::new(Vec::new()),
            next_rule: AtomicU64::new(0),
            reject: AtomicBool::new(false),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-accept-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared))
                .expect("spawn proxy accept thread")
        };
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:port/` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The upstream address.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Immediately shuts down both sockets of every open connection pair;
    /// returns how many pairs were cut. New connections are still accepted.
    pub fn cut(&self) -> usize {
        let pairs: Vec<Arc<Pair>> = lock(&self.shared.pairs).drain().map(|(_, p)| p).collect();
        for pair in &pairs {
            pair.close();
        }
        self.shared.wake();
        pairs.len()
    }

    /// While on, nothing is forwarded in either direction, on existing and
    /// new connections alike (connections are still accepted). Bytes already
    /// read are held back, not dropped, and flow once stalling is switched
    /// off.
    pub fn stall(&self, on: bool) {
        *lock(&self.shared.stalled) = on;
        self.shared.stall_cv.notify_all();
    }

    /// Sleeps this long before forwarding each chunk, in each direction
    /// (so a request/reply round trip gains about twice `delay`).
    pub fn set_delay(&self, delay: Duration) {
        *lock(&self.shared.delay) = delay;
    }

    /// Number of client connections accepted so far.
    pub fn connections_total(&self) -> usize {
        self.shared.total.load(Ordering::SeqCst)
    }

    /// Number of connection pairs currently open.
    pub fn connections_open(&self) -> usize {
        lock(&self.shared.pairs).len()
    }

    /// Arms a one-shot trigger: the next client→server chunk containing
    /// `pattern` is forwarded to the server, then that connection is cut
    /// before any reply reaches the client ("request executed, reply lost").
    ///
    /// Precisely: the client socket is shut down at once; the upstream
    /// socket gets a write-shutdown (FIN after the request, so Redis is
    /// guaranteed to read and execute it) and whatever Redis sends back on it
    /// is discarded — including replies to earlier pipelined requests that
    /// had not been forwarded yet. Re-arming replaces a pending pattern.
    pub fn cut_after_request(&self, pattern: &[u8]) {
        assert!(!pattern.is_empty(), "cut_after_request: empty pattern");
        *lock(&self.shared.trigger) = Some(pattern.to_vec());
    }

    /// `true` while a [`Proxy::cut_after_request`] trigger has not fired.
    pub fn armed(&self) -> bool {
        lock(&self.shared.trigger).is_some()
    }

    /// Cancels a pending [`Proxy::cut_after_request`] trigger.
    pub fn disarm(&self) {
        *lock(&self.shared.trigger) = None;
    }

    /// Installs a rule: the next `times` client->server chunks (on any
    /// connection) that contain `pattern` get `fault`; `usize::MAX` means
    /// every matching chunk until the rule is removed. Rules are checked in
    /// installation order and one rule at most applies to a chunk. A pattern
    /// is matched within one chunk as read (up to 16 KiB), which is what a
    /// client writes in one go: a command, or a pipeline.
    pub fn add_rule(&self, pattern: &[u8], fault: Fault, times: usize) -> RuleId {
        assert!(!pattern.is_empty(), "add_rule: empty pattern");
        let id = self.shared.next_rule.fetch_add(1, Ordering::SeqCst);
        lock(&self.shared.rules).push(Rule {
            id,
            pattern: pattern.to_vec(),
            fault,
            remaining: times,
            hits: 0,
            fired_on: Vec::new(),
        });
        RuleId(id)
    }

    /// How many times the rule has fired so far (0 once removed).
    pub fn hits(&self, rule: RuleId) -> usize {
        lock(&self.shared.rules)
            .iter()
            .find(|r| r.id == rule.0)
            .map_or(0, |r| r.hits)
    }

    /// For each time the rule fired, the local address of the connection to
    /// the server that the chunk came on, as the server's `MONITOR` and
    /// `CLIENT LIST` show its client (`None` if it could not be read);
    /// empty once removed.
    pub fn fired_on(&self, rule: RuleId) -> Vec<Option<SocketAddr>> {
        lock(&self.shared.rules)
            .iter()
            .find(|r| r.id == rule.0)
            .map_or_else(Vec::new, |r| r.fired_on.clone())
    }

    /// Removes a rule (faults already applied stay applied).
    pub fn remove_rule(&self, rule: RuleId) {
        lock(&self.shared.rules).retain(|r| r.id != rule.0);
    }

    /// Removes every rule installed with [`Proxy::add_rule`].
    pub fn clear_rules(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Blocks until the rule has fired at least `n` times; panics, naming
    /// the rule's pattern, if it has not within `timeout`.
    pub fn wait_hits(&self, rule: RuleId, n: usize, timeout: Duration) {
        let pattern = lock(&self.shared.rules)
            .iter()
            .find(|r| r.id == rule.0)
            .map(|r| String::from_utf8_lossy(&r.pattern).into_owned())
            .unwrap_or_default();
        wait_until(
            &format!("proxy rule on {pattern:?} to fire {n} times"),
            timeout,
            || self.hits(rule) >= n,
        );
    }

    /// Ids of the open connections, oldest first.
    pub fn connection_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = lock(&self.shared.pairs).keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The open connections whose client has sent a chunk containing
    /// `pattern` (within its first 64 KiB), oldest first.
    pub fn connections_that_sent(&self, pattern: &[u8]) -> Vec<u64> {
        let mut ids: Vec<u64> = lock(&self.shared.pairs)
            .values()
            .filter(|p| contains(&lock(&p.sent), pattern))
            .map(|p| p.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Closes one open connection (both sockets shut down at once); `false`
    /// if no such connection is open.
    pub fn cut_connection(&self, conn: u64) -> bool {
        let pair = lock(&self.shared.pairs).remove(&conn);
        match pair {
            Some(pair) => {
                pair.close();
                self.shared.wake();
                true
            }
            None => false,
        }
    }

    /// Black-holes one open connection from now on: nothing is forwarded in
    /// either direction, and both sockets stay open (no FIN, no RST).
    /// `false` if no such connection is open.
    pub fn black_hole(&self, conn: u64) -> bool {
        match lock(&self.shared.pairs).get(&conn) {
            Some(pair) => {
                pair.black_holed.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// While on, every newly accepted client connection is closed right
    /// after accept (a server that accepts and hangs up, like one at
    /// `maxclients`). Existing connections are unaffected; rejected
    /// connections count in [`Proxy::connections_total`].
    pub fn set_reject(&self, on: bool) {
        self.shared.reject.store(on, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.wake();
        // Unblock accept().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // No new pairs can appear now; unblock every read/write.
        self.cut();
        let workers: Vec<JoinHandle<()>> = lock(&self.shared.workers).drain(..).collect();
        for worker in workers {
            let _ = worker.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    for incoming in listener.incoming() {
        if shared.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = incoming else {
            thread::sleep(Duration::from_millis(5));
            continue;
        };
        shared.total.fetch_add(1, Ordering::SeqCst);
        if shared.reject.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(2))
        else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let clones = (|| {
            Some((
                client.try_clone().ok()?,
                upstream.try_clone().ok()?,
                client.try_clone().ok()?,
                upstream.try_clone().ok()?,
            ))
        })();
        let Some((c_read, u_write, c_write, u_read)) = clones else {
            continue;
        };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let pair = Arc::new(Pair {
            id,
            client,
            upstream,
            closed: AtomicBool::new(false),
            doomed: AtomicBool::new(false),
            sent: Mutex::new(Vec::new()),
            reply_delays: Mutex::new(std::collections::VecDeque::new()),
            drop_replies: AtomicBool::new(false),
            black_holed: AtomicBool::new(false),
        });
        lock(&shared.pairs).insert(id, Arc::clone(&pair));

        let mut workers = lock(&shared.workers);
        workers.retain(|h| !h.is_finished());
        for (dir, reader, writer, name) in [
            (Direction::ToUpstream, c_read, u_write, "c2u"),
            (Direction::ToClient, u_read, c_write, "u2c"),
        ] {
            let (shared, pair2) = (Arc::clone(&shared), Arc::clone(&pair));
            let spawned = thread::Builder::new()
                .name(format!("proxy-{name}-{id}"))
                .spawn(move || pump(&shared, &pair2, dir, reader, writer));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(_) => pair.close(),
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn pump(
    shared: &ProxyShared,
    pair: &Pair,
    dir: Direction,
    mut reader: TcpStream,
    mut writer: TcpStream,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if pair.black_holed.load(Ordering::SeqCst) {
            continue;
        }
        if !shared.wait_not_stalled(pair) {
            break;
        }
        match dir {
            Direction::ToClient => {
                if pair.drop_replies.load(Ordering::SeqCst) {
                    continue;
                }
                let delay = lock(&pair.reply_delays).pop_front();
                if let Some(d) = delay {
                    if !shared.sleep(pair, d) {
                        break;
                    }
                }
                if pair.black_holed.load(Ordering::SeqCst) {
                    continue;
                }
            }
            Direction::ToUpstream => {
                {
                    let mut sent = lock(&pair.sent);
                    let room = SENT_KEPT.saturating_sub(sent.len());
                    sent.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                match shared.take_fault(chunk, pair) {
                    None => {}
                    Some(Fault::DelayReply(d)) => lock(&pair.reply_delays).push_back(d),
                    Some(Fault::DelayRequest(d)) if !shared.sleep(pair, d) => break,
                    Some(Fault::DelayRequest(_)) => {}
                    Some(Fault::DropReply) => pair.drop_replies.store(true, Ordering::SeqCst),
                    Some(Fault::BlackHole) => {
                        pair.black_holed.store(true, Ordering::SeqCst);
                        continue;
                    }
                    Some(Fault::LateCopy(d)) => {
                        let (copy, upstream) = (chunk.to_vec(), shared.upstream);
                        thread::spawn(move || {
                            thread::sleep(d);
                            if let Ok(mut s) = TcpStream::connect(upstream) {
                                let _ = s.write_all(&copy);
                                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                                let _ = s.read(&mut [0u8; 4096]);
                            }
                        });
                        continue;
                    }
                    Some(Fault::CutAfterRequest) => {
                        pair.doomed.store(true, Ordering::SeqCst);
                        let _ = writer.write_all(chunk);
                        let _ = pair.client.shutdown(Shutdown::Both);
                        let _ = pair.upstream.shutdown(Shutdown::Write);
                        return;
                    }
                }
            }
        }
        let delay = *lock(&shared.delay);
        if !delay.is_zero() {
            thread::sleep(delay);
        }
        match dir {
            Direction::ToClient => {
                if pair.doomed.load(Ordering::SeqCst) {
                    // Reply of the request that fired the trigger (or later):
                    // swallow everything until the server closes.
                    while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
                    break;
                }
            }
            Direction::ToUpstream => {
                let fire = {
                    let mut trigger = lock(&shared.trigger);
                    let hit = trigger.as_deref().is_some_and(|p| contains(chunk, p));
                    if hit {
                        *trigger = None;
                    }
                    hit
                };
                if fire {
                    // Doom first: any reply is produced after this write, so
                    // the other direction is guaranteed to see the flag.
                    pair.doomed.store(true, Ordering::SeqCst);
                    let _ = writer.write_all(chunk);
                    let _ = pair.client.shutdown(Shutdown::Both);
                    let _ = pair.upstream.shutdown(Shutdown::Write);
                    // The ToClient side drains upstream and tears the pair down.
                    return;
                }
            }
        }
        if writer.write_all(chunk).is_err() {
            break;
        }
    }
    shared.remove(pair);
}

impl RedisServer {
    /// Subscribes a plain connection to `channel` (as Redisson's waiters do),
    /// waits until the subscription is confirmed, and forwards each message's
    /// payload. The listener thread ends when the receiver is dropped or after
    /// 20 s without a message.
    pub fn listen(&self, channel: &str) -> std::sync::mpsc::Receiver<Vec<u8>> {
        let mut conn = self.conn();
        let channel = channel.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let mut ps = conn.as_pubsub();
            ps.subscribe(&channel).expect("SUBSCRIBE");
            ps.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("read timeout");
            let _ = ready_tx.send(());
            while let Ok(msg) = ps.get_message() {
                assert_eq!(msg.get_channel_name(), channel);
                if tx.send(msg.get_payload_bytes().to_vec()).is_err() {
                    break;
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("timed out waiting for the listener to subscribe");
        rx
    }
}
