//! The one subscriber connection of a client (`redlease-pubsub`).
//!
//! Waiters subscribe to a lock's release channel before their retry, so no
//! release can slip between "busy" and "waiting". Subscriptions are counted per
//! channel: the first waiter sends SUBSCRIBE, the last one to leave sends
//! UNSUBSCRIBE. Each channel has a latch with permits: a release message adds
//! one permit and wakes one waiter of that lock in this process (no thundering
//! herd); a permit that arrives while nobody sleeps is kept for the next wait.
//!
//! Commands go out through an outbox: whoever finds the outbox idle writes
//! everything queued, others just queue and leave, so no thread ever waits on a
//! lock of ours that is held across socket I/O. Replies come back in order, so
//! an acknowledgement counter tells each waiter when its SUBSCRIBE has been
//! applied. When the connection dies, the thread reconnects with backoff,
//! subscribes every channel that still has waiters and then wakes all of them
//! to retry, because a release may have been missed meanwhile.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Where the subscriber connects and how it authenticates.
#[derive(Clone)]
pub(crate) struct Target {
    addr: Addr,
    username: Option<String>,
    password: Option<String>,
}

#[derive(Clone, Debug)]
enum Addr {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl Target {
    pub(crate) fn from_info(info: &redis::ConnectionInfo) -> Result<Target> {
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            other => {
                return Err(Error::InvalidUrl(format!(
                    "{other} is not supported yet: use a redis:// or redis+unix:// url"
                )))
            }
        };
        let settings = info.redis_settings();
        Ok(Target {
            addr,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
        })
    }
}

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn connect(addr: &Addr, timeout: Duration) -> io::Result<Stream> {
        match addr {
            Addr::Tcp(host, port) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "host has no address");
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
            #[cfg(unix)]
            Addr::Unix(path) => Ok(Stream::Unix(std::os::unix::net::UnixStream::connect(path)?)),
        }
    }

    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
            #[cfg(unix)]
            Stream::Unix(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            #[cfg(unix)]
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => (&*s).write_all(buf),
            #[cfg(unix)]
            Stream::Unix(s) => (&*s).write_all(buf),
        }
    }
}

/// Reads from a shared stream while other threads write to it.
struct StreamReader(Arc<Stream>);

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &*self.0 {
            Stream::Tcp(s) => (&*s).read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => (&*s).read(buf),
        }
    }
}

/// One channel's waiters and latch.
struct Channel {
    /// Waiters subscribed; changed only under the channel map's lock.
    refs: AtomicUsize,
    /// Sequence number of the SUBSCRIBE that created this entry.
    sub_seq: u64,
    permits: Mutex<usize>,
    wake: Condvar,
}

impl Channel {
    fn release(&self, all: bool) {
        let refs = self.refs.load(Ordering::Acquire);
        let mut permits = self.permits.lock();
        if all {
            *permits = refs.max(1);
            self.wake.notify_all();
        } else {
            *permits = (*permits + 1).min(refs.max(1));
            self.wake.notify_one();
        }
    }
}

struct Outbox {
    buf: Vec<u8>,
    next_seq: u64,
    stream: Option<Arc<Stream>>,
}

struct Inner {
    target: Target,
    connect_timeout: Duration,
    response_timeout: Duration,
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    out: Mutex<Outbox>,
    writing: AtomicBool,
    acked: Mutex<u64>,
    acked_cv: Condvar,
    shutdown: AtomicBool,
    reconnects: AtomicU64,
}

/// The subscriber; owned by the client, stops its thread on drop.
pub(crate) struct PubSub {
    inner: Arc<Inner>,
    /// `Some` once the thread runs; dropping the sender stops it.
    thread: Mutex<Option<Sender<()>>>,
}

impl PubSub {
    pub(crate) fn new(
        target: Target,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> PubSub {
        PubSub {
            inner: Arc::new(Inner {
                target,
                connect_timeout,
                response_timeout,
                channels: Mutex::new(HashMap::new()),
                out: Mutex::new(Outbox {
                    buf: Vec::new(),
                    next_seq: 0,
                    stream: None,
                }),
                writing: AtomicBool::new(false),
                acked: Mutex::new(0),
                acked_cv: Condvar::new(),
                shutdown: AtomicBool::new(false),
                reconnects: AtomicU64::new(0),
            }),
            thread: Mutex::new(None),
        }
    }

    /// How many times the subscriber connection was re-established.
    pub(crate) fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// Number of channels subscribed (with at least one waiter).
    pub(crate) fn channels(&self) -> usize {
        self.inner.channels.lock().len()
    }

    fn ensure_started(&self) -> Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_some() {
            return Ok(());
        }
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let inner = Arc::clone(&self.inner);
        std::thread::Builder::new()
            .name("redlease-pubsub".into())
            .spawn(move || inner.run(rx))
            .map_err(Error::Thread)?;
        *thread = Some(tx);
        Ok(())
    }

