//! # redlease
//!
//! Synchronous distributed locks on Redis, compatible on the wire with
//! Redisson's `RLock`: a Java service using Redisson and a Rust service using
//! redlease on the same lock name exclude each other and wake each other.
//!
//! - **Reentrant**: a hash per lock, field `<client-uuid>:<thread-id>`, value
//!   the hold count; every operation is one Lua script, one round trip.
//! - **Woken, not polling**: a waiter subscribes to the lock's release channel;
//!   a release wakes one waiter per process, or, where redlease processes
//!   are queued for a reentrant lock, one waiter of one queued process. Each
//!   wait is bounded by the holder's lease, so a crashed holder's lock is
//!   taken as soon as it expires.
//! - **Watchdog**: locks taken without a lease are renewed until released, by
//!   one thread per client that renews everything due in one round trip, each
//!   lock at its own interval, and reports a lost lease to its guard.
//! - **Blocking** API on an r2d2 pool; RAII [`LockGuard`]s.
//! - **Observable**: [`Lock::holders`] (and the other kinds') says who holds
//!   a lock, down to the host, process id and [`ClientBuilder::name`] of a
//!   redlease holder; [`Client::inspect`] and [`Client::list`] read any
//!   name of the family (the `redlease` command prints them); a
//!   [`HandleEvent`] set with [`ClientBuilder::event_handler`] hears every
//!   acquisition, release, lost lease, renewal batch and failover (the
//!   `metrics` feature's `MetricsHandler` records them as metrics).
//!
//! ```
//! use std::time::Duration;
//!
//! fn main() -> redlease::Result<()> {
//!     let url = "redis://127.0.0.1:6379/";
//! #   let server = TestServer::start(); // a throwaway redis-server for this example
//! #   let url = server.url();
//!     let client = redlease::Client::open(url)?;
//!     let lock = client.lock("orders:42");
//!
//!     let guard = lock.lock()?;                 // waits; renewed by the watchdog
//!     let again = lock.lock()?;                 // re-entry by the same thread
//!     assert_eq!(lock.hold_count()?, 2);
//!     drop(again);
//!
//!     guard.ensure_held()?;                     // cheap check before a side effect
//!     guard.unlock()?;                          // or just drop it
//!     assert!(!lock.is_locked()?);
//!
//!     let lease = Duration::from_secs(10);
//!     if let Some(g) = lock.try_lock_with_lease(Duration::from_secs(1), lease)? {
//!         // held for at most 10 s, never renewed
//!         drop(g);
//!     }
//!     Ok(())
//! }
//! # struct TestServer(std::process::Child, u16);
//! # impl TestServer {
//! #     fn start() -> TestServer {
//! #         let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
//! #         let child = std::process::Command::new("redis-server")
//! #             .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
//! #             .stdout(std::process::Stdio::null())
//! #             .spawn()
//! #             .expect("this example needs redis-server installed");
//! #         let deadline = std::time::Instant::now() + Duration::from_secs(10);
//! #         while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
//! #             assert!(std::time::Instant::now() < deadline, "redis-server did not start");
//! #             std::thread::sleep(Duration::from_millis(10));
//! #         }
//! #         TestServer(child, port)
//! #     }
//! #     fn url(&self) -> String { format!("redis://127.0.0.1:{}/", self.1) }
//! # }
//! # impl Drop for TestServer {
//! #     fn drop(&mut self) { let _ = self.0.kill(); let _ = self.0.wait(); }
//! # }
//! ```
//!
//! ## Redis layout (Redisson's `RLock`)
//!
//! | what | in Redis |
//! |---|---|
//! | lock state | a hash at key `<name>`; field `<client-uuid>:<thread-id>`, value the hold count; plus redlease's field `<client-uuid>:<thread-id>:gen` (a generation Redisson ignores) |
//! | lease | `PEXPIRE <name>` on every acquire, re-entry and renewal |
//! | release channel | `redisson_lock__channel:{<name>}` (`redisson_lock__channel:<name>` when the name contains `{`), message `0` on a full release |
//! | request keys | `redisson_unlock_latch:{<name>}:...`, `redlease_acquire_cancel:{<name>}:...`, `redlease_force_unlock_latch:{<name>}:...`: short-lived, written only so that a retried or late copy of a request is never applied twice |
//!
//! Every state change is one Lua script (EVALSHA), so acquire, re-entry,
//! release and renewal are each atomic and each one round trip.
//!
//! ## Threads and blocking
//!
//! Each [`Client`] has an r2d2 pool (connections opened by one
//! `redlease-connect` thread), one `redlease-watchdog` thread that renews
//! every watched lock of the client in batched round trips, and one
//! `redlease-pubsub` thread with one subscriber connection for all waiters
//! (on a Redis Cluster, one per master, and a `redlease-slots` thread that
//! reads the slot map every second). None of them is per lock; they stop when the last `Client` clone and the
//! last guard are gone.
//!
//! Every call, and dropping a [`LockGuard`], makes blocking round trips,
//! each bounded by the client's timeouts. From async code, run them inside
//! `spawn_blocking` (tokio) or your runtime's equivalent, and take and drop
//! the guard in the same closure: a lock is owned by an OS thread, which is
//! why a `LockGuard` is `!Send`.
//!
//! ```no_run
//! # fn main() -> redlease::Result<()> {
//! # let client = redlease::Client::open("redis://127.0.0.1/")?;
//! // async fn handler(client: redlease::Client) {
//! //     tokio::task::spawn_blocking(move || -> redlease::Result<()> {
//!         let guard = client.lock("orders:42").lock()?;
//!         // ... blocking work while the lock is held ...
//!         guard.unlock()
//! //     }).await??;
//! # }
//! ```
//!
//! ## Features
//!
//! - `tls` (default): `rediss://` urls, TLS and mutual TLS through rustls
//!   with the ring provider and the system's roots (adds `rustls`, `ring`
//!   and `rustls-native-certs`; no OpenSSL, no cmake). Without it a
//!   `rediss://` url is refused with an error that names the feature.
//! - `metrics`: `MetricsHandler`, an event handler that records redlease's
//!   events with the [`metrics`](https://docs.rs/metrics) facade (adds the
//!   `metrics` crate).
//!
//! ## Guarantees and limits
//!
//! A Redis lock is a lease. A holder that pauses (GC-like stall, swap, a
//! stopped VM) for longer than its lease can lose the lock while it still
//! runs; the watchdog cannot help a process that does not run. Call
//! [`LockGuard::ensure_held`] before each side effect that must be exclusive,
//! and keep critical sections well inside the lease. A single Redis (or a
//! replicated one that fails over) can lose a lock on a crash.
//!
//! ## Guides
//!
//! - [`guide::guarantees`]: what a lock promises, and what a crash, a lost
//!   reply, a stall and a failover do.
//! - [`guide::kinds`]: each kind beside the reentrant lock (fenced, fair,
//!   read-write, semaphores, latch, RedLock, MultiLock), with examples.
//! - [`guide::production`]: TLS, ACL users, Sentinel, replica sync, Redis
//!   Cluster.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// The layers, top down; an import only points down this list (checked by
// tests/layers.rs):
//   client.rs  the public Client and its builder: a handle over engine::Shared
//   kinds/     one public kind per file; never imports client.rs
//   engine/    what every kind shares; knows no kind's public type
//   scripts.rs Redisson's key names and the Lua scripts, and how they run
//   net/       reaching Redis; knows no lock
//   error.rs, time.rs, events.rs (the event handler), metrics.rs (the
//   `metrics` feature's handler)  the ground
mod client;
mod engine;
mod error;
mod events;
mod kinds;
#[cfg(feature = "metrics")]
mod metrics;
mod net;
mod scripts;
mod time;

