//! The Lua scripts (one `.lua` file each, next to this module), how they are
//! run (EVALSHA, falling back to EVAL on NOSCRIPT: still one round trip), and
//! the Redis key names of the Redisson layout.
//!
//! The scripts write constant arguments of `redis.call` as strings (`'1'`,
//! not `1`): Redis turns a Lua number into text on every call, some 1,500
//! instructions each (`bench_compare.sh … redis-instructions-lock`).

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind};

/// How long the key of a request whose reply was lost (an acquire's cancel
/// marker, a release's latch) lives once set: a copy of the request can still
/// reach Redis as long as the kernel retransmits the closed connection's data
/// (Linux gives up after about 15 minutes by default). Such keys exist only
/// for lost replies, so they stay few.
pub(crate) const LATE_REQUEST_WINDOW_MS: u64 = 15 * 60 * 1000;

/// The field of a reentrant lock's hash that says processes are queued for
/// it (queue_lib.lua's `QUEUED`).
pub(crate) const QUEUED_FIELD: &str = "redlease:waiting";

/// A Lua script and its SHA1.
pub(crate) struct Lua {
    source: &'static str,
    sha: LazyLock<String>,
}

macro_rules! lua {
    ($vis:vis $name:ident, $($file:literal),+) => {
        $vis static $name: Lua = Lua {
            source: concat!($(include_str!($file)),+),
            sha: LazyLock::new(|| {
                redis::Script::new(concat!($(include_str!($file)),+))
                    .get_hash()
                    .to_owned()
            }),
        };
    };
}

// The reentrant lock's queue of waiting processes: queue_lib.lua, and
// queue_wake.lua for the scripts that wake a queued process.
lua!(ACQUIRE, "scripts/queue_lib.lua", "scripts/acquire.lua");
// The release of the reentrant and the fair lock: one script, with the
// part that says whom it wakes prepended.
lua!(
    RELEASE,
    "scripts/queue_lib.lua",
    "scripts/queue_wake.lua",
    "scripts/release_plain.lua",
    "scripts/release.lua"
);
// The reentrant lock's usual release, without a latch.
lua!(
    RELEASE_FULL,
    "scripts/queue_lib.lua",
    "scripts/queue_wake.lua",
    "scripts/release_full.lua"
);
lua!(
    LEAVE,
    "scripts/queue_lib.lua",
    "scripts/queue_wake.lua",
    "scripts/leave.lua"
);
// The read-write lock's scripts share the functions of rw_lib.lua.
lua!(RW_ACQUIRE, "scripts/rw_lib.lua", "scripts/rw_acquire.lua");
lua!(RW_RELEASE, "scripts/rw_lib.lua", "scripts/rw_release.lua");
lua!(RW_CANCEL, "scripts/rw_lib.lua", "scripts/rw_cancel.lua");
// The fair lock's scripts share the functions of fair_lib.lua.
lua!(
    FAIR_ACQUIRE,
    "scripts/fair_lib.lua",
    "scripts/fair_acquire.lua"
);
lua!(
    FAIR_RELEASE,
    "scripts/fair_lib.lua",
    "scripts/fair_release.lua",
    "scripts/release.lua"
);
lua!(
    FAIR_CANCEL,
    "scripts/fair_lib.lua",
    "scripts/fair_cancel.lua"
);
lua!(FAIR_LEAVE, "scripts/fair_lib.lua", "scripts/fair_leave.lua");
lua!(
    FAIR_FORCE_UNLOCK,
    "scripts/fair_lib.lua",
    "scripts/fair_force_unlock.lua"
);
lua!(CANCEL_ACQUIRE, "scripts/cancel_acquire.lua");
lua!(FORCE_UNLOCK, "scripts/force_unlock.lua");
lua!(LATCH_SET, "scripts/latch_set.lua");
lua!(LATCH_COUNT_DOWN, "scripts/latch_count_down.lua");
lua!(LATCH_DELETE, "scripts/latch_delete.lua");
lua!(SEMAPHORE_ACQUIRE, "scripts/semaphore_acquire.lua");
lua!(SEMAPHORE_RELEASE, "scripts/semaphore_release.lua");
lua!(SEMAPHORE_ADD, "scripts/semaphore_add.lua");
lua!(SEMAPHORE_SET, "scripts/semaphore_set.lua");
lua!(SEMAPHORE_DRAIN, "scripts/semaphore_drain.lua");
// The permit-expirable semaphore's scripts share permit_lib.lua.
lua!(
    PERMIT_ACQUIRE,
    "scripts/permit_lib.lua",
    "scripts/permit_acquire.lua"
);
lua!(
    PERMIT_RELEASE,
    "scripts/permit_lib.lua",
    "scripts/permit_release.lua"
);
lua!(
    PERMIT_LEASE,
    "scripts/permit_lib.lua",
    "scripts/permit_lease.lua"
);
// The watchdog pipelines this one itself (see `engine::watchdog`, `renew_all`).
lua!(pub(crate) RENEW, "scripts/renew.lua");

impl Lua {
    /// The script's SHA1, as EVALSHA takes it.
    pub(crate) fn sha(&self) -> &str {
        self.sha.as_str()
    }

    /// The EVALSHA command; `fill` appends the keys, then the arguments;
    /// `size` is the expected number of bytes they take (to size the buffer
    /// once instead of growing it).
    pub(crate) fn evalsha(&self, num_keys: usize, size: usize, fill: impl Fn(&mut Cmd)) -> Cmd {
        command("EVALSHA", self.sha.as_str(), num_keys, size, fill)
    }

    /// The EVAL command carrying the source (loads the script as it runs).
    pub(crate) fn eval(&self, num_keys: usize, size: usize, fill: impl Fn(&mut Cmd)) -> Cmd {
        command("EVAL", self.source, num_keys, size, fill)
    }

