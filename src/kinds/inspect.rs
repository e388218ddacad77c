//! Who holds a lock or a semaphore, and who waits in a fair lock's line, as
//! Redis records it; which process a redlease holder is (its client's
//! process key, see `engine::process`); and what kind of object a name is,
//! for `Client::inspect` and `Client::list`. Read only: nothing here
//! changes what is held.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::engine::process::field;
use crate::engine::shared::Shared;
use crate::error::Result;
use crate::net::router::Router;
use crate::scripts;

/// One holder of a lock, or of permits of a semaphore, as Redis records it.
///
/// A holder written by another Redisson-compatible client is listed with
/// what the layout tells (owner field, count, lease) and no process.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1/")?;
/// for h in client.lock("orders:42").holders()? {
///     match &h.process {
///         Some(p) => println!("{} (pid {} on {}, {:?})", h.owner, p.pid, p.host, p.name),
///         None => println!("{} (not a redlease client, or gone)", h.owner),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder as Redis names it: a lock's owner field
    /// (`<client-id>:<thread-id>`, with `:write` for a read-write lock's
    /// writer), a semaphore's record (`<client-id>:<acquisition>`), or an
    /// expirable permit's id (32 hex digits).
    pub owner: String,
    /// The id of the client that holds it ([`Client::id`](crate::Client::id)):
    /// from the owner field, or for a permit from its client's process key
    /// (`None` when neither tells).
    pub client_id: Option<String>,
    /// The owner within the client: its thread, or an owned guard's id
    /// (locks); the acquisition (a semaphore's permits); `None` for a permit.
    pub owner_id: Option<u64>,
    /// How it holds.
    pub mode: HoldMode,
    /// Its hold count (locks) or its permits (semaphores).
    pub count: u64,
    /// How long until Redis lets it go if it is not renewed: the lock's
    /// lease (a reader's own, for a read-write lock in read mode) or the
    /// permit's; `None` when there is none (a semaphore's permits, a permit
    /// taken without a lease, a key without expiry).
    pub remaining_lease: Option<Duration>,
    /// The holder's process, when its client is a redlease client that has
    /// published it (see [`ProcessInfo`]).
    pub process: Option<ProcessInfo>,
}

/// How a [`Holder`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldMode {
    /// A lock held alone (reentrant, fenced, fair).
    Exclusive,
    /// A read hold of a read-write lock.
    Read,
    /// A write hold of a read-write lock.
    Write,
    /// Permits of a semaphore.
    Permits,
}

/// What a redlease client publishes about its process, under the key
/// `redlease_client:{<first 16 hex digits of its id>}`, renewed by its
/// watchdog while the client lives (from its first acquisition on) and
/// gone a watchdog lease after it stops.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessInfo {
    /// The client's id ([`Client::id`](crate::Client::id)).
    pub client_id: String,
    /// The host name of its machine.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The name the application gave it
    /// ([`ClientBuilder::name`](crate::ClientBuilder::name)).
    pub name: Option<String>,
    /// When the client was made.
    pub started: SystemTime,
    /// The redlease version it runs.
    pub version: String,
}

/// One waiter in a fair lock's line ([`FairLock::queue`](crate::FairLock::queue)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// Its owner field, `<client-id>:<thread-id>`.
    pub owner: String,
    /// The client id, from the owner field.
    pub client_id: Option<String>,
    /// The thread within the client.
    pub owner_id: Option<u64>,
    /// How long its place in line is kept unless it renews it (a redlease
    /// waiter renews it while it waits; a Redisson waiter's place lasts its
    /// whole wait).
    pub place_kept_for: Duration,
    /// The waiter's process, when its client is a redlease client that has
    /// published it.
    pub process: Option<ProcessInfo>,
}

