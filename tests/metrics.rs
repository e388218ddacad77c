//! The `metrics` feature: `MetricsHandler` records acquisitions, releases,
//! lost leases and renewal batches, with their kind and outcome as labels,
//! into the recorder the service installed (here one that keeps every
//! value). Its own binary: it installs a global recorder.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use metrics::{Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata};
use metrics::{Recorder, SharedString, Unit};
use redlease::{Client, MetricsHandler};
use redlease_testkit::{wait_until, RedisServer};

/// Every value recorded, by `name{label=value,...}`.
#[derive(Default)]
struct Kept(Mutex<BTreeMap<String, Vec<f64>>>);

struct One(Arc<Kept>, String);

impl CounterFn for One {
    fn increment(&self, value: u64) {
        self.record(value as f64);
    }
    fn absolute(&self, value: u64) {
        self.record(value as f64);
    }
}

impl HistogramFn for One {
    fn record(&self, value: f64) {
        let mut kept = self.0 .0.lock().unwrap();
        kept.entry(self.1.clone()).or_default().push(value);
    }
}

struct Keeper(Arc<Kept>);

impl Keeper {
    fn one(&self, key: &Key) -> Arc<One> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Arc::new(One(
            Arc::clone(&self.0),
            format!("{}{{{}}}", key.name(), labels.join(",")),
        ))
    }
}

impl Recorder for Keeper {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.one(key))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.one(key))
    }
}

#[test]
fn metrics_are_recorded_with_kind_and_outcome() {
    let kept = Arc::new(Kept::default());
    metrics::set_global_recorder(Keeper(Arc::clone(&kept))).expect("the only recorder");
    let values = |name: &str| {
        kept.0
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    };
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(300))
        .event_handler(MetricsHandler)
        .build()
        .expect("client");
    let holder = Client::open(srv.url()).expect("client");
    let g = holder.lock("m").lock().expect("lock");
    let lock = c.lock("m");
    let waiter = thread::spawn(move || drop(lock.try_lock_for(Duration::from_secs(10)).unwrap()));
    wait_until("the waiter", Duration::from_secs(10), || {
        c.stats().subscribed_channels == 2
    });
    thread::sleep(Duration::from_millis(50));
    drop(g);
    waiter.join().expect("waiter");
    drop(c.fair_lock("m:fair").try_lock().unwrap().expect("fair"));
    let lost = c.lock("m:lost").lock().expect("lock");
    srv.cmd(&["DEL", "m:lost"]);
    wait_until("the loss", Duration::from_secs(10), || lost.is_lost());
    drop(lost);

    assert_eq!(
        values("redlease_acquisitions_total{kind=lock,outcome=waited}"),
        [1.0]
    );
    assert_eq!(
        values("redlease_acquisitions_total{kind=lock,outcome=immediate}"),
        [1.0]
    );
    assert_eq!(
        values("redlease_acquisitions_total{kind=fair-lock,outcome=immediate}"),
        [1.0]
    );
    let waits = values("redlease_acquire_wait_seconds{kind=lock}");
    assert_eq!(waits.len(), 2);
    assert!(waits[0] >= 0.05, "the wait is measured: {waits:?}");
    assert_eq!(
        values("redlease_releases_total{kind=lock,outcome=released}"),
        [1.0]
    );
    assert_eq!(
        values("redlease_releases_total{kind=lock,outcome=failed}"),
        [1.0]
    );
    assert_eq!(values("redlease_hold_seconds{kind=fair-lock}").len(), 1);
    assert_eq!(values("redlease_leases_lost_total{kind=lock}"), [1.0]);
    assert!(!values("redlease_renewal_batches_total{}").is_empty());
    assert!(values("redlease_renewal_batch_locks{}")
        .iter()
        .all(|&n| n >= 1.0));
    assert!(!values("redlease_renewal_round_trip_seconds{}").is_empty());
    println!("{:#?}", kept.0.lock().unwrap());
}
