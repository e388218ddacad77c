//! The fair lock (Redisson's RFairLock layout): waiters get it in arrival
//! order across threads and clients (also when they wait longer than a
//! place is kept), a release tells only the first in line, a waiter that
//! gives up leaves the line at once, a crashed waiter holds up the line for
//! seconds only, a lost reply leaves neither a hold nor a place behind, and
//! Redisson's own scripts share the line both ways.

use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::{wait_until, Fault, Proxy, RedisServer};
use redlease::{Client, FairLock};

const WAIT: Duration = Duration::from_secs(30);
const LINE: &str = "redisson_lock_queue:{fair}";
const PLACES: &str = "redisson_lock_timeout:{fair}";

// Redisson's fair lock scripts (redisson-family.md §3.1, §3.4), without the
// unlock latch.
const REDISSON_ACQUIRE: &str = "while true do local first = redis.call('lindex', KEYS[2], 0); if first == false then break; end; local timeout = redis.call('zscore', KEYS[3], first); if timeout ~= false and tonumber(timeout) <= tonumber(ARGV[4]) then redis.call('zrem', KEYS[3], first); redis.call('lpop', KEYS[2]); else break; end; end; if (redis.call('exists', KEYS[1]) == 0) and ((redis.call('exists', KEYS[2]) == 0) or (redis.call('lindex', KEYS[2], 0) == ARGV[2])) then redis.call('lpop', KEYS[2]); redis.call('zrem', KEYS[3], ARGV[2]); local keys = redis.call('zrange', KEYS[3], 0, -1); for i = 1, #keys, 1 do redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), keys[i]); end; redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; local timeout = redis.call('zscore', KEYS[3], ARGV[2]); if timeout ~= false then local ttl = redis.call('pttl', KEYS[1]); return math.max(0, ttl); end; local lastThreadId = redis.call('lindex', KEYS[2], -1); local ttl; if lastThreadId ~= false and lastThreadId ~= ARGV[2] and redis.call('zscore', KEYS[3], lastThreadId) ~= false then ttl = tonumber(redis.call('zscore', KEYS[3], lastThreadId)) - tonumber(ARGV[4]); else ttl = redis.call('pttl', KEYS[1]); end; local timeout = ttl + tonumber(ARGV[3]) + tonumber(ARGV[4]); if redis.call('zadd', KEYS[3], timeout, ARGV[2]) == 1 then redis.call('rpush', KEYS[2], ARGV[2]); end; return ttl;";
const REDISSON_UNLOCK: &str = "while true do local first = redis.call('lindex', KEYS[2], 0); if first == false then break; end; local timeout = redis.call('zscore', KEYS[3], first); if timeout ~= false and tonumber(timeout) <= tonumber(ARGV[4]) then redis.call('zrem', KEYS[3], first); redis.call('lpop', KEYS[2]); else break; end; end; if (redis.call('exists', KEYS[1]) == 0) then local nextThreadId = redis.call('lindex', KEYS[2], 0); if nextThreadId ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. nextThreadId, ARGV[1]); end; return 1; end; if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; end; redis.call('del', KEYS[1]); local nextThreadId = redis.call('lindex', KEYS[2], 0); if nextThreadId ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. nextThreadId, ARGV[1]); end; return 1;";
const JAVA: &str = "6f1c2b1a-0000-4000-8000-00000000beef:9";

