//! This thread's holds and unsettled requests, per client and lock: the
//! reentrancy registry. Only the owning thread re-enters or releases a hold,
//! so a thread-local map serves without a lock.

use std::cell::RefCell;
use std::collections::HashMap;
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

thread_local! {
    /// This thread's holds: client id -> lock name -> slot. Only the owning
    /// thread re-enters or releases a hold, so no lock is needed.
    static SLOTS: RefCell<HashMap<u64, HashMap<Box<str>, Slot>>> = RefCell::new(HashMap::new());
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
            m.insert(name.into(), Slot::default());
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
    with_slot(hold.client_id, hold.slot(), |slot| {
        if let Some(slot) = slot {
            if slot.hold.as_ref().is_some_and(|x| Arc::ptr_eq(x, hold)) {
                slot.hold = None;
            }
        }
    });
    prune(hold.client_id, hold.slot());
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
