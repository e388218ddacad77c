//! One acquisition of a lock ([`LockGuard`]) and the state all acquisitions
//! of one owner share ([`Hold`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::client::{Client, Shared};
use crate::connection::Synced;
use crate::error::{Error, Result};
use crate::scripts::{self, Kind, LockRef};
use crate::time::deadline;

/// What this process knows of a hold's lease on Redis.
///
/// Every request that sets the lease (an acquisition, a re-entry, a partial
/// release, the undo of a lost acquisition) writes a new *generation* (its
/// request id) next to the owner field, and first lowers `valid_until` to
/// what it could set: a request that may have run bounds the hold even when
/// its reply is lost. While such a request is in flight or unsettled
/// (`busy`), nothing raises the bound; a renewal raises it only if no such
/// request began between its sending and its reply (`epoch`), and Redis
/// applies a renewal only if the generation it carries is still the one in
/// Redis, so a renewal taken for an earlier state of the hold (or for an
/// earlier hold of the same owner) can neither extend the lease nor the
/// bound.
struct LeaseState {
    /// The lease is known to hold until then.
    valid_until: Instant,
    /// Bumped when a lease-setting request begins or is confirmed.
    epoch: u64,
    /// Lease-setting requests in flight or whose reply was lost and that are
    /// not settled yet.
    busy: u32,
    /// The generation Redis holds for this hold, as far as known.
    gen: Option<u64>,
}

/// What a renewal of a hold carries: the generation it expects, and the
/// epoch it was taken in (`None` if a lease-setting request was under way:
/// then its reply cannot raise the bound).
#[derive(Clone, Copy)]
pub(crate) struct RenewToken {
    pub(crate) epoch: Option<u64>,
    pub(crate) gen: Option<u64>,
}

/// Where a hold stands in the watchdog's schedule; read and written only
/// under the watchdog's lock. One hold has at most one entry, always.
pub(crate) enum Sched {
    /// Not scheduled.
    Idle,
    /// In the schedule under this key.
    Queued((Instant, u64)),
    /// Taken for a renewal that is under way; the renewal schedules it again
    /// if it is still watched, with these terms if `watch` gave new ones.
    InFlight(Option<(Duration, u64)>),
}

/// What one owner (this thread of this client) holds of one lock: the
/// re-entries share it, and so does the watchdog's entry for it.
pub(crate) struct Hold {
    pub(crate) client_id: u64,
    pub(crate) name: String,
    /// The release channel (`scripts::channel_name`).
    pub(crate) channel: String,
    pub(crate) field: String,
    pub(crate) kind: Kind,
    /// A read hold's key prefix (`LockRef::hold_prefix`), else empty.
    pub(crate) prefix: String,
    /// Its key among this thread's holds ([`slot_key`]).
    slot: String,
    /// Guards alive for this owner; changed only by the owning thread.
    count: AtomicU32,
    /// Of those, the guards taken without a lease (renewed by the watchdog).
    watched: AtomicU32,
    /// The watchdog's lease, while watched guards remain.
    watch_lease_ms: AtomicU64,
    /// The lease of the latest acquisition with an explicit lease: what bounds
    /// the hold again once no watched guard remains.
    explicit_lease_ms: AtomicU64,
    lease: Mutex<LeaseState>,
    lost: AtomicBool,
    released: AtomicBool,
    /// A release was sent for this hold after it was found lost.
    lost_release_sent: AtomicBool,
    pub(crate) sched: Mutex<Sched>,
    /// Told once when the hold is reported lost (a RedLock or MultiLock
    /// guard counting its members).
    lost_listeners: Mutex<Vec<Weak<dyn LostListener>>>,
}

/// Told when a hold is reported lost (see [`Hold::on_lost`]).
pub(crate) trait LostListener: Send + Sync {
    fn lost(&self);
}

