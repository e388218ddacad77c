//! Events for the service that uses redlease, in the manner of r2d2's
//! `HandleEvent`: a handler set on the builder
//! ([`ClientBuilder::event_handler`](crate::ClientBuilder::event_handler))
//! is called for each acquisition, release, lost lease, renewal batch,
//! failover followed and subscriber reconnect. Without a handler nothing
//! is measured: one branch per event, no clock read.
//!
//! The handler runs on the thread the event happens on (a caller's, the
//! watchdog's, the subscriber's), outside every lock of redlease, under
//! `catch_unwind`: keep it short, and do not call redlease from it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receives redlease's events; every method does nothing by default.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use redlease::{AcquireEvent, HandleEvent};
///
/// #[derive(Default)]
/// struct SlowWaits(AtomicU64);
///
/// impl HandleEvent for SlowWaits {
///     fn handle_acquire(&self, event: AcquireEvent<'_>) {
///         if event.waited() > std::time::Duration::from_secs(1) {
///             self.0.fetch_add(1, Ordering::Relaxed);
///             log::info!("waited {:?} for {}", event.waited(), event.name());
///         }
///     }
/// }
///
/// # fn main() -> redlease::Result<()> {
/// let client = redlease::Client::builder("redis://127.0.0.1/")
///     .event_handler(SlowWaits::default())
///     .build_lazy()?;
/// # Ok(()) }
/// ```
pub trait HandleEvent: Send + Sync + 'static {
    /// A lock or permits were acquired.
    fn handle_acquire(&self, event: AcquireEvent<'_>) {
        let _ = event;
    }

    /// A guard was released (by drop or `unlock`), whatever the outcome. A
    /// guard given up with `forget` tells nothing.
    fn handle_release(&self, event: ReleaseEvent<'_>) {
        let _ = event;
    }

    /// A held lock's lease was found lost (by the watchdog, a check or the
    /// owner's next operation).
    fn handle_lost(&self, event: LostEvent<'_>) {
        let _ = event;
    }

    /// The watchdog renewed a batch of locks.
    fn handle_renewal_batch(&self, event: RenewalBatchEvent) {
        let _ = event;
    }

    /// The client followed a failover to a new master (a Sentinel group's,
    /// or a Cluster node that took over slots).
    fn handle_failover(&self, event: FailoverEvent<'_>) {
        let _ = event;
    }

    /// A subscriber connection was made again after it broke.
    fn handle_subscriber_reconnect(&self, event: ReconnectEvent<'_>) {
        let _ = event;
    }
}

/// An acquisition ([`HandleEvent::handle_acquire`]).
#[derive(Clone, Copy, Debug)]
pub struct AcquireEvent<'a> {
    kind: &'static str,
    name: &'a str,
    waited: Duration,
    had_to_wait: bool,
}

impl<'a> AcquireEvent<'a> {
    /// The kind: `lock`, `fenced-lock`, `fair-lock`, `read-lock`,
    /// `write-lock`, `semaphore` or `expirable-semaphore`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The lock's (or semaphore's) name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// How long the call took, from its start to the acquisition.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// `false` when the first try acquired it; `true` when it was busy and
    /// the caller waited.
    pub fn had_to_wait(&self) -> bool {
        self.had_to_wait
    }
}

/// A release ([`HandleEvent::handle_release`]).
#[derive(Clone, Copy, Debug)]
pub struct ReleaseEvent<'a> {
    kind: &'static str,
    name: &'a str,
    held: Duration,
    ok: bool,
}

impl<'a> ReleaseEvent<'a> {
    /// The kind (see [`AcquireEvent::kind`]).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The lock's (or semaphore's) name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// How long the guard held it: from its acquisition to its release.
    pub fn held(&self) -> Duration {
        self.held
    }

    /// `true` when the release succeeded; `false` when the lock had been
    /// lost or the release failed (it is then completed in the background
    /// or left to the lease).
    pub fn ok(&self) -> bool {
        self.ok
    }
}

