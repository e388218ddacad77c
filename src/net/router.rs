//! Routing: which node a key's operation goes to, and batches of many keys
//! grouped per node.
//!
//! Everything that talks to Redis names the key it works on and asks the
//! router: a lock operation runs on the node of its lock key, a waiter
//! subscribes on the node of its channel, and the watchdog's batches are cut
//! per node (and per slot within a node, see [`Router::group`]) and sent to
//! all nodes at once ([`crate::net::pool::fan_out`]). A node is a pool of
//! connections (`Redis`, with its replica sync state) and a subscriber
//! (`PubSub`); both are made lazily and open nothing until used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::net::cluster::{slot, Cluster};
use crate::net::node::Node;
use crate::net::pool::{Counters, Synced};
use crate::net::transport::Connection;
use crate::time::{jitter, warn_limited};

/// The nodes of a client.
enum Topology {
    /// One server, or the master of a Sentinel group (the target moves,
    /// the node stays).
    Single(Arc<Node>),
    /// The masters of a Redis Cluster, by slot.
    Cluster(Arc<Cluster>),
}

/// Keys grouped for one node: `chunks` holds indices into the caller's
/// items, at most `chunk` per inner vector, each inner vector within one
/// slot where that matters (a multi-key script may touch one slot only).
pub(crate) struct Group {
    pub(crate) node: Arc<Node>,
    pub(crate) chunks: Vec<Vec<usize>>,
}

pub(crate) struct Router {
    topology: Topology,
    next_request: AtomicU64,
    retry_attempts: u32,
    counters: Arc<Counters>,
    /// How long a call without a deadline of its own rides out a failover.
    response_timeout: Duration,
}

impl Router {
    pub(crate) fn single(
        node: Node,
        retry_attempts: u32,
        counters: Arc<Counters>,
        response_timeout: Duration,
    ) -> Router {
        Router {
            topology: Topology::Single(Arc::new(node)),
            next_request: AtomicU64::new(1),
            retry_attempts,
            counters,
            response_timeout,
        }
    }

    pub(crate) fn cluster(
        cluster: Arc<Cluster>,
        retry_attempts: u32,
        counters: Arc<Counters>,
        response_timeout: Duration,
    ) -> Router {
        Router {
            topology: Topology::Cluster(cluster),
            next_request: AtomicU64::new(1),
            retry_attempts,
            counters,
            response_timeout,
        }
    }

