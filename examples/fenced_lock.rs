//! A fenced lock guarding a write: each acquisition gets a token that only
//! grows, and the storage refuses a write with a token older than the last
//! it accepted. So a holder that paused past its lease (and lost the lock
//! to another) cannot overwrite the newer holder's work.
//!
//! ```text
//! cargo run --example fenced_lock
//! ```

#[path = "support/mod.rs"]
mod support;

use std::sync::Mutex;
use std::time::Duration;

/// Stands for any store that can check a token on write (a database row
/// with a `token` column, an object store's conditional put, ...).
struct Storage {
    last_token: Mutex<u64>,
}

impl Storage {
    fn write(&self, token: u64, what: &str) -> Result<(), String> {
        let mut last = self.last_token.lock().unwrap();
        if token < *last {
            return Err(format!("refused {what:?}: token {token} < {}", *last));
        }
        *last = token;
        println!("stored {what:?} with token {token}");
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let lock = client.fenced_lock("example:fenced:report");
    let storage = Storage {
        last_token: Mutex::new(0),
    };

    // A first holder takes the lock with a short lease, then "pauses" past it.
    let slow = lock.lock_with_lease(Duration::from_millis(200))?;
    let slow_token = slow.token().expect("a fenced lock's guard has a token");
    std::thread::sleep(Duration::from_millis(300));

    // Meanwhile the lease ran out and a second holder took the lock.
    let fast = lock.lock()?;
    let fast_token = fast.token().expect("token");
    storage.write(fast_token, "report v2")?;
    drop(fast);

    // The first holder wakes up: ensure_held() tells it the lock is gone,
    // and even if it wrote anyway, its older token is refused.
    println!(
        "first holder still holds it: {}",
        slow.ensure_held().is_ok()
    );
    if let Err(refused) = storage.write(slow_token, "report v1") {
        println!("{refused}");
    }
    Ok(())
}
