//! Who holds a lock, and what happens to it: `holders()` names each
//! holder's host, process id and application name; an event handler hears
//! acquisitions, releases and lost leases (the `metrics` feature's
//! `MetricsHandler` records them as metrics).
//!
//! ```text
//! cargo run --example who_holds
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use redlease::{AcquireEvent, HandleEvent, ReleaseEvent};

/// Logs what it hears (a service would count it or export it).
struct Log;

impl HandleEvent for Log {
    fn handle_acquire(&self, e: AcquireEvent<'_>) {
        println!(
            "event: {} {} acquired after {:?}",
            e.kind(),
            e.name(),
            e.waited()
        );
    }

    fn handle_release(&self, e: ReleaseEvent<'_>) {
        println!(
            "event: {} {} released after {:?} held",
            e.kind(),
            e.name(),
            e.held()
        );
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::builder(url.as_str())
        .name("billing-worker")
        .event_handler(Log)
        .build()?;
    let lock = client.lock("example:orders:42");
    let guard = lock.lock()?;

    // The holder's process is published in the background once it holds
    // something; give it a moment in this demo.
    let mut holders = lock.holders()?;
    for _ in 0..100 {
        if holders.iter().all(|h| h.process.is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        holders = lock.holders()?;
    }
    for h in &holders {
        match &h.process {
            Some(p) => println!(
                "{} holds it x{}: {:?}, pid {} on {}, lease left {:?}",
                h.owner, h.count, p.name, p.pid, p.host, h.remaining_lease
            ),
            None => println!("{} holds it (not a redlease client)", h.owner),
        }
    }
    let found = client.inspect("example:orders:42")?;
    println!(
        "inspect: a {} with {} holder(s)",
        found.kind.as_str(),
        found.holders.len()
    );
    drop(guard);
    // From a terminal: cargo run -p redlease-cli -- --url <url> inspect example:orders:42
    Ok(())
}
