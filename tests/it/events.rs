//! The event handler (`ClientBuilder::event_handler`): the events of an
//! acquisition without and with a wait, a hand-off, a release, a lost
//! lease, renewal batches, a subscriber reconnect, permits; and a handler
//! that panics. (A failover's event: `failover.rs`.)

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use redlease::{
    AcquireEvent, Client, FailoverEvent, HandleEvent, LostEvent, MultiLock, ReconnectEvent,
    ReleaseEvent, RenewalBatchEvent,
};

use crate::support::{wait_until, RedisServer};

const WAIT: Duration = Duration::from_secs(10);

/// Keeps each event as a line of text; renewal batches only counted.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    pub(crate) lines: Arc<Mutex<Vec<String>>>,
    batches: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl Recorder {
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The lines of one kind of event (`failover`, `reconnect`, ...).
    pub(crate) fn lines_of(&self, event: &str) -> Vec<String> {
        let mut lines = self.lines();
        lines.retain(|l| l.starts_with(event));
        lines
    }

    fn push(&self, line: String) {
        self.lines.lock().unwrap().push(line);
    }
}

impl HandleEvent for Recorder {
    fn handle_acquire(&self, e: AcquireEvent<'_>) {
        let how = if e.had_to_wait() { "waited" } else { "at once" };
        self.push(format!("acquire {} {} {how}", e.kind(), e.name()));
    }

    fn handle_release(&self, e: ReleaseEvent<'_>) {
        let ok = if e.ok() { "ok" } else { "failed" };
        self.push(format!("release {} {} {ok}", e.kind(), e.name()));
    }

    fn handle_lost(&self, e: LostEvent<'_>) {
        self.push(format!("lost {} {}", e.kind(), e.name()));
    }

    fn handle_renewal_batch(&self, e: RenewalBatchEvent) {
        self.batches.lock().unwrap().push((e.locks(), e.lost()));
    }

    fn handle_failover(&self, e: FailoverEvent<'_>) {
        self.push(format!("failover to {}", e.to()));
    }

    fn handle_subscriber_reconnect(&self, e: ReconnectEvent<'_>) {
        self.push(format!("reconnect {}", e.node()));
    }
}

fn client(srv: &RedisServer, events: &Recorder) -> Client {
    Client::builder(srv.url())
        .watchdog_timeout(Duration::from_millis(600))
        .event_handler(events.clone())
        .build()
        .expect("client")
}

/// Each guard's acquisition and release, in order; a waiter's acquisition
/// says it waited, and its wait and hold are measured.
#[test]
fn a_wait_and_a_hand_off_in_order() {
    let srv = RedisServer::start();
    let (ea, eb) = (Recorder::default(), Recorder::default());
    let (a, b) = (client(&srv, &ea), client(&srv, &eb));
    let g = a.lock("ev").lock().expect("lock");
    let again = a.lock("ev").lock().expect("re-entry");
    let waited = Arc::new(Mutex::new(None));
    let waiter = {
        let waited = Arc::clone(&waited);
        let lock = b.lock("ev");
        thread::spawn(move || {
            let g = lock.try_lock_for(WAIT).expect("wait").expect("hand-off");
            drop(g);
            *waited.lock().unwrap() = Some(());
        })
    };
    wait_until("the waiter to subscribe", WAIT, || {
        b.stats().subscribed_channels == 2
    });
    drop(again);
    drop(g);
    waiter.join().expect("waiter");
    assert_eq!(
        ea.lines(),
        [
            "acquire lock ev at once",
            "acquire lock ev at once",
            "release lock ev ok",
            "release lock ev ok",
        ]
    );
    assert_eq!(eb.lines(), ["acquire lock ev waited", "release lock ev ok"]);
    // Kinds beyond the plain lock, and permits.
    let sem = b.semaphore("ev:sem");
    sem.try_set_permits(1).expect("set");
    drop(sem.acquire(1).expect("permit"));
    drop(b.read_write_lock("ev:rw").read_lock().lock().expect("read"));
    drop(b.fair_lock("ev:fair").lock().expect("fair"));
    let ex = b.permit_expirable_semaphore("ev:ex");
    ex.try_set_permits(1).expect("set");
    ex.acquire(Duration::from_secs(5))
        .expect("permit")
        .release()
        .expect("release");
    assert_eq!(
        eb.lines()[2..],
        [
            "acquire semaphore ev:sem at once",
            "release semaphore ev:sem ok",
            "acquire read-lock ev:rw at once",
            "release read-lock ev:rw ok",
            "acquire fair-lock ev:fair at once",
            "release fair-lock ev:fair ok",
            "acquire expirable-semaphore ev:ex at once",
            "release expirable-semaphore ev:ex ok",
        ]
    );
}

