//! The cost of replica sync (`sync_replicas`, WAIT after every lock write)
//! on an uncontended acquire+release, beside the same pair without it and
//! the round-trip floor, all against one master with one replica, measured
//! in the same run. Run with `cargo bench --bench replica_sync` (about 30 s);
//! the `SUMMARY:` lines are the result.
//!
//! Redis (master and replica) runs on core 0, this process on core 1. The
//! three routines are measured by criterion and, interleaved, in 40 rounds
//! of 20 ms bursts in rotating order; the ratios are medians of per-round
//! ratios.

mod support;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use support::{Mode, RedisServer};

const LEASE: Duration = Duration::from_secs(30);

fn main() {
    support::pin_self();
    let mode = support::mode();
    let master = support::start_server();
    let replica =
        RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    support::pin(&replica);
    let deadline = Instant::now() + Duration::from_secs(20);
    while replica.info_field("replication", "master_link_status") != "up" {
        assert!(
            Instant::now() < deadline,
            "the replica did not sync within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let synced = redlease::Client::builder(master.url())
        .sync_replicas(1, Duration::from_secs(1))
        .build()
        .expect("client with replica sync");
    let plain = redlease::Client::builder(master.url())
        .sync_replicas(0, Duration::ZERO)
        .build()
        .expect("client without replica sync");
    let mut ping_conn = master.conn();

    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    {
        let mut group = c.benchmark_group("replica_sync");
        group.throughput(Throughput::Elements(1));
        group.bench_function("ping", |b| {
            b.iter(|| {
                redis::cmd("PING")
                    .query::<()>(&mut ping_conn)
                    .expect("PING")
            })
        });
        let lock = plain.lock("bench:sync:off");
        group.bench_function("pair_without_wait", |b| {
            b.iter(|| drop(lock.lock_with_lease(LEASE).expect("lock")))
        });
        let lock = synced.lock("bench:sync:on");
        group.bench_function("pair_with_wait", |b| {
            b.iter(|| drop(lock.lock_with_lease(LEASE).expect("lock")))
        });
        group.finish();
    }
    c.final_summary();
    if mode == Mode::List {
        return;
    }

    let (rounds, burst) = if mode == Mode::Bench {
        (40, Duration::from_millis(20))
    } else {
        (2, Duration::from_millis(5))
    };
    let off = plain.lock("bench:sync:il:off");
    let on = synced.lock("bench:sync:il:on");
    let rates = support::interleaved(
        rounds,
        burst,
        &mut [
            &mut || {
                redis::cmd("PING")
                    .query::<()>(&mut ping_conn)
                    .expect("PING")
            },
            &mut || drop(off.lock_with_lease(LEASE).expect("lock")),
            &mut || drop(on.lock_with_lease(LEASE).expect("lock")),
        ],
    );
    let (median, ratio) = (support::median, |a, b, s| support::ratio(&rates, a, b, s));
    let floor = median(&rates[0]) / 2.0;
    println!(
        "SUMMARY: floor (PING/s ÷ 2) {floor:.0} pairs/s; without WAIT {:.0} pairs/s; with WAIT \
         (1 replica) {:.0} pairs/s",
        median(&rates[1]),
        median(&rates[2])
    );
    println!(
        "SUMMARY: with/without WAIT {:.2}; without WAIT / floor {:.2}; with WAIT / floor {:.2}",
        ratio(2, 1, 1.0),
        ratio(1, 0, 0.5),
        ratio(2, 0, 0.5)
    );
    let stats = synced.stats();
    println!("DIAG: synced client {stats:?}");
}
