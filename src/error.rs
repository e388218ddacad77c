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
/// and may grow. `Display` is one short lowercase line that says what went
/// wrong, with the values involved (the name, the counts, the bad value and
/// what is allowed); what to do about it is in the docs of each variant and
/// predicate below. [`source()`](std::error::Error::source) carries Redis's
/// own error.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// use std::time::Duration;
/// match client.lock("orders:42").try_lock_for(Duration::from_secs(2)) {
///     Ok(Some(guard)) => { /* held */ }
///     Ok(None) => { /* busy for 2 s */ }
///     Err(e) if e.is_auth() => return Err(e), // fix the credentials or ACL
///     Err(e) if e.is_connection_error() => { /* Redis unreachable: retry later */ }
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An argument or a setting was out of range. The message names it, the
    /// value given and what is allowed (`pool_size must be at least 1, got
    /// 0`): change the call or the setting to fit; retrying will not help.
    /// Nothing was sent to Redis.
    InvalidArgument(String),
    /// The connection info could not be parsed or names something redlease
    /// cannot use (for example a `rediss://` url in a build without the
    /// `tls` feature, or TLS certificates that cannot be read). The message
    /// says which address (never its password) and what is wrong with it.
    /// The forms accepted are `redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://...` for TLS (the `tls` feature, on by default) and
    /// `redis+unix:///path`; a Redis Cluster has database 0 only.
    InvalidUrl(String),
    /// Redis answered with an error, or the connection failed or timed out in
    /// the middle of a command. `Display` says which; the
    /// [`source`](std::error::Error::source) is Redis's own error, with its
    /// code and text.
    ///
    /// - Credentials or a permission refused: see [`is_auth`](Error::is_auth).
    /// - No answer within the response timeout: see
    ///   [`is_timeout`](Error::is_timeout).
    /// - The connection failed (before or during the request): see
    ///   [`is_connection_error`](Error::is_connection_error). With Sentinel
    ///   or a Cluster, this is also how "no master found through the
    ///   sentinels" or "no cluster node answered" comes (the source lists
    ///   each address and how it failed): check the sentinel or seed
    ///   addresses, and the master name.
    /// - The TLS handshake failed: the source says what to set. A server
    ///   certificate not trusted needs the CA that signed it
    ///   (`ClientBuilder::tls_root_certificate`) or a host name in the url
    ///   that the certificate names; a server that wants a client
    ///   certificate needs one it trusts
    ///   (`ClientBuilder::tls_client_identity`).
    /// - Any other reply (`WRONGTYPE`: the name is a key of another type,
    ///   not a lock of this kind; `BUSY`: a long script runs on the server).
    Redis(redis::RedisError),
    /// No connection could be had in time (within the connection timeout, or
    /// the response timeout if shorter): Redis is unreachable, refuses the
    /// connection, does not answer, or every pooled connection is busy. The
    /// string says where to (`redis at host:port`, `the master of "name"`)
    /// and, when known, why (the last connection error, or that all pooled
    /// connections were in use).
    ///
    /// Check that Redis is reachable and answering. When the pool is the
    /// limit (many threads calling at once, or slow commands keeping
    /// connections), raise [`pool_size`](crate::ClientBuilder::pool_size),
    /// or give calls longer with
    /// [`connection_timeout`](crate::ClientBuilder::connection_timeout) and
    /// [`response_timeout`](crate::ClientBuilder::response_timeout).
    Pool(String),
    /// A background thread of the client (watchdog or subscriber) could not
    /// be started: the operating system refused a new thread (the
    /// [`source`](std::error::Error::source) is its error). The process may
    /// have reached its thread limit (`ulimit -u`, a container's pids limit).
    Thread(std::io::Error),
    /// Fewer replicas than required acknowledged an acquisition within the
    /// replica sync timeout (see
    /// [`ClientBuilder::sync_replicas`](crate::ClientBuilder::sync_replicas)),
    /// on every try: the acquisition was undone, so the lock (or the permits)
    /// is not held. The master may be cut off from its replicas: check its
    /// link to them (`INFO replication`), or lower the requirement with
    /// `sync_replicas` (0 replicas turns it off). A later try may succeed
    /// once the replicas catch up.
    ReplicaSync {
        /// The lock's (or semaphore's) name.
        name: String,
        /// Replicas required (capped by those the master has).
        wanted: u32,
        /// Replicas that acknowledged the last try.
        acked: u32,
    },
    /// The lock is no longer held by this guard: its lease ran out, it was
    /// deleted (for example by `force_unlock` or a Redis restart), or the
    /// watchdog could not renew it in time. Whatever the guard protected may
    /// have been touched by another holder since: do not act on it, acquire
    /// the lock again and start over from what you read under the new guard.
    /// If leases run out while held, give a fixed lease more time, or let the
    /// watchdog renew it (no lease, and Redis reachable within the
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout)).
    LockLost {
        /// The lock's name.
        name: String,
    },
    /// Semaphore permits were no longer out when released or renewed: the
    /// semaphore was deleted, or the lease of a [`Permit`](crate::Permit) of
    /// an [`ExpirableSemaphore`](crate::ExpirableSemaphore) ran out (it was
    /// counted back by then, or by this release; or it was released by id).
    /// More permits than were set may have been out meanwhile: do not act on
    /// what the permits protected, acquire again. For expirable permits, give
    /// a longer lease, or extend it in time with
    /// [`Permit::update_lease`](crate::Permit::update_lease).
    PermitLost {
        /// The semaphore's name.
        name: String,
    },
    /// Too few masters of a [`RedLock`](crate::RedLock) answered for a
    /// majority (the others failed: down, stopped, slow past the response
    /// timeout, refusing): nothing was left held. The first member's error
    /// is the [`source`](std::error::Error::source) and says why. Bring the
    /// failed masters back, or check their addresses and the response
    /// timeout (a master slower than it counts as failed).
    NoQuorum {
        /// The member locks' names, comma-separated.
        name: String,
        /// Members (masters).
        masters: usize,
        /// Masters that answered.
        answered: usize,
        /// Majority needed.
        needed: usize,
        /// The first failed member's error.
        first: Option<Box<Error>>,
    },
}

