//! The client: configuration, the connection pool, the client id and the
//! background threads.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::shared::{check_lease, check_max_hold, Shared};
use crate::engine::watchdog::{LostCallback, MIN_RENEW_INTERVAL};
use crate::error::{Error, Result};
use crate::events::{Events, HandleEvent};
use crate::kinds::expirable::ExpirableSemaphore;
use crate::kinds::fair::FairLock;
use crate::kinds::inspect::Inspection;
use crate::kinds::latch::CountDownLatch;
use crate::kinds::lock::Lock;
use crate::kinds::rwlock::ReadWriteLock;
use crate::kinds::semaphore::Semaphore;
use crate::net::cluster::PubSubMode;
use crate::net::pool::{PoolSettings, SyncReplicas};
use crate::net::router::Router;
use crate::net::setup::{
    self, connection_infos, describe, ClusterSettings, SentinelSettings, Servers, Settings,
};
use crate::net::transport::TlsOptions;

/// The longest client name accepted ([`ClientBuilder::name`]).
const MAX_NAME_BYTES: usize = 256;

/// The longest `connection_timeout` or `response_timeout` accepted.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A handle on a Redis server for taking locks.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync`: share one per process.
/// Each `Client` has its own id (the `<client-uuid>` of the owner field), its
/// own connection pool, one watchdog thread (started with the first watched
/// lock) and one subscriber thread (started with the first wait). They stop
/// when the last clone and the last guard are gone.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// let client = redlease::Client::open("redis://127.0.0.1:6379/")?;
/// let guard = client.lock("orders:42").lock()?;
/// // ... the lock is held, and renewed, until the guard is dropped
/// drop(guard);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
}

impl Client {
    /// Connects with default settings, and returns once a connection to
    /// Redis works (or fails at once with why it does not): unlike
    /// `redis::Client::open`, which connects nothing. A service that must
    /// start while Redis is down uses
    /// [`Client::builder(url).build_lazy()`](ClientBuilder::build_lazy)
    /// instead. See [`ClientBuilder`] for the settings.
    ///
    /// # Errors
    ///
    /// As for [`ClientBuilder::build`].
    pub fn open(info: impl redis::IntoConnectionInfo) -> Result<Client> {
        Client::builder(info).build()
    }

    /// Starts configuring a client for one Redis server. `info` is what
    /// redis-rs takes: a url (`redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://...` for TLS, `rediss://...#insecure` to skip certificate
    /// checks, `redis+unix:///path`) as `&str` or `String`, or a
    /// [`redis::ConnectionInfo`]. The username, password and database apply
    /// to every connection the client opens, the subscriber's included.
    pub fn builder(info: impl redis::IntoConnectionInfo) -> ClientBuilder {
        ClientBuilder::new(info.into_connection_info())
    }

