//! Interop with Redisson's RLock on the same Redis: Redisson's own acquire and
//! release Lua scripts (verbatim from Redisson 3.x), run from a plain
//! connection with a fake Redisson owner field, against redlease on the same
//! lock name: mutual exclusion both ways, wake-ups both ways through the
//! shared release channel, and the hold counts both write into the hash.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{wait_until, RedisServer};
use redlease::Client;

const WAIT: Duration = Duration::from_secs(10);
/// A wake-up through pub/sub must come well within this; every lease here is
/// 30 s, so only the release message explains an acquisition inside it.
const HANDOFF_BOUND: Duration = Duration::from_secs(5);
const LEASE_MS: u64 = 30_000;

/// Redisson 3.x `RedissonLock.tryLockInnerAsync` (KEYS[1] = lock name,
/// ARGV[1] = lease ms, ARGV[2] = owner field `<uuid>:<thread id>`).
const REDISSON_ACQUIRE: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// Redisson 3.x `RedissonLock.unlockInnerAsync` (with the unlock latch):
/// KEYS = [name, channel, latch], ARGV = [0, lease ms, field, 'publish',
/// latch timeout ms].
const REDISSON_RELEASE: &str = "local val = redis.call('get', KEYS[3]); if val ~= false then return tonumber(val); end; if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; else redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1; end; return nil;";

/// A Redisson owner field: `<connection manager uuid>:<java thread id>`.
const REDISSON_FIELD: &str = "e3b0c442-98fc-1c14-9afb-f4c8996fb924:1";

/// Redisson's `prefixName("redisson_lock__channel", name)`.
pub(crate) fn redisson_channel(name: &str) -> String {
    if name.contains('{') {
        format!("redisson_lock__channel:{name}")
    } else {
        format!("redisson_lock__channel:{{{name}}}")
    }
}

/// A plain connection acting as a Redisson client.
pub(crate) struct Redisson {
    conn: redis::Connection,
    requests: u64,
    /// Redisson's publish command: `publish`, or `spublish` on a cluster
    /// with sharded pub/sub.
    publish: &'static str,
}

impl Redisson {
    pub(crate) fn new(srv: &RedisServer) -> Redisson {
        Redisson {
            conn: srv.conn(),
            requests: 0,
            publish: "publish",
        }
    }

    /// A Redisson client on a Redis 7 cluster (sharded pub/sub, its
    /// default), talking to the master of the locks' slot.
    pub(crate) fn sharded(master: &RedisServer) -> Redisson {
        Redisson {
            publish: "spublish",
            ..Redisson::new(master)
        }
    }

    /// `None` = acquired (or re-entered); `Some(pttl)` = busy.
    pub(crate) fn acquire(&mut self, name: &str, lease_ms: u64) -> Option<i64> {
        redis::cmd("EVAL")
            .arg(REDISSON_ACQUIRE)
            .arg(1)
            .arg(name)
            .arg(lease_ms)
            .arg(REDISSON_FIELD)
            .query(&mut self.conn)
            .expect("Redisson's acquire script")
    }

    /// `None` = not held by this owner; `Some(0)` = holds remain;
    /// `Some(1)` = released and published.
    pub(crate) fn release(&mut self, name: &str) -> Option<i64> {
        self.requests += 1;
        // Redisson: prefixName("redisson_unlock_latch", name) + ":" + requestId.
        let latch = if name.contains('{') {
            format!("redisson_unlock_latch:{name}:req-{}", self.requests)
        } else {
            format!("redisson_unlock_latch:{{{name}}}:req-{}", self.requests)
        };
        redis::cmd("EVAL")
            .arg(REDISSON_RELEASE)
            .arg(3)
            .arg(name)
            .arg(redisson_channel(name))
            .arg(latch)
            .arg(0)
            .arg(LEASE_MS)
            .arg(REDISSON_FIELD)
            .arg(self.publish)
            .arg(5000)
            .query(&mut self.conn)
            .expect("Redisson's release script")
    }

    /// The owner fields of a lock hash, as Redisson sees them (redlease's
    /// generation fields `<owner>:gen`, which Redisson never reads, left out).
    fn hash(&mut self, name: &str) -> HashMap<String, String> {
        let mut hash: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(name)
            .query(&mut self.conn)
            .expect("HGETALL");
        hash.retain(|f, _| !f.ends_with(":gen"));
        hash
    }
}

fn client(srv: &RedisServer) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(LEASE_MS))
        .build()
        .expect("client connects to the test server")
}

