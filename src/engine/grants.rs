//! Hand-off inside one client: a reentrant lock's waiter (fenced or not)
//! that sleeps for a wake-up parks an [`Offer`] (an acquisition prepared in
//! its name: owner field, generation, cancel marker, lease); a thread of the
//! same client that fully releases the lock claims the longest-parked offer
//! and sends a release that hands the lock to it (release.lua; a fenced
//! lock's waiter gets the next token from it), so that the waiter holds the
//! lock when it wakes, with no round trip of its own.
//!
//! Giving up and being granted are decided under the offer's lock: a
//! waiter that stops waiting withdraws its offer; if a releaser claimed it
//! first, the waiter takes that release's outcome (one round trip, within
//! the response timeout): granted, it holds the lock; unknown (the reply
//! was lost), it undoes the grant as a lost acquisition (its cancel marker
//! makes a late copy of the release grant nothing, and its next operation
//! on the lock sets the marker first; an owned guard's waiter, whose field
//! is its acquisition's own, has the undo alone). A release claims an offer
//! only while every waiter of the lock in this client sleeps with one
//! parked (a MultiLock's waiter, which cannot take a hand-off, gets the
//! release's wake-up as before); Redis grants only while the
//! waiter's cancel marker is absent, its field is not in the hash, and no
//! other subscriber than this client's listens on the lock's channel (a
//! waiter of another process, Redisson's included, is woken as before).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::engine::unsettled::{Lost, Unsettled};
use crate::net::pubsub::Poker;
use crate::scripts::{Kind, LockRef};

/// The parked offers of one client, per lock name, longest-parked first.
#[derive(Default)]
pub(crate) struct Grants {
    parked: Mutex<HashMap<Box<str>, VecDeque<Arc<Offer>>>>,
    /// How many offers `parked` lists: a release finds none without the
    /// lock.
    count: AtomicUsize,
}

/// An acquisition prepared in a waiting thread's name, which a releasing
/// thread of the same client may carry out with its release.
pub(crate) struct Offer {
    pub(crate) name: String,
    /// The waiter's lock: a reentrant lock, fenced or not (a fenced one's
    /// hand-off takes the next token for it, whoever releases).
    pub(crate) kind: Kind,
    /// Owned by the acquisition, not the waiting thread (`Lock::owned`):
    /// a lost hand-off is undone without the thread's later operations on
    /// the lock marking it (its field is the acquisition's own).
    pub(crate) owned: bool,
    pub(crate) channel: String,
    /// The waiter's owner field.
    pub(crate) field: String,
    /// The acquisition's cancel marker ([`crate::scripts::acquire_cancel_name`]).
    pub(crate) marker: String,
    /// The acquisition's id: the generation it writes.
    pub(crate) n: u64,
    /// The lease it sets.
    pub(crate) lease_ms: u64,
    /// Its process's wake-up channel for the lock (its entry in the lock's
    /// queue of waiting processes).
    pub(crate) wake: String,
    state: Mutex<State>,
    decided: Condvar,
    poker: Poker,
}

enum State {
    /// The waiter sleeps, and may be granted.
    Parked,
    /// A releaser claimed it and sent its release.
    Claimed,
    /// The release's answer, for the waiter to take.
    Decided(Outcome),
    /// The waiter took it back (or the outcome).
    Withdrawn,
}

/// What a claimed offer's release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The lock is the waiter's, leased from `sent` (when the release was
    /// sent) on; a fenced lock's with `token`.
    Granted { sent: Instant, token: Option<u64> },
    /// Not granted: the release did not take place, or released the lock
    /// and woke whom it wakes without a hand-off (someone else listens).
    /// The waiter sleeps on unless something else woke it.
    Declined,
    /// Not granted: the releaser held nothing any more (its lease ran out,
    /// the key was deleted), so the lock may be free with nobody told. The
    /// waiter tries at once.
    Missed,
    /// The release's reply was lost: it may have granted the lock, or may
    /// still, until the waiter's cancel marker is set.
    Unknown { sent: Instant },
}

impl Offer {
    /// An offer of the acquisition described, waking its waiter through
    /// `poker` once decided.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: &str,
        kind: Kind,
        owned: bool,
        channel: &str,
        field: String,
        marker: String,
        n: u64,
        lease_ms: u64,
        wake: String,
        poker: Poker,
    ) -> Offer {
        Offer {
            name: name.to_owned(),
            kind,
            owned,
            channel: channel.to_owned(),
            field,
            marker,
            n,
            lease_ms,
            wake,
            state: Mutex::new(State::Parked),
            decided: Condvar::new(),
            poker,
        }
    }

    /// The acquisition it describes, as a lost one to undo in the
    /// background (from the waiter's thread: its next operations on the
    /// lock mark it done first).
    pub(crate) fn lost(&self, sent: Instant) -> Unsettled {
        let lock = LockRef {
            name: &self.name,
            channel: &self.channel,
            field: &self.field,
            kind: self.kind,
        };
        Unsettled::new(
            lock,
            self.marker.clone(),
            Lost::Acquire {
                held: 0,
                lease_ms: 0,
            },
            None,
            sent,
        )
    }
}