    /// Runs the script in one round trip (two only right after Redis lost its
    /// script cache, e.g. on a restart). The command is packed as it is
    /// filled (see [`Packed`]).
    fn run<T: FromRedisValue>(
        &self,
        conn: &mut crate::net::transport::Connection,
        num_keys: usize,
        fill: impl Fn(&mut Packed),
    ) -> RedisResult<T> {
        let run = |verb: &str, script: &str, conn: &mut crate::net::transport::Connection| {
            let mut cmd = Packed::with_capacity(PACKED_SIZE + script.len());
            cmd.arg(verb).arg(script).arg(num_keys);
            fill(&mut cmd);
            let reply =
                redis::ConnectionLike::req_packed_command(conn, cmd.finish())?.extract_error()?;
            Ok(redis::from_redis_value(reply)?)
        };
        match run("EVALSHA", self.sha.as_str(), conn) {
            Err(e) if is_noscript(&e) => run("EVAL", self.source, conn),
            other => other,
        }
    }
}

/// The bytes a script call's keys and arguments usually take: its buffer
/// is made once at this size (more only for long names).
const PACKED_SIZE: usize = 512;

fn command(verb: &str, script: &str, num_keys: usize, size: usize, fill: impl Fn(&mut Cmd)) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 * num_keys + 8, 64 + script.len() + size);
    cmd.arg(verb).arg(script).arg(num_keys);
    fill(&mut cmd);
    cmd
}

/// What a script call's keys and arguments are added to: a [`Packed`]
/// command sent on its own, or a [`Cmd`] for a pipeline.
pub(crate) trait Args {
    fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self;
}

impl Args for Cmd {
    fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        Cmd::arg(self, arg)
    }
}

impl Args for Packed {
    fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(self);
        self
    }
}

/// A command written in Redis's protocol as its arguments are added: one
/// buffer, no copy of it made to send it (a [`Cmd`] keeps its arguments
/// apart and is packed into a second buffer on every call, which cost the
/// client about a sixth of its work per acquire + release).
pub(crate) struct Packed {
    /// [`PACKED_HEAD`] bytes kept free for the header, then the arguments.
    buf: Vec<u8>,
    args: usize,
}

/// Room for the header (`*<count>\r\n`) in front of a [`Packed`]'s arguments.
const PACKED_HEAD: usize = 24;

impl Packed {
    pub(crate) fn with_capacity(size: usize) -> Packed {
        let mut buf = Vec::with_capacity(PACKED_HEAD + size);
        buf.resize(PACKED_HEAD, 0);
        Packed { buf, args: 0 }
    }

    /// The command: its header written in front of its arguments.
    pub(crate) fn finish(&mut self) -> &[u8] {
        let mut count = itoa::Buffer::new();
        let count = count.format(self.args).as_bytes();
        let start = PACKED_HEAD - count.len() - 3;
        let head = &mut self.buf[start..PACKED_HEAD];
        head[0] = b'*';
        head[1..=count.len()].copy_from_slice(count);
        head[count.len() + 1..].copy_from_slice(b"\r\n");
        &self.buf[start..]
    }
}

impl redis::RedisWrite for Packed {
    fn write_arg(&mut self, arg: &[u8]) {
        let mut len = itoa::Buffer::new();
        self.buf.push(b'$');
        self.buf.extend_from_slice(len.format(arg.len()).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        self.buf.extend_from_slice(arg);
        self.buf.extend_from_slice(b"\r\n");
        self.args += 1;
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        PackedArg {
            packed: self,
            arg: Vec::new(),
        }
    }
}

/// One argument of a [`Packed`] written in pieces: appended when dropped
/// (its length goes first).
struct PackedArg<'a> {
    packed: &'a mut Packed,
    arg: Vec<u8>,
}

impl std::io::Write for PackedArg<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.arg.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for PackedArg<'_> {
    fn drop(&mut self) {
        redis::RedisWrite::write_arg(self.packed, &self.arg);
    }
}

/// The names one owner's operation on one lock uses.
#[derive(Clone, Copy)]
pub(crate) struct LockRef<'a> {
    /// The lock's key.
    pub(crate) name: &'a str,
    /// Its release channel ([`channel_name`], [`rw_channel_name`]).
    pub(crate) channel: &'a str,
    /// The owner field, `<client-uuid>:<thread-id>` (`:write` appended for
    /// a write lock).
    pub(crate) field: &'a str,
    pub(crate) kind: Kind,
}

/// The layout and scripts of a lock's hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Redisson's `RLock`.
    Plain,
    /// Redisson's `RFencedLock`: `RLock` plus a token key.
    Fenced,
    /// A read hold of Redisson's `RReadWriteLock`.
    Read,
    /// A write hold of Redisson's `RReadWriteLock`.
    Write,
    /// Redisson's `RFairLock`: `RLock` plus a line of waiters.
    Fair,
}

impl Kind {
    /// Its name in events and metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Plain => "lock",
            Kind::Fenced => "fenced-lock",
            Kind::Read => "read-lock",
            Kind::Write => "write-lock",
            Kind::Fair => "fair-lock",
        }
    }

    /// A read or a write hold (the read-write lock's scripts).
    pub(crate) fn is_rw(self) -> bool {
        matches!(self, Kind::Read | Kind::Write)
    }
}

impl LockRef<'_> {
    /// A read hold's key prefix, `{<name>}:<owner>:rwlock_timeout`
    /// (Redisson's); empty for other kinds.
    pub(crate) fn hold_prefix(&self) -> String {
        if self.kind == Kind::Read {
            let mut s = suffix_name(self.name, self.field);
            s.push_str(":rwlock_timeout");
            s
        } else {
            String::new()
        }
    }
}

