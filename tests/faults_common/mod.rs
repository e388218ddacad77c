//! Helpers shared by the fault-injection tests (`tests/faults_*.rs`): figures,
//! client builders, bounded-call checks, a raw `MONITOR` reader and a few
//! server queries. Include it with a `#[path]` module next to
//! `use redlease_testkit as support;` (see `tests/it/main.rs`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redlease::{Client, ClientBuilder};

use crate::support::{RedisServer, Resp};

/// Allowance for scheduling on a loaded 2-core machine, added to every
/// "returns within" bound.
pub const MARGIN: Duration = Duration::from_millis(1500);

/// Prints a measured figure for the README's reliability table.
pub fn figure(text: &str) {
    println!("FIGURE: {text}");
}

pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// A builder with the given response timeout (everything else default).
pub fn builder(url: &str, response_timeout: Duration) -> ClientBuilder {
    Client::builder(url).response_timeout(response_timeout)
}

/// [`builder`], built.
pub fn client(url: &str, response_timeout: Duration) -> Client {
    builder(url, response_timeout)
        .build()
        .expect("build client")
}

/// A client whose replies time out after 300 ms and that never resends a
/// request on a new connection: a reply a proxy rule drops is a lost
/// reply, at once.
pub fn impatient(url: &str) -> Client {
    builder(url, Duration::from_millis(300))
        .retry_attempts(0)
        .build()
        .expect("build client")
}

/// Runs `f` and returns its result and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// Panics unless `took` is within `bound`.
pub fn assert_within(what: &str, took: Duration, bound: Duration) {
    assert!(took <= bound, "{what} took {took:?}; bound {bound:?}");
}

/// Every key but the expiring release latches and acquire cancel markers,
/// and the clients' process keys (which expire a lease after their client).
pub fn lock_keys(conn: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
    keys.retain(|k| {
        !k.starts_with("redisson_unlock_latch:")
            && !k.starts_with("redlease_acquire_cancel:")
            && !k.starts_with("redlease_client:")
    });
    keys.sort();
    keys
}

/// [`lock_keys`] over a fresh admin connection.
pub fn server_lock_keys(srv: &RedisServer) -> Vec<String> {
    lock_keys(&mut srv.conn())
}

/// The hold count Redis records for the only owner of `name` (0 if none).
pub fn server_count(conn: &mut redis::Connection, name: &str) -> u32 {
    let mut fields: Vec<(String, u32)> = redis::cmd("HGETALL")
        .arg(name)
        .query(conn)
        .expect("HGETALL");
    // Each owner field has redlease's generation field `<owner>:gen` beside it.
    fields.retain(|(f, _)| !f.ends_with(":gen"));
    assert!(fields.len() <= 1, "one owner at most: {fields:?}");
    fields.first().map_or(0, |(_, n)| *n)
}

/// Subscribers of `channel` on the server.
pub fn numsub(srv: &RedisServer, channel: &str) -> i64 {
    match srv.raw(&["PUBSUB", "NUMSUB", channel]) {
        Resp::Array(Some(v)) => match v.get(1) {
            Some(Resp::Int(n)) => *n,
            other => panic!("PUBSUB NUMSUB: {other:?}"),
        },
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

/// Starts `waiters`' subscriber before a test proper: its first connection
/// wakes every waiter once (a SUBSCRIBE sent before it existed may have been
/// lost), which would add an acquire attempt at an arbitrary moment later.
pub fn warm_subscriber(holder: &Client, waiters: &Client) {
    let name = format!("warm:{}", waiters.id());
    let held = holder.lock(name.as_str()).lock().expect("warm-up lock");
    let none = waiters
        .lock(name.as_str())
        .try_lock_for(Duration::from_millis(200))
        .expect("warm-up wait");
    assert!(none.is_none(), "the warm-up lock is held");
    held.unlock().expect("warm-up unlock");
}

/// The SHA1 of release_full.lua as the client sends it (EVALSHA): a proxy
/// rule on it matches the usual full release and nothing else (the lock's
/// channel also goes by in subscriptions and in other scripts).
pub fn release_full_sha() -> Vec<u8> {
    redis::Script::new(concat!(
        include_str!("../../src/scripts/queue_lib.lua"),
        include_str!("../../src/scripts/queue_wake.lua"),
        include_str!("../../src/scripts/release_full.lua")
    ))
    .get_hash()
    .as_bytes()
    .to_vec()
}

/// `true` for the MONITOR line of a lock script call (EVALSHA) that carries
/// `needle` among its arguments.
pub fn is_script_call(line: &str, needle: &str) -> bool {
    line.contains("\"EVALSHA\"") && line.contains(needle)
}

/// `true` for the MONITOR line of an acquire on `name` (its second key is
/// the request's cancel marker; an undo's second key is the channel).
pub fn is_acquire_of(line: &str, name: &str) -> bool {
    is_script_call(line, &format!("\"{name}\" \"redlease_acquire_cancel:"))
}

/// A raw `MONITOR` connection: every command Redis runs, one line each
/// (`+<time> [<db> <client address>] "CMD" "arg" ...`).
pub struct Monitor {
    lines: BufReader<TcpStream>,
}

impl Monitor {
    pub fn start(srv: &RedisServer) -> Monitor {
        let mut stream =
            TcpStream::connect_timeout(&srv.addr(), Duration::from_secs(5)).expect("monitor");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("monitor read timeout");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut lines = BufReader::new(stream);
        let mut ok = String::new();
        lines.read_line(&mut ok).expect("MONITOR reply");
        assert_eq!(ok.trim_end(), "+OK");
        Monitor { lines }
    }

    /// The client address of a MONITOR line (`None` for commands run by Lua).
    pub fn client_of(line: &str) -> Option<&str> {
        let inside = line.split_once('[')?.1.split_once(']')?.0;
        let addr = inside.split_once(' ')?.1;
        (addr != "lua").then_some(addr)
    }

    /// Every line Redis ran up to an `ECHO` of `marker` that this sends
    /// now (not included), for 10 s at most; panics otherwise.
    #[allow(dead_code)]
    pub fn lines_until_echo(&mut self, srv: &RedisServer, marker: &str) -> Vec<String> {
        assert_eq!(srv.cmd(&["ECHO", marker]), marker);
        let needle = format!("\"ECHO\" \"{marker}\"");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        loop {
            let line = self.next_line(deadline, || format!("reading MONITOR up to ECHO {marker}"));
            if line.contains(&needle) {
                return out;
            }
            out.push(line);
        }
    }

    /// The next line, before `deadline` (10 s after the caller began);
    /// panics saying what the caller was doing otherwise.
    fn next_line(&mut self, deadline: std::time::Instant, doing: impl Fn() -> String) -> String {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after 10 s {}",
            doing()
        );
        let mut line = String::new();
        self.lines
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{}: {e}", doing()));
        line
    }

    /// Reads until `count` lines matching `pred` were seen, for 10 s at most
    /// in all (other commands' lines do not extend it); panics saying `what`
    /// it waited for otherwise.
    pub fn wait_for(&mut self, what: &str, mut pred: impl FnMut(&str) -> bool, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = 0;
        while seen < count {
            let line = self.next_line(deadline, || {
                format!("waiting for {what} on MONITOR ({seen}/{count})")
            });
            if pred(&line) {
                seen += 1;
            }
        }
    }
}
