//! The renewal script (`renew.lua`) run raw, section by section, on the
//! server's own `PEXPIRE ... GT` and on the path for servers older than 7.0
//! (which refuse `GT`: simulated by a script whose option Redis refuses), and
//! through the client: a key overwritten by someone else costs only its own
//! lock.

use std::time::Duration;

use crate::support::{wait_until, RedisServer};

const RENEW_LUA: &str = include_str!("../../src/scripts/renew.lua");
const OWNER: &str = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a:";

/// A lock hash held by `<OWNER><tid>` with generation `gen`, PTTL `ttl_ms`.
fn held(conn: &mut redis::Connection, key: &str, tid: &str, gen: &str, ttl_ms: u64) {
    let field = format!("{OWNER}{tid}");
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg(&field)
        .arg(1)
        .arg(format!("{field}:gen"))
        .arg(gen)
        .query(conn)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ttl_ms)
        .query(conn)
        .unwrap();
}

fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

/// Runs `script` on `keys` with `args`; the reply's pairs.
fn run(
    conn: &mut redis::Connection,
    script: &str,
    keys: &[&str],
    args: &[&str],
) -> redis::RedisResult<Vec<redis::Value>> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
    cmd.query(conn)
}

/// The (position, code) pairs of a reply, codes as text ("0" for gone),
/// with the script's note (0, "pexpire") if any.
fn all_pairs(reply: Vec<redis::Value>) -> Vec<(i64, String)> {
    reply
        .chunks(2)
        .map(|p| match p {
            [redis::Value::Int(i), redis::Value::Int(c)] => (*i, c.to_string()),
            [redis::Value::Int(i), redis::Value::BulkString(g)] => {
                (*i, String::from_utf8_lossy(g).into_owned())
            }
            other => panic!("unexpected reply pair {other:?}"),
        })
        .collect()
}

/// [`all_pairs`] of the locks alone.
fn pairs(reply: Vec<redis::Value>) -> Vec<(i64, String)> {
    let mut pairs = all_pairs(reply);
    pairs.retain(|(i, _)| *i != 0);
    pairs
}

/// The note that PEXPIREAT cannot be used here.
fn note() -> (i64, String) {
    (0, "pexpire".to_owned())
}

/// The same checks on the script as shipped and on one whose `GT` Redis
/// refuses (as a server older than 7.0 does).
fn both_paths(mut check: impl FnMut(&str)) {
    check(RENEW_LUA);
    let old_server = RENEW_LUA.replace("'gt'", "'not-an-option'");
    assert_ne!(old_server, RENEW_LUA, "renew.lua no longer asks for GT");
    check(&old_server);
}

/// Flags 0: one `TIME` per call and `PEXPIREAT` per lock; flags 2 (the
/// client was told `PEXPIREAT` cannot be used): `PEXPIRE`, no `TIME`. The
/// same lease either way, and no note in the reply.
#[test]
fn the_relative_flag_extends_with_pexpire_and_reads_no_clock() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    let owner1 = format!("{OWNER}1");
    for (flags, time, pexpireat, pexpire) in [("0", 1, 2, 0), ("2", 0, 0, 2)] {
        held(&mut conn, "r1", "1", "10", 1_000);
        held(&mut conn, "r2", "1", "11", 1_000);
        assert_eq!(srv.cmd(&["CONFIG", "RESETSTAT"]), "OK");
        let reply = run(
            &mut conn,
            RENEW_LUA,
            &["r1", "r2"],
            &[flags, "20000", "2", "f", &owner1, "10", "11"],
        )
        .expect("renewal script");
        assert_eq!(
            all_pairs(reply),
            vec![],
            "flags {flags}: all renewed, no note"
        );
        for k in ["r1", "r2"] {
            let ms = pttl(&mut conn, k);
            assert!(
                (10_001..=20_000).contains(&ms),
                "flags {flags}: {k} PTTL {ms}"
            );
        }
        assert_eq!(
            (
                srv.command_stat("time", "calls"),
                srv.command_stat("pexpireat", "calls"),
                srv.command_stat("pexpire", "calls")
            ),
            (time, pexpireat, pexpire),
            "flags {flags}: TIME, PEXPIREAT and PEXPIRE calls"
        );
    }
}

