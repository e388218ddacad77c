//! Connections: an r2d2 manager that sets timeouts and never PINGs on
//! checkout, and the runner that every Redis operation goes through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, Value};

use crate::error::{is_io_failure, is_refusal, Error, Result};
use crate::events::Events;
use crate::net::target::Target;
use crate::net::transport::{Connection, Waited};
use crate::time::{duration_ms, warn_limited};

/// A pooled connection and the pool epoch it was made in; or, when Redis
/// refused the credentials or the TLS settings, that refusal.
pub(crate) struct Conn {
    link: std::result::Result<Connection, Refusal>,
    epoch: u64,
    /// When it was last given back to the pool (or made).
    idle_since: Instant,
}

/// A connection idle this long is checked before it is handed out: a
/// server that restarted, or a master that failed over, closed it
/// meanwhile. Sent on, a request would meet the end of the stream, and one
/// that must not be sent twice (a semaphore's count, a latch's) could then
/// not be sent again, as it may have run. Connections in steady use skip
/// the check (three system calls, about a microsecond): a close within
/// this long of a connection's last use still meets the request.
const IDLE_CHECK: Duration = Duration::from_millis(10);

/// A connection attempt that Redis refused for a reason retrying will not
/// fix (credentials, permissions, certificates). The pool hands it out like
/// a connection, so that the caller waiting for one learns the reason at
/// once instead of waiting out the checkout timeout while r2d2 retries in
/// the background; it is used once and only while fresh.
struct Refusal {
    error: redis::RedisError,
    at: Instant,
}

/// How long a refusal answers checkouts before a new attempt is made.
const REFUSAL_FRESH: Duration = Duration::from_secs(1);

/// Counters the connection layer keeps (see [`crate::ClientStats`]).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) round_trips: AtomicU64,
    pub(crate) failures: AtomicU64,
    /// The client's event handler (reached by every part of the client
    /// through the counters it already shares).
    pub(crate) events: Events,
}

/// The r2d2 manager. Redis's own r2d2 glue sets no socket timeouts and PINGs
/// on every checkout; this one sets connect, read and write timeouts and
/// validates without I/O: a connection is discarded when it broke or when it
/// was made before the last connection failure seen (the pool's epoch), which
/// is how a Redis restart clears every stale pooled connection at once.
#[derive(Clone)]
pub(crate) struct Manager {
    pub(crate) target: Target,
    connect_timeout: Duration,
    response_timeout: Duration,
    epoch: Arc<AtomicU64>,
    /// When the last connection attempt failed (`None` once one succeeds).
    failed_at: Arc<parking_lot::Mutex<Option<Instant>>>,
    /// When the last dial failed (`None` once one succeeds); with
    /// `breaker`, no new dial is made within [`DIAL_BREAKER`] of it.
    dial_failed_at: Arc<parking_lot::Mutex<Option<Instant>>>,
    breaker: bool,
}

/// How long a Cluster node whose last dial failed is not dialled again: r2d2
/// retries a failed connection on and on (and each waiting checkout adds
/// one), which would dial a dead node many times a second.
const DIAL_BREAKER: Duration = Duration::from_millis(500);

#[derive(Debug)]
pub(crate) enum ManagerError {
    Redis(redis::RedisError),
    /// Made before a connection failure (or broken): discard it.
    Stale,
}

impl std::fmt::Display for ManagerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ManagerError::Redis(e) => e.fmt(f),
            ManagerError::Stale => f.write_str("connection predates a connection failure"),
        }
    }
}

impl std::error::Error for ManagerError {}

