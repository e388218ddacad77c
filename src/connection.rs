//! Connections: an r2d2 manager that sets timeouts and never PINGs on
//! checkout, and the runner that every Redis operation goes through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::ConnectionLike;

use crate::error::{is_io_failure, Error, Result};
use crate::transport::{Connection, Endpoint};

/// A pooled connection and the pool epoch it was made in.
pub(crate) struct Conn {
    pub(crate) inner: Connection,
    epoch: u64,
}

/// Counters the connection layer keeps (see [`crate::ClientStats`]).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) round_trips: AtomicU64,
    pub(crate) failures: AtomicU64,
}

/// The r2d2 manager. Redis's own r2d2 glue sets no socket timeouts and PINGs
/// on every checkout; this one sets connect, read and write timeouts and
/// validates without I/O: a connection is discarded when it broke or when it
/// was made before the last connection failure seen (the pool's epoch), which
/// is how a Redis restart clears every stale pooled connection at once.
pub(crate) struct Manager {
    endpoint: Endpoint,
    connect_timeout: Duration,
    response_timeout: Duration,
    epoch: Arc<AtomicU64>,
}

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
        endpoint: Endpoint,
        connect_timeout: Duration,
        response_timeout: Duration,
        epoch: Arc<AtomicU64>,
    ) -> Manager {
        Manager {
            endpoint,
            connect_timeout,
            response_timeout,
            epoch,
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = ManagerError;

    fn connect(&self) -> Result<Conn, ManagerError> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let inner = Connection::open(&self.endpoint, self.connect_timeout, self.response_timeout)
            .map_err(ManagerError::Redis)?;
        Ok(Conn { inner, epoch })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ManagerError> {
        if self.has_broken(conn) {
            return Err(ManagerError::Stale);
        }
        Ok(())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        !conn.inner.is_open() || conn.epoch < self.epoch.load(Ordering::Acquire)
    }
}

/// The pool plus the script runner; shared by the client, its locks and the
/// watchdog.
pub(crate) struct Redis {
    pool: r2d2::Pool<Manager>,
    epoch: Arc<AtomicU64>,
    /// How long one attempt waits for a pooled connection.
    checkout_timeout: Duration,
    /// The socket timeout connections are made with.
    response_timeout: Duration,
    /// Retries after a dropped connection.
    retry_attempts: u32,
    next_request: AtomicU64,
    pub(crate) counters: Counters,
}

impl Redis {
    /// `epoch` must be the one the pool's [`Manager`] was made with.
    pub(crate) fn new(
        pool: r2d2::Pool<Manager>,
        epoch: Arc<AtomicU64>,
        checkout_timeout: Duration,
        response_timeout: Duration,
        retry_attempts: u32,
    ) -> Redis {
        Redis {
            pool,
            epoch,
            checkout_timeout,
            response_timeout,
            retry_attempts,
            next_request: AtomicU64::new(1),
            counters: Counters::default(),
        }
    }

    /// A number unique to this client, for request ids (latch and marker
    /// names, generations).
    pub(crate) fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `op` on a pooled connection, one round trip as far as `op` goes.
    ///
    /// A connection failure marks every pooled connection made before it as
    /// stale. If the connection turned out dropped (Redis restarted, the link
    /// was cut), `op` is run again on a new connection, up to
    /// `retry_attempts` times, all within one response timeout of the first
    /// attempt (each retry's checkout and socket timeouts are cut to what is
    /// left): every operation of redlease is safe to repeat (see the
    /// scripts). Timeouts are not retried, and waiting for a pooled connection
    /// is bounded by the smaller of the connection and response timeouts, so
    /// a stalled server (which accepts connections but never answers) holds a
    /// call for about one response timeout.
    ///
    /// If an attempt may have run and a later one fails, the first such
    /// attempt's error is returned, so that [`Error::maybe_applied`] holds.
    pub(crate) fn run<T>(
        &self,
        mut op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut first_failure: Option<redis::RedisError> = None;
        let mut retries = 0;
        let started = Instant::now();
        let deadline = started.checked_add(self.response_timeout);
        loop {
            let left = match (retries, deadline) {
                (0, _) | (_, None) => self.response_timeout,
                (_, Some(d)) => d.saturating_duration_since(Instant::now()),
            };
            if left.is_zero() {
                return Err(Error::Redis(first_failure.unwrap_or_else(|| {
                    (redis::ErrorKind::Io, "retries ran out of time").into()
                })));
            }
            let mut conn = match self.pool.get_timeout(self.checkout_timeout.min(left)) {
                Ok(conn) => conn,
                Err(e) => return Err(first_failure.map_or_else(|| Error::pool(e), Error::Redis)),
            };
            let shortened = left < self.response_timeout;
            if shortened && set_timeouts(&conn.inner, left).is_err() {
                self.mark_failure(&mut conn);
                continue;
            }
            self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let result = op(&mut conn.inner);
            if shortened && set_timeouts(&conn.inner, self.response_timeout).is_err() {
                self.mark_failure(&mut conn);
            }
            match result {
                Ok(v) => return Ok(v),
                Err(e) => {
                    if is_connection_failure(&e) {
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
    }
}

fn set_timeouts(conn: &Connection, timeout: Duration) -> std::io::Result<()> {
    conn.set_timeouts(timeout)
}

/// The connection can no longer be trusted (it may even get a late reply).
fn is_connection_failure(e: &redis::RedisError) -> bool {
    is_io_failure(e) || e.is_unrecoverable_error()
}

/// Logs the pool's failures to connect at `warn` (r2d2's default is `error`):
/// the pool keeps retrying, and calls report their own errors.
#[derive(Debug)]
pub(crate) struct WarnOnError;

impl r2d2::HandleError<ManagerError> for WarnOnError {
    fn handle_error(&self, error: ManagerError) {
        log::warn!("redlease: cannot connect to redis: {error}");
    }
}