    /// Subscribes to `name` and waits (until `deadline`, at most one response
    /// timeout) for Redis to confirm. An unconfirmed subscription still works
    /// once the connection is back; until then waits are bounded by the
    /// holder's lease.
    pub(crate) fn subscribe(
        &self,
        name: &str,
        deadline: Option<Instant>,
    ) -> Result<Subscription<'_>> {
        self.ensure_started()?;
        let inner = &*self.inner;
        let (channel, created) = {
            let mut map = inner.channels.lock();
            match map.get(name) {
                Some(c) => {
                    c.refs.fetch_add(1, Ordering::AcqRel);
                    (Arc::clone(c), false)
                }
                None => {
                    let seq = inner.queue(&redis::cmd("SUBSCRIBE").arg(name).get_packed_command());
                    let c = Arc::new(Channel {
                        refs: AtomicUsize::new(1),
                        sub_seq: seq,
                        permits: Mutex::new(0),
                        wake: Condvar::new(),
                    });
                    map.insert(name.to_owned(), Arc::clone(&c));
                    (c, true)
                }
            }
        };
        if created {
            inner.flush();
        }
        let now = Instant::now();
        let mut until = now.checked_add(inner.response_timeout).unwrap_or(now);
        if let Some(d) = deadline {
            until = until.min(d);
        }
        inner.wait_acked(channel.sub_seq, until);
        Ok(Subscription {
            pubsub: self,
            name: name.to_owned(),
            channel,
        })
    }
}

impl Drop for PubSub {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        // Dropping the sender wakes a backoff wait; shutting the socket down
        // ends a blocking read.
        self.thread.lock().take();
        if let Some(s) = self.inner.out.lock().stream.take() {
            s.shutdown();
        }
    }
}

/// A waiter's subscription to one release channel; unsubscribes on drop.
pub(crate) struct Subscription<'a> {
    pubsub: &'a PubSub,
    name: String,
    channel: Arc<Channel>,
}

impl Subscription<'_> {
    /// Waits for a release message (or a reconnect) until `until`; `true` if
    /// woken by one, `false` on timeout.
    pub(crate) fn wait_until(&self, until: Instant) -> bool {
        let mut permits = self.channel.permits.lock();
        while *permits == 0 {
            if self
                .channel
                .wake
                .wait_until(&mut permits, until)
                .timed_out()
            {
                if *permits == 0 {
                    return false;
                }
                break;
            }
        }
        *permits -= 1;
        true
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let inner = &*self.pubsub.inner;
        let queued = {
            let mut map = inner.channels.lock();
            if self.channel.refs.fetch_sub(1, Ordering::AcqRel) == 1
                && map
                    .get(&self.name)
                    .is_some_and(|c| Arc::ptr_eq(c, &self.channel))
            {
                map.remove(&self.name);
                inner.queue(
                    &redis::cmd("UNSUBSCRIBE")
                        .arg(&self.name)
                        .get_packed_command(),
                );
                true
            } else {
                false
            }
        };
        if queued {
            inner.flush();
        }
    }
}

enum Reply {
    Ack,
    Message(String),
    Other,
}

fn classify(v: redis::Value) -> Reply {
    let redis::Value::Array(items) = v else {
        return Reply::Other;
    };
    let kind = match items.first() {
        Some(redis::Value::BulkString(k)) => k.as_slice(),
        _ => return Reply::Other,
    };
    match kind {
        b"subscribe" | b"unsubscribe" => Reply::Ack,
        b"message" => match items.get(1) {
            Some(redis::Value::BulkString(ch)) => match String::from_utf8(ch.clone()) {
                Ok(ch) => Reply::Message(ch),
                Err(_) => Reply::Other,
            },
            _ => Reply::Other,
        },
        _ => Reply::Other,
    }
}

impl Inner {
    /// Queues a command; returns its sequence number. Callers hold the channel
    /// map's lock, so commands for one channel are queued in map order.
    fn queue(&self, cmd: &[u8]) -> u64 {
        let mut out = self.out.lock();
        let seq = out.next_seq;
        out.next_seq += 1;
        out.buf.extend_from_slice(cmd);
        seq
    }

