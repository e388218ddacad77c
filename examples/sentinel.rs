//! A lock through a Sentinel group: the client finds the master through the
//! sentinels and follows a failover by itself.
//!
//! ```text
//! REDIS_SENTINELS=redis://10.0.0.1:26379,redis://10.0.0.2:26379 \
//! REDIS_SENTINEL_MASTER=mymaster cargo run --example sentinel
//! ```

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (Ok(sentinels), Ok(master)) = (
        std::env::var("REDIS_SENTINELS"),
        std::env::var("REDIS_SENTINEL_MASTER"),
    ) else {
        println!(
            "no Sentinel group given: set REDIS_SENTINELS (sentinel urls, comma separated) and \
             REDIS_SENTINEL_MASTER (the master's name); see https://redis.io/docs/latest/operate/oss_and_stack/management/sentinel/"
        );
        return Ok(());
    };
    let client = redlease::Client::sentinel_builder(sentinels.split(','), &master)
        // Wait for one replica to confirm each acquisition and release, so
        // that a failover does not lose a lock (at a round trip's cost).
        .sync_replicas(1, Duration::from_secs(1))
        .build()?;
    let guard = client.lock("example:sentinel").lock()?;
    println!("held on the master of {master:?}");
    guard.unlock()?;
    Ok(())
}