    /// Starts configuring a client for the master of a Sentinel group:
    /// `sentinels` are the sentinels' addresses (urls or
    /// [`redis::ConnectionInfo`]s, each with its own credentials;
    /// `rediss://` sentinels mean TLS to the data nodes too; at least one,
    /// three or more in production), `master_name` the name they monitor
    /// (not empty). Credentials for the data nodes are set with
    /// [`ClientBuilder::master_auth`].
    ///
    /// The client finds the master through any reachable sentinel, checks
    /// it with `ROLE`, and follows failovers: after a connection failure,
    /// `READONLY` or `MASTERDOWN`, and once a second against the sentinels,
    /// it finds the master again; connections to the old one are dropped,
    /// waiters are woken to retry on the new one, the watchdog renews there,
    /// and `lock()` keeps waiting through the failover.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// let client = redlease::Client::sentinel_builder(
    ///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    ///     "mymaster",
    /// )
    /// .master_auth(Some("locker"), "secret")
    /// .build()?;
    /// let guard = client.lock("orders:42").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_builder<I>(sentinels: I, master_name: &str) -> ClientBuilder
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        let mut b = ClientBuilder::without_url("no sentinel given");
        b.servers.sentinel = Some(SentinelSettings {
            sentinels: connection_infos(sentinels),
            master_name: master_name.to_owned(),
            username: None,
            password: None,
            db: 0,
        });
        b
    }

    /// Starts configuring a client for a Redis Cluster: `seeds` are some of
    /// its nodes (urls or [`redis::ConnectionInfo`]s; the first one's
    /// credentials and TLS apply to every node; `rediss://` means TLS to all
    /// nodes; at least one, several in case one is down; database 0 only).
    /// Every [`ClientBuilder`] setting applies, per node where it concerns
    /// connections (pool size, timeouts, replica sync).
    ///
    /// The client reads the slot map from any seed that answers, sends each
    /// lock operation to the master of its lock's slot (a lock's keys and
    /// channel share one slot: Redisson's hash-tag layout), follows `MOVED`
    /// and `ASK` redirections, and reads the map again after a redirection
    /// or a node failure, never per call. The watchdog renews all locks of a
    /// master in one round trip, all masters at once. Waiters use sharded
    /// pub/sub (`SSUBSCRIBE`) on Redis 7 as Redisson does, with one
    /// subscriber connection per master that has waited-on locks; see
    /// [`ClientBuilder::classic_pubsub`] for Redis 6.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// let client = redlease::Client::cluster_builder([
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    ///     "redis://10.0.0.3:7000/",
    /// ])
    /// .build()?;
    /// let guard = client.lock("orders:42").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster_builder<I>(seeds: I) -> ClientBuilder
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        let mut b = ClientBuilder::without_url("no cluster node given");
        b.servers.cluster = Some(ClusterSettings {
            seeds: connection_infos(seeds),
            pubsub: PubSubMode::Auto,
        });
        b
    }

    /// A handle on the count-down latch named `name` (Redisson's
    /// `RCountDownLatch` layout). Cheap and infallible: the name is checked
    /// when the latch is used.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let latch = client.count_down_latch("batch-7");
    /// latch.try_set_count(2)?;
    /// # Ok(()) }
    /// ```
    pub fn count_down_latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::new(Arc::clone(&self.shared), name.into())
    }

    /// A handle on the fair lock named `name` (Redisson's `RFairLock`
    /// layout): waiters get it in the order they came. Cheap and
    /// infallible: the name is checked when it is used.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fair_lock("ledger").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(Arc::clone(&self.shared), name.into())
    }

    /// A handle on the read-write lock named `name` (Redisson's
    /// `RReadWriteLock` layout): any number of readers, or one writer.
    /// Cheap and infallible: the name is checked when it is used.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let rw = client.read_write_lock("catalog");
    /// let reading = rw.read_lock().lock()?;
    /// # Ok(()) }
    /// ```
    pub fn read_write_lock(&self, name: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock::new(Arc::clone(&self.shared), name.into())
    }

    /// A handle on the semaphore named `name` (Redisson's `RSemaphore`
    /// layout). Cheap and infallible: the name is checked when it is used.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let s = client.semaphore("uploads");
    /// s.try_set_permits(3)?;
    /// let permit = s.acquire(1)?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore::new(Arc::clone(&self.shared), name.into())
    }

    /// A handle on the permit-expirable semaphore named `name` (Redisson's
    /// `RPermitExpirableSemaphore` layout): every permit has a lease, and
    /// comes back when it runs out. Cheap and infallible.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::Duration;
    /// let s = client.permit_expirable_semaphore("render-slots");
    /// s.try_set_permits(4)?;
    /// let permit = s.acquire(Duration::from_secs(60))?;
    /// # Ok(()) }
    /// ```
    pub fn permit_expirable_semaphore(&self, name: impl Into<String>) -> ExpirableSemaphore {
        ExpirableSemaphore::new(Arc::clone(&self.shared), name.into())
    }

    /// A handle on the fenced lock named `name` (Redisson's `RFencedLock`):
    /// a [`Lock`] whose every acquisition, re-entries included, also takes a
    /// new fencing token from `redisson_lock_token:{<name>}` (an integer that
    /// only grows and never expires), given by
    /// [`LockGuard::token`](crate::LockGuard::token). The
    /// lock itself is the reentrant lock: plain locks of the same name
    /// exclude it and are excluded by it, but take no token.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("ledger").lock()?;
    /// assert!(guard.token().is_some());
    /// # Ok(()) }
    /// ```
    pub fn fenced_lock(&self, name: impl Into<String>) -> Lock {
        Lock::fenced(Arc::clone(&self.shared), name.into())
    }

    /// A handle on the lock named `name` (any UTF-8, including braces,
    /// newlines and NUL). Cheap and infallible: the name is checked when the
    /// lock is used.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(Arc::clone(&self.shared), name.into())
    }

    /// This client's id, the `<client-uuid>` part of the owner field it
    /// writes into lock hashes.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.shared.uuid
    }

    /// What the keys of `name` tell of it: its kind (lock, fenced, fair,
    /// read-write, semaphore, expirable semaphore, counter), its holders
    /// with their processes, a fair lock's line, the key's lease, a
    /// counter's value, and the processes waiting for it. Read only; a
    /// few round trips. What the `redlease inspect` command prints.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let found = client.inspect("orders:42")?;
    /// println!("{}: {} holder(s)", found.kind.as_str(), found.holders.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name; a Redis or pool error.
    pub fn inspect(&self, name: &str) -> Result<Inspection> {
        crate::engine::shared::check_name("object", name, &self.shared.router)?;
        crate::kinds::inspect::inspect(&self.shared, name)
    }

    /// The locks, semaphores and counters whose name matches the glob
    /// `pattern` (Redis's `MATCH`: `*`, `?`, `[..]`), each inspected (see
    /// [`inspect`](Client::inspect)), in name order. Found with `SCAN` on
    /// every master, never `KEYS`; it reads every matching key, so give a
    /// pattern on a large database. Keys that are parts of an object (a
    /// fair lock's line, a token, redlease's records) are not listed
    /// apart. A name whose parts cannot be read as its kind's (a key of
    /// the wrong type where a part belongs) is left out, with a `warn` log
    /// line; [`inspect`](Client::inspect) on it returns the error.
    ///
    /// # Errors
    ///
    /// A Redis or pool error.
    pub fn list(&self, pattern: &str) -> Result<Vec<Inspection>> {
        crate::kinds::inspect::list(&self.shared, pattern)
    }

    /// The lease of locks taken without an explicit one.
    #[must_use]
    pub fn watchdog_timeout(&self) -> Duration {
        self.shared.watchdog_timeout
    }

    /// A snapshot of this client's counters.
    #[must_use]
    pub fn stats(&self) -> ClientStats {
        let s = &self.shared;
        let wd = s.watchdog.counters();
        let nodes = s.router.nodes();
        let counters = s.router.counters();
        ClientStats {
            round_trips: counters.round_trips.load(Ordering::Relaxed),
            connection_failures: counters.failures.load(Ordering::Relaxed),
            renewal_batches: wd.batches.load(Ordering::Relaxed),
            renewal_round_trips: wd.round_trips.load(Ordering::Relaxed),
            renewals: wd.renewals.load(Ordering::Relaxed),
            locks_lost: wd.lost.load(Ordering::Relaxed),
            watchdog_entries: s.watchdog.scheduled(),
            subscribed_channels: nodes.iter().map(|n| n.pubsub.channels()).sum(),
            subscriber_reconnects: nodes.iter().map(|n| n.pubsub.reconnects()).sum(),
            unsettled_requests: wd.unsettled.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.shared.uuid)
            .field("server", &self.shared.server)
            .field("watchdog_timeout", &self.shared.watchdog_timeout)
            .finish_non_exhaustive()
    }
}

