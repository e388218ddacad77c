//! Calling redlease from a tokio service. redlease blocks, so each call
//! goes to `spawn_blocking`; the guard is an `OwnedLockGuard` (`Send`), so
//! it can be taken on one blocking thread and released on another, across
//! `.await`s. What cannot be cancelled: a blocking call runs to its end
//! (bound it with `try_lock_for`), and a dropped future does not release a
//! lock: release it explicitly, or let the guard's drop do it.
//!
//! ```text
//! cargo run --example tokio_service
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use redlease::{OwnedLock, OwnedLockGuard};

/// Takes the lock without blocking the async runtime; `None` if it stayed
/// busy for `wait`.
async fn acquire(lock: OwnedLock, wait: Duration) -> redlease::Result<Option<OwnedLockGuard>> {
    tokio::task::spawn_blocking(move || lock.try_lock_for(wait))
        .await
        .expect("the blocking task panicked")
}

/// Releases it without blocking the async runtime.
async fn release(guard: OwnedLockGuard) -> redlease::Result<()> {
    tokio::task::spawn_blocking(move || guard.unlock())
        .await
        .expect("the blocking task panicked")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    // Client::open connects (it blocks): do it once, at start, off the runtime.
    let client = tokio::task::spawn_blocking(move || redlease::Client::open(url)).await??;
    let lock = client.lock("example:tokio:invoice-7").owned();

    let mut tasks = Vec::new();
    for task in 0..3 {
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            let Some(guard) = acquire(lock, Duration::from_secs(5)).await? else {
                println!("task {task}: still busy after 5 s");
                return Ok::<_, redlease::Error>(());
            };
            println!("task {task} holds the lock");
            tokio::time::sleep(Duration::from_millis(50)).await; // async work while holding it
            guard.ensure_held()?; // cheap, no I/O: fine on the runtime
            release(guard).await?;
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
