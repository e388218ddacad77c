//! RedLock over 3 and 5 independent masters beside one lock on one master,
//! measured in the same run: uncontended acquire + release (interleaved
//! rounds, medians of per-round ratios), and the hand-off latency from a
//! release to a waiting RedLock holding.
//!
//! All masters on core 0, this process on core 1. Run with
//! `cargo bench --bench redlock` (about 30 s); the `SUMMARY:` lines are the
//! result. Without `--bench` it runs a short smoke pass.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{Mode, RedisServer};

const LEASE: Duration = Duration::from_secs(30);

fn client(server: &RedisServer) -> redlease::Client {
    redlease::Client::builder(server.url())
        .sync_replicas(0, Duration::ZERO)
        .build()
        .expect("client")
}

fn client_at(url: &str) -> redlease::Client {
    redlease::Client::builder(url)
        .sync_replicas(0, Duration::ZERO)
        .build()
        .expect("client")
}

/// Pairs/s of one lock, a RedLock of 3 and of 5, and 3 locks taken one
/// after another (what a sequential RedLock costs), interleaved.
fn pairs(mode: Mode, what: &str, urls: &[String]) {
    let clients: Vec<redlease::Client> = urls.iter().map(|u| client_at(u)).collect();
    let one = clients[0].lock("bench:one");
    let red3 = redlease::RedLock::new(clients[..3].iter().map(|c| c.lock("bench:r3")).collect())
        .expect("RedLock of 3");
    let red5 = redlease::RedLock::new(clients.iter().map(|c| c.lock("bench:r5")).collect())
        .expect("RedLock of 5");
    let seq: Vec<redlease::Lock> = clients[..3].iter().map(|c| c.lock("bench:seq")).collect();
    let mut sequential = || {
        let guards: Vec<_> = seq
            .iter()
            .map(|l| l.lock_with_lease(LEASE).expect("lock"))
            .collect();
        drop(guards);
    };
    for _ in 0..100 {
        drop(one.lock_with_lease(LEASE).expect("lock"));
        drop(red3.lock_with_lease(LEASE).expect("lock"));
        drop(red5.lock_with_lease(LEASE).expect("lock"));
        sequential();
    }
    let (rounds, burst) = if mode == Mode::Bench {
        (40, Duration::from_millis(30))
    } else {
        (2, Duration::from_millis(5))
    };
    let rates = support::interleaved(
        rounds,
        burst,
        &mut [
            &mut || drop(one.lock_with_lease(LEASE).expect("lock")),
            &mut || drop(red3.lock_with_lease(LEASE).expect("lock")),
            &mut || drop(red5.lock_with_lease(LEASE).expect("lock")),
            &mut sequential,
        ],
    );
    let (median, cost) = (support::median, |a| 1.0 / support::ratio(&rates, a, 0, 1.0));
    println!(
        "SUMMARY: {what}: pairs/s: one lock {:.0}; RedLock of 3 {:.0} (cost {:.2}x one lock); \
         RedLock of 5 {:.0} ({:.2}x); 3 locks one after another {:.0} ({:.2}x)",
        median(&rates[0]),
        median(&rates[1]),
        cost(1),
        median(&rates[2]),
        cost(2),
        median(&rates[3]),
        cost(3),
    );
}

fn main() {
    support::pin_self();
    let mode = support::mode();
    if mode == Mode::List {
        return;
    }
    let servers: Vec<RedisServer> = (0..5).map(|_| support::start_server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    // On loopback every round trip is CPU: the masters share one core, so N
    // masters cost about N times one master's CPU, in parallel or not.
    pairs(mode, "loopback, masters on one core", &urls);
    // With a network between client and masters (a proxy adding 0.5 ms each
    // way), the round trip dominates: what sending to all at once saves.
    let proxies: Vec<support::Proxy> = servers
        .iter()
        .map(|s| {
            let p = support::Proxy::start(s.addr());
            p.set_delay(Duration::from_micros(500));
            p
        })
        .collect();
    let proxied: Vec<String> = proxies.iter().map(support::Proxy::url).collect();
    pairs(mode, "masters 1 ms away (proxy)", &proxied);
    let clients: Vec<redlease::Client> = servers.iter().map(client).collect();

    // Hand-off: a thread waits on the RedLock of 3 while this one holds it;
    // from this release to the waiter holding.
    let n = if mode == Mode::Bench { 300 } else { 5 };
    let mut lat = Vec::with_capacity(n);
    let waiter_clients: Vec<redlease::Client> = servers[..3].iter().map(client).collect();
    for i in 0..n {
        let name = format!("bench:handoff:{i}");
        let red = redlease::RedLock::new(clients[..3].iter().map(|c| c.lock(&name)).collect())
            .expect("RedLock");
        let g = red.lock_with_lease(LEASE).expect("lock");
        let (tx, rx) = mpsc::channel();
        let wc = waiter_clients.clone();
        let name2 = name.clone();
        let t = std::thread::spawn(move || {
            let red = redlease::RedLock::new(wc.iter().map(|c| c.lock(&name2)).collect())
                .expect("RedLock");
            let got = red
                .try_lock_with_lease(Duration::from_secs(10), LEASE)
                .expect("waiter");
            let at = Instant::now();
            drop(got.expect("acquired"));
            tx.send(at).expect("report");
        });
        let chan = format!("redisson_lock__channel:{{{name}}}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while servers[0].subscribers(&chan) == 0 {
            assert!(Instant::now() < deadline, "the waiter did not subscribe");
            std::thread::sleep(Duration::from_micros(200));
        }
        let released = Instant::now();
        g.unlock().expect("unlock");
        let at = rx.recv_timeout(Duration::from_secs(10)).expect("hand-off");
        lat.push(at.duration_since(released));
        t.join().expect("waiter");
    }
    lat.sort();
    println!(
        "SUMMARY: RedLock of 3 hand-off (release -> waiter holds): p50 {} p99 {} ({} hand-offs)",
        support::ms(support::quantile(&lat, 0.5)),
        support::ms(support::quantile(&lat, 0.99)),
        n
    );
}