/// Counters of one [`Client`], for metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Round trips to Redis made by lock operations, queries and the
    /// watchdog (a retry after a dropped connection counts again).
    pub round_trips: u64,
    /// Connection failures seen (each discards the pooled connections).
    pub connection_failures: u64,
    /// Times the watchdog woke up to renew leases (it renews everything due
    /// at once).
    pub renewal_batches: u64,
    /// Round trips the watchdog made: one per node per wake-up (one Redis:
    /// one per wake-up; a cluster: one per master with leases due), plus one
    /// per node after Redis lost its script cache, and one per script a slot
    /// migration redirected.
    pub renewal_round_trips: u64,
    /// Leases the watchdog renewed.
    pub renewals: u64,
    /// Held locks found lost (see [`ClientBuilder::on_lock_lost`]).
    pub locks_lost: u64,
    /// Locks the watchdog is renewing.
    pub watchdog_entries: usize,
    /// Channels with at least one waiter in this process (release channels
    /// of every kind, a reentrant lock's wake-up channel of this process, a
    /// fair lock's waiters' own channels, semaphore and latch channels): a
    /// waiter of a reentrant lock subscribes to two.
    pub subscribed_channels: usize,
    /// Times the subscriber connection was re-established.
    pub subscriber_reconnects: u64,
    /// Requests whose reply was lost (or that Redis refused for a passing
    /// reason) that the watchdog thread has not settled yet: acquisitions
    /// to undo, releases to complete, semaphore permits to return, fair lock
    /// places to leave; also, for a moment, a reentrant lock's queue that
    /// this process leaves after its last waiter gave up. Usually 0.
    ///
    /// When the last `Client` handle (and guard) is dropped, those that
    /// return semaphore permits are still tried in the background, for up
    /// to 15 minutes, while the process runs (a plain semaphore's permits
    /// have no lease: a program that exits with one pending leaves its
    /// permits out); the rest are left to their lease. A program about to
    /// exit can wait until this is 0.
    pub unsettled_requests: u64,
}

