//! A semaphore: at most N holders at once across processes (Redisson's
//! `RSemaphore` layout); permits are returned when their guard drops.
//!
//! ```text
//! cargo run --example semaphore
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let uploads = client.semaphore("example:uploads");
    uploads.delete()?; // start from scratch for the demo
    uploads.try_set_permits(2)?; // two uploads at a time, cluster-wide

    let a = uploads.acquire(1)?;
    let b = uploads.acquire(1)?;
    println!("available now: {}", uploads.available_permits()?);
    // A third must wait; here it gives up after 100 ms.
    let third = uploads.try_acquire_for(1, Duration::from_millis(100))?;
    println!("a third got a permit: {}", third.is_some());
    for h in uploads.holders()? {
        println!("held by {} ({} permit)", h.owner, h.count);
    }
    drop(a); // returned on drop ...
    b.release()?; // ... or explicitly, to see the outcome
    println!("available again: {}", uploads.available_permits()?);
    Ok(())
}
