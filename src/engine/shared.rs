//! The context every kind of lock holds ([`Shared`]): the client's ids, its
//! router, its watchdog and timeouts, with the checks and the hand-off to
//! settlement that every kind uses. The public `Client` is a handle over it;
//! the kinds hold it directly and never the `Client`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::engine::grants::Grants;
use crate::engine::owners::{add_pending, owner_state};
use crate::engine::process::Announce;
use crate::engine::unsettled::Unsettled;
use crate::engine::watchdog::{LostCallback, Watchdog};
use crate::error::{Error, Result};
use crate::events::Events;
use crate::net::router::Router;
use crate::scripts;
use crate::time::duration_ms;

/// The longest lease accepted: 2^53 ms (about 285,000 years), the largest
/// whole number a Lua script handles exactly, and well inside Redis's 64-bit
/// millisecond expiry times.
pub const MAX_LEASE: Duration = Duration::from_millis(1 << 53);

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

/// What a client's locks share: one per `Client` (its clones share it).
pub(crate) struct Shared {
    /// A number unique in the process, for the per-thread registry.
    pub(crate) id: u64,
    /// The `<client-uuid>` of the owner fields it writes.
    pub(crate) uuid: String,
    /// The first 8 bytes of the UUID: the start of the ids of the permits
    /// it takes, and (in hex) its process key's id.
    pub(crate) short_id: [u8; 8],
    /// The application's name (`ClientBuilder::name`), for the process key.
    pub(crate) app_name: Option<String>,
    pub(crate) started: SystemTime,
    /// Set once the process key is scheduled (the first acquisition).
    announced: AtomicBool,
    /// The event handler, if any.
    pub(crate) events: Events,
    /// Where it connects, for `Debug` (no password).
    pub(crate) server: String,
    pub(crate) router: Arc<Router>,
    pub(crate) watchdog: Watchdog,
    pub(crate) watchdog_timeout: Duration,
    /// The longest a lock of this client may be held by default
    /// (`ClientBuilder::max_hold`).
    pub(crate) max_hold: Option<Duration>,
    /// How long the latch of a release lives: long enough for a retry of the
    /// same request to find it (4 response timeouts, at least 1 s).
    pub(crate) latch_ttl_ms: u64,
    pub(crate) response_timeout: Duration,
    /// Waiters of this client's reentrant locks that a release by another
    /// of its threads may hand the lock to.
    pub(crate) grants: Grants,
}

impl Shared {
    /// The context of a new client on `router` (`server` says where, for
    /// `Debug`); its watchdog starts with the first watched lock.
    pub(crate) fn new(
        router: Arc<Router>,
        server: String,
        watchdog_timeout: Duration,
        max_hold: Option<Duration>,
        response_timeout: Duration,
        on_lock_lost: Option<LostCallback>,
        app_name: Option<String>,
    ) -> Shared {
        let uuid = uuid::Uuid::new_v4();
        let mut short_id = [0; 8];
        short_id.copy_from_slice(&uuid.as_bytes()[..8]);
        Shared {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            uuid: uuid.to_string(),
            short_id,
            app_name,
            started: SystemTime::now(),
            announced: AtomicBool::new(false),
            events: router.counters().events.clone(),
            server,
            watchdog: Watchdog::new(Arc::clone(&router), on_lock_lost),
            router,
            watchdog_timeout,
            max_hold,
            latch_ttl_ms: duration_ms(response_timeout).saturating_mul(4).max(1000),
            response_timeout,
            grants: Grants::default(),
        }
    }

    /// Has the watchdog publish this client's process key, once: called on
    /// every acquisition (one atomic load after the first).
    pub(crate) fn announce(&self) {
        if self.announced.load(Ordering::Relaxed) || self.announced.swap(true, Ordering::Relaxed) {
            return;
        }
        self.watchdog.announce(Announce::new(
            scripts::process_key_name(&scripts::hex(&self.short_id)),
            &self.uuid,
            self.app_name.as_deref(),
            self.started,
            duration_ms(self.watchdog_timeout),
        ));
    }

    /// `<client-uuid>:<thread-id>` for the current thread.
    pub(crate) fn owner_field(&self) -> String {
        let mut field = String::with_capacity(self.uuid.len() + 21);
        field.push_str(&self.uuid);
        field.push(':');
        field.push_str(itoa::Buffer::new().format(thread_id()));
        field
    }

