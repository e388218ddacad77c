//! How a client reaches Redis: one connect path for every connection it
//! opens, the pool's and the subscriber's alike.
//!
//! An [`Endpoint`] is an address (TCP, TLS over TCP, or a Unix socket) plus
//! the credentials and database to use there. [`Endpoint::connect`] opens a
//! [`Stream`] within the connection timeout, runs the TLS handshake (one
//! `rustls` configuration per endpoint, built once: the system's roots are
//! not reloaded per connection) and then the Redis handshake (`AUTH`,
//! `SELECT`, plus whatever the caller adds, e.g. `PING`) in one round trip,
//! bounded by the response timeout. A refused password or permission comes
//! back as an error naming what Redis said (`WRONGPASS ...`), not as a
//! timeout.
//!
//! A [`Stream`] can be read by one thread while others write to it (the
//! subscriber does that), TLS included: the TLS session state sits behind a
//! mutex that is only held to encrypt or decrypt in memory, never across
//! socket I/O, and encrypted records go out in order through one writer at a
//! time. [`Connection`] is a [`Stream`] with a RESP parser: what the pool
//! holds and what redis-rs's commands, scripts and pipelines run on.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, Value};

#[cfg(feature = "tls")]
pub(crate) use crate::net::tls::{self, TlsOptions};

/// Where to connect.
#[derive(Clone, Debug)]
pub(crate) enum Addr {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(host, port) if host.contains(':') => write!(f, "[{host}]:{port}"),
            Addr::Tcp(host, port) => write!(f, "{host}:{port}"),
            #[cfg(unix)]
            Addr::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A Redis server and how to talk to it.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) addr: Addr,
    #[cfg(feature = "tls")]
    tls: Option<tls::Tls>,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Endpoint");
        d.field("addr", &self.addr);
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.is_some());
        d.field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// TLS settings when the `tls` feature is off: there are none to give.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsOptions {}

