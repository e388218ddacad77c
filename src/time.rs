//! Small time helpers every layer uses: milliseconds of a `Duration`,
//! deadlines that saturate instead of overflowing, and jitter.

use std::time::{Duration, Instant};

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