pub use crate::client::{Client, ClientBuilder, ClientStats};
pub use crate::engine::shared::MAX_LEASE;
pub use crate::engine::watchdog::MIN_RENEW_INTERVAL;
pub use crate::error::{Error, Result};
pub use crate::events::{
    AcquireEvent, FailoverEvent, HandleEvent, LostEvent, ReconnectEvent, ReleaseEvent,
    RenewalBatchEvent,
};
pub use crate::kinds::expirable::{ExpirableSemaphore, Permit};
pub use crate::kinds::fair::{FairLock, FAIR_PLACE};
pub use crate::kinds::guard::LockGuard;
pub use crate::kinds::inspect::{HoldMode, Holder, Inspection, ObjectKind, ProcessInfo, Waiter};
pub use crate::kinds::latch::CountDownLatch;
pub use crate::kinds::lock::Lock;
pub use crate::kinds::lockable::{LeaseGuard, Lockable};
pub use crate::kinds::multi::{MultiGuard, MultiLock, RedLock};
pub use crate::kinds::owned::{OwnedLock, OwnedLockGuard};
pub use crate::kinds::rwlock::{ReadLock, ReadWriteLock, WriteLock};
pub use crate::kinds::semaphore::{Semaphore, SemaphorePermits, PERMIT_RECHECK};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use crate::metrics::MetricsHandler;

// Every Rust block of the README and of docs/ compiles as a doctest.
macro_rules! doctests {
    ($($name:ident = $file:literal;)+) => {
        $(
            #[cfg(doctest)]
            #[doc = include_str!($file)]
            pub struct $name;
        )+
    };
}

doctests! {
    ReadmeDoctests = "../README.md";
    ApiDoctests = "../docs/api.md";
    ObservabilityDoctests = "../docs/observability.md";
    InternalsDoctests = "../docs/internals.md";
    PerformanceDoctests = "../docs/performance.md";
    ReliabilityDoctests = "../docs/reliability.md";
}

/// The guides of `docs/` that a user of the API reads, here as well as in
/// the repository: what a lock guarantees, each kind of the family, and
/// production setups. Nothing to call: these modules hold only text (and
/// its examples, which run as doctests).
pub mod guide {
    #[doc = include_str!("../docs/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("../docs/kinds.md")]
    pub mod kinds {}
    #[doc = include_str!("../docs/production.md")]
    pub mod production {}
}
