//! A count-down latch (Redisson's `RCountDownLatch` layout): waiters block
//! until the count reaches zero, from any process.
//!
//! ```text
//! cargo run --example latch
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let ready = client.count_down_latch("example:services-ready");
    ready.delete()?;
    ready.try_set_count(3)?; // three services must report ready

    let waiter = {
        let ready = ready.clone();
        std::thread::spawn(move || ready.wait_for(Duration::from_secs(10)))
    };
    for service in ["db", "cache", "search"] {
        std::thread::sleep(Duration::from_millis(50));
        let left = ready.count_down()?;
        println!("{service} is ready; {left} to go");
    }
    println!(
        "the waiter saw the latch open: {}",
        waiter.join().expect("waiter")?
    );
    Ok(())
}