/// Locks k1 to k5 for a call of two sections (one field, then each its own)
/// of `OWNER`: k1 (tid 1, generation 10, PTTL `k1_ms`) renewable, k2 stale
/// (generation 99), k3 gone, k4 (tid 2, generation 11) renewable, k5 held
/// by someone else (PTTL 1 s).
fn five_locks(conn: &mut redis::Connection, k1_ms: u64) {
    held(conn, "k1", "1", "10", k1_ms);
    held(conn, "k2", "1", "99", 1_000);
    let _: () = redis::cmd("DEL").arg("k3").query(conn).unwrap();
    held(conn, "k4", "2", "11", 1_000);
    let _: () = redis::cmd("DEL").arg("k5").query(conn).unwrap();
    let _: () = redis::cmd("HSET")
        .arg("k5")
        .arg("other-client:7")
        .arg(1)
        .query(conn)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg("k5")
        .arg(1_000)
        .query(conn)
        .unwrap();
}

#[test]
fn sections_renew_matching_generations_and_report_the_rest_by_position() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    both_paths(|script| {
        // Section 'f' (one field, tid 1): k1 to k3; section 'e' (own
        // fields): k4, k5 (tid 3: no field of this owner), and k6 (tid 4)
        // ok but with a longer lease than the renewal's: never shortened.
        five_locks(&mut conn, 1_000);
        held(&mut conn, "k6", "4", "12", 100_000);
        let owner1 = format!("{OWNER}1");
        let reply = run(
            &mut conn,
            script,
            &["k1", "k2", "k3", "k4", "k5", "k6"],
            &[
                "0", "20000", "3", "f", &owner1, "10", "10", "10", "20000", "3", "e", OWNER, "2",
                "11", "3", "11", "4", "12",
            ],
        )
        .expect("renewal script");
        let mut want = vec![
            (2, "99".to_owned()),
            (3, "0".to_owned()),
            (5, "0".to_owned()),
        ];
        // A server that refuses GT takes PEXPIREAT no more than PEXPIRE:
        // the client is told to ask for PEXPIRE.
        if script != RENEW_LUA {
            want.push(note());
        }
        assert_eq!(all_pairs(reply), want, "renewal outcomes by position");
        // Renewed to the 20 s lease, not beyond it.
        for k in ["k1", "k4"] {
            let ms = pttl(&mut conn, k);
            assert!((10_001..=20_000).contains(&ms), "{k} renewed: PTTL {ms}");
        }
        assert!(
            pttl(&mut conn, "k2") <= 1_000,
            "a stale renewal extended k2"
        );
        assert!(
            pttl(&mut conn, "k5") <= 1_000,
            "another owner's lock was extended"
        );
        assert_eq!(pttl(&mut conn, "k3"), -2, "a gone lock was brought back");
        assert!(
            pttl(&mut conn, "k6") > 50_000,
            "a renewal shortened a longer lease"
        );
    });
}

/// Sections in upper case ('F', 'E': the client knows that no key of
/// theirs carries a longer lease) set the lease as it is, with no `GT` and
/// no `PTTL` read, on either path; generations are checked as in lower case.
#[test]
fn upper_case_sections_set_the_lease_without_gt() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    both_paths(|script| {
        // 'F': k1 to k3, k1's lease longer than the renewal's (set as
        // asked); 'E': k4, k5.
        five_locks(&mut conn, 100_000);
        assert_eq!(srv.cmd(&["CONFIG", "RESETSTAT"]), "OK");
        let owner1 = format!("{OWNER}1");
        let reply = run(
            &mut conn,
            script,
            &["k1", "k2", "k3", "k4", "k5"],
            &[
                "0", "20000", "3", "F", &owner1, "10", "10", "10", "20000", "2", "E", OWNER, "2",
                "11", "3", "11",
            ],
        )
        .expect("renewal script");
        assert_eq!(
            (
                srv.command_stat("pexpireat", "calls"),
                srv.command_stat("pttl", "calls")
            ),
            (2, 0),
            "one PEXPIREAT per renewed lock, no TTL read"
        );
        // No GT asked for: no note, on a server that refuses GT too.
        assert_eq!(
            all_pairs(reply),
            vec![
                (2, "99".to_owned()),
                (3, "0".to_owned()),
                (5, "0".to_owned())
            ],
            "renewal outcomes by position"
        );
        for k in ["k1", "k4"] {
            let ms = pttl(&mut conn, k);
            assert!(
                (10_001..=20_000).contains(&ms),
                "{k} set to the 20 s lease: PTTL {ms}"
            );
        }
        assert!(
            pttl(&mut conn, "k2") <= 1_000,
            "a stale renewal extended k2"
        );
        assert_eq!(pttl(&mut conn, "k3"), -2, "a gone lock was brought back");
        assert!(
            pttl(&mut conn, "k5") <= 1_000,
            "another owner's lock was extended"
        );
    });
}

