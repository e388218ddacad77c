//! The `metrics` feature: [`MetricsHandler`], an event handler that
//! records redlease's events with the [`metrics`](https://docs.rs/metrics)
//! facade, into whatever recorder the service installed (Prometheus,
//! StatsD, ...).

use crate::events::{
    AcquireEvent, FailoverEvent, HandleEvent, LostEvent, ReconnectEvent, ReleaseEvent,
    RenewalBatchEvent,
};

/// Records redlease's events as metrics (set it with
/// [`ClientBuilder::event_handler`](crate::ClientBuilder::event_handler)).
///
/// | name | type | labels | what |
/// |---|---|---|---|
/// | `redlease_acquisitions_total` | counter | `kind`, `outcome` (`immediate`, `waited`) | acquisitions |
/// | `redlease_acquire_wait_seconds` | histogram | `kind` | from the call to the acquisition |
/// | `redlease_releases_total` | counter | `kind`, `outcome` (`released`, `failed`) | releases |
/// | `redlease_hold_seconds` | histogram | `kind` | from the acquisition to the release |
/// | `redlease_leases_lost_total` | counter | `kind` | held locks found lost |
/// | `redlease_renewal_batches_total` | counter | | watchdog batches |
/// | `redlease_renewal_batch_locks` | histogram | | locks per batch |
/// | `redlease_renewal_round_trip_seconds` | histogram | | a batch's round trips |
/// | `redlease_failovers_total` | counter | | failovers followed |
/// | `redlease_subscriber_reconnects_total` | counter | | subscriber reconnects |
///
/// `kind` is `lock`, `fenced-lock`, `fair-lock`, `read-lock`, `write-lock`,
/// `semaphore` or `expirable-semaphore`.
///
/// ```
/// # fn main() -> redlease::Result<()> {
/// let client = redlease::Client::builder("redis://127.0.0.1/")
///     .event_handler(redlease::MetricsHandler)
///     .build_lazy()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub struct MetricsHandler;

impl HandleEvent for MetricsHandler {
    fn handle_acquire(&self, e: AcquireEvent<'_>) {
        let outcome = if e.had_to_wait() {
            "waited"
        } else {
            "immediate"
        };
        metrics::counter!("redlease_acquisitions_total", "kind" => e.kind(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("redlease_acquire_wait_seconds", "kind" => e.kind())
            .record(e.waited().as_secs_f64());
    }

    fn handle_release(&self, e: ReleaseEvent<'_>) {
        let outcome = if e.ok() { "released" } else { "failed" };
        metrics::counter!("redlease_releases_total", "kind" => e.kind(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("redlease_hold_seconds", "kind" => e.kind())
            .record(e.held().as_secs_f64());
    }

    fn handle_lost(&self, e: LostEvent<'_>) {
        metrics::counter!("redlease_leases_lost_total", "kind" => e.kind()).increment(1);
    }

    fn handle_renewal_batch(&self, e: RenewalBatchEvent) {
        metrics::counter!("redlease_renewal_batches_total").increment(1);
        #[allow(clippy::cast_precision_loss)]
        metrics::histogram!("redlease_renewal_batch_locks").record(e.locks() as f64);
        metrics::histogram!("redlease_renewal_round_trip_seconds")
            .record(e.round_trip().as_secs_f64());
    }

    fn handle_failover(&self, _: FailoverEvent<'_>) {
        metrics::counter!("redlease_failovers_total").increment(1);
    }

    fn handle_subscriber_reconnect(&self, _: ReconnectEvent<'_>) {
        metrics::counter!("redlease_subscriber_reconnects_total").increment(1);
    }
}
