//! The client: configuration, the connection pool, the client id and the
//! background threads.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::connection::{Manager, Redis, WarnOnError};
use crate::error::{Error, Result};
use crate::lock::{check_lease, duration_ms, Lock, MIN_RENEW_INTERVAL};
use crate::pubsub::PubSub;
use crate::transport::{Endpoint, TlsOptions};
use crate::watchdog::{LostCallback, Watchdog};

/// The longest `connection_timeout` or `response_timeout` accepted.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
}

/// A number for the current OS thread, stable for its lifetime and unique in
/// the process (the `<thread-id>` of the owner field).
fn thread_id() -> u64 {
    THREAD_ID.try_with(|id| *id).unwrap_or(0)
}

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

pub(crate) struct Shared {
    pub(crate) id: u64,
    uuid: String,
    url: String,
    pub(crate) redis: Arc<Redis>,
    pub(crate) watchdog: Watchdog,
    pub(crate) pubsub: PubSub,
    pub(crate) watchdog_timeout: Duration,
    /// How long the latch of a release lives: long enough for a retry of the
    /// same request to find it (4 response timeouts, at least 1 s).
    pub(crate) latch_ttl_ms: u64,
}

impl Shared {
    /// `<client-uuid>:<thread-id>` for the current thread.
    pub(crate) fn owner_field(&self) -> String {
        use std::fmt::Write;
        let mut field = String::with_capacity(self.uuid.len() + 21);
        field.push_str(&self.uuid);
        let _ = write!(field, ":{}", thread_id());
        field
    }

    /// A number unique to this client, for request ids.
    pub(crate) fn next_request(&self) -> u64 {
        self.redis.next_request()
    }
}

impl Client {
    /// Connects with default settings; see [`ClientBuilder`].
    ///
    /// # Errors
    ///
    /// As for [`ClientBuilder::build`].
    pub fn open(url: &str) -> Result<Client> {
        Client::builder(url).build()
    }

    /// Starts configuring a client for the Redis at `url`
    /// (`redis://[user:password@]host[:port][/db]` or `redis+unix:///path`).
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder::new(url)
    }

    /// A handle on the lock named `name` (any UTF-8, including braces,
    /// newlines and NUL). Cheap and infallible: the name is checked when the
    /// lock is used.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), name.into())
    }

    /// This client's id, the `<client-uuid>` part of the owner field it
    /// writes into lock hashes.
    pub fn id(&self) -> &str {
        &self.shared.uuid
    }

    /// The lease of locks taken without an explicit one.
    pub fn watchdog_timeout(&self) -> Duration {
        self.shared.watchdog_timeout
    }

    /// A snapshot of this client's counters.
    pub fn stats(&self) -> ClientStats {
        let s = &self.shared;
        let wd = s.watchdog.counters();
        ClientStats {
            round_trips: s.redis.counters.round_trips.load(Ordering::Relaxed),
            connection_failures: s.redis.counters.failures.load(Ordering::Relaxed),
            renewal_round_trips: wd.round_trips.load(Ordering::Relaxed),
            renewals: wd.renewals.load(Ordering::Relaxed),
            locks_lost: wd.lost.load(Ordering::Relaxed),
            watchdog_entries: s.watchdog.scheduled(),
            subscribed_channels: s.pubsub.channels(),
            subscriber_reconnects: s.pubsub.reconnects(),
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.shared.uuid)
            .field("url", &self.shared.url)
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
    /// Round trips the watchdog made (one per due batch).
    pub renewal_round_trips: u64,
    /// Leases the watchdog renewed.
    pub renewals: u64,
    /// Held locks found lost (see [`ClientBuilder::on_lock_lost`]).
    pub locks_lost: u64,
    /// Locks the watchdog is renewing.
    pub watchdog_entries: usize,
    /// Release channels with at least one waiter in this process.
    pub subscribed_channels: usize,
    /// Times the subscriber connection was re-established.
    pub subscriber_reconnects: u64,
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
    url: String,
    pool_size: u32,
    connection_timeout: Duration,
    response_timeout: Duration,
    watchdog_timeout: Duration,
    retry_attempts: u32,
    on_lock_lost: Option<LostCallback>,
}

/// The most `retry_attempts` accepted.
const MAX_RETRY_ATTEMPTS: u32 = 100;

