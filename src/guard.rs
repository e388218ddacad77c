//! One acquisition of a lock ([`LockGuard`]) and the state all acquisitions
//! of one owner share ([`Hold`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crate::client::{Client, Shared};
use crate::error::{Error, Result};
use crate::scripts::{self, LockRef};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// `t` as nanoseconds since a process-wide epoch (saturating), for atomics.
fn to_nanos(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(*EPOCH).as_nanos()).unwrap_or(u64::MAX)
}

fn deadline_nanos(sent: Instant, lease_ms: u64) -> u64 {
    to_nanos(sent).saturating_add(lease_ms.saturating_mul(1_000_000))
}

fn from_nanos(n: u64) -> Instant {
    EPOCH
        .checked_add(Duration::from_nanos(n))
        .unwrap_or_else(|| *EPOCH + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// What one owner (this thread of this client) holds of one lock: the
/// re-entries share it, and so does the watchdog's entry for it.
pub(crate) struct Hold {
    pub(crate) client_id: u64,
    pub(crate) name: String,
    /// The release channel (`scripts::channel_name`).
    pub(crate) channel: String,
    pub(crate) field: String,
    /// Guards alive for this owner; changed only by the owning thread.
    count: AtomicU32,
    /// Of those, the guards taken without a lease (renewed by the watchdog).
    watched: AtomicU32,
    /// The watchdog's lease, while watched guards remain.
    watch_lease_ms: AtomicU64,
    /// The lease of the latest acquisition with an explicit lease: what bounds
    /// the hold again once no watched guard remains.
    explicit_lease_ms: AtomicU64,
    /// Last confirmed acquisition or renewal (the time it was sent) + lease.
    valid_until: AtomicU64,
    lost: AtomicBool,
    released: AtomicBool,
    /// The watchdog's key for this hold while it is scheduled; read and
    /// written only under the watchdog's schedule lock.
    schedule_key: parking_lot::Mutex<Option<(Instant, u64)>>,
}

impl Hold {
    pub(crate) fn new(client_id: u64, name: &str, channel: &str, field: String) -> Hold {
        Hold {
            client_id,
            name: name.to_owned(),
            channel: channel.to_owned(),
            field,
            count: AtomicU32::new(0),
            watched: AtomicU32::new(0),
            watch_lease_ms: AtomicU64::new(0),
            explicit_lease_ms: AtomicU64::new(0),
            valid_until: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            schedule_key: parking_lot::Mutex::new(None),
        }
    }

    pub(crate) fn lock_ref(&self) -> LockRef<'_> {
        LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &self.field,
        }
    }

    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    /// Records a successful acquisition sent at `sent` with `lease_ms`;
    /// `true` if it is the first watched guard (the caller starts renewal).
    pub(crate) fn acquired(&self, sent: Instant, lease_ms: u64, watched: bool) -> bool {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.leased(sent, lease_ms);
        if watched {
            self.watch_lease_ms.store(lease_ms, Ordering::Release);
            self.watched.fetch_add(1, Ordering::AcqRel) == 0
        } else {
            self.explicit_lease_ms.store(lease_ms, Ordering::Release);
            false
        }
    }

    /// Renewed by the watchdog: active with at least one watched guard.
    pub(crate) fn is_watched(&self) -> bool {
        self.is_active() && self.watched.load(Ordering::Acquire) > 0
    }

    /// Records a renewal sent at `sent`: it extended the lease to at least
    /// `lease_ms` from then.
    pub(crate) fn confirm(&self, sent: Instant, lease_ms: u64) {
        self.valid_until
            .fetch_max(deadline_nanos(sent, lease_ms), Ordering::AcqRel);
    }

    /// Records an operation sent at `sent` that set the lease to `lease_ms`
    /// (an acquisition or a partial release: PEXPIRE may shorten it, so the
    /// old bound no longer holds).
    fn leased(&self, sent: Instant, lease_ms: u64) {
        self.valid_until
            .store(deadline_nanos(sent, lease_ms), Ordering::Release);
    }

    pub(crate) fn valid_until(&self) -> Instant {
        from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// Marks the hold lost; `true` only for the call that changed it, and
    /// never for a hold that was released.
    pub(crate) fn mark_lost(&self) -> bool {
        !self.released.load(Ordering::Acquire) && !self.lost.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Still held as far as this process knows: not released, not lost.
    pub(crate) fn is_active(&self) -> bool {
        !self.released.load(Ordering::Acquire) && !self.is_lost()
    }

    pub(crate) fn set_schedule_key(&self, key: Option<(Instant, u64)>) {
        *self.schedule_key.lock() = key;
    }

    pub(crate) fn take_schedule_key(&self) -> Option<(Instant, u64)> {
        self.schedule_key.lock().take()
    }
}

/// A request whose reply was lost: it may have run, or may still run when a
/// copy held up on the network reaches Redis. The watchdog thread settles it
/// (undoes the acquisition, or completes the release, see [`Unsettled::kind`])
/// and retries until that has run once. Until it is settled, every later
/// acquire or release of the same owner on the same lock sets the request's
/// key atomically first, so a late copy finds it and does nothing, and the
/// settling can never touch a later, legitimate hold.
pub(crate) struct Unsettled {
    pub(crate) name: String,
    pub(crate) channel: String,
    pub(crate) field: String,
    /// The request's key: an acquire's cancel marker or a release's latch.
    /// Set with a TTL of [`scripts::LATE_REQUEST_WINDOW_MS`].
    pub(crate) key: String,
    pub(crate) kind: Lost,
    done: AtomicBool,
}

/// What an [`Unsettled`] request was.
pub(crate) enum Lost {
    /// An acquisition, sent while the owner had `held` holds: undo it.
    Acquire { held: u32, lease_ms: u64 },
    /// A release leaving `left` holds: complete it (same latch, so it runs
    /// at most once).
    Release { left: u32, lease_ms: u64 },
}

impl Unsettled {
    pub(crate) fn new(lock: LockRef<'_>, key: String, kind: Lost) -> Unsettled {
        Unsettled {
            name: lock.name.to_owned(),
            channel: lock.channel.to_owned(),
            field: lock.field.to_owned(),
            key,
            kind,
            done: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn set_done(&self) {
        self.done.store(true, Ordering::Release);
    }

    pub(crate) fn lock_ref(&self) -> LockRef<'_> {
        LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &self.field,
        }
    }
}

/// Settles `request` in the background, and until then has this thread's
/// next operations on its lock mark it done first.
pub(crate) fn settle_later(shared: &Shared, request: Unsettled) {
    let request = Arc::new(request);
    add_pending(shared.id, &request);
    shared.watchdog.settle_later(request);
}

/// The keys of `requests`, as the scripts take them.
pub(crate) fn keys(requests: &[Arc<Unsettled>]) -> Vec<&str> {
    requests.iter().map(|r| r.key.as_str()).collect()
}

/// What this thread has of one lock through one client.
#[derive(Default)]
struct Slot {
    hold: Option<Arc<Hold>>,
    pending: Vec<Arc<Unsettled>>,
}

thread_local! {
    /// This thread's holds: client id -> lock name -> slot. Only the owning
    /// thread re-enters or releases a hold, so no lock is needed.
    static SLOTS: RefCell<HashMap<u64, HashMap<String, Slot>>> = RefCell::new(HashMap::new());
}

fn with_slot<R>(client_id: u64, name: &str, f: impl FnOnce(Option<&mut Slot>) -> R) -> Option<R> {
    SLOTS
        .try_with(|s| {
            let mut s = s.borrow_mut();
            f(s.get_mut(&client_id).and_then(|m| m.get_mut(name)))
        })
        .ok()
}

fn with_slot_or_insert(client_id: u64, name: &str, f: impl FnOnce(&mut Slot)) {
    let _ = SLOTS.try_with(|s| {
        let mut s = s.borrow_mut();
        let m = s.entry(client_id).or_default();
        if !m.contains_key(name) {
            m.insert(name.to_owned(), Slot::default());
        }
        if let Some(slot) = m.get_mut(name) {
            f(slot);
        }
    });
}

fn prune(client_id: u64, name: &str) {
    let _ = SLOTS.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some(m) = s.get_mut(&client_id) {
            if m.get(name)
                .is_some_and(|slot| slot.hold.is_none() && slot.pending.is_empty())
            {
                m.remove(name);
            }
            if m.is_empty() {
                s.remove(&client_id);
            }
        }
    });
}

