//! Waiters whose tries fail the way an outage looks (a link cut after the
//! request reached Redis, or silent): they wait on within the holder's lease
//! they saw, pace their tries, and step out meanwhile, so that a wake-up
//! they took goes on to another waiter, of their process or of the next
//! queued one. Found by review of the first version of this ride-out, which
//! kept a failing waiter subscribed: two failing waiters of one process
//! handed the wake-up back and forth while the next process slept until
//! their deadline, and a try right after subscribing still ended `lock()`.
//! A second review added the fair lock (it rides out an outage while its
//! place in line lasts) and the latch (its wait has no lease to bound it:
//! it fails 10 s after its last answered read).
//!
//! Figures are printed as `FIGURE:` lines (run with `--nocapture` to see them).

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::faults_common::{figure, is_acquire_of, is_script_call, Monitor};
use crate::handoff::{acquire_sha, queue, rig, wake_channel, Returned, WAIT};
use crate::support::{wait_until, Fault};

/// Waits for the waiter at `index` among those that send to `rx`: when it
/// got the lock (`None`: it did not), and what the others sent meanwhile.
fn wait_for_waiter(
    rx: &mpsc::Receiver<Returned>,
    index: usize,
) -> (Option<Instant>, Vec<Returned>) {
    let mut others = Vec::new();
    loop {
        let (i, at) = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("waiter {index} to return: {e}"));
        if i == index {
            return (at, others);
        }
        others.push((i, at));
    }
}

/// Two waiters of one client whose every try gets no answer, and a client
/// queued behind them: the release wakes the failing client, and its
/// waiters step out (the client leaves the queue, passing the wake-up on),
/// so the other client takes the lock within seconds. (Keeping the failing
/// waiters subscribed, the first version of the ride-out passed the wake-up
/// between them, and the other client waited 15.5 s, for their deadline.)
#[test]
fn two_failing_waiters_of_one_client_do_not_strand_the_next_client() {
    const NAME: &str = "rv:two";
    let r = rig();
    let proxy = &r.proxy;
    let (g, rx, _go) = r.queue_up(NAME, 2, Duration::from_secs(15));
    let tried = proxy.add_rule(&acquire_sha(), Fault::BlackHole, usize::MAX);
    let released = Instant::now();
    drop(g);
    let (patient_at, others) = wait_for_waiter(&rx, 2);
    let took = patient_at.map(|a| a.saturating_duration_since(released));
    figure(&format!(
        "two failing waiters in one client: the next client got the lock {took:?} after \
         the release (failing tries black-holed: {}; other returns: {others:?})",
        proxy.hits(tried)
    ));
    proxy.remove_rule(tried);
    let took = took.expect("the patient client got the lock");
    assert!(
        took < Duration::from_secs(5),
        "the wake-up was not passed on: the patient client got the lock {took:?} after the \
         release"
    );
}

/// The try right after subscribing (the first that queues) is cut after it
/// reached Redis, and so is each retry on a new connection. The waiter saw
/// the holder's 30 s lease in its first try, so it waits on and takes the
/// lock once it is released. (Before: `lock()` = `Err(unexpected end of
/// file)` at once.)
#[test]
fn a_cut_try_right_after_subscribing_waits_on() {
    const NAME: &str = "rv:first";
    let r = rig();
    let g = r.holder.lock(NAME).lock().expect("holder lock");
    // Only a queued try carries the queue key; the first try (before
    // subscribing) does not, nor does SUBSCRIBE.
    let attempts = 1 + 3;
    // (This lock's queue only: the warm-up's leave, sent in the background,
    // carries the warm-up lock's queue.)
    let rule = r.proxy.add_rule(
        b"redlease_waiting:{rv:first}",
        Fault::CutAfterRequest,
        attempts,
    );
    let started = Instant::now();
    let h = {
        let lock = r.failing.lock(NAME);
        thread::spawn(move || {
            let got = lock.lock().map(|g| {
                let c = lock.hold_count();
                drop(g);
                c
            });
            (format!("{got:?}"), Instant::now())
        })
    };
    r.proxy.wait_hits(rule, attempts, WAIT);
    drop(g);
    let (got, at) = h.join().expect("waiter");
    figure(&format!(
        "cut try right after subscribing: lock() = {got} after {:?} (rule hits {})",
        at - started,
        r.proxy.hits(rule)
    ));
    assert_eq!(
        got, "Ok(Ok(1))",
        "lock() rides out the cut try (holder's lease 30 s)"
    );
}

