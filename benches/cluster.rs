//! Redis Cluster beside one Redis, in the same run: an uncontended
//! acquire+release, and the cost of keeping 10,000 watched locks alive.
//!
//! One `redis-server` and a 3-master cluster (no replicas, so that the
//! figures are the client's and the masters' own), all on core 0; this
//! process on core 1.
//!
//! * pairs: `lock_with_lease()` + drop on one name, interleaved in rounds of
//!   20 ms bursts against the single server and the cluster, beside two
//!   PING round trips to one server (the floor); medians of per-round ratios.
//! * keep-alive: 10,000 locks with `try_lock` on a client with a 3 s
//!   `watchdog_timeout` (renewed every second), then a 10 s window:
//!   renewals/s, watchdog wake-ups and round trips (`ClientStats`), this
//!   process's CPU and the servers' CPU, locks lost.
//!
//! Run with `cargo bench --bench cluster` (about 60 s); the `SUMMARY:` lines
//! are the result. Without `--bench` it runs a short smoke pass.

mod support;

use std::time::{Duration, Instant};

use redlease_testkit::Cluster;
use support::{Mode, RedisServer};

const LEASE: Duration = Duration::from_secs(30);

fn main() {
    support::pin_self();
    let mode = support::mode();
    if mode == Mode::List {
        return;
    }
    let single = support::start_server();
    let cluster = Cluster::start(3, 0);
    for node in cluster.nodes() {
        support::pin(node);
    }
    pairs(mode, &single, &cluster);
    keep_alive(mode, &single, &cluster);
}

fn pairs(mode: Mode, single: &RedisServer, cluster: &Cluster) {
    let one = redlease::Client::builder(single.url())
        .build()
        .expect("client of one server");
    let many = redlease::Client::cluster_builder(cluster.seeds())
        .build()
        .expect("client of the cluster");
    let mut ping = single.conn();
    let (rounds, burst) = if mode == Mode::Bench {
        (60, Duration::from_millis(20))
    } else {
        (2, Duration::from_millis(5))
    };
    let on_one = one.lock("bench:pair");
    let on_many = many.lock("bench:pair");
    // Warm up: pools, scripts, slot map.
    for _ in 0..200 {
        drop(on_one.lock_with_lease(LEASE).expect("lock"));
        drop(on_many.lock_with_lease(LEASE).expect("lock"));
    }
    let rates = support::interleaved(
        rounds,
        burst,
        &mut [
            &mut || redis::cmd("PING").query::<()>(&mut ping).expect("PING"),
            &mut || drop(on_one.lock_with_lease(LEASE).expect("lock")),
            &mut || drop(on_many.lock_with_lease(LEASE).expect("lock")),
        ],
    );
    let (median, ratio) = (support::median, |a, b, s| support::ratio(&rates, a, b, s));
    println!(
        "SUMMARY: pairs: floor (PING/s ÷ 2) {:.0}/s; one Redis {:.0}/s; cluster {:.0}/s; \
         cluster/one {:.2}; one/floor {:.2}; cluster/floor {:.2}",
        median(&rates[0]) / 2.0,
        median(&rates[1]),
        median(&rates[2]),
        ratio(2, 1, 1.0),
        ratio(1, 0, 0.5),
        ratio(2, 0, 0.5)
    );
}

fn keep_alive(mode: Mode, single: &RedisServer, cluster: &Cluster) {
    let (n, window) = if mode == Mode::Bench {
        (10_000, Duration::from_secs(10))
    } else {
        (500, Duration::from_secs(2))
    };
    let servers: Vec<&RedisServer> = std::iter::once(single).collect();
    measure("one Redis", n, window, &servers, || {
        redlease::Client::builder(single.url())
            .watchdog_timeout(Duration::from_secs(3))
            .build()
            .expect("client")
    });
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    measure("cluster", n, window, &nodes, || {
        redlease::Client::cluster_builder(cluster.seeds())
            .watchdog_timeout(Duration::from_secs(3))
            .build()
            .expect("client")
    });
}

fn measure(
    what: &str,
    n: usize,
    window: Duration,
    servers: &[&RedisServer],
    client: impl FnOnce() -> redlease::Client,
) {
    let client = client();
    let redis_cpu = || -> Duration {
        servers
            .iter()
            .map(|s| support::cpu_time_of(s.pid().expect("server runs")))
            .sum()
    };
    let guards = support::hold_fresh_locks(&client, "bench:alive:", n);
    // Two renewal cycles to settle (scripts loaded, batches formed).
    std::thread::sleep(Duration::from_secs(2));
    let (s0, cpu0, rcpu0, t0) = (
        client.stats(),
        support::cpu_time(),
        redis_cpu(),
        Instant::now(),
    );
    std::thread::sleep(window);
    let (s1, cpu1, rcpu1, secs) = (
        client.stats(),
        support::cpu_time(),
        redis_cpu(),
        t0.elapsed().as_secs_f64(),
    );
    let renewals = (s1.renewals - s0.renewals) as f64;
    let wakeups = (s1.renewal_batches - s0.renewal_batches) as f64;
    let trips = (s1.renewal_round_trips - s0.renewal_round_trips) as f64;
    println!(
        "SUMMARY: keep-alive {what}, {n} locks: {:.0} renewals/s, {:.1} wake-ups/s, {:.1} round \
         trips/s ({:.2} per wake-up, {:.0} renewals per round trip), client CPU {:.2} % of a \
         core, Redis CPU {:.2} %, lost {}",
        renewals / secs,
        wakeups / secs,
        trips / secs,
        trips / wakeups.max(1.0),
        renewals / trips.max(1.0),
        100.0 * (cpu1 - cpu0).as_secs_f64() / secs,
        100.0 * (rcpu1 - rcpu0).as_secs_f64() / secs,
        s1.locks_lost
    );
    drop(guards);
}
