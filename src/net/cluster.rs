//! Redis Cluster: the slot map, a node (pool and subscriber) per master, and
//! redirections.
//!
//! The slot of a key is computed here (CRC16 of its hash tag, as Redis does)
//! and looked up in a slot map read with `CLUSTER SLOTS`. The map is read
//! when first needed, and again when Redis says it is out of date (`MOVED`,
//! `CLUSTERDOWN`) or a node fails, by one caller at a time and at most every
//! [`MIN_REFRESH_GAP`]: never per call, and a storm of redirections costs one
//! refresh while the other callers follow the address each `MOVED` names.
//! `ASK` (a slot being migrated) is followed with `ASKING` for that request
//! alone; `TRYAGAIN` (a multi-key request during a migration) and
//! `CLUSTERDOWN` (a failover under way) are retried after a short pause
//! within the response timeout.
//!
//! Each master is a [`Node`] with its own r2d2 pool, replica sync state and
//! subscriber; nodes are made on first use and share the client's connect
//! thread and counters. Lock channels use sharded pub/sub (`SSUBSCRIBE`,
//! `SPUBLISH`) where the servers have it (Redis 7, detected with `PUBSUB
//! SHARDNUMSUB` as Redisson does), so a waiter subscribes at the master of
//! its lock's slot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use redis::{RedisError, Value};

use crate::error::{Error, Result};
use crate::net::node::Node;
use crate::net::pool::{
    is_connection_failure, Counters, PoolSettings, Redis, SyncReplicas, Threads,
};
use crate::net::pubsub::PubSub;
use crate::net::target::Target;
use crate::net::transport::{Addr, Connection, Endpoint};
use crate::time::{jitter, warn_limited};

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// The least time between two reads of the slot map.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);

/// How often a client that makes no calls reads the slot map again
/// (Redisson's `scanInterval`), so that its first call after a failover
/// goes to the new master: one `CLUSTER SLOTS` on a kept connection.
pub(crate) const SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// Redirections one request follows before giving up.
const MAX_REDIRECTS: u32 = 5;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (what lies between the
/// first `{` and the first `}` after it, if not empty) or else of the whole
/// key, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % SLOTS as u16
}

/// What Redis Cluster hashes of `key`: the bytes between its first `{` and
/// the first `}` after it when there are any, else all of it.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    key.iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

/// Whether lock channels use sharded pub/sub on a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PubSubMode {
    /// Sharded where the servers have it (Redis 7), as Redisson's `AUTO`.
    Auto,
    /// Classic `PUBLISH`/`SUBSCRIBE` (Redis 6, or Redisson in classic mode).
    Classic,
}

/// What every node of a cluster is made with.
pub(crate) struct NodeSettings {
    /// Credentials and TLS; the address is each node's.
    pub(crate) template: Endpoint,
    pub(crate) pool: PoolSettings,
    pub(crate) response_timeout: Duration,
    pub(crate) retry_attempts: u32,
    pub(crate) sync: SyncReplicas,
    pub(crate) counters: Arc<Counters>,
}

pub(crate) struct Cluster {
    seeds: Vec<Addr>,
    settings: NodeSettings,
    mode: PubSubMode,
    /// Sharded pub/sub in use (read by the nodes' subscribers and for the
    /// scripts' publish command); decided with the first slot map.
    sharded: Arc<AtomicBool>,
    /// The master of each slot (empty before the first read).
    owners: RwLock<Vec<Option<Arc<Node>>>>,
    /// Every node made so far, by address.
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Whether a read of the slot map is under way, and when the last one
    /// ended; callers that need the first map wait on `refreshed`.
    refresh: Mutex<RefreshState>,
    refreshed: Condvar,
    /// This cluster, for the background reads.
    me: Weak<Cluster>,
    /// The `redlease-slots` thread that reads the slot map every
    /// [`SCAN_INTERVAL`], started with the first map (it holds the cluster
    /// weakly, and ends when the cluster is dropped).
    scanner: OnceLock<scheduled_thread_pool::ScheduledThreadPool>,
    /// A connection to the node that answered the last read, kept for the
    /// next one (taken out while in use: no lock is held across I/O).
    kept: Mutex<Option<(Addr, Connection)>>,
}

