//! A read-write lock: many readers at once, or one writer (Redisson's
//! `RReadWriteLock` layout).
//!
//! ```text
//! cargo run --example read_write_lock
//! ```

#[path = "support/mod.rs"]
mod support;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let config = client.read_write_lock("example:config");

    // Readers share it: a second reader (here another thread) gets in too.
    let reading = config.read_lock().lock()?;
    let other = config.clone();
    let shared = std::thread::spawn(move || other.read_lock().try_lock().map(|g| g.is_some()))
        .join()
        .expect("reader thread")?;
    println!("a second reader got in: {shared}");
    // A writer waits for every reader.
    let other = config.clone();
    let writer_now = std::thread::spawn(move || other.write_lock().try_lock().map(|g| g.is_some()))
        .join()
        .expect("writer thread")?;
    println!("a writer got in while reading: {writer_now}");
    for h in config.holders()? {
        println!("holder {} ({:?} x{})", h.owner, h.mode, h.count);
    }
    drop(reading);

    let writing = config.write_lock().lock()?;
    println!("write-locked: {}", config.is_write_locked()?);
    writing.unlock()?;
    Ok(())
}