/// acquire.lua's request: `None` when acquired, else the script's code or
/// the holder's PTTL. `unsettled` are keys of the owner's requests whose
/// reply was lost, set first (see `unsettled::Unsettled`); `gen` is the
/// request's id, the hold's new generation.
pub(crate) struct Acquire<'a> {
    pub(crate) lock: LockRef<'a>,
    pub(crate) marker: &'a str,
    /// The fenced lock's token key (see [`token_name`]), `None` for a plain
    /// reentrant lock.
    pub(crate) token: Option<&'a str>,
    pub(crate) unsettled: Vec<&'a str>,
    pub(crate) lease_ms: u64,
    pub(crate) count: u32,
    pub(crate) gen: u64,
    /// A read hold's key prefix ([`LockRef::hold_prefix`]).
    pub(crate) prefix: &'a str,
    /// A reader's thread's writer field (a writer may also read).
    pub(crate) writer: &'a str,
    /// A fair lock's waiter: how long its place in line is kept (0: a
    /// single try, no place).
    pub(crate) place_ms: u64,
    /// A fair lock's waiter's first try: it queues at the end.
    pub(crate) requeue: bool,
    /// The publish command (a fair lock's try that finds the lock free but
    /// another waiter first in line tells that waiter).
    pub(crate) publish: &'static str,
    /// A reentrant lock's waiter that listens for its process's wake-up:
    /// its process joins the lock's queue if busy (see queue_lib.lua).
    pub(crate) queue: Option<Queued<'a>>,
}

/// A waiter's process in a reentrant lock's queue of waiting processes
/// (acquire.lua's `ARGV[7..9]`).
#[derive(Clone, Copy)]
pub(crate) struct Queued<'a> {
    /// The queue ([`queue_name`]).
    pub(crate) key: &'a str,
    /// The process's wake-up channel ([`wake_channel_name`]), its entry.
    pub(crate) channel: &'a str,
    /// Other waiters of the process still wait: once acquired, it stays in
    /// the queue (else it leaves).
    pub(crate) stay: bool,
    /// The longest the caller waits before it tries again, in ms.
    pub(crate) wait_ms: u64,
}

impl Acquire<'_> {
    /// The keys, then the arguments, of the kind's acquire script: the lock
    /// and the request's marker, the kind's own keys, the unsettled keys;
    /// the lease, owner, hold count and generation (the generation first
    /// for acquire.lua, which takes a missing count as 1), the kind's own
    /// arguments, and the unsettled keys' TTL when there are any.
    fn fill(&self, cmd: &mut impl Args) {
        let name = self.lock.name;
        cmd.arg(name).arg(self.marker);
        match self.lock.kind {
            Kind::Fair => {
                cmd.arg(fair_line_name(name))
                    .arg(fair_places_name(name))
                    .arg(fair_deadlines_name(name));
            }
            Kind::Plain | Kind::Fenced => {
                if let Some(token) = self.token {
                    cmd.arg(token);
                }
            }
            Kind::Read | Kind::Write => {}
        }
        for key in &self.unsettled {
            cmd.arg(*key);
        }
        if let Some(q) = &self.queue {
            cmd.arg(q.key);
        }
        cmd.arg(self.lease_ms).arg(self.lock.field);
        // acquire.lua takes the generation first and reads a missing count
        // as 1 (sent only when it is not, or when arguments follow it); the
        // other kinds' scripts take the count first.
        let follows = self.token.is_some() || !self.unsettled.is_empty() || self.queue.is_some();
        match self.lock.kind {
            Kind::Plain | Kind::Fenced => {
                cmd.arg(self.gen);
                if self.count != 1 || follows {
                    cmd.arg(self.count);
                }
            }
            Kind::Fair | Kind::Read | Kind::Write => {
                cmd.arg(self.count).arg(self.gen);
            }
        }
        match self.lock.kind {
            Kind::Fair => {
                cmd.arg(self.place_ms)
                    .arg(if self.requeue { "1" } else { "0" })
                    .arg(self.lock.channel)
                    .arg(self.publish);
            }
            Kind::Read | Kind::Write => {
                cmd.arg(self.prefix).arg(self.writer).arg(rw_base(name));
            }
            Kind::Plain | Kind::Fenced => {
                // acquire.lua reads a missing flag as '0': sent only when
                // set, or when arguments follow it (an argument costs Redis
                // more than the Lua that reads it).
                if self.token.is_some() {
                    cmd.arg("1");
                } else if follows {
                    cmd.arg("0");
                }
            }
        }
        if !self.unsettled.is_empty() || self.queue.is_some() {
            cmd.arg(LATE_REQUEST_WINDOW_MS);
        }
        if let Some(q) = &self.queue {
            cmd.arg(if q.stay { "q" } else { "l" })
                .arg(q.channel)
                .arg(q.wait_ms);
        }
    }

    fn keys(&self) -> usize {
        let extra = match self.lock.kind {
            Kind::Fair => 3,
            _ => usize::from(self.token.is_some()),
        };
        2 + extra + self.unsettled.len() + usize::from(self.queue.is_some())
    }

    fn script(&self) -> &'static Lua {
        match self.lock.kind {
            Kind::Read | Kind::Write => &RW_ACQUIRE,
            Kind::Fair => &FAIR_ACQUIRE,
            Kind::Plain | Kind::Fenced => &ACQUIRE,
        }
    }

    /// Runs it in one round trip.
    pub(crate) fn run(
        &self,
        conn: &mut crate::net::transport::Connection,
    ) -> RedisResult<AcquireReply> {
        AcquireReply::parse(self.script().run(conn, self.keys(), |cmd| self.fill(cmd))?)
    }

    /// Its EVALSHA command, for a round trip shared with other requests.
    pub(crate) fn command(&self) -> Cmd {
        self.script()
            .evalsha(self.keys(), 512, |cmd| self.fill(cmd))
    }
}

/// What acquire.lua answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AcquireReply {
    /// `None` when acquired; else the script's code or the holder's PTTL.
    pub(crate) busy: Option<i64>,
    /// A fenced lock's new token, when acquired.
    pub(crate) token: Option<u64>,
}

impl AcquireReply {
    /// Parses the script's reply.
    pub(crate) fn parse(v: redis::Value) -> RedisResult<AcquireReply> {
        match v {
            redis::Value::Nil => Ok(AcquireReply {
                busy: None,
                token: None,
            }),
            redis::Value::Int(n) => Ok(AcquireReply {
                busy: Some(n),
                token: None,
            }),
            redis::Value::Array(items) => match items.as_slice() {
                [redis::Value::Int(t)] => Ok(AcquireReply {
                    busy: None,
                    token: u64::try_from(*t).ok(),
                }),
                _ => Err((ErrorKind::Parse, "unexpected reply to the acquire script").into()),
            },
            _ => Err((ErrorKind::Parse, "unexpected reply to the acquire script").into()),
        }
    }
}

