//! Routing: which node a key's operation goes to, and batches of many keys
//! grouped per node.
//!
//! Everything that talks to Redis names the key it works on and asks the
//! router: a lock operation runs on the node of its lock key, a waiter
//! subscribes on the node of its channel, and the watchdog's batches are cut
//! per node (and per slot within a node, see [`Router::group`]) and sent to
//! all nodes at once ([`crate::connection::fan_out`]). A node is a pool of
//! connections ([`Redis`], with its replica sync state) and a subscriber
//! ([`PubSub`]); both are made lazily and open nothing until used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::connection::{Counters, Redis, Synced};
use crate::error::Result;
use crate::pubsub::PubSub;
use crate::transport::Connection;

/// One Redis server the client talks to: its connection pool and its
/// subscriber.
pub(crate) struct Node {
    pub(crate) redis: Arc<Redis>,
    pub(crate) pubsub: PubSub,
}

/// The nodes of a client.
enum Topology {
    /// One server, or the master of a Sentinel group (the target moves,
    /// the node stays).
    Single(Arc<Node>),
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
}

impl Router {
    pub(crate) fn single(node: Node, retry_attempts: u32, counters: Arc<Counters>) -> Router {
        Router {
            topology: Topology::Single(Arc::new(node)),
            next_request: AtomicU64::new(1),
            retry_attempts,
            counters,
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
    pub(crate) fn node(&self, _key: &str) -> Result<Arc<Node>> {
        match &self.topology {
            Topology::Single(node) => Ok(Arc::clone(node)),
        }
    }

    /// Every node known now (for stats and for listeners).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        match &self.topology {
            Topology::Single(node) => vec![Arc::clone(node)],
        }
    }

    /// Runs `op` on the node of `key` (see [`Redis::run`]).
    pub(crate) fn run<T>(
        &self,
        key: &str,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.node(key)?.redis.run(op)
    }

    /// Runs a write that decides lock state on the node of `key`, with
    /// replica sync (see [`Redis::run_synced`]).
    pub(crate) fn run_synced<T>(
        &self,
        key: &str,
        op: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<(T, Synced)> {
        self.node(key)?.redis.run_synced(op)
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
        }
    }

    /// `true` when the servers behind a key can change (Sentinel, Cluster):
    /// callers that wait (`lock()`) ride out a failover instead of failing.
    pub(crate) fn can_move(&self) -> bool {
        match &self.topology {
            Topology::Single(node) => node.redis.target().can_move(),
        }
    }

    /// Waits (up to the connection timeout) for a connection, to report at
    /// once whether the settings work.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.topology {
            Topology::Single(node) => node.redis.check(),
        }
    }
}