    /// Writes what is queued, unless another thread is already doing so (it
    /// will take our commands too). No lock is held during the write.
    fn flush(&self) {
        loop {
            if self
                .writing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return;
            }
            loop {
                let (buf, stream) = {
                    let mut out = self.out.lock();
                    (std::mem::take(&mut out.buf), out.stream.clone())
                };
                if buf.is_empty() {
                    break;
                }
                // Without a connection the commands are dropped: the reconnect
                // subscribes every channel that still has waiters.
                if let Some(stream) = stream {
                    if let Err(e) = stream.write_all(&buf) {
                        log::debug!("redlease-pubsub: write failed: {e}");
                        stream.shutdown();
                    }
                }
            }
            self.writing.store(false, Ordering::Release);
            if self.out.lock().buf.is_empty() {
                return;
            }
        }
    }

    fn wait_acked(&self, seq: u64, until: Instant) -> bool {
        let mut acked = self.acked.lock();
        while *acked <= seq {
            if self.acked_cv.wait_until(&mut acked, until).timed_out() {
                return *acked > seq;
            }
        }
        true
    }

    fn run(self: Arc<Self>, stop: Receiver<()>) {
        let mut backoff = MIN_BACKOFF;
        let mut connected_before = false;
        while !self.shutdown.load(Ordering::Acquire) {
            match self.connect() {
                Ok((stream, reader)) => {
                    backoff = MIN_BACKOFF;
                    if connected_before {
                        self.reconnects.fetch_add(1, Ordering::Relaxed);
                        log::info!("redlease-pubsub: reconnected to redis");
                    }
                    connected_before = true;
                    let err = self.serve(stream, reader);
                    if self.shutdown.load(Ordering::Acquire) {
                        break;
                    }
                    log::warn!("redlease-pubsub: connection lost ({err}); reconnecting");
                }
                Err(e) => {
                    log::warn!(
                        "redlease-pubsub: cannot connect to redis ({e}); retrying in {backoff:?}"
                    );
                    match stop.recv_timeout(backoff) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => break,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        log::debug!("redlease-pubsub: stopped");
    }

    fn connect(&self) -> redis::RedisResult<(Arc<Stream>, BufReader<StreamReader>)> {
        let stream = Arc::new(Stream::connect(&self.target.addr, self.connect_timeout)?);
        stream.set_timeouts(Some(self.response_timeout), Some(self.response_timeout))?;
        let mut reader = BufReader::new(StreamReader(Arc::clone(&stream)));
        if let Some(password) = &self.target.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.target.username {
                auth.arg(user);
            }
            auth.arg(password);
            stream.write_all(&auth.get_packed_command())?;
            if let redis::Value::ServerError(e) = redis::Parser::new().parse_value(&mut reader)? {
                return Err(e.into());
            }
        }
        // Reads block until a message comes; writes stay bounded.
        stream.set_timeouts(None, Some(self.response_timeout))?;
        Ok((stream, reader))
    }

    /// Subscribes every channel with waiters on the new connection, then reads
    /// until the connection fails; returns that failure.
    fn serve(&self, stream: Arc<Stream>, mut reader: BufReader<StreamReader>) -> redis::RedisError {
        let resubscribed_at = {
            let map = self.channels.lock();
            let mut out = self.out.lock();
            out.buf.clear();
            out.stream = Some(Arc::clone(&stream));
            // Whatever was queued for the old connection is void: let its
            // waiters go (they retry and then wait bounded by the lease).
            *self.acked.lock() = out.next_seq;
            self.acked_cv.notify_all();
            for name in map.keys() {
                out.next_seq += 1;
                out.buf
                    .extend_from_slice(&redis::cmd("SUBSCRIBE").arg(name).get_packed_command());
            }
            (!map.is_empty()).then_some(out.next_seq)
        };
        if self.shutdown.load(Ordering::Acquire) {
            stream.shutdown();
        }
        self.flush();
        let mut pending_wake = resubscribed_at;
        let mut parser = redis::Parser::new();
        let err = loop {
            let value = match parser.parse_value(&mut reader) {
                Ok(v) => v,
                Err(e) => break e,
            };
            match classify(value) {
                Reply::Ack => {
                    let acked = {
                        let mut acked = self.acked.lock();
                        *acked += 1;
                        *acked
                    };
                    self.acked_cv.notify_all();
                    if pending_wake.is_some_and(|at| acked >= at) {
                        pending_wake = None;
                        // A release may have been published while we were
                        // away: every waiter retries once.
                        let channels: Vec<_> = self.channels.lock().values().cloned().collect();
                        for c in channels {
                            c.release(true);
                        }
                    }
                }
                Reply::Message(name) => {
                    let channel = self.channels.lock().get(&name).cloned();
                    if let Some(c) = channel {
                        c.release(false);
                    }
                }
                Reply::Other => {}
            }
        };
        let mut out = self.out.lock();
        if out.stream.as_ref().is_some_and(|s| Arc::ptr_eq(s, &stream)) {
            out.stream = None;
        }
        err
    }
}
