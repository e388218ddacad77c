//! The permit-expirable semaphore ([`ExpirableSemaphore`], Redisson's
//! `RPermitExpirableSemaphore` layout) and its guard [`Permit`]: every permit
//! has a lease, and comes back when it runs out. Built on what both
//! semaphores share (`semaphore::Names`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::engine::shared::{check_lease, Shared};
use crate::engine::waiting::{Attempt, Wait};
use crate::error::{Error, Result};
use crate::kinds::semaphore::{Held, Names, PERMIT_RECHECK};
use crate::net::pool::Synced;
use crate::scripts;
use crate::time::{deadline, duration_ms, warn_limited};

/// A distributed semaphore whose permits expire, shared with Redisson's
/// `RPermitExpirableSemaphore` on the same name: `<name>` counts the permits
/// available, the sorted set `{<name>}:timeout` holds the permits out
/// (member: the permit's 16-byte id, which starts with the first 8 bytes
/// of the client's id; score: its expiry in epoch ms), and
/// `redisson_sc:{<name>}` carries counts when permits come back.
///
/// Every permit has a lease: a holder that crashes loses its permit when
/// the lease runs out, and the next acquisition (or
/// [`available_permits`](Self::available_permits)) counts it back. Expiry is
/// by Redis's clock, so clients' clocks do not matter among redlease
/// clients (Redisson computes expiries with its own clock). A permit is
/// released by its guard ([`Permit`]) or by id; release by id is idempotent,
/// so retrying it after a lost reply is safe.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// use std::time::Duration;
/// let slots = client.permit_expirable_semaphore("render-slots");
/// slots.try_set_permits(4)?;
/// let permit = slots.acquire(Duration::from_secs(30))?;  // comes back after 30 s at most
/// println!("holding permit {}", permit.id());
/// permit.update_lease(Duration::from_secs(30))?;         // 30 s from now
/// permit.release()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an ExpirableSemaphore does nothing until one of its methods is called"]
pub struct ExpirableSemaphore {
    names: Names,
}

impl ExpirableSemaphore {
    /// The longest permit lease accepted: 100 years (expiries are absolute
    /// epoch milliseconds; Redisson reads far larger ones as "never").
    pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    pub(crate) fn new(shared: Arc<Shared>, name: String) -> ExpirableSemaphore {
        ExpirableSemaphore {
            names: Names::new(
                shared,
                name,
                scripts::permits_out_name,
                "expirable-semaphore",
            ),
        }
    }