impl Endpoint {
    /// The endpoint a parsed redis-rs connection info describes.
    ///
    /// Errors: a `rediss://` address while the `tls` feature is off, or TLS
    /// settings that cannot be used (unreadable PEM, a key that does not
    /// match), or TLS settings given for a plain address.
    pub(crate) fn new(
        info: &redis::ConnectionInfo,
        #[allow(unused_variables)] tls: &TlsOptions,
    ) -> Result<Endpoint, String> {
        #[cfg(feature = "tls")]
        let mut tls_settings = None;
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => {
                #[cfg(feature = "tls")]
                if tls.is_set() {
                    return Err(
                        "a plain address with TLS certificates set: use rediss://".to_owned()
                    );
                }
                Addr::Tcp(host.clone(), *port)
            }
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => {
                #[cfg(feature = "tls")]
                if tls.is_set() {
                    return Err(
                        "a unix socket with TLS certificates set: drop them or use rediss://"
                            .to_owned(),
                    );
                }
                Addr::Unix(path.clone())
            }
            #[cfg(feature = "tls")]
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                tls_settings = Some(tls::Tls::new(host, *insecure, tls)?);
                Addr::Tcp(host.clone(), *port)
            }
            other => {
                return Err(format!(
                    "{other} needs the `tls` feature, which this build leaves out"
                ))
            }
        };
        let settings = info.redis_settings();
        Ok(Endpoint {
            addr,
            #[cfg(feature = "tls")]
            tls: tls_settings,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        })
    }

    /// The same settings for another server (a Sentinel group's master).
    pub(crate) fn with_addr(&self, addr: Addr) -> Endpoint {
        let mut e = self.clone();
        #[cfg(feature = "tls")]
        if let (Some(tls), Addr::Tcp(host, _)) = (&e.tls, &addr) {
            e.tls = Some(tls.for_host(host));
        }
        e.addr = addr;
        e
    }

    /// Opens a stream and runs the handshake: AUTH and SELECT as configured,
    /// then `extra` (already packed), all written at once; each reply is
    /// checked, and the replies to `extra` are returned. The TCP connect
    /// and the TLS handshake are bounded by `connect_timeout`, the Redis
    /// handshake by `response_timeout`, which stays the socket's read and
    /// write timeout.
    pub(crate) fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
        extra: &[(&'static str, Vec<u8>)],
    ) -> RedisResult<(Stream, redis::Parser, Vec<Value>)> {
        let stream = self.open(connect_timeout)?;
        stream.set_timeouts(Some(response_timeout))?;
        let mut hello: Vec<(&'static str, Vec<u8>)> = Vec::with_capacity(2 + extra.len());
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            auth.arg(password);
            hello.push(("AUTH", auth.get_packed_command()));
        }
        if self.db != 0 {
            hello.push((
                "SELECT",
                redis::cmd("SELECT").arg(self.db).get_packed_command(),
            ));
        }
        let mut parser = redis::Parser::new();
        if hello.is_empty() && extra.is_empty() {
            return Ok((stream, parser, Vec::new()));
        }
        let mut buf = Vec::new();
        for (_, cmd) in hello.iter().chain(extra) {
            buf.extend_from_slice(cmd);
        }
        let written = stream.write_all(&buf);
        let mut replies = Vec::with_capacity(extra.len());
        for (i, (what, _)) in hello.iter().chain(extra).enumerate() {
            // Read also after a failed write: the server may have said why
            // it drops us (e.g. "ERR max number of clients reached").
            let reply = match parser.parse_value(&stream) {
                Ok(v) => v,
                Err(e) => {
                    // The server may refuse our certificate only now (TLS 1.3
                    // sends that alert after the handshake).
                    if let Some(text) = stream.tls_failure() {
                        return Err(tls_refused(text));
                    }
                    return Err(written.err().map_or(e, RedisError::from));
                }
            };
            if let Value::ServerError(e) = reply {
                let text = match e.details() {
                    Some(d) => format!("{} {d}", e.code()),
                    None => e.code().to_owned(),
                };
                let user = self.username.as_deref().unwrap_or("default");
                // WRONGPASS, or "ERR AUTH <password> called without any
                // password configured"; not "ERR max number of clients
                // reached", which can answer any first command.
                let refused =
                    e.code() == "WRONGPASS" || e.details().is_some_and(|d| d.starts_with("AUTH"));
                return Err(match *what {
                    "AUTH" if refused => RedisError::from((
                        ErrorKind::AuthenticationFailed,
                        "redis refused the credentials",
                        format!("{text} (user {user:?})"),
                    )),
                    // A database the server does not have: no retry fixes
                    // it (a refusal, reported at once).
                    "SELECT" => RedisError::from((
                        ErrorKind::InvalidClientConfig,
                        "redis refused the database number",
                        format!(
                            "SELECT {}: {text}: give one the server has (its `databases` setting)",
                            self.db
                        ),
                    )),
                    what => {
                        let kind = e.kind().map_or(ErrorKind::Extension, ErrorKind::Server);
                        RedisError::from((
                            kind,
                            "redis refused the connection handshake",
                            format!("{what}: {text}"),
                        ))
                    }
                });
            }
            if i >= hello.len() {
                replies.push(reply);
            }
        }
        written?;
        Ok((stream, parser, replies))
    }

    fn open(&self, timeout: Duration) -> RedisResult<Stream> {
        let started = Instant::now();
        let inner = match &self.addr {
            Addr::Tcp(host, port) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
                let mut found = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    let left = timeout.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
                        break;
                    }
                    match TcpStream::connect_timeout(&a, left) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let sock = found.ok_or(last)?;
                sock.set_nodelay(true)?;
                #[cfg(feature = "tls")]
                if let Some(tls) = &self.tls {
                    let left = timeout.saturating_sub(started.elapsed());
                    let stream = tls.handshake(sock, left).map_err(|e| {
                        if e.kind() == io::ErrorKind::InvalidData {
                            tls_refused(e.to_string())
                        } else {
                            RedisError::from(e)
                        }
                    })?;
                    return Ok(Stream(Inner::Tls(Box::new(stream))));
                }
                Inner::Tcp(sock)
            }
            #[cfg(unix)]
            Addr::Unix(path) => Inner::Unix(std::os::unix::net::UnixStream::connect(path)?),
        };
        Ok(Stream(inner))
    }
}