/// Sections with and without `GT`, in either order in one call, as a user
/// without `+pexpireat`, one without `+time` and one with every command, on
/// the script as shipped and on a server that refuses `GT`: every lock
/// whose generation matches gets the lease, a longer lease stays under a
/// lower-case section and is set as asked under an upper-case one, and no
/// call fails (the adversarial review's probe of the `GT`-less sections).
#[test]
fn sections_with_and_without_gt_mix_in_one_call_under_any_acl() {
    let srv = RedisServer::start();
    let mut admin = srv.conn();
    for (user, rule) in [
        ("noat", "on >pw ~* +@all -pexpireat"),
        ("notime", "on >pw ~* +@all -time"),
        ("all", "on >pw ~* +@all"),
    ] {
        crate::acl::acl(&srv, user, rule);
        let url = srv
            .url()
            .replace("redis://", &format!("redis://{user}:pw@"));
        let mut conn = redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("the user connects");
        both_paths(|script| {
            for order in [["F", "f", "E", "e"], ["f", "F", "e", "E"]] {
                held(&mut admin, "k1", "1", "10", 1_000);
                held(&mut admin, "k2", "1", "11", 1_000);
                held(&mut admin, "k3", "1", "12", 100_000);
                held(&mut admin, "k4", "2", "13", 1_000);
                held(&mut admin, "k5", "3", "14", 100_000);
                let owner1 = format!("{OWNER}1");
                let reply = run(
                    &mut conn,
                    script,
                    &["k1", "k2", "k3", "k4", "k5"],
                    &[
                        "0", "20000", "1", order[0], &owner1, "10", "20000", "2", order[1],
                        &owner1, "11", "12", "20000", "1", order[2], OWNER, "2", "13", "20000",
                        "1", order[3], OWNER, "3", "14",
                    ],
                )
                .unwrap_or_else(|e| panic!("{user} {order:?}: {e}"));
                assert_eq!(pairs(reply), vec![], "{user} {order:?}: all renewed");
                for k in ["k1", "k2", "k4"] {
                    let ms = pttl(&mut admin, k);
                    assert!(
                        (10_001..=20_000).contains(&ms),
                        "{user} {order:?}: {k} PTTL {ms}"
                    );
                }
                for (k, mode) in [("k3", order[1]), ("k5", order[3])] {
                    let ms = pttl(&mut admin, k);
                    if mode.chars().all(|c| c.is_lowercase()) {
                        assert!(
                            ms > 90_000,
                            "{user} {order:?}: {k} shortened under GT: {ms}"
                        );
                    } else {
                        assert!(ms <= 20_000, "{user} {order:?}: {k} not set as asked: {ms}");
                    }
                }
            }
        });
    }
}

#[test]
fn a_key_that_is_not_a_hash_fails_the_call_and_alone_when_careful() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    both_paths(|script| {
        held(&mut conn, "h1", "1", "5", 1_000);
        let _: () = redis::cmd("SET")
            .arg("h2")
            .arg("a string now")
            .arg("PX")
            .arg(1_000)
            .query(&mut conn)
            .unwrap();
        held(&mut conn, "h3", "1", "5", 1_000);
        let owner = format!("{OWNER}1");
        let args = |careful: &'static str| {
            vec![
                careful.to_owned(),
                "20000".into(),
                "3".into(),
                "f".into(),
                owner.clone(),
                "5".into(),
                "5".into(),
                "5".into(),
            ]
        };
        let fast: Vec<String> = args("0");
        let fast: Vec<&str> = fast.iter().map(String::as_str).collect();
        let err = run(&mut conn, script, &["h1", "h2", "h3"], &fast)
            .expect_err("a key of the wrong type fails the fast call");
        assert!(
            err.code() == Some("WRONGTYPE") || err.to_string().contains("WRONGTYPE"),
            "the error says WRONGTYPE: {err}"
        );
        let careful: Vec<String> = args("1");
        let careful: Vec<&str> = careful.iter().map(String::as_str).collect();
        let reply = run(&mut conn, script, &["h1", "h2", "h3"], &careful).expect("careful call");
        assert_eq!(pairs(reply), vec![(2, "0".to_owned())]);
        assert!(pttl(&mut conn, "h3") > 10_000, "h3 renewed");
        assert!(pttl(&mut conn, "h2") <= 1_000, "the string was extended");
    });
}