    /// The semaphore's name (the key of its count).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.names.name
    }

    /// Sets the permits available to `permits` if the semaphore does not
    /// exist; `false` if it does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or more than 2^53
    /// permits; a Redis or pool error.
    pub fn try_set_permits(&self, permits: u64) -> Result<bool> {
        self.names.try_set_permits(permits)
    }

    /// Adds `delta` permits (takes them away when negative).
    ///
    /// # Errors
    ///
    /// As for [`Semaphore::add_permits`](crate::Semaphore::add_permits).
    pub fn add_permits(&self, delta: i64) -> Result<()> {
        self.names.add_permits(delta).map(|_| ())
    }

    /// The permits available now, after counting back the permits whose
    /// lease ran out (a write: waiters are told of those).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn available_permits(&self) -> Result<i64> {
        self.names.check()?;
        let names = &self.names;
        let publish = names.router().publish_command();
        names.router().run(&names.name, |conn| {
            scripts::permit_lease(conn, names.sem(), None, publish)
        })
    }

    /// The permits out, one [`Holder`](crate::Holder) each, with the
    /// lease left; a permit taken by a redlease client names its client
    /// and process (its id starts with the client's short id), one taken by
    /// Redisson only its id. Read only.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn holders(&self) -> Result<Vec<crate::kinds::inspect::Holder>> {
        self.names.check()?;
        crate::kinds::inspect::permit_holders(self.names.shared(), &self.names.name)
    }

    /// Releases the permit with id `id` (32 hex digits, as
    /// [`Permit::id`] gives); `true` if it was out and is now returned
    /// (also when its lease had run out but it was not counted back yet),
    /// `false` if it was not out (released already, or counted back after
    /// its lease ran out). Idempotent: safe to retry after an error, which
    /// returns the permit once (the retry answers `false` if the first call
    /// had returned it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an id that is not 32 hex digits or an
    /// empty name; a Redis or pool error.
    pub fn release(&self, id: &str) -> Result<bool> {
        let raw = parse_id(id)?;
        self.names.check()?;
        let names = &self.names;
        let publish = names.router().publish_command();
        let latch = scripts::permit_latch_name(
            &names.name,
            &scripts::hex(&raw),
            names.shared().next_request(),
        );
        // Waited for by the replicas where replica sync is on, as a lock's
        // release.
        let (n, _) = names.router().run_synced(&names.name, |conn| {
            scripts::return_permits(
                conn,
                names.sem(),
                scripts::Held::Permit(&raw),
                &latch,
                None,
                names.shared().latch_ttl_ms,
                publish,
            )
        })?;
        Ok(n != 0)
    }

    /// Deletes the semaphore (its count and its permits out); `false` if
    /// there was none. Permits of it are lost ([`Error::PermitLost`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name (or, on a Redis Cluster,
    /// one whose keys would span slots); a Redis or pool error.
    pub fn delete(&self) -> Result<bool> {
        self.names.delete()
    }

    /// Takes a permit with `lease`, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease below 1 ms or above
    /// [`MAX_LEASE`](Self::MAX_LEASE), or an empty name; a Redis or pool
    /// error. A failed call never leaves a permit out in the caller's name:
    /// one that may have been taken is returned in the background.
    pub fn acquire(&self, lease: Duration) -> Result<Permit> {
        loop {
            if let Some(p) = self.acquire_until(Wait::Forever, lease)? {
                return Ok(p);
            }
        }
    }

    /// Takes a permit with `lease` if one is available, without waiting.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire(&self, lease: Duration) -> Result<Option<Permit>> {
        self.acquire_until(Wait::No, lease)
    }

    /// Takes a permit with `lease`, waiting at most `wait`.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire_for(&self, wait: Duration, lease: Duration) -> Result<Option<Permit>> {
        self.acquire_until(Wait::after(wait), lease)
    }

    /// Takes a permit with `lease`, waiting until `deadline` at the latest.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    pub fn try_acquire_until(&self, deadline: Instant, lease: Duration) -> Result<Option<Permit>> {
        self.acquire_until(Wait::Until(deadline), lease)
    }

    fn acquire_until(&self, wait: Wait, lease: Duration) -> Result<Option<Permit>> {
        check_permit_lease(lease)?;
        self.names.check()?;
        let names = &self.names;
        names
            .waiters()
            .acquire(wait.deadline(), |_| names.synced(|| self.attempt(lease)))
    }

    fn attempt(&self, lease: Duration) -> Result<Attempt<Permit>> {
        let names = &self.names;
        // The client's short id, then 8 random bytes: whoever lists the
        // permits out can find the holder's process key.
        let mut raw = *uuid::Uuid::new_v4().as_bytes();
        raw[..8].copy_from_slice(&names.shared().short_id);
        let id = scripts::hex(&raw);
        let marker = scripts::permit_cancel_name(&names.name, &id);
        let lease_ms = duration_ms(lease);
        let publish = names.router().publish_command();
        let sent = Instant::now();
        names.attempt(
            |conn| scripts::permit_acquire(conn, names.sem(), &marker, lease_ms, &raw, publish),
            || names.lost(Held::Permit(&raw, &id), marker.clone(), true, sent),
            || Permit {
                sem: self.clone(),
                id: id.clone(),
                raw,
                lease: Mutex::new(PermitLease {
                    valid_until: deadline(sent, lease_ms),
                    in_flight: 0,
                    overlapped: false,
                    lost: Vec::new(),
                }),
                done: false,
                acquired_at: names.shared().events.start(),
            },
            // The ms until the first permit out expires (-2: none will),
            // and a re-check at least every PERMIT_RECHECK all the same.
            |ms| {
                let expiry = Duration::from_millis(ms.unsigned_abs());
                Some(if ms >= 0 {
                    expiry.min(PERMIT_RECHECK)
                } else {
                    PERMIT_RECHECK
                })
            },
        )
    }
}