/// What kind of object a name is, as its keys tell
/// ([`Client::inspect`](crate::Client::inspect)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjectKind {
    /// A reentrant lock ([`Lock`](crate::Lock), Redisson's `RLock`).
    Lock,
    /// A fenced lock (a lock with a token key).
    FencedLock,
    /// A fair lock with waiters in line (with nobody in line its keys are
    /// a plain lock's, and it shows as [`Lock`](ObjectKind::Lock)).
    FairLock,
    /// A read-write lock.
    ReadWriteLock,
    /// A semaphore with redlease's permit records.
    Semaphore,
    /// A permit-expirable semaphore.
    ExpirableSemaphore,
    /// A string holding a whole number and nothing beside it: a semaphore
    /// without holders recorded, or a count-down latch (the layout cannot
    /// tell them apart), or any other counter.
    Counter,
    /// Another Redis type, or a hash that holds no lock (the type's name).
    Other(String),
    /// No key of that name.
    Missing,
}

impl ObjectKind {
    /// A short name: `lock`, `fenced-lock`, `fair-lock`, `read-write-lock`,
    /// `semaphore`, `expirable-semaphore`, `counter`, `missing`, or the
    /// Redis type.
    pub fn as_str(&self) -> &str {
        match self {
            ObjectKind::Lock => "lock",
            ObjectKind::FencedLock => "fenced-lock",
            ObjectKind::FairLock => "fair-lock",
            ObjectKind::ReadWriteLock => "read-write-lock",
            ObjectKind::Semaphore => "semaphore",
            ObjectKind::ExpirableSemaphore => "expirable-semaphore",
            ObjectKind::Counter => "counter",
            ObjectKind::Other(t) => t,
            ObjectKind::Missing => "missing",
        }
    }
}

/// What [`Client::inspect`](crate::Client::inspect) found under a name.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The name.
    pub name: String,
    /// What it is.
    pub kind: ObjectKind,
    /// Its holders (locks and semaphores).
    pub holders: Vec<Holder>,
    /// A fair lock's line, first first.
    pub queue: Vec<Waiter>,
    /// The key's remaining lease (`None`: no key, or no expiry).
    pub remaining_lease: Option<Duration>,
    /// A semaphore's permits available, a counter's value, a fenced lock's
    /// last token.
    pub value: Option<i64>,
    /// Processes subscribed to its channel: the processes waiting for it
    /// (on a Cluster with classic pub/sub, those connected to the node
    /// that serves the name).
    pub waiting_processes: u64,
}

/// Splits an owner field into its client id and its owner id (thread,
/// owned guard, acquisition); `:write` is taken off first.
fn split_owner(owner: &str) -> (Option<String>, Option<u64>) {
    let owner = owner.strip_suffix(":write").unwrap_or(owner);
    match owner.rsplit_once(':') {
        Some((client, id)) if !client.is_empty() => (Some(client.to_owned()), id.parse().ok()),
        _ => (None, None),
    }
}