fn client(url: &str) -> Client {
    Client::open(url).expect("client")
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

fn line(srv: &RedisServer) -> Vec<String> {
    srv.cmd(&["LRANGE", LINE, "0", "-1"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Starts `n` waiters on `fair`, alternating between two clients, one at a
/// time (each in line before the next starts); each reports its number
/// when it holds the lock, and holds it for `hold`.
fn waiters_in_line(
    srv: &RedisServer,
    n: usize,
    hold: Duration,
) -> (mpsc::Receiver<usize>, Vec<thread::JoinHandle<()>>) {
    let clients = [client(&srv.url()), client(&srv.url())];
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::new();
    for i in 0..n {
        let lock: FairLock = clients[i % 2].fair_lock("fair");
        let tx = tx.clone();
        handles.push(thread::spawn(move || {
            let g = lock.try_lock_for(WAIT).expect("wait").expect("its turn");
            tx.send(i).expect("report");
            thread::sleep(hold);
            drop(g);
        }));
        wait_until(&format!("waiter {i} to be in line"), WAIT, || {
            line(srv).len() == i + 1
        });
    }
    (rx, handles)
}

#[test]
fn waiters_get_the_lock_in_arrival_order() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    let (rx, handles) = waiters_in_line(&srv, 6, Duration::from_millis(2));
    assert_eq!(holder.fair_lock("fair").waiters().expect("waiters"), 6);
    drop(g);
    let order: Vec<usize> = (0..6)
        .map(|_| rx.recv_timeout(WAIT).expect("every waiter gets it"))
        .collect();
    assert_eq!(order, (0..6).collect::<Vec<_>>(), "arrival order");
    for h in handles {
        h.join().expect("waiter");
    }
    assert!(line(&srv).is_empty());
    assert_eq!(srv.cmd(&["EXISTS", PLACES]), "0");
}

/// Waiters keep their places while the holder holds longer than a place is
/// kept without renewal.
#[test]
fn waiters_keep_their_places_through_a_long_hold() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    let (rx, handles) = waiters_in_line(&srv, 3, Duration::ZERO);
    thread::sleep(redlease::FAIR_PLACE + Duration::from_secs(1));
    assert_eq!(line(&srv).len(), 3, "nobody lost its place");
    drop(g);
    let order: Vec<usize> = (0..3)
        .map(|_| rx.recv_timeout(WAIT).expect("turn"))
        .collect();
    assert_eq!(order, vec![0, 1, 2]);
    for h in handles {
        h.join().expect("waiter");
    }
}

/// A release publishes only on the first waiter's own channel.
#[test]
fn a_release_tells_only_the_first_in_line() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    let (rx, handles) = waiters_in_line(&srv, 2, Duration::from_millis(300));
    let owners = line(&srv);
    let first = srv.listen(&format!("redisson_lock__channel:{{fair}}:{}", owners[0]));
    let second = srv.listen(&format!("redisson_lock__channel:{{fair}}:{}", owners[1]));
    let base = srv.listen("redisson_lock__channel:{fair}");
    drop(g);
    assert_eq!(first.recv_timeout(WAIT).expect("the first is told"), b"0");
    assert_eq!(rx.recv_timeout(WAIT).expect("first"), 0);
    assert!(
        second.recv_timeout(Duration::from_millis(200)).is_err(),
        "the second is not told while the first holds it"
    );
    assert!(
        base.try_recv().is_err(),
        "nothing on the lock's own channel"
    );
    assert_eq!(rx.recv_timeout(WAIT).expect("second"), 1);
    for h in handles {
        h.join().expect("waiter");
    }
}

#[test]
fn a_waiter_that_gives_up_leaves_the_line_at_once() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let _g = holder.fair_lock("fair").lock().expect("lock");
    let other = client(&srv.url());
    let t = Instant::now();
    assert!(other
        .fair_lock("fair")
        .try_lock_for(Duration::from_millis(300))
        .expect("try_lock_for")
        .is_none());
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(line(&srv).is_empty(), "left the line");
    assert_eq!(srv.cmd(&["EXISTS", PLACES]), "0");
    // try_lock never takes a place.
    assert!(other.fair_lock("fair").try_lock().expect("try").is_none());
    assert!(line(&srv).is_empty());
}

/// A waiter finds its turn at its next re-check even when nobody tells it
/// (the waiter before it left the line without a word).
#[test]
fn a_waiter_finds_its_turn_without_a_message() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    // A dead waiter first in line, placed far in the future (Redisson's
    // way): the lock is free, but it is not the live waiter's turn.
    let mut conn = srv.conn();
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(LINE)
        .arg(JAVA)
        .ignore()
        .cmd("ZADD")
        .arg(PLACES)
        .arg(epoch_ms() + 300_000)
        .arg(JAVA)
        .ignore()
        .query(&mut conn)
        .expect("dead waiter");
    let (tx, rx) = mpsc::channel();
    let waiter = c.fair_lock("fair");
    thread::spawn(move || {
        let g = waiter.try_lock_for(WAIT).expect("wait");
        tx.send(g.is_some()).expect("report");
        drop(g);
    });
    wait_until("the live waiter in line", WAIT, || line(&srv).len() == 2);
    // The dead waiter "gives up" (Redisson's acquireFailed).
    let _: () = redis::pipe()
        .cmd("ZREM")
        .arg(PLACES)
        .arg(JAVA)
        .ignore()
        .cmd("LREM")
        .arg(LINE)
        .arg(0)
        .arg(JAVA)
        .ignore()
        .query(&mut conn)
        .expect("leave");
    // Nobody told the live waiter: it finds its turn at its next re-check.
    assert!(rx.recv_timeout(WAIT).expect("its turn"));
}

