//! This thread's holds and unsettled requests, per client and lock: the
//! reentrancy registry. Only the owning thread re-enters or releases a hold,
//! so a thread-local map serves without a lock.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::engine::hold::Hold;
use crate::engine::unsettled::Unsettled;

/// What this thread has of one lock through one client. Its requests not
/// settled yet are boxed (most slots have none), and the map's key is a
/// `Box<str>`: an entry takes 32 bytes, not 56.
#[derive(Default)]
struct Slot {
    hold: Option<Arc<Hold>>,
    // One word, as most slots have none (a `Vec` takes three).
    #[allow(clippy::box_collection)]
    pending: Option<Box<Vec<Arc<Unsettled>>>>,
}

impl Slot {
    /// Drops the requests settled since (and the box, once none is left).
    fn prune_pending(&mut self) {
        if let Some(p) = &mut self.pending {
            p.retain(|p| !p.is_done());
            if p.is_empty() {
                self.pending = None;
            }
        }
    }
}

/// The maps' hash: rustc's multiply-and-rotate (FxHash), a few instructions
/// per 8 bytes of a lock name, where the default SipHash took about a tenth
/// of the client's work per acquire + release. The maps are a thread's own
/// holds (keys its program chose, as many as it holds at once), so there is
/// no flood of colliding keys to resist.
#[derive(Default)]
struct FxHasher(u64);

impl FxHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(c);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type Fx = BuildHasherDefault<FxHasher>;

/// One client's slots of this thread, by lock ([`slot_key`](crate::engine::hold::slot_key)).
type Slots = HashMap<Box<str>, Slot, Fx>;

thread_local! {
    /// This thread's holds: client id -> lock name -> slot. Only the owning
    /// thread re-enters or releases a hold, so no lock is needed.
    static SLOTS: RefCell<HashMap<u64, Slots, Fx>> = RefCell::new(HashMap::default());
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
        match m.get_mut(name) {
            Some(slot) => f(slot),
            None => {
                let mut slot = Slot::default();
                f(&mut slot);
                m.insert(name.into(), slot);
            }
        }
    });
}

fn prune(client_id: u64, name: &str) {
    let _ = SLOTS.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some(m) = s.get_mut(&client_id) {
            if m.get(name)
                .is_some_and(|slot| slot.hold.is_none() && slot.pending.is_none())
            {
                m.remove(name);
            }
            if m.is_empty() {
                s.remove(&client_id);
            }
        }
    });
}

/// The active hold this thread has under `slot` ([`slot_key`](crate::engine::hold::slot_key)) through
/// client `client_id`, and its requests that are not settled yet.
pub(crate) fn owner_state(client_id: u64, slot: &str) -> (Option<Arc<Hold>>, Vec<Arc<Unsettled>>) {
    with_slot(client_id, slot, |slot| match slot {
        None => (None, Vec::new()),
        Some(slot) => {
            slot.prune_pending();
            (
                slot.hold.clone().filter(|h| h.is_active()),
                slot.pending.as_deref().cloned().unwrap_or_default(),
            )
        }
    })
    .unwrap_or_default()
}

pub(crate) fn insert_hold(hold: &Arc<Hold>) {
    if hold.owned {
        // Owned by its acquisition, not by this thread.
        return;
    }
    with_slot_or_insert(hold.client_id, hold.slot(), |slot| {
        slot.hold = Some(Arc::clone(hold));
    });
}

pub(crate) fn remove_hold(hold: &Arc<Hold>) {
    if hold.owned {
        return;
    }
    // One look-up of the slot, and one more to remove it once empty.
    let _ = SLOTS.try_with(|s| {
        let mut s = s.borrow_mut();
        let Some(m) = s.get_mut(&hold.client_id) else {
            return;
        };
        let name = hold.slot();
        let Some(slot) = m.get_mut(name) else {
            return;
        };
        if slot.hold.as_ref().is_some_and(|x| Arc::ptr_eq(x, hold)) {
            slot.hold = None;
        }
        if slot.hold.is_none() && slot.pending.is_none() {
            m.remove(name);
            if m.is_empty() {
                s.remove(&hold.client_id);
            }
        }
    });
}

/// `false` if this thread holds a newer hold of the same lock than `hold`
/// (taken after `hold` was lost): that one owns the owner field now.
pub(crate) fn is_latest(hold: &Arc<Hold>) -> bool {
    if hold.owned {
        // Its owner (the acquisition) takes the lock once.
        return true;
    }
    with_slot(hold.client_id, hold.slot(), |slot| {
        slot.and_then(|s| s.hold.as_ref())
            .is_none_or(|x| Arc::ptr_eq(x, hold))
    })
    .unwrap_or(true)
}

pub(crate) fn add_pending(client_id: u64, cancel: &Arc<Unsettled>) {
    with_slot_or_insert(client_id, cancel.slot(), |slot| {
        slot.pending
            .get_or_insert_with(Box::default)
            .push(Arc::clone(cancel));
    });
}

/// The keys of `requests` (all on one lock) are now set on Redis: late
/// copies are harmless, nothing is left to settle.
pub(crate) fn settle(client_id: u64, requests: &[Arc<Unsettled>]) {
    for r in requests {
        r.set_done();
    }
    if let Some(first) = requests.first() {
        with_slot(client_id, first.slot(), |slot| {
            if let Some(slot) = slot {
                slot.prune_pending();
            }
        });
        prune(client_id, first.slot());
    }
}