#[test]
fn redisson_holder_excludes_redlease_and_its_release_wakes_a_waiter() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let mut redisson = Redisson::new(&srv);
    let name = "shared:orders";
    let lock = client.lock(name);

    assert_eq!(redisson.acquire(name, LEASE_MS), None, "Redisson acquires");
    assert_eq!(redisson.acquire(name, LEASE_MS), None, "Redisson re-enters");
    assert_eq!(
        redisson.hash(name),
        HashMap::from([(REDISSON_FIELD.to_owned(), "2".to_owned())])
    );

    // Seen from redlease: held, not by us.
    assert!(lock.try_lock().unwrap().is_none());
    assert!(lock
        .try_lock_for(Duration::from_millis(100))
        .unwrap()
        .is_none());
    assert!(lock.is_locked().unwrap());
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert!(!lock.is_held_by_current_thread().unwrap());
    let remaining = lock.remaining_lease().unwrap().expect("held by Redisson");
    assert!(remaining <= Duration::from_millis(LEASE_MS));
    assert!(lock
        .try_lock_with_lease(Duration::from_millis(100), Duration::from_secs(1))
        .unwrap()
        .is_none());
    // The waits that gave up leave the queue in the background, and the
    // last to leave takes the queue's mark out of the hash.
    wait_until("the hash back to Redisson's one field", WAIT, || {
        redisson.hash(name).len() == 1
    });

    // A redlease waiter, blocked in lock().
    let (tx, rx) = mpsc::channel();
    let waiter = lock.clone();
    thread::spawn(move || {
        let result = waiter.lock().map(|g| {
            let at = Instant::now();
            let count = g.hold_count();
            drop(g);
            (at, count)
        });
        let _ = tx.send(result.map_err(|e| e.to_string()));
    });
    wait_until("the redlease waiter to subscribe", WAIT, || {
        client.stats().subscribed_channels == 2
    });

    // Redisson's partial release keeps the lock (and publishes nothing).
    // Besides Redisson's count, the hash may carry the mark of the queued
    // redlease process (redlease's own field, which Redisson never reads).
    assert_eq!(redisson.release(name), Some(0));
    let mut hash = redisson.hash(name);
    hash.remove("redlease:waiting");
    assert_eq!(
        hash,
        HashMap::from([(REDISSON_FIELD.to_owned(), "1".to_owned())])
    );
    assert!(
        matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "the waiter took a lock Redisson still holds"
    );

    let released = Instant::now();
    assert_eq!(redisson.release(name), Some(1), "Redisson's full release");
    let (at, count) = rx
        .recv_timeout(HANDOFF_BOUND)
        .expect("Redisson's release message to wake the redlease waiter")
        .expect("the waiter's lock()");
    assert_eq!(count, 1);
    let delay = at - released;
    assert!(delay < HANDOFF_BOUND, "{delay:?}");
    eprintln!(
        "FIGURE: Redisson release script -> redlease waiter acquired in {:.2} ms (lease {LEASE_MS} ms)",
        delay.as_secs_f64() * 1000.0
    );
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn redlease_holder_excludes_redisson_and_wakes_its_channel() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let mut redisson = Redisson::new(&srv);
    for name in ["shared:stock", "tagged{shared}:stock"] {
        let lock = client.lock(name);
        let messages = srv.listen(&redisson_channel(name));

        let g1 = lock.lock().unwrap();
        let g2 = lock.lock().unwrap();
        // redlease's re-entry count is the hash value Redisson reads.
        let hash = redisson.hash(name);
        assert_eq!(hash.len(), 1, "{hash:?}");
        let (field, count) = hash.iter().next().unwrap();
        assert!(field.starts_with(&format!("{}:", client.id())), "{field}");
        assert_eq!(count, "2");

        // Redisson's acquire sees it busy and gets the PTTL, not nil.
        let pttl = redisson
            .acquire(name, LEASE_MS)
            .expect("Redisson must not acquire a lock redlease holds");
        assert!(pttl > 0 && pttl <= LEASE_MS as i64, "PTTL {pttl}");
        // Redisson's release of a lock it does not hold: nil, nothing changes.
        assert_eq!(redisson.release(name), None);
        assert_eq!(
            redisson.hash(name).get(field.as_str()).map(String::as_str),
            Some("2")
        );
        assert_eq!(lock.hold_count().unwrap(), 2);

        // Partial release: no message; full release: "0" on Redisson's channel.
        drop(g2);
        let _: i64 = redis::cmd("PUBLISH")
            .arg(redisson_channel(name))
            .arg("marker")
            .query(&mut srv.conn())
            .unwrap();
        assert_eq!(messages.recv_timeout(WAIT).expect("the marker"), b"marker");
        g1.unlock().unwrap();
        assert_eq!(
            messages
                .recv_timeout(WAIT)
                .expect("redlease's release message"),
            b"0",
            "Redisson's waiters listen for 0 on {}",
            redisson_channel(name)
        );

        // Now Redisson gets it, and redlease is excluded in turn.
        assert_eq!(redisson.acquire(name, LEASE_MS), None);
        assert!(lock.try_lock().unwrap().is_none());
        assert_eq!(redisson.release(name), Some(1));
        assert_eq!(
            messages
                .recv_timeout(WAIT)
                .expect("Redisson's release message"),
            b"0"
        );
        drop(lock.try_lock().unwrap().expect("free again"));
    }
}

#[test]
fn crashed_redisson_holder_is_waited_out_by_its_lease() {
    let srv = RedisServer::start();
    let client = client(&srv);
    let mut redisson = Redisson::new(&srv);
    let name = "shared:abandoned";
    let lease = Duration::from_secs(1);
    let started = Instant::now();
    assert_eq!(redisson.acquire(name, lease.as_millis() as u64), None);
    // The Java process dies: no release, no renewal.
    let g = client.lock(name).lock().unwrap();
    let took = started.elapsed();
    assert!(took + Duration::from_millis(50) >= lease, "{took:?}");
    assert!(took < lease + Duration::from_secs(2), "{took:?}");
    eprintln!(
        "FIGURE: abandoned Redisson lock (1 s lease) taken by redlease after {:.0} ms",
        took.as_secs_f64() * 1000.0
    );
    assert_eq!(g.hold_count(), 1);
    assert_eq!(redisson.release(name), None, "Redisson no longer holds it");
    assert!(g.ensure_held().is_ok());
}
