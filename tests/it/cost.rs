//! The Redis work of the hot paths, counted on `MONITOR`: what issue 20's
//! speed rests on, checked without timing anything (the benches time it).
//!
//! An uncontended acquire + release is two script calls and, inside them,
//! six commands; a renewal is one script call per batch (one `TIME`)
//! and, per lock, one read of its generation and one `PEXPIREAT`. A change
//! that adds a command to either path, or an argument to the usual acquire
//! or release, fails here: measure it with
//! `scripts/bench_compare.sh` (lock, watchdog) and, if it is worth it,
//! change the budget below and docs/performance.md with the figures.

use std::collections::BTreeMap;
use std::time::Duration;

use redlease::Client;

use crate::faults_common::Monitor;
use crate::support::{wait_until, RedisServer};

const WAIT: Duration = Duration::from_secs(10);

/// The commands run inside scripts (MONITOR's `lua` lines), by name, with
/// how many times each ran; and the top-level commands, by name.
fn split(lines: &[String]) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let (mut lua, mut top) = (BTreeMap::new(), BTreeMap::new());
    for line in lines {
        let Some(cmd) = line.split('"').nth(1) else {
            continue;
        };
        let into = if Monitor::client_of(line).is_none() {
            &mut lua
        } else {
            &mut top
        };
        *into.entry(cmd.to_ascii_lowercase()).or_insert(0) += 1;
    }
    (lua, top)
}

/// `PAIRS` uncontended `lock_with_lease()` + drop: two EVALSHAs each, of
/// eight words each, and these commands inside them per pair (the
/// acquire's `EXISTS`, `HSET`, `PEXPIRE`; the release's `HMGET`, `PUBLISH`,
/// `DEL`: no latch, the hold's generation certain), and nothing else sent
/// per pair.
#[test]
fn an_uncontended_acquire_and_release_stay_within_their_commands() {
    const PAIRS: usize = 10;
    let srv = RedisServer::start();
    let client = Client::open(srv.url()).unwrap();
    let lock = client.lock("cost:pair");
    // Loads the scripts and writes the process key first.
    drop(lock.lock_with_lease(Duration::from_secs(30)).unwrap());
    let mut monitor = Monitor::start(&srv);
    for _ in 0..PAIRS {
        drop(lock.lock_with_lease(Duration::from_secs(30)).unwrap());
    }
    let lines: Vec<String> = monitor
        .lines_until_echo(&srv, "end-of-pairs")
        .into_iter()
        // The process key (`Client::inspect`) is written now and then by
        // the watchdog's thread: not the lock's cost.
        .filter(|l| !l.contains("redlease_client:"))
        .collect();
    let (lua, top) = split(&lines);
    let per_pair = |names: &[&str]| -> BTreeMap<String, usize> {
        names.iter().map(|n| (n.to_string(), PAIRS)).collect()
    };
    assert_eq!(
        lua,
        per_pair(&["exists", "hset", "pexpire", "hmget", "publish", "del"]),
        "commands inside the scripts of {PAIRS} pairs"
    );
    assert_eq!(
        top.get("evalsha"),
        Some(&(2 * PAIRS)),
        "script calls of {PAIRS} pairs: {top:?}"
    );
    assert_only_script_calls(&top);
    // Each key and argument of a script call costs Redis about 1,200
    // instructions: the acquire sends EVALSHA, its SHA, the key count, 2
    // keys (the lock, the cancel marker) and 3 arguments (lease, owner,
    // generation); the release the same, 3 keys (the lock, its channel, its
    // queue) and 2 arguments (owner, generation).
    let sizes: Vec<usize> = lines
        .iter()
        .filter(|l| Monitor::client_of(l).is_some() && l.contains("\"EVALSHA\""))
        .map(|l| l.split('"').count() / 2)
        .collect();
    assert_eq!(
        sizes,
        vec![8; 2 * PAIRS],
        "words per script call of {PAIRS} pairs"
    );
}

/// Locks held by one thread and renewed by the watchdog: per lock and
/// renewal, one `HGET` of its generation and one `PEXPIREAT` inside the
/// batch's script, and one `TIME` per script call; nothing else (no `PTTL`
/// read).
#[test]
fn a_renewal_reads_one_field_and_extends_once_per_lock() {
    const LOCKS: usize = 20;
    let srv = RedisServer::start();
    let client = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .unwrap();
    let guards: Vec<_> = (0..LOCKS)
        .map(|i| {
            client
                .lock(format!("cost:renew:{i}"))
                .try_lock()
                .unwrap()
                .expect("a fresh lock is free")
        })
        .collect();
    let mut monitor = Monitor::start(&srv);
    // Three renewals of each lock counted: at least two of them ran after
    // MONITOR began (one batch may have been under way then).
    let before = client.stats().renewals;
    wait_until("three renewals of every lock", WAIT, || {
        client.stats().renewals >= before + 3 * LOCKS as u64
    });
    let lines: Vec<String> = monitor
        .lines_until_echo(&srv, "end-of-renewals")
        .into_iter()
        .filter(|l| !l.contains("redlease_client:"))
        .collect();
    drop(guards);
    // Locks renewed: the key counts of the renewal script calls seen.
    let calls: Vec<&String> = lines
        .iter()
        .filter(|l| Monitor::client_of(l).is_some() && l.contains("\"EVALSHA\""))
        .collect();
    let renewed: usize = calls
        .iter()
        .map(|l| {
            l.split('"')
                .nth(5)
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("a renewal call's key count: {l}"))
        })
        .sum();
    assert!(renewed >= 2 * LOCKS, "{renewed} renewals seen");
    let (lua, top) = split(&lines);
    assert_eq!(
        lua,
        [
            ("time".to_string(), calls.len()),
            ("hget".to_string(), renewed),
            ("pexpireat".to_string(), renewed)
        ]
        .into_iter()
        .collect(),
        "commands inside the renewal scripts for {renewed} renewals"
    );
    // How many locks share a call depends on when they were taken (a busy
    // machine spreads 20 acquisitions over several batches): watchdog.rs
    // checks the batching, with 10,000 locks.
    assert_only_script_calls(&top);
}

/// The top-level commands are script calls, but for what loads a script
/// (an `EVAL` where the server lacked it) or opens a connection (the `PING`
/// that proves it, the subscriber's `HELLO`): the pool may open one in the
/// background at any time.
fn assert_only_script_calls(top: &BTreeMap<String, usize>) {
    assert!(
        top.keys()
            .all(|c| ["evalsha", "eval", "ping", "hello"].contains(&c.as_str())),
        "commands other than script calls: {top:?}"
    );
}