/// The TLS settings and the server do not agree (certificate not trusted,
/// client certificate missing or refused, no common protocol).
fn tls_refused(text: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, "TLS handshake failed", text))
}

/// A connection to Redis that one thread may read while others write.
pub(crate) struct Stream(Inner);

enum Inner {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
    #[cfg(feature = "tls")]
    Tls(Box<tls::TlsStream>),
}

impl Stream {
    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.0 {
            Inner::Tcp(s) => s.set_read_timeout(timeout),
            #[cfg(unix)]
            Inner::Unix(s) => s.set_read_timeout(timeout),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.sock.set_read_timeout(timeout),
        }
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.0 {
            Inner::Tcp(s) => s.set_write_timeout(timeout),
            #[cfg(unix)]
            Inner::Unix(s) => s.set_write_timeout(timeout),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.sock.set_write_timeout(timeout),
        }
    }

    pub(crate) fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)?;
        self.set_write_timeout(timeout)
    }

    /// Whether the server has closed the connection (or reset it) while it
    /// sat idle, told without waiting: a non-blocking peek at the socket.
    /// Bytes waiting on a plain TCP connection that nobody asked for
    /// count as closed too (Redis sends nothing unasked on these); on TLS
    /// the records waiting are taken in and read by the session (a session
    /// ticket is fine, a close_notify is not: see
    /// `TlsStream::idle_closed`). A Unix socket is not checked
    /// (`false`).
    pub(crate) fn peer_closed(&self) -> bool {
        fn peek(s: &TcpStream, data_means_closed: bool) -> bool {
            if s.set_nonblocking(true).is_err() {
                return true;
            }
            let closed = match s.peek(&mut [0u8; 1]) {
                Ok(0) => true,
                Ok(_) => data_means_closed,
                Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            };
            s.set_nonblocking(false).is_err() || closed
        }
        match &self.0 {
            Inner::Tcp(s) => peek(s, true),
            #[cfg(unix)]
            Inner::Unix(_) => false,
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.idle_closed(),
        }
    }

    /// Ends the connection both ways; a thread blocked reading it returns.
    pub(crate) fn shutdown(&self) {
        let _ = match &self.0 {
            Inner::Tcp(s) => s.shutdown(Shutdown::Both),
            #[cfg(unix)]
            Inner::Unix(s) => s.shutdown(Shutdown::Both),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.sock.shutdown(Shutdown::Both),
        };
    }

    /// What the TLS session failed on, if it did.
    fn tls_failure(&self) -> Option<String> {
        match &self.0 {
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.failure.lock().clone(),
            _ => None,
        }
    }

    /// Writes all of `buf`. Concurrent writers must take turns (the
    /// subscriber's outbox does); a reader may run at the same time.
    pub(crate) fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match &self.0 {
            Inner::Tcp(s) => (&*s).write_all(buf),
            #[cfg(unix)]
            Inner::Unix(s) => (&*s).write_all(buf),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.write_all(buf),
        }
    }

    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.0 {
            Inner::Tcp(s) => (&*s).read(buf),
            #[cfg(unix)]
            Inner::Unix(s) => (&*s).read(buf),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.read(buf),
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Stream::read(self, buf)
    }
}

/// `ASKING`, packed.
const ASKING: &[u8] = b"*1\r\n$6\r\nASKING\r\n";

/// Replies read off a connection (RESP2): what `redis::Parser` makes of
/// them, value for value, without its cost. Its decoder zeroes up to 8 KB of
/// buffer before every read from the socket, about 4,300 instructions per
/// reply: a third of the client's work per acquire + release. This buffer
/// is zeroed once, when it grows. Error replies are handed to
/// `redis::parse_redis_value`, so that they are the same values; a RESP3
/// type (never sent on these connections, which do not ask for RESP3) is a
/// parse error.
pub(crate) struct Replies {
    /// Bytes read and not yet parsed are `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// How far the reply at `start` is known to be whole: read that far
    /// (relative to `start`), with `open[i]` elements still to come in the
    /// i-th array it is inside. Kept across reads, so that a long reply
    /// arriving in many reads is walked once, not once per read.
    scanned: usize,
    open: Vec<usize>,
}

