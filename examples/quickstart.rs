//! Quickstart: acquire a lock, re-enter it, look at the hold count, release.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Uses `REDIS_URL` if set, else a Redis at 127.0.0.1:6379 if one answers,
//! else starts a throwaway `redis-server` on a free port for the demo.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = redis_url()?;
    println!("using {url}");

    let client = redlease::Client::open(url)?;
    let lock = client.lock("quickstart:orders:42");

    let guard = lock.lock()?; // waits as long as it takes; renewed by the watchdog
    println!(
        "acquired {:?}, hold count {}",
        guard.name(),
        lock.hold_count()?
    );

    let again = lock.lock()?; // the same thread may take it again
    println!("re-entered, hold count {}", lock.hold_count()?);
    println!("lease left: {:?}", lock.remaining_lease()?);

    // Another thread of this process does not own it: try_lock says "busy".
    let other = lock.clone();
    let busy = std::thread::spawn(move || other.try_lock().map(|g| g.is_none())).join();
    println!("busy for another thread: {}", matches!(busy, Ok(Ok(true))));

    drop(again);
    println!("released once, hold count {}", lock.hold_count()?);
    guard.ensure_held()?; // cheap check before a side effect the lock protects
    guard.unlock()?;
    println!("released, locked: {}", lock.is_locked()?);
    Ok(())
}

/// A throwaway redis-server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_url() -> Result<(String, Option<Server>), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Ok((url, None));
    }
    if answers_ping(6379) {
        return Ok(("redis://127.0.0.1:6379/".into(), None));
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "no Redis at 127.0.0.1:6379 and no redis-server to start ({e}): run \
                 `bash scripts/test.sh` once (it installs redis-server), or set REDIS_URL"
            )
        })?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers_ping(port) {
        if Instant::now() > deadline {
            return Err("the throwaway redis-server did not answer within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("started a throwaway redis-server on port {port}");
    Ok((format!("redis://127.0.0.1:{port}/"), Some(server)))
}

fn answers_ping(port: u16) -> bool {
    let addr = ([127, 0, 0, 1], port).into();
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
