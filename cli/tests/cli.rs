//! The `redlease` command end to end, against redis-server processes the
//! tests start: `inspect`, `list`, `force-unlock`, `--json`, exit codes,
//! `watch` in a terminal, and a Cluster.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use redlease::Client;
use redlease_testkit::{free_port, Cluster, RedisServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_redlease");

fn redlease(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run the redlease command")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn named(url: &str) -> Client {
    Client::builder(url)
        .name("cli-test")
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .expect("client")
}

/// Waits (bounded) until the watchdog finds `g`'s lock gone.
fn wait_lost(g: &redlease::LockGuard) {
    redlease_testkit::wait_until("the holder to be told", Duration::from_secs(10), || {
        g.is_lost()
    });
}

/// Waits (bounded) until `c` has published its process key.
fn wait_published(c: &Client, name: &str) {
    redlease_testkit::wait_until("the holder's process key", Duration::from_secs(10), || {
        c.lock(name)
            .holders()
            .expect("holders")
            .iter()
            .any(|h| h.process.is_some())
    });
}

#[test]
fn inspect_shows_the_holder_and_its_process() {
    let srv = RedisServer::start();
    let url = srv.url();
    let c = named(&url);
    let _g = c.lock("orders:42").lock().expect("lock");
    let _again = c.lock("orders:42").lock().expect("re-entry");
    wait_published(&c, "orders:42");
    let o = redlease(&["--url", &url, "inspect", "orders:42"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert!(text.starts_with("orders:42  lock  lease "), "{text}");
    assert!(text.contains(&format!("{}:", c.id())), "{text}");
    assert!(
        text.contains(&format!("cli-test pid {} on ", std::process::id())),
        "{text}"
    );
    assert!(text.contains("exclusive x2"), "{text}");

    let o = redlease(&["--url", &url, "--json", "inspect", "orders:42"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["kind"], "lock");
    assert_eq!(v["holders"][0]["count"], 2);
    assert_eq!(v["holders"][0]["client_id"], c.id());
    assert_eq!(v["holders"][0]["process"]["pid"], std::process::id());
    assert_eq!(v["holders"][0]["process"]["name"], "cli-test");
    assert!(v["holders"][0]["lease_ms"].as_u64().is_some_and(|l| l > 0));

    let o = redlease(&["--url", &url, "inspect", "orders:none"]);
    assert_eq!(o.status.code(), Some(1), "a missing name: {}", show(&o));
}

#[test]
fn list_finds_the_family_and_nothing_else() {
    let srv = RedisServer::start();
    let url = srv.url();
    let c = named(&url);
    let _a = c.lock("jobs:a").lock().expect("lock");
    let _b = c
        .read_write_lock("jobs:b")
        .read_lock()
        .lock()
        .expect("read");
    let sem = c.semaphore("jobs:c");
    sem.try_set_permits(3).expect("set");
    let _p = sem.acquire(2).expect("permits");
    srv.cmd(&["SET", "jobs:text", "hello"]);
    srv.cmd(&["SET", "other:x", "1"]);
    let o = redlease(&["--url", &url, "list", "jobs:*"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let names: Vec<String> = stdout(&o)
        .lines()
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        names,
        ["jobs:a lock", "jobs:b read-write-lock", "jobs:c semaphore"],
        "{}",
        show(&o)
    );
    let o = redlease(&["--url", &url, "--json", "list", "jobs:*"]);
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v.as_array().map(Vec::len), Some(3));
    assert_eq!(v[2]["value"], 1, "permits available");
    assert_eq!(v[2]["holders"][0]["count"], 2);
    let o = redlease(&["--url", &url, "list", "nothing:*"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "");
}

#[test]
fn force_unlock_asks_unless_yes() {
    let srv = RedisServer::start();
    let url = srv.url();
    let c = named(&url);
    let g = c.lock("orders:7").lock().expect("lock");
    // No terminal to ask on: refused, nothing done.
    let o = redlease(&["--url", &url, "force-unlock", "orders:7"]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--yes"),
        "{}",
        show(&o)
    );
    g.ensure_held().expect("still held");
    let o = redlease(&["--url", &url, "--json", "force-unlock", "orders:7", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["unlocked"], true);
    assert!(!c.lock("orders:7").is_locked().expect("query"));
    wait_lost(&g);
    // Nothing held, or not a lock: nothing to do.
    let o = redlease(&["--url", &url, "force-unlock", "orders:7", "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nothing to unlock: \"orders:7\" is not held"),
        "{}",
        show(&o)
    );
    let sem = c.semaphore("orders:sem");
    sem.try_set_permits(1).expect("set");
    let o = redlease(&["--url", &url, "force-unlock", "orders:sem", "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("\"orders:sem\"") && err.contains("not a lock"),
        "{}",
        show(&o)
    );
}

#[test]
fn errors_have_their_exit_codes() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let o = redlease(&["--url", &url, "--timeout", "0.5", "list"]);
    assert_eq!(o.status.code(), Some(3), "no server: {}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "timed out waiting for a connection to redis at 127.0.0.1:{port}"
        )),
        "{}",
        show(&o)
    );
    let o = redlease(&["--url", &url, "--timeout", "0", "list"]);
    assert_eq!(o.status.code(), Some(2), "bad timeout: {}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("--timeout must be 0.001 to 86400 seconds, got 0"),
        "{}",
        show(&o)
    );
    let o = redlease(&["inspect"]);
    assert_eq!(o.status.code(), Some(2), "no name: {}", show(&o));
    let o = redlease(&["--url", "redis://a/", "--url", "redis://b/", "list"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--cluster"));
}

/// `watch` in a terminal (`script` gives it one): a few refreshes, each
/// clearing the screen and drawing the lock's line with its lease bar.
#[test]
fn watch_refreshes_in_a_terminal() {
    let srv = RedisServer::start();
    let url = srv.url();
    let c = named(&url);
    let _g = c.lock("w:1").lock().expect("lock");
    wait_published(&c, "w:1");
    let line = format!("{BIN} --url {url} watch 'w:*' --interval 0.2 --count 3");
    let o = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::null())
        .output();
    let Ok(o) = o else {
        panic!("the `script` command (util-linux) is needed to give watch a terminal");
    };
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert_eq!(
        text.matches("\x1b[2J\x1b[H").count(),
        3,
        "3 refreshes: {text:?}"
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("w:1 ")).collect();
    assert_eq!(rows.len(), 3, "{text:?}");
    assert!(rows[0].contains("[#"), "a lease bar: {}", rows[0]);
    assert!(rows[0].contains("cli-test pid "), "{}", rows[0]);
    // Without a terminal, JSON lines: one array per refresh.
    let o = redlease(&[
        "--url",
        &url,
        "--json",
        "watch",
        "w:*",
        "--interval",
        "0.1",
        "--count",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0][0]["name"], "w:1");
}

#[test]
fn a_cluster_is_listed_across_its_masters() {
    let cluster = Cluster::start(3, 0);
    let seeds = cluster.seeds();
    let c = Client::cluster_builder(seeds.iter().map(String::as_str))
        .name("cli-cluster")
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .expect("cluster client");
    let names: Vec<String> = cluster
        .names_on_each_master("c:", 1)
        .into_iter()
        .flatten()
        .collect();
    let guards: Vec<_> = names
        .iter()
        .map(|n| c.lock(n.as_str()).lock().expect("lock"))
        .collect();
    wait_published(&c, &names[0]);
    let mut args = vec!["--cluster"];
    for s in &seeds {
        args.extend(["--url", s.as_str()]);
    }
    let run = |more: &[&str]| {
        let mut all = args.clone();
        all.extend(more);
        redlease(&all)
    };
    let o = run(&["--json", "list", "c:*"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let mut listed: Vec<String> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|i| i["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    listed.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(listed, want, "one lock on each master");
    assert!(
        v[0]["holders"][0]["process"]["name"] == "cli-cluster",
        "{v}"
    );
    let o = run(&["inspect", &names[1]]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let o = run(&["force-unlock", &names[2], "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    wait_lost(&guards[2]);
    assert!(guards[0].ensure_held().is_ok());
}

// ---- Added by review ----

/// A key or a string value that is not UTF-8 (Redisson's default codecs
/// write binary values) must not make `list` fail: it is not a lock.
#[test]
fn list_skips_binary_keys_and_values() {
    let srv = RedisServer::start();
    let url = srv.url();
    let mut conn = srv.conn();
    let _: () = redis::cmd("SET")
        .arg("bin:value")
        .arg(b"\xac\xed\x00\x05t\x00\x03abc".as_slice())
        .query(&mut conn)
        .expect("SET");
    let _: () = redis::cmd("SET")
        .arg(b"bin:k\xff".as_slice())
        .arg("v")
        .query(&mut conn)
        .expect("SET");
    let _: () = redis::cmd("HSET")
        .arg("bin:map")
        .arg(b"\xac\xed\x00\x05".as_slice())
        .arg(b"\x01\x02".as_slice())
        .query(&mut conn)
        .expect("HSET");
    let c = named(&url);
    let _g = c.lock("bin:lock").lock().expect("lock");
    let o = redlease(&["--url", &url, "list", "bin:*"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(stdout(&o).starts_with("bin:lock "), "{}", show(&o));
}

/// `watch` is kept open while debugging: Redis going away for a moment must
/// not end it; it says so and shows the locks again once Redis is back.
#[test]
fn watch_keeps_going_while_redis_is_away() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    let srv = RedisServer::start();
    let url = srv.url();
    srv.cmd(&["HSET", "w:1", "8d1f3b9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b:1", "1"]);
    /// Kills the command when the test ends, passed or failed.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Command::new(BIN)
        .args(["--url", &url, "--timeout", "0.5", "--json", "watch", "w:*"])
        .args(["--interval", "0.2"])
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Killed)
        .expect("spawn");
    // Its lines as they come: ("out" | "err", line).
    let (tx, rx) = mpsc::channel();
    let out = BufReader::new(child.0.stdout.take().expect("stdout"));
    let err = BufReader::new(child.0.stderr.take().expect("stderr"));
    for (which, lines) in [
        (
            "out",
            Box::new(out.lines()) as Box<dyn Iterator<Item = _> + Send>,
        ),
        ("err", Box::new(err.lines())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = tx.send((which, line));
            }
        });
    }
    let mut seen = Vec::new();
    // One deadline for all of it: lines that do not match do not extend it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut wait_for = |what: &str, which: &str, text: &str| loop {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok((w, line)) => {
                let found = w == which && line.contains(text);
                seen.push(format!("{w}: {line}"));
                if found {
                    return;
                }
            }
            Err(e) => panic!("{e} waiting for {what}; so far: {seen:#?}"),
        }
    };
    wait_for("a first refresh", "out", ":1\"");
    srv.stop();
    wait_for("the outage to be told", "err", "not answering");
    wait_for("a second outage refresh", "err", "not answering");
    srv.restart();
    srv.cmd(&["HSET", "w:1", "8d1f3b9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b:2", "1"]);
    wait_for("a refresh after the restart", "out", ":2\"");
    assert!(
        child.0.try_wait().expect("try_wait").is_none(),
        "watch still running"
    );
}

/// `redlease watch | head -1`: once the reader is gone, watch must end
/// instead of refreshing into a closed pipe forever.
#[test]
fn watch_ends_when_its_output_is_closed() {
    use std::io::{BufRead, BufReader};
    let srv = RedisServer::start();
    let url = srv.url();
    let mut child = Command::new(BIN)
        .args(["--url", &url, "watch", "--interval", "0.1"])
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a first line");
    // The reader (here: the BufReader) is dropped: the pipe is closed.
    let ended = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        child.try_wait().expect("try_wait").is_some()
    });
    if !ended {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(ended, "watch still running 5 s after its output was closed");
}

/// The url may hold a password: `--help` must not print REDIS_URL's value.
#[test]
fn help_does_not_print_the_password_in_redis_url() {
    let o = Command::new(BIN)
        .arg("--help")
        .env("REDIS_URL", "redis://admin:S3cret@10.0.0.5:6379/")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0));
    assert!(!stdout(&o).contains("S3cret"), "{}", stdout(&o));
}

/// A name (or an owner field) with a newline or an escape sequence is shown
/// escaped: one line per object, nothing the terminal interprets.
#[test]
fn list_escapes_control_characters() {
    let srv = RedisServer::start();
    let url = srv.url();
    srv.cmd(&["HSET", "x\nfake                     lock", "u:1", "1"]);
    srv.cmd(&["HSET", "esc", "\x1b[2Ju:1", "1"]);
    let o = redlease(&["--url", &url, "list"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 2, "{text:?}");
    assert!(!text.contains('\x1b'), "{text:?}");
}

/// Fair and read-write locks are force-unlocked as what they are: the fair
/// lock's first waiter gets it, a read-write lock's readers are let go.
#[test]
fn force_unlock_fair_and_read_write_locks() {
    let srv = RedisServer::start();
    let url = srv.url();
    let c = named(&url);
    let g = c.fair_lock("f:1").lock().expect("lock");
    let waiter = {
        let url = url.clone();
        std::thread::spawn(move || {
            let c = named(&url);
            let g = c.fair_lock("f:1").lock().expect("waiter gets it");
            drop(g);
        })
    };
    redlease_testkit::wait_until("a waiter in line", Duration::from_secs(10), || {
        c.inspect("f:1").expect("inspect").queue.len() == 1
    });
    let o = redlease(&["--url", &url, "--json", "inspect", "f:1"]);
    let v: Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["kind"], "fair-lock", "{v}");
    let o = redlease(&["--url", &url, "force-unlock", "f:1", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    waiter.join().expect("the waiter took the lock");
    wait_lost(&g);

    let r = c.read_write_lock("rw:1").read_lock().lock().expect("read");
    let o = redlease(&["--url", &url, "force-unlock", "rw:1", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    wait_lost(&r);
    assert!(c
        .read_write_lock("rw:1")
        .write_lock()
        .try_lock()
        .expect("try")
        .is_some());
}
