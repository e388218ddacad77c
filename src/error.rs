//! The one error type of the crate.

use std::error::Error as StdError;
use std::fmt;

/// A `Result` whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in redlease.
///
/// Match on the predicates ([`is_timeout`](Error::is_timeout),
/// [`is_lock_lost`](Error::is_lock_lost), …) rather than on the variants when
/// you only need to decide what to do next: the enum is `#[non_exhaustive]`
/// and may grow.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An argument or a setting was out of range; the message says what to
    /// change. Nothing was sent to Redis.
    InvalidArgument(String),
    /// The Redis URL could not be parsed or names something redlease cannot
    /// use (for example TLS, which is not supported yet).
    InvalidUrl(String),
    /// Redis answered with an error, or the connection failed or timed out in
    /// the middle of a command.
    Redis(redis::RedisError),
    /// No connection could be had in time (within the connection timeout, or
    /// the response timeout if shorter): Redis is unreachable, refuses the
    /// connection, does not answer, or every pooled connection is busy.
    Pool(String),
    /// A background thread of the client (watchdog or subscriber) could not
    /// be started; the operating system refused a new thread.
    Thread(std::io::Error),
    /// The lock is no longer held by this guard: its lease ran out, it was
    /// deleted (for example by `force_unlock` or a Redis restart), or the
    /// watchdog could not renew it in time. Whatever the guard protected may
    /// have been touched by another holder since.
    LockLost {
        /// The lock's name.
        name: String,
    },
}

impl Error {
    /// `true` if a deadline passed: a Redis command timed out, or no pooled
    /// connection could be had in time.
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Redis(e) => e.is_timeout(),
            Error::Pool(_) => true,
            _ => false,
        }
    }

    /// `true` if the lock this error is about is no longer held by the caller
    /// (see [`Error::LockLost`]).
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. })
    }

    /// `true` for bad input (an argument, a setting or the URL): fix the call,
    /// retrying will not help.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_) | Error::InvalidUrl(_))
    }

    /// `true` if Redis could not be reached or the connection broke: the
    /// operation may succeed when retried later.
    pub fn is_connection_error(&self) -> bool {
        self.maybe_applied() || matches!(self, Error::Pool(_))
    }

    /// The request may have reached Redis and run, though no reply came.
    pub(crate) fn maybe_applied(&self) -> bool {
        matches!(self, Error::Redis(e) if is_io_failure(e))
    }

    /// A request that changes a lock did not complete for a passing reason:
    /// it may have run (no reply), was never sent (no connection), or Redis
    /// refused it for now (see [`is_retryable_reply`]). Such a request is
    /// settled in the background until it has run once.
    pub(crate) fn needs_settle(&self) -> bool {
        match self {
            Error::Redis(e) => is_io_failure(e) || is_retryable_reply(e),
            Error::Pool(_) => true,
            _ => false,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }

    pub(crate) fn pool(e: r2d2::Error) -> Error {
        Error::Pool(e.to_string())
    }
}

/// The connection failed or timed out while a command was under way (as
/// opposed to an error reply from Redis).
pub(crate) fn is_io_failure(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

/// Redis refused the command without running it, for a reason that passes
/// (a long script elsewhere, loading, a failover, an ACL being changed, memory
/// full): the same request may succeed when tried again.
pub(crate) fn is_retryable_reply(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some(
            "BUSY"
                | "LOADING"
                | "READONLY"
                | "MASTERDOWN"
                | "TRYAGAIN"
                | "CLUSTERDOWN"
                | "NOREPLICAS"
                | "NOPERM"
                | "NOAUTH"
                | "OOM"
        )
    )
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
            Error::InvalidUrl(msg) => write!(f, "invalid redis url: {msg}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::Pool(msg) => write!(
                f,
                "no redis connection in time ({msg}); check that redis is reachable and \
                 answering, or raise pool_size, connection_timeout or response_timeout"
            ),
            Error::Thread(e) => write!(
                f,
                "cannot start a background thread of redlease ({e}); the process may have \
                 reached its thread limit"
            ),
            Error::LockLost { name } => write!(
                f,
                "lock {name:?} is no longer held by this thread: its lease ran out or it was \
                 deleted; do not act on what it protected, acquire it again"
            ),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Thread(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::Redis(e)
    }
}
