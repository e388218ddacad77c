//! A fair lock: waiters get it in the order they asked (Redisson's
//! `RFairLock` layout), and `queue()` shows the line.
//!
//! ```text
//! cargo run --example fair_lock
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let fair = client.fair_lock("example:fair");

    let first = fair.lock()?;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let lock = fair.clone();
        waiters.push(std::thread::spawn(move || -> redlease::Result<()> {
            let guard = lock.lock()?;
            println!("waiter {i} has the lock");
            drop(guard);
            Ok(())
        }));
        // Let each get in line before the next one comes.
        while fair.queue()?.len() < i + 1 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for (place, w) in fair.queue()?.iter().enumerate() {
        println!(
            "in line {place}: {} (place kept {:?})",
            w.owner, w.place_kept_for
        );
    }
    drop(first); // they get it in the order they came: 0, 1, 2
    for w in waiters {
        w.join().expect("waiter")?;
    }
    Ok(())
}
