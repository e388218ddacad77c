//! The public kinds, one per file, on the engine below them. A kind never
//! imports the client (`Client` is a handle over the context the kinds
//! hold), and reuse runs from a derived kind to its base, never back.
//!
//! Bottom up (a file imports only those before it):
//! - `inspect`: who holds and who waits, as Redis records it, and what
//!   kind of object a name is (read only);
//! - `lockable`: the traits every lock kind (`Lockable`) and every guard
//!   of one (`LeaseGuard`) implement;
//! - `guard`: `LockGuard`, the guard of every hash lock, and the release
//!   protocol;
//! - `lock`: `Lock`, the reentrant lock (plain and fenced) and the base of
//!   the fair, read and write locks: the handle and the acquire protocol;
//! - `owned`: `OwnedLock`, `OwnedLockGuard`: a lock owned by the
//!   acquisition, not the thread;
//! - `fair`: `FairLock` and its wait in line;
//! - `rwlock`: `ReadWriteLock`, `ReadLock`, `WriteLock`;
//! - `multi`: `RedLock`, `MultiLock`, `MultiGuard` over member locks;
//! - `semaphore`: `Semaphore`, `SemaphorePermits`, and what both semaphores
//!   share;
//! - `expirable`: `ExpirableSemaphore` and `Permit`, on the semaphore's
//!   shared part;
//! - `latch`: `CountDownLatch`, on its own.

pub(crate) mod expirable;
pub(crate) mod fair;
pub(crate) mod guard;
pub(crate) mod inspect;
pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod lockable;
pub(crate) mod multi;
pub(crate) mod owned;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