/// One waiter per client. The failing client's waiter is woken (a message
/// on the lock's channel) and its try gets no answer; its next try runs on
/// Redis but loses its reply; every try after that gets no answer. The
/// release must not wake the failing client in place of the other one:
/// a waiter that stepped out does not queue its client again until a try
/// of it is answered. (In the first version of the ride-out the lost
/// reply's try queued the client again, the release woke it while its
/// waiter was pausing between tries, and the other client waited 11 s, for
/// the failing one's deadline.)
#[test]
fn a_client_whose_tries_fail_is_not_woken_in_place_of_another() {
    const NAME: &str = "rv:single";
    let r = rig();
    let (srv, proxy, failing) = (&r.srv, &r.proxy, &r.failing);
    let (g, rx, _go) = r.queue_up(NAME, 1, Duration::from_secs(12));
    let sha = acquire_sha();
    let hole1 = proxy.add_rule(&sha, Fault::BlackHole, 1);
    let lost = proxy.add_rule(&sha, Fault::DropReply, 1);
    let hole = proxy.add_rule(&sha, Fault::BlackHole, usize::MAX);
    // A wake-up for every client (as a Redisson release, or an undo, sends).
    srv.cmd(&[
        "PUBLISH",
        &format!("redisson_lock__channel:{{{NAME}}}"),
        "0",
    ]);
    wait_until("the failing waiter's tries", WAIT, || {
        proxy.hits(hole1) == 1 && proxy.hits(lost) == 1 && proxy.hits(hole) >= 1
    });
    let requeued = srv.cmd(&["ZSCORE", &queue(NAME), &wake_channel(NAME, failing)]);
    let zset = srv.cmd(&["ZRANGE", &queue(NAME), "0", "-1", "WITHSCORES"]);
    let released = Instant::now();
    drop(g);
    let (patient_at, others) = wait_for_waiter(&rx, 1);
    let took = patient_at.map(|a| a.saturating_duration_since(released));
    figure(&format!(
        "a failing waiter's client queued at the release: {:?} (queue {zset:?}); the other \
         client got the lock {took:?} after the release (other returns {others:?})",
        !requeued.is_empty(),
    ));
    proxy.remove_rule(hole);
    assert!(
        requeued.is_empty(),
        "a waiter that stepped out does not queue its client: {zset:?}"
    );
    let took = took.expect("the patient client got the lock");
    assert!(
        took < Duration::from_secs(5),
        "the wake-up was not passed on: {took:?} after the release"
    );
}

/// A woken waiter whose every try fails at once (cut after reaching Redis)
/// neither spins nor outlives `try_lock_for`'s deadline by more than about
/// one response timeout.
#[test]
fn failing_tries_are_paced_and_bounded() {
    const NAME: &str = "rv:paced";
    let r = rig();
    let (srv, proxy, failing) = (&r.srv, &r.proxy, &r.failing);
    let g = r.holder.lock(NAME).lock().expect("holder");
    let lock = failing.lock(NAME);
    let started = Instant::now();
    let h = thread::spawn(move || {
        let r = lock.try_lock_for(Duration::from_secs(3));
        (format!("{:?}", r.map(|g| g.is_some())), Instant::now())
    });
    wait_until("queued", WAIT, || srv.cmd(&["ZCARD", &queue(NAME)]) == "1");
    let cut = proxy.add_rule(&acquire_sha(), Fault::CutAfterRequest, usize::MAX);
    srv.cmd(&[
        "PUBLISH",
        &format!("redisson_lock__channel:{{{NAME}}}"),
        "0",
    ]);
    let (got, at) = h.join().expect("waiter");
    let hits = proxy.hits(cut);
    proxy.remove_rule(cut);
    drop(g);
    let took = at - started;
    figure(&format!(
        "a waiter whose every try is cut: try_lock_for(3 s) = {got} after {} ms; cut acquire \
         requests (each try and its 3 resends): {hits}",
        took.as_millis()
    ));
    assert!(
        got.starts_with("Err("),
        "its tries failed until the deadline: {got}"
    );
    assert!(
        took < Duration::from_millis(3_600),
        "returned {took:?} after try_lock_for(3 s), response timeout 500 ms"
    );
    assert!(hits < 60, "{hits} cut tries in 3 s: the tries are paced");
}

