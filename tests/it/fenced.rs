//! The fenced lock (Redisson's RFencedLock layout): a token that grows with
//! every acquisition, re-entries included, across clients, threads and
//! Redisson; a resource that refuses stale tokens refuses a holder that lost
//! the lock without knowing it.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::support::{Proxy, RedisServer};
use redlease::Client;

const TOKEN_KEY: &str = "redisson_lock_token:{ledger}";

/// Redisson's RFencedLock token path (`tryLockInnerAsync`, paraphrased in
/// the wire notes): KEYS = [name, token key], ARGV = [lease ms, owner].
const REDISSON_FENCED_ACQUIRE: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then local token = redis.call('incr', KEYS[2]); redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return {-1, token}; end; return {redis.call('pttl', KEYS[1]), -1};";
const REDISSON_FIELD: &str = "e3b0c442-98fc-1c14-9afb-f4c8996fb924:1";

#[test]
fn tokens_grow_with_every_acquisition_and_reentry() {
    let srv = RedisServer::start();
    let a = Client::open(srv.url()).expect("client");
    let b = Client::open(srv.url()).expect("client");
    let g1 = a.fenced_lock("ledger").lock().expect("lock");
    let t1 = g1.token().expect("a token");
    let g2 = a.fenced_lock("ledger").lock().expect("re-entry");
    let t2 = g2.token().expect("a token");
    assert!(t2 > t1, "re-entry takes a new token ({t1} then {t2})");
    assert!(b.fenced_lock("ledger").try_lock().expect("try").is_none());
    drop(g2);
    drop(g1);
    let g3 = b.fenced_lock("ledger").lock().expect("lock");
    let t3 = g3.token().expect("a token");
    assert!(
        t3 > t2,
        "the next holder's token is larger ({t2} then {t3})"
    );
    assert_eq!(
        srv.cmd(&["PTTL", TOKEN_KEY]),
        "-1",
        "the token never expires"
    );
    assert_eq!(srv.cmd(&["GET", TOKEN_KEY]), t3.to_string());
    // A plain lock of the same name excludes it, and takes no token.
    assert!(a.lock("ledger").try_lock().expect("try").is_none());
    drop(g3);
    let plain = a.lock("ledger").lock().expect("lock");
    assert_eq!(plain.token(), None);
    assert_eq!(srv.cmd(&["GET", TOKEN_KEY]), t3.to_string());
}

/// An error's text with its source's (Redis's own message).
fn detail(err: &redlease::Error) -> String {
    let source = std::error::Error::source(err).map(ToString::to_string);
    format!("{err}: {}", source.unwrap_or_default())
}

/// A token key that is not a number, or a negative one (someone else
/// wrote it: tokens never are), fails the acquisition with an error that
/// names the key and says so, with nothing of the lock written and the
/// token key as it was: no hold is left in the name of a caller told it
/// failed, and failed tries do not walk a negative token up to 0. A
/// re-entry the same way.
#[test]
fn a_token_key_that_is_not_a_number_fails_with_nothing_held() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url()).expect("client");
    for (value, says) in [
        ("not-a-number", "does not hold a whole number"),
        ("-5", "holds a negative number"),
    ] {
        srv.cmd(&["SET", TOKEN_KEY, value]);
        let err = c
            .fenced_lock("ledger")
            .try_lock()
            .expect_err("no token to take");
        assert!(detail(&err).contains(says), "{value}: {err}");
        assert!(
            detail(&err).contains(TOKEN_KEY),
            "{value}: names the key: {err}"
        );
        assert_eq!(
            srv.cmd(&["GET", TOKEN_KEY]),
            value,
            "{value}: the token key is as it was"
        );
        assert_eq!(
            srv.cmd(&["EXISTS", "ledger"]),
            "0",
            "{value}: nothing held in the name of the failed acquisition"
        );
        srv.cmd(&["SET", TOKEN_KEY, "7"]);
        let g = c.fenced_lock("ledger").lock().expect("lock");
        assert_eq!(g.token(), Some(8));
        srv.cmd(&["SET", TOKEN_KEY, value]);
        let hold = srv.cmd(&["HGETALL", "ledger"]);
        let err = c
            .fenced_lock("ledger")
            .try_lock()
            .expect_err("no token for the re-entry");
        assert!(detail(&err).contains(says), "{value}: {err}");
        assert_eq!(
            srv.cmd(&["HGETALL", "ledger"]),
            hold,
            "{value}: the hold is as before"
        );
        drop(g);
        assert_eq!(srv.cmd(&["EXISTS", "ledger"]), "0", "{value}: released");
    }
}