impl Manager {
    pub(crate) fn new(
        target: Target,
        connect_timeout: Duration,
        response_timeout: Duration,
        epoch: Arc<AtomicU64>,
    ) -> Manager {
        Manager {
            target,
            connect_timeout,
            response_timeout,
            epoch,
            failed_at: Arc::default(),
            dial_failed_at: Arc::default(),
            breaker: false,
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = ManagerError;

    fn connect(&self) -> Result<Conn, ManagerError> {
        // The epoch is read once the target is resolved: a resolution that
        // finds a new master bumps it, and this connection is to that master.
        if self.breaker {
            let recent = self
                .dial_failed_at
                .lock()
                .filter(|t| t.elapsed() < DIAL_BREAKER);
            if let Some(t) = recent {
                return Err(ManagerError::Redis(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "not dialled again yet",
                    format!("the last dial failed {:?} ago", t.elapsed()),
                ))));
            }
        }
        let mut epoch = 0;
        let opened = self.target.endpoint().and_then(|endpoint| {
            epoch = self.epoch.load(Ordering::Acquire);
            Connection::open(&endpoint, self.connect_timeout, self.response_timeout)
        });
        let failed = opened.is_err().then(Instant::now);
        *self.failed_at.lock() = failed;
        *self.dial_failed_at.lock() = failed;
        match opened {
            Ok(inner) => Ok(Conn {
                link: Ok(inner),
                epoch,
                idle_since: Instant::now(),
            }),
            Err(error) if is_refusal(&error) => {
                warn_limited!(
                    "connection refused",
                    "redis refused the connection: {error}"
                );
                Ok(Conn {
                    link: Err(Refusal {
                        error,
                        at: Instant::now(),
                    }),
                    epoch,
                    idle_since: Instant::now(),
                })
            }
            Err(e) => {
                self.target.suspect();
                Err(ManagerError::Redis(e))
            }
        }
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ManagerError> {
        let fresh = match &conn.link {
            Ok(c) => {
                c.is_open()
                    && conn.epoch >= self.epoch.load(Ordering::Acquire)
                    && (conn.idle_since.elapsed() < IDLE_CHECK || !c.peer_closed())
            }
            Err(r) => r.at.elapsed() < REFUSAL_FRESH,
        };
        if fresh {
            Ok(())
        } else {
            Err(ManagerError::Stale)
        }
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        // Called as it goes back to the pool.
        conn.idle_since = Instant::now();
        match &conn.link {
            Ok(c) => !c.is_open() || conn.epoch < self.epoch.load(Ordering::Acquire),
            // Used once.
            Err(_) => true,
        }
    }
}

/// The pool plus the script runner; shared by the client, its locks and the
/// watchdog.
pub(crate) struct Redis {
    /// Made on first use, so that a lazily built client opens no connection
    /// before it is used.
    pool: OnceLock<r2d2::Pool<Manager>>,
    settings: PoolSettings,
    manager: Manager,
    epoch: Arc<AtomicU64>,
    /// How long one attempt waits for a pooled connection.
    checkout_timeout: Duration,
    /// The socket timeout connections are made with.
    response_timeout: Duration,
    /// Retries after a dropped connection.
    retry_attempts: u32,
    /// The client's counters (shared by all its nodes).
    counters: Arc<Counters>,
    sync: SyncReplicas,
    /// Replicas the master reported (ROLE), or -1 before the first answer.
    replicas: std::sync::atomic::AtomicI64,
    /// When `replicas` was last read, in ms since `born` (0: never; set to 0
    /// to have it read again).
    replicas_at: AtomicU64,
    /// Set while one caller reads the replica count.
    replicas_reading: std::sync::atomic::AtomicBool,
    /// Set once a refused WAIT was logged.
    wait_refused: std::sync::atomic::AtomicBool,
    born: Instant,
    /// The thread that opens its connections (the client's, or on a
    /// cluster this node's own).
    threads: Threads,
    /// Fail at once, instead of waiting for a connection, while the last
    /// attempt to connect failed (a Cluster node: its slots may be served
    /// elsewhere by now, and the router finds out). Each checkout still
    /// has a new attempt made, and waits [`FAST_CHECKOUT`] for it.
    fail_fast: bool,
}

/// The first part of a checkout that fails fast (see [`Redis::checkout`]).
const FAST_CHECKOUT: Duration = Duration::from_millis(100);

/// The one thread (`redlease-connect`, not r2d2's default three) that opens
/// a pool's connections and runs the Sentinel master check; started with the
/// pool. A Cluster node has its own, so that a node that never answers holds
/// up only its own dials.
pub(crate) type Threads = Arc<OnceLock<Arc<scheduled_thread_pool::ScheduledThreadPool>>>;

fn connect_thread(threads: &Threads) -> Arc<scheduled_thread_pool::ScheduledThreadPool> {
    Arc::clone(threads.get_or_init(|| {
        Arc::new(
            scheduled_thread_pool::ScheduledThreadPool::builder()
                .num_threads(1)
                .thread_name_pattern("redlease-connect")
                // Exit with the pools, not after r2d2's next reaper tick.
                .on_drop_behavior(
                    scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled,
                )
                .build(),
        )
    }))
}

/// Replica sync (Redisson's `checkLockSyncedSlaves`): writes that decide lock
/// state are followed, in the same round trip, by `WAIT min timeout`, with
/// `min` capped by the replicas the master has. `min == 0` turns it off.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncReplicas {
    pub(crate) min: u32,
    pub(crate) timeout: Duration,
}