/// A waiter that vanished without leaving (its process crashed) holds up
/// the line only until its place runs out.
#[test]
fn a_crashed_waiter_holds_up_the_line_for_seconds() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    // A crashed redlease waiter: a place kept FAIR_PLACE from now, never
    // renewed.
    let now_ms = {
        let t = srv.cmd(&["TIME"]);
        let mut parts = t.lines();
        let secs: u64 = parts.next().unwrap().parse().unwrap();
        let micros: u64 = parts.next().unwrap().parse().unwrap();
        secs * 1000 + micros / 1000
    };
    let place = redlease::FAIR_PLACE.as_millis() as u64;
    let mut conn = srv.conn();
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(LINE)
        .arg("crashed:1")
        .ignore()
        .cmd("ZADD")
        .arg(PLACES)
        .arg(now_ms + place)
        .arg("crashed:1")
        .ignore()
        .query(&mut conn)
        .expect("crashed waiter");
    let (tx, rx) = mpsc::channel();
    let waiter = client(&srv.url()).fair_lock("fair");
    thread::spawn(move || {
        let g = waiter.try_lock_for(WAIT).expect("wait");
        tx.send((g.is_some(), Instant::now())).expect("report");
    });
    wait_until("the live waiter in line", WAIT, || line(&srv).len() == 2);
    let released = Instant::now();
    drop(g);
    let (ok, at) = rx.recv_timeout(WAIT).expect("the live waiter gets it");
    assert!(ok);
    let took = at.duration_since(released);
    eprintln!("figure: a crashed waiter held up the line {took:?} (place {place} ms)");
    assert!(
        took < redlease::FAIR_PLACE + Duration::from_secs(3),
        "held up {took:?}"
    );
}

#[test]
fn a_lost_reply_leaves_neither_a_hold_nor_a_place() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = crate::faults_common::impatient(&proxy.url());
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    // A waiting acquisition whose reply is lost: the caller gets an error,
    // and its place is given up.
    proxy.add_rule(b"redisson_lock_queue", Fault::DropReply, 1);
    assert!(c
        .fair_lock("fair")
        .try_lock_for(Duration::from_secs(5))
        .is_err());
    wait_until("the lost request to be settled", WAIT, || {
        c.stats().unsettled_requests == 0 && line(&srv).is_empty()
    });
    assert_eq!(srv.cmd(&["EXISTS", PLACES]), "0");
    drop(g);
    // An acquisition of the free lock whose reply is lost: undone.
    proxy.add_rule(b"redisson_lock_queue", Fault::DropReply, 1);
    assert!(c.fair_lock("fair").try_lock().is_err());
    wait_until("the lost acquisition to be undone", WAIT, || {
        c.stats().unsettled_requests == 0 && srv.cmd(&["EXISTS", "fair"]) == "0"
    });
    assert!(holder.fair_lock("fair").try_lock().expect("try").is_some());
}