/// How deep arrays may nest (as `redis::Parser`: an element inside 100
/// arrays is refused).
const MAX_REPLY_DEPTH: usize = 100;
/// What a connection's buffer starts with and goes back to once a longer
/// reply is read.
const REPLY_BUFFER: usize = 16 * 1024;

impl Replies {
    pub(crate) fn new() -> Replies {
        Replies {
            buf: vec![0; REPLY_BUFFER],
            start: 0,
            end: 0,
            scanned: 0,
            open: Vec::new(),
        }
    }

    /// The next reply, reading from `stream` until it is whole. An error
    /// reading (a timeout included) is the `io::Error`'s, the end of the
    /// stream `UnexpectedEof`, as `redis::Parser` reports them.
    pub(crate) fn next(&mut self, mut stream: impl Read) -> RedisResult<Value> {
        while !self.scan()? {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = stream.read(&mut self.buf[self.end..])?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            self.end += n;
        }
        let whole = &self.buf[self.start..self.start + self.scanned];
        let Some((value, used)) = parse_reply(whole, 0)? else {
            return Err(parse_error("a reply scanned whole did not parse"));
        };
        debug_assert_eq!(used, self.scanned);
        self.start += self.scanned;
        self.scanned = 0;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > 4 * REPLY_BUFFER {
                self.buf = vec![0; REPLY_BUFFER];
            }
        }
        Ok(value)
    }

    /// Walks the reply at `start` on from where the last walk stopped:
    /// whether it is whole (then `scanned` is its length). Builds nothing.
    fn scan(&mut self) -> RedisResult<bool> {
        let buf = &self.buf[self.start..self.end];
        loop {
            let at = self.scanned;
            let Some(&kind) = buf.get(at) else {
                return Ok(false);
            };
            if !matches!(kind, b'+' | b'-' | b':' | b'$' | b'*') {
                return Err(parse_error("a reply of a type other than RESP2's"));
            }
            if self.open.len() >= MAX_REPLY_DEPTH {
                return Err(parse_error("Maximum recursion depth exceeded"));
            }
            let Some(eol) = find_crlf(&buf[at + 1..]) else {
                return Ok(false);
            };
            let after = at + eol + 3;
            match kind {
                b'$' => match usize::try_from(reply_int(&buf[at + 1..at + 1 + eol])?) {
                    Ok(len) => {
                        let end = after.saturating_add(len);
                        match buf.get(end..end.saturating_add(2)) {
                            Some(b"\r\n") => self.scanned = end + 2,
                            Some(_) => return Err(bulk_not_ended()),
                            None if buf.get(end).is_some_and(|&b| b != b'\r') => {
                                return Err(bulk_not_ended())
                            }
                            None => return Ok(false),
                        }
                    }
                    Err(_) => self.scanned = after,
                },
                b'*' => {
                    self.scanned = after;
                    if let Ok(len @ 1..) = usize::try_from(reply_int(&buf[at + 1..at + 1 + eol])?) {
                        self.open.push(len);
                        continue;
                    }
                }
                _ => self.scanned = after,
            }
            // An element is whole: so is every array it completes.
            loop {
                match self.open.last_mut() {
                    None => return Ok(true),
                    Some(left) if *left > 1 => {
                        *left -= 1;
                        break;
                    }
                    Some(_) => {
                        self.open.pop();
                    }
                }
            }
        }
    }
}

fn bulk_not_ended() -> RedisError {
    parse_error("a bulk string does not end with CRLF")
}

