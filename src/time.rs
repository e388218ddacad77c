//! Small time helpers every layer uses: milliseconds of a `Duration`,
//! deadlines that saturate instead of overflowing, jitter, and a warning
//! let through at most once a second per cause ([`warn_limited!`]).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The shortest time between two warnings of the same cause.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(1);

/// Per cause: when its last warning went out, and how many were held back
/// since.
static WARNED: LazyLock<Mutex<HashMap<String, (Instant, u64)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether a warning of `cause` may go out now: `Some(n)` with the number
/// held back since the last one, or `None` within [`WARN_EVERY`] of it (it
/// is counted). Causes quiet for a minute are forgotten.
pub(crate) fn warn_allowed(cause: &str) -> Option<u64> {
    let now = Instant::now();
    let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((last, held)) = warned.get_mut(cause) {
        if now.duration_since(*last) < WARN_EVERY {
            *held += 1;
            return None;
        }
        let n = std::mem::take(held);
        *last = now;
        return Some(n);
    }
    if warned.len() >= 256 {
        warned.retain(|_, (last, _)| now.duration_since(*last) < Duration::from_secs(60));
    }
    warned.insert(cause.to_owned(), (now, 0));
    Some(0)
}

/// `log::warn!`, at most once a second for the same `cause` (a string
/// naming what failed and where, without what varies from one time to the
/// next): during an outage a warning that would repeat on every retry is
/// one line a second, with the number held back.
macro_rules! warn_limited {
    ($cause:expr, $($arg:tt)+) => {
        if let Some(held) = $crate::time::warn_allowed($cause) {
            if held == 0 {
                log::warn!($($arg)+);
            } else {
                log::warn!("{} ({held} more like it not shown)", format_args!($($arg)+));
            }
        }
    };
}

pub(crate) use warn_limited;

/// `d` in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `sent + lease_ms`, saturating far in the future.
pub(crate) fn deadline(sent: Instant, lease_ms: u64) -> Instant {
    sent.checked_add(Duration::from_millis(lease_ms))
        .unwrap_or_else(|| far_future(sent))
}

/// An instant about a century after `now` (or `now` itself if even that
/// cannot be represented): "never", for a deadline that must be an
/// `Instant`.
pub(crate) fn far_future(now: Instant) -> Instant {
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// `d` scaled by a random factor in `[1 - spread, 1 + spread)`, so that many
/// clients retrying after one failure do not stay in step. `RandomState` is
/// randomly keyed per instance, which is random enough for this.
pub(crate) fn jitter(d: Duration, spread: f64) -> Duration {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(1.0 - spread + 2.0 * spread * unit)
}