/// A lost lease ([`HandleEvent::handle_lost`]).
#[derive(Clone, Copy, Debug)]
pub struct LostEvent<'a> {
    kind: &'static str,
    name: &'a str,
}

impl<'a> LostEvent<'a> {
    /// The kind (see [`AcquireEvent::kind`]).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The lock's name.
    pub fn name(&self) -> &'a str {
        self.name
    }
}

/// A renewal batch ([`HandleEvent::handle_renewal_batch`]).
#[derive(Clone, Copy, Debug)]
pub struct RenewalBatchEvent {
    locks: usize,
    round_trip: Duration,
    lost: usize,
}

impl RenewalBatchEvent {
    /// Locks in the batch.
    pub fn locks(&self) -> usize {
        self.locks
    }

    /// How long the batch's round trips took (one per node, at once).
    pub fn round_trip(&self) -> Duration {
        self.round_trip
    }

    /// Locks of the batch found lost.
    pub fn lost(&self) -> usize {
        self.lost
    }
}

/// A failover followed ([`HandleEvent::handle_failover`]).
#[derive(Clone, Copy, Debug)]
pub struct FailoverEvent<'a> {
    to: &'a str,
}

impl<'a> FailoverEvent<'a> {
    /// The new master's address.
    pub fn to(&self) -> &'a str {
        self.to
    }
}

/// A subscriber reconnected ([`HandleEvent::handle_subscriber_reconnect`]).
#[derive(Clone, Copy, Debug)]
pub struct ReconnectEvent<'a> {
    node: &'a str,
}

impl<'a> ReconnectEvent<'a> {
    /// The server it reconnected to.
    pub fn node(&self) -> &'a str {
        self.node
    }
}

/// The client's handler, if any; cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Events(Option<Arc<dyn HandleEvent>>);

impl Events {
    pub(crate) fn new(handler: Option<Arc<dyn HandleEvent>>) -> Events {
        Events(handler)
    }

    /// The time now, when a handler is set (to measure with): no clock is
    /// read without one.
    #[inline]
    pub(crate) fn start(&self) -> Option<Instant> {
        self.0.as_ref().map(|_| Instant::now())
    }

    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Calls the handler, if any, with a panic kept in.
    #[inline]
    fn call(&self, f: impl FnOnce(&dyn HandleEvent)) {
        if let Some(h) = &self.0 {
            if catch_unwind(AssertUnwindSafe(|| f(h.as_ref()))).is_err() {
                log::error!("the event handler panicked");
            }
        }
    }

    /// An acquisition of a call begun at `started` (see [`Events::start`]).
    pub(crate) fn acquired(
        &self,
        kind: &'static str,
        name: &str,
        started: Option<Instant>,
        had_to_wait: bool,
    ) {
        if let Some(t) = started {
            self.call(|h| {
                h.handle_acquire(AcquireEvent {
                    kind,
                    name,
                    waited: t.elapsed(),
                    had_to_wait,
                });
            });
        }
    }

    /// A release of what was acquired at `acquired` (see [`Events::start`]).
    pub(crate) fn released(
        &self,
        kind: &'static str,
        name: &str,
        acquired: Option<Instant>,
        ok: bool,
    ) {
        if let Some(t) = acquired {
            self.call(|h| {
                h.handle_release(ReleaseEvent {
                    kind,
                    name,
                    held: t.elapsed(),
                    ok,
                });
            });
        }
    }

    pub(crate) fn lost(&self, kind: &'static str, name: &str) {
        self.call(|h| h.handle_lost(LostEvent { kind, name }));
    }

    pub(crate) fn renewal_batch(&self, locks: usize, round_trip: Duration, lost: usize) {
        self.call(|h| {
            h.handle_renewal_batch(RenewalBatchEvent {
                locks,
                round_trip,
                lost,
            });
        });
    }

    pub(crate) fn failover(&self, to: &str) {
        self.call(|h| h.handle_failover(FailoverEvent { to }));
    }

    pub(crate) fn subscriber_reconnected(&self, node: &str) {
        self.call(|h| h.handle_subscriber_reconnect(ReconnectEvent { node }));
    }
}