/// The reply at the start of `buf` and its length, or `None` if `buf` does
/// not hold all of it yet.
fn parse_reply(buf: &[u8], depth: usize) -> RedisResult<Option<(Value, usize)>> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    if depth >= MAX_REPLY_DEPTH {
        return Err(parse_error("Maximum recursion depth exceeded"));
    }
    let Some(eol) = find_crlf(&buf[1..]) else {
        return Ok(None);
    };
    let line = &buf[1..1 + eol];
    let after = eol + 3;
    let reply = match kind {
        b'+' => {
            let line = reply_line(line)?;
            if line == "OK" {
                Value::Okay
            } else {
                Value::SimpleString(line.to_owned())
            }
        }
        b'-' => redis::parse_redis_value(&buf[..after])?,
        b':' => Value::Int(reply_int(line)?),
        b'$' => {
            let Ok(len) = usize::try_from(reply_int(line)?) else {
                return Ok(Some((Value::Nil, after)));
            };
            let end = after.saturating_add(len);
            if buf.len() < end.saturating_add(2) {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(bulk_not_ended());
            }
            return Ok(Some((Value::BulkString(buf[after..end].to_vec()), end + 2)));
        }
        b'*' => {
            let Ok(len) = usize::try_from(reply_int(line)?) else {
                return Ok(Some((Value::Nil, after)));
            };
            // Not trusted for more room than the bytes at hand can fill.
            let mut items = Vec::with_capacity(len.min(buf.len() / 3));
            let mut at = after;
            for _ in 0..len {
                match parse_reply(&buf[at..], depth + 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(parse_error("a reply of a type other than RESP2's")),
    };
    Ok(Some((reply, after)))
}

/// Where the first CRLF in `buf` starts.
fn find_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\r') {
        let at = from + i;
        match buf.get(at + 1) {
            Some(b'\n') => return Some(at),
            Some(_) => from = at + 1,
            None => return None,
        }
    }
    None
}

fn reply_line(line: &[u8]) -> RedisResult<&str> {
    std::str::from_utf8(line).map_err(|_| parse_error("a reply line is not UTF-8"))
}

fn reply_int(line: &[u8]) -> RedisResult<i64> {
    reply_line(line)?
        .trim()
        .parse()
        .map_err(|_| parse_error("Expected integer, got garbage"))
}

fn parse_error(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::Parse, what))
}

/// A pooled connection: a [`Stream`] and its replies.
pub(crate) struct Connection {
    stream: Stream,
    replies: Replies,
    db: i64,
    /// `false` once a write or read failed or timed out: a late reply may
    /// still come, so the connection is never used again.
    open: bool,
    /// A packed `WAIT` sent behind every request while set (replica sync),
    /// in the same write, and its reply.
    wait: Option<Vec<u8>>,
    waited: Option<Waited>,
    /// `ASKING` goes before every request while set (a Cluster `ASK`
    /// redirection), in the same write; its reply is read and dropped.
    asking: bool,
}

/// The reply to a `WAIT` sent behind a request.
#[derive(Clone, Debug)]
pub(crate) enum Waited {
    /// How many replicas acknowledged.
    Acked(i64),
    /// Redis refused the WAIT (say, an ACL without `+wait`).
    Refused(String),
}

impl Connection {
    pub(crate) fn open(
        endpoint: &Endpoint,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Connection> {
        // A PING proves the connection before the pool hands it out: a
        // server that accepts and then refuses (maxclients, a client
        // certificate refused after the TLS handshake) fails here.
        let ping = redis::cmd("PING").get_packed_command();
        // The handshake's parser read its replies, and nothing follows them.
        let (stream, _, _) =
            endpoint.connect(connect_timeout, response_timeout, &[("PING", ping)])?;
        Ok(Connection {
            stream,
            replies: Replies::new(),
            db: endpoint.db,
            open: true,
            wait: None,
            waited: None,
            asking: false,
        })
    }

    /// Sends `ASKING` before each request from now on (following a Cluster
    /// `ASK` redirection), or stops doing so.
    pub(crate) fn set_asking(&mut self, asking: bool) {
        self.asking = asking;
    }

    /// Sends `WAIT replicas timeout` behind each request from now on (in
    /// the same round trip), or stops doing so (`None`).
    pub(crate) fn set_wait(&mut self, wait: Option<(u32, Duration)>) {
        self.waited = None;
        self.wait = wait.map(|(n, t)| {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1);
            redis::cmd("WAIT").arg(n).arg(ms).get_packed_command()
        });
    }