#[test]
fn read_holds_renew_their_hold_keys_and_are_gone_when_one_expired() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    both_paths(|script| {
        let field = format!("{OWNER}1");
        let prefix = format!("{{rw}}:{field}:rwlock_timeout");
        let _: () = redis::cmd("DEL").arg("rw").query(&mut conn).unwrap();
        let _: () = redis::cmd("HSET")
            .arg("rw")
            .arg("mode")
            .arg("read")
            .arg(&field)
            .arg(2)
            .arg(format!("{field}:gen"))
            .arg("g7")
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("PEXPIRE")
            .arg("rw")
            .arg(1_000)
            .query(&mut conn)
            .unwrap();
        for k in 1..=2 {
            let _: () = redis::cmd("SET")
                .arg(format!("{prefix}:{k}"))
                .arg(1)
                .arg("PX")
                .arg(1_000)
                .query(&mut conn)
                .unwrap();
        }
        let renew = |conn: &mut redis::Connection| {
            let args = ["0", "20000", "1", "r", OWNER, "1", "g7", &prefix];
            pairs(run(conn, script, &["rw"], &args).expect("renewal script"))
        };
        assert!(renew(&mut conn).is_empty(), "the read hold was renewed");
        assert!(pttl(&mut conn, "rw") > 10_000);
        assert!(pttl(&mut conn, &format!("{prefix}:2")) > 10_000);
        // One hold key gone: the read hold is lost.
        let _: () = redis::cmd("DEL")
            .arg(format!("{prefix}:2"))
            .query(&mut conn)
            .unwrap();
        assert_eq!(renew(&mut conn), vec![(1, "0".to_owned())]);
    });
}

#[test]
fn an_overwritten_key_loses_only_its_own_lock() {
    let srv = RedisServer::start();
    let client = redlease::Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .unwrap();
    let names = ["ow:a", "ow:b", "ow:c"];
    let guards: Vec<_> = names
        .iter()
        .map(|n| client.lock(*n).lock().expect("lock"))
        .collect();
    // Someone else overwrites the middle lock's key with a string.
    let _: () = redis::cmd("SET")
        .arg("ow:b")
        .arg("not a lock")
        .query(&mut srv.conn())
        .unwrap();
    wait_until(
        "the watchdog to report the overwritten lock lost",
        Duration::from_secs(10),
        || guards[1].is_lost(),
    );
    let renewed = client.stats().renewals;
    wait_until(
        "two more renewals of the other locks",
        Duration::from_secs(10),
        || client.stats().renewals >= renewed + 2,
    );
    for i in [0, 2] {
        assert!(!guards[i].is_lost(), "{} was reported lost", names[i]);
        guards[i]
            .ensure_held()
            .unwrap_or_else(|e| panic!("{} is no longer held: {e}", names[i]));
    }
    assert_eq!(client.stats().locks_lost, 1);
}

/// Someone rewrites a held lock's generation field in a shape redlease never
/// writes for that kind ("g<n>" on a plain lock): the renewal finds it
/// stale, and again after taking the generation found. The lock is lost
/// then, at once; before, the watchdog renewed it again without pause until
/// the lease ran out (hundreds of round trips a second).
#[test]
fn a_foreign_generation_loses_the_lock_without_a_renewal_storm() {
    let srv = RedisServer::start();
    let client = redlease::Client::builder(srv.url())
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let lock = client.lock("foreign-gen");
    let guard = lock.lock().expect("lock");
    let mut conn = srv.conn();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("foreign-gen")
        .query(&mut conn)
        .unwrap();
    let gen_field = fields
        .iter()
        .find(|f| f.ends_with(":gen"))
        .expect("the hash has the owner's generation field")
        .clone();
    let gen: String = redis::cmd("HGET")
        .arg("foreign-gen")
        .arg(&gen_field)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("foreign-gen")
        .arg(&gen_field)
        .arg(format!("g{gen}"))
        .query(&mut conn)
        .unwrap();
    let before = client.stats().renewal_round_trips;
    wait_until(
        "the watchdog to report the lock with a foreign generation lost",
        Duration::from_secs(5),
        || guard.is_lost(),
    );
    let trips = client.stats().renewal_round_trips - before;
    assert!(
        trips <= 5,
        "{trips} renewal round trips before the lock was found lost"
    );
}