impl Error {
    /// `true` if a deadline passed: a Redis command timed out, or no pooled
    /// connection could be had in time ([`Error::Pool`], which says what to
    /// check).
    ///
    /// A command that timed out may still run on Redis. redlease settles a
    /// lock change whose reply was lost in the background (an acquisition is
    /// undone, a release completed), so calling again is safe. When it
    /// recurs, check Redis's load (`SLOWLOG`, a long script, a saturated
    /// server or network), or raise
    /// [`response_timeout`](crate::ClientBuilder::response_timeout).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Redis(e) => e.is_timeout(),
            Error::Pool(_) => true,
            _ => false,
        }
    }

    /// `true` if the lock (or semaphore permit) this error is about is no
    /// longer held by the caller (see [`Error::LockLost`],
    /// [`Error::PermitLost`]). Do not act on what it protected: another
    /// holder may have it now. Acquire it again.
    #[must_use]
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. } | Error::PermitLost { .. })
    }

    /// `true` for bad input (an argument, a setting or the URL): fix the call
    /// as the message says, retrying will not help.
    #[must_use]
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_) | Error::InvalidUrl(_))
    }

    /// `true` if Redis refused the credentials or a permission: a wrong
    /// password or unknown user (`WRONGPASS`), no authentication
    /// (`NOAUTH`), or an ACL that lacks a command, key or channel the lock
    /// needs (`NOPERM`). Retrying will not help:
    ///
    /// - refused credentials: fix the username and password (in the url or
    ///   the `ConnectionInfo`), or enable the user (`ACL SETUSER <user> on`);
    /// - a missing permission: the [`source`](std::error::Error::source)
    ///   names the command, key or channel refused; grant what the minimal
    ///   ACL rule in [`guide::production`](crate::guide::production) lists.
    ///
    /// ```
    /// # fn check(e: redlease::Error) {
    /// if e.is_auth() {
    ///     eprintln!("fix the redis credentials or ACL: {e}");
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn is_auth(&self) -> bool {
        match self {
            Error::Redis(e) => is_auth_error(e),
            _ => false,
        }
    }

    /// `true` if Redis could not be reached or the connection broke: the
    /// operation may succeed when retried once Redis is reachable. A request
    /// whose connection failed during it may have run; redlease settles such
    /// a lock change in the background (see [`is_timeout`](Error::is_timeout)),
    /// so calling again is safe.
    #[must_use]
    pub fn is_connection_error(&self) -> bool {
        self.maybe_applied() || matches!(self, Error::Pool(_) | Error::NoQuorum { .. })
    }

    /// `true` for [`Error::ReplicaSync`]: the master took the acquisition
    /// but too few replicas confirmed it, so it was undone (the variant says
    /// what to check).
    #[must_use]
    pub fn is_replica_sync(&self) -> bool {
        matches!(self, Error::ReplicaSync { .. })
    }

    /// What a failover of the master looks like from a client: no
    /// connection, a dropped or timed-out one, or a refusal that passes once
    /// the servers have moved (`READONLY`, `MASTERDOWN`, `LOADING`,
    /// `CLUSTERDOWN`, `TRYAGAIN`, a redirection not followed to its end).
    pub(crate) fn is_failover_symptom(&self) -> bool {
        self.is_connection_error() || matches!(self, Error::Redis(r) if is_moving_reply(r))
    }

    /// A failover symptom after which the same request may be sent again
    /// at once: it was not sent (no connection), Redis refused it without
    /// running it, or its connection is gone (no copy of it can arrive
    /// later). Not after a timeout: a copy may still be on its way.
    pub(crate) fn can_resend(&self) -> bool {
        match self {
            Error::Pool(_) => true,
            Error::Redis(r) => (is_io_failure(r) && !r.is_timeout()) || is_moving_reply(r),
            _ => false,
        }
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

    /// The same error again, for each of several requests that one failure
    /// ended (what decides settling, `maybe_applied` and `needs_settle`,
    /// is kept: connection errors are Redis or pool errors).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Redis(e) => Error::Redis(e.clone()),
            Error::Pool(m) => Error::Pool(m.clone()),
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::InvalidUrl(m) => Error::InvalidUrl(m.clone()),
            other => Error::Pool(other.to_string()),
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }
}

