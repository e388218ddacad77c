//! Leader election: every instance tries to become leader; the one that
//! holds the lock leads, checks `ensure_held` before each act of leadership,
//! and hears at once (`on_lock_lost`) if its lease is lost. When the leader
//! goes, another instance takes over within the lease.
//!
//! ```text
//! cargo run --example leader_election
//! ```

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One instance of a service: tries to lead for `rounds` turns.
fn instance(url: String, name: &'static str, rounds: u32) -> redlease::Result<()> {
    let lost = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&lost);
    let client = redlease::Client::builder(url.as_str())
        .name(name)
        .watchdog_timeout(Duration::from_secs(2)) // a dead leader is replaced within 2 s
        .on_lock_lost(move |_| flag.store(true, Ordering::Relaxed))
        .build()?;
    let leadership = client.lock("example:leader");
    for _ in 0..rounds {
        // Wait a while to become leader, then do the leader's work.
        let Some(guard) = leadership.try_lock_for(Duration::from_secs(5))? else {
            continue;
        };
        println!("{name} leads");
        for tick in 0..3 {
            guard.ensure_held()?; // before each act that only the leader may do
            if lost.load(Ordering::Relaxed) {
                break;
            }
            println!("{name}: leader's work, tick {tick}");
            std::thread::sleep(Duration::from_millis(100));
        }
        println!("{name} steps down");
        drop(guard);
        std::thread::sleep(Duration::from_millis(50)); // let another lead
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let a = {
        let url = url.clone();
        std::thread::spawn(move || instance(url, "instance-a", 2))
    };
    let b = std::thread::spawn(move || instance(url, "instance-b", 2));
    a.join().expect("instance a")?;
    b.join().expect("instance b")?;
    Ok(())
}