/// What replica sync said of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Synced {
    /// No WAIT was needed (off, or the master has no replica).
    NotNeeded,
    /// Enough replicas acknowledged.
    Yes,
    /// Fewer replicas than wanted acknowledged within the timeout.
    No { wanted: u32, acked: u32 },
}

/// How often the sentinels are asked whether the master moved (Redisson's
/// `scanInterval`).
const MASTER_CHECK: Duration = Duration::from_secs(1);

/// How long the master's replica count is trusted before it is read again.
const REPLICAS_FRESH: Duration = Duration::from_secs(1);

/// r2d2's settings, as the client builder took them.
#[derive(Clone, Debug)]
pub(crate) struct PoolSettings {
    pub(crate) max_size: u32,
    pub(crate) min_idle: Option<u32>,
    pub(crate) max_lifetime: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) connection_timeout: Duration,
}

impl Redis {
    pub(crate) fn new(
        target: Target,
        settings: PoolSettings,
        response_timeout: Duration,
        retry_attempts: u32,
        sync: SyncReplicas,
        counters: Arc<Counters>,
        threads: Threads,
    ) -> Redis {
        let epoch = Arc::new(AtomicU64::new(0));
        Redis {
            pool: OnceLock::new(),
            manager: Manager::new(
                target,
                settings.connection_timeout,
                response_timeout,
                Arc::clone(&epoch),
            ),
            checkout_timeout: settings.connection_timeout.min(response_timeout),
            settings,
            epoch,
            response_timeout,
            retry_attempts,
            counters,
            threads,
            sync,
            replicas: std::sync::atomic::AtomicI64::new(-1),
            replicas_at: AtomicU64::new(0),
            replicas_reading: std::sync::atomic::AtomicBool::new(false),
            wait_refused: std::sync::atomic::AtomicBool::new(false),
            born: Instant::now(),
            fail_fast: false,
        }
    }

    /// A pooled connection within `timeout`. Failing fast, the wait is cut
    /// short once an attempt to connect has failed (r2d2 would retry until
    /// the timeout): first [`FAST_CHECKOUT`], then the rest unless the
    /// attempt made meanwhile failed.
    fn checkout(&self, timeout: Duration) -> Result<r2d2::PooledConnection<Manager>> {
        if self.fail_fast && timeout > FAST_CHECKOUT {
            match self.pool().get_timeout(FAST_CHECKOUT) {
                Ok(conn) => return Ok(conn),
                Err(e) if self.unreachable() => return Err(self.no_connection(&e)),
                Err(_) => {
                    return self
                        .pool()
                        .get_timeout(timeout - FAST_CHECKOUT)
                        .map_err(|e| self.no_connection(&e))
                }
            }
        }
        self.pool()
            .get_timeout(timeout)
            .map_err(|e| self.no_connection(&e))
    }

    /// The [`Error::Pool`] of a checkout that failed with `e`: where to, and
    /// why when known (the last connection error, or a pool all in use).
    fn no_connection(&self, e: &r2d2::Error) -> Error {
        let mut msg = self.manager.target.describe();
        if self.unreachable() {
            msg.push_str(" (unreachable)");
        }
        // r2d2 says "timed out waiting for connection[: <last error>]";
        // Error::Pool's Display says the first part.
        let text = e.to_string();
        match text.strip_prefix("timed out waiting for connection") {
            Some("") => {
                let state = self.pool().state();
                if state.idle_connections == 0 && state.connections >= self.pool().max_size() {
                    msg.push_str(&format!(
                        ": all {} pooled connections in use",
                        state.connections
                    ));
                }
            }
            Some(cause) => msg.push_str(cause),
            None => {
                msg.push_str(": ");
                msg.push_str(&text);
            }
        }
        Error::Pool(msg)
    }

