//! What one owner (a thread of a client) holds of one lock: the hold count,
//! what is known of its lease on Redis, its slot in the watchdog's schedule,
//! and who is told when it is lost. Re-entries share one [`Hold`]; the
//! watchdog's slot for it holds it too, until the hold is no longer watched.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use crate::scripts::{Kind, LockRef};
use crate::time::{bound_instant, bound_us, deadline, duration_ms};

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
///
/// A renewal sets the lease it carries from the moment it runs; it needs
/// Redis to keep a longer lease the key has (`GT`) only where one of the
/// generation's requests or renewals may have set a longer lease than its
/// own: `gen_lease` tracks the longest, so that a renewal of a hold whose
/// leases are all alike is sent without `GT` (less work for Redis).
///
/// A renewal that succeeds raises the bound without the watchdog reading
/// the hold again after its round trip: the renewal is taken as *pending*
/// in its batch, and the watchdog says when the batch is done
/// ([`Progress`]). By then every renewal of the batch that failed has been
/// taken back from its hold ([`Hold::not_renewed`]), so a pending renewal
/// whose batch is done extended the lease, and it is folded into the bound
/// when the bound is next read. A lease-setting request that begins or
/// ends before the batch is done drops the pending renewal: as before, a
/// renewal that such a request overlapped does not raise the bound. Bounds
/// are kept as whole microseconds ([`bound_us`], rounded down so that they
/// err early): 8 bytes each, and folding one in is a comparison.
struct LeaseState {
    /// The lease is known to hold until then, as a [`bound_us`] (and until
    /// `pending_until` once the pending renewal's batch is done).
    valid_until: u64,
    /// What the pending renewal extends the lease to, as a [`bound_us`].
    pending_until: u64,
    /// Bumped when a lease-setting request begins or is confirmed.
    epoch: u64,
    /// The generation Redis holds for this hold, as far as known (see
    /// [`gen`](LeaseState::gen): known while `gen_lease` is not 0; two
    /// fields, which pack tighter than an `Option<u64>` and a lease).
    gen: u64,
    /// The watchdog's record of the batches it is done with, set when the
    /// hold is first watched.
    progress: Option<Arc<Progress>>,
    /// Lease-setting requests in flight or whose reply was lost and that are
    /// not settled yet.
    busy: u32,
    /// 0 while the generation is not known; else the longest lease in ms
    /// that a request or a renewal of the generation may have set (see
    /// [`lease_code`]), `u32::MAX` when that is not known.
    gen_lease: u32,
    /// The batch of the pending renewal (0: none).
    pending_batch: u32,
    /// The hold's slot in the watchdog's schedule, plus one (0: not
    /// scheduled); read and written with the watchdog's lock held as well.
    slot: u32,
}

impl LeaseState {
    fn gen(&self) -> Option<u64> {
        (self.gen_lease != 0).then_some(self.gen)
    }

    /// The pending renewal's batch is done: it extended the lease.
    fn pending_done(&self) -> bool {
        self.pending_batch != 0
            && self
                .progress
                .as_ref()
                .is_some_and(|p| p.is_done(self.pending_batch))
    }

    /// Folds the pending renewal into the bound if its batch is done; drops
    /// it if not and `keep` is false (a lease-setting request begins or
    /// ends: it overlapped the renewal).
    fn settle_renewal(&mut self, keep: bool) {
        if self.pending_batch == 0 {
            return;
        }
        if self.pending_done() {
            self.valid_until = self.valid_until.max(self.pending_until);
            self.pending_batch = 0;
        } else if !keep {
            self.pending_batch = 0;
        }
    }

    /// Generation `gen` was written with `lease_ms` (`None`: a lease not
    /// known here).
    fn set_gen(&mut self, gen: Option<u64>, lease_ms: Option<u64>) {
        self.gen = gen.unwrap_or(0);
        self.gen_lease = match (gen, lease_ms) {
            (None, _) => 0,
            (Some(_), None) => u32::MAX,
            (Some(_), Some(ms)) => lease_code(ms),
        };
    }
}

/// A lease that a request of the generation set, as `LeaseState::gen_lease`
/// keeps it: at least 1, and `u32::MAX` (longer than any renewal's, see
/// [`Hold::take_due`]) from `u32::MAX - 1` ms (some 49 days) on, so that it
/// errs towards `GT`.
fn lease_code(lease_ms: u64) -> u32 {
    match u32::try_from(lease_ms) {
        Ok(ms) if ms < u32::MAX - 1 => ms.max(1),
        _ => u32::MAX,
    }
}