impl Grants {
    /// Parks `offer` behind the others of its lock.
    pub(crate) fn park(&self, offer: &Arc<Offer>) {
        let mut parked = self.parked.lock();
        parked
            .entry(offer.name.as_str().into())
            .or_default()
            .push_back(Arc::clone(offer));
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The longest-parked offer for lock `name`, claimed: it is the
    /// caller's to decide ([`Claim::decide`], or dropped: unknown). None
    /// unless every waiter of the lock in this client sleeps with an offer
    /// parked: a waiter that cannot take a hand-off (a MultiLock's, one
    /// with a request unsettled) or is trying just now
    /// gets the release's wake-up as before, and is never passed over.
    pub(crate) fn claim(&self, name: &str) -> Option<Claim> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut parked = self.parked.lock();
        let queue = parked.get_mut(name)?;
        // Offers taken back (or claimed) go; the first parked one is the
        // candidate.
        let mut withdrawn = 0;
        queue.retain(|o| {
            let keep = matches!(*o.state.lock(), State::Parked);
            withdrawn += usize::from(!keep);
            keep
        });
        self.count.fetch_sub(withdrawn, Ordering::Relaxed);
        // Every waiter parked, and whether the first is the only one.
        let everyone = queue.front().and_then(|first| {
            let on_its_latch = queue
                .iter()
                .filter(|o| o.poker.same_latch(&first.poker))
                .count();
            (first.poker.waiters() == on_its_latch).then_some(on_its_latch == 1)
        });
        let claimed = match (queue.pop_front(), everyone) {
            (Some(offer), Some(last)) => {
                self.count.fetch_sub(1, Ordering::Relaxed);
                let mut state = offer.state.lock();
                // Taken back since it was looked at: no hand-off.
                if matches!(*state, State::Parked) {
                    *state = State::Claimed;
                    drop(state);
                    Some(Claim {
                        offer,
                        last,
                        decided: false,
                    })
                } else {
                    None
                }
            }
            (Some(offer), None) => {
                queue.push_front(offer);
                None
            }
            (None, _) => None,
        };
        if queue.is_empty() {
            parked.remove(name);
        }
        claimed
    }

    /// Takes `offer` back: `None` if it was still parked (nobody will
    /// grant it now), else the outcome of the release that claimed it,
    /// waited for if that release is still under way.
    pub(crate) fn withdraw(&self, offer: &Arc<Offer>) -> Option<Outcome> {
        let outcome = {
            let mut state = offer.state.lock();
            loop {
                match std::mem::replace(&mut *state, State::Withdrawn) {
                    State::Parked | State::Withdrawn => break None,
                    State::Decided(o) => break Some(o),
                    State::Claimed => {
                        *state = State::Claimed;
                        offer.decided.wait(&mut state);
                    }
                }
            }
        };
        if outcome.is_none() {
            let mut parked = self.parked.lock();
            if let Some(queue) = parked.get_mut(offer.name.as_str()) {
                let before = queue.len();
                queue.retain(|o| !Arc::ptr_eq(o, offer));
                self.count
                    .fetch_sub(before - queue.len(), Ordering::Relaxed);
                if queue.is_empty() {
                    parked.remove(offer.name.as_str());
                }
            }
        }
        outcome
    }
}

/// A claimed offer, until its release's outcome is known; dropped
/// undecided, it tells the waiter "unknown" (the waiter undoes what may
/// have been granted).
pub(crate) struct Claim {
    offer: Arc<Offer>,
    /// Its waiter is the client's only waiter of the lock: handed the
    /// lock, its process leaves the lock's queue.
    last: bool,
    decided: bool,
}

impl Claim {
    pub(crate) fn offer(&self) -> &Offer {
        &self.offer
    }

    /// See [`Claim::last`](Claim#structfield.last).
    pub(crate) fn last(&self) -> bool {
        self.last
    }

    /// Tells the waiter what the release did, and wakes it.
    pub(crate) fn decide(mut self, outcome: Outcome) {
        self.decided = true;
        tell(&self.offer, outcome);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.decided {
            tell(
                &self.offer,
                Outcome::Unknown {
                    sent: Instant::now(),
                },
            );
        }
    }
}

/// Decides `offer` and wakes its waiter: poked before the outcome can be
/// seen, so that a waiter that takes the outcome (and clears the poke)
/// is not woken again by it later.
fn tell(offer: &Offer, outcome: Outcome) {
    let mut state = offer.state.lock();
    *state = State::Decided(outcome);
    offer.poker.poke();
    drop(state);
    offer.decided.notify_all();
}