    /// `true` on a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// The command lock scripts publish release messages with: `spublish`
    /// on a cluster with sharded pub/sub, else `publish`.
    pub(crate) fn publish_command(&self) -> &'static str {
        match &self.topology {
            Topology::Single(_) => "publish",
            Topology::Cluster(c) => c.publish_command(),
        }
    }

    /// A waiter's channel left its node (see `pubsub::Wake::Moved`): follow
    /// it before subscribing again. `to` is the node Redis named, if any.
    pub(crate) fn channel_moved(&self, channel: &str, to: Option<&str>) {
        if let Topology::Cluster(c) = &self.topology {
            c.channel_moved(channel, to);
        }
    }

    /// A node failed a request the router did not route itself (a
    /// watchdog batch): on a cluster, read the slot map again soon.
    pub(crate) fn node_failed(&self) {
        if let Topology::Cluster(c) = &self.topology {
            c.refresh_soon();
        }
    }

    /// A number unique to this client, for request ids (latch and marker
    /// names, generations).
    pub(crate) fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Retries of a dropped request (the client's `retry_attempts`).
    pub(crate) fn retry_attempts(&self) -> u32 {
        self.retry_attempts
    }

    /// The client's connection counters.
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The node that serves `key` now.
    pub(crate) fn node(&self, key: &str) -> Result<Arc<Node>> {
        match &self.topology {
            Topology::Single(node) => Ok(Arc::clone(node)),
            Topology::Cluster(c) => c.owner(slot(key.as_bytes())),
        }
    }

    /// The masters known now: the one node, or every master of a Cluster
    /// (what a scan of the keys visits).
    pub(crate) fn masters(&self) -> Vec<Arc<Node>> {
        match &self.topology {
            Topology::Single(node) => vec![Arc::clone(node)],
            Topology::Cluster(c) => c.masters(),
        }
    }

    /// Every node known now (for stats and for listeners).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        match &self.topology {
            Topology::Single(node) => vec![Arc::clone(node)],
            Topology::Cluster(c) => c.all_nodes(),
        }
    }

    /// Runs `op` on the node of `key` (see
    /// [`Redis::run`](crate::net::pool::Redis::run)): the one call path of
    /// every request of every kind. It routes the key, follows `MOVED` and
    /// `ASK`, and rides out a failover for up to a response timeout
    /// ([`ride_out`](Router::ride_out)).
    pub(crate) fn run<T>(
        &self,
        key: &str,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.run_within(key, self.response_timeout, op)
    }

    /// [`run`](Router::run) riding out a failover for at most `budget`
    /// instead of a response timeout (the watchdog's background requests,
    /// which it tries again on a schedule of its own).
    pub(crate) fn run_within<T>(
        &self,
        key: &str,
        budget: Duration,
        mut op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.ride_out(key, budget, |left| match &self.topology {
            Topology::Single(node) => node.redis.run_within(left, &mut op),
            Topology::Cluster(c) => c.route(key, left, |node, asking| {
                node.redis
                    .run_within(left, |conn| asking_for(conn, asking, &mut op))
            }),
        })
    }

    /// [`run`](Router::run) for a write that decides lock state, with
    /// replica sync (see
    /// [`Redis::run_synced`](crate::net::pool::Redis::run_synced)).
    pub(crate) fn run_synced<T>(
        &self,
        key: &str,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<(T, Synced)> {
        self.run_synced_within(key, self.response_timeout, op)
    }

    /// [`run_synced`](Router::run_synced) riding out a failover for at most
    /// `budget` instead of a response timeout: the watchdog's background
    /// requests, which it tries again on a schedule of its own (a failed try
    /// still has the slot map read again for the next one).
    pub(crate) fn run_synced_within<T>(
        &self,
        key: &str,
        budget: Duration,
        mut op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<(T, Synced)> {
        self.ride_out(key, budget, |left| match &self.topology {
            Topology::Single(node) => node.redis.run_synced_within(left, &mut op),
            Topology::Cluster(c) => c.route(key, left, |node, asking| {
                node.redis
                    .run_synced_within(left, |conn| asking_for(conn, asking, &mut op))
            }),
        })
    }

    /// Runs `send` (one routed request) again while it fails the way a
    /// failover looks and the request cannot be running still
    /// ([`Error::can_resend`]: it was not sent, Redis refused it without
    /// running it, or its connection is gone), for up to `budget` (a
    /// response timeout, for a caller's request; each resend gets only what
    /// is left of it): between tries, a Cluster's slot map is read again and
    /// a Sentinel group's master looked up again, after a pause growing from
    /// 50 ms to 500 ms (jittered). Only where the servers can move; a
    /// request that timed out is never sent again here (a late copy may
    /// still run: its caller settles it). If a try that may have run fails
    /// and a later one fails too, the first failure is returned, so that
    /// [`Error::maybe_applied`] holds.
    fn ride_out<T>(
        &self,
        key: &str,
        budget: Duration,
        mut send: impl FnMut(Duration) -> Result<T>,
    ) -> Result<T> {
        if !self.can_move() {
            return send(self.response_timeout);
        }
        // The budget counts from the first try, which gets a whole response
        // timeout, as any request.
        let deadline = Instant::now().checked_add(budget);
        let first_try = send(self.response_timeout);
        // A resend is made only with at least this much of the budget left
        // after its pause (a shorter socket timeout would time out, and a
        // timed-out request is settled, not resent).
        let least = self.response_timeout / 4;
        let mut pause = Duration::from_millis(50);
        let mut first: Option<Error> = None;
        let mut result = first_try;
        loop {
            let e = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let resend = e.can_resend();
            if resend {
                // The map (Cluster) is read again for the next try, ours
                // or the caller's.
                self.node_failed();
            }
            let wait = jitter(pause, 0.5);
            let left = deadline.map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now() + wait)
            });
            if !resend || left < least {
                return Err(match first {
                    Some(f) if !e.maybe_applied() => f,
                    _ => e,
                });
            }
            log::debug!("{key:?}: {e}; routing again in {wait:?}");
            if e.maybe_applied() && first.is_none() {
                first = Some(e);
            }
            std::thread::sleep(wait);
            pause = (pause * 2).min(Duration::from_millis(500));
            // What is left of the budget, and no more: the ride-out ends
            // within it.
            result = send(left);
        }
    }

    /// Groups `keys` (the i-th item's key) per node, in chunks of at most
    /// `chunk` keys of one slot.
    pub(crate) fn group<'a>(
        &self,
        keys: impl ExactSizeIterator<Item = &'a str>,
        chunk: usize,
    ) -> Vec<Group> {
        let n = keys.len();
        match &self.topology {
            Topology::Single(node) if n > 0 => vec![Group {
                node: Arc::clone(node),
                chunks: (0..n)
                    .collect::<Vec<_>>()
                    .chunks(chunk.max(1))
                    .map(<[usize]>::to_vec)
                    .collect(),
            }],
            Topology::Single(_) => Vec::new(),
            Topology::Cluster(c) => group_by_slot(c, keys, chunk),
        }
    }

    /// `true` when the servers behind a key can change (Sentinel, Cluster):
    /// callers that wait (`lock()`) ride out a failover instead of failing.
    pub(crate) fn can_move(&self) -> bool {
        match &self.topology {
            Topology::Single(node) => node.redis.target().can_move(),
            Topology::Cluster(_) => true,
        }
    }

    /// Waits (up to the connection timeout) for a connection, to report at
    /// once whether the settings work.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.topology {
            Topology::Single(node) => node.redis.check(),
            Topology::Cluster(c) => {
                c.refresh()?;
                for node in c.masters() {
                    node.redis.check()?;
                }
                Ok(())
            }
        }
    }
}