    /// Fails at once while the server is known unreachable (see the field).
    pub(crate) fn failing_fast(mut self) -> Redis {
        self.fail_fast = true;
        self.manager.breaker = true;
        self
    }

    /// The `WAIT` a write needs now: `min` replicas, capped by those the
    /// master has (read with ROLE, at most once a second, by one caller
    /// while the others use the last count).
    fn wait_needed(&self) -> Option<(u32, Duration)> {
        if self.sync.min == 0 {
            return None;
        }
        self.count_replicas_if_stale();
        self.wait_known()
    }

    /// Reads the master's replica count if it is older than
    /// [`REPLICAS_FRESH`], unless another caller is reading it.
    fn count_replicas_if_stale(&self) {
        if self.sync.min == 0 {
            return;
        }
        let now_ms = duration_ms(self.born.elapsed()).max(1);
        let at = self.replicas_at.load(Ordering::Acquire);
        let stale = at == 0 || now_ms.saturating_sub(at) >= duration_ms(REPLICAS_FRESH);
        if stale
            && self
                .replicas_reading
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.read_replicas();
            self.replicas_at.store(now_ms, Ordering::Release);
            self.replicas_reading.store(false, Ordering::Release);
        }
    }

    /// The `WAIT` a write needs by the replica count known now (none while
    /// the first count is being read).
    fn wait_known(&self) -> Option<(u32, Duration)> {
        if self.sync.min == 0 {
            return None;
        }
        let have = u32::try_from(self.replicas.load(Ordering::Acquire).max(0)).unwrap_or(0);
        let n = self.sync.min.min(have);
        (n > 0).then_some((n, self.sync.timeout))
    }

    fn read_replicas(&self) {
        let role = self.run(|c| redis::cmd("ROLE").query::<redis::Value>(c));
        let count = match &role {
            Ok(redis::Value::Array(items)) => match items.as_slice() {
                [redis::Value::BulkString(kind), _, redis::Value::Array(replicas), ..]
                    if kind.as_slice() == b"master" =>
                {
                    i64::try_from(replicas.len()).unwrap_or(0)
                }
                _ => 0,
            },
            Ok(_) => 0,
            Err(e) => {
                let known = self.replicas.load(Ordering::Acquire);
                if known >= 0 {
                    // A passing failure (the master may be failing over):
                    // keep the last count; a WAIT that finds fewer replicas
                    // has the count read again.
                    log::debug!("reading the master's replicas failed ({e})");
                    return;
                }
                warn_limited!(
                    "replica count",
                    "cannot read the master's replicas for replica sync ({e}); \
                     writes go without WAIT until it can (grant +role)"
                );
                0
            }
        };
        let old = self.replicas.swap(count, Ordering::AcqRel);
        if old != count && old >= 0 {
            log::info!("the master has {count} replica(s) now (was {old})");
        }
    }

    /// Like [`run`](Redis::run), for a write that decides lock state: the
    /// replica sync `WAIT` goes behind it in the same round trip (the
    /// response timeout grows by the WAIT timeout), and the result says
    /// whether enough replicas acknowledged.
    pub(crate) fn run_synced<T>(
        &self,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<(T, Synced)> {
        self.run_synced_within(self.response_timeout, op)
    }

    /// [`run_synced`](Redis::run_synced) within `budget` (at most the
    /// response timeout; the WAIT's timeout comes on top).
    pub(crate) fn run_synced_within<T>(
        &self,
        budget: Duration,
        mut op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<(T, Synced)> {
        let Some((wanted, timeout)) = self.wait_needed() else {
            return self.run_within(budget, op).map(|v| (v, Synced::NotNeeded));
        };
        let (v, acked) = self.run_with(timeout, budget, |c| {
            c.set_wait(Some((wanted, timeout)));
            let r = op(c);
            let acked = c.waited();
            c.set_wait(None);
            r.map(|v| (v, acked))
        })?;
        Ok((v, self.synced(wanted, timeout, acked)))
    }

    /// What a `WAIT wanted timeout` answered `acked` says of the write
    /// before it.
    fn synced(&self, wanted: u32, timeout: Duration, acked: Option<Waited>) -> Synced {
        let acked = match acked {
            Some(Waited::Acked(n)) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            Some(Waited::Refused(why)) => {
                // Replica sync cannot work for this user: go without it
                // (as without +role) rather than fail every lock; the count
                // is read again in a second.
                if !self.wait_refused.swap(true, Ordering::AcqRel) {
                    log::warn!(
                        "redis refused WAIT ({why}); lock writes go without replica \
                         sync (grant +wait)"
                    );
                }
                self.replicas.store(0, Ordering::Release);
                let now_ms = duration_ms(self.born.elapsed()).max(1);
                self.replicas_at.store(now_ms, Ordering::Release);
                return Synced::NotNeeded;
            }
            None => 0,
        };
        if acked >= wanted {
            return Synced::Yes;
        }
        // A replica may have gone: count them again before the next write.
        self.replicas_at.store(0, Ordering::Release);
        warn_limited!(
            "replica acks",
            "{acked} of {wanted} replica(s) acknowledged a lock write within {timeout:?}"
        );
        Synced::No { wanted, acked }
    }

    /// The first half of a [`fan_out`]: sends `packed` (`count` commands,
    /// plus the replica sync `WAIT`) on a pooled connection without waiting
    /// for the replies.
    ///
    /// Neither this nor [`receive_job`](Self::receive_job) waits for
    /// anything but the request itself and a connection (as long as `stage`
    /// allows; `None` when it gave up for a later stage): the replica count
    /// it goes by is the one known, read again after the round if stale.
    fn send_job(&self, packed: &[u8], stage: Stage) -> Result<Option<InFlight>> {
        let wait = self.wait_known();
        let mut conn = match stage {
            Stage::Idle => match self.pool().try_get() {
                Some(c) => c,
                None => return Ok(None),
            },
            // A short wait, so that one unhealthy node holds the round up by
            // little. A Cluster node (failing fast) stops there: the next
            // round finds the connection made meanwhile.
            Stage::Short => match self.pool().get_timeout(FAST_CHECKOUT) {
                Ok(c) => c,
                Err(e) if self.fail_fast || self.unreachable() => {
                    return Err(self.no_connection(&e))
                }
                Err(_) => return Ok(None),
            },
            Stage::Rest if self.unreachable() => {
                return Err(Error::Pool(format!(
                    "{} (unreachable)",
                    self.manager.target.describe()
                )))
            }
            Stage::Rest => self.checkout(self.checkout_timeout.saturating_sub(FAST_CHECKOUT))?,
        };
        let sent = match &mut conn.link {
            Ok(link) => {
                let timeouts = match wait {
                    Some((_, t)) => link.set_timeouts(self.response_timeout.saturating_add(t)),
                    None => Ok(()),
                };
                match timeouts {
                    Ok(()) => {
                        link.set_wait(wait);
                        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
                        link.send_all(packed)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Err(r) => return Err(Error::Redis(r.error.clone())),
        };
        match sent {
            Ok(()) => Ok(Some(InFlight { conn, wait })),
            Err(e) => {
                self.failed(&mut conn, &e);
                Err(Error::Redis(e))
            }
        }
    }

    /// The second half: reads the replies of what [`send_job`](Self::send_job)
    /// sent.
    fn receive_job(&self, mut job: InFlight, count: usize) -> Result<(Vec<Value>, Synced)> {
        let (received, waited) = match &mut job.conn.link {
            Ok(link) => {
                let r = link.receive_all(count);
                let waited = link.waited();
                link.set_wait(None);
                if job.wait.is_some() && link.set_timeouts(self.response_timeout).is_err() {
                    self.mark_failure(&mut job.conn);
                }
                (r, waited)
            }
            Err(r) => return Err(Error::Redis(r.error.clone())),
        };
        match received {
            Ok(values) => {
                self.answered();
                let moved = values.iter().any(|v| {
                    matches!(v, Value::ServerError(e) if matches!(e.code(), "READONLY" | "MASTERDOWN"))
                });
                if moved {
                    self.manager.target.suspect();
                    self.mark_failure(&mut job.conn);
                }
                let synced = match job.wait {
                    Some((wanted, timeout)) => self.synced(wanted, timeout, waited),
                    None => Synced::NotNeeded,
                };
                Ok((values, synced))
            }
            Err(e) => {
                self.failed(&mut job.conn, &e);
                Err(Error::Redis(e))
            }
        }
    }

    /// A request on `conn` failed with `e`: a connection failure discards
    /// it and everything pooled before it, and has the target looked up
    /// again.
    fn failed(&self, conn: &mut r2d2::PooledConnection<Manager>, e: &redis::RedisError) {
        if is_connection_failure(e) {
            self.manager.target.suspect();
            self.mark_failure(conn);
        }
    }

    /// The pool's epoch: bumping it discards every pooled connection made
    /// before (the master moved).
    pub(crate) fn epoch(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.epoch)
    }

    fn pool(&self) -> &r2d2::Pool<Manager> {
        self.pool.get_or_init(|| {
            let s = &self.settings;
            let threads = connect_thread(&self.threads);
            if let Target::Sentinel(sentinel) = &self.manager.target {
                let sentinel = Arc::downgrade(sentinel);
                threads.execute_at_fixed_rate(MASTER_CHECK, MASTER_CHECK, move || {
                    if let Some(s) = sentinel.upgrade() {
                        s.check();
                    }
                });
            }
            r2d2::Pool::builder()
                .max_size(s.max_size)
                .min_idle(s.min_idle)
                .max_lifetime(s.max_lifetime)
                .idle_timeout(s.idle_timeout)
                .connection_timeout(s.connection_timeout)
                .test_on_check_out(true)
                .error_handler(Box::new(WarnOnError))
                .thread_pool(threads)
                .build_unchecked(self.manager.clone())
        })
    }

    /// Waits (up to the connection timeout) for a connection to Redis, to
    /// report at once whether the settings work.
    pub(crate) fn check(&self) -> Result<()> {
        let budget = self
            .manager
            .target
            .connect_budget(self.settings.connection_timeout);
        let conn = self
            .pool()
            .get_timeout(budget)
            .map_err(|e| self.no_connection(&e))?;
        match &conn.link {
            Ok(_) => {}
            Err(r) => return Err(Error::Redis(r.error.clone())),
        }
        drop(conn);
        if self.sync.min > 0 {
            // Count the replicas now, so that the first writes already wait
            // for them.
            self.read_replicas();
            let now_ms = duration_ms(self.born.elapsed()).max(1);
            self.replicas_at.store(now_ms, Ordering::Release);
        }
        Ok(())
    }

    /// The server answered a request: it is reachable.
    fn answered(&self) {
        if self.fail_fast {
            *self.manager.failed_at.lock() = None;
        }
    }

    /// `true` while the last attempt to connect failed, or a request failed
    /// on its connection (failing fast), and nothing has succeeded since.
    pub(crate) fn unreachable(&self) -> bool {
        self.manager.failed_at.lock().is_some()
    }

    /// Where connections go.
    pub(crate) fn target(&self) -> &Target {
        &self.manager.target
    }

    /// Runs `op` on a pooled connection, one round trip as far as `op` goes.
    ///
    /// A connection failure marks every pooled connection made before it as
    /// stale. If the connection turned out dropped (Redis restarted, the link
    /// was cut), `op` is run again on a new connection, up to
    /// `retry_attempts` times, all within one response timeout of the first
    /// attempt (each retry's checkout and socket timeouts are cut to what is
    /// left): every operation of redlease is safe to repeat (see the
    /// scripts), or is sent at most once ([`send_once`]: the counters of the
    /// semaphores and the latch). Timeouts are not retried, and waiting for a pooled connection
    /// is bounded by the smaller of the connection and response timeouts, so
    /// a stalled server (which accepts connections but never answers) holds a
    /// call for about one response timeout.
    ///
    /// If an attempt may have run and a later one fails, the first such
    /// attempt's error is returned, so that [`Error::maybe_applied`] holds.
    pub(crate) fn run<T>(
        &self,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.run_within(self.response_timeout, op)
    }

    /// [`run`](Redis::run) within `budget` instead of a response timeout
    /// (never more): a resend of the router's that gets what is left of
    /// the caller's.
    pub(crate) fn run_within<T>(
        &self,
        budget: Duration,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.run_with(Duration::ZERO, budget, op)
    }

    /// [`run`](Redis::run) within `budget`, with `extra` time for Redis to
    /// answer (a WAIT's).
    fn run_with<T>(
        &self,
        extra: Duration,
        budget: Duration,
        mut op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut first_failure: Option<redis::RedisError> = None;
        let mut retries = 0;
        let started = Instant::now();
        let budget = budget.min(self.response_timeout);
        let deadline = started.checked_add(budget);
        loop {
            let left = match (retries, deadline) {
                (0, _) | (_, None) => budget,
                (_, Some(d)) => d.saturating_duration_since(Instant::now()),
            };
            if left.is_zero() {
                return Err(Error::Redis(first_failure.unwrap_or_else(|| {
                    (redis::ErrorKind::Io, "retries ran out of time").into()
                })));
            }
            let mut conn = match self.checkout(self.checkout_timeout.min(left)) {
                Ok(conn) => conn,
                Err(e) => return Err(first_failure.map_or_else(|| e, Error::Redis)),
            };
            let link = match &mut conn.link {
                Ok(link) => link,
                // Nothing was sent on this attempt: an earlier one that may
                // have run still decides what the caller is told.
                Err(r) => return Err(Error::Redis(first_failure.unwrap_or(r.error.clone()))),
            };
            let changed = left < self.response_timeout || !extra.is_zero();
            if changed && link.set_timeouts(left.saturating_add(extra)).is_err() {
                self.mark_failure(&mut conn);
                continue;
            }
            self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let result = op(link);
            if changed && link.set_timeouts(self.response_timeout).is_err() {
                self.mark_failure(&mut conn);
            }
            match result {
                Ok(v) => {
                    self.answered();
                    return Ok(v);
                }
                Err(e) => {
                    if matches!(e.code(), Some("READONLY" | "MASTERDOWN")) {
                        // Talking to a replica, or a master cut off from its
                        // group: find the master again, and drop what we
                        // have.
                        self.manager.target.suspect();
                        self.mark_failure(&mut conn);
                    }
                    if is_connection_failure(&e) {
                        self.manager.target.suspect();
                        self.mark_failure(&mut conn);
                        if retries < self.retry_attempts
                            && e.is_connection_dropped()
                            && !e.is_timeout()
                        {
                            log::debug!("redis connection dropped ({e}); retrying on a new one");
                            retries += 1;
                            if first_failure.is_none() {
                                first_failure = Some(e);
                            }
                            continue;
                        }
                    }
                    return Err(Error::Redis(match first_failure {
                        Some(first) if !is_io_failure(&e) => first,
                        _ => e,
                    }));
                }
            }
        }
    }

    fn mark_failure(&self, conn: &mut r2d2::PooledConnection<Manager>) {
        // Everything made up to now is suspect (this connection too: a
        // timed-out one may still get the late reply); connections made after
        // this point carry the new epoch.
        let old = self.epoch.fetch_max(conn.epoch + 1, Ordering::AcqRel);
        if old <= conn.epoch {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
        }
        if self.fail_fast {
            // Until a new connection proves it answers (a stalled server
            // accepts connections but never answers them), requests fail
            // fast rather than each wait for a connection: see `checkout`.
            *self.manager.failed_at.lock() = Some(Instant::now());
        }
    }
}

/// The connection can no longer be trusted (it may even get a late reply).
pub(crate) fn is_connection_failure(e: &redis::RedisError) -> bool {
    is_io_failure(e) || e.is_unrecoverable_error()
}

/// Logs the pool's failures to connect at `warn` (r2d2's default is `error`):
/// the pool keeps retrying, and calls report their own errors.
#[derive(Debug)]
pub(crate) struct WarnOnError;

impl r2d2::HandleError<ManagerError> for WarnOnError {
    fn handle_error(&self, error: ManagerError) {
        match error {
            // A pooled connection found closed or outdated at check-out
            // (the server restarted, timed it out, a failover): replaced,
            // nothing failed.
            ManagerError::Stale => log::debug!("replacing a pooled connection: {error}"),
            _ => warn_limited!("connect", "cannot connect to redis: {error}"),
        }
    }
}

/// How a [`fan_out`] job gets its connection, stage by stage.
#[derive(Clone, Copy)]
enum Stage {
    /// An idle pooled connection, or none.
    Idle,
    /// Up to [`FAST_CHECKOUT`].
    Short,
    /// The rest of the checkout timeout, unless the server is known
    /// unreachable.
    Rest,
}

/// A request sent by [`Redis::send_job`] whose replies are still to be read.
struct InFlight {
    conn: r2d2::PooledConnection<Manager>,
    wait: Option<(u32, Duration)>,
}

/// What a [`fan_out`] job got: its replies (error replies as values) and
/// what replica sync said.
pub(crate) type Replies = Result<(Vec<Value>, Synced)>;

/// One node's share of a [`fan_out`]: a packed pipeline of `count` commands.
pub(crate) struct Job<'a> {
    pub(crate) redis: &'a Redis,
    pub(crate) packed: Vec<u8>,
    pub(crate) count: usize,
}

/// Sends every job's pipeline, each on a pooled connection of its node (with
/// the node's replica sync `WAIT` behind it), before reading any reply: the
/// whole costs about one round trip of the slowest node, and a slow or dead
/// node does not hold back what the others do. Returns, per job, its replies
/// (error replies as values) and what replica sync said; a failed job is not
/// retried here. Each job's wait for its replies is bounded by its own
/// connection's timeouts, which all started running at about the same time.
pub(crate) fn fan_out(jobs: &[Job<'_>]) -> Vec<Replies> {
    // Nodes with an idle connection first: a node that is down (no valid
    // connection, new ones refused or hanging) costs its checkout timeout
    // only after the others' requests are out.
    // Then a short wait each for a connection, then the rest of the
    // checkout budget for servers not known to be unreachable.
    let mut sent: Vec<Option<Result<InFlight>>> = jobs.iter().map(|_| None).collect();
    for stage in [Stage::Idle, Stage::Short, Stage::Rest] {
        for (job, s) in jobs.iter().zip(sent.iter_mut()) {
            if s.is_none() {
                *s = job.redis.send_job(&job.packed, stage).transpose();
            }
        }
    }
    let results: Vec<_> = jobs
        .iter()
        .zip(sent)
        .map(|(job, sent)| match sent {
            Some(sent) => sent.and_then(|f| job.redis.receive_job(f, job.count)),
            None => Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no connection",
            )))),
        })
        .collect();
    // Replica counts that went stale are read now, after this round, on
    // the nodes that answered (one that did not would only hold the caller
    // up).
    for (job, result) in jobs.iter().zip(&results) {
        if result.is_ok() {
            job.redis.count_replicas_if_stale();
        }
    }
    results
}

/// `op`, not sent again once a copy may have run: after a failure on the
/// connection (no reply) a resend on a new connection is refused (the
/// caller is told of the first failure); a resend after a redirection
/// (`MOVED`, `ASK`: it did not run) goes ahead. For the scripts that are not
/// idempotent (the semaphores' counting scripts, the latch's).
pub(crate) fn send_once<T>(
    mut op: impl FnMut(&mut crate::net::transport::Connection) -> redis::RedisResult<T>,
) -> impl FnMut(&mut crate::net::transport::Connection) -> redis::RedisResult<T> {
    let mut may_have_run = false;
    move |conn| {
        if may_have_run {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "not sent again: the first copy may have run",
            )));
        }
        let result = op(conn);
        if let Err(e) = &result {
            may_have_run = crate::error::is_io_failure(e);
        }
        result
    }
}