/// Redisson's own fair scripts on a raw connection share the line: a
/// Redisson waiter behind a redlease holder is told on its own channel, and
/// a Redisson holder's unlock tells the redlease waiter first in line.
#[test]
fn redisson_waiters_share_the_line() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let mut java = srv.conn();
    let acquire = |java: &mut redis::Connection| -> Option<i64> {
        redis::cmd("EVAL")
            .arg(REDISSON_ACQUIRE)
            .arg(3)
            .arg("fair")
            .arg(LINE)
            .arg(PLACES)
            .arg(30_000)
            .arg(JAVA)
            .arg(300_000)
            .arg(epoch_ms())
            .query(java)
            .expect("redisson acquire")
    };
    let unlock = |java: &mut redis::Connection| -> Option<i64> {
        redis::cmd("EVAL")
            .arg(REDISSON_UNLOCK)
            .arg(4)
            .arg("fair")
            .arg(LINE)
            .arg(PLACES)
            .arg("redisson_lock__channel:{fair}")
            .arg(0)
            .arg(30_000)
            .arg(JAVA)
            .arg(epoch_ms())
            .arg("publish")
            .query(java)
            .expect("redisson unlock")
    };
    // redlease holds; Redisson queues and is told on its own channel.
    let g = c.fair_lock("fair").lock().expect("lock");
    assert!(
        acquire(&mut java).is_some_and(|ttl| ttl > 0),
        "Redisson waits"
    );
    assert_eq!(line(&srv), vec![JAVA.to_owned()]);
    let told = srv.listen(&format!("redisson_lock__channel:{{fair}}:{JAVA}"));
    drop(g);
    assert_eq!(told.recv_timeout(WAIT).expect("Redisson is told"), b"0");
    assert_eq!(acquire(&mut java), None, "Redisson takes its turn");
    // Redisson holds; a redlease waiter queues; Redisson's unlock tells it.
    let (tx, rx) = mpsc::channel();
    let waiter = c.fair_lock("fair");
    let got = Arc::new(Mutex::new(None));
    let got2 = Arc::clone(&got);
    thread::spawn(move || {
        let g = waiter.try_lock_for(WAIT).expect("wait");
        *got2.lock().unwrap() = Some(Instant::now());
        tx.send(g.is_some()).expect("report");
    });
    wait_until("the redlease waiter in line", WAIT, || {
        line(&srv).len() == 1
    });
    let released = Instant::now();
    assert_eq!(unlock(&mut java), Some(1));
    assert!(rx.recv_timeout(WAIT).expect("woken by Redisson's unlock"));
    let took = got.lock().unwrap().expect("time").duration_since(released);
    assert!(
        took < Duration::from_secs(1),
        "woken by the message ({took:?})"
    );
}

/// The lock is free but someone is first in line: a newcomer neither takes
/// it with `try_lock` nor while waiting, until its turn comes.
#[test]
fn a_newcomer_never_jumps_the_line() {
    let srv = RedisServer::start();
    let c = client(&srv.url());
    let mut conn = srv.conn();
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(LINE)
        .arg(JAVA)
        .ignore()
        .cmd("ZADD")
        .arg(PLACES)
        .arg(epoch_ms() + 300_000)
        .arg(JAVA)
        .ignore()
        .query(&mut conn)
        .expect("a waiter first in line");
    let lock = c.fair_lock("fair");
    assert!(lock.try_lock().expect("try").is_none(), "not its turn");
    assert!(lock
        .try_lock_for(Duration::from_millis(2500))
        .expect("wait")
        .is_none());
    assert_eq!(line(&srv), vec![JAVA.to_owned()], "and it left the line");
}

/// The oracle: 8 threads on two clients, 15 rounds each; never two inside.
#[test]
fn fair_lock_excludes_under_contention() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let srv = RedisServer::start();
    let clients = [client(&srv.url()), client(&srv.url())];
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let lock = clients[t % 2].fair_lock("fair");
            let (inside, overlaps) = (Arc::clone(&inside), Arc::clone(&overlaps));
            thread::spawn(move || {
                for _ in 0..15 {
                    let g = lock.lock().expect("lock");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_micros(300));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.unlock().expect("unlock");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(line(&srv).is_empty(), "nobody left in line");
    assert_eq!(srv.cmd(&["EXISTS", "fair"]), "0");
}

/// A waiter whose subscriber connection is cut, and one that rides out a
/// Redis restart (the line and the lock are gone with it): each gets the
/// lock.
#[test]
fn waiters_survive_a_cut_subscriber_and_a_restart() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    let (rx, handles) = waiters_in_line(&srv, 1, Duration::ZERO);
    wait_until("the waiter to subscribe to its channel", WAIT, || {
        !srv.cmd(&["PUBSUB", "CHANNELS", "redisson_lock__channel:{fair}:*"])
            .is_empty()
    });
    assert!(srv.client_kill_type("pubsub") >= 1, "the subscriber cut");
    drop(g);
    assert_eq!(rx.recv_timeout(WAIT).expect("its turn after the cut"), 0);
    for h in handles {
        h.join().expect("waiter");
    }
    let g = holder.fair_lock("fair").lock().expect("lock again");
    let (rx, handles) = waiters_in_line(&srv, 1, Duration::ZERO);
    srv.restart();
    assert_eq!(
        rx.recv_timeout(WAIT).expect("its turn after the restart"),
        0
    );
    for h in handles {
        h.join().expect("waiter");
    }
    assert!(
        g.unlock().is_err(),
        "the holder's lock went with the restart"
    );
}

