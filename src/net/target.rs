//! Connection targets: where the client's connections go. A fixed server, or
//! the master of a Sentinel group, found and followed by redlease itself
//! (with its timeouts, TLS and credentials on every hop; redis-rs's sync
//! Sentinel client has no timeouts and resolves on every connection).
//!
//! The master is resolved when first needed and again after any connection
//! failure, `READONLY` or `MASTERDOWN` (the caller [`suspect`](Target::suspect)s
//! it), and checked once a second against what the sentinels say (as
//! Redisson's `scanInterval`), which also catches a graceful failover where
//! the old master keeps answering for a while. A new master runs the
//! listeners: the pool discards every connection made before, and the
//! subscriber reconnects and wakes its waiters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{ErrorKind, RedisError, RedisResult, Value};

use crate::net::transport::{Addr, Connection, Endpoint};

/// Where connections go.
#[derive(Clone)]
pub(crate) enum Target {
    Fixed(Endpoint),
    Sentinel(Arc<Sentinel>),
}

impl Target {
    /// The endpoint to connect to now.
    pub(crate) fn endpoint(&self) -> RedisResult<Endpoint> {
        match self {
            Target::Fixed(e) => Ok(e.clone()),
            Target::Sentinel(s) => s.master(),
        }
    }

    /// A connection to the target failed, or it answered as a replica: find
    /// the master again before the next connection.
    pub(crate) fn suspect(&self) {
        if let Target::Sentinel(s) = self {
            s.forget();
        }
    }

    /// How long finding the target may take when some of its servers do
    /// not answer: one connect timeout per sentinel (each asked in turn)
    /// plus one for the master.
    pub(crate) fn connect_budget(&self, connect_timeout: Duration) -> Duration {
        match self {
            Target::Fixed(_) => connect_timeout,
            Target::Sentinel(s) => connect_timeout.saturating_mul(
                u32::try_from(s.sentinels.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(1),
            ),
        }
    }

    /// Where it is, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Fixed(e) => format!("redis at {}", e.addr),
            Target::Sentinel(s) => format!("the master of {:?}", s.name),
        }
    }

    /// `true` when the target can move (Sentinel): callers that wait
    /// (`lock()`) ride out a failover instead of failing.
    pub(crate) fn can_move(&self) -> bool {
        matches!(self, Target::Sentinel(_))
    }
}

type Listener = Arc<dyn Fn(&str) + Send + Sync>;

/// A Sentinel group's master, as the client sees it.
pub(crate) struct Sentinel {
    name: String,
    sentinels: Vec<Endpoint>,
    /// What a data node's endpoint looks like (credentials, TLS, database);
    /// its address is replaced by the master's.
    template: Endpoint,
    connect_timeout: Duration,
    response_timeout: Duration,
    current: Mutex<Option<Endpoint>>,
    /// The address of the last master found (kept when `current` is
    /// forgotten, to tell a new master from the same one found again).
    last: Mutex<Option<String>>,
    /// Bumped on every change of master.
    generation: AtomicU64,
    listeners: Mutex<Vec<Listener>>,
    /// A connection to a sentinel kept for the periodic check (taken out
    /// while in use: no lock is held across I/O).
    kept: Mutex<Option<(usize, Connection)>>,
}