impl Hold {
    /// A hold whose first acquisition, request `gen` sent at `sent`, set
    /// `lease_ms`.
    pub(crate) fn new(
        client_id: u64,
        lock: LockRef<'_>,
        sent: Instant,
        lease_ms: u64,
        gen: u64,
    ) -> Hold {
        Hold {
            client_id,
            name: lock.name.to_owned(),
            channel: lock.channel.to_owned(),
            field: lock.field.to_owned(),
            kind: lock.kind,
            prefix: lock.hold_prefix(),
            slot: slot_key(lock.name, lock.kind),
            count: AtomicU32::new(0),
            watched: AtomicU32::new(0),
            watch_lease_ms: AtomicU64::new(0),
            explicit_lease_ms: AtomicU64::new(0),
            lease: Mutex::new(LeaseState {
                valid_until: deadline(sent, lease_ms),
                epoch: 0,
                busy: 0,
                gen: Some(gen),
            }),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            lost_release_sent: AtomicBool::new(false),
            sched: Mutex::new(Sched::Idle),
            lost_listeners: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn lock_ref(&self) -> LockRef<'_> {
        LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &self.field,
            kind: self.kind,
        }
    }

    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    /// Records a guard taken with `lease_ms` (its request confirmed);
    /// `true` if it is the first watched guard (the caller starts renewal).
    pub(crate) fn acquired(&self, lease_ms: u64, watched: bool) -> bool {
        self.count.fetch_add(1, Ordering::AcqRel);
        if watched {
            self.watch_lease_ms.store(lease_ms, Ordering::Release);
            self.watched.fetch_add(1, Ordering::AcqRel) == 0
        } else {
            self.explicit_lease_ms.store(lease_ms, Ordering::Release);
            false
        }
    }

    /// The lease the hold's guards need now: the watchdog's while a watched
    /// guard remains, else that of the latest explicit-lease acquisition.
    pub(crate) fn needed_lease_ms(&self) -> u64 {
        if self.watched.load(Ordering::Acquire) > 0 {
            self.watch_lease_ms.load(Ordering::Acquire)
        } else {
            self.explicit_lease_ms.load(Ordering::Acquire)
        }
    }

    /// The lease a re-entry with `lease_ms` sets: never shorter than what
    /// the watched guards need (they are renewed, not bounded).
    pub(crate) fn reentry_lease_ms(&self, lease_ms: u64, watched: bool) -> u64 {
        if !watched && self.watched.load(Ordering::Acquire) > 0 {
            lease_ms.max(self.watch_lease_ms.load(Ordering::Acquire))
        } else {
            lease_ms
        }
    }

    /// Renewed by the watchdog: active with at least one watched guard.
    pub(crate) fn is_watched(&self) -> bool {
        self.is_active() && self.watched.load(Ordering::Acquire) > 0
    }

    /// A request that sets the lease to `lease_ms` is about to be sent at
    /// `sent`: whether or not a reply comes, the lease may end then. Returns
    /// the request's ticket.
    pub(crate) fn begin(&self, sent: Instant, lease_ms: u64) -> u64 {
        let mut st = self.lease.lock();
        st.epoch += 1;
        st.busy += 1;
        st.valid_until = st.valid_until.min(deadline(sent, lease_ms));
        st.epoch
    }

    /// The owner's request begun at `sent` ran and set `lease_ms` with
    /// generation `gen`. The owner's requests come one at a time and make
    /// every earlier one of theirs (and any undo of it) a no-op, so what this
    /// one set is what Redis has.
    pub(crate) fn confirmed(&self, sent: Instant, lease_ms: u64, gen: u64) {
        let mut st = self.lease.lock();
        st.epoch += 1;
        st.busy = st.busy.saturating_sub(1);
        st.valid_until = deadline(sent, lease_ms);
        st.gen = Some(gen);
    }

    /// A request begun with [`begin`](Hold::begin) did not run, or ran
    /// without writing: the bound stays as it is.
    pub(crate) fn aborted(&self) {
        let mut st = self.lease.lock();
        st.busy = st.busy.saturating_sub(1);
    }

