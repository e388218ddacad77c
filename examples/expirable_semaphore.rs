//! A semaphore whose permits expire (Redisson's
//! `RPermitExpirableSemaphore` layout): a holder that crashes gives its
//! permit back when the permit's lease runs out.
//!
//! ```text
//! cargo run --example expirable_semaphore
//! ```

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let slots = client.permit_expirable_semaphore("example:slots");
    slots.delete()?;
    slots.try_set_permits(1)?;

    // A permit taken and "forgotten" (as by a crashed process): it comes back
    // by itself after its 300 ms lease.
    let id = slots.acquire(Duration::from_millis(300))?.forget();
    println!(
        "took permit {id}; available: {}",
        slots.available_permits()?
    );
    let next = slots.try_acquire_for(Duration::from_secs(2), Duration::from_secs(10))?;
    println!(
        "the next caller got one after the lease ran out: {}",
        next.is_some()
    );

    if let Some(permit) = next {
        permit.update_lease(Duration::from_secs(30))?; // holding longer
        println!(
            "valid until {:?} from now",
            permit.valid_until() - std::time::Instant::now()
        );
        permit.release()?;
    }
    Ok(())
}