/// Successive holders across 2 clients x 4 threads see strictly growing
/// tokens.
#[test]
fn successive_holders_see_growing_tokens() {
    let srv = RedisServer::start();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let c = Client::open(srv.url()).expect("client");
            let seen = Arc::clone(&seen);
            thread::spawn(move || {
                let _keep = i;
                for _ in 0..25 {
                    let g = c.fenced_lock("ledger").lock().expect("lock");
                    seen.lock().unwrap().push(g.token().expect("token"));
                    g.unlock().expect("unlock");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 200);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens in the order the lock was held are strictly increasing"
    );
}

/// Redisson's fenced lock and redlease's share the token key and exclude
/// each other; tokens grow across both.
#[test]
fn redisson_fenced_lock_shares_the_token() {
    let srv = RedisServer::start();
    let c = Client::open(srv.url()).expect("client");
    let mut redisson = srv.conn();
    let acquire = |conn: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("EVAL")
            .arg(REDISSON_FENCED_ACQUIRE)
            .arg(2)
            .arg("ledger")
            .arg(TOKEN_KEY)
            .arg(30_000)
            .arg(REDISSON_FIELD)
            .query(conn)
            .expect("Redisson's fenced acquire")
    };
    let g = c.fenced_lock("ledger").lock().expect("lock");
    let t1 = g.token().expect("token");
    let busy = acquire(&mut redisson);
    assert!(
        busy[0] > 0 && busy[1] == -1,
        "Redisson sees it held: {busy:?}"
    );
    drop(g);
    let got = acquire(&mut redisson);
    assert_eq!(got[0], -1, "Redisson takes it: {got:?}");
    assert!(
        got[1] > i64::try_from(t1).unwrap(),
        "Redisson's token is larger"
    );
    assert!(c.fenced_lock("ledger").try_lock().expect("try").is_none());
    let _: () = redis::cmd("DEL")
        .arg("ledger")
        .query(&mut redisson)
        .unwrap();
    let g = c.fenced_lock("ledger").lock().expect("lock");
    assert!(
        i64::try_from(g.token().expect("token")).unwrap() > got[1],
        "and redlease's next one larger again"
    );
}

/// An acquisition whose reply was lost still leaves tokens growing: the
/// caller's next acquisition takes a larger one than any before.
#[test]
fn a_lost_reply_does_not_make_tokens_go_back() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = crate::faults_common::impatient(&proxy.url());
    let g = c.fenced_lock("ledger").lock().expect("lock");
    let t1 = g.token().expect("token");
    g.unlock().expect("unlock");
    proxy.add_rule(b"redisson_lock_token", crate::support::Fault::DropReply, 1);
    assert!(
        c.fenced_lock("ledger").try_lock().is_err(),
        "the reply is lost"
    );
    let g = c
        .fenced_lock("ledger")
        .try_lock_for(Duration::from_secs(10))
        .expect("lock")
        .expect("free once the lost acquisition is undone");
    assert!(g.token().expect("token") > t1 + 1, "past the lost one too");
}

/// How a resource uses the token: it remembers the highest token it has
/// seen and refuses a write with a lower one. A holder paused past its
/// lease (so that another took the lock) is refused.
#[test]
fn a_resource_refuses_a_stale_holder() {
    // The resource: a Redis key written only with a token at least the
    // highest seen (one script, so the check and the write are one step).
    const WRITE_IF_FRESH: &str = "local top = tonumber(redis.call('get', KEYS[2]) or '0'); if tonumber(ARGV[1]) < top then return 0 end; redis.call('set', KEYS[2], ARGV[1]); redis.call('set', KEYS[1], ARGV[2]); return 1";
    let srv = RedisServer::start();
    let storage = RedisServer::start();
    let write = |token: u64, value: &str| -> bool {
        let ok: i64 = redis::cmd("EVAL")
            .arg(WRITE_IF_FRESH)
            .arg(2)
            .arg("balance")
            .arg("balance:token")
            .arg(token)
            .arg(value)
            .query(&mut storage.conn())
            .expect("storage");
        ok == 1
    };
    let a = Client::open(srv.url()).expect("client");
    let b = Client::open(srv.url()).expect("client");
    let slow = a
        .fenced_lock("ledger")
        .lock_with_lease(Duration::from_millis(200))
        .expect("lock");
    thread::sleep(Duration::from_millis(300)); // a pause past the lease
    let fast = b.fenced_lock("ledger").lock().expect("lock");
    assert!(write(fast.token().expect("token"), "from b"));
    assert!(
        !write(slow.token().expect("token"), "from a"),
        "the stale holder is refused"
    );
    assert_eq!(storage.cmd(&["GET", "balance"]), "from b");
}

/// A watched fenced lock is renewed like any lock, keeping its token.
#[test]
fn the_watchdog_renews_a_fenced_lock() {
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(600))
        .build()
        .expect("client");
    let g = c.fenced_lock("ledger").lock().expect("lock");
    let t = g.token();
    thread::sleep(Duration::from_millis(1500));
    g.ensure_held().expect("renewed past its lease");
    assert_eq!(g.token(), t);
    assert!(c.stats().renewals >= 2);
}