/// A renewal's lease, to compare with a generation's [`lease_code`]: at most
/// `u32::MAX - 1`, so that a lease of 49 days or more is never taken for
/// at least as long as one of the generation's.
fn renewal_code(lease_ms: u64) -> u32 {
    u32::try_from(lease_ms)
        .unwrap_or(u32::MAX)
        .min(u32::MAX - 1)
}

/// The batches a watchdog is done with: a batch is done once every renewal
/// of it that failed has been taken back from its hold (see [`LeaseState`]).
/// Batches are numbered from 1 and done in order.
#[derive(Default)]
pub(crate) struct Progress {
    done: AtomicU32,
}

impl Progress {
    /// Batch `batch` and every one before it are done.
    pub(crate) fn finish(&self, batch: u32) {
        self.done.store(batch, Ordering::Release);
    }

    /// Whether `batch` is done (numbers wrap after some four billion
    /// batches, years at the watchdog's rate).
    fn is_done(&self, batch: u32) -> bool {
        (self.done.load(Ordering::Acquire).wrapping_sub(batch) as i32) >= 0
    }
}

/// What a renewal of a hold carries: the generation it expects, and the
/// epoch it was taken in (`None` if a lease-setting request was under way:
/// then its reply cannot raise the bound).
#[derive(Clone, Copy)]
pub(crate) struct RenewToken {
    pub(crate) epoch: Option<u64>,
    pub(crate) gen: Option<u64>,
}

/// What one owner (this thread of this client) holds of one lock: the
/// re-entries share it, and so does the watchdog's slot for it.
///
/// `repr(C)`, with what the watchdog reads on every renewal first: those
/// fields share the cache lines of the `Arc`'s counts, so renewing many
/// locks touches two lines per lock rather than one per field.
#[repr(C)]
pub(crate) struct Hold {
    lease: Mutex<LeaseState>,
    lost: AtomicBool,
    released: AtomicBool,
    pub(crate) kind: Kind,
    /// `cap` is set: the watchdog reads it (a cache line further on) only
    /// then.
    pub(crate) capped: bool,
    /// Of the guards, those taken without a lease (renewed by the watchdog).
    watched: AtomicU32,
    /// The owner field's thread (or acquisition) id and `:write` suffix,
    /// when the field is `<client-uuid>:<id>[:write]` (always, for fields
    /// this client makes): the watchdog groups renewals by it without
    /// reading the field.
    pub(crate) owner: Option<(u64, bool)>,
    /// The hold's texts in one allocation (see [`Texts`]): with many locks
    /// held, one heap block per hold rather than three to five.
    texts: Texts,
    // The rest, read seldom, largest first (no padding but at the end).
    pub(crate) client_id: u64,
    /// The watchdog's lease, while watched guards remain.
    watch_lease_ms: AtomicU64,
    /// The lease of the latest acquisition with an explicit lease: what bounds
    /// the hold again once no watched guard remains.
    explicit_lease_ms: AtomicU64,
    /// Told once when the hold is reported lost (a RedLock or MultiLock
    /// guard counting its members); boxed, as most holds have none.
    lost_listeners: Mutex<LostListeners>,
    /// The hold may last until then at most (`max_hold` from its first
    /// acquisition): no request of its owner sets its lease past it.
    pub(crate) cap: Option<Instant>,
    /// Guards alive for this owner; changed only by the owning thread.
    count: AtomicU32,
    /// A release was sent for this hold after it was found lost.
    lost_release_sent: AtomicBool,
    /// Owned by its acquisition, not by a thread (`Lock::owned`): in no
    /// thread's registry of holds, never re-entered.
    pub(crate) owned: bool,
    /// A request of the hold whose reply was lost was settled: Redis may
    /// carry a generation for it that the hold did not record (a partial
    /// release completed in the background writes its own).
    settled_lost: AtomicBool,
}