/// The active hold this thread has on `name` through client `client_id`, and
/// its requests that are not settled yet.
pub(crate) fn owner_state(client_id: u64, name: &str) -> (Option<Arc<Hold>>, Vec<Arc<Unsettled>>) {
    with_slot(client_id, name, |slot| match slot {
        None => (None, Vec::new()),
        Some(slot) => {
            slot.pending.retain(|p| !p.is_done());
            (
                slot.hold.clone().filter(|h| h.is_active()),
                slot.pending.clone(),
            )
        }
    })
    .unwrap_or_default()
}

pub(crate) fn insert_hold(hold: &Arc<Hold>) {
    with_slot_or_insert(hold.client_id, &hold.name, |slot| {
        slot.hold = Some(Arc::clone(hold));
    });
}

fn remove_hold(hold: &Arc<Hold>) {
    with_slot(hold.client_id, &hold.name, |slot| {
        if let Some(slot) = slot {
            if slot.hold.as_ref().is_some_and(|x| Arc::ptr_eq(x, hold)) {
                slot.hold = None;
            }
        }
    });
    prune(hold.client_id, &hold.name);
}

fn add_pending(client_id: u64, cancel: &Arc<Unsettled>) {
    with_slot_or_insert(client_id, &cancel.name, |slot| {
        slot.pending.push(Arc::clone(cancel));
    });
}