    /// The reply of the last `WAIT`, if one was sent and answered.
    pub(crate) fn waited(&self) -> Option<Waited> {
        self.waited.clone()
    }

    pub(crate) fn set_timeouts(&self, timeout: Duration) -> io::Result<()> {
        self.stream.set_timeouts(Some(timeout))
    }

    fn send(&mut self, cmd: &[u8]) -> RedisResult<()> {
        if !self.open {
            return Err(RedisError::from(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection failed before",
            )));
        }
        self.waited = None;
        let written = if self.wait.is_none() && !self.asking {
            self.stream.write_all(cmd)
        } else {
            let wait = self.wait.as_deref().unwrap_or_default();
            let mut buf = Vec::with_capacity(ASKING.len() + cmd.len() + wait.len());
            if self.asking {
                buf.extend_from_slice(ASKING);
            }
            buf.extend_from_slice(cmd);
            buf.extend_from_slice(wait);
            self.stream.write_all(&buf)
        };
        written.map_err(|e| {
            self.open = false;
            RedisError::from(e)
        })
    }

    /// Reads (and drops) the reply of the `ASKING` sent before a request.
    fn receive_asking(&mut self) -> RedisResult<()> {
        if self.asking {
            if let Value::ServerError(e) = self.receive()? {
                // The request behind it is refused too (as without ASKING):
                // its own reply says why.
                log::debug!("redis refused ASKING: {}", RedisError::from(e));
            }
        }
        Ok(())
    }

    /// Reads the reply of the `WAIT` sent behind a request.
    fn receive_wait(&mut self) -> RedisResult<()> {
        if self.wait.is_some() {
            self.waited = Some(match self.receive()? {
                Value::Int(n) => Waited::Acked(n),
                Value::ServerError(e) => Waited::Refused(match e.details() {
                    Some(d) => format!("{} {d}", e.code()),
                    None => e.code().to_owned(),
                }),
                other => Waited::Refused(format!("unexpected reply {other:?}")),
            });
        }
        Ok(())
    }

    fn receive(&mut self) -> RedisResult<Value> {
        self.replies.next(&self.stream).inspect_err(|_| {
            self.open = false;
        })
    }
}

impl Connection {
    /// The first half of a pipeline's round trip: writes `cmds` (and the
    /// `WAIT` behind them, if set), so that other connections' requests can
    /// go out before this one's replies are read ([`receive_all`](Self::receive_all)).
    pub(crate) fn send_all(&mut self, cmds: &[u8]) -> RedisResult<()> {
        self.send(cmds)
    }