// Found by an adversarial review; each failed before its fix.

fn redisson_acquire(java: &mut redis::Connection, owner: &str) -> Option<i64> {
    redis::cmd("EVAL")
        .arg(REDISSON_ACQUIRE)
        .arg(3)
        .arg("fair")
        .arg(LINE)
        .arg(PLACES)
        .arg(30_000)
        .arg(owner)
        .arg(300_000)
        .arg(epoch_ms())
        .query(java)
        .expect("redisson acquire")
}

fn redisson_unlock(java: &mut redis::Connection, owner: &str) -> Option<i64> {
    redis::cmd("EVAL")
        .arg(REDISSON_UNLOCK)
        .arg(4)
        .arg("fair")
        .arg(LINE)
        .arg(PLACES)
        .arg("redisson_lock__channel:{fair}")
        .arg(0)
        .arg(30_000)
        .arg(owner)
        .arg(epoch_ms())
        .arg("publish")
        .query(java)
        .expect("redisson unlock")
}

/// A thread whose fair hold was lost (its lease ran out) and that asks for
/// the lock again while another holds it takes a place in line like anyone
/// else: it came before X, so it gets the lock before X (it used to wait
/// without a place, for an empty line).
#[test]
fn a_thread_whose_hold_was_lost_waits_in_line() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let t_client = client(&srv.url());
    let x_client = client(&srv.url());
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel();
    let t_lock = t_client.fair_lock("fair");
    let tx_t = tx.clone();
    let t = thread::spawn(move || {
        let old = t_lock
            .lock_with_lease(Duration::from_millis(200))
            .expect("lock");
        go_rx.recv().expect("go");
        let g = t_lock.try_lock_for(WAIT).expect("wait");
        tx_t.send(("T", g.is_some())).expect("report");
        thread::sleep(Duration::from_millis(100));
        drop(g);
        drop(old);
    });
    thread::sleep(Duration::from_millis(400));
    let hg = holder.fair_lock("fair").lock().expect("holder");
    go_tx.send(()).expect("go");
    thread::sleep(Duration::from_secs(1));
    let t_line = line(&srv);
    let x_lock = x_client.fair_lock("fair");
    let x = thread::spawn(move || {
        let g = x_lock.try_lock_for(WAIT).expect("wait");
        tx.send(("X", g.is_some())).expect("report");
        thread::sleep(Duration::from_millis(100));
        drop(g);
    });
    wait_until("X in line", WAIT, || line(&srv).len() == t_line.len() + 1);
    drop(hg);
    let first = rx.recv_timeout(WAIT).expect("first");
    let second = rx.recv_timeout(WAIT).expect("second");
    t.join().expect("t");
    x.join().expect("x");
    assert_eq!(
        (t_line.len(), first.0, second.0),
        (1, "T", "X"),
        "T asked first; line when T waited: {t_line:?}"
    );
}

