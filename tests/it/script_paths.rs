//! The acquire and release scripts' one-read fast paths, run raw: every
//! answer is the one the full checks give (a retry or a late copy of a
//! release returns its first answer and changes nothing; a cancelled
//! acquisition never applies).

use crate::support::RedisServer;

const ACQUIRE_LUA: &str = concat!(
    include_str!("../../src/scripts/queue_lib.lua"),
    include_str!("../../src/scripts/acquire.lua")
);
const RELEASE_LUA: &str = concat!(
    include_str!("../../src/scripts/queue_lib.lua"),
    include_str!("../../src/scripts/queue_wake.lua"),
    include_str!("../../src/scripts/release_plain.lua"),
    include_str!("../../src/scripts/release.lua")
);
const FIELD: &str = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a:1";

fn acquire(
    conn: &mut redis::Connection,
    name: &str,
    marker: &str,
    count: u32,
    gen: u64,
) -> Option<i64> {
    redis::cmd("EVAL")
        .arg(ACQUIRE_LUA)
        .arg(2)
        .arg(name)
        .arg(marker)
        .arg(30_000)
        .arg(FIELD)
        .arg(gen)
        .arg(count)
        .arg("0")
        .query(conn)
        .expect("acquire.lua")
}

fn release(
    conn: &mut redis::Connection,
    name: &str,
    latch: &str,
    left: u32,
    gen: u64,
) -> Option<i64> {
    redis::cmd("EVAL")
        .arg(RELEASE_LUA)
        .arg(3)
        .arg(name)
        .arg("chan")
        .arg(latch)
        .arg(FIELD)
        .arg(left)
        .arg(30_000)
        .arg(60_000)
        .arg(gen)
        .arg("publish")
        .query(conn)
        .expect("release.lua")
}

fn gen_of(conn: &mut redis::Connection, name: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(name)
        .arg(format!("{FIELD}:gen"))
        .query(conn)
        .unwrap()
}

#[test]
fn a_cancelled_acquisition_never_applies() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    srv.cmd(&["SET", "m1", "1"]);
    assert_eq!(
        acquire(&mut conn, "free", "m1", 1, 5),
        Some(-3),
        "free lock"
    );
    assert_eq!(srv.cmd(&["EXISTS", "free"]), "0");
    srv.cmd(&["HSET", "taken", "someone:1", "1"]);
    assert_eq!(
        acquire(&mut conn, "taken", "m1", 1, 5),
        Some(-3),
        "held lock"
    );
    assert_eq!(
        acquire(&mut conn, "free", "m2", 1, 6),
        None,
        "not cancelled"
    );
    assert_eq!(gen_of(&mut conn, "free").as_deref(), Some("6"));
    assert_eq!(
        acquire(&mut conn, "gone", "m3", 2, 7),
        Some(-4),
        "re-entry of a lost hold"
    );
}

#[test]
fn a_release_answers_retries_and_late_copies_with_its_first_answer() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    // Full release: applied once; a retry answers 1 again.
    assert_eq!(acquire(&mut conn, "l", "m1", 1, 5), None);
    assert_eq!(release(&mut conn, "l", "latch7", 0, 7), Some(1));
    assert_eq!(srv.cmd(&["EXISTS", "l"]), "0");
    assert_eq!(release(&mut conn, "l", "latch7", 0, 7), Some(1), "retry");
    // The owner takes it again (generation 9): a late copy of the release
    // answers 1 and leaves the new hold alone.
    assert_eq!(acquire(&mut conn, "l", "m2", 1, 9), None);
    assert_eq!(
        release(&mut conn, "l", "latch7", 0, 7),
        Some(1),
        "late copy"
    );
    assert_eq!(
        gen_of(&mut conn, "l").as_deref(),
        Some("9"),
        "new hold kept"
    );
    // A partial release: 0, once; its retry finds its own generation.
    assert_eq!(acquire(&mut conn, "l", "m3", 2, 10), None);
    assert_eq!(release(&mut conn, "l", "latch11", 1, 11), Some(0));
    assert_eq!(gen_of(&mut conn, "l").as_deref(), Some("11"));
    assert_eq!(release(&mut conn, "l", "latch11", 1, 11), Some(0), "retry");
    assert_eq!(srv.cmd(&["HGET", "l", FIELD]), "1", "released once");
    // Not held: nil, and nil again on a retry after the owner took it anew.
    assert_eq!(release(&mut conn, "free", "latch12", 0, 12), None);
    assert_eq!(acquire(&mut conn, "free", "m4", 1, 13), None);
    assert_eq!(
        release(&mut conn, "free", "latch12", 0, 12),
        None,
        "late copy"
    );
    assert_eq!(gen_of(&mut conn, "free").as_deref(), Some("13"));
    // A release whose latch has expired, on a field a later request of the
    // owner wrote (an undo run by the watchdog): applied, as without the
    // fast path.
    srv.cmd(&["HSET", "u", FIELD, "1", &format!("{FIELD}:gen"), "20"]);
    assert_eq!(release(&mut conn, "u", "latch15", 0, 15), Some(1));
    assert_eq!(srv.cmd(&["EXISTS", "u"]), "0");
}

/// A release whose reply was lost before it ran, then the owner's next
/// acquisition (which sets the release's latch: it names it among its
/// unsettled requests), then the watchdog's settle of that release, sent
/// with a new, larger request id: the settle must find the latch and leave
/// the new hold alone. (A release fast path that took "generation older
/// than this request" to mean "not run yet" released the new hold here; the
/// randomized safety test found it.)
#[test]
fn a_settle_after_a_later_acquisition_leaves_the_new_hold_alone() {
    let srv = RedisServer::start();
    let mut conn = srv.conn();
    assert_eq!(acquire(&mut conn, "s", "m1", 1, 5), None);
    // The release (id 7, latch "latch7") never reaches redis. The owner
    // acquires again, setting the unsettled release's latch first.
    let acquired: Option<i64> = redis::cmd("EVAL")
        .arg(ACQUIRE_LUA)
        .arg(3)
        .arg("s")
        .arg("m2")
        .arg("latch7")
        .arg(30_000)
        .arg(FIELD)
        .arg(9)
        .arg(1)
        .arg("0")
        .arg(60_000)
        .query(&mut conn)
        .expect("acquire.lua with an unsettled release");
    assert_eq!(acquired, None);
    // The settle of the release, with a new request id.
    assert_eq!(release(&mut conn, "s", "latch7", 0, 11), Some(1));
    assert_eq!(
        gen_of(&mut conn, "s").as_deref(),
        Some("9"),
        "the new hold was released"
    );
}