/// A watched lock deleted under its holder: renewal batches, then the
/// lost event once, then a release that fails.
#[test]
fn a_lost_lease_and_renewal_batches() {
    let srv = RedisServer::start();
    let events = Recorder::default();
    let c = client(&srv, &events);
    let g = c.lock("ev:lost").lock().expect("lock");
    let _other = c.lock("ev:kept").lock().expect("lock");
    wait_until("a renewal batch", WAIT, || {
        !events.batches.lock().unwrap().is_empty()
    });
    srv.cmd(&["DEL", "ev:lost"]);
    wait_until("the loss", WAIT, || g.is_lost());
    drop(g);
    assert_eq!(
        events.lines(),
        [
            "acquire lock ev:lost at once",
            "acquire lock ev:kept at once",
            "lost lock ev:lost",
            "release lock ev:lost failed",
        ]
    );
    let batches = events.batches.lock().unwrap().clone();
    assert!(
        batches.iter().all(|&(n, _)| (1..=2).contains(&n)),
        "{batches:?}"
    );
    assert_eq!(batches.iter().map(|&(_, lost)| lost).sum::<usize>(), 1);
}

/// The subscriber's connection killed under a waiter: one reconnect
/// event, naming the server.
#[test]
fn a_subscriber_reconnect() {
    let srv = RedisServer::start();
    let events = Recorder::default();
    let c = client(&srv, &events);
    let holder = Client::open(srv.url()).expect("client");
    let g = holder.lock("ev:sub").lock().expect("lock");
    let lock = c.lock("ev:sub");
    let waiter = thread::spawn(move || lock.try_lock_for(WAIT).expect("wait").is_some());
    wait_until("the waiter to subscribe", WAIT, || {
        srv.subscribers("redisson_lock__channel:{ev:sub}") == 1
    });
    assert_eq!(srv.client_kill_type("pubsub"), 1);
    wait_until("the reconnect event", WAIT, || {
        !events.lines_of("reconnect").is_empty()
    });
    drop(g);
    assert!(waiter.join().expect("waiter"));
    assert_eq!(
        events.lines_of("reconnect"),
        [format!("reconnect redis at 127.0.0.1:{}", srv.port())]
    );
}

/// A handler that panics costs nothing but a log line.
#[test]
fn a_panicking_handler_is_contained() {
    struct Panics;
    impl HandleEvent for Panics {
        fn handle_acquire(&self, _: AcquireEvent<'_>) {
            panic!("a handler bug");
        }
    }
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .event_handler(Panics)
        .build()
        .expect("client");
    let g = c
        .lock("ev:panic")
        .lock()
        .expect("acquired despite the handler");
    assert!(g.ensure_held().is_ok());
    g.unlock().expect("released");
}

/// A MultiLock tells each member's acquisition and release, and nothing of
/// the members a failed round gave back.
#[test]
fn a_multilock_tells_as_many_acquisitions_as_releases() {
    let srv = RedisServer::start();
    let ev = Recorder::default();
    let c = Client::builder(srv.url())
        .event_handler(ev.clone())
        .build()
        .expect("client");
    let multi = MultiLock::new(vec![c.lock("rv:a"), c.lock("rv:b")]).expect("multi");
    drop(multi.lock().expect("lock"));
    // A failed try: b is busy (another client), a is taken and given back.
    let other = Client::open(srv.url().as_str()).expect("client");
    let _b = other.lock("rv:b").lock().expect("b");
    assert!(multi.try_lock().expect("try").is_none());
    let lines = ev.lines();
    println!("{lines:#?}");
    let acquires = lines.iter().filter(|l| l.starts_with("acquire")).count();
    let releases = lines.iter().filter(|l| l.starts_with("release")).count();
    assert_eq!(acquires, releases, "{lines:#?}");
}

/// A handler that panics, called from a guard dropped while its thread
/// unwinds from a panic: the process must not abort, and the lock is
/// released.
#[test]
fn a_panicking_handler_in_a_drop_during_unwinding() {
    struct Bad;
    impl redlease::HandleEvent for Bad {
        fn handle_release(&self, _: redlease::ReleaseEvent<'_>) {
            panic!("handler panics on release");
        }
    }
    let srv = RedisServer::start();
    let c = Client::builder(srv.url())
        .event_handler(Bad)
        .build()
        .expect("client");
    let lock = c.lock("rv:unwind");
    let l2 = lock.clone();
    let r = std::thread::spawn(move || {
        let _g = l2.lock().expect("lock");
        panic!("the holder panics");
    })
    .join();
    assert!(r.is_err());
    assert!(!lock.is_locked().expect("is_locked"), "released on unwind");
}