/// A leave retried in the background (its reply was lost) spares the place
/// the same thread took since in a new wait (it used to remove it).
#[test]
fn a_background_leave_spares_a_later_place() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let c = crate::faults_common::impatient(&proxy.url());
    let holder = client(&srv.url());
    let hg = holder.fair_lock("fair").lock().expect("lock");
    // The leave script (the only one with the channel right before the line).
    proxy.add_rule(
        b"redisson_lock__channel:{fair}\r\n$26\r\nredisson_lock_queue",
        Fault::DropReply,
        3,
    );
    let (tx, rx) = mpsc::channel();
    let (gave_up_tx, gave_up_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let lock = c.fair_lock("fair");
    let tx_t = tx.clone();
    let t = thread::spawn(move || {
        assert!(lock
            .try_lock_for(Duration::from_millis(300))
            .expect("first wait")
            .is_none());
        gave_up_tx.send(()).expect("gave up");
        go_rx.recv().expect("go");
        let g = lock.try_lock_for(WAIT).expect("second wait");
        tx_t.send(("T", g.is_some())).expect("report");
        thread::sleep(Duration::from_millis(100));
        drop(g);
    });
    gave_up_rx.recv_timeout(WAIT).expect("T gave up");
    // T's old place is still there (its leave was lost); T waits again:
    // its first try renews its deadline.
    let deadline = || -> u64 {
        let owner = line(&srv).first().cloned().unwrap_or_default();
        srv.cmd(&["HGET", "redlease_fair_alive:{fair}", &owner])
            .parse()
            .unwrap_or(0)
    };
    let old = deadline();
    go_tx.send(()).expect("go");
    wait_until("T back in line", WAIT, || {
        line(&srv).len() == 1 && deadline() > old
    });
    let x_lock = client(&srv.url()).fair_lock("fair");
    let x = thread::spawn(move || {
        let g = x_lock.try_lock_for(WAIT).expect("wait");
        tx.send(("X", g.is_some())).expect("report");
        thread::sleep(Duration::from_millis(100));
        drop(g);
    });
    wait_until("X in line", WAIT, || line(&srv).len() == 2);
    let before = line(&srv);
    wait_until("the old leave settled", WAIT, || {
        c.stats().unsettled_requests == 0
    });
    let after = line(&srv);
    drop(hg);
    let first = rx.recv_timeout(WAIT).expect("first");
    t.join().expect("t");
    x.join().expect("x");
    assert_eq!(
        (after.first(), first.0),
        (before.first(), "T"),
        "line before the old leave ran {before:?}, after {after:?}"
    );
}

/// A Redisson client that takes its turn (Redisson's acquire moves every
/// place earlier by its wait, 5 min) does not throw the redlease waiters
/// behind it out of the line: they keep their order and the first of them
/// is told when Redisson unlocks (they used to be dropped).
#[test]
fn a_redisson_acquisition_keeps_redlease_waiters_in_line() {
    let srv = RedisServer::start();
    let mut java = srv.conn();
    let holder = client(&srv.url());
    let g = holder.fair_lock("fair").lock().expect("lock");
    assert!(redisson_acquire(&mut java, JAVA).is_some_and(|t| t > 0));
    let clients = [client(&srv.url()), client(&srv.url())];
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::new();
    for i in 0..3 {
        let lock: FairLock = clients[i % 2].fair_lock("fair");
        let tx = tx.clone();
        handles.push(thread::spawn(move || {
            let g = lock.try_lock_for(WAIT).expect("wait").expect("its turn");
            tx.send((i, Instant::now())).expect("report");
            thread::sleep(Duration::from_millis(5));
            drop(g);
        }));
        wait_until("in line", WAIT, || line(&srv).len() == i + 2);
    }
    let told = srv.listen(&format!("redisson_lock__channel:{{fair}}:{JAVA}"));
    drop(g);
    told.recv_timeout(WAIT).expect("Redisson told");
    assert_eq!(redisson_acquire(&mut java, JAVA), None, "Redisson's turn");
    let before = line(&srv);
    thread::sleep(Duration::from_millis(100));
    let released = Instant::now();
    assert_eq!(redisson_unlock(&mut java, JAVA), Some(1));
    let after = line(&srv);
    let got: Vec<(usize, Instant)> = (0..3)
        .map(|_| rx.recv_timeout(WAIT).expect("turn"))
        .collect();
    for h in handles {
        h.join().expect("waiter");
    }
    let order: Vec<usize> = got.iter().map(|g| g.0).collect();
    let handoff = got[0].1.duration_since(released);
    eprintln!("figure: line {before:?} -> {after:?}; order {order:?}; hand-off {handoff:?}");
    // The first may have its turn already: the line is the same but for it.
    assert!(
        before.ends_with(&after) && before.len() - after.len() <= 1,
        "the waiters kept their places"
    );
    assert_eq!(order, vec![0, 1, 2], "arrival order");
    assert!(
        handoff < Duration::from_millis(500),
        "told, not found ({handoff:?})"
    );
}

