//! A MultiLock: several locks taken as one (all or none), e.g. both
//! accounts of a transfer, in any order without deadlock.
//!
//! ```text
//! cargo run --example multilock
//! ```

#[path = "support/mod.rs"]
mod support;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let transfer = redlease::MultiLock::new(vec![
        client.lock("example:account:alice"),
        client.lock("example:account:bob"),
    ])?;

    let both = transfer.lock()?;
    println!("holding {} accounts", both.member_count());
    // Another thread cannot take either account meanwhile.
    let alice = client.lock("example:account:alice");
    let busy = std::thread::spawn(move || alice.try_lock().map(|g| g.is_none()))
        .join()
        .expect("thread")?;
    println!("alice's account busy for others: {busy}");
    both.unlock()?;
    Ok(())
}
