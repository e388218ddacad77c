//! The integration tests, one binary: each module is one suite, all against
//! redis-server processes they start themselves (`redlease_testkit`).
//!
//! Tests that look at the whole process (its threads) or re-run the test
//! binary as worker processes live in their own binaries next to this one
//! (`watchdog`, `watchdog_shutdown`, `faults_lifecycle`, `multiprocess`).

use redlease_testkit as support;

#[path = "../faults_common/mod.rs"]
mod faults_common;

mod faults_correctness;
mod faults_cut;
mod faults_pubsub;
mod faults_restart;
mod faults_stall;
mod lock;
mod production;
mod redisson_interop;
mod replica_sync;
mod sentinel;
mod support_selftest;