impl fmt::Debug for ExpirableSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpirableSemaphore")
            .field("name", &self.names.name)
            .finish()
    }
}

fn check_permit_lease(lease: Duration) -> Result<()> {
    // The permit's own cap first: it is below the locks' (2^53 ms), which
    // would otherwise be named for a lease above both.
    if lease > ExpirableSemaphore::MAX_LEASE {
        return Err(Error::invalid(format!(
            "permit lease must be at most ExpirableSemaphore::MAX_LEASE (100 years), got \
             {lease:?}"
        )));
    }
    check_lease("permit lease", lease)
}

fn parse_id(id: &str) -> Result<[u8; 16]> {
    let bad = || {
        Error::invalid(format!(
            "permit id must be 32 hex digits (as Permit::id gives), got {id:?}"
        ))
    };
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&id[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(raw)
}

/// What a [`Permit`] knows of its lease.
struct PermitLease {
    /// Until when the permit is known to be out.
    valid_until: Instant,
    /// Lease updates under way.
    in_flight: u32,
    /// Some of them overlapped.
    overlapped: bool,
    /// The keys of updates whose reply was lost, and when each was sent: a
    /// copy of one may still reach Redis (within
    /// [`scripts::LATE_REQUEST_WINDOW_MS`]) and set a lease that a later
    /// update's reply no longer tells. The next update sets them first,
    /// which makes such copies do nothing.
    lost: Vec<(String, Instant)>,
}

/// A permit of an [`ExpirableSemaphore`]: it comes back when released (by
/// this guard, on drop, or by id) or when its lease runs out.
///
/// The guard is `Send`: permits have no owner.
#[must_use = "the permit is released as soon as the guard is dropped"]
pub struct Permit {
    sem: ExpirableSemaphore,
    id: String,
    raw: [u8; 16],
    lease: Mutex<PermitLease>,
    done: bool,
    /// When it was acquired, if an event handler measures it.
    acquired_at: Option<Instant>,
}

impl Permit {
    /// The permit's id: 32 lower-case hex digits (Redisson's form), for
    /// [`ExpirableSemaphore::release`].
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Until when the permit is known to be out: its last lease, counted
    /// from when the request that set it was sent.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.lease.lock().valid_until
    }

    /// `true` once the permit's lease has passed (it may be counted back
    /// and handed out again).
    #[must_use]
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until()
    }

    /// Sets the permit's lease to `lease` from now.
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] if the permit is no longer out (its lease ran
    /// out first, it was released by id, or the semaphore was deleted);
    /// [`Error::InvalidArgument`] for a lease out of range;
    /// [`Error::ReplicaSync`] with replica sync on, if fewer replicas than
    /// wanted confirmed the new lease (it is set on the master; the guard
    /// goes by the shorter of the two); a
    /// Redis or pool error (the lease is then known only up to the shorter
    /// of the old and the new one; the permit's next update makes a copy of
    /// this one that is still on its way do nothing).
    pub fn update_lease(&self, lease: Duration) -> Result<()> {
        check_permit_lease(lease)?;
        let names = &self.sem.names;
        let lease_ms = duration_ms(lease);
        let publish = names.router().publish_command();
        let sent = Instant::now();
        let key =
            scripts::permit_lease_key_name(&names.name, &self.id, names.router().next_request());
        let lost: Vec<String> = {
            // Until the reply: either lease may be the one in Redis.
            let mut st = self.lease.lock();
            st.valid_until = st.valid_until.min(deadline(sent, lease_ms));
            st.in_flight += 1;
            st.overlapped |= st.in_flight > 1;
            let window = Duration::from_millis(scripts::LATE_REQUEST_WINDOW_MS);
            st.lost
                .retain(|(_, at)| sent.saturating_duration_since(*at) < window);
            st.lost.iter().map(|(k, _)| k.clone()).collect()
        };
        // Sent more than once (the pool sends a request again on a new
        // connection after a dropped one), an earlier copy may still be on
        // its way whatever the answer.
        let tries = std::cell::Cell::new(0u32);
        // Waited for by the replicas where replica sync is on, as a lock's
        // renewal: a lease a failover could take back is not gone by.
        let result = names.router().run_synced(&names.name, |conn| {
            tries.set(tries.get() + 1);
            let update = scripts::LeaseUpdate {
                id: &self.raw,
                lease_ms,
                key: &key,
                lost: &lost,
            };
            scripts::permit_lease(conn, names.sem(), Some(update), publish)
        });
        let mut st = self.lease.lock();
        st.in_flight -= 1;
        // Updates from several threads at once may have run in another
        // order than their replies came: the bound stays at the shortest.
        let alone = !st.overlapped;
        if st.in_flight == 0 {
            st.overlapped = false;
        }
        if result.is_ok() {
            // Answered: the lost updates' keys are set.
            st.lost.retain(|(k, _)| !lost.contains(k));
        }
        let maybe_late = match &result {
            Ok(_) => tries.get() > 1,
            Err(e) => e.needs_settle(),
        };
        if maybe_late {
            // A copy of this one may still reach Redis: its key goes with
            // the next update.
            st.lost.push((key, sent));
        }
        let (n, synced) = result?;
        if let (1, Synced::No { wanted, acked }) = (n, synced) {
            // Set on the master, not confirmed: a failover may bring the
            // old lease back. The bound stays at the shorter of the two.
            return Err(Error::ReplicaSync {
                name: names.name.clone(),
                wanted,
                acked,
            });
        }
        if n == 1 {
            if alone {
                st.valid_until = deadline(sent, lease_ms);
            }
            Ok(())
        } else {
            Err(Error::PermitLost {
                name: names.name.clone(),
            })
        }
    }

    /// Releases the permit and reports the outcome.
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] if the permit's lease had run out (it is
    /// counted back either way); a Redis or pool error if Redis could not be
    /// reached or did not answer in time: the release is then completed in
    /// the background as soon as Redis answers.
    pub fn release(mut self) -> Result<()> {
        self.done = true;
        self.return_permit()
    }

    /// Drops the guard without releasing the permit, and returns its id: it
    /// comes back when its lease runs out, or by
    /// [`ExpirableSemaphore::release`].
    #[must_use = "the id is the only way left to release the permit early"]
    pub fn forget(mut self) -> String {
        self.done = true;
        std::mem::take(&mut self.id)
    }

    fn return_permit(&self) -> Result<()> {
        self.sem
            .names
            .give_back(Held::Permit(&self.raw, &self.id), self.acquired_at)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.return_permit() {
            // A lost lock (or permit) is told each time.
            warn_limited!(
                unless e.is_lock_lost(),
                "permit release on drop",
                "releasing permit {} of {:?} on drop failed: {e}",
                self.id,
                self.sem.names.name
            );
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.sem.names.name)
            .field("id", &self.id)
            .field("expired", &self.is_expired())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_ids_round_trip_and_bad_ids_are_refused() {
        let raw = [0xab; 16];
        let id = scripts::hex(&raw);
        assert_eq!(id, "ab".repeat(16));
        assert_eq!(parse_id(&id).unwrap(), raw);
        assert_eq!(parse_id(&id.to_uppercase()).unwrap(), raw);
        for bad in [
            "",
            "ab",
            &"zz".repeat(16),
            &"é".repeat(16),
            &"ab".repeat(17),
        ] {
            assert!(parse_id(bad).unwrap_err().is_invalid_argument(), "{bad:?}");
        }
    }
}
