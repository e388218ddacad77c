//! Requests whose reply was lost ([`Unsettled`]): what each was ([`Lost`])
//! and what settles it. The watchdog's thread retries them until each has
//! run once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use redis::RedisResult;

use crate::engine::hold::{slot_key, Hold};
use crate::net::transport::Connection;
use crate::scripts::{self, Kind, LockRef};

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
    /// Not handed to the watchdog yet (see `Shared::defer_settle`).
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
    /// A reentrant lock's last waiter in this process gave up: the process
    /// leaves the lock's queue (`key`), passing on a wake-up it was given
    /// (see leave.lua). Run in the background, so that the wait that gave
    /// up returns at once, and retried until it has run: a lost leave must
    /// not strand the waiters of other processes.
    Dequeue {
        /// The process's wake-up channel (its entry in the queue).
        wake: String,
    },
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

    /// Its key among this thread's holds ([`slot_key`]).
    pub(crate) fn slot(&self) -> &str {
        &self.slot
    }

    /// Not to be handed to the watchdog until the owner says so (see
    /// `Shared::defer_settle`).
    pub(crate) fn defer(&self) {
        self.deferred.store(true, Ordering::Release);
    }

    /// `true` once for a request that was deferred: the caller settles it.
    pub(crate) fn take_deferred(&self) -> bool {
        self.deferred.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// For semaphore permits: returns them (one script call on `conn`;
    /// `latch_ms`: how long its latch lives). `None` for another kind.
    pub(crate) fn return_permits(
        &self,
        conn: &mut Connection,
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

    /// Settles the request (one script call on `conn`, `gen` a new request
    /// id): undoes a lost acquisition, completes a lost or refused release,
    /// returns semaphore permits, leaves a fair lock's line. Its key makes
    /// it run at most once, and a late copy of the request a no-op. Redis's
    /// answer: 1 if it changed something (2: an undone re-entry found a
    /// hold key of the owner expired).
    pub(crate) fn run(&self, conn: &mut Connection, gen: u64, publish: &str) -> RedisResult<i64> {
        let now = Instant::now();
        match self.kind {
            Lost::Acquire { held, lease_ms } => scripts::cancel_acquire(
                conn,
                self.lock_ref(),
                &self.key,
                held,
                self.capped(lease_ms, now),
                gen,
                publish,
            ),
            // A release runs with the window as its latch TTL: a copy of it
            // may still arrive.
            Lost::Release { left, lease_ms } => scripts::Release {
                lock: self.lock_ref(),
                latch: &self.key,
                unsettled: Vec::new(),
                left,
                lease_ms: self.capped(lease_ms, now),
                latch_ms: scripts::LATE_REQUEST_WINDOW_MS,
                gen,
                unlatched: None,
                publish,
                prefix: &self.lock_ref().hold_prefix(),
                grant: None,
            }
            .run(conn)
            .map(|r| r.code.unwrap_or(0)),
            Lost::Dequeue { ref wake } => {
                scripts::leave(conn, &self.name, &self.channel, &self.key, wake, publish).map(|_| 0)
            }
            Lost::Leave => scripts::fair_leave(
                conn,
                self.lock_ref(),
                &self.key,
                scripts::LATE_REQUEST_WINDOW_MS,
                publish,
            )
            .map(|_| 0),
            // Its latch lives the window: a copy may still arrive.
            Lost::Permits { .. } => self
                .return_permits(conn, scripts::LATE_REQUEST_WINDOW_MS, publish)
                .unwrap_or(Ok(0))
                .map(|r| i64::from(r != 0)),
        }
    }

    /// What [`run`](Unsettled::run) answering `applied` means for `hold`
    /// (the request's hold while active, with its epoch before the run, sent
    /// at `sent` as request `gen`): an undone re-entry re-applied the lease
    /// the remaining holds need; `Some` with the hold and why when it is
    /// lost.
    pub(crate) fn ran<'h>(
        &self,
        applied: i64,
        hold: Option<&'h Arc<Hold>>,
        epoch: Option<u64>,
        sent: Instant,
        gen: u64,
    ) -> Option<(&'h Arc<Hold>, &'static str)> {
        let Lost::Acquire { held, lease_ms } = self.kind else {
            return None;
        };
        let hold = hold?;
        match (applied, epoch) {
            (2, _) => Some((
                hold,
                "a hold key of it ran out before a lost re-entry was undone",
            )),
            (1, Some(epoch)) if held > 0 => {
                // What `run` re-applied, cut to the cap as of `sent` (no
                // later than the run): the bound ends at the cap too.
                hold.settled(epoch, sent, hold.capped_lease_ms(lease_ms, sent), gen);
                None
            }
            _ => None,
        }
    }

    /// `lease_ms`, re-applied for the remaining holds at `now`, cut so that
    /// it ends at the hold's cap (`max_hold`) at the latest.
    fn capped(&self, lease_ms: u64, now: Instant) -> u64 {
        match self.hold.as_ref().and_then(Weak::upgrade) {
            Some(hold) => hold.capped_lease_ms(lease_ms, now),
            None => lease_ms,
        }
    }

    /// What settling it does, for the log.
    pub(crate) fn what(&self) -> &'static str {
        match self.kind {
            Lost::Acquire { .. } => "undid an acquisition",
            Lost::Permits { undo: true, .. } => "returned the permits of an acquisition",
            Lost::Release { .. } | Lost::Permits { .. } => "completed a release",
            Lost::Leave => "left the line",
            Lost::Dequeue { .. } => "left the queue",
        }
    }

    /// `false` for semaphore permits, which have no lease (or a long one):
    /// they are returned however long it takes. Anything else is given up
    /// once no copy of it can arrive any more and its lease is long gone.
    pub(crate) fn expires(&self) -> bool {
        !matches!(self.kind, Lost::Permits { .. })
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

/// The keys of `requests`, as the scripts take them.
pub(crate) fn keys(requests: &[Arc<Unsettled>]) -> Vec<&str> {
    requests.iter().map(|r| r.key.as_str()).collect()
}