/// The keys of `requests` (all on one lock) are now set on Redis: late
/// copies are harmless, nothing is left to settle.
pub(crate) fn settle(client_id: u64, requests: &[Arc<Unsettled>]) {
    for r in requests {
        r.set_done();
    }
    if let Some(first) = requests.first() {
        with_slot(client_id, &first.name, |slot| {
            if let Some(slot) = slot {
                slot.pending.retain(|p| !p.is_done());
            }
        });
        prune(client_id, &first.name);
    }
}

/// A held lock. Dropping it releases one hold (the lock is free once every
/// re-entry of this thread is released); [`unlock`](LockGuard::unlock) does
/// the same and reports failures.
///
/// The guard is `!Send`: ownership is "this thread of this client", and a
/// guard moved to another thread would let two threads believe they hold the
/// lock. It is `Sync`, so scoped threads may check [`is_lost`](Self::is_lost).
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<redlease::LockGuard>();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    client: Client,
    hold: Arc<Hold>,
    /// Taken without a lease: renewed by the watchdog.
    watched: bool,
    done: bool,
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

impl LockGuard {
    pub(crate) fn new(client: Client, hold: Arc<Hold>, watched: bool) -> LockGuard {
        LockGuard {
            client,
            hold,
            watched,
            done: false,
            _not_send: PhantomData,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// `true` once this process knows the lock is no longer held: the
    /// watchdog found it gone or could not renew it before its lease ran out,
    /// or its lease has passed without a confirmed renewal.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost() || Instant::now() >= self.hold.valid_until()
    }

    /// Checks, without a round trip, that the lock is still held; call it
    /// before each side effect the lock protects.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when [`is_lost`](Self::is_lost) is true.
    pub fn ensure_held(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::LockLost {
                name: self.hold.name.clone(),
            });
        }
        Ok(())
    }

    /// Until when the lease is known to hold: the last acquisition or renewal
    /// Redis confirmed (counted from when it was sent) plus the lease.
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// How many guards this thread holds on this lock (re-entries included).
    pub fn hold_count(&self) -> u32 {
        self.hold.count()
    }

    /// Releases this hold and reports the outcome.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the lock was no longer held (lease ran out,
    /// deleted, or found lost by the watchdog); a Redis or pool error if
    /// Redis could not be reached or did not answer in time. In that case the
    /// release is completed in the background as soon as Redis answers (it
    /// is applied at most once), and the lease bounds the lock meanwhile.
    pub fn unlock(mut self) -> Result<()> {
        self.done = true;
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let hold = &self.hold;
        let lost = || Error::LockLost {
            name: hold.name.clone(),
        };
        if hold.is_lost() {
            remove_hold(hold);
            return Err(lost());
        }
        let left = hold.count.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        if left == 0 {
            // Before the script goes out: the watchdog never renews it again,
            // and a late renewal result cannot mark it lost.
            hold.released.store(true, Ordering::Release);
            remove_hold(hold);
        }
        if self.watched && hold.watched.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last watched guard: the watchdog stops, and what is left
            // (explicit-lease guards) is bounded by its own lease again.
            self.client.shared.watchdog.unwatch(hold);
        }
        let lease_ms = if hold.watched.load(Ordering::Acquire) > 0 {
            hold.watch_lease_ms.load(Ordering::Acquire)
        } else {
            hold.explicit_lease_ms.load(Ordering::Acquire)
        };
        let shared = &self.client.shared;
        let sent = Instant::now();
        let latch = scripts::unlock_latch_name(&hold.name, &hold.field, shared.next_request());
        let latch_ms = shared.latch_ttl_ms;
        let (_, pending) = owner_state(hold.client_id, &hold.name);
        let reply = shared.redis.run(|conn| {
            scripts::release(
                conn,
                hold.lock_ref(),
                &latch,
                &keys(&pending),
                left,
                lease_ms,
                latch_ms,
            )
        });
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                if e.is_connection_error() {
                    // Not sent, or it may have run, or may run later:
                    // complete it in the background as soon as Redis answers
                    // (the latch makes it run once).
                    let kind = Lost::Release { left, lease_ms };
                    settle_later(shared, Unsettled::new(hold.lock_ref(), latch, kind));
                }
                return Err(e);
            }
        };
        settle(hold.client_id, &pending);
        match reply {
            Some(_) => {
                if left > 0 {
                    hold.leased(sent, lease_ms);
                }
                Ok(())
            }
            None => {
                // Gone on the server: the other guards of this owner are lost too.
                hold.mark_lost();
                remove_hold(hold);
                Err(lost())
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.release() {
            log::warn!(
                "redlease: releasing lock {:?} on drop failed: {e}",
                self.hold.name
            );
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.hold.name)
            .field("owner", &self.hold.field)
            .field("hold_count", &self.hold.count())
            .field("lost", &self.is_lost())
            .finish()
    }
}