    /// The current epoch, for [`settled`](Hold::settled).
    pub(crate) fn epoch(&self) -> u64 {
        self.lease.lock().epoch
    }

    /// An undo sent at `sent` in epoch `epoch` re-applied `lease_ms` with
    /// generation `gen`; it counts only if no request of the owner began
    /// since (the owner's requests make an undo that runs after them a
    /// no-op, and override one that ran before).
    pub(crate) fn settled(&self, epoch: u64, sent: Instant, lease_ms: u64, gen: u64) {
        let mut st = self.lease.lock();
        if st.epoch == epoch {
            st.epoch += 1;
            st.valid_until = deadline(sent, lease_ms);
            st.gen = Some(gen);
        }
    }

    /// A request of this hold whose reply was lost is settled now.
    pub(crate) fn unbusy(&self) {
        self.aborted();
    }

    /// What a renewal sent now carries.
    pub(crate) fn renew_token(&self) -> RenewToken {
        let st = self.lease.lock();
        RenewToken {
            epoch: (st.busy == 0).then_some(st.epoch),
            gen: st.gen,
        }
    }

    /// A renewal taken with `token` and sent at `sent` extended the lease by
    /// `lease_ms`: raises the bound unless a lease-setting request began
    /// since. `true` if it did.
    pub(crate) fn renewed(&self, token: RenewToken, sent: Instant, lease_ms: u64) -> bool {
        let mut st = self.lease.lock();
        if st.busy == 0 && token.epoch == Some(st.epoch) {
            st.valid_until = st.valid_until.max(deadline(sent, lease_ms));
            true
        } else {
            false
        }
    }