/// Redis refused the credentials or a permission.
pub(crate) fn is_auth_error(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "NOPERM" | "WRONGPASS"))
        // A command a script runs that the user's ACL lacks (Redis says ERR).
        || e.detail().is_some_and(|d| d.contains("The user executing the script can't"))
}

/// Redis refused to let us in, for a reason that retrying will not fix.
pub(crate) fn is_refusal(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::AuthenticationFailed | redis::ErrorKind::InvalidClientConfig
    ) || matches!(e.code(), Some("NOAUTH" | "NOPERM" | "WRONGPASS"))
}

/// The connection failed or timed out while a command was under way (as
/// opposed to an error reply from Redis).
pub(crate) fn is_io_failure(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

/// Redis refused the command without running it because the servers are
/// moving (a failover, a slot migration).
fn is_moving_reply(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "CLUSTERDOWN" | "TRYAGAIN" | "MOVED" | "ASK")
    )
}

/// Redis refused the command without running it, for a reason that passes
/// (a long script elsewhere, loading, a failover, an ACL being changed, memory
/// full, a Cluster slot moving or migrating past the redirections followed):
/// the same request may succeed when tried again.
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
                | "MOVED"
                | "ASK"
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
            // The redis error itself is the source; say what it means here.
            Error::Redis(e)
                if e.kind() == redis::ErrorKind::AuthenticationFailed
                    || matches!(e.code(), Some("NOAUTH" | "WRONGPASS")) =>
            {
                f.write_str("redis refused the credentials")
            }
            Error::Redis(e) if is_auth_error(e) => {
                f.write_str("the redis user lacks a permission the lock needs")
            }
            Error::Redis(e) if e.is_timeout() => {
                f.write_str("timed out waiting for redis to answer")
            }
            Error::Redis(e) if is_io_failure(e) => f.write_str("the connection to redis failed"),
            Error::Redis(e) if e.kind() == redis::ErrorKind::InvalidClientConfig => {
                f.write_str("the TLS handshake with redis failed")
            }
            Error::Redis(e) => match e.code() {
                Some(code) => write!(f, "redis answered with an error ({code})"),
                None => f.write_str("redis answered with an error"),
            },
            Error::Pool(msg) => write!(f, "timed out waiting for a connection to {msg}"),
            Error::Thread(_) => f.write_str("cannot start a background thread"),
            Error::ReplicaSync {
                name,
                wanted,
                acked,
            } => write!(
                f,
                "acquisition of {name:?} undone: {acked} of {wanted} replicas acknowledged it \
                 in time"
            ),
            Error::LockLost { name } => write!(f, "lock {name:?} is no longer held"),
            Error::PermitLost { name } => {
                write!(f, "the permits of semaphore {name:?} are no longer held")
            }
            Error::NoQuorum {
                name,
                masters,
                answered,
                needed,
                ..
            } => write!(
                f,
                "redlock {name:?}: {answered} of {masters} masters answered, {needed} needed"
            ),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Thread(e) => Some(e),
            Error::NoQuorum { first: Some(e), .. } => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::Redis(e)
    }
}