/// A hold's lost-listeners: one word, as most holds have none.
#[allow(clippy::box_collection)]
type LostListeners = Option<Box<Vec<Weak<dyn LostListener>>>>;

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
        cap: Option<Instant>,
        owned: bool,
    ) -> Hold {
        Hold {
            capped: cap.is_some(),
            cap,
            owned,
            client_id,
            texts: Texts::new(lock),
            owner: owner_key(lock.field),
            kind: lock.kind,
            count: AtomicU32::new(0),
            watched: AtomicU32::new(0),
            watch_lease_ms: AtomicU64::new(0),
            explicit_lease_ms: AtomicU64::new(0),
            lease: Mutex::new(LeaseState {
                valid_until: bound_us(deadline(sent, lease_ms)),
                pending_until: 0,
                epoch: 0,
                busy: 0,
                gen,
                gen_lease: lease_code(lease_ms),
                pending_batch: 0,
                progress: None,
                slot: 0,
            }),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            lost_release_sent: AtomicBool::new(false),
            settled_lost: AtomicBool::new(false),
            lost_listeners: Mutex::new(None),
        }
    }

    /// Reads a word of each cache line (beside the `Arc`'s counts, which
    /// the caller reads) that taking the hold for a renewal, or scheduling
    /// it again, reads: the lease lock, the flags, the owner key. The
    /// watchdog does so for a run of holds before it takes their locks, so
    /// that the lines load all at once: a lock's atomic operation waits for
    /// the loads before it, and a line missed after one is missed alone.
    /// Whatever the allocation's alignment (16 bytes or more), these fields
    /// fall on every line the two passes use.
    pub(crate) fn warm(&self) -> usize {
        usize::from(self.lease.is_locked())
            ^ self.kind as usize
            ^ self.owner.map_or(0, |(id, _)| id as usize)
    }

    /// The lock's name (its key).
    pub(crate) fn name(&self) -> &str {
        self.texts.get(NAME)
    }

    /// The lock's name as a RESP bulk string (`$<len>\r\n<name>\r\n`).
    pub(crate) fn framed_name(&self) -> &[u8] {
        self.texts.framed_name()
    }

    /// The owner field.
    pub(crate) fn field(&self) -> &str {
        self.texts.get(FIELD)
    }

    /// The release channel (`scripts::channel_name`).
    pub(crate) fn channel(&self) -> &str {
        self.texts.get(CHANNEL)
    }

    /// A read hold's key prefix (`LockRef::hold_prefix`), else empty.
    pub(crate) fn prefix(&self) -> &str {
        self.texts.get(PREFIX)
    }

    /// Its key among this thread's holds ([`slot_key`]): the name but for a
    /// write lock's.
    pub(crate) fn slot(&self) -> &str {
        match self.texts.get(SLOT) {
            "" => self.name(),
            slot => slot,
        }
    }

    /// A guard of the hold (`watched`: taken without a lease) is going:
    /// the holds left, and whether it was the last watched guard (then the
    /// watchdog stops, and the explicit-lease guards left are bounded by
    /// their own lease again).
    pub(crate) fn guard_gone(&self, watched: bool) -> (u32, bool) {
        let left = self.count.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        let last_watched = watched && self.watched.fetch_sub(1, Ordering::AcqRel) == 1;
        (left, last_watched)
    }

    /// The hold's last guard is being released: the watchdog never renews
    /// it again, and a late renewal result cannot mark it lost.
    pub(crate) fn set_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    /// `true` for the first caller only: a release of whatever a hold
    /// found lost may still hold on Redis is sent once.
    pub(crate) fn take_lost_release(&self) -> bool {
        !self.lost_release_sent.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn lock_ref(&self) -> LockRef<'_> {
        LockRef {
            name: self.name(),
            channel: self.channel(),
            field: self.field(),
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

    /// `lease_ms` for a request sent at `now`, cut so that the lease ends
    /// at the hold's cap at the latest (at least 1 ms: a request past the
    /// cap leaves the hold a lease that has all but run out).
    pub(crate) fn capped_lease_ms(&self, lease_ms: u64, now: Instant) -> u64 {
        match self.cap {
            Some(cap) => lease_ms.min(duration_ms(cap.saturating_duration_since(now)).max(1)),
            None => lease_ms,
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
        st.settle_renewal(false);
        st.epoch += 1;
        st.busy += 1;
        st.valid_until = st.valid_until.min(bound_us(deadline(sent, lease_ms)));
        st.epoch
    }

    /// The owner's request begun at `sent` ran and set `lease_ms` with
    /// generation `gen`. The owner's requests come one at a time and make
    /// every earlier one of theirs (and any undo of it) a no-op, so what this
    /// one set is what Redis has.
    pub(crate) fn confirmed(&self, sent: Instant, lease_ms: u64, gen: u64) {
        let mut st = self.lease.lock();
        st.settle_renewal(false);
        st.epoch += 1;
        st.busy = st.busy.saturating_sub(1);
        st.valid_until = bound_us(deadline(sent, lease_ms));
        st.set_gen(Some(gen), Some(lease_ms));
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
            st.settle_renewal(false);
            st.epoch += 1;
            st.valid_until = bound_us(deadline(sent, lease_ms));
            st.set_gen(Some(gen), Some(lease_ms));
        }
    }

    /// The generation Redis holds for this hold, when that is certain: known,
    /// no lease-setting request of the hold in flight or unsettled, and none
    /// ever settled after a lost reply (each of those may have written one
    /// that the hold did not record).
    pub(crate) fn settled_gen(&self) -> Option<u64> {
        if self.settled_lost.load(Ordering::Acquire) {
            return None;
        }
        let st = self.lease.lock();
        if st.busy == 0 {
            st.gen()
        } else {
            None
        }
    }

    /// A request of this hold whose reply was lost is settled now.
    pub(crate) fn unbusy(&self) {
        self.settled_lost.store(true, Ordering::Release);
        self.aborted();
    }

    /// The hold's slot in the watchdog's schedule (`None`: not scheduled);
    /// call it only with the watchdog's own lock held.
    pub(crate) fn watch_slot(&self) -> Option<u32> {
        self.lease.lock().slot.checked_sub(1)
    }

    /// Records the hold's slot in the watchdog's schedule, and the
    /// watchdog's progress; only with the watchdog's own lock held.
    pub(crate) fn set_watch_slot(&self, slot: u32, progress: &Arc<Progress>) {
        let mut st = self.lease.lock();
        st.slot = slot.saturating_add(1);
        if st.progress.is_none() {
            st.progress = Some(Arc::clone(progress));
        }
    }

    /// The hold's slot in the watchdog's schedule, which it no longer has
    /// from now on (`None`: it had none); only with the watchdog's own lock
    /// held.
    pub(crate) fn take_watch_slot(&self) -> Option<u32> {
        std::mem::take(&mut self.lease.lock().slot).checked_sub(1)
    }

    /// Takes the hold for a renewal with `lease_ms` in batch `batch` (sent
    /// or not: `send`), whose success would extend the lease to `until` (a
    /// [`bound_us`]): the renewal's token, and whether the key may carry a
    /// longer lease than the renewal sets (a request or an earlier renewal of the
    /// generation set a longer one, or what it set is not known: then Redis
    /// must keep the longer one, with `GT`). A renewal sent while no
    /// lease-setting request is under way is pending (see [`LeaseState`]).
    /// `None` when the hold is not watched any more: then it is no longer
    /// scheduled either. Only with the watchdog's own lock held, and once
    /// every earlier batch is done.
    pub(crate) fn take_due(
        &self,
        lease_ms: u64,
        batch: u32,
        until: u64,
        send: bool,
    ) -> Option<(RenewToken, bool)> {
        let mut st = self.lease.lock();
        // The renewal before, if it was not folded yet.
        st.settle_renewal(true);
        // The token first: a last watched guard released after this check
        // changes the epoch (and the generation in Redis).
        let token = RenewToken {
            epoch: (st.busy == 0).then_some(st.epoch),
            gen: st.gen(),
        };
        let code = renewal_code(lease_ms);
        let keep_longer = st.gen_lease == 0 || code < st.gen_lease;
        if self.is_watched() {
            // Whether or not it runs, the renewal may set its lease under
            // the generation: a later one with a shorter lease keeps it.
            if st.gen_lease != 0 && code > st.gen_lease {
                st.gen_lease = lease_code(lease_ms);
            }
            if send && token.epoch.is_some() && until > st.valid_until {
                st.pending_batch = batch;
                st.pending_until = until;
            }
            Some((token, keep_longer))
        } else {
            st.slot = 0;
            None
        }
    }

    /// The renewal taken in the batch under way did not extend the lease
    /// (or its outcome is not known): it raises no bound. Called for each
    /// such renewal before the batch is done.
    pub(crate) fn not_renewed(&self) {
        self.lease.lock().pending_batch = 0;
    }

    /// A renewal taken with `token` found generation `gen` in Redis: if no
    /// lease-setting request of this hold was under way or began since, every
    /// one of them has run or been made a no-op, so `gen` is this hold's
    /// (written by an undo whose outcome was not known here) and is taken.
    /// `true` if it was.
    pub(crate) fn adopt(&self, token: RenewToken, gen: Option<u64>) -> bool {
        let mut st = self.lease.lock();
        if st.busy == 0 && token.epoch == Some(st.epoch) {
            // Written by a request whose lease is not known here (an undo,
            // a partial release completed in the background).
            st.set_gen(gen, None);
            true
        } else {
            false
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        let mut st = self.lease.lock();
        st.settle_renewal(true);
        bound_instant(st.valid_until)
    }

    /// Tells `listener` (while it lives) when the hold is reported lost.
    pub(crate) fn on_lost(&self, listener: Weak<dyn LostListener>) {
        let mut listeners = self.lost_listeners.lock();
        let listeners = listeners.get_or_insert_with(Box::default);
        listeners.retain(|l| l.strong_count() > 0);
        listeners.push(listener);
    }

    /// Tells the listeners (see [`on_lost`](Hold::on_lost)); called once the
    /// loss is reported.
    pub(crate) fn tell_lost(&self) {
        let listeners = self.lost_listeners.lock().take().unwrap_or_default();
        for l in listeners.iter().filter_map(Weak::upgrade) {
            l.lost();
        }
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
}

/// The texts of a hold, one after another in one allocation: its name
/// framed as a RESP bulk string (`$<len>\r\n<name>\r\n`, what the
/// watchdog's renewals copy in one piece), owner field, release channel,
/// read-hold prefix (empty but for a read hold) and slot key (empty but for
/// a write hold: see [`slot_key`]).
struct Texts {
    all: Box<str>,
    /// Where each part but the last ends in `all`: the frame's head, the
    /// name, the frame's tail, the field, the channel, the prefix.
    ends: [u32; 6],
}

const NAME: usize = 1;
const FIELD: usize = 3;
const CHANNEL: usize = 4;
const PREFIX: usize = 5;
const SLOT: usize = 6;

impl Texts {
    fn new(lock: LockRef<'_>) -> Texts {
        let prefix = lock.hold_prefix();
        let slot = if lock.kind == Kind::Write {
            slot_key(lock.name, lock.kind)
        } else {
            String::new()
        };
        let mut len = itoa::Buffer::new();
        let len = len.format(lock.name.len());
        // The frame's head, `$<len>\r\n`, is the first part.
        let parts = [lock.name, "\r\n", lock.field, lock.channel, &prefix, &slot];
        let head = 3 + len.len();
        let mut all = String::with_capacity(head + parts.iter().map(|p| p.len()).sum::<usize>());
        all.push('$');
        all.push_str(len);
        all.push_str("\r\n");
        let mut ends = [0; 6];
        ends[0] = head as u32;
        for (i, part) in parts.iter().enumerate() {
            all.push_str(part);
            if let Some(end) = ends.get_mut(i + 1) {
                // Saturates past 4 GiB of texts, which no hold reaches: its
                // name is at most `MAX_NAME_LEN` (512 MiB, `check_name`), and
                // its texts hold four copies of it at most.
                *end = u32::try_from(all.len()).unwrap_or(u32::MAX);
            }
        }
        Texts {
            all: all.into_boxed_str(),
            ends,
        }
    }

    /// Part `i` (`NAME` ... `SLOT`).
    fn get(&self, i: usize) -> &str {
        let start = match i.checked_sub(1) {
            Some(before) => self.ends.get(before).copied().unwrap_or(0),
            None => 0,
        };
        let end = self.ends.get(i).map_or(self.all.len(), |&e| e as usize);
        self.all.get(start as usize..end).unwrap_or_default()
    }

    /// The name framed as a RESP bulk string.
    fn framed_name(&self) -> &[u8] {
        let end = self.ends[2] as usize;
        self.all.as_bytes().get(..end).unwrap_or_default()
    }
}

/// The id and `:write` suffix of an owner field `<client-uuid>:<id>` or
/// `<client-uuid>:<id>:write`; `None` for any other shape.
fn owner_key(field: &str) -> Option<(u64, bool)> {
    let (_, rest) = field.split_once(':')?;
    let (id, write) = match rest.strip_suffix(":write") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    // The digits exactly as the id prints them (no sign, no leading zero).
    let canonical = id.bytes().all(|b| b.is_ascii_digit()) && (id == "0" || !id.starts_with('0'));
    Some((id.parse().ok().filter(|_| canonical)?, write))
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{owner_key, slot_key, Hold};
    use crate::scripts::{Kind, LockRef};
    use crate::time::bound_us;

    #[test]
    fn a_hold_gives_back_each_of_its_texts() {
        let field = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a:7";
        for kind in [
            Kind::Plain,
            Kind::Fenced,
            Kind::Read,
            Kind::Write,
            Kind::Fair,
        ] {
            for name in ["", "a", "orders:{42}:ä"] {
                let channel = format!("channel-of-{name}");
                let lock = LockRef {
                    name,
                    channel: &channel,
                    field,
                    kind,
                };
                let hold = Hold::new(1, lock, Instant::now(), 1000, 1, None, false);
                assert_eq!(hold.name(), name, "{kind:?}");
                assert_eq!(
                    hold.framed_name(),
                    format!("${}\r\n{name}\r\n", name.len()).as_bytes(),
                    "{kind:?}"
                );
                assert_eq!(hold.field(), field, "{kind:?}");
                assert_eq!(hold.channel(), channel, "{kind:?}");
                assert_eq!(hold.prefix(), lock.hold_prefix(), "{kind:?}");
                assert_eq!(hold.slot(), slot_key(name, kind), "{kind:?}");
            }
        }
    }

    /// Takes `hold` for a renewal with `lease_ms`: whether Redis must keep
    /// a longer lease than the renewal's (`GT`).
    fn keeps_longer(hold: &Hold, lease_ms: u64) -> bool {
        hold.take_due(lease_ms, 1, bound_us(Instant::now()), true)
            .expect("due")
            .1
    }

    #[test]
    fn a_renewal_keeps_a_longer_lease_only_where_one_may_stand() {
        let lock = LockRef {
            name: "n",
            channel: "c",
            field: "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a:7",
            kind: Kind::Plain,
        };
        let now = Instant::now();
        let hold = Hold::new(1, lock, now, 3_000, 1, None, false);
        hold.acquired(3_000, true);
        // Every lease alike, or the renewal's longer: nothing to keep.
        assert!(!keeps_longer(&hold, 3_000));
        assert!(!keeps_longer(&hold, 4_000));
        // A renewal of the generation set 4 s: a 3 s one must keep it.
        assert!(keeps_longer(&hold, 3_000));
        // A new generation: what its request set counts.
        hold.confirmed(now, 3_000, 2);
        assert!(!keeps_longer(&hold, 3_000));
        hold.confirmed(now, 60_000, 3);
        assert!(keeps_longer(&hold, 3_000));
        hold.settled(hold.epoch(), now, 3_000, 4);
        assert!(!keeps_longer(&hold, 3_000));
        // A generation adopted from Redis (an undo's): its lease is not known.
        let (token, _) = hold.take_due(3_000, 1, bound_us(now), true).expect("due");
        assert!(hold.adopt(token, Some(9)));
        assert!(keeps_longer(&hold, 3_000));
        let (token, _) = hold.take_due(3_000, 1, bound_us(now), true).expect("due");
        assert!(hold.adopt(token, None));
        assert!(keeps_longer(&hold, 3_000));
        // Leases of 49 days and more are not told apart: kept.
        let days_49 = u64::from(u32::MAX);
        hold.confirmed(now, days_49 - 2, 5);
        assert!(!keeps_longer(&hold, days_49 - 2));
        for long in [days_49 - 1, days_49, 100 * 365 * 86_400_000] {
            hold.confirmed(now, long, 6);
            assert!(keeps_longer(&hold, long), "{long}");
        }
    }

    /// A renewal raises the bound once its batch is done, and never when
    /// it failed or a lease-setting request overlapped it.
    #[test]
    fn a_renewal_raises_the_bound_once_its_batch_is_done() {
        use std::sync::Arc;
        use std::time::Duration;

        use super::Progress;

        let lock = LockRef {
            name: "n",
            channel: "c",
            field: "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a:7",
            kind: Kind::Plain,
        };
        let t0 = Instant::now();
        let hold = Hold::new(1, lock, t0, 3_000, 1, None, false);
        hold.acquired(3_000, true);
        let progress = Arc::new(Progress::default());
        hold.set_watch_slot(0, &progress);
        let first = hold.valid_until();
        let later = first + Duration::from_secs(2);
        // Taken in batch 1: pending until the batch is done.
        hold.take_due(3_000, 1, bound_us(later), true).expect("due");
        assert_eq!(hold.valid_until(), first, "batch 1 under way");
        progress.finish(1);
        assert_eq!(hold.valid_until(), later, "batch 1 done");
        // Failed in batch 2: taken back before the batch is done.
        let more = later + Duration::from_secs(2);
        hold.take_due(3_000, 2, bound_us(more), true).expect("due");
        hold.not_renewed();
        progress.finish(2);
        assert_eq!(hold.valid_until(), later, "a failed renewal raises nothing");
        // A request that begins while batch 3 is under way drops it.
        hold.take_due(3_000, 3, bound_us(more), true).expect("due");
        hold.begin(t0, 60_000);
        progress.finish(3);
        assert_eq!(
            hold.valid_until(),
            later,
            "an overlapped renewal raises nothing"
        );
        hold.confirmed(t0, 3_000, 2);
        let confirmed = hold.valid_until();
        // Done before the next request begins: the request keeps its gain.
        let most = confirmed + Duration::from_secs(5);
        hold.take_due(3_000, 4, bound_us(most), true).expect("due");
        progress.finish(4);
        hold.begin(most + Duration::from_secs(60), 60_000);
        assert_eq!(hold.valid_until(), most, "folded before the request began");
        // Not sent (its hold was capped): nothing pending.
        hold.confirmed(t0, 3_000, 3);
        hold.take_due(3_000, 5, bound_us(most), false).expect("due");
        progress.finish(5);
        assert_eq!(hold.valid_until(), confirmed);
    }

    #[test]
    fn owner_keys_only_for_fields_of_the_usual_shape() {
        let uuid = "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a";
        assert_eq!(owner_key(&format!("{uuid}:12")), Some((12, false)));
        assert_eq!(owner_key(&format!("{uuid}:0:write")), Some((0, true)));
        assert_eq!(
            owner_key(&format!("{uuid}:{}", u64::MAX)),
            Some((u64::MAX, false))
        );
        for odd in ["012", "+1", "-1", "1:read", "", "1:write:write", "x"] {
            assert_eq!(owner_key(&format!("{uuid}:{odd}")), None, "{odd:?}");
        }
        assert_eq!(owner_key("no-colon"), None);
    }
}

/// Client memory per held lock is a reported figure (`benches/watchdog.rs`,
/// issue 20): a field that makes a hold larger fails here until the limit
/// is raised with the bench's figures.
#[cfg(all(test, target_pointer_width = "64"))]
mod size {
    #[test]
    fn a_hold_stays_small() {
        let sizes = [
            ("Hold", std::mem::size_of::<super::Hold>(), 192),
            ("LeaseState", std::mem::size_of::<super::LeaseState>(), 56),
        ];
        for (what, size, limit) in sizes {
            assert!(
                size <= limit,
                "{what} takes {size} bytes, more than {limit}"
            );
        }
    }

    /// [`Hold::warm`](super::Hold::warm) reads a field on every cache line
    /// that taking a hold for a renewal and scheduling it again use (from
    /// the `Arc`'s counts to the owner key), wherever a 16-byte-aligned
    /// allocation starts: a field moved in `Hold` fails here.
    #[test]
    fn warm_reads_every_line_the_watchdog_uses() {
        use super::Hold;
        use std::collections::BTreeSet;
        use std::mem::{offset_of, size_of};
        // In the `Arc`'s allocation the hold follows two counts.
        let at = |offset: usize| 2 * size_of::<usize>() + offset;
        // The strong count (read by the watchdog's `touch`), the lease
        // lock's state, the kind (beside the flags), the owner key's id and
        // flag.
        let read = [
            0,
            at(offset_of!(Hold, lease)),
            at(offset_of!(Hold, kind)),
            at(offset_of!(Hold, owner)),
            at(offset_of!(Hold, owner)) + size_of::<u64>(),
        ];
        // The owner key is read whole: its flag (after the id) tells the
        // `Option` apart.
        let used = at(offset_of!(Hold, owner)) + size_of::<u64>() + 1;
        for start in (0..64).step_by(16) {
            let lines: BTreeSet<usize> = (start..start + used).map(|b| b / 64).collect();
            let warmed: BTreeSet<usize> = read.iter().map(|o| (start + o) / 64).collect();
            assert_eq!(
                lines, warmed,
                "allocation at {start} bytes into a line: lines used {lines:?}, read {warmed:?}"
            );
        }
    }
}