impl Sentinel {
    pub(crate) fn new(
        name: String,
        sentinels: Vec<Endpoint>,
        template: Endpoint,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Sentinel {
        Sentinel {
            name,
            sentinels,
            template,
            connect_timeout,
            response_timeout,
            current: Mutex::new(None),
            last: Mutex::new(None),
            generation: AtomicU64::new(0),
            listeners: Mutex::new(Vec::new()),
            kept: Mutex::new(None),
        }
    }

    /// Runs `f` with the new master's address whenever the master changes.
    pub(crate) fn on_change(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        self.listeners.lock().push(Arc::new(f));
    }

    fn master(&self) -> RedisResult<Endpoint> {
        if let Some(e) = self.current.lock().clone() {
            return Ok(e);
        }
        self.resolve()
    }

    fn forget(&self) {
        self.current.lock().take();
    }

    /// Asks the sentinels (in order, each within the timeouts) for the
    /// master's address, and checks with `ROLE` that it is a master.
    fn resolve(&self) -> RedisResult<Endpoint> {
        let mut failures = Vec::new();
        let mut refusal = None;
        // The sentinel that answered last first: one that is down or cut
        // off costs its connect timeout once, not on every resolution.
        let first = self.kept.lock().as_ref().map_or(0, |(i, _)| *i);
        let n = self.sentinels.len();
        for i in (0..n).map(|k| (first + k) % n) {
            match self.ask(i).and_then(|addr| self.verify(addr)) {
                Ok(endpoint) => {
                    self.switch(&endpoint);
                    return Ok(endpoint);
                }
                Err(e) => {
                    failures.push(format!("{}: {e}", self.sentinels[i].addr));
                    if crate::error::is_refusal(&e) {
                        refusal.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = refusal.filter(|_| failures.len() == self.sentinels.len()) {
            // Credentials or certificates refused (by a sentinel or the
            // master): say so, rather than "no master".
            return Err(e);
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "no master found through the sentinels",
            format!("{:?}: {}", self.name, failures.join("; ")),
        )))
    }

    /// The master address sentinel `i` reports.
    fn ask(&self, i: usize) -> RedisResult<Addr> {
        let kept = self.kept.lock().take();
        let mut conn = match kept {
            Some((j, c)) if j == i && redis::ConnectionLike::is_open(&c) => c,
            _ => Connection::open(
                &self.sentinels[i],
                self.connect_timeout,
                self.response_timeout,
            )?,
        };
        let reply: Value = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.name)
            .query(&mut conn)?;
        *self.kept.lock() = Some((i, conn));
        match reply {
            Value::Array(items) if items.len() == 2 => {
                let host: String = redis::from_redis_value(items[0].clone())?;
                let port: u16 = redis::from_redis_value(items[1].clone())?;
                Ok(Addr::Tcp(host, port))
            }
            Value::Nil => Err(RedisError::from((
                ErrorKind::Io,
                "the sentinel does not know this master name",
            ))),
            _ => Err(RedisError::from((
                ErrorKind::Parse,
                "unexpected reply to SENTINEL GET-MASTER-ADDR-BY-NAME",
            ))),
        }
    }

    /// `addr` answers `ROLE` as a master (a user without `+role` is taken
    /// at the sentinels' word).
    fn verify(&self, addr: Addr) -> RedisResult<Endpoint> {
        let endpoint = self.template.with_addr(addr);
        let mut conn = Connection::open(&endpoint, self.connect_timeout, self.response_timeout)?;
        match redis::cmd("ROLE").query::<Value>(&mut conn) {
            Ok(Value::Array(items)) => match items.first() {
                Some(Value::BulkString(role)) if role.as_slice() == b"master" => Ok(endpoint),
                _ => Err(RedisError::from((
                    ErrorKind::Io,
                    "the node the sentinel named is not a master (yet)",
                ))),
            },
            Ok(_) => Err(RedisError::from((
                ErrorKind::Parse,
                "unexpected reply to ROLE",
            ))),
            Err(e) if e.code() == Some("NOPERM") => Ok(endpoint),
            Err(e) => Err(e),
        }
    }

    fn switch(&self, endpoint: &Endpoint) {
        *self.current.lock() = Some(endpoint.clone());
        let addr = endpoint.addr.to_string();
        let changed = {
            let mut last = self.last.lock();
            let changed = last.as_deref() != Some(addr.as_str());
            *last = Some(addr);
            changed
        };
        if changed {
            let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            if generation > 1 {
                log::warn!("the master of {:?} is now {}", self.name, endpoint.addr);
                let addr = endpoint.addr.to_string();
                // Called outside the lock (a listener may be the user's
                // event handler).
                let listeners = self.listeners.lock().clone();
                for f in listeners {
                    f(&addr);
                }
            } else {
                log::info!("the master of {:?} is {}", self.name, endpoint.addr);
            }
        }
    }

    /// The periodic check: asks the sentinels; a different master is
    /// verified and switched to.
    pub(crate) fn check(&self) {
        let known = self.last.lock().clone();
        let Some(known) = known else {
            // Never resolved (nobody needed the master yet).
            return;
        };
        for i in 0..self.sentinels.len() {
            match self.ask(i) {
                Ok(addr) if addr.to_string() == known => return,
                Ok(addr) => {
                    if let Err(e) = self.verify(addr.clone()).map(|e| self.switch(&e)) {
                        log::debug!("new master {addr} not ready: {e}");
                    }
                    return;
                }
                Err(e) => log::debug!(
                    "sentinel {} did not answer the check: {e}",
                    self.sentinels[i].addr
                ),
            }
        }
    }
}