    /// The second half: reads `count` replies, error replies included as
    /// values (one failed command does not hide the others' replies), then
    /// the `WAIT`'s.
    pub(crate) fn receive_all(&mut self, count: usize) -> RedisResult<Vec<Value>> {
        self.receive_asking()?;
        let mut replies = Vec::with_capacity(count);
        for _ in 0..count {
            replies.push(self.receive()?);
        }
        self.receive_wait()?;
        Ok(replies)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.send(cmd)?;
        self.receive_asking()?;
        let reply = self.receive()?;
        self.receive_wait()?;
        Ok(reply)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.send(cmd)?;
        self.receive_asking()?;
        let mut replies = Vec::with_capacity(count);
        let mut first_error = None;
        for i in 0..offset + count {
            // A failed read leaves the connection closed, WAIT reply and all.
            match self.receive()? {
                Value::ServerError(e) if i < offset => {
                    first_error.get_or_insert(e);
                }
                _ if i < offset => {}
                v => replies.push(v),
            }
        }
        self.receive_wait()?;
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(replies),
        }
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

impl Connection {
    /// Whether the server closed the connection while it sat idle (see
    /// [`Stream::peer_closed`]).
    pub(crate) fn peer_closed(&self) -> bool {
        self.stream.peer_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives its bytes `step` at a time, as a socket may.
    struct Trickle<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(out.len()).min(self.bytes.len());
            out[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    fn replies() -> Vec<Vec<u8>> {
        let mut all: Vec<Vec<u8>> = [
            &b"+OK\r\n"[..],
            b"+PONG\r\n",
            b"-ERR unknown command 'x'\r\n",
            b"-MOVED 3999 127.0.0.1:6381\r\n",
            b"-NOSCRIPT No matching script.\r\n",
            b":0\r\n",
            b":-4\r\n",
            b":9223372036854775807\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nhello\r\n",
            b"$4\r\na\r\nb\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$-1\r\n$2\r\nab\r\n",
            b"*2\r\n*2\r\n:7\r\n-WRONGTYPE Operation against a key\r\n*0\r\n",
        ]
        .iter()
        .map(|r| r.to_vec())
        .collect();
        // Longer than the buffer starts with.
        let big = vec![b'x'; 40_000];
        let mut bulk = format!("${}\r\n", big.len()).into_bytes();
        bulk.extend_from_slice(&big);
        bulk.extend_from_slice(b"\r\n");
        all.push(bulk);
        // Walked once however it arrives (with a byte a read, walking it
        // again from its start on every read took seconds in debug builds).
        let mut array = b"*3000\r\n".to_vec();
        for i in 0..3000 {
            array.extend_from_slice(format!(":{i}\r\n").as_bytes());
        }
        all.push(array);
        all
    }

    #[test]
    fn replies_read_as_redis_parser_reads_them_however_they_arrive() {
        let all = replies();
        let stream: Vec<u8> = all.concat();
        for step in [1, 2, 3, 7, 4096, usize::MAX] {
            let mut replies = Replies::new();
            let mut source = Trickle {
                bytes: &stream,
                step,
            };
            for (i, bytes) in all.iter().enumerate() {
                let want = redis::parse_redis_value(bytes).expect("redis parses the reply");
                let got = replies
                    .next(&mut source)
                    .unwrap_or_else(|e| panic!("reply {i} ({step} bytes a read): {e}"));
                assert_eq!(got, want, "reply {i}, {step} bytes a read");
            }
            let end = replies.next(&mut source).expect_err("nothing more");
            assert!(
                end.is_io_error(),
                "the end of the stream is an I/O error: {end:?}"
            );
        }
    }

    #[test]
    fn a_malformed_reply_is_an_error_not_a_value() {
        for bad in [
            &b"$3\r\nabcde\r\n"[..],
            b":12x\r\n",
            b"!3\r\nerr\r\n",
            b"?\r\n",
        ] {
            let got = Replies::new().next(bad);
            assert!(
                got.is_err(),
                "{:?} read as {got:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Nested as deep as redis-rs allows, and one deeper.
        let deep = "*1\r\n".repeat(MAX_REPLY_DEPTH - 1) + ":1\r\n";
        assert_eq!(
            Replies::new()
                .next(deep.as_bytes())
                .expect("99 arrays deep"),
            redis::parse_redis_value(deep.as_bytes()).expect("redis reads it")
        );
        let deeper = "*1\r\n".repeat(MAX_REPLY_DEPTH) + ":1\r\n";
        assert!(redis::parse_redis_value(deeper.as_bytes()).is_err());
        assert!(Replies::new().next(deeper.as_bytes()).is_err());
    }

    /// Would block if asked for more: a parse error must come first.
    struct Dry<'a>(&'a [u8]);

    impl Read for Dry<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = out.len().min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_reply_known_malformed_is_refused_without_waiting_for_more() {
        for bad in [
            &b"$0\r\n\n"[..],
            b"$1\r\nab",
            b"?",
            b"\n$",
            b"*2\r\n:1\r\n!",
        ] {
            let got = Replies::new().next(Dry(bad));
            assert!(
                matches!(&got, Err(e) if !e.is_io_error()),
                "{:?}: {got:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