/// A count-down latch's script call: `(key, channel, args)`; 1 or 0, or the
/// count left.
pub(crate) fn latch(
    conn: &mut crate::net::transport::Connection,
    op: LatchOp,
    key: &str,
    channel: &str,
    publish: &str,
) -> RedisResult<i64> {
    let (script, count) = match op {
        LatchOp::Set(count) => (&LATCH_SET, Some(count)),
        LatchOp::CountDown => (&LATCH_COUNT_DOWN, None),
        LatchOp::Delete => (&LATCH_DELETE, None),
    };
    script.run(conn, 2, |cmd| {
        cmd.arg(key).arg(channel);
        if let Some(c) = count {
            cmd.arg(c);
        }
        cmd.arg(publish);
    })
}

/// What a count-down latch script does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LatchOp {
    Set(u64),
    CountDown,
    Delete,
}

/// The channel of count-down latch `name`: Redisson's literal
/// `redisson_countdownlatch__channel__{<name>}`.
pub(crate) fn latch_channel_name(name: &str) -> String {
    format!("redisson_countdownlatch__channel__{{{name}}}")
}

/// The token key of fenced lock `name` (Redisson's RFencedLock).
pub(crate) fn token_name(name: &str) -> String {
    prefix_name("redisson_lock_token", name, 0)
}

/// release.lua's request: `None` when the owner's field is gone, `Some(0)`
/// when holds remain, `Some(1)` when the lock was deleted. `unsettled` as
/// for [`Acquire`]; `left` holds remain after it, with `lease_ms` re-applied;
/// the latch lives `latch_ms`; `publish` is the publish command.
/// `unlatched`: a full release of a reentrant lock, handing nothing over,
/// with no unsettled keys, of the hold with this generation: sent without a
/// latch (release_full.lua; the other fields but `lock` and `publish` go
/// unused).
pub(crate) struct Release<'a> {
    pub(crate) lock: LockRef<'a>,
    pub(crate) latch: &'a str,
    pub(crate) unsettled: Vec<&'a str>,
    pub(crate) left: u32,
    pub(crate) lease_ms: u64,
    pub(crate) latch_ms: u64,
    pub(crate) gen: u64,
    pub(crate) unlatched: Option<u64>,
    pub(crate) publish: &'a str,
    /// A read hold's key prefix ([`LockRef::hold_prefix`]).
    pub(crate) prefix: &'a str,
    /// A full release of a reentrant lock: the waiting thread of this
    /// client it may hand the lock to (release_plain.lua).
    pub(crate) grant: Option<Grant<'a>>,
}

/// An acquisition a release may carry out for a waiting thread of the same
/// client (see release_plain.lua).
#[derive(Clone, Copy)]
pub(crate) struct Grant<'a> {
    /// The waiter's owner field.
    pub(crate) field: &'a str,
    /// Its acquisition's cancel marker.
    pub(crate) marker: &'a str,
    pub(crate) gen: u64,
    pub(crate) lease_ms: u64,
    /// The waiter's process's queue entry, to remove when it was the
    /// process's last waiter.
    pub(crate) leave: Option<&'a str>,
    /// A fenced lock's token key ([`token_name`]): the waiter's
    /// acquisition takes the next token, which the release returns.
    pub(crate) token_key: Option<&'a str>,
}

impl Release<'_> {
    fn fill(&self, cmd: &mut impl Args) {
        cmd.arg(self.lock.name)
            .arg(self.lock.channel)
            .arg(self.latch);
        match self.lock.kind {
            Kind::Fair => {
                cmd.arg(fair_line_name(self.lock.name))
                    .arg(fair_places_name(self.lock.name))
                    .arg(fair_deadlines_name(self.lock.name));
            }
            Kind::Plain | Kind::Fenced => {
                cmd.arg(queue_name(self.lock.name));
            }
            Kind::Read | Kind::Write => {}
        }
        for key in &self.unsettled {
            cmd.arg(*key);
        }
        if let Some(g) = &self.grant {
            if let Some(key) = g.token_key {
                cmd.arg(key);
            }
            cmd.arg(g.marker);
        }
        cmd.arg(self.lock.field)
            .arg(self.left)
            .arg(self.lease_ms)
            .arg(self.latch_ms);
        // release.lua writes the generation only while holds remain: a full
        // release sends none (a new string costs Redis's Lua an allocation
        // and its collection); rw_release.lua uses it either way.
        if self.left == 0 && !self.lock.kind.is_rw() {
            cmd.arg("");
        } else {
            cmd.arg(self.gen);
        }
        cmd.arg(self.publish);
        if self.lock.kind.is_rw() {
            cmd.arg(self.prefix).arg(rw_base(self.lock.name));
        }
        if !self.unsettled.is_empty() || self.grant.is_some() {
            cmd.arg(LATE_REQUEST_WINDOW_MS);
        }
        if let Some(g) = &self.grant {
            cmd.arg(g.field)
                .arg(g.gen)
                .arg(g.lease_ms)
                .arg(g.leave.unwrap_or(""));
            if g.token_key.is_some() {
                cmd.arg("f");
            }
        }
    }

    /// release_full.lua's keys and arguments (see `unlatched`).
    fn fill_full(&self, cmd: &mut impl Args, gen: u64) {
        cmd.arg(self.lock.name)
            .arg(self.lock.channel)
            .arg(queue_name(self.lock.name))
            .arg(self.lock.field)
            .arg(gen);
        // release_full.lua reads a missing one as 'publish'.
        if self.publish != "publish" {
            cmd.arg(self.publish);
        }
    }

    fn fill_any(&self, cmd: &mut impl Args) {
        match self.unlatched {
            Some(gen) => self.fill_full(cmd, gen),
            None => self.fill(cmd),
        }
    }

    fn keys(&self) -> usize {
        if self.unlatched.is_some() {
            return 3;
        }
        let extra = match self.lock.kind {
            Kind::Fair => 3,
            Kind::Plain | Kind::Fenced => 1,
            Kind::Read | Kind::Write => 0,
        };
        let grant = self
            .grant
            .map_or(0, |g| 1 + usize::from(g.token_key.is_some()));
        3 + extra + self.unsettled.len() + grant
    }

    fn script(&self) -> &'static Lua {
        if self.unlatched.is_some() {
            return &RELEASE_FULL;
        }
        match self.lock.kind {
            Kind::Read | Kind::Write => &RW_RELEASE,
            Kind::Fair => &FAIR_RELEASE,
            Kind::Plain | Kind::Fenced => &RELEASE,
        }
    }

    /// Runs it in one round trip.
    pub(crate) fn run(
        &self,
        conn: &mut crate::net::transport::Connection,
    ) -> RedisResult<ReleaseReply> {
        ReleaseReply::parse(
            self.script()
                .run(conn, self.keys(), |cmd| self.fill_any(cmd))?,
        )
    }

    /// Its EVALSHA command, for a round trip shared with other requests.
    pub(crate) fn command(&self) -> Cmd {
        self.script()
            .evalsha(self.keys(), 512, |cmd| self.fill_any(cmd))
    }
}

