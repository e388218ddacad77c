//! RedLock over independent Redis masters: the lock is held while a
//! majority of them hold it, so it survives one master failing.
//!
//! ```text
//! cargo run --example redlock                  # starts 3 throwaway servers
//! REDIS_URLS=redis://a/,redis://b/,redis://c/ cargo run --example redlock
//! ```

#[path = "support/mod.rs"]
mod support;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (urls, _servers) = support::independent_urls(3)?;
    // One client per master: RedLock needs independent ones, not a cluster.
    let clients = urls
        .iter()
        .map(|u| redlease::Client::open(u.as_str()))
        .collect::<redlease::Result<Vec<_>>>()?;
    let redlock =
        redlease::RedLock::new(clients.iter().map(|c| c.lock("example:redlock")).collect())?;

    let guard = redlock.lock()?;
    println!(
        "held on {} masters, valid for {:?} at least",
        guard.member_count(),
        guard.valid_until() - std::time::Instant::now()
    );
    guard.ensure_held()?;
    guard.unlock()?;
    println!("released on every master");
    Ok(())
}