#[derive(Default)]
struct RefreshState {
    running: bool,
    ended_at: Option<Instant>,
}

impl Cluster {
    pub(crate) fn new(seeds: Vec<Addr>, settings: NodeSettings, mode: PubSubMode) -> Arc<Cluster> {
        Arc::new_cyclic(|me| Cluster {
            seeds,
            settings,
            mode,
            sharded: Arc::new(AtomicBool::new(false)),
            owners: RwLock::new(Vec::new()),
            nodes: Mutex::new(HashMap::new()),
            refresh: Mutex::new(RefreshState::default()),
            refreshed: Condvar::new(),
            me: me.clone(),
            scanner: OnceLock::new(),
            kept: Mutex::new(None),
        })
    }

    /// The command scripts publish release messages with.
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.sharded.load(Ordering::Acquire) {
            "spublish"
        } else {
            "publish"
        }
    }

    /// The node at `addr` (`host:port`), made on first use.
    pub(crate) fn node_at(&self, addr: &str) -> Result<Arc<Node>> {
        if let Some(n) = self.nodes.lock().get(addr) {
            return Ok(Arc::clone(n));
        }
        let parsed = addr.rsplit_once(':').and_then(|(h, p)| {
            Some((
                h.trim_start_matches('[').trim_end_matches(']'),
                p.parse().ok()?,
            ))
        });
        let Some((host, port)) = parsed else {
            return Err(Error::Redis(RedisError::from((
                redis::ErrorKind::Parse,
                "redis named a cluster node by an address that is not host:port",
                addr.to_owned(),
            ))));
        };
        Ok(self.node_for(Addr::Tcp(host.to_owned(), port)))
    }

    fn node_for(&self, addr: Addr) -> Arc<Node> {
        let name = addr.to_string();
        let mut nodes = self.nodes.lock();
        if let Some(n) = nodes.get(&name) {
            return Arc::clone(n);
        }
        let s = &self.settings;
        let endpoint = s.template.with_addr(addr);
        let target = Target::Fixed(endpoint);
        let node = Arc::new(Node {
            name: name.clone(),
            redis: Arc::new(
                Redis::new(
                    target.clone(),
                    s.pool.clone(),
                    s.response_timeout,
                    s.retry_attempts,
                    s.sync,
                    Arc::clone(&s.counters),
                    // A connect thread of its own: a node that accepts and
                    // never answers holds only its own dials up.
                    Threads::default(),
                )
                .failing_fast(),
            ),
            pubsub: PubSub::new(
                target,
                s.pool.connection_timeout,
                s.response_timeout,
                Some(Arc::clone(&self.sharded)),
                s.counters.events.clone(),
            ),
        });
        nodes.insert(name, Arc::clone(&node));
        node
    }

    /// Every master of the current slot map.
    pub(crate) fn masters(&self) -> Vec<Arc<Node>> {
        let owners = self.owners.read();
        let mut masters: Vec<Arc<Node>> = Vec::new();
        for n in owners.iter().flatten() {
            if !masters.iter().any(|m| Arc::ptr_eq(m, n)) {
                masters.push(Arc::clone(n));
            }
        }
        masters
    }

    /// Every node made so far (masters, seeds, nodes named by redirections).
    pub(crate) fn all_nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.lock().values().cloned().collect()
    }

    /// The master of `slot`, reading the slot map first if there is none.
    pub(crate) fn owner(&self, slot: u16) -> Result<Arc<Node>> {
        self.ensure_map()?;
        let owner = self.owners.read().get(usize::from(slot)).cloned().flatten();
        owner.ok_or_else(|| {
            // A read of the map in the background; callers that wait retry.
            self.refresh_soon();
            Error::Redis(RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                "no master serves this slot",
                format!("slot {slot}: the cluster is down or being reconfigured"),
            )))
        })
    }

    /// The owners of many slots at once (one read of the map, made first if
    /// there is none): `None` for a slot no master serves now.
    pub(crate) fn owners_of(&self, slots: &[u16]) -> Result<Vec<Option<Arc<Node>>>> {
        self.ensure_map()?;
        let owners = self.owners.read();
        Ok(slots
            .iter()
            .map(|&s| owners.get(usize::from(s)).cloned().flatten())
            .collect())
    }

    /// Reads the slot map if there is none yet.
    fn ensure_map(&self) -> Result<()> {
        if self.owners.read().is_empty() {
            self.refresh()?;
        }
        Ok(())
    }

    /// Redis said `slot` is served by `node` now (`MOVED`).
    fn set_owner(&self, slot: u16, node: &Arc<Node>) {
        let mut owners = self.owners.write();
        if let Some(o) = owners.get_mut(usize::from(slot)) {
            *o = Some(Arc::clone(node));
        }
    }

    /// Redis said the waiter's channel moved to `addr` (`MOVED` on
    /// `SSUBSCRIBE`), or (`None`) it was dropped from its node: follow.
    pub(crate) fn channel_moved(&self, channel: &str, addr: Option<&str>) {
        match addr.map(|a| self.node_at(a)) {
            Some(Ok(node)) => self.set_owner(slot(channel.as_bytes()), &node),
            _ => self.refresh_soon(),
        }
    }

    /// Has the slot map read again in the background (a thread of its own,
    /// so that a silent node costs no caller, nor the watchdog, its
    /// response timeout), unless a read is under way or ended less than
    /// [`MIN_REFRESH_GAP`] ago. Callers go on with the map they have; `MOVED`
    /// replies name the new owner meanwhile.
    pub(crate) fn refresh_soon(&self) {
        {
            let mut st = self.refresh.lock();
            if st.running || st.ended_at.is_some_and(|t| t.elapsed() < MIN_REFRESH_GAP) {
                return;
            }
            st.running = true;
        }
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("redlease-slots".into())
            .spawn(move || {
                if let Some(c) = me.upgrade() {
                    if let Err(e) = c.read_map() {
                        warn_limited!("slot map", "cannot read the cluster's slot map: {e}");
                    }
                    c.refresh_ended();
                }
            });
        if let Err(e) = spawned {
            warn_limited!(
                "slot map thread",
                "cannot start a thread to read the slot map ({e})"
            );
            self.refresh_ended();
        }
    }

    /// Reads the slot map now unless a read is under way or ended less than
    /// half a [`SCAN_INTERVAL`] ago (the scanner's turn).
    fn scan(&self) {
        {
            let mut st = self.refresh.lock();
            if st.running || st.ended_at.is_some_and(|t| t.elapsed() < SCAN_INTERVAL / 2) {
                return;
            }
            st.running = true;
        }
        if let Err(e) = self.read_map() {
            log::debug!("the periodic read of the slot map failed: {e}");
        }
        self.refresh_ended();
    }

    /// Starts the scanner (once).
    fn start_scanner(&self) {
        self.scanner.get_or_init(|| {
            let pool = scheduled_thread_pool::ScheduledThreadPool::builder()
                .num_threads(1)
                .thread_name_pattern("redlease-slots")
                .on_drop_behavior(
                    scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled,
                )
                .build();
            let me = self.me.clone();
            pool.execute_at_fixed_rate(SCAN_INTERVAL, SCAN_INTERVAL, move || {
                if let Some(c) = me.upgrade() {
                    c.scan();
                }
            });
            pool
        });
    }

    fn refresh_ended(&self) {
        let mut st = self.refresh.lock();
        st.running = false;
        st.ended_at = Some(Instant::now());
        self.refreshed.notify_all();
    }

    /// Reads the slot map (`CLUSTER SLOTS`) now, from the first node that
    /// answers: the one that answered last, then the masters, then the
    /// seeds; with the first map, decides whether pub/sub is sharded. If a
    /// read is under way, waits for it instead, for at most one connection
    /// and one response timeout (a call stays bounded even when the read
    /// under way tries seeds that do not answer).
    pub(crate) fn refresh(&self) -> Result<()> {
        {
            let mut st = self.refresh.lock();
            if st.running {
                let deadline = Instant::now()
                    + self
                        .settings
                        .pool
                        .connection_timeout
                        .saturating_add(self.settings.response_timeout);
                while st.running {
                    if self.refreshed.wait_until(&mut st, deadline).timed_out() {
                        break;
                    }
                }
                drop(st);
                return if self.owners.read().is_empty() {
                    Err(Error::Redis(RedisError::from((
                        redis::ErrorKind::Io,
                        "the cluster's slot map could not be read",
                        "see the warnings logged".to_owned(),
                    ))))
                } else {
                    Ok(())
                };
            }
            st.running = true;
        }
        let result = self.read_map();
        self.refresh_ended();
        result
    }

    fn read_map(&self) -> Result<()> {
        let detect = self.mode == PubSubMode::Auto && self.owners.read().is_empty();
        let mut kept = self.kept.lock().take();
        let mut candidates: Vec<Addr> = kept.iter().map(|(a, _)| a.clone()).collect();
        let mut masters = self.masters();
        // Not always the same first master: one that is down costs its
        // connect timeout once, not on every read.
        if !masters.is_empty() {
            let spread = jitter(Duration::from_secs(1), 1.0).as_millis();
            let start = usize::try_from(spread).unwrap_or(0) % masters.len();
            masters.rotate_left(start);
        }
        // Masters whose last request or connection failed go last.
        masters.sort_by_key(|m| m.redis.unreachable());
        for m in masters {
            if let Ok(e) = m.redis.target().endpoint() {
                candidates.push(e.addr);
            }
        }
        candidates.extend(self.seeds.iter().cloned());
        let mut failures = Vec::new();
        let mut tried: Vec<String> = Vec::new();
        for addr in candidates {
            let name = addr.to_string();
            if tried.contains(&name) {
                continue;
            }
            tried.push(name.clone());
            let conn = match kept.take() {
                Some((a, c)) if a.to_string() == name && redis::ConnectionLike::is_open(&c) => {
                    Ok(c)
                }
                _ => Connection::open(
                    &self.settings.template.with_addr(addr.clone()),
                    self.settings.pool.connection_timeout,
                    self.settings.response_timeout,
                ),
            };
            let answer = conn.and_then(|mut c| {
                let mut pipe = redis::pipe();
                pipe.cmd("CLUSTER").arg("SLOTS");
                if detect {
                    pipe.cmd("PUBSUB").arg("SHARDNUMSUB");
                }
                c.send_all(&pipe.get_packed_pipeline())?;
                let replies = c.receive_all(if detect { 2 } else { 1 })?;
                Ok((c, replies))
            });
            match answer {
                Ok((c, replies)) => {
                    let mut replies = replies.into_iter();
                    let slots = replies.next().unwrap_or(Value::Nil);
                    let host = match &addr {
                        Addr::Tcp(h, _) => h.clone(),
                        #[cfg(unix)]
                        Addr::Unix(_) => String::new(),
                    };
                    // Redis 6 does not know the subcommand; a user not
                    // allowed it (NOPERM) is on a server that does.
                    let sharded = detect.then(|| match replies.next() {
                        Some(Value::ServerError(e)) => e.code() == "NOPERM",
                        Some(_) => true,
                        None => false,
                    });
                    match self.install(slots, &host, sharded) {
                        Ok(()) => {
                            *self.kept.lock() = Some((addr, c));
                            return Ok(());
                        }
                        Err(e) => failures.push(format!("{name}: {e}")),
                    }
                }
                Err(e) => {
                    if crate::error::is_refusal(&e) {
                        return Err(Error::Redis(e));
                    }
                    failures.push(format!("{name}: {e}"));
                }
            }
        }
        Err(Error::Redis(RedisError::from((
            redis::ErrorKind::Io,
            "no cluster node answered CLUSTER SLOTS",
            failures.join("; "),
        ))))
    }

    /// Installs the slot map a `CLUSTER SLOTS` reply describes; `host` is
    /// the answering node's (for entries that leave theirs empty).
    /// `sharded`, if given, is set before the map can be seen (a release
    /// routed by it publishes the way waiters listen).
    fn install(&self, reply: Value, host: &str, sharded: Option<bool>) -> Result<()> {
        let bad = |what: &str| {
            Error::Redis(RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply to CLUSTER SLOTS",
                what.to_owned(),
            )))
        };
        let ranges = match reply {
            Value::Array(r) => r,
            Value::ServerError(e) => return Err(Error::Redis(e.into())),
            _ => return Err(bad("not a list")),
        };
        let mut owners: Vec<Option<Arc<Node>>> = vec![None; SLOTS];
        let mut covered = 0;
        for range in ranges {
            let Value::Array(items) = range else {
                return Err(bad("a range is not a list"));
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (items.first(), items.get(1), items.get(2))
            else {
                return Err(bad("a range has no start, end and master"));
            };
            let node_host = match master.first() {
                Some(Value::BulkString(h)) if !h.is_empty() && h.as_slice() != b"?" => {
                    String::from_utf8_lossy(h).into_owned()
                }
                _ => host.to_owned(),
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return Err(bad("a master has no port"));
            };
            let port = u16::try_from(*port).map_err(|_| bad("a port is out of range"))?;
            let node = self.node_for(Addr::Tcp(node_host, port));
            let (Ok(start), Ok(end)) = (usize::try_from(*start), usize::try_from(*end)) else {
                return Err(bad("a slot is out of range"));
            };
            for o in owners
                .get_mut(start..=end.min(SLOTS - 1))
                .unwrap_or_default()
            {
                *o = Some(Arc::clone(&node));
                covered += 1;
            }
        }
        if covered == 0 {
            return Err(bad("no slot is served"));
        }
        let masters: Vec<String> = {
            let mut m: Vec<String> = Vec::new();
            for n in owners.iter().flatten() {
                if m.last() != Some(&n.name) && !m.contains(&n.name) {
                    m.push(n.name.clone());
                }
            }
            m
        };
        if let Some(sharded) = sharded {
            self.sharded.store(sharded, Ordering::Release);
            log::info!(
                "cluster pub/sub is {}",
                if sharded {
                    "sharded (SSUBSCRIBE/SPUBLISH)"
                } else {
                    "classic (Redis before 7)"
                }
            );
        }
        let unchanged = {
            let current = self.owners.read();
            current.len() == owners.len()
                && current.iter().zip(&owners).all(|(a, b)| same_node(a, b))
        };
        if unchanged {
            // Nothing moved (the scanner's usual read).
            return Ok(());
        }
        let old = std::mem::replace(&mut *self.owners.write(), owners);
        if old.is_empty() {
            self.start_scanner();
        }
        // Nodes that serve no slot now (a failed master, a seed that is a
        // replica) go: their pools stop dialling, and their subscribers hand
        // their channels back to the waiters.
        let gone: Vec<Arc<Node>> = {
            let mut nodes = self.nodes.lock();
            let gone = nodes
                .iter()
                .filter(|(name, _)| !masters.contains(name))
                .map(|(_, n)| Arc::clone(n))
                .collect();
            nodes.retain(|name, _| masters.contains(name));
            gone
        };
        drop(gone);
        if !old.is_empty() {
            // A master that served no slot before took some over: a replica
            // promoted by a failover (or a node given slots).
            let mut before: Vec<&str> = old.iter().flatten().map(|n| n.name.as_str()).collect();
            before.sort_unstable();
            before.dedup();
            for m in masters
                .iter()
                .filter(|m| before.binary_search(&m.as_str()).is_err())
            {
                self.settings.counters.events.failover(m);
            }
            log::debug!("read the cluster's slot map again ({covered} slots served)");
        }
        Ok(())
    }

    /// Runs `exec` on the master of `key`'s slot, following redirections:
    /// `MOVED` (the slot's master changed: noted, and the map read again
    /// soon), `ASK` (the key is being migrated: `exec` gets `asking` set),
    /// `TRYAGAIN` and `CLUSTERDOWN` (retried after a short pause while the
    /// response timeout lasts). A connection failure has the map read again
    /// and is returned.
    pub(crate) fn route<R>(
        &self,
        key: &str,
        budget: Duration,
        mut exec: impl FnMut(&Node, bool) -> Result<R>,
    ) -> Result<R> {
        let slot = slot(key.as_bytes());
        let started = Instant::now();
        let mut next: Option<(Arc<Node>, bool)> = None;
        let mut redirects = 0;
        let mut pause = Duration::from_millis(5);
        // The node an ASK sent us to: a TRYAGAIN from it (a multi-key
        // request whose keys are split by the migration) is retried there.
        let mut asked: Option<Arc<Node>> = None;
        loop {
            let (node, asking) = match next.take() {
                Some(n) => n,
                None => (self.owner(slot)?, false),
            };
            if node.redis.unreachable() && !asking {
                // Its last connection or request failed: it may have been
                // replaced. (If not, the request fails fast: see
                // `Redis::checkout`; a caller that waits retries until its
                // deadline.)
                self.refresh_soon();
                let owner = self.owner(slot)?;
                if !Arc::ptr_eq(&owner, &node) && redirects < MAX_REDIRECTS {
                    redirects += 1;
                    next = Some((owner, false));
                    continue;
                }
            }
            let e = match exec(&node, asking) {
                Err(Error::Redis(e)) => e,
                Err(e) => {
                    if e.is_connection_error() {
                        self.refresh_soon();
                    }
                    return Err(e);
                }
                ok => return ok,
            };
            let redirect = e.redirect_node().map(|(a, s)| (a.to_owned(), s));
            match (e.code(), redirect) {
                (Some("MOVED"), Some((addr, s))) if redirects < MAX_REDIRECTS => {
                    let to = self.node_at(&addr)?;
                    log::debug!("slot {s} moved to {addr}");
                    self.set_owner(s, &to);
                    self.refresh_soon();
                    next = Some((to, false));
                    redirects += 1;
                }
                (Some("ASK"), Some((addr, _))) if redirects < MAX_REDIRECTS => {
                    let to = self.node_at(&addr)?;
                    asked = Some(Arc::clone(&to));
                    next = Some((to, true));
                    redirects += 1;
                }
                (Some("TRYAGAIN" | "CLUSTERDOWN"), _) if started.elapsed() + pause < budget => {
                    if e.code() == Some("CLUSTERDOWN") {
                        self.refresh_soon();
                    }
                    std::thread::sleep(jitter(pause, 0.5));
                    pause = (pause * 2).min(Duration::from_millis(100));
                    if asking {
                        next = asked.clone().map(|n| (n, true));
                    }
                }
                _ => {
                    if is_connection_failure(&e) {
                        self.refresh_soon();
                    }
                    return Err(Error::Redis(e));
                }
            }
        }
    }
}

/// The same owner (or none) for a slot.
fn same_node(a: &Option<Arc<Node>>, b: &Option<Arc<Node>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}
