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

/// Whether a warning of `cause` may go out now: `Some((n, since))` with the
/// number held back since the last one went out, `since` ago; `None`
/// within [`WARN_EVERY`] of it (it is counted). When the map of causes is
/// full, those quiet for a minute are forgotten.
pub(crate) fn warn_allowed(cause: &str) -> Option<(u64, Duration)> {
    let now = Instant::now();
    let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((last, held)) = warned.get_mut(cause) {
        let since = now.duration_since(*last);
        if since < WARN_EVERY {
            *held += 1;
            return None;
        }
        let n = std::mem::take(held);
        *last = now;
        return Some((n, since));
    }
    if warned.len() >= 256 {
        warned.retain(|_, (last, _)| now.duration_since(*last) < Duration::from_secs(60));
    }
    warned.insert(cause.to_owned(), (now, 0));
    Some((0, Duration::ZERO))
}

/// `log::warn!`, at most once a second for the same `cause` (a string
/// naming what failed and where, without what varies from one time to the
/// next): during an outage a warning that would repeat on every retry is
/// one line a second, with the number held back since the last one. Not
/// for what must be seen each time: `warn_limited!(unless lost, ...)` lets
/// every warning through when `lost` holds (a lock or permit lost is told
/// each time).
macro_rules! warn_limited {
    (unless $always:expr, $cause:expr, $($arg:tt)+) => {
        if $always {
            log::warn!($($arg)+);
        } else {
            $crate::time::warn_limited!($cause, $($arg)+);
        }
    };
    ($cause:expr, $($arg:tt)+) => {
        if let Some((held, since)) = $crate::time::warn_allowed($cause) {
            if held == 0 {
                log::warn!($($arg)+);
            } else {
                log::warn!(
                    "{} ({held} more like it in the {:.1} s before, not shown)",
                    format_args!($($arg)+),
                    since.as_secs_f64()
                );
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

/// The instant every [`bound_us`] counts from: an hour before its first use,
/// so that the instants it is given (a request's send time plus its lease)
/// fall after it.
fn bound_base() -> Instant {
    static BASE: LazyLock<Instant> = LazyLock::new(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    });
    *BASE
}

/// `at` as whole microseconds since a fixed instant, rounded down: a lease
/// bound that errs early (by less than a microsecond), takes 8 bytes, and
/// is compared and raised without `Instant`'s arithmetic. An instant
/// before the fixed one (which has long passed) counts as it; far in the
/// future it saturates.
pub(crate) fn bound_us(at: Instant) -> u64 {
    let d = at.saturating_duration_since(bound_base());
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

/// The instant of a [`bound_us`].
pub(crate) fn bound_instant(us: u64) -> Instant {
    let base = bound_base();
    base.checked_add(Duration::from_micros(us))
        .unwrap_or_else(|| far_future(base))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One warning a second per cause, the rest counted and told with the
    /// next one, with how long they span.
    #[test]
    fn a_cause_warns_once_a_second_and_counts_the_rest() {
        let cause = "time::tests one cause";
        assert_eq!(warn_allowed(cause), Some((0, Duration::ZERO)));
        assert_eq!(warn_allowed(cause), None);
        assert_eq!(warn_allowed(cause), None);
        assert!(warn_allowed("time::tests another cause").is_some());
        std::thread::sleep(WARN_EVERY + Duration::from_millis(10));
        let (held, since) = warn_allowed(cause).expect("a second later");
        assert_eq!(held, 2);
        assert!(since >= WARN_EVERY, "{since:?}");
        assert_eq!(warn_allowed(cause), None);
    }
}
