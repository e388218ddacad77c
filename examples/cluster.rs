//! A lock on a Redis Cluster: give some nodes as seeds; the client reads the
//! slot map, follows `MOVED`/`ASK` and failovers, and waits with sharded
//! pub/sub at the master of the lock's slot.
//!
//! ```text
//! REDIS_CLUSTER_SEEDS=redis://10.0.0.1:7000,redis://10.0.0.2:7000 cargo run --example cluster
//! ```

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(seeds) = std::env::var("REDIS_CLUSTER_SEEDS") else {
        println!(
            "no Cluster given: set REDIS_CLUSTER_SEEDS (node urls, comma separated); a local \
             one: https://redis.io/docs/latest/operate/oss_and_stack/management/scaling/"
        );
        return Ok(());
    };
    let client = redlease::Client::cluster_builder(seeds.split(',')).build()?;
    // Names with a hash tag keep related locks in one slot (a MultiLock of
    // them then goes to one master).
    let guard = client.lock("example:{orders}:42").lock()?;
    println!(
        "held; holders: {:?}",
        client.lock("example:{orders}:42").holders()?.len()
    );
    guard.unlock()?;
    Ok(())
}