/// What release.lua answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReleaseReply {
    /// `None` when the owner's field was gone; else 0 (holds remain), 1
    /// (released) or 2 (handed over).
    pub(crate) code: Option<i64>,
    /// A fenced lock handed over: the waiter's token.
    pub(crate) token: Option<u64>,
}

impl ReleaseReply {
    /// Parses the script's reply.
    pub(crate) fn parse(v: redis::Value) -> RedisResult<ReleaseReply> {
        let bad = || {
            redis::RedisError::from((ErrorKind::Parse, "unexpected reply to the release script"))
        };
        match v {
            redis::Value::Nil => Ok(ReleaseReply {
                code: None,
                token: None,
            }),
            redis::Value::Int(n) => Ok(ReleaseReply {
                code: Some(n),
                token: None,
            }),
            redis::Value::Array(items) => match items.as_slice() {
                // Handed over: a token that is no u64 (release.lua never
                // answers one) counts as none, which the waiter undoes.
                [redis::Value::Int(2), redis::Value::Int(t)] => Ok(ReleaseReply {
                    code: Some(2),
                    token: u64::try_from(*t).ok(),
                }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// cancel_acquire.lua: 1 if an acquisition was undone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cancel_acquire(
    conn: &mut crate::net::transport::Connection,
    lock: LockRef<'_>,
    marker: &str,
    held: u32,
    lease_ms: u64,
    gen: u64,
    publish: &str,
) -> RedisResult<i64> {
    let (script, keys) = match lock.kind {
        Kind::Read | Kind::Write => (&RW_CANCEL, 3),
        Kind::Fair => (&FAIR_CANCEL, 6),
        Kind::Plain | Kind::Fenced => (&CANCEL_ACQUIRE, 3),
    };
    script.run(conn, keys, |cmd| {
        cmd.arg(lock.name).arg(lock.channel).arg(marker);
        if lock.kind == Kind::Fair {
            cmd.arg(fair_line_name(lock.name))
                .arg(fair_places_name(lock.name))
                .arg(fair_deadlines_name(lock.name));
        }
        cmd.arg(lock.field)
            .arg(held)
            .arg(lease_ms)
            .arg(LATE_REQUEST_WINDOW_MS)
            .arg(gen)
            .arg(publish);
        if lock.kind.is_rw() {
            cmd.arg(lock.hold_prefix()).arg(rw_base(lock.name));
        }
    })
}

/// leave.lua: the last waiter of its process gives up; the process leaves
/// the queue of lock `name` (`channel` its release channel), and a wake-up
/// a release already gave it goes on if the lock is free: 1 if passed on.
pub(crate) fn leave(
    conn: &mut crate::net::transport::Connection,
    name: &str,
    channel: &str,
    queue: &str,
    wake_channel: &str,
    publish: &str,
) -> RedisResult<i64> {
    LEAVE.run(conn, 3, |cmd| {
        cmd.arg(name)
            .arg(channel)
            .arg(queue)
            .arg(wake_channel)
            .arg(publish);
    })
}

/// The names of one semaphore, either kind (Redisson's `RSemaphore` or
/// `RPermitExpirableSemaphore`): its key, its channel and its bookkeeping key
/// (redlease's permit records for the first kind, Redisson's set of permits
/// out for the second).
#[derive(Clone, Copy)]
pub(crate) struct SemaphoreRef<'a> {
    pub(crate) name: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) book: &'a str,
}

/// semaphore_acquire.lua: -1 acquired, -3 cancelled, else the permits
/// available.
pub(crate) fn semaphore_acquire(
    conn: &mut crate::net::transport::Connection,
    sem: SemaphoreRef<'_>,
    marker: &str,
    permits: u64,
    field: &str,
) -> RedisResult<i64> {
    SEMAPHORE_ACQUIRE.run(conn, 3, |cmd| {
        cmd.arg(sem.name)
            .arg(sem.book)
            .arg(marker)
            .arg(permits)
            .arg(field);
    })
}

/// Returns what one acquisition of semaphore `sem` holds, once whatever the
/// number of copies (`latch`, living `latch_ms`, answers the copies after
/// the first); `undo` (an acquisition whose reply was lost) sets its cancel
/// marker first. `held` is the permit record's field (semaphore_release.lua:
/// 1 returned, also by an earlier copy; 0 no record) or the permit's id
/// (permit_release.lua: 1 released, 2 released after its lease ran out, 0
/// not out).
#[allow(clippy::too_many_arguments)]
pub(crate) fn return_permits(
    conn: &mut crate::net::transport::Connection,
    sem: SemaphoreRef<'_>,
    held: Held<'_>,
    latch: &str,
    undo: Option<&str>,
    latch_ms: u64,
    publish: &str,
) -> RedisResult<i64> {
    let script = match held {
        Held::Record(_) => &SEMAPHORE_RELEASE,
        Held::Permit(_) => &PERMIT_RELEASE,
    };
    script.run(conn, 4 + usize::from(undo.is_some()), |cmd| {
        cmd.arg(sem.name).arg(sem.channel).arg(sem.book).arg(latch);
        if let Some(marker) = undo {
            cmd.arg(marker);
        }
        match held {
            Held::Record(field) => cmd.arg(field),
            Held::Permit(id) => cmd.arg(id),
        };
        cmd.arg(publish).arg(latch_ms);
        if undo.is_some() {
            cmd.arg(LATE_REQUEST_WINDOW_MS);
        }
    })
}

/// What one acquisition of a semaphore holds: the field of its record in
/// the semaphore's records, or an expirable semaphore's permit id (raw).
#[derive(Clone, Copy)]
pub(crate) enum Held<'a> {
    Record(&'a str),
    Permit(&'a [u8]),
}

/// What a semaphore's counting script does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PermitsOp {
    /// semaphore_add.lua: the new total.
    Add(i64),
    /// semaphore_set.lua: 1 if set.
    Set(u64),
    /// semaphore_drain.lua: the permits taken.
    Drain,
}

/// A semaphore's counting script (either kind).
pub(crate) fn permits(
    conn: &mut crate::net::transport::Connection,
    sem: SemaphoreRef<'_>,
    op: PermitsOp,
    publish: &str,
) -> RedisResult<i64> {
    match op {
        PermitsOp::Add(d) => SEMAPHORE_ADD.run(conn, 2, |cmd| {
            cmd.arg(sem.name).arg(sem.channel).arg(d).arg(publish);
        }),
        PermitsOp::Set(n) => SEMAPHORE_SET.run(conn, 2, |cmd| {
            cmd.arg(sem.name).arg(sem.channel).arg(n).arg(publish);
        }),
        PermitsOp::Drain => SEMAPHORE_DRAIN.run(conn, 1, |cmd| {
            cmd.arg(sem.name);
        }),
    }
}

/// permit_acquire.lua: -1 acquired, -3 cancelled, -2 nothing will expire,
/// else the ms until the first permit out expires.
pub(crate) fn permit_acquire(
    conn: &mut crate::net::transport::Connection,
    sem: SemaphoreRef<'_>,
    marker: &str,
    lease_ms: u64,
    id: &[u8],
    publish: &str,
) -> RedisResult<i64> {
    PERMIT_ACQUIRE.run(conn, 4, |cmd| {
        cmd.arg(sem.name)
            .arg(sem.book)
            .arg(sem.channel)
            .arg(marker)
            .arg(lease_ms)
            .arg(id)
            .arg(publish);
    })
}

/// One lease update of a permit (permit_lease.lua).
pub(crate) struct LeaseUpdate<'a> {
    /// The permit's 16-byte id.
    pub(crate) id: &'a [u8],
    pub(crate) lease_ms: u64,
    /// This update's key ([`permit_lease_key_name`]): a copy of it that
    /// finds the key set does nothing.
    pub(crate) key: &'a str,
    /// The keys of this permit's earlier updates whose reply was lost, set
    /// first so that copies of them still on their way can no longer apply.
    pub(crate) lost: &'a [String],
}

/// permit_lease.lua: counts expired permits back; then sets a permit's
/// lease (1, or 0 if it is not out or `update.key` is set), or returns the
/// permits available.
pub(crate) fn permit_lease(
    conn: &mut crate::net::transport::Connection,
    sem: SemaphoreRef<'_>,
    update: Option<LeaseUpdate<'_>>,
    publish: &str,
) -> RedisResult<i64> {
    let keys = update.as_ref().map_or(3, |u| 4 + u.lost.len());
    PERMIT_LEASE.run(conn, keys, |cmd| {
        cmd.arg(sem.name).arg(sem.book).arg(sem.channel);
        if let Some(u) = &update {
            cmd.arg(u.key);
            for key in u.lost {
                cmd.arg(key.as_str());
            }
        }
        cmd.arg(publish);
        if let Some(u) = &update {
            cmd.arg(u.id).arg(u.lease_ms);
            if !u.lost.is_empty() {
                cmd.arg(LATE_REQUEST_WINDOW_MS);
            }
        }
    })
}

/// `raw` in lowercase hex digits (a permit's id, a client's short id).
pub(crate) fn hex(raw: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 * raw.len());
    for b in raw {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The process key of the client whose short id (the first 8 bytes of its
/// UUID, in hex) is `short_id`: `redlease_client:{<short id>}` (redlease's
/// own; see `engine::process`).
pub(crate) fn process_key_name(short_id: &str) -> String {
    format!("redlease_client:{{{short_id}}}")
}

/// The channel of semaphore `name`, either kind (Redisson's
/// `redisson_sc:{<name>}`).
pub(crate) fn semaphore_channel_name(name: &str) -> String {
    prefix_name("redisson_sc", name, 0)
}

/// The hash where redlease records the permits each acquisition of
/// semaphore `name` holds (redlease's own; Redisson does not read it).
pub(crate) fn semaphore_records_name(name: &str) -> String {
    prefix_name("redlease_semaphore_permits", name, 0)
}

/// The cancel marker of one semaphore acquire request (redlease's own).
pub(crate) fn semaphore_cancel_name(name: &str, client: &str, n: u64) -> String {
    request_key("redlease_semaphore_cancel", name, client, n)
}

/// The latch of the release of the permits recorded under `field` of
/// semaphore `name` (redlease's own).
pub(crate) fn semaphore_latch_name(name: &str, field: &str) -> String {
    let mut s = prefix_name("redlease_semaphore_released", name, field.len() + 1);
    s.push(':');
    s.push_str(field);
    s
}

/// The latch of release request `n` of permit `id` (hex) of
/// permit-expirable semaphore `name` (redlease's own).
pub(crate) fn permit_latch_name(name: &str, id: &str, n: u64) -> String {
    request_key("redlease_permit_released", name, id, n)
}

/// The key of lease update request `n` of permit `id` (hex) of
/// permit-expirable semaphore `name` (redlease's own), set only once its
/// reply was lost.
pub(crate) fn permit_lease_key_name(name: &str, id: &str, n: u64) -> String {
    request_key("redlease_permit_lease", name, id, n)
}

/// The set of permits out of permit-expirable semaphore `name` (Redisson's
/// `suffixName(name, "timeout")`).
pub(crate) fn permits_out_name(name: &str) -> String {
    suffix_name(name, "timeout")
}

/// The cancel marker of the acquisition of permit `id` (hex) of
/// permit-expirable semaphore `name` (redlease's own).
pub(crate) fn permit_cancel_name(name: &str, id: &str) -> String {
    let mut s = prefix_name("redlease_permit_cancel", name, id.len() + 1);
    s.push(':');
    s.push_str(id);
    s
}

/// Deletes lock `name` of `kind` whoever holds it and wakes its waiters
/// (force_unlock.lua: one waiter per process, every waiter for a
/// read-write lock; fair_force_unlock.lua: the first in line): 1 if a lock
/// was deleted (the first run's answer, also when a retry of the same
/// request finds the latch).
#[allow(clippy::too_many_arguments)]
pub(crate) fn force_unlock(
    conn: &mut crate::net::transport::Connection,
    name: &str,
    channel: &str,
    kind: Kind,
    mode: &str,
    latch: &str,
    latch_ms: u64,
    publish: &str,
) -> RedisResult<i64> {
    if kind == Kind::Fair {
        return FAIR_FORCE_UNLOCK.run(conn, 6, |cmd| {
            cmd.arg(name)
                .arg(channel)
                .arg(latch)
                .arg(fair_line_name(name))
                .arg(fair_places_name(name))
                .arg(fair_deadlines_name(name))
                .arg(latch_ms)
                .arg(publish);
        });
    }
    FORCE_UNLOCK.run(conn, 3, |cmd| {
        cmd.arg(name)
            .arg(channel)
            .arg(latch)
            .arg(latch_ms)
            .arg(publish)
            .arg(u8::from(kind.is_rw()))
            .arg(mode);
    })
}

/// fair_leave.lua: the waiter `lock.field` leaves the line of fair lock
/// `lock.name` (the first waiter left is woken if the lock is free), once:
/// 1, or 0 if `marker` (living `marker_ms`) says it ran already.
pub(crate) fn fair_leave(
    conn: &mut crate::net::transport::Connection,
    lock: LockRef<'_>,
    marker: &str,
    marker_ms: u64,
    publish: &str,
) -> RedisResult<i64> {
    FAIR_LEAVE.run(conn, 6, |cmd| {
        cmd.arg(lock.name)
            .arg(lock.channel)
            .arg(fair_line_name(lock.name))
            .arg(fair_places_name(lock.name))
            .arg(fair_deadlines_name(lock.name))
            .arg(marker)
            .arg(lock.field)
            .arg(publish)
            .arg(marker_ms);
    })
}

/// The marker of one request of `field` to leave the line of fair lock
/// `name` (redlease's own).
pub(crate) fn fair_leave_name(name: &str, field: &str, n: u64) -> String {
    request_key("redlease_fair_leave", name, field, n)
}

/// An error reply that says a script did not run there and then (its cache
/// was lost, its slot moved or is moving, the node is failing over, loading
/// or busy): running it again, elsewhere or in a moment, may work.
pub(crate) fn not_run_there(code: &str) -> bool {
    matches!(
        code,
        "NOSCRIPT" | "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "BUSY"
    )
}

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Redisson's `prefixName`: `<prefix>:{<name>}`, or `<prefix>:<name>` when the
/// name already carries a hash tag. Keeps related keys in the lock's slot and
/// matches Redisson byte for byte. `extra` is room to reserve for a suffix.
fn prefix_name(prefix: &str, name: &str, extra: usize) -> String {
    let mut s = String::with_capacity(prefix.len() + name.len() + 3 + extra);
    s.push_str(prefix);
    if name.contains('{') {
        s.push(':');
        s.push_str(name);
    } else {
        s.push_str(":{");
        s.push_str(name);
        s.push('}');
    }
    s
}

/// `<prefix-name>:<owner field>:<n>`: a key for one request of one owner.
fn request_key(prefix: &str, name: &str, field: &str, n: u64) -> String {
    let mut s = prefix_name(prefix, name, field.len() + 22);
    s.push(':');
    s.push_str(field);
    s.push(':');
    s.push_str(itoa::Buffer::new().format(n));
    s
}

/// `true` when the keys and channel of lock `name` share its slot (on a
/// Redis Cluster): a name without `{`, whose names get the tag `{name}`, or
/// one with a complete, non-empty hash tag of its own.
pub(crate) fn same_slot(name: &str) -> bool {
    let channel = channel_name(name);
    crate::net::cluster::slot(name.as_bytes()) == crate::net::cluster::slot(channel.as_bytes())
        && crate::net::cluster::slot(unlock_latch_name(name, "x", 0).as_bytes())
            == crate::net::cluster::slot(name.as_bytes())
}

/// Redisson's `suffixName`: `{<name>}:<suffix>`, or `<name>:<suffix>` when
/// the name already carries a hash tag.
fn suffix_name(name: &str, suffix: &str) -> String {
    if name.contains('{') {
        format!("{name}:{suffix}")
    } else {
        format!("{{{name}}}:{suffix}")
    }
}

/// What the read-write lock's hold keys of `name` start with: `{<name>}`,
/// or `<name>` when it carries a hash tag (Redisson's key prefix).
fn rw_base(name: &str) -> String {
    if name.contains('{') {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    }
}

/// The line of waiters of fair lock `name` (Redisson's
/// `redisson_lock_queue:{<name>}`).
pub(crate) fn fair_line_name(name: &str) -> String {
    prefix_name("redisson_lock_queue", name, 0)
}

/// The places of the waiters of fair lock `name` (Redisson's
/// `redisson_lock_timeout:{<name>}`).
pub(crate) fn fair_places_name(name: &str) -> String {
    prefix_name("redisson_lock_timeout", name, 0)
}

/// redlease's deadlines of its waiters' places in the line of fair lock
/// `name` (`redlease_fair_alive:{<name>}`: owner -> epoch ms).
pub(crate) fn fair_deadlines_name(name: &str) -> String {
    prefix_name("redlease_fair_alive", name, 0)
}

/// The channel of read-write lock `name` (Redisson's, for both locks).
pub(crate) fn rw_channel_name(name: &str) -> String {
    prefix_name("redisson_rwlock", name, 0)
}

/// The channel a full release publishes on (Redisson's).
pub(crate) fn channel_name(name: &str) -> String {
    prefix_name("redisson_lock__channel", name, 0)
}

/// The queue of the processes waiting for reentrant lock `name`
/// (redlease's own, see queue_lib.lua): `redlease_waiting:{<tag>}:<name>`,
/// in the lock's slot, and its own for every name (`k` and `{k}`, which
/// share Redisson's channel, have a queue each).
pub(crate) fn queue_name(name: &str) -> String {
    tagged_name("redlease_waiting", name, 0)
}

/// The wake-up channel of client `client`'s waiters of reentrant lock
/// `name` (redlease's own): `redlease_wake:{<tag>}:<name>:<client>`, in the
/// lock's slot.
pub(crate) fn wake_channel_name(name: &str, client: &str) -> String {
    let mut s = tagged_name("redlease_wake", name, client.len() + 1);
    s.push(':');
    s.push_str(client);
    s
}

/// `<prefix>:{<tag>}:<name>`: a name of redlease's own in `name`'s slot
/// (`<tag>` is what Redis hashes of `name`: its hash tag, or all of it),
/// distinct for every name.
fn tagged_name(prefix: &str, name: &str, extra: usize) -> String {
    let tag = hash_tag(name);
    let mut s = String::with_capacity(prefix.len() + tag.len() + name.len() + 4 + extra);
    s.push_str(prefix);
    s.push_str(":{");
    s.push_str(tag);
    s.push_str("}:");
    s.push_str(name);
    s
}

/// What Redis Cluster hashes of `name` ([`hash_tag`](crate::net::cluster::hash_tag)).
fn hash_tag(name: &str) -> &str {
    // `{` and `}` are ASCII: the tag starts and ends on char boundaries.
    std::str::from_utf8(crate::net::cluster::hash_tag(name.as_bytes())).unwrap_or(name)
}

/// The latch key of one release request (Redisson's scheme, with
/// `<owner field>:<n>` as the request id).
pub(crate) fn unlock_latch_name(name: &str, field: &str, n: u64) -> String {
    request_key("redisson_unlock_latch", name, field, n)
}

/// The latch of one `force_unlock` request of a client (redlease's own).
pub(crate) fn force_unlock_latch_name(name: &str, client: &str, n: u64) -> String {
    request_key("redlease_force_unlock_latch", name, client, n)
}

/// The cancel marker of one acquire request (redlease's own).
pub(crate) fn acquire_cancel_name(name: &str, field: &str, n: u64) -> String {
    request_key("redlease_acquire_cancel", name, field, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_command_is_what_redis_rs_packs() {
        // Counts of one and two digits, empty and long arguments, numbers,
        // and an argument written in pieces.
        for n in [0usize, 1, 9, 10, 120] {
            let long = "x".repeat(n * 7);
            let mut packed = Packed::with_capacity(8);
            let mut cmd = redis::cmd("EVALSHA");
            packed.arg("EVALSHA");
            for i in 0..n {
                packed.arg(i as u64).arg("").arg(&long).arg(-3i64);
                cmd.arg(i as u64).arg("").arg(&long).arg(-3i64);
            }
            {
                use std::io::Write;
                let mut w = redis::RedisWrite::writer_for_next_arg(&mut packed);
                w.write_all(b"pie").unwrap();
                w.write_all(b"ces").unwrap();
            }
            cmd.arg("pieces");
            assert_eq!(
                packed.finish(),
                &cmd.get_packed_command()[..],
                "{n} arguments"
            );
        }
    }

    #[test]
    fn queue_names_are_in_the_lock_slot_and_one_per_name() {
        use crate::net::cluster::slot;
        for name in ["k", "{k}", "a{b}c", "orders:1", "x{}y", "é{ü}"] {
            let q = queue_name(name);
            let w = wake_channel_name(name, "6f1c2c1e-3b1a-4a51-9a4e-1f2e3d4c5b6a");
            if same_slot(name) {
                assert_eq!(slot(q.as_bytes()), slot(name.as_bytes()), "{q}");
                assert_eq!(slot(w.as_bytes()), slot(name.as_bytes()), "{w}");
            }
        }
        assert_eq!(queue_name("k"), "redlease_waiting:{k}:k");
        assert_eq!(queue_name("{k}"), "redlease_waiting:{k}:{k}");
        assert_ne!(wake_channel_name("k", "u"), wake_channel_name("{k}", "u"));
    }

    #[test]
    fn names_follow_redisson() {
        assert_eq!(
            channel_name("orders:42"),
            "redisson_lock__channel:{orders:42}"
        );
        assert_eq!(channel_name("a{b}c"), "redisson_lock__channel:a{b}c");
        assert_eq!(
            unlock_latch_name("x", "u:1", 7),
            "redisson_unlock_latch:{x}:u:1:7"
        );
    }

    #[test]
    fn scripts_have_distinct_hashes() {
        let shas = [
            &ACQUIRE,
            &RELEASE,
            &RELEASE_FULL,
            &CANCEL_ACQUIRE,
            &FORCE_UNLOCK,
            &RENEW,
        ]
        .map(|l| l.sha.as_str());
        for (i, a) in shas.iter().enumerate() {
            assert_eq!(a.len(), 40);
            for b in &shas[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
