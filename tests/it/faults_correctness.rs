//! Regression tests for the correctness issue: lost replies, late renewals,
//! silent links. Each test injects exactly the fault it is about through the
//! in-test proxy (a rule that delays, drops or cuts one chosen reply or
//! request), and each failed on the code before the fix.

#[path = "correctness/family.rs"]
mod family;
#[path = "correctness/lease.rs"]
mod lease;
#[path = "correctness/pubsub.rs"]
mod pubsub;
#[path = "correctness/randomized.rs"]
mod randomized;
#[path = "correctness/safety.rs"]
mod safety;
#[path = "correctness/semaphores.rs"]
mod semaphores;