/// A live waiter whose tries are answered slowly (but within the client's
/// response timeout) keeps its place: the place outlives the longest gap
/// between two of its tries (with a 6 s response timeout it used not to).
#[test]
fn a_slow_but_live_waiter_keeps_its_place() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let slow = Client::builder(proxy.url())
        .response_timeout(Duration::from_secs(6))
        .build()
        .expect("client");
    let holder = client(&srv.url());
    let hg = holder.fair_lock("fair").lock().expect("lock");
    let (tx, rx) = mpsc::channel();
    let a_lock = slow.fair_lock("fair");
    let tx_a = tx.clone();
    let a = thread::spawn(move || {
        let g = a_lock.try_lock_for(WAIT).expect("wait");
        tx_a.send(("A", g.is_some())).expect("report");
        drop(g);
    });
    wait_until("A in line", WAIT, || line(&srv).len() == 1);
    let a_owner = line(&srv)[0].clone();
    // Redis answers A's tries 4.5 s late (well within its 6 s timeout).
    proxy.add_rule(
        b"redisson_lock_timeout:{fair}",
        Fault::DelayReply(Duration::from_millis(4500)),
        3,
    );
    let b_lock = client(&srv.url()).fair_lock("fair");
    let b = thread::spawn(move || {
        let g = b_lock.try_lock_for(WAIT).expect("wait");
        tx.send(("B", g.is_some())).expect("report");
        drop(g);
    });
    wait_until("B in line", WAIT, || line(&srv).len() == 2);
    // Others try now and then (each try prunes a head whose place ran out).
    let other = client(&srv.url()).fair_lock("fair");
    let mut lost_at = None;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(14) {
        assert!(other.try_lock().expect("try").is_none());
        if lost_at.is_none() && line(&srv).first() != Some(&a_owner) {
            lost_at = Some(t0.elapsed());
        }
        thread::sleep(Duration::from_millis(100));
    }
    drop(hg);
    let first = rx.recv_timeout(WAIT).expect("first");
    a.join().expect("a");
    b.join().expect("b");
    assert_eq!(
        (lost_at, first.0),
        (None, "A"),
        "A lost the head of the line at {lost_at:?}"
    );
}

// Found by a second review.

fn sha1_hex(src: &str) -> String {
    redis::Script::new(src).get_hash().to_owned()
}

/// A waiter gave up (its deadline) but its leave did not get through; it
/// waits again before the background leave ran. Its new wait queues at the
/// end (its next try sets the leave's marker, so the leave never runs, and
/// the old place used to be kept: it was served before a waiter that
/// queued while it was gone).
#[test]
fn a_waiter_that_gave_up_does_not_keep_its_old_place() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = crate::faults_common::impatient(&proxy.url());
    let h = Client::open(srv.url()).expect("client");
    let c = Client::open(srv.url()).expect("client");
    let held = h.fair_lock("f").lock().expect("holder");
    let leave_sha = sha1_hex(concat!(
        include_str!("../../src/scripts/fair_lib.lua"),
        include_str!("../../src/scripts/fair_leave.lua")
    ));
    let hole = proxy.add_rule(leave_sha.as_bytes(), Fault::BlackHole, usize::MAX);
    let fa = a.fair_lock("f");
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (gave_up_tx, gave_up_rx) = std::sync::mpsc::channel::<()>();
    // One thread: gives up, then (after C queued) waits again.
    let a_waits = std::thread::spawn(move || {
        assert!(fa
            .try_lock_for(Duration::from_millis(200))
            .expect("wait")
            .is_none());
        gave_up_tx.send(()).expect("send");
        go_rx.recv().expect("go");
        let g = fa.try_lock_for(WAIT).expect("a waits");
        (g.is_some(), Instant::now())
    });
    gave_up_rx.recv().expect("gave up");
    proxy.wait_hits(hole, 1, WAIT);
    // C queues while A is away.
    let c_waits = std::thread::spawn(move || {
        let g = c.fair_lock("f").try_lock_for(WAIT).expect("c waits");
        (g.is_some(), Instant::now())
    });
    wait_until("C in line", WAIT, || {
        srv.cmd(&["LLEN", "redisson_lock_queue:{f}"]) == "2"
    });
    go_tx.send(()).expect("go");
    std::thread::sleep(Duration::from_millis(500));
    let line = srv.cmd(&["LRANGE", "redisson_lock_queue:{f}", "0", "-1"]);
    proxy.remove_rule(hole);
    drop(held);
    let (c_got, c_at) = c_waits.join().expect("c");
    let (a_got, a_at) = a_waits.join().expect("a");
    assert!(c_got && a_got);
    assert!(
        c_at < a_at,
        "A, who gave up and came back after C queued, was served first (line: {line:?})"
    );
}