    /// `<client-uuid>:<id>` for a new owned acquisition: an id no thread
    /// and no other acquisition of this process has.
    pub(crate) fn owned_field(&self) -> String {
        format!(
            "{}:{}",
            self.uuid,
            NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A number unique to this client, for request ids.
    pub(crate) fn next_request(&self) -> u64 {
        self.router.next_request()
    }

    /// Settles `request` in the background, and until then has this
    /// thread's next operations on its lock mark it done first.
    pub(crate) fn settle_later(&self, request: Unsettled) {
        let request = Arc::new(request);
        add_pending(self.id, &request);
        self.watchdog.settle_later(request);
    }

    /// Settles a request of an owned acquisition in the background: its
    /// owner makes no later operation that could mark it done first.
    pub(crate) fn settle_owned_later(&self, request: Unsettled) {
        self.watchdog.settle_later(Arc::new(request));
    }

    /// Has this thread's next operations on its lock mark `request` done
    /// first, but leaves it unsettled until
    /// [`settle_deferred`](Shared::settle_deferred): a fair lock's waiter
    /// whose try failed tries again within the same wait, and that try
    /// settles it (an undo run meanwhile would take the waiter out of the
    /// line).
    pub(crate) fn defer_settle(&self, request: Unsettled) {
        request.defer();
        add_pending(self.id, &Arc::new(request));
    }

    /// Settles in the background the requests of this thread under `slot`
    /// whose settling was deferred ([`defer_settle`](Shared::defer_settle))
    /// and that no later operation settled: the wait they belonged to ended
    /// without the lock.
    pub(crate) fn settle_deferred(&self, slot: &str) {
        let (_, pending) = owner_state(self.id, slot);
        for request in pending {
            if request.take_deferred() && !request.is_done() {
                self.watchdog.settle_later(request);
            }
        }
    }
}

/// The longest name of a lock, semaphore or latch: 512 MiB, Redis's
/// default `proto-max-bulk-len`.
pub(crate) const MAX_NAME_LEN: usize = 512 * 1024 * 1024;

/// Refuses a name longer than [`MAX_NAME_LEN`]: what Redis takes by default,
/// and what keeps a hold's texts (a few copies of its name) within their
/// 32-bit offsets.
fn check_name_len(what: &str, len: usize) -> Result<()> {
    if len > MAX_NAME_LEN {
        return Err(Error::invalid(format!(
            "{what} name must be at most 512 MiB, got {len} bytes"
        )));
    }
    Ok(())
}

/// Checks the name of a `what` (lock, semaphore, ...) laid out as Redisson
/// does: not empty, at most [`MAX_NAME_LEN`], and on a cluster, its keys
/// and channel in one slot.
pub(crate) fn check_name(what: &str, name: &str, router: &Router) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(format!("{what} name must not be empty")));
    }
    check_name_len(what, name.len())?;
    if router.is_cluster() && !scripts::same_slot(name) {
        // Redisson's layout puts such a name's channel in another slot:
        // every script would fail with CROSSSLOT.
        return Err(Error::invalid(format!(
            "{what} name {name:?} would span cluster slots: complete its hash tag (e.g. \
             \"a{{b}}\") or leave braces out"
        )));
    }
    Ok(())
}

/// The largest count accepted (permits, a latch's count, a change of
/// either): 2^53, the largest whole number a Lua script counts exactly.
pub(crate) const MAX_COUNT: u64 = 1 << 53;

/// Checks a count (`what` names it): at most [`MAX_COUNT`].
pub(crate) fn check_count(what: &str, n: u64) -> Result<()> {
    if n > MAX_COUNT {
        return Err(Error::invalid(format!(
            "{what} must be at most 2^53, got {n}"
        )));
    }
    Ok(())
}

/// Checks a cap on holding (`max_hold`): at least 1 ms, at most
/// [`MAX_LEASE`].
pub(crate) fn check_max_hold(max_hold: Option<Duration>) -> Result<()> {
    match max_hold {
        Some(d) if d < Duration::from_millis(1) || d > MAX_LEASE => Err(Error::invalid(format!(
            "max_hold must be between 1ms and MAX_LEASE (2^53 ms), got {d:?}"
        ))),
        _ => Ok(()),
    }
}

/// Checks a lease-like duration: at least 1 ms, at most [`MAX_LEASE`].
pub(crate) fn check_lease(what: &str, d: Duration) -> Result<()> {
    if d < Duration::from_millis(1) {
        return Err(Error::invalid(format!(
            "{what} must be at least 1ms, got {d:?}"
        )));
    }
    if d > MAX_LEASE {
        return Err(Error::invalid(format!(
            "{what} must be at most MAX_LEASE (2^53 ms), got {d:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_name_len, MAX_NAME_LEN};

    #[test]
    fn a_name_past_redis_default_bulk_length_is_refused() {
        assert!(check_name_len("lock", 1).is_ok());
        assert!(check_name_len("lock", MAX_NAME_LEN).is_ok());
        let err = check_name_len("lock", MAX_NAME_LEN + 1).unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        assert!(
            err.to_string()
                .contains("lock name must be at most 512 MiB"),
            "{err}"
        );
    }
}