/// The MultiLock's rounds right after subscribing (the first after the
/// first answered, busy round) are cut after reaching Redis: the wait goes
/// on within the holder's 30 s lease it saw, and takes both locks once the
/// link answers and the holder has released. (Before: `Err(unexpected end
/// of file)` after the first cut round.)
#[test]
fn a_multilock_round_cut_after_subscribing_waits_on() {
    let r = rig();
    let (srv, proxy, failing) = (&r.srv, &r.proxy, &r.failing);
    let g = r.holder.lock("rv:ma").lock().expect("holder");
    let mut monitor = Monitor::start(srv);
    // Holds back the SUBSCRIBE's ack (within the 500 ms response timeout):
    // the round after subscribing waits for the cut rule.
    let slow_sub = proxy.add_rule(
        b"redisson_lock__channel:{rv:ma}",
        Fault::DelayReply(Duration::from_millis(400)),
        1,
    );
    let multi = redlease::MultiLock::new(vec![failing.lock("rv:ma"), failing.lock("rv:mb")])
        .expect("multi");
    let started = Instant::now();
    let h = thread::spawn(move || {
        let r = multi.try_lock_for(Duration::from_secs(10));
        (format!("{:?}", r.map(|g| g.is_some())), Instant::now())
    });
    monitor.wait_for("the first round", |l| is_acquire_of(l, "rv:ma"), 1);
    let cut = proxy.add_rule(&acquire_sha(), Fault::CutAfterRequest, usize::MAX);
    proxy.wait_hits(cut, 1, WAIT);
    let cut_hits = proxy.hits(cut);
    proxy.remove_rule(cut);
    drop(g);
    let (got, at) = h.join().expect("waiter");
    figure(&format!(
        "multilock: try_lock_for(10 s) = {got} after {:?}; subscribe delayed {}; cut rounds {}",
        at - started,
        proxy.hits(slow_sub),
        cut_hits
    ));
    assert_eq!(got, "Ok(true)");
}

/// A fair lock's waiter (first in line; the holder's lease 30 s) whose try
/// is cut after reaching Redis, with its 3 resends: it rides the outage out
/// within its place's lease and takes the lock once it is released. (Found
/// by review: the fair lock shortened its busy hint to its 2 s re-check, so
/// a failed re-check ended `lock()` with the error, and the waiter left the
/// line.)
#[test]
fn a_fair_waiter_rides_out_a_cut_try() {
    const NAME: &str = "rv:fair";
    let r = rig();
    let g = r.holder.fair_lock(NAME).lock().expect("holder");
    let lock = r.failing.fair_lock(NAME);
    let mut monitor = Monitor::start(&r.srv);
    let started = Instant::now();
    let h = thread::spawn(move || {
        let got = lock.lock().map(drop);
        (format!("{got:?}"), Instant::now())
    });
    // Only the fair waiter's tries (and its leave) name the places key; the
    // holder is not behind the proxy.
    let places = format!("redisson_lock_timeout:{{{NAME}}}");
    // Its first try and the one after subscribing: the next is its 2 s
    // re-check, which keeps its place.
    monitor.wait_for(
        "the fair waiter's try after subscribing",
        |l| is_script_call(l, &places) && l.contains(r.failing.id()),
        2,
    );
    let cut = r
        .proxy
        .add_rule(places.as_bytes(), Fault::CutAfterRequest, 4);
    r.proxy.wait_hits(cut, 4, WAIT);
    drop(g);
    let (got, at) = h.join().expect("waiter");
    figure(&format!(
        "a fair waiter whose try was cut 4 times: lock() = {got} after {} ms",
        (at - started).as_millis()
    ));
    assert_eq!(
        got, "Ok(())",
        "lock() rides out a cut try within its place's lease"
    );
}

/// A latch's `wait()` (no deadline) whose Redis becomes unreachable rides
/// the outage out for 10 s after its last answered read, then fails. (Found
/// by review: no lease bounds a latch's wait, so it waited forever.)
#[test]
fn a_latch_wait_without_deadline_fails_once_redis_is_gone_for_10_s() {
    const NAME: &str = "rv:latch";
    let r = rig();
    assert!(r
        .holder
        .count_down_latch(NAME)
        .try_set_count(1)
        .expect("set the count"));
    let latch = r.failing.count_down_latch(NAME);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let got = latch.wait();
        let _ = tx.send((format!("{got:?}"), Instant::now()));
    });
    wait_until("the latch waiter subscribed", WAIT, || {
        r.srv
            .subscribers(&format!("redisson_countdownlatch__channel__{{{NAME}}}"))
            == 1
    });
    r.proxy.set_reject(true);
    let gone = Instant::now();
    r.proxy.cut();
    let (got, at) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("wait() to return within 20 s of Redis becoming unreachable");
    let took = at.saturating_duration_since(gone);
    figure(&format!(
        "a latch wait() with Redis unreachable returned {got} after {} ms",
        took.as_millis()
    ));
    assert!(got.starts_with("Err("), "{got}");
}