/// The short id of a client id (its process key's id): the first 16 hex
/// digits of the UUID, `None` for an id that is not a UUID.
fn short_id(client_id: &str) -> Option<String> {
    let hex: String = client_id.chars().filter(|c| *c != '-').take(16).collect();
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// The process of each short id that has a process key: one round trip
/// on one server, one per id on a Cluster (the keys are in other slots).
fn processes(
    router: &Router,
    ids: impl IntoIterator<Item = String>,
) -> Result<HashMap<String, ProcessInfo>> {
    let mut ids: Vec<String> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let keys: Vec<String> = ids.iter().map(|id| scripts::process_key_name(id)).collect();
    // All in one pipeline on one server; each on its own node on a Cluster.
    let per_call = if router.is_cluster() {
        1
    } else {
        keys.len().max(1)
    };
    let mut records: Vec<HashMap<String, String>> = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(per_call) {
        let replies: Vec<HashMap<String, String>> = router.run(&chunk[0], |c| {
            let mut pipe = redis::pipe();
            for key in chunk {
                pipe.cmd("HGETALL").arg(key);
            }
            pipe.query(c)
        })?;
        records.extend(replies);
    }
    Ok(ids
        .into_iter()
        .zip(records)
        .filter_map(|(id, fields)| Some((id, process_info(&fields)?)))
        .collect())
}

fn process_info(fields: &HashMap<String, String>) -> Option<ProcessInfo> {
    let get = |f: &str| fields.get(f).cloned();
    Some(ProcessInfo {
        client_id: get(field::ID)?,
        host: get(field::HOST).unwrap_or_default(),
        pid: get(field::PID).and_then(|p| p.parse().ok()).unwrap_or(0),
        name: get(field::NAME),
        started: get(field::STARTED)
            .and_then(|s| s.parse().ok())
            .map_or(UNIX_EPOCH, |ms| UNIX_EPOCH + Duration::from_millis(ms)),
        version: get(field::VERSION).unwrap_or_default(),
    })
}

/// Fills in each holder's process from its client's process key.
fn with_processes(router: &Router, holders: &mut [Holder]) -> Result<()> {
    let ids = holders.iter().filter_map(|h| match &h.client_id {
        Some(c) => short_id(c),
        None if h.mode == HoldMode::Permits => h.owner.get(..16).map(str::to_owned),
        None => None,
    });
    // The processes are extra: holders are listed without them when their
    // keys cannot be read (an ACL without `redlease_client:*`, a Cluster
    // node that is down).
    let found = processes(router, ids.collect::<Vec<_>>()).unwrap_or_else(|e| {
        log::debug!("reading the holders' process keys failed: {e}");
        HashMap::new()
    });
    for h in holders {
        let id = match &h.client_id {
            Some(c) => short_id(c),
            None => h.owner.get(..16).map(str::to_owned),
        };
        if let Some(p) = id.and_then(|id| found.get(&id)) {
            if h.client_id.is_none() {
                h.client_id = Some(p.client_id.clone());
            }
            if h.client_id.as_deref() == Some(p.client_id.as_str()) {
                h.process = Some(p.clone());
            }
        }
    }
    Ok(())
}

/// A PTTL reply as a lease: `None` for no key (-2) or no expiry (-1).
fn lease(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// The holders of the lock hash `name` (reentrant, fenced, fair, or
/// read-write: the hash's `mode` field tells), with their processes.
pub(crate) fn lock_holders(shared: &Shared, name: &str) -> Result<Vec<Holder>> {
    let router = &shared.router;
    // Bytes: a hash that is not a lock (a Redisson map with a binary codec)
    // may hold fields that are not UTF-8; such fields are no holders.
    type Fields = Vec<(Vec<u8>, Vec<u8>)>;
    let (raw, pttl): (Fields, i64) = router.run(name, |c| {
        redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(name)
            .cmd("PTTL")
            .arg(name)
            .query(c)
    })?;
    // Owner fields and counts are text: a field or value that is not (an
    // application's binary data) names no holder.
    let fields: Vec<(String, String)> = raw
        .into_iter()
        .filter_map(|(f, v)| Some((String::from_utf8(f).ok()?, String::from_utf8(v).ok()?)))
        .collect();
    let mut holders = holders_of_hash(&fields, lease(pttl));
    let mode = fields.iter().find(|(f, _)| f == "mode").map(|(_, m)| m);
    if mode.is_some() {
        read_leases(router, name, &mut holders)?;
    }
    with_processes(router, &mut holders)?;
    Ok(holders)
}

/// The holders a lock hash's fields name: every field but `mode`, the
/// generations (`<owner>:gen`) and the queue's mark whose value is a count.
fn holders_of_hash(fields: &[(String, String)], lease: Option<Duration>) -> Vec<Holder> {
    let rw = fields.iter().any(|(f, _)| f == "mode");
    fields
        .iter()
        .filter(|(f, _)| f != "mode" && f != scripts::QUEUED_FIELD && !f.ends_with(":gen"))
        .filter_map(|(f, v)| {
            let count = v.parse().ok()?;
            let (client_id, owner_id) = split_owner(f);
            // An owner field is `<client>:<number>` (`:write` after it):
            // another field with a number is an application's counter.
            owner_id?;
            let mode = match (rw, f.ends_with(":write")) {
                (false, _) => HoldMode::Exclusive,
                (true, true) => HoldMode::Write,
                (true, false) => HoldMode::Read,
            };
            Some(Holder {
                owner: f.clone(),
                client_id,
                owner_id,
                mode,
                count,
                remaining_lease: lease,
                process: None,
            })
        })
        .collect()
}

/// Sets each reader's lease to the longest of its hold keys'
/// (`{<name>}:<owner>:rwlock_timeout:<k>`, Redisson's): a reader whose keys
/// are all gone (a crashed client) shows no lease.
fn read_leases(router: &Router, name: &str, holders: &mut [Holder]) -> Result<()> {
    // At most this many hold keys read per reader (a re-entry each).
    const MOST: u64 = 100;
    let readers: Vec<usize> = (0..holders.len())
        .filter(|&i| holders[i].mode == HoldMode::Read)
        .collect();
    if readers.is_empty() {
        return Ok(());
    }
    let mut keys = Vec::new();
    for &i in &readers {
        let prefix = scripts::LockRef {
            name,
            channel: "",
            field: &holders[i].owner,
            kind: scripts::Kind::Read,
        }
        .hold_prefix();
        keys.push(
            (1..=holders[i].count.clamp(1, MOST))
                .map(|k| format!("{prefix}:{k}"))
                .collect::<Vec<_>>(),
        );
    }
    let ttls: Vec<Vec<i64>> = router.run(name, |c| {
        let mut pipe = redis::pipe();
        for reader in &keys {
            for key in reader {
                pipe.cmd("PTTL").arg(key);
            }
        }
        let flat: Vec<i64> = pipe.query(c)?;
        let mut it = flat.into_iter();
        Ok(keys
            .iter()
            .map(|k| it.by_ref().take(k.len()).collect())
            .collect())
    })?;
    for (&i, ttls) in readers.iter().zip(ttls) {
        holders[i].remaining_lease = ttls.into_iter().filter_map(lease).max();
    }
    Ok(())
}

/// The holders of the permits of semaphore `name`: redlease's records
/// (`redlease_semaphore_permits:{<name>}`); permits taken by Redisson
/// clients are not recorded.
pub(crate) fn semaphore_holders(shared: &Shared, name: &str) -> Result<Vec<Holder>> {
    let records = scripts::semaphore_records_name(name);
    // Bytes: a record someone overwrote with text that is no count names
    // no holder (and fails nothing).
    let fields: Vec<(Vec<u8>, Vec<u8>)> = shared
        .router
        .run(name, |c| redis::cmd("HGETALL").arg(&records).query(c))?;
    let mut holders: Vec<Holder> = fields
        .into_iter()
        .filter_map(|(owner, count)| {
            let owner = String::from_utf8(owner).ok()?;
            let count = std::str::from_utf8(&count).ok()?.parse().ok()?;
            let (client_id, owner_id) = split_owner(&owner);
            Some(Holder {
                owner,
                client_id,
                owner_id,
                mode: HoldMode::Permits,
                count,
                remaining_lease: None,
                process: None,
            })
        })
        .collect();
    with_processes(&shared.router, &mut holders)?;
    Ok(holders)
}

/// Redis's `TIME`: seconds and microseconds.
type Time = (u64, u64);

/// A fair lock's line (owners), places (Redisson's scores), redlease's
/// deadlines, and the time.
type Line = (
    Vec<String>,
    HashMap<String, f64>,
    HashMap<String, u64>,
    Time,
);

/// Redisson's score of a permit taken without a lease.
const NO_EXPIRY: f64 = 922_337_203_685_477.0;

/// The permits out of permit-expirable semaphore `name`, one holder each
/// (expired ones not yet counted back are left out).
pub(crate) fn permit_holders(shared: &Shared, name: &str) -> Result<Vec<Holder>> {
    let out = scripts::permits_out_name(name);
    let (permits, (secs, micros)): (Vec<(Vec<u8>, f64)>, Time) = shared.router.run(name, |c| {
        redis::pipe()
            .atomic()
            .cmd("ZRANGE")
            .arg(&out)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("TIME")
            .query(c)
    })?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut holders: Vec<Holder> = permits
        .into_iter()
        .filter_map(|(id, score)| {
            let remaining_lease = if score >= NO_EXPIRY {
                None
            } else {
                // Whole ms: the score is an integer in a float. Out until
                // the millisecond it names has passed, as the scripts
                // count it (permit_lib.lua's reclaim).
                let until = score as u64;
                if until < now_ms {
                    return None;
                }
                Some(Duration::from_millis(until - now_ms))
            };
            Some(Holder {
                owner: scripts::hex(&id),
                client_id: None,
                owner_id: None,
                mode: HoldMode::Permits,
                count: 1,
                remaining_lease,
                process: None,
            })
        })
        .collect();
    with_processes(&shared.router, &mut holders)?;
    Ok(holders)
}

/// The line of fair lock `name`, first first, without the waiters whose
/// place has lapsed (the next acquisition drops them).
pub(crate) fn fair_queue(shared: &Shared, name: &str) -> Result<Vec<Waiter>> {
    let (line, places, alive, (secs, micros)): Line = shared.router.run(name, |c| {
        redis::pipe()
            .atomic()
            .cmd("LRANGE")
            .arg(scripts::fair_line_name(name))
            .arg(0)
            .arg(-1)
            .cmd("ZRANGE")
            .arg(scripts::fair_places_name(name))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("HGETALL")
            .arg(scripts::fair_deadlines_name(name))
            .cmd("TIME")
            .query(c)
    })?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut waiters: Vec<Waiter> = line
        .into_iter()
        .filter_map(|owner| {
            // A redlease waiter's own deadline, else Redisson's score.
            let until = alive
                .get(&owner)
                .copied()
                .or_else(|| places.get(&owner).map(|s| *s as u64))?;
            let place_kept_for = Duration::from_millis(until.checked_sub(now_ms)?);
            let (client_id, owner_id) = split_owner(&owner);
            Some(Waiter {
                owner,
                client_id,
                owner_id,
                place_kept_for,
                process: None,
            })
        })
        .collect();
    let ids = waiters
        .iter()
        .filter_map(|w| w.client_id.as_deref().and_then(short_id));
    let found = processes(&shared.router, ids.collect::<Vec<_>>()).unwrap_or_else(|e| {
        log::debug!("reading the waiters' process keys failed: {e}");
        HashMap::new()
    });
    for w in &mut waiters {
        let id = w.client_id.as_deref().and_then(short_id);
        w.process = id.and_then(|id| found.get(&id)).cloned();
    }
    Ok(waiters)
}

/// The most fields a hash read as a lock may have (holders, read holds).
const MAX_LOCK_FIELDS: u64 = 10_000;

/// What the keys of `name` tell of it: its kind, holders, line, lease,
/// value and waiting processes.
pub(crate) fn inspect(shared: &Shared, name: &str) -> Result<Inspection> {
    let router = &shared.router;
    let line = scripts::fair_line_name(name);
    let places = scripts::fair_places_name(name);
    let token = scripts::token_name(name);
    let records = scripts::semaphore_records_name(name);
    let out = scripts::permits_out_name(name);
    let (kind, pttl, fair, fenced, recorded, expirable): (String, i64, bool, bool, bool, bool) =
        router.run(name, |c| {
            redis::pipe()
                .atomic()
                .cmd("TYPE")
                .arg(name)
                .cmd("PTTL")
                .arg(name)
                .cmd("EXISTS")
                .arg(&line)
                .arg(&places)
                .cmd("EXISTS")
                .arg(&token)
                .cmd("EXISTS")
                .arg(&records)
                .cmd("EXISTS")
                .arg(&out)
                .query(c)
        })?;
    let mut found = Inspection {
        name: name.to_owned(),
        kind: ObjectKind::Missing,
        holders: Vec::new(),
        queue: Vec::new(),
        remaining_lease: lease(pttl),
        value: None,
        waiting_processes: 0,
    };
    // At most 21 bytes, as bytes: a whole number (an i64) is at most 20
    // characters, and the value may be large or binary (any cache entry).
    let counter = |c: &mut crate::net::transport::Connection| {
        redis::cmd("GETRANGE")
            .arg(name)
            .arg(0)
            .arg(20)
            .query::<Vec<u8>>(c)
            .map(|v| String::from_utf8(v).ok())
    };
    found.kind = match kind.as_str() {
        // A hash with this many fields is a map or a cache, not a lock
        // (whose fields are its holders): not read whole.
        "hash"
            if router.run(name, |c| redis::cmd("HLEN").arg(name).query::<u64>(c))?
                > MAX_LOCK_FIELDS =>
        {
            ObjectKind::Other(kind.clone())
        }
        "hash" => {
            found.holders = lock_holders(shared, name)?;
            let rw = found
                .holders
                .iter()
                .any(|h| matches!(h.mode, HoldMode::Read | HoldMode::Write));
            if rw {
                ObjectKind::ReadWriteLock
            } else if fair {
                ObjectKind::FairLock
            } else if fenced {
                ObjectKind::FencedLock
            } else if found.holders.is_empty() {
                ObjectKind::Other(kind.clone())
            } else {
                ObjectKind::Lock
            }
        }
        "string" => match router.run(name, counter)?.and_then(|v| v.parse().ok()) {
            Some(v) => {
                found.value = Some(v);
                if expirable {
                    found.holders = permit_holders(shared, name)?;
                    ObjectKind::ExpirableSemaphore
                } else if recorded {
                    found.holders = semaphore_holders(shared, name)?;
                    ObjectKind::Semaphore
                } else {
                    ObjectKind::Counter
                }
            }
            None => ObjectKind::Other(kind.clone()),
        },
        "none" if fair => ObjectKind::FairLock,
        "none" if fenced => ObjectKind::FencedLock,
        "none" if expirable => {
            found.holders = permit_holders(shared, name)?;
            ObjectKind::ExpirableSemaphore
        }
        "none" if recorded => {
            found.holders = semaphore_holders(shared, name)?;
            ObjectKind::Semaphore
        }
        "none" => ObjectKind::Missing,
        _ => ObjectKind::Other(kind.clone()),
    };
    if fenced {
        // Bytes: a token key someone overwrote with text is no token (and
        // no reason to fail the whole inspection).
        let t: Option<Vec<u8>> = router.run(name, |c| redis::cmd("GET").arg(&token).query(c))?;
        let t = t.and_then(|t| {
            let n = std::str::from_utf8(&t).ok()?.parse().ok();
            if n.is_none() {
                log::warn!("the fencing token key {token:?} holds no number; left out");
            }
            n
        });
        found.value = found.value.or(t);
    }
    if found.kind == ObjectKind::FairLock {
        found.queue = fair_queue(shared, name)?;
    }
    let channels = match found.kind {
        ObjectKind::Lock | ObjectKind::FencedLock | ObjectKind::FairLock => {
            vec![scripts::channel_name(name)]
        }
        ObjectKind::ReadWriteLock => vec![scripts::rw_channel_name(name)],
        ObjectKind::Semaphore | ObjectKind::ExpirableSemaphore => {
            vec![scripts::semaphore_channel_name(name)]
        }
        // A semaphore's waiters, or a latch's.
        ObjectKind::Counter => vec![
            scripts::semaphore_channel_name(name),
            scripts::latch_channel_name(name),
        ],
        _ => Vec::new(),
    };
    if !channels.is_empty() {
        found.waiting_processes = subscribers(router, name, &channels)?;
    }
    Ok(found)
}

/// The connections subscribed to `channels` (of `name`, in its slot):
/// `PUBSUB SHARDNUMSUB` where locks publish sharded, else `PUBSUB NUMSUB`.
fn subscribers(router: &Router, name: &str, channels: &[String]) -> Result<u64> {
    let sub = if router.publish_command() == "SPUBLISH" {
        "SHARDNUMSUB"
    } else {
        "NUMSUB"
    };
    let reply: Vec<(String, u64)> = router.run(name, |c| {
        redis::cmd("PUBSUB").arg(sub).arg(channels).query(c)
    })?;
    Ok(reply.iter().map(|(_, n)| n).sum())
}

/// Keys that are parts of another object (a fair lock's line, a token, a
/// read hold's key, redlease's records and request keys, a process key):
/// every key that starts with `redlease_` is taken for one of redlease's.
fn is_part(key: &str) -> bool {
    const PARTS: [&str; 5] = [
        "redisson_lock_queue:",
        "redisson_lock_timeout:",
        "redisson_lock_token:",
        "redisson_unlock_latch:",
        "redlease_",
    ];
    PARTS.iter().any(|p| key.starts_with(p)) || key.contains(":rwlock_timeout:")
}

/// The objects of the lock family whose name matches the glob `pattern`,
/// found with `SCAN` on every master (never `KEYS`), each inspected, in
/// name order. Counters are included (a latch or a semaphore cannot be told
/// from them); other keys are not.
pub(crate) fn list(shared: &Shared, pattern: &str) -> Result<Vec<Inspection>> {
    let router = &shared.router;
    let mut masters = router.masters();
    if masters.is_empty() {
        router.check()?;
        masters = router.masters();
    }
    let mut names = Vec::new();
    for node in masters {
        let mut cursor = 0u64;
        loop {
            // Keys as bytes: a key that is not UTF-8 is no lock's name
            // (names are `&str`), and must not fail the listing.
            let (next, keys): (u64, Vec<Vec<u8>>) = node.redis.run(|c| {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(c)
            })?;
            names.extend(
                keys.into_iter()
                    .filter_map(|k| String::from_utf8(k).ok())
                    .filter(|k| !is_part(k)),
            );
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    names.sort();
    names.dedup();
    let mut found = Vec::new();
    for name in names {
        if router.is_cluster() && !scripts::same_slot(&name) {
            continue;
        }
        let i = match inspect(shared, &name) {
            Ok(i) => i,
            // A name whose parts cannot be read as its kind's (a fair
            // lock's timeouts that are a string, a token that is not a
            // number): left out, so that one odd key does not hide the
            // rest; `inspect` on it says what is wrong.
            Err(e) if !(e.is_failover_symptom() || e.is_timeout() || e.is_auth()) => {
                log::warn!("listing {pattern:?}: {name:?} left out: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        if !matches!(i.kind, ObjectKind::Other(_) | ObjectKind::Missing) {
            found.push(i);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_fields_split_into_client_and_owner() {
        let c = "8d1f3b9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            split_owner(&format!("{c}:17")),
            (Some(c.to_owned()), Some(17))
        );
        assert_eq!(
            split_owner(&format!("{c}:17:write")),
            (Some(c.to_owned()), Some(17))
        );
        assert_eq!(split_owner("nothing"), (None, None));
        assert_eq!(short_id(c).as_deref(), Some("8d1f3b9e1c2d4e5f"));
        assert_eq!(short_id("not-a-uuid"), None);
    }

    #[test]
    fn a_hash_names_its_holders_but_not_its_generations_or_mode() {
        let f = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        let h = holders_of_hash(&[f("u:1", "2"), f("u:1:gen", "9")], None);
        assert_eq!(h.len(), 1);
        assert_eq!((h[0].count, h[0].mode), (2, HoldMode::Exclusive));
        let h = holders_of_hash(
            &[f("mode", "write"), f("u:1:write", "1"), f("u:1", "1")],
            None,
        );
        let modes: Vec<HoldMode> = h.iter().map(|h| h.mode).collect();
        assert_eq!(modes, [HoldMode::Write, HoldMode::Read]);
    }
}
