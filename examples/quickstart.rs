//! Quickstart: acquire a lock, re-enter it, look at the hold count, release.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Uses `REDIS_URL` if set, else a Redis at 127.0.0.1:6379 if one answers,
//! else starts a throwaway `redis-server` on a free port for the demo.

#[path = "support/mod.rs"]
mod support;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    println!("using {url}");

    let client = redlease::Client::open(url)?;
    let lock = client.lock("quickstart:orders:42");

    let guard = lock.lock()?; // waits as long as it takes; renewed by the watchdog
    println!(
        "acquired {:?}, hold count {}",
        guard.name(),
        lock.hold_count()?
    );

    let again = lock.lock()?; // the same thread may take it again
    println!("re-entered, hold count {}", lock.hold_count()?);
    println!("lease left: {:?}", lock.remaining_lease()?);

    // Another thread of this process does not own it: try_lock says "busy".
    let other = lock.clone();
    let busy = std::thread::spawn(move || other.try_lock().map(|g| g.is_none())).join();
    println!("busy for another thread: {}", matches!(busy, Ok(Ok(true))));

    drop(again);
    println!("released once, hold count {}", lock.hold_count()?);
    guard.ensure_held()?; // cheap check before a side effect the lock protects
    guard.unlock()?;
    println!("released, locked: {}", lock.is_locked()?);
    Ok(())
}