impl ClientBuilder {
    fn new(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_owned(),
            pool_size: 16,
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            watchdog_timeout: Duration::from_secs(30),
            retry_attempts: 3,
            on_lock_lost: None,
        }
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
    pub fn watchdog_timeout(mut self, lease: Duration) -> Self {
        self.watchdog_timeout = lease;
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

    /// Checks the settings and connects.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] or [`Error::InvalidArgument`] for bad settings;
    /// [`Error::Pool`] if Redis cannot be reached within the connection
    /// timeout.
    pub fn build(self) -> Result<Client> {
        if self.pool_size == 0 {
            return Err(Error::invalid("pool_size is 0: use at least 1"));
        }
        for (what, d) in [
            ("connection_timeout", self.connection_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::invalid(format!(
                    "{what} is zero: use a positive duration"
                )));
            }
            if d > MAX_TIMEOUT {
                return Err(Error::invalid(format!(
                    "{what} of {d:?} is too long: use at most {MAX_TIMEOUT:?}"
                )));
            }
        }
        if self.retry_attempts > MAX_RETRY_ATTEMPTS {
            return Err(Error::invalid(format!(
                "retry_attempts {} is too many: use at most {MAX_RETRY_ATTEMPTS}",
                self.retry_attempts
            )));
        }
        check_lease("watchdog_timeout", self.watchdog_timeout)?;
        if self.watchdog_timeout <= MIN_RENEW_INTERVAL * 2 {
            return Err(Error::invalid(format!(
                "watchdog_timeout {:?} is too short to renew: use more than {:?}",
                self.watchdog_timeout,
                MIN_RENEW_INTERVAL * 2
            )));
        }
        let info = redis::IntoConnectionInfo::into_connection_info(self.url.as_str()).map_err(|e| {
            Error::InvalidUrl(format!(
                "{:?}: {e}; use redis://[user:password@]host[:port][/db] or redis+unix:///path",
                redact(&self.url)
            ))
        })?;
        let endpoint = Endpoint::new(&info, &TlsOptions::default())
            .map_err(|e| Error::InvalidUrl(format!("{:?}: {e}", redact(&self.url))))?;
        let epoch = Arc::new(AtomicU64::new(0));
        let manager = Manager::new(
            endpoint.clone(),
            self.connection_timeout,
            self.response_timeout,
            Arc::clone(&epoch),
        );
        let pool = r2d2::Pool::builder()
            .max_size(self.pool_size)
            .min_idle(Some(1))
            .connection_timeout(self.connection_timeout)
            .test_on_check_out(true)
            .error_handler(Box::new(WarnOnError))
            // One thread (not r2d2's default three) opens connections.
            .thread_pool(Arc::new(
                scheduled_thread_pool::ScheduledThreadPool::builder()
                    .num_threads(1)
                    .thread_name_pattern("redlease-connect")
                    // Exit with the pool, not after r2d2's next reaper tick.
                    .on_drop_behavior(
                        scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled,
                    )
                    .build(),
            ))
            .build(manager)
            .map_err(Error::pool)?;
        let checkout = self.connection_timeout.min(self.response_timeout);
        let redis = Arc::new(Redis::new(
            pool,
            epoch,
            checkout,
            self.response_timeout,
            self.retry_attempts,
        ));
        let shared = Shared {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            uuid: uuid::Uuid::new_v4().to_string(),
            url: redact(&self.url),
            watchdog: Watchdog::new(Arc::clone(&redis), self.on_lock_lost),
            pubsub: PubSub::new(endpoint, self.connection_timeout, self.response_timeout),
            redis,
            watchdog_timeout: self.watchdog_timeout,
            latch_ttl_ms: duration_ms(self.response_timeout)
                .saturating_mul(4)
                .max(1000),
        };
        Ok(Client {
            shared: Arc::new(shared),
        })
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &redact(&self.url))
            .field("pool_size", &self.pool_size)
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("retry_attempts", &self.retry_attempts)
            .field(
                "on_lock_lost",
                &self.on_lock_lost.as_ref().map(|_| "Fn(&str)"),
            )
            .finish()
    }
}

/// The URL with any password replaced by `***`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    if userinfo.is_empty() {
        return url.to_owned();
    }
    // `user:password`, or a lone password (redis-rs reads `redis://pw@h`).
    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
    format!("{}{user}:***{}", &url[..scheme_end + 3], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:secret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://u:secret@h/"), "redis://u:***@h/");
        assert_eq!(redact("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact("redis://tok@h/"), "redis://:***@h/");
    }
}