/// Configures a [`Client`]; by value, like r2d2's builder.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// use std::time::Duration;
/// let client = redlease::Client::builder("redis://127.0.0.1:6379/")
///     .pool_size(16)
///     .connection_timeout(Duration::from_secs(2))
///     .watchdog_timeout(Duration::from_secs(30))
///     .on_lock_lost(|name: &str| log::error!("lost {name}"))
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until build() is called"]
pub struct ClientBuilder {
    servers: Servers,
    tls: TlsOptions,
    pool_size: u32,
    min_idle: Option<u32>,
    max_lifetime: Option<Duration>,
    idle_timeout: Option<Duration>,
    connection_timeout: Duration,
    response_timeout: Duration,
    watchdog_timeout: Duration,
    max_hold: Option<Duration>,
    retry_attempts: u32,
    sync: SyncReplicas,
    on_lock_lost: Option<LostCallback>,
    name: Option<String>,
    event_handler: Option<Arc<dyn HandleEvent>>,
}

/// The most `retry_attempts` accepted.
const MAX_RETRY_ATTEMPTS: u32 = 100;

impl ClientBuilder {
    /// A builder for servers found through others (sentinels, cluster
    /// seeds): no url of its own.
    fn without_url(why: &'static str) -> ClientBuilder {
        ClientBuilder::new(Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            why,
        ))))
    }

    fn new(info: redis::RedisResult<redis::ConnectionInfo>) -> ClientBuilder {
        ClientBuilder {
            servers: Servers {
                info,
                sentinel: None,
                cluster: None,
            },
            tls: TlsOptions::default(),
            pool_size: 16,
            min_idle: Some(1),
            max_lifetime: Some(Duration::from_secs(30 * 60)),
            idle_timeout: Some(Duration::from_secs(10 * 60)),
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            watchdog_timeout: Duration::from_secs(30),
            max_hold: None,
            retry_attempts: 3,
            sync: SyncReplicas {
                min: 1,
                timeout: Duration::from_secs(1),
            },
            on_lock_lost: None,
            name: None,
            event_handler: None,
        }
    }

    /// For a [`Client::cluster_builder`]: use classic `PUBLISH`/`SUBSCRIBE`
    /// for lock channels instead of sharded pub/sub. Needed where Redisson
    /// clients on the same cluster use classic pub/sub
    /// (`subscriptionMode`/`shardedSubscriptionMode` off), so that each side
    /// hears the other's releases. On Redis 6, which has no sharded pub/sub,
    /// classic is chosen by itself (found with `PUBSUB SHARDNUMSUB`, as
    /// Redisson does). Classic messages are broadcast to every node of the
    /// cluster; sharded ones stay within the slot's shard.
    pub fn classic_pubsub(mut self, classic: bool) -> Self {
        if let Some(c) = &mut self.servers.cluster {
            c.pubsub = if classic {
                PubSubMode::Classic
            } else {
                PubSubMode::Auto
            };
        }
        self
    }

    /// For a [`Client::sentinel_builder`]: the username (ACL) and password
    /// of the data nodes (master and replicas). Defaults to none. Has no
    /// effect on a client for one server (its url carries them).
    pub fn master_auth(mut self, username: Option<&str>, password: &str) -> Self {
        if let Some(s) = &mut self.servers.sentinel {
            s.username = username.map(str::to_owned);
            s.password = Some(password.to_owned());
        }
        self
    }

    /// For a [`Client::sentinel_builder`]: the database number on the data
    /// nodes, 0 or more (a negative one fails `build()`). Defaults to 0.
    pub fn master_db(mut self, db: i64) -> Self {
        if let Some(s) = &mut self.servers.sentinel {
            s.db = db;
        }
        self
    }

    /// Replica sync, as Redisson's `checkLockSyncedSlaves`: every write that
    /// decides a lock's state (acquire, release, a renewal batch, the
    /// settling of a lost reply, force-unlock), and a semaphore's or a
    /// latch's count (permits taken, returned, set or added; a count-down),
    /// is followed in the same round trip by `WAIT min_replicas timeout`, so
    /// that the lock survives a failover of its master to a replica. A
    /// release or a count fewer replicas confirmed is still done on the
    /// master and reported done. The requirement is capped by the
    /// replicas the master has at that moment (read with `ROLE`, at most once
    /// a second): a master with no replica takes writes without WAIT. An
    /// acquisition fewer replicas confirmed is undone and retried (up to
    /// [`retry_attempts`](ClientBuilder::retry_attempts)), then fails with
    /// [`Error::ReplicaSync`]; an unconfirmed renewal counts as a failed
    /// renewal. `WAIT` is not consensus: a failover can still lose a lock
    /// whose replica acknowledged, or promote one that did not (see
    /// [`guide::guarantees`](crate::guide::guarantees)). `min_replicas` 0
    /// turns it off; otherwise `timeout` must be 1 ms to 24 h (a `WAIT`
    /// without a timeout would block forever), or [`build`](Self::build) fails with
    /// [`Error::InvalidArgument`]. Defaults to 1 replica within 1 s whenever
    /// the master has replicas.
    pub fn sync_replicas(mut self, min_replicas: u32, timeout: Duration) -> Self {
        self.sync = SyncReplicas {
            min: min_replicas,
            timeout,
        };
        self
    }

    /// Trusts the CA certificate(s) in `ca_pem` (PEM; a bundle may hold
    /// several) for `rediss://` servers, instead of the system's roots.
    /// Defaults to the system's roots.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_certificate = Some(ca_pem.into());
        self
    }

    /// Presents this client certificate (PEM, the chain leaf first) and
    /// private key (PEM: PKCS#8, PKCS#1 or SEC1) to `rediss://` servers that
    /// ask for one (mutual TLS, `tls-auth-clients yes`). Defaults to none.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// How many times a request is sent again when its connection turned
    /// out dropped (Redis restarted, the link was cut, a pooled connection
    /// had gone stale), each time on a new connection and all within one
    /// response timeout of the first attempt. Every request of redlease is
    /// safe to repeat: a repeat never applies an acquisition or a release
    /// twice (hold counts are written absolutely, releases carry a latch).
    /// Timeouts are not retried (the request may still be running); a
    /// request that may have run and could not be confirmed is settled in
    /// the background. 0 turns retries off. Defaults to 3, like Redisson's
    /// `retryAttempts`.
    pub fn retry_attempts(mut self, attempts: u32) -> Self {
        self.retry_attempts = attempts;
        self
    }

    /// The most connections kept to Redis for lock operations (the
    /// subscriber has one more of its own). Defaults to 16.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How many idle connections the pool keeps open (r2d2's `min_idle`;
    /// `None`: as many as `pool_size`). Defaults to 1.
    pub fn min_idle(mut self, min_idle: Option<u32>) -> Self {
        self.min_idle = min_idle;
        self
    }

    /// Closes pooled connections this old when they are next idle (r2d2's
    /// `max_lifetime`; `None`: never). Defaults to 30 minutes.
    pub fn max_lifetime(mut self, max_lifetime: Option<Duration>) -> Self {
        self.max_lifetime = max_lifetime;
        self
    }

    /// Closes pooled connections idle this long, down to `min_idle` (r2d2's
    /// `idle_timeout`; `None`: never). Defaults to 10 minutes.
    pub fn idle_timeout(mut self, idle_timeout: Option<Duration>) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    /// How long to wait to open a connection (TCP connect and handshake);
    /// `build()` fails after it when Redis is unreachable. A call waits for a
    /// pooled connection at most this or the response timeout, whichever is
    /// shorter. Defaults to 2 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long to wait for Redis to answer a command (the socket read and
    /// write timeout), so that a stalled server cannot hang a call. Defaults
    /// to 2 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The lease of locks taken without an explicit one; the watchdog renews
    /// them every third of it (or per [`Lock::with_renew_interval`]).
    /// Defaults to 30 s, like Redisson's `lockWatchdogTimeout`.
    ///
    /// On Sentinel and Cluster it is also how long any wait without a
    /// deadline (`lock()`, a semaphore's `acquire()`, a latch's `wait()`)
    /// rides out a failover at least, from its first failed try: a holder
    /// keeps its lock through an outage that long, so a failover shorter
    /// than it loses neither the lock nor the wait. Past it, the wait fails
    /// with the last error. Keep it above the time a failover takes: with
    /// Sentinel's default `down-after-milliseconds` (30 s) a failover takes
    /// longer than the default 30 s, and both held locks and waits end
    /// before it does (lower `down-after-milliseconds`, or raise this).
    pub fn watchdog_timeout(mut self, lease: Duration) -> Self {
        self.watchdog_timeout = lease;
        self
    }

    /// The longest any lock of this client may be held (default: none, the
    /// watchdog renews a lock for as long as its guard lives). Past it, the
    /// watchdog stops renewing the hold: its lease runs out at that moment
    /// (each renewal extends it at most up to the cap), the guard reports
    /// it lost and [`on_lock_lost`](Self::on_lock_lost) is called, as for
    /// any lost lock. A stuck holder then frees the lock instead of keeping
    /// it forever. Counted from the hold's first acquisition (re-entries do
    /// not restart it, and a re-entry through a lock with another cap
    /// changes nothing); every request of the holder, renewals, re-entries
    /// and partial releases alike, sets a lease that ends at the cap at the
    /// latest (as its sender counts: Redis may keep the key for as long as
    /// that request took to arrive). A fixed lease longer than the cap is
    /// refused with [`Error::InvalidArgument`], and a cap outside 1 ms to
    /// [`MAX_LEASE`](crate::MAX_LEASE) makes [`build`](Self::build) fail
    /// with it. One lock can set its own with
    /// [`Lock::with_max_hold`](crate::Lock::with_max_hold).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// use std::time::Duration;
    /// let client = redlease::Client::builder("redis://127.0.0.1/")
    ///     .max_hold(Duration::from_secs(300)) // no job holds a lock longer
    ///     .on_lock_lost(|name: &str| log::error!("{name}: lost or held too long"))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The application's name, published with the host name and process id
    /// in this client's process key, so that whoever lists a lock's holders
    /// ([`Lock::holders`](crate::Lock::holders), the `redlease` command)
    /// sees which service holds it. Defaults to none (host and process id
    /// only). At most 256 bytes ([`build`](Self::build) fails with
    /// [`Error::InvalidArgument`] otherwise).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// let client = redlease::Client::builder("redis://127.0.0.1/")
    ///     .name("billing-worker")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Calls `handler` for each acquisition, release, lost lease, renewal
    /// batch, failover followed and subscriber reconnect (see
    /// [`HandleEvent`]; with the `metrics` feature,
    /// `MetricsHandler` records them with the
    /// `metrics` crate). Defaults to none: then nothing is measured.
    pub fn event_handler(mut self, handler: impl HandleEvent) -> Self {
        self.event_handler = Some(Arc::new(handler));
        self
    }

    /// Called with the lock's name when a held lock is found lost: by the
    /// watchdog (deleted, expired, or not renewable before its lease ran out)
    /// or by its owner thread taking it again. Runs outside any lock of
    /// redlease, under `catch_unwind`, mostly on the watchdog thread; keep it
    /// short, and do not capture the `Client` in it (that would keep the
    /// client's threads alive forever). Defaults to none (the loss is logged
    /// at `error` either way).
    pub fn on_lock_lost<F>(mut self, callback: F) -> Self
    where
        F: Fn(&str) + Send + Sync + 'static,
    {
        self.on_lock_lost = Some(Arc::new(callback));
        self
    }

    /// Checks the settings and connects: returns once a connection to
    /// Redis works.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] or [`Error::InvalidArgument`] for bad settings;
    /// an [`Error::is_auth`] error at once if Redis refuses the credentials;
    /// [`Error::Pool`] if Redis cannot be reached within the connection
    /// timeout (for a Sentinel group: one connection timeout per sentinel,
    /// plus one; the message says why: refused, no master known, ...).
    pub fn build(self) -> Result<Client> {
        let client = self.build_lazy()?;
        client.shared.router.check()?;
        Ok(client)
    }

    /// Checks the settings and makes the client without connecting: no
    /// connection is opened until the first call, which reports any
    /// connection error. For services that must start while Redis is down.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] or [`Error::InvalidArgument`] for bad settings.
    pub fn build_lazy(mut self) -> Result<Client> {
        if self.pool_size == 0 {
            return Err(Error::invalid("pool_size must be at least 1, got 0"));
        }
        if let Some(name) = &self.name {
            if name.len() > MAX_NAME_BYTES {
                return Err(Error::invalid(format!(
                    "the client's name must be at most {MAX_NAME_BYTES} bytes, got {}: give \
                     a shorter one (it is written into the client's process key)",
                    name.len()
                )));
            }
        }
        if let Some(n) = self.min_idle.filter(|&n| n > self.pool_size) {
            return Err(Error::invalid(format!(
                "min_idle must be at most pool_size ({}), got {n}",
                self.pool_size
            )));
        }
        for (what, d) in [
            ("max_lifetime", self.max_lifetime),
            ("idle_timeout", self.idle_timeout),
        ] {
            if d.is_some_and(|d| d.is_zero()) {
                return Err(Error::invalid(format!(
                    "{what} must be positive (or None for no limit), got 0ns"
                )));
            }
        }
        for (what, d) in [
            ("connection_timeout", self.connection_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::invalid(format!("{what} must be positive, got 0ns")));
            }
            if d > MAX_TIMEOUT {
                return Err(Error::invalid(format!(
                    "{what} must be at most {MAX_TIMEOUT:?}, got {d:?}"
                )));
            }
        }
        if self.retry_attempts > MAX_RETRY_ATTEMPTS {
            return Err(Error::invalid(format!(
                "retry_attempts must be at most {MAX_RETRY_ATTEMPTS}, got {}",
                self.retry_attempts
            )));
        }
        if self.sync.min > 0 && (self.sync.timeout.is_zero() || self.sync.timeout > MAX_TIMEOUT) {
            return Err(Error::invalid(format!(
                "sync_replicas timeout must be between 1ms and {MAX_TIMEOUT:?} (or 0 replicas \
                 to turn it off), got {:?}",
                self.sync.timeout
            )));
        }
        check_lease("watchdog_timeout", self.watchdog_timeout)?;
        check_max_hold(self.max_hold)?;
        if self.watchdog_timeout <= MIN_RENEW_INTERVAL * 2 {
            return Err(Error::invalid(format!(
                "watchdog_timeout must be more than {:?} (twice MIN_RENEW_INTERVAL), got {:?}",
                MIN_RENEW_INTERVAL * 2,
                self.watchdog_timeout
            )));
        }
        let settings = Settings {
            tls: self.tls.clone(),
            pool: PoolSettings {
                max_size: self.pool_size,
                min_idle: self.min_idle,
                max_lifetime: self.max_lifetime,
                idle_timeout: self.idle_timeout,
                connection_timeout: self.connection_timeout,
            },
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
            retry_attempts: self.retry_attempts,
            sync: self.sync,
            events: Events::new(self.event_handler.clone()),
        };
        let (router, server) = setup::router(&mut self.servers, &settings)?;
        Ok(self.finish(router, server))
    }

    /// The client on `router`.
    fn finish(self, router: Arc<Router>, server: String) -> Client {
        let shared = Shared::new(
            router,
            server,
            self.watchdog_timeout,
            self.max_hold,
            self.response_timeout,
            self.on_lock_lost,
            self.name,
        );
        Client {
            shared: Arc::new(shared),
        }
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field(
                "server",
                &self
                    .servers
                    .info
                    .as_ref()
                    .map(describe)
                    .map_err(|e| e.to_string()),
            )
            .field("tls", &self.tls)
            .field("pool_size", &self.pool_size)
            .field("min_idle", &self.min_idle)
            .field("max_lifetime", &self.max_lifetime)
            .field("idle_timeout", &self.idle_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("retry_attempts", &self.retry_attempts)
            .field("sync_replicas", &self.sync)
            .field(
                "on_lock_lost",
                &self.on_lock_lost.as_ref().map(|_| "Fn(&str)"),
            )
            .finish()
    }
}