/// Runs `op` with `ASKING` before it when `asking` (an `ASK` redirection).
fn asking_for<T>(
    conn: &mut Connection,
    asking: bool,
    op: &mut impl FnMut(&mut Connection) -> redis::RedisResult<T>,
) -> redis::RedisResult<T> {
    if !asking {
        return op(conn);
    }
    conn.set_asking(true);
    let r = op(conn);
    conn.set_asking(false);
    r
}

/// [`Router::group`] on a cluster: per master, then per slot. Keys whose
/// slot no master serves now are left out (the caller counts them as
/// failed), and the slot map is read again.
fn group_by_slot<'a>(
    cluster: &Cluster,
    keys: impl ExactSizeIterator<Item = &'a str>,
    chunk: usize,
) -> Vec<Group> {
    let slots: Vec<u16> = keys.map(|k| slot(k.as_bytes())).collect();
    let owners = match cluster.owners_of(&slots) {
        Ok(o) => o,
        Err(e) => {
            warn_limited!("route batch", "cannot route a batch: {e}");
            return Vec::new();
        }
    };
    type BySlot = std::collections::BTreeMap<u16, Vec<usize>>;
    let mut groups: Vec<(Arc<Node>, BySlot)> = Vec::new();
    let mut unserved = false;
    for (i, (s, owner)) in slots.iter().zip(owners).enumerate() {
        let Some(node) = owner else {
            unserved = true;
            continue;
        };
        let pos = match groups.iter().position(|(n, _)| Arc::ptr_eq(n, &node)) {
            Some(p) => p,
            None => {
                groups.push((node, std::collections::BTreeMap::new()));
                groups.len() - 1
            }
        };
        groups[pos].1.entry(*s).or_default().push(i);
    }
    if unserved {
        cluster.refresh_soon();
    }
    groups
        .into_iter()
        .map(|(node, by_slot)| Group {
            node,
            chunks: by_slot
                .into_values()
                .flat_map(|keys| {
                    keys.chunks(chunk.max(1))
                        .map(<[usize]>::to_vec)
                        .collect::<Vec<_>>()
                })
                .collect(),
        })
        .collect()
}
