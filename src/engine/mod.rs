//! What every kind of lock shares. This layer knows no kind's public type:
//! it keeps the state of holds and of requests whose reply was lost, the one
//! renewal thread, the context each kind holds, and the one acquire loop.
//!
//! Bottom up (a file imports only those before it):
//! - `hold`: what one owner holds of one lock: the count, what is known of
//!   the lease (bound, generation), the watchdog's mark, the lost flag;
//! - `unsettled`: requests whose reply was lost, what each was, and how it
//!   is settled;
//! - `owners`: this thread's holds and unsettled requests per client and
//!   lock (the reentrancy registry);
//! - `process`: what the client publishes about its process (its process
//!   key), which the watchdog writes;
//! - `watchdog`: the `redlease-watchdog` thread: renews due holds per node
//!   in one round trip each, and settles lost requests until each has run;
//! - `grants`: hand-off inside one client: a waiter's prepared acquisition
//!   that a releasing thread of the same client carries out with its
//!   release (uses the net layer's wake-up of one waiter);
//! - `shared`: the context a client's locks hold (ids, router, watchdog,
//!   timeouts), and the checks every kind makes;
//! - `waiting`: the acquire loop (try, subscribe, wait for a message or
//!   the hint, try again), which uses the net layer only.

pub(crate) mod grants;
pub(crate) mod hold;
pub(crate) mod owners;
pub(crate) mod process;
pub(crate) mod shared;
pub(crate) mod unsettled;
pub(crate) mod waiting;
pub(crate) mod watchdog;
