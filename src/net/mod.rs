//! Reaching Redis: one server, then which server. This layer knows no lock:
//! it sends what the layers above give it to the node that serves a key, and
//! hands back the reply or a classified failure.
//!
//! Bottom up (a file imports only those before it):
//! - `tls`: the rustls configuration and stream (the `tls` feature);
//! - `transport`: addresses, endpoints, the stream (TCP, TLS, Unix) and a
//!   RESP connection over it;
//! - `target`: where a connection goes: a fixed server, or the master a
//!   Sentinel group names now;
//! - `pool`: the r2d2 manager and the runner of one server (`Redis`: a
//!   pooled call with retries after a dropped connection, replica sync with
//!   `WAIT`, a pipelined round trip to several servers at once);
//! - `pubsub`: one server's subscriber thread and its waiters' latches;
//! - `node`: one server's pool and subscriber;
//! - `cluster`: the slot map, its refresh, `MOVED`/`ASK`/`TRYAGAIN`;
//! - `router`: the node of a key, and batches grouped per node and slot;
//! - `setup`: the builder's settings made into a router (one server, a
//!   Sentinel group's master, a Cluster).

pub(crate) mod cluster;
pub(crate) mod node;
pub(crate) mod pool;
pub(crate) mod pubsub;
pub(crate) mod router;
pub(crate) mod setup;
pub(crate) mod target;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod transport;