/// A waiter gave up (its deadline) but its leave did not get through, and
/// the lock is released meanwhile: the release tells its old place, still
/// first in line, not the waiter behind it. The waiter's next try takes its
/// old place out and, finding the lock free with another waiter first,
/// tells that one, who would otherwise sleep until its re-check (2 s).
#[test]
fn a_try_that_finds_the_lock_free_tells_the_first_in_line() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let a = crate::faults_common::impatient(&proxy.url());
    let h = Client::open(srv.url()).expect("client");
    let b = Client::open(srv.url()).expect("client");
    let held = h.fair_lock("t").lock().expect("holder");
    let leave_sha = sha1_hex(concat!(
        include_str!("../../src/scripts/fair_lib.lua"),
        include_str!("../../src/scripts/fair_leave.lua")
    ));
    let hole = proxy.add_rule(leave_sha.as_bytes(), Fault::BlackHole, usize::MAX);
    let fa = a.fair_lock("t");
    assert!(fa
        .try_lock_for(Duration::from_millis(200))
        .expect("wait")
        .is_none());
    proxy.wait_hits(hole, 1, WAIT);
    let b_waits = thread::spawn(move || {
        b.fair_lock("t")
            .try_lock_for(WAIT)
            .expect("b waits")
            .map(|g| g.unlock())
    });
    wait_until("B in line behind A's old place", WAIT, || {
        srv.cmd(&["LLEN", "redisson_lock_queue:{t}"]) == "2"
    });
    let b_field = srv.cmd(&["LINDEX", "redisson_lock_queue:{t}", "1"]);
    let told = srv.listen(&format!("redisson_lock__channel:{{t}}:{b_field}"));
    drop(held);
    assert!(
        fa.try_lock().expect("a's next try").is_none(),
        "B is first in line now"
    );
    assert_eq!(
        told.recv_timeout(WAIT)
            .expect("B to be told by A's try that found the lock free"),
        b"0"
    );
    let got = b_waits.join().expect("b");
    assert!(matches!(got, Some(Ok(()))), "B took the lock: {got:?}");
    proxy.remove_rule(hole);
}

/// A user without the lock's channels (docs/production.md: such a user can
/// take free locks) gets "busy" from a fair try that finds the lock free
/// and another waiter first in line, as before that try told the first
/// waiter: the wake-up is best effort, not an error.
#[test]
fn a_try_without_the_channel_that_finds_another_first_is_busy_not_an_error() {
    let srv = RedisServer::start();
    let out = srv.cmd(&[
        "ACL",
        "SETUSER",
        "nochan",
        "on",
        ">pw",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    assert_eq!(out.trim(), "OK", "{out}");
    // Another waiter first in line (a live place), the lock free.
    let until = (epoch_ms() + 60_000).to_string();
    srv.cmd(&["RPUSH", "redisson_lock_queue:{nochan}", "other:1"]);
    srv.cmd(&["ZADD", "redisson_lock_timeout:{nochan}", &until, "other:1"]);
    let c = client(&format!("redis://nochan:pw@127.0.0.1:{}/", srv.port()));
    let got = c.fair_lock("nochan").try_lock();
    assert!(
        matches!(got, Ok(None)),
        "try_lock on a free fair lock with another waiter first: {:?}",
        got.map(|g| g.is_some())
    );
}

/// `force_unlock` deletes the lock whoever holds it and tells the first in
/// line, who takes it.
#[test]
fn force_unlock_wakes_the_first_in_line() {
    let srv = RedisServer::start();
    let holder = client(&srv.url());
    let _g = holder.fair_lock("fair").lock().expect("lock");
    let (rx, handles) = waiters_in_line(&srv, 1, Duration::ZERO);
    let told = srv.listen(&format!(
        "redisson_lock__channel:{{fair}}:{}",
        line(&srv)[0]
    ));
    let forced = Instant::now();
    assert!(holder.fair_lock("fair").force_unlock().expect("force"));
    assert_eq!(told.recv_timeout(WAIT).expect("the first is told"), b"0");
    assert_eq!(rx.recv_timeout(WAIT).expect("its turn"), 0);
    assert!(forced.elapsed() < Duration::from_secs(1), "told, not found");
    for h in handles {
        h.join().expect("waiter");
    }
    assert!(!holder.fair_lock("fair").force_unlock().expect("again"));
}
