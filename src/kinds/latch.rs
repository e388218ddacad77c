//! The count-down latch (Redisson's `RCountDownLatch` layout): a count in
//! Redis that any client counts down; waiters wake when it reaches zero.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::shared::{check_count, Shared};
use crate::engine::waiting::{Attempt, Waiters};
use crate::error::{Error, Result};
use crate::net::pool::send_once;
use crate::net::pubsub::WakeRule;
use crate::net::router::Router;
use crate::scripts::{self, LatchOp};

/// How long a wait rides out an outage after its last answered read (no
/// lease bounds a latch's wait).
const RIDE_OUT: Duration = Duration::from_secs(10);

/// A distributed count-down latch, shared with Redisson's `RCountDownLatch`
/// on the same name: the count is the string integer at key `<name>`, and
/// `redisson_countdownlatch__channel__{<name>}` carries `0` when it reaches
/// zero and `1` when it is set or deleted.
///
/// Waiting is by pub/sub: a waiter subscribes, then reads the count, so a
/// count-down between the two is not missed, and the subscriber wakes every
/// waiter to look again after it reconnects, so a message missed while it
/// was away does not strand anyone.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// let ready = client.count_down_latch("workers-ready");
/// ready.try_set_count(3)?;           // false if the latch already exists
/// // ... in each of three workers:
/// ready.count_down()?;
/// // ... in the coordinator:
/// ready.wait()?;                     // or wait_for(timeout) -> bool
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a CountDownLatch does nothing until one of its methods is called"]
pub struct CountDownLatch {
    shared: Arc<Shared>,
    name: String,
    channel: String,
}

impl CountDownLatch {
    pub(crate) fn new(shared: Arc<Shared>, name: String) -> CountDownLatch {
        CountDownLatch {
            shared,
            channel: scripts::latch_channel_name(&name),
            name,
        }
    }

    /// The latch's name (its key).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    fn router(&self) -> &Router {
        &self.shared.router
    }

    fn check_name(&self) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::invalid("latch name must not be empty"));
        }
        if self.router().is_cluster()
            && crate::net::cluster::slot(self.name.as_bytes())
                != crate::net::cluster::slot(self.channel.as_bytes())
        {
            return Err(Error::invalid(format!(
                "latch name {:?} would span cluster slots: leave braces out",
                self.name
            )));
        }
        Ok(())
    }

    fn run(&self, op: LatchOp) -> Result<i64> {
        self.check_name()?;
        let publish = self.router().publish_command();
        // Not idempotent (as Redisson's): never resent after it may have run.
        // Waited for by the replicas where replica sync is on, as a lock's
        // writes (one fewer confirmed is still done on the master).
        self.router()
            .run_synced(
                &self.name,
                send_once(|conn| scripts::latch(conn, op, &self.name, &self.channel, publish)),
            )
            .map(|(n, _)| n)
    }

    /// Sets the count to `count` if the latch does not exist; `false` if it
    /// does (its count is left as it is).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a count of 0 (a latch at zero does not
    /// exist: nothing would wait) or above 2^53 (Lua counts exactly up to
    /// there); a Redis or pool error.
    pub fn try_set_count(&self, count: u64) -> Result<bool> {
        if count == 0 {
            return Err(Error::invalid("latch count must be at least 1, got 0"));
        }
        check_count("latch count", count)?;
        Ok(self.run(LatchOp::Set(count))? == 1)
    }

    /// Counts down by one; at zero the latch is removed and every waiter
    /// wakes. Counting down a latch at zero (or never set) does nothing.
    /// Returns the count left.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name (as for
    /// [`count`](Self::count)); a Redis or pool error: the count-down may
    /// have happened (it is not idempotent, as in Redisson; it is never
    /// sent twice).
    pub fn count_down(&self) -> Result<u64> {
        Ok(u64::try_from(self.run(LatchOp::CountDown)?).unwrap_or(0))
    }

    /// The count now (0 once it reached zero or was deleted).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose key and channel would be in different slots: Redisson's
    /// channel is `redisson_countdownlatch__channel__{<name>}`, so a name
    /// with braces of its own cannot share a slot with it); a Redis or pool
    /// error.
    pub fn count(&self) -> Result<u64> {
        self.check_name()?;
        let n: Option<i64> = self
            .router()
            .run(&self.name, |c| redis::cmd("GET").arg(&self.name).query(c))?;
        Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }

    /// Deletes the latch (its waiters wake: the count is 0 from now on);
    /// `false` if there was none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose key and channel would be in different slots); a Redis or
    /// pool error.
    pub fn delete(&self) -> Result<bool> {
        Ok(self.run(LatchOp::Delete)? == 1)
    }

    /// Waits until the count is zero (or the latch deleted), as long as it
    /// takes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name (as for
    /// [`count`](Self::count)); a Redis or pool error, or Redis refusing
    /// the subscription. A read that fails the way an outage looks (no
    /// connection, a lost reply) is made again after a pause (about 50 ms,
    /// doubling up to about 500 ms), for up to 10 s after the last read
    /// that Redis answered; then the wait fails with its error.
    pub fn wait(&self) -> Result<()> {
        self.wait_deadline(None).map(|_| ())
    }

    /// Waits up to `timeout` for the count to reach zero; `true` if it did.
    ///
    /// # Errors
    ///
    /// As for [`wait`](Self::wait).
    pub fn wait_for(&self, timeout: Duration) -> Result<bool> {
        self.wait_deadline(Instant::now().checked_add(timeout))
    }

    /// Waits until `deadline` at the latest for the count to reach zero;
    /// `true` if it did (a deadline already past still reads the count
    /// once).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// use std::time::{Duration, Instant};
    /// // One deadline for several waits: the latch, then a lock.
    /// let deadline = Instant::now() + Duration::from_secs(10);
    /// if client.count_down_latch("workers:ready").wait_until(deadline)? {
    ///     let _guard = client.lock("start").try_lock_until(deadline)?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`wait`](Self::wait).
    pub fn wait_until(&self, deadline: Instant) -> Result<bool> {
        self.wait_deadline(Some(deadline))
    }

    fn wait_deadline(&self, deadline: Option<Instant>) -> Result<bool> {
        self.check_name()?;
        // The acquire loop every kind waits in: the count is read, and read
        // again after subscribing (a count-down in between is seen), then
        // after each message, each reconnect of the subscriber, and while
        // the subscription is not confirmed; failovers are ridden out until
        // the deadline.
        let waiters = Waiters {
            router: self.router(),
            name: &self.name,
            channel: &self.channel,
            rule: WakeRule::All,
            // Only a message (or an unconfirmed subscription) has it read
            // again: nobody publishes a count-down's progress.
            recheck: Duration::MAX,
            every: Duration::MAX,
            // No lease bounds the wait: an outage is ridden out this long
            // after the last answered read, then the wait fails.
            ride_out: RIDE_OUT,
            kind: None,
            client: None,
            failover: self.shared.watchdog_timeout,
        };
        let opened = waiters.acquire(deadline, |_| {
            Ok(if self.count()? == 0 {
                Attempt::Acquired(())
            } else {
                Attempt::Busy(None)
            })
        })?;
        Ok(opened.is_some())
    }
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &self.name)
            .finish()
    }
}