    /// A renewal taken with `token` found generation `gen` in Redis: if no
    /// lease-setting request of this hold was under way or began since, every
    /// one of them has run or been made a no-op, so `gen` is this hold's
    /// (written by an undo whose outcome was not known here) and is taken.
    /// `true` if it was.
    pub(crate) fn adopt(&self, token: RenewToken, gen: Option<u64>) -> bool {
        let mut st = self.lease.lock();
        if st.busy == 0 && token.epoch == Some(st.epoch) {
            st.gen = gen;
            true
        } else {
            false
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.lease.lock().valid_until
    }

    /// Marks the hold lost; `true` only for the call that changed it, and
    /// never for a hold that was released.
    /// Tells `listener` (while it lives) when the hold is reported lost.
    pub(crate) fn on_lost(&self, listener: Weak<dyn LostListener>) {
        let mut listeners = self.lost_listeners.lock();
        listeners.retain(|l| l.strong_count() > 0);
        listeners.push(listener);
    }

    /// Tells the listeners (see [`on_lost`](Hold::on_lost)); called once the
    /// loss is reported.
    pub(crate) fn tell_lost(&self) {
        let listeners = std::mem::take(&mut *self.lost_listeners.lock());
        for l in listeners.iter().filter_map(Weak::upgrade) {
            l.lost();
        }
    }

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
    /// The lock's kind (`kind` is what the request was).
    pub(crate) lock_kind: Kind,
    /// Its key among this thread's holds ([`slot_key`]).
    slot: String,
    /// The request's key: an acquire's cancel marker or a release's latch.
    /// Set with a TTL of [`scripts::LATE_REQUEST_WINDOW_MS`].
    pub(crate) key: String,
    pub(crate) kind: Lost,
    /// The hold whose lease the request may have set (a re-entry or a
    /// partial release): it stays busy until the request is settled.
    pub(crate) hold: Option<Weak<Hold>>,
    /// When the request was sent.
    pub(crate) sent: Instant,
    done: AtomicBool,
    /// Not handed to the watchdog yet (see [`defer_settle`]).
    deferred: AtomicBool,
}

/// What an [`Unsettled`] request was.
pub(crate) enum Lost {
    /// An acquisition, sent while the owner had `held` holds: undo it, and
    /// re-apply `lease_ms` (what the remaining holds need) if any remain.
    Acquire { held: u32, lease_ms: u64 },
    /// A release leaving `left` holds: complete it (same latch, so it runs
    /// at most once).
    Release { left: u32, lease_ms: u64 },
    /// What one semaphore acquisition holds (`book`: the semaphore's
    /// records, with the record under `field`; or, with `permit`, an
    /// expirable semaphore's set of permits out and the permit's id):
    /// return it (`key` is the release's latch, or for `undo` the
    /// acquisition's cancel marker). `undo` (an acquisition whose reply was
    /// lost) first sets the marker, so that a late copy of the acquisition
    /// does nothing.
    Permits {
        book: String,
        permit: Option<[u8; 16]>,
        undo: bool,
    },
    /// A fair lock's waiter (`field`) that gave up: take it out of the line
    /// (`key` is the request's marker, which the owner's next operation on
    /// the lock sets first, so that a late leave spares a later place).
    Leave,
}

impl Unsettled {
    pub(crate) fn new(
        lock: LockRef<'_>,
        key: String,
        kind: Lost,
        hold: Option<&Arc<Hold>>,
        sent: Instant,
    ) -> Unsettled {
        Unsettled {
            name: lock.name.to_owned(),
            channel: lock.channel.to_owned(),
            field: lock.field.to_owned(),
            lock_kind: lock.kind,
            slot: slot_key(lock.name, lock.kind),
            key,
            kind,
            hold: hold.map(Arc::downgrade),
            sent,
            done: AtomicBool::new(false),
            deferred: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// For semaphore permits: returns them (one script call on `conn`;
    /// `latch_ms`: how long its latch lives). `None` for another kind.
    pub(crate) fn return_permits(
        &self,
        conn: &mut crate::transport::Connection,
        latch_ms: u64,
        publish: &str,
    ) -> Option<redis::RedisResult<i64>> {
        let Lost::Permits { book, permit, undo } = &self.kind else {
            return None;
        };
        let held = match permit {
            Some(id) => scripts::Held::Permit(id),
            None => scripts::Held::Record(&self.field),
        };
        let sem = scripts::SemaphoreRef {
            name: &self.name,
            channel: &self.channel,
            book,
        };
        // A release's latch is its key; an undo's is its own, next to the
        // acquisition's cancel marker (its key).
        let latch = if *undo {
            format!("{}:undo", self.key)
        } else {
            self.key.clone()
        };
        let marker = undo.then_some(self.key.as_str());
        Some(scripts::return_permits(
            conn, sem, held, &latch, marker, latch_ms, publish,
        ))
    }

    /// The request has run once, or can no longer run: its hold is no
    /// longer busy with it.
    pub(crate) fn set_done(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            if let Some(hold) = self.hold.as_ref().and_then(Weak::upgrade) {
                hold.unbusy();
            }
        }
    }

    /// The hold the request belongs to, while it is still held.
    pub(crate) fn active_hold(&self) -> Option<Arc<Hold>> {
        self.hold
            .as_ref()
            .and_then(Weak::upgrade)
            .filter(|h| h.is_active())
    }

    pub(crate) fn lock_ref(&self) -> LockRef<'_> {
        LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &self.field,
            kind: self.lock_kind,
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

/// Has this thread's next operations on its lock mark `request` done first,
/// but leaves it unsettled until [`settle_deferred`]: a fair lock's waiter
/// whose try failed tries again within the same wait, and that try settles
/// it (an undo run meanwhile would take the waiter out of the line).
pub(crate) fn defer_settle(shared: &Shared, request: Unsettled) {
    request.deferred.store(true, Ordering::Release);
    add_pending(shared.id, &Arc::new(request));
}

/// Settles in the background the requests of this thread under `slot`
/// whose settling was deferred ([`defer_settle`]) and that no later
/// operation settled: the wait they belonged to ended without the lock.
pub(crate) fn settle_deferred(shared: &Shared, slot: &str) {
    let (_, pending) = owner_state(shared.id, slot);
    for request in pending {
        if request.deferred.swap(false, Ordering::AcqRel) && !request.is_done() {
            shared.watchdog.settle_later(request);
        }
    }
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

/// The key of `name`'s holds of `kind` among a thread's holds: the name, or
/// for a write lock the name marked as such (a thread may hold the read and
/// the write lock of one name at once, as two holds).
pub(crate) fn slot_key(name: &str, kind: Kind) -> String {
    if kind == Kind::Write {
        format!("{name}\0write")
    } else {
        name.to_owned()
    }
}

/// The active hold this thread has under `slot` ([`slot_key`]) through
/// client `client_id`, and its requests that are not settled yet.
pub(crate) fn owner_state(client_id: u64, slot: &str) -> (Option<Arc<Hold>>, Vec<Arc<Unsettled>>) {
    with_slot(client_id, slot, |slot| match slot {
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
    with_slot_or_insert(hold.client_id, &hold.slot, |slot| {
        slot.hold = Some(Arc::clone(hold));
    });
}

fn remove_hold(hold: &Arc<Hold>) {
    with_slot(hold.client_id, &hold.slot, |slot| {
        if let Some(slot) = slot {
            if slot.hold.as_ref().is_some_and(|x| Arc::ptr_eq(x, hold)) {
                slot.hold = None;
            }
        }
    });
    prune(hold.client_id, &hold.slot);
}

/// `false` if this thread holds a newer hold of the same lock than `hold`
/// (taken after `hold` was lost): that one owns the owner field now.
fn is_latest(hold: &Arc<Hold>) -> bool {
    with_slot(hold.client_id, &hold.slot, |slot| {
        slot.and_then(|s| s.hold.as_ref())
            .is_none_or(|x| Arc::ptr_eq(x, hold))
    })
    .unwrap_or(true)
}

fn add_pending(client_id: u64, cancel: &Arc<Unsettled>) {
    with_slot_or_insert(client_id, &cancel.slot, |slot| {
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
        with_slot(client_id, &first.slot, |slot| {
            if let Some(slot) = slot {
                slot.pending.retain(|p| !p.is_done());
            }
        });
        prune(client_id, &first.slot);
    }
}

/// A held lock. Dropping it releases one hold (the lock is free once every
/// re-entry of this thread is released); [`unlock`](LockGuard::unlock) does
/// the same and reports failures. Either way the release is a blocking round
/// trip to Redis (bounded by the response timeout); a release that fails on
/// drop is logged at `warn` and completed in the background once Redis
/// answers, and the lease bounds the lock meanwhile.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// # fn write_order() {}
/// let guard = client.lock("orders:42").lock()?;
/// guard.ensure_held()?;          // no round trip: is the lease still ours?
/// write_order();
/// if guard.is_lost() {
///     // the write above may have raced another holder: compensate
/// }
/// guard.unlock()?;               // or just drop it
/// # Ok(()) }
/// ```
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
    /// A fenced lock's token for this acquisition.
    token: Option<u64>,
    done: bool,
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

impl LockGuard {
    pub(crate) fn new(
        client: Client,
        hold: Arc<Hold>,
        watched: bool,
        token: Option<u64>,
    ) -> LockGuard {
        LockGuard {
            client,
            hold,
            watched,
            token,
            done: false,
            _not_send: PhantomData,
        }
    }

    /// The fencing token of this acquisition, for a lock from
    /// [`Client::fenced_lock`](crate::Client::fenced_lock) (`None` for a
    /// plain lock): it grows with every acquisition of the lock, re-entries
    /// included, by any client (Redisson's `RFencedLock` too). Pass it with
    /// each write to the protected resource, and have the resource refuse a
    /// token lower than the highest it has seen: a holder that lost the lock
    /// without knowing it (a pause longer than its lease) is then refused.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("ledger").lock()?;
    /// let token = guard.token().expect("a fenced lock has a token");
    /// // storage.write_if_newer(token, entry)?;
    /// # let _ = token;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn token(&self) -> Option<u64> {
        self.token
    }

    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// `true` once this process knows the lock is no longer held: the
    /// watchdog found it gone or could not renew it before its lease ran out,
    /// or its lease has passed without a confirmed renewal.
    #[must_use]
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
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// How many guards this thread holds on this lock (re-entries included).
    #[must_use]
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
        match self.begin_release() {
            Release::Done(r) => r,
            Release::Send(step) => {
                let reply = self.send_release(&step.request);
                self.end_release(step, reply)
            }
        }
    }

    /// Tells `listener` (while it lives) if this guard's hold is reported
    /// lost.
    pub(crate) fn on_lost(&self, listener: Weak<dyn LostListener>) {
        self.hold.on_lost(listener);
    }

    /// The client the guard belongs to.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The part of a release before its round trip: the guard's
    /// bookkeeping, and either the outcome (nothing to send) or the request
    /// to send. The guard is done from here on (dropping it sends nothing).
    pub(crate) fn begin_release(&mut self) -> Release {
        self.done = true;
        let hold = Arc::clone(&self.hold);
        let lost = || Error::LockLost {
            name: hold.name.clone(),
        };
        // Past its bound the hold may have been lost unnoticed: release what
        // may still be held, but do not report success.
        let expired = Instant::now() >= hold.valid_until();
        let left = hold.count.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        if self.watched && hold.watched.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last watched guard: the watchdog stops, and what is left
            // (explicit-lease guards) is bounded by its own lease again.
            self.client.shared.watchdog.unwatch(&hold);
        }
        if hold.is_lost() {
            if left == 0 {
                remove_hold(&hold);
            }
            // The hold was declared lost, but Redis may still hold it (the
            // renewals ran though their replies were lost): the first guard
            // to go releases whatever this owner may still hold, unless the
            // thread has taken the lock again since (that hold owns it now).
            if !hold.lost_release_sent.swap(true, Ordering::AcqRel) && is_latest(&hold) {
                let request = self.prepare_release(&hold, 0, 0);
                let reply = self.send_release(&request);
                match self.finish_release(request, reply) {
                    Ok(Some(_)) => log::info!(
                        "redlease: lock {:?} was found lost but was still held in redis; \
                         released it",
                        hold.name
                    ),
                    Ok(None) => {}
                    Err(e) => log::debug!(
                        "redlease: releasing lost lock {:?} failed ({e}); it is completed in \
                         the background",
                        hold.name
                    ),
                }
            }
            return Release::Done(Err(lost()));
        }
        if left == 0 {
            // Before the script goes out: the watchdog never renews it again,
            // and a late renewal result cannot mark it lost.
            hold.released.store(true, Ordering::Release);
            remove_hold(&hold);
            let request = self.prepare_release(&hold, 0, 0);
            return Release::Send(ReleaseStep { request, expired });
        }
        let lease_ms = hold.needed_lease_ms();
        let request = self.prepare_release(&hold, left, lease_ms);
        Release::Send(ReleaseStep { request, expired })
    }

    /// The part of a release after its round trip: what `reply` means.
    pub(crate) fn end_release(
        &self,
        step: ReleaseStep,
        reply: Result<(Option<i64>, Synced)>,
    ) -> Result<()> {
        let hold = &self.hold;
        let lost = || Error::LockLost {
            name: hold.name.clone(),
        };
        let partial = step.request.left > 0;
        match self.finish_release(step.request, reply)? {
            Some(_) if !step.expired => Ok(()),
            Some(_) => Err(lost()),
            None if !partial => Err(lost()),
            None => {
                // Gone on the server: the other guards of this owner are lost too.
                if hold.mark_lost() {
                    self.client
                        .shared
                        .watchdog
                        .report_lost(hold, "its key or owner field is gone from redis");
                }
                remove_hold(hold);
                Err(lost())
            }
        }
    }

    /// A release leaving `left` holds (re-applying `lease_ms` if any
    /// remain), made ready to send; a partial release lowers the hold's
    /// bound to what it may set.
    fn prepare_release(&self, hold: &Arc<Hold>, left: u32, lease_ms: u64) -> ReleaseRequest {
        let shared = &self.client.shared;
        let n = shared.next_request();
        let latch = scripts::unlock_latch_name(&hold.name, &hold.field, n);
        let (_, pending) = owner_state(hold.client_id, &hold.slot);
        let sent = Instant::now();
        if left > 0 {
            hold.begin(sent, lease_ms);
        }
        ReleaseRequest {
            n,
            latch,
            pending,
            sent,
            left,
            lease_ms,
        }
    }

    /// The release script command of `r` (EVALSHA), for a round trip
    /// shared with other requests.
    pub(crate) fn release_command(&self, r: &ReleaseRequest) -> redis::Cmd {
        self.release_script(r).command()
    }

    /// The release script's request for `r`.
    fn release_script<'a>(&'a self, r: &'a ReleaseRequest) -> scripts::Release<'a> {
        let shared = &self.client.shared;
        scripts::Release {
            lock: self.hold.lock_ref(),
            latch: &r.latch,
            unsettled: keys(&r.pending),
            left: r.left,
            lease_ms: r.lease_ms,
            latch_ms: shared.latch_ttl_ms,
            gen: r.n,
            publish: shared.router.publish_command(),
            prefix: &self.hold.prefix,
        }
    }

    /// Sends `r` on its own (one round trip, routed).
    pub(crate) fn send_release(&self, r: &ReleaseRequest) -> Result<(Option<i64>, Synced)> {
        let shared = &self.client.shared;
        let hold = &self.hold;
        // A release fewer replicas confirmed is still done on the master: at
        // worst a failover brings the lock back until its lease runs out.
        let script = self.release_script(r);
        shared
            .router
            .run_synced(&hold.name, |conn| script.run(conn))
    }

    /// Records the outcome of release `r` on the hold. A release that did
    /// not complete for a passing reason (no reply, no connection, a refusal
    /// such as BUSY) is completed in the background as soon as Redis takes
    /// it.
    fn finish_release(
        &self,
        r: ReleaseRequest,
        reply: Result<(Option<i64>, Synced)>,
    ) -> Result<Option<i64>> {
        let shared = &self.client.shared;
        let hold = &self.hold;
        let partial = r.left > 0;
        match reply.map(|(reply, _)| reply) {
            Ok(reply) => {
                settle(hold.client_id, &r.pending);
                if partial {
                    match reply {
                        Some(_) => hold.confirmed(r.sent, r.lease_ms, r.n),
                        None => hold.aborted(),
                    }
                }
                Ok(reply)
            }
            Err(e) => {
                if e.needs_settle() {
                    // Not sent, or it may have run, or may run later, or
                    // Redis refused it for now: complete it in the background
                    // (the latch makes it run once).
                    let kind = Lost::Release {
                        left: r.left,
                        lease_ms: r.lease_ms,
                    };
                    let owner = partial.then_some(hold);
                    settle_later(
                        shared,
                        Unsettled::new(hold.lock_ref(), r.latch, kind, owner, r.sent),
                    );
                } else if partial {
                    hold.aborted();
                }
                Err(e)
            }
        }
    }
}

/// A release request made ready (see [`LockGuard::begin_release`]).
pub(crate) struct ReleaseRequest {
    n: u64,
    latch: String,
    pending: Vec<Arc<Unsettled>>,
    sent: Instant,
    /// Holds left after it (0: a full release).
    left: u32,
    lease_ms: u64,
}

/// A release under way: its request, and whether the hold's bound had
/// passed when it began.
pub(crate) struct ReleaseStep {
    pub(crate) request: ReleaseRequest,
    expired: bool,
}

/// What [`LockGuard::begin_release`] found.
pub(crate) enum Release {
    /// Nothing (more) to send: the outcome.
    Done(Result<()>),
    /// A request to send, then [`LockGuard::end_release`].
    Send(ReleaseStep),
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
