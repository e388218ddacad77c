//! One Redis server the client talks to: its connection pool and its
//! subscriber. A single server or a Sentinel group's master is one node; a
//! Cluster has one per master (made by the cluster as it learns them).

use std::sync::Arc;

use crate::net::pool::Redis;
use crate::net::pubsub::PubSub;

/// One Redis server the client talks to: its connection pool and its
/// subscriber.
pub(crate) struct Node {
    /// Its address, for logs.
    pub(crate) name: String,
    pub(crate) redis: Arc<Redis>,
    pub(crate) pubsub: PubSub,
}
