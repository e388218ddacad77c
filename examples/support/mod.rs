//! What the examples share: a Redis to talk to. `REDIS_URL` if set, else a
//! Redis at 127.0.0.1:6379 if one answers, else a throwaway `redis-server`
//! on a free port (killed when the example ends).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway redis-server, killed when dropped.
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn redis_url() -> Result<(String, Option<Server>), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Ok((url, None));
    }
    if answers_ping(6379) {
        return Ok(("redis://127.0.0.1:6379/".into(), None));
    }
    let (url, server) = throwaway()?;
    Ok((url, Some(server)))
}

/// A throwaway redis-server on a free loopback port.
pub fn throwaway() -> Result<(String, Server), Box<dyn std::error::Error>> {
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
    Ok((format!("redis://127.0.0.1:{port}/"), server))
}

pub fn answers_ping(port: u16) -> bool {
    let addr = ([127, 0, 0, 1], port).into();
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// `n` Redis servers of their own (RedLock needs independent masters):
/// `REDIS_URLS` (comma separated) if set, else `n` throwaway servers.
pub fn independent_urls(
    n: usize,
) -> Result<(Vec<String>, Vec<Server>), Box<dyn std::error::Error>> {
    if let Ok(urls) = std::env::var("REDIS_URLS") {
        return Ok((urls.split(',').map(str::to_owned).collect(), Vec::new()));
    }
    let mut urls = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..n {
        let (url, server) = throwaway()?;
        urls.push(url);
        servers.push(server);
    }
    Ok((urls, servers))
}
