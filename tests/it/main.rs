//! The integration tests, one binary: each module is one suite, all against
//! redis-server processes they start themselves (`redlease_testkit`).
//!
//! `multiprocess`, `watchdog` and `faults_lifecycle` re-run this binary as
//! worker processes (each module's `worker` test, chosen by an environment
//! variable), and count threads there. Tests that look at their own whole
//! process (its threads, its logger) live in binaries of their own next to
//! this one (`watchdog_shutdown`, `log_outage`, `settle_warnings`).

use redlease_testkit as support;

#[path = "../faults_common/mod.rs"]
mod faults_common;

mod acl;
mod cluster;
mod cost;
mod events;
mod failover;
mod fair;
mod faults_correctness;
mod faults_cut;
mod faults_lifecycle;
mod faults_pubsub;
mod faults_restart;
mod faults_stall;
mod faults_waiting;
mod fenced;
mod grant;
mod handoff;
mod inspect;
mod latch;
mod lock;
mod lockable;
mod max_hold;
mod multiprocess;
mod owned;
mod redisson_interop;
mod redlock;
mod renewal;
mod replica_sync;
mod rwlock;
mod script_paths;
mod semaphore;
mod sentinel;
mod support_selftest;
#[cfg(feature = "tls")]
mod tls;
mod watchdog;

/// This test binary run again as a worker process: only `test` (a module's
/// `worker`, which picks its job from environment variables the caller
/// sets), on one thread, its output not captured.
pub(crate) fn worker_process(test: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("current_exe"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads", "1"]);
    cmd
}

/// An error and its chain of causes, for messages and assertions.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(" <- ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// The client's counters read between two watchdog batches (a batch counts
/// itself before its renewals and round trips): the same twice 20 ms apart.
/// On a loaded machine a batch can still be under way (its round trips not
/// yet counted): callers allow for one such batch at each end.
pub(crate) fn quiet_stats(c: &redlease::Client) -> redlease::ClientStats {
    let mut quiet = None;
    support::wait_until(
        "the watchdog between batches",
        std::time::Duration::from_secs(20),
        || {
            let a = c.stats();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let b = c.stats();
            let same = a == b;
            quiet = Some(b);
            same
        },
    );
    quiet.expect("stats were read")
}
