//! A Redis Cluster of private `redis-server` processes (see [`Cluster`]).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::{free_port, lock, redis_cli_path, Proxy, RedisServer, Resp};

/// Command-line arguments every cluster node gets (on top of the ones
/// [`RedisServer`] always passes: `--save '' --appendonly no`, own dir, ...).
const NODE_ARGS: [&str; 8] = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
    "--repl-diskless-sync-delay",
    "0",
];
/// Number of hash slots.
const SLOTS: usize = 16384;
/// How often the cluster is created from scratch (fresh nodes and ports)
/// before [`Cluster::start`] gives up.
const CREATE_ATTEMPTS: usize = 3;
/// Bound for `redis-cli --cluster create`.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for [`Cluster::wait_ready`].
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for [`Cluster::wait_failover_of`] (node timeout is 1 s; a failover
/// normally takes 2-3 s).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for every node to agree on a migrated slot's owner.
const AGREE_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval of the cluster waits (each poll talks to every node).
const POLL: Duration = Duration::from_millis(20);
/// Cluster node ports are picked from here, so that the node port and its
/// bus port (+10000, up to 32767) both lie below Linux's ephemeral range
/// (32768 and up by default) where outgoing connections take their ports.
const PORT_RANGE: (u16, u16) = (16384, 22767);

/// A Redis Cluster of `masters * (1 + replicas_per_master)` private
/// `redis-server` processes on 127.0.0.1, created with `redis-cli --cluster
/// create` (node timeout 1 s, diskless replication without delay, no
/// persistence).
///
/// Every node is a [`RedisServer`] (so `pause`, `resume`, `kill`, `restart`,
/// `raw`, `cmd`, `conn` work on it), launched through a parent-watch
/// wrapper: the servers die, and their temp dirs are removed, when the test
/// process exits for whatever reason — even if the `Cluster` is never
/// dropped (e.g. held in a `static OnceLock<Cluster>` as a per-binary
/// fixture) or the process is SIGKILLed. Dropping the cluster kills every
/// node and removes the temp dirs at once.
///
/// Roles are discovered, not fixed: [`Cluster::masters`] and
/// [`Cluster::replicas_of`] read `CLUSTER NODES`, so after a failover the
/// promoted replica counts as a master. Queries about the cluster's state
/// ask the live node (running, not paused) with the highest
/// `cluster_current_epoch`, which avoids the stale view of a node that was
/// just restarted.
///
/// All waits are bounded and panic with a message that says what was being
/// waited for and what was seen last.
///
/// Error statistics, as measured on Redis 7.0.15: the `-MOVED` and `-ASK`
/// redirections a node sends **are** counted in `INFO errorstats`
/// (`errorstat_MOVED`, `errorstat_ASK`) and in `total_error_replies`, like
/// `CROSSSLOT`, so [`Cluster::errorstat`] can count redirections. A
/// redirected command counts as `rejected_calls`, not `calls`, in its
/// `cmdstat_*`. Beware `errorstat_ERR`: redis-rs sends `CLIENT SETINFO`
/// twice on every new connection, which Redis < 7.2 answers with `-ERR`, so
/// every connection (including each admin call of [`RedisServer::raw`])
/// adds 2 there.
pub struct Cluster {
    nodes: Vec<RedisServer>,
    /// Node ids (`CLUSTER MYID`), parallel to `nodes`; stable across a
    /// node's restart (kept in its `nodes.conf`).
    ids: Vec<String>,
    /// One proxy per node (parallel to `nodes`) for
    /// [`Cluster::start_behind_proxies`], else empty.
    proxies: Vec<Proxy>,
    /// Slot ranges of masters killed with [`Cluster::kill_node`], by port.
    killed_slots: Mutex<HashMap<u16, Vec<(u16, u16)>>>,
    /// Removes the nodes' temp dirs when this process dies (declared last:
    /// dropped after the nodes, which print their logs first if panicking).
    _dir_guard: DirGuard,
}

/// A `sh` process that removes some dirs once its stdin (a pipe from this
/// process) reaches end-of-file: when the [`DirGuard`] is dropped, or when
/// this process exits in any way.
///
/// Each node's own watch wrapper already kills the node and removes its dir
/// when this process dies while the node runs; the guard covers the dirs of
/// nodes that were killed (or stopped) and not restarted by then.
struct DirGuard(Option<std::process::Child>);

impl DirGuard {
    fn spawn(dirs: &[&std::path::Path]) -> DirGuard {
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"cat >/dev/null; rm -rf "$@""#)
            .arg("redlease-dir-guard")
            .args(dirs)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok(); // best effort: without it only those dirs may be left
        DirGuard(child)
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.wait(); // closes stdin first; sh then exits at once
        }
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    /// The announced port (a proxy's port behind proxies).
    port: u16,
    flags: Vec<String>,
    master_id: Option<String>,
    slots: Vec<(u16, u16)>,
    /// `[slot->-id]` entries (only on the node's own line).
    migrating: Vec<(u16, String)>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// One range of `CLUSTER SLOTS`, by announced ports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SlotRange {
    start: u16,
    end: u16,
    master: u16,
    replicas: Vec<u16>,
}

/// Admin connections kept open across the polls of one wait (one per
/// node), so a wait does not open a fresh connection per command. I/O errors
/// drop the connection and are returned, so the poll just tries again.
#[derive(Default)]
struct Conns(HashMap<u16, redis::Connection>);

impl Conns {
    fn query(&mut self, node: &RedisServer, args: &[&str]) -> Result<Resp, String> {
        let port = node.port();
        let fail = |e: redis::RedisError| format!("port {port}: {args:?}: {e}");
        let conn = match self.0.entry(port) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let client = redis::Client::open(node.url()).map_err(fail)?;
                let conn = client
                    .get_connection_with_timeout(Duration::from_secs(5))
                    .map_err(fail)?;
                conn.set_read_timeout(Some(Duration::from_secs(5)))
                    .map_err(fail)?;
                conn.set_write_timeout(Some(Duration::from_secs(5)))
                    .map_err(fail)?;
                v.insert(conn)
            }
        };
        let (name, rest) = args.split_first().expect("a command");
        let mut cmd = redis::cmd(name);
        for a in rest {
            cmd.arg(*a);
        }
        // Error replies arrive as `Ok(Value::ServerError)`; `Err` is I/O.
        match redis::ConnectionLike::req_command(conn, &cmd) {
            Ok(v) => Ok(Resp::from(v)),
            Err(e) => {
                self.0.remove(&port);
                Err(fail(e))
            }
        }
    }

    /// A bulk-string reply as text.
    fn text(&mut self, node: &RedisServer, args: &[&str]) -> Result<String, String> {
        match self.query(node, args)? {
            Resp::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => Err(format!(
                "port {}: {args:?}: unexpected reply {other:?}",
                node.port()
            )),
        }
    }
}

impl Cluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each and
    /// waits until the cluster is ready (see [`Cluster::wait_ready`]); the
    /// nodes' statistics are then reset (`CONFIG RESETSTAT`). `masters` must
    /// be at least 3 (`redis-cli --cluster create` refuses fewer). Takes
    /// about 2 s.
    pub fn start(masters: usize, replicas_per_master: usize) -> Cluster {
        Self::start_with_args(masters, replicas_per_master, &[])
    }

    /// Like [`Cluster::start`], appending `extra_args` to every node's
    /// command line (also on a node's [`RedisServer::restart`]).
    pub fn start_with_args(
        masters: usize,
        replicas_per_master: usize,
        extra_args: &[&str],
    ) -> Cluster {
        Self::build(masters, replicas_per_master, extra_args, false)
    }

    /// Like [`Cluster::start_with_args`], but every node sits behind its own
    /// [`Proxy`] and announces the proxy's port to the cluster
    /// (`cluster-announce-port`; the bus port stays direct): `CLUSTER
    /// SLOTS`, `CLUSTER NODES`, `MOVED` and `ASK` name the proxies, so a
    /// client that follows them talks to the nodes only through the proxies
    /// (for fault injection, or counting connections per node).
    /// [`Cluster::seeds`] are the proxies' urls.
    ///
    /// Replication follows the announced address too: a replica's link to
    /// its master goes through the master's proxy, so faults injected there
    /// (e.g. [`Proxy::cut`]) also hit replication. The admin helpers of this
    /// type use the nodes' own ports and bypass the proxies.
    pub fn start_behind_proxies(
        masters: usize,
        replicas_per_master: usize,
        extra_args: &[&str],
    ) -> Cluster {
        Self::build(masters, replicas_per_master, extra_args, true)
    }

    fn build(masters: usize, replicas: usize, extra_args: &[&str], proxied: bool) -> Cluster {
        assert!(
            masters >= 3,
            "Cluster::start: redis-cli --cluster create needs at least 3 masters, got {masters}"
        );
        let total = masters * (1 + replicas);
        let mut args: Vec<&str> = NODE_ARGS.to_vec();
        args.extend_from_slice(extra_args);
        let mut failures = Vec::new();
        for _ in 0..CREATE_ATTEMPTS {
            let mut nodes = start_nodes(total, &args);
            let mut proxies = Vec::new();
            if proxied {
                for node in &mut nodes {
                    let proxy = Proxy::start(node.addr());
                    let announce = [
                        ("cluster-announce-port", proxy.port()),
                        ("cluster-announce-bus-port", node.port() + 10000),
                    ];
                    let mut restart_args = Vec::new();
                    for (name, value) in announce {
                        let value = value.to_string();
                        expect_ok(node, &["CONFIG", "SET", name, &value]);
                        restart_args.push(format!("--{name}"));
                        restart_args.push(value);
                    }
                    node.append_restart_args(&restart_args);
                    proxies.push(proxy);
                }
            }
            if let Err(e) = create(&nodes, replicas) {
                failures.push(e);
                continue; // drops (kills) these nodes; new ports next time
            }
            // CLUSTER SLOTS leaves out replicas whose replication offset is
            // still 0, which on a fresh, empty cluster lasts until the first
            // replication PING (repl-ping-replica-period, 10 s): a replicated
            // no-op write on every master moves the offsets on at once.
            // (Replicas answer -READONLY, which is fine.)
            for node in &nodes {
                let _ = node.raw(&["FLUSHALL"]);
            }
            let ids = nodes.iter().map(|n| n.cmd(&["CLUSTER", "MYID"])).collect();
            let dirs: Vec<&std::path::Path> = nodes.iter().map(RedisServer::dir).collect();
            let dir_guard = DirGuard::spawn(&dirs);
            let mut conns = Conns::default();
            let cluster = Cluster {
                nodes,
                ids,
                proxies,
                killed_slots: Mutex::new(HashMap::new()),
                _dir_guard: dir_guard,
            };
            wait_for(
                &format!(
                    "a new cluster of {masters} masters x {replicas} replicas to be ready \
                     (state ok on every node, all slots served, every node known, replica \
                     links up, one slot map everywhere)"
                ),
                READY_TIMEOUT,
                || cluster.check_ready(&mut conns, Some((masters, replicas))),
            );
            cluster.reset_stats(); // forget the setup's commands and errors
            return cluster;
        }
        panic!(
            "could not create a cluster ({} attempt(s)):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    /// All nodes, in start order (roles are not tied to positions).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The proxies of a cluster started with [`Cluster::start_behind_proxies`]
    /// (parallel to [`Cluster::nodes`]); empty otherwise.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// The proxy in front of `node`. Panics if the cluster was not started
    /// with [`Cluster::start_behind_proxies`].
    pub fn proxy_of(&self, node: &RedisServer) -> &Proxy {
        let i = self.index_of(node);
        self.proxies.get(i).unwrap_or_else(|| {
            panic!("proxy_of: the cluster was not started with start_behind_proxies")
        })
    }

    /// `redis://127.0.0.1:port/` of every node, as the cluster announces it
    /// (the proxies' urls behind proxies), in [`Cluster::nodes`] order.
    pub fn seeds(&self) -> Vec<String> {
        (0..self.nodes.len())
            .map(|i| format!("redis://127.0.0.1:{}/", self.announced_port(i)))
            .collect()
    }

    /// The node with this port: its own port or, behind proxies, its
    /// proxy's port. Panics if there is none.
    pub fn node_by_port(&self, port: u16) -> &RedisServer {
        match self.index_of_port(port) {
            Some(i) => &self.nodes[i],
            None => panic!(
                "no node of this cluster on port {port} (nodes: {:?})",
                self.nodes.iter().map(RedisServer::port).collect::<Vec<_>>()
            ),
        }
    }

    /// The cluster node id of `node` (`CLUSTER MYID`, cached at start).
    pub fn node_id(&self, node: &RedisServer) -> &str {
        &self.ids[self.index_of(node)]
    }

    /// The current masters that serve slots, ordered by their lowest slot,
    /// from `CLUSTER NODES` of a live node (masters flagged `fail` are
    /// left out; after a failover the promoted replica is one of them).
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.masters_in(&self.cluster_nodes(self.view()))
    }

    fn masters_in(&self, lines: &[NodeLine]) -> Vec<&RedisServer> {
        let mut masters: Vec<&NodeLine> = lines
            .iter()
            .filter(|l| l.has_flag("master") && !l.has_flag("fail") && !l.slots.is_empty())
            .collect();
        masters.sort_by_key(|l| l.slots.iter().map(|s| s.0).min());
        masters.iter().map(|l| self.node_of_line(l)).collect()
    }

    /// The current replicas of `master` (from `CLUSTER NODES` of a live
    /// node; replicas flagged `fail` are left out), in [`Cluster::nodes`]
    /// order.
    pub fn replicas_of(&self, master: &RedisServer) -> Vec<&RedisServer> {
        let id = self.node_id(master);
        let mut replicas: Vec<usize> = self
            .cluster_nodes(self.view())
            .iter()
            .filter(|l| {
                l.has_flag("slave") && !l.has_flag("fail") && l.master_id.as_deref() == Some(id)
            })
            .map(|l| self.index_of_line(l))
            .collect();
        replicas.sort_unstable();
        replicas.into_iter().map(|i| &self.nodes[i]).collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT` on a live node).
    pub fn slot_of(&self, key: &str) -> u16 {
        let node = self.any_live();
        match node.raw(&["CLUSTER", "KEYSLOT", key]) {
            Resp::Int(n) => slot_from_i64(n),
            other => panic!("CLUSTER KEYSLOT {key:?}: unexpected reply {other:?}"),
        }
    }

    /// The master serving `slot`, from `CLUSTER NODES` of a live node
    /// (during a migration that is still the source; a killed master keeps
    /// its slots until a replica has taken over).
    pub fn master_of_slot(&self, slot: u16) -> &RedisServer {
        let lines = self.cluster_nodes(self.view());
        let owner = lines
            .iter()
            .find(|l| l.has_flag("master") && l.owns(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {lines:?}"));
        self.node_of_line(owner)
    }

    /// Lock names `prefix:0`, `prefix:1`, ... grouped by master: one group
    /// per master, in [`Cluster::masters`] order, each with the first
    /// `per_master` names whose slot that master serves.
    pub fn names_on_each_master(&self, prefix: &str, per_master: usize) -> Vec<Vec<String>> {
        let lines = self.cluster_nodes(self.view());
        let masters = self.masters_in(&lines);
        let owner_index = |slot: u16| -> Option<usize> {
            let line = lines
                .iter()
                .find(|l| l.has_flag("master") && !l.has_flag("fail") && l.owns(slot))?;
            let node = self.node_of_line(line);
            masters.iter().position(|m| std::ptr::eq(*m, node))
        };
        let mut groups: Vec<Vec<String>> = vec![Vec::new(); masters.len()];
        let mut conn = self.any_live().conn();
        let limit = 1000 + 100 * per_master * masters.len();
        for i in 0..limit {
            if groups.iter().all(|g| g.len() >= per_master) {
                return groups;
            }
            let name = format!("{prefix}:{i}");
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&name)
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT {name:?}: {e}"));
            if let Some(g) = owner_index(slot_from_i64(slot)) {
                if groups[g].len() < per_master {
                    groups[g].push(name);
                }
            }
        }
        panic!("names_on_each_master({prefix:?}, {per_master}): {limit} names did not fill every master's group: {groups:?}");
    }

    // -- slot migration ----------------------------------------------------

    /// First step of moving `slot` to master `to`: `CLUSTER SETSLOT slot
    /// IMPORTING <source id>` on `to`, then `CLUSTER SETSLOT slot MIGRATING
    /// <to's id>` on the current owner. From now on the source answers
    /// `-ASK` for keys of the slot it does not have. Panics if `to` already
    /// serves the slot.
    pub fn begin_migration(&self, slot: u16, to: &RedisServer) {
        let from = self.master_of_slot(slot);
        assert!(
            !std::ptr::eq(from, to),
            "begin_migration: slot {slot} is already served by port {}",
            to.port()
        );
        let s = slot.to_string();
        expect_ok(
            to,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", self.node_id(from)],
        );
        expect_ok(
            from,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", self.node_id(to)],
        );
    }

    /// Second step: moves every key of `slot` from its owner to the node it
    /// is migrating to (`CLUSTER GETKEYSINSLOT` + `MIGRATE 127.0.0.1 <port>
    /// "" 0 5000 KEYS ...` on the source, in batches until none is left).
    /// Returns the number of keys moved. Panics if the slot is not being
    /// migrated ([`Cluster::begin_migration`] first) or `MIGRATE` fails.
    pub fn migrate_keys(&self, slot: u16) -> usize {
        let from = self.master_of_slot(slot);
        let own = self
            .cluster_nodes(from)
            .into_iter()
            .find(|l| l.has_flag("myself"))
            .expect("CLUSTER NODES has no myself line");
        let to_id = own
            .migrating
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, id)| id.clone())
            .unwrap_or_else(|| {
                panic!(
                    "migrate_keys: slot {slot} is not migrating on its owner (port {}); \
                     call begin_migration first",
                    from.port()
                )
            });
        let to = self.node_by_id(&to_id);
        let (s, to_port) = (slot.to_string(), to.port().to_string());
        let mut moved = 0;
        for _ in 0..100_000 {
            let keys: Vec<String> = match from.raw(&["CLUSTER", "GETKEYSINSLOT", &s, "1000"]) {
                Resp::Array(Some(items)) => items
                    .into_iter()
                    .map(|k| match k {
                        Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
                        other => panic!("CLUSTER GETKEYSINSLOT {slot}: odd key {other:?}"),
                    })
                    .collect(),
                other => panic!("CLUSTER GETKEYSINSLOT {slot}: unexpected reply {other:?}"),
            };
            if keys.is_empty() {
                return moved;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            match from.raw(&args) {
                Resp::Simple(r) if r == "OK" || r == "NOKEY" => moved += keys.len(),
                other => panic!(
                    "MIGRATE of {} key(s) of slot {slot} from port {} to port {}: {other:?}",
                    keys.len(),
                    from.port(),
                    to.port()
                ),
            }
        }
        panic!(
            "migrate_keys: slot {slot} never became empty on port {}",
            from.port()
        );
    }

    /// Last step: `CLUSTER SETSLOT slot NODE <to's id>` on `to`, on the
    /// source, then on every other live master; then waits until every live
    /// node agrees that `to` serves the slot. Panics if the source still
    /// holds keys of the slot ([`Cluster::migrate_keys`] first).
    pub fn finish_migration(&self, slot: u16, to: &RedisServer) {
        let from = self.master_of_slot(slot);
        let s = slot.to_string();
        let to_id = self.node_id(to).to_owned();
        let set = |node: &RedisServer| {
            expect_ok(node, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        };
        set(to);
        if !std::ptr::eq(from, to) {
            set(from);
        }
        for master in self.masters() {
            if !std::ptr::eq(master, to) && !std::ptr::eq(master, from) && is_live(master) {
                set(master);
            }
        }
        self.wait_slot_owner(slot, to);
    }

    /// Moves `slot` (and its keys) to master `to`: [`Cluster::begin_migration`],
    /// [`Cluster::migrate_keys`], [`Cluster::finish_migration`].
    pub fn migrate_slot(&self, slot: u16, to: &RedisServer) {
        self.begin_migration(slot, to);
        self.migrate_keys(slot);
        self.finish_migration(slot, to);
    }

    /// Waits (bounded) until every live node's `CLUSTER SLOTS` says `owner`
    /// serves `slot`.
    pub fn wait_slot_owner(&self, slot: u16, owner: &RedisServer) {
        let want = self.index_of(owner);
        let mut conns = Conns::default();
        wait_for(
            &format!(
                "every live node to agree that port {} serves slot {slot}",
                owner.port()
            ),
            AGREE_TIMEOUT,
            || {
                for node in self.live() {
                    let seen = self.slot_owner_seen_by(&mut conns, node, slot)?;
                    if seen != Some(want) {
                        return Err(format!(
                            "port {} sees slot {slot} served by {:?}",
                            node.port(),
                            seen.map(|i| self.nodes[i].port())
                        ));
                    }
                }
                Ok(())
            },
        );
    }

    // -- failures ----------------------------------------------------------

    /// Kills `node` with SIGKILL ([`RedisServer::kill`]), first noting the
    /// slots it serves (for [`Cluster::wait_failover_of`]).
    pub fn kill_node(&self, node: &RedisServer) {
        let i = self.index_of(node);
        let others: Vec<&RedisServer> = self
            .live()
            .into_iter()
            .filter(|n| !std::ptr::eq(*n, node))
            .collect();
        if let Some(view) = self.best_view(&others) {
            let slots: Vec<(u16, u16)> = self
                .cluster_nodes(view)
                .into_iter()
                .filter(|l| self.index_of_port(l.port) == Some(i) && l.has_flag("master"))
                .flat_map(|l| l.slots)
                .collect();
            if !slots.is_empty() {
                lock(&self.killed_slots).insert(node.port(), slots);
            }
        }
        node.kill();
    }

    /// Waits (bounded) until the slots of the master that was on
    /// `old_master_port` are served by another live node on every live
    /// node's view, then until the cluster is ready again
    /// ([`Cluster::wait_ready`]); returns the new master. The old master's
    /// slots are those noted by [`Cluster::kill_node`], else those it still
    /// serves in the current view.
    pub fn wait_failover_of(&self, old_master_port: u16) -> &RedisServer {
        let old = self.index_of_port(old_master_port).unwrap_or_else(|| {
            panic!("wait_failover_of: no node of this cluster on port {old_master_port}")
        });
        let old_port = self.nodes[old].port();
        let recorded = lock(&self.killed_slots).get(&old_port).cloned();
        let slots = recorded.unwrap_or_else(|| {
            self.cluster_nodes(self.view())
                .into_iter()
                .filter(|l| self.index_of_port(l.port) == Some(old) && l.has_flag("master"))
                .flat_map(|l| l.slots)
                .collect()
        });
        assert!(
            !slots.is_empty(),
            "wait_failover_of: the node on port {old_port} serves no slots (kill masters \
             with Cluster::kill_node so their slots are noted)"
        );
        let mut new_master = None;
        let mut conns = Conns::default();
        wait_for(
            &format!(
                "failover of the master on port {old_port}: slots {slots:?} served by one \
                 other live node in every live node's view"
            ),
            FAILOVER_TIMEOUT,
            || {
                let mut owner = None;
                for node in self.live() {
                    let map = self.slot_map_with(&mut conns, node)?;
                    for &(a, b) in &slots {
                        let overlapping = map.iter().filter(|r| r.start <= b && a <= r.end);
                        let covered: usize = overlapping
                            .clone()
                            .map(|r| usize::from(r.end.min(b) - r.start.max(a)) + 1)
                            .sum();
                        if covered != usize::from(b - a) + 1 {
                            return Err(format!(
                                "port {} sees slots {a}-{b} partly unassigned",
                                node.port()
                            ));
                        }
                        for r in overlapping {
                            let i = self.index_of_port(r.master);
                            match (i, owner) {
                                (Some(i), _) if i == old => {
                                    return Err(format!(
                                        "port {} still sees {}-{} on the old master",
                                        node.port(),
                                        r.start,
                                        r.end
                                    ))
                                }
                                (Some(i), None) if is_live(&self.nodes[i]) => owner = Some(i),
                                (Some(i), Some(o)) if i == o => {}
                                _ => {
                                    return Err(format!(
                                        "port {} sees {}-{} on port {}",
                                        node.port(),
                                        r.start,
                                        r.end,
                                        r.master
                                    ))
                                }
                            }
                        }
                    }
                }
                new_master = owner;
                owner.map(|_| ()).ok_or_else(|| "no live node".to_owned())
            },
        );
        self.wait_ready();
        &self.nodes[new_master.expect("set by the wait")]
    }

    /// Waits (bounded) until on every live node (running, not paused):
    /// `CLUSTER INFO` says `cluster_state:ok`, `cluster_slots_ok:16384` and
    /// `cluster_known_nodes` = all nodes; a replica's `INFO replication`
    /// says `master_link_status:up`; and `CLUSTER SLOTS` is the same
    /// (ranges, masters and non-failed replicas). Use after a failover,
    /// migration or restart.
    pub fn wait_ready(&self) {
        let mut conns = Conns::default();
        wait_for(
            "the cluster to be ready (state ok on every live node, all slots served, every \
             node known, replica links up, one slot map everywhere)",
            READY_TIMEOUT,
            || self.check_ready(&mut conns, None),
        );
    }

    // -- statistics ----------------------------------------------------------

    /// Sum over the live nodes of `errorstat_<code>:count=N` in `INFO
    /// errorstats` (0 where absent), e.g. `"CROSSSLOT"`, `"MOVED"`, `"ASK"`,
    /// `"NOSCRIPT"` (Redis 7.0 counts `MOVED`/`ASK` redirections here; see
    /// [`Cluster`] about `"ERR"`). Killed and paused nodes are skipped.
    pub fn errorstat(&self, code: &str) -> u64 {
        let prefix = format!("errorstat_{code}:");
        self.live()
            .into_iter()
            .map(|node| {
                info_text(node, "errorstats")
                    .lines()
                    .find_map(|l| l.strip_prefix(&prefix))
                    .and_then(|rest| stat_value(rest, "count"))
                    .unwrap_or(0)
            })
            .sum()
    }

    /// `calls` of `cmdstat_<cmd>` in `INFO commandstats` of `node` (0 if
    /// absent); `cmd` is case-insensitive, subcommands as `cluster|slots`.
    pub fn commandstat_calls(&self, node: &RedisServer, cmd: &str) -> u64 {
        node.command_stat(cmd, "calls")
    }

    /// `CONFIG RESETSTAT` on every live node (error and command statistics
    /// start again from 0).
    pub fn reset_stats(&self) {
        for node in self.live() {
            expect_ok(node, &["CONFIG", "RESETSTAT"]);
        }
    }

    // -- internals -----------------------------------------------------------

    /// The nodes that are running and not paused.
    fn live(&self) -> Vec<&RedisServer> {
        self.nodes.iter().filter(|n| is_live(n)).collect()
    }

    fn any_live(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| is_live(n))
            .expect("no live node in the cluster (all killed or paused)")
    }

    /// The live node whose view to trust: the highest current epoch.
    fn view(&self) -> &RedisServer {
        self.best_view(&self.live())
            .expect("no live node in the cluster (all killed or paused)")
    }

    fn best_view<'a>(&self, candidates: &[&'a RedisServer]) -> Option<&'a RedisServer> {
        candidates.iter().copied().max_by_key(|n| {
            let info = n.cmd(&["CLUSTER", "INFO"]);
            // max_by_key keeps the last maximum; prefer earlier nodes on ties.
            let epoch = info_u64(&info, "cluster_current_epoch").unwrap_or(0);
            (epoch, std::cmp::Reverse(n.port()))
        })
    }

    fn index_of(&self, node: &RedisServer) -> usize {
        self.nodes
            .iter()
            .position(|n| std::ptr::eq(n, node))
            .unwrap_or_else(|| {
                panic!(
                    "the server on port {} is not a node of this cluster",
                    node.port()
                )
            })
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        (0..self.nodes.len())
            .find(|&i| self.nodes[i].port() == port || self.announced_port(i) == port)
    }

    fn announced_port(&self, i: usize) -> u16 {
        self.proxies
            .get(i)
            .map_or_else(|| self.nodes[i].port(), Proxy::port)
    }

    fn node_by_id(&self, id: &str) -> &RedisServer {
        let i = self
            .ids
            .iter()
            .position(|x| x == id)
            .unwrap_or_else(|| panic!("no node of this cluster has id {id}"));
        &self.nodes[i]
    }

    fn index_of_line(&self, line: &NodeLine) -> usize {
        self.ids
            .iter()
            .position(|x| *x == line.id)
            .or_else(|| self.index_of_port(line.port))
            .unwrap_or_else(|| panic!("CLUSTER NODES names a node that is not ours: {line:?}"))
    }

    fn node_of_line(&self, line: &NodeLine) -> &RedisServer {
        &self.nodes[self.index_of_line(line)]
    }

    fn cluster_nodes(&self, node: &RedisServer) -> Vec<NodeLine> {
        let text = match node.raw(&["CLUSTER", "NODES"]) {
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
            other => panic!(
                "CLUSTER NODES on port {}: unexpected reply {other:?}",
                node.port()
            ),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| parse_node_line(l).unwrap_or_else(|| panic!("odd CLUSTER NODES line {l:?}")))
            .collect()
    }

    /// `CLUSTER SLOTS` of `node`, sorted, replicas sorted.
    fn slot_map(&self, node: &RedisServer) -> Vec<SlotRange> {
        self.slot_map_with(&mut Conns::default(), node)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn slot_map_with(
        &self,
        conns: &mut Conns,
        node: &RedisServer,
    ) -> Result<Vec<SlotRange>, String> {
        let reply = conns.query(node, &["CLUSTER", "SLOTS"])?;
        let Resp::Array(Some(ranges)) = reply else {
            return Err(format!(
                "CLUSTER SLOTS on port {}: unexpected reply {reply:?}",
                node.port()
            ));
        };
        let port_of = |n: &Resp| -> u16 {
            match n {
                Resp::Array(Some(f)) => match f.get(1) {
                    Some(Resp::Int(p)) => u16::try_from(*p).unwrap_or(0),
                    _ => 0,
                },
                _ => 0,
            }
        };
        let mut map: Vec<SlotRange> = ranges
            .iter()
            .map(|r| {
                let Resp::Array(Some(f)) = r else {
                    panic!("CLUSTER SLOTS: odd range {r:?}");
                };
                let (Some(Resp::Int(a)), Some(Resp::Int(b)), Some(m)) =
                    (f.first(), f.get(1), f.get(2))
                else {
                    panic!("CLUSTER SLOTS: odd range {r:?}");
                };
                let mut replicas: Vec<u16> = f[3..].iter().map(port_of).collect();
                replicas.sort_unstable();
                SlotRange {
                    start: slot_from_i64(*a),
                    end: slot_from_i64(*b),
                    master: port_of(m),
                    replicas,
                }
            })
            .collect();
        map.sort();
        Ok(map)
    }

    /// Which node `node` thinks serves `slot` (by `CLUSTER SLOTS`).
    fn slot_owner_seen_by(
        &self,
        conns: &mut Conns,
        node: &RedisServer,
        slot: u16,
    ) -> Result<Option<usize>, String> {
        Ok(self
            .slot_map_with(conns, node)?
            .into_iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .and_then(|r| self.index_of_port(r.master)))
    }

    /// `Ok` if the cluster is ready (see [`Cluster::wait_ready`]), else what
    /// is not. With `expect = (masters, replicas)` also checks the shape.
    fn check_ready(&self, conns: &mut Conns, expect: Option<(usize, usize)>) -> Result<(), String> {
        let total = self.nodes.len() as u64;
        let mut first: Option<(u16, Vec<SlotRange>)> = None;
        let live = self.live();
        if live.is_empty() {
            return Err("no live node".to_owned());
        }
        for node in live {
            let port = node.port();
            let info = conns.text(node, &["CLUSTER", "INFO"])?;
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return Err(format!("port {port}: cluster_state is not ok"));
            }
            let ok = info_u64(&info, "cluster_slots_ok");
            if ok != Some(SLOTS as u64) {
                return Err(format!("port {port}: cluster_slots_ok = {ok:?}"));
            }
            let known = info_u64(&info, "cluster_known_nodes");
            if known != Some(total) {
                return Err(format!(
                    "port {port}: cluster_known_nodes = {known:?}, want {total}"
                ));
            }
            let repl = conns.text(node, &["INFO", "replication"])?;
            if repl.lines().any(|l| l.trim() == "role:slave")
                && !repl.lines().any(|l| l.trim() == "master_link_status:up")
            {
                return Err(format!("port {port}: replica link to its master is not up"));
            }
            let map = self.slot_map_with(conns, node)?;
            match &first {
                None => first = Some((port, map)),
                Some((p, m)) if *m != map => {
                    return Err(format!(
                        "slot maps differ: port {p} has {m:?}, port {port} has {map:?}"
                    ))
                }
                Some(_) => {}
            }
        }
        if let (Some((masters, replicas)), Some((_, map))) = (expect, &first) {
            let mut by_master: HashMap<u16, usize> = HashMap::new();
            for r in map {
                by_master.insert(r.master, r.replicas.len());
            }
            if by_master.len() != masters || by_master.values().any(|&n| n != replicas) {
                return Err(format!(
                    "want {masters} masters with {replicas} replicas each, slot map is {map:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Polls `check` every [`POLL`] until it is `Ok`; panics after
/// `timeout` with `what` and the last complaint.
fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check() {
            Ok(()) => return,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            match check() {
                Ok(()) => return,
                Err(e) => panic!(
                    "timed out after {timeout:?} waiting for {what}; last seen: {e} \
                     (before: {last})"
                ),
            }
        }
        thread::sleep(POLL);
    }
}

impl Drop for Cluster {
    /// Kills every node first (so no node logs the others' teardown), then
    /// the nodes drop as usual: temp dirs removed, and the log tails printed
    /// if the thread is panicking.
    fn drop(&mut self) {
        for node in &self.nodes {
            node.kill();
        }
    }
}

fn is_live(node: &RedisServer) -> bool {
    node.is_running() && !node.is_paused()
}

/// Starts `n` watched cluster-mode servers in parallel.
fn start_nodes(n: usize, args: &[&str]) -> Vec<RedisServer> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| s.spawn(|| RedisServer::start_inner(args, true, cluster_port)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`,
/// bounded by [`CREATE_TIMEOUT`]; the error carries redis-cli's output.
fn create(nodes: &[RedisServer], replicas: usize) -> Result<(), String> {
    let out_path = nodes[0].dir().join("cluster-create.log");
    let out = File::create(&out_path).map_err(|e| format!("cannot create {out_path:?}: {e}"))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(redis_cli_path());
    cmd.arg("--cluster").arg("create");
    for node in nodes {
        cmd.arg(format!("127.0.0.1:{}", node.port()));
    }
    cmd.arg("--cluster-replicas")
        .arg(replicas.to_string())
        .arg("--cluster-yes")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", redis_cli_path()))?;
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("did not finish within {CREATE_TIMEOUT:?}"));
            }
            Err(e) => break Err(e.to_string()),
        }
    };
    let output = fs::read(&out_path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    match status {
        Ok(s) if s.success() && !output.contains("[ERR]") => Ok(()),
        Ok(s) => Err(format!(
            "redis-cli --cluster create failed ({s}):\n{output}"
        )),
        Err(e) => Err(format!("redis-cli --cluster create {e}:\n{output}")),
    }
}

/// A port P with P and P + 10000 (its cluster bus port) free on 127.0.0.1,
/// chosen at random in [`PORT_RANGE`] (falling back to ephemeral ports
/// below 55535). Racy like [`free_port`]; the start is retried on a clash.
fn cluster_port() -> u16 {
    let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
    let (lo, hi) = PORT_RANGE;
    for _ in 0..200 {
        let p = lo + (random_u64() % u64::from(hi - lo + 1)) as u16;
        if free(p) && free(p + 10000) {
            return p;
        }
    }
    for _ in 0..200 {
        let p = free_port();
        if p < 55535 && free(p + 10000) {
            return p;
        }
    }
    panic!("no free port P with a free cluster bus port P+10000 found on 127.0.0.1");
}

fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn expect_ok(node: &RedisServer, args: &[&str]) {
    match node.raw(args) {
        Resp::Simple(s) if s == "OK" => {}
        other => panic!(
            "{args:?} on port {}: unexpected reply {other:?}",
            node.port()
        ),
    }
}

fn info_text(node: &RedisServer, section: &str) -> String {
    match node.raw(&["INFO", section]) {
        Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!(
            "INFO {section} on port {}: unexpected reply {other:?}",
            node.port()
        ),
    }
}

impl RedisServer {
    /// Field `field` (`calls`, `rejected_calls`, `failed_calls`, ...) of
    /// `cmdstat_<cmd>` in `INFO commandstats` (0 if the command has no
    /// line); `cmd` is case-insensitive, subcommands as `cluster|slots`.
    pub fn command_stat(&self, cmd: &str, field: &str) -> u64 {
        let prefix = format!("cmdstat_{}:", cmd.to_ascii_lowercase());
        info_text(self, "commandstats")
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| stat_value(rest, field))
            .unwrap_or(0)
    }
}

/// `field:N` from `INFO`-style text.
fn info_u64(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `name=N` from a `a=1,b=2` list.
fn stat_value(list: &str, name: &str) -> Option<u64> {
    list.trim()
        .split(',')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn slot_from_i64(n: i64) -> u16 {
    u16::try_from(n)
        .ok()
        .filter(|&s| usize::from(s) < SLOTS)
        .unwrap_or_else(|| panic!("{n} is not a hash slot"))
}

/// Parses `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong>
/// <epoch> <link> <slot>...`.
fn parse_node_line(line: &str) -> Option<NodeLine> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    let addr = f[1].split(['@', ',']).next()?;
    let port = addr.rsplit(':').next()?.parse().ok()?;
    let mut slots = Vec::new();
    let mut migrating = Vec::new();
    for s in &f[8..] {
        if let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            if let Some((slot, id)) = inner.split_once("->-") {
                migrating.push((slot.parse().ok()?, id.to_owned()));
            }
        } else if let Some((a, b)) = s.split_once('-') {
            slots.push((a.parse().ok()?, b.parse().ok()?));
        } else {
            let n = s.parse().ok()?;
            slots.push((n, n));
        }
    }
    Some(NodeLine {
        id: f[0].to_owned(),
        port,
        flags: f[2].split(',').map(str::to_owned).collect(),
        master_id: (f[3] != "-").then(|| f[3].to_owned()),
        slots,
        migrating,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::OnceLock;

    /// Tells [`cluster_child_process`] it runs as the child of
    /// [`cluster_dies_with_its_process`], and how to end.
    const CHILD_ENV: &str = "REDLEASE_TESTKIT_CLUSTER_CHILD";

    /// `SET key value` on `node` over a plain (non-cluster) redis-rs
    /// connection.
    fn set_on(node: &RedisServer, key: &str, value: &str) -> Resp {
        node.raw(&["SET", key, value])
    }

    #[test]
    fn cluster_harness_end_to_end() {
        let t0 = Instant::now();
        let cluster = Cluster::start(3, 1);
        let ready = t0.elapsed();
        println!("3x1 cluster ready after {ready:?}");
        assert_eq!(cluster.nodes().len(), 6);
        assert_eq!(cluster.seeds().len(), 6);

        let masters = cluster.masters();
        assert_eq!(masters.len(), 3, "masters");
        for m in &masters {
            assert_eq!(cluster.replicas_of(m).len(), 1, "replicas of {}", m.port());
            assert!(std::ptr::eq(cluster.node_by_port(m.port()), *m));
        }

        // slot_of / master_of_slot agree with where a write lands.
        cluster.reset_stats();
        let key = "lock:a";
        let slot = cluster.slot_of(key);
        let owner = cluster.master_of_slot(slot);
        assert_eq!(set_on(owner, key, "1"), Resp::Simple("OK".into()));
        let other = masters
            .iter()
            .copied()
            .find(|m| !std::ptr::eq(*m, owner))
            .unwrap();
        match set_on(other, key, "2") {
            Resp::Error(e) => assert!(
                e.starts_with(&format!("MOVED {slot} 127.0.0.1:{}", owner.port())),
                "{e}"
            ),
            r => panic!("expected MOVED, got {r:?}"),
        }
        assert_eq!(
            cluster.errorstat("MOVED"),
            1,
            "errorstat_MOVED counts the redirect"
        );
        // MOVED is part of total_error_replies (as is every errorstat;
        // note that each new redis-rs connection adds two errorstat_ERR on
        // Redis < 7.2: its CLIENT SETINFO calls are unknown there).
        let info = other.cmd(&["INFO", "stats", "errorstats"]);
        let per_code: u64 = info
            .lines()
            .filter(|l| l.starts_with("errorstat_"))
            .filter_map(|l| stat_value(l.split_once(':')?.1, "count"))
            .sum();
        assert_eq!(
            info_u64(&info, "total_error_replies"),
            Some(per_code),
            "{info}"
        );
        assert!(info.contains("errorstat_MOVED:count=1"), "{info}");
        match other.raw(&["MSET", "a", "1", "b", "2"]) {
            Resp::Error(e) => assert!(e.starts_with("CROSSSLOT"), "{e}"),
            r => panic!("expected CROSSSLOT, got {r:?}"),
        }
        assert_eq!(cluster.errorstat("CROSSSLOT"), 1);
        assert_eq!(cluster.errorstat("NOSUCHCODE"), 0);
        assert_eq!(cluster.commandstat_calls(owner, "set"), 1);
        assert_eq!(
            cluster.commandstat_calls(other, "SET"),
            0,
            "MOVED: rejected"
        );
        assert_eq!(cluster.commandstat_calls(owner, "evalsha"), 0);

        // names_on_each_master
        let groups = cluster.names_on_each_master("n", 2);
        assert_eq!(groups.len(), 3);
        for (g, m) in groups.iter().zip(&masters) {
            assert_eq!(g.len(), 2);
            for name in g {
                assert!(std::ptr::eq(
                    cluster.master_of_slot(cluster.slot_of(name)),
                    *m
                ));
            }
        }

        // Step-by-step migration: ASK while importing, then the key moves.
        let t = Instant::now();
        cluster.begin_migration(slot, other);
        // A key the source does not have, in the same slot (hash tag).
        let absent = format!("{{{key}}}:absent");
        assert_eq!(cluster.slot_of(&absent), slot);
        match owner.raw(&["GET", &absent]) {
            Resp::Error(e) => assert!(e.starts_with(&format!("ASK {slot} ")), "{e}"),
            r => panic!("expected ASK, got {r:?}"),
        }
        assert_eq!(cluster.migrate_keys(slot), 1);
        match owner.raw(&["GET", key]) {
            Resp::Error(e) => assert!(e.starts_with(&format!("ASK {slot} ")), "{e}"),
            r => panic!("expected ASK after the key moved, got {r:?}"),
        }
        assert_eq!(
            cluster.errorstat("ASK"),
            2,
            "errorstat_ASK counts redirects"
        );
        cluster.finish_migration(slot, other);
        println!("step-by-step migration took {:?}", t.elapsed());
        assert!(std::ptr::eq(cluster.master_of_slot(slot), other));
        assert_eq!(other.cmd(&["GET", key]), "1");
        assert!(matches!(owner.raw(&["GET", key]), Resp::Error(e) if e.starts_with("MOVED")));

        // migrate_slot in one call, back to the old owner.
        let t = Instant::now();
        cluster.migrate_slot(slot, owner);
        println!("migrate_slot took {:?}", t.elapsed());
        assert_eq!(owner.cmd(&["GET", key]), "1");

        // Kill the owner; its replica takes over with the key.
        assert_eq!(owner.cmd(&["WAIT", "1", "5000"]), "1");
        let replica_port = cluster.replicas_of(owner)[0].port();
        let t = Instant::now();
        cluster.kill_node(owner);
        let promoted = cluster.wait_failover_of(owner.port());
        println!("failover took {:?}", t.elapsed());
        assert_eq!(promoted.port(), replica_port);
        assert_eq!(cluster.masters().len(), 3);
        assert!(std::ptr::eq(cluster.master_of_slot(slot), promoted));
        assert_eq!(promoted.cmd(&["GET", key]), "1");
        println!(
            "errorstats after the run: MOVED {} ASK {} CROSSSLOT {}",
            cluster.errorstat("MOVED"),
            cluster.errorstat("ASK"),
            cluster.errorstat("CROSSSLOT")
        );

        // The old master comes back as a replica of the promoted node.
        owner.restart();
        cluster.wait_ready();
        assert_eq!(cluster.replicas_of(promoted).len(), 1);
        assert!(std::ptr::eq(cluster.replicas_of(promoted)[0], owner));
    }

    #[test]
    fn cluster_behind_proxies() {
        let t0 = Instant::now();
        let cluster = Cluster::start_behind_proxies(3, 1, &[]);
        println!("3x1 cluster behind proxies ready after {:?}", t0.elapsed());
        let proxy_ports: Vec<u16> = cluster.proxies().iter().map(Proxy::port).collect();
        assert_eq!(proxy_ports.len(), 6);
        let seeds = cluster.seeds();
        for (seed, p) in seeds.iter().zip(&proxy_ports) {
            assert_eq!(*seed, format!("redis://127.0.0.1:{p}/"));
        }
        // CLUSTER SLOTS names only proxy ports, masters and replicas.
        let map = cluster.slot_map(&cluster.nodes()[0]);
        assert_eq!(map.len(), 3);
        for r in &map {
            assert!(proxy_ports.contains(&r.master), "{map:?}");
            assert_eq!(r.replicas.len(), 1);
            assert!(proxy_ports.contains(&r.replicas[0]), "{map:?}");
        }
        // A write through the owner's proxy replicates (through the proxy).
        let key = "proxied";
        let owner = cluster.master_of_slot(cluster.slot_of(key));
        let proxy = cluster.proxy_of(owner);
        let via_proxy = redis::Client::open(proxy.url()).unwrap();
        let mut conn = via_proxy
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("v")
            .query(&mut conn)
            .unwrap();
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query(&mut conn)
            .unwrap();
        assert_eq!(acked, 1);
        let replica = cluster.replicas_of(owner)[0];
        let mut replica_conn = replica.conn();
        let _: () = redis::cmd("READONLY").query(&mut replica_conn).unwrap();
        let got: String = redis::cmd("GET").arg(key).query(&mut replica_conn).unwrap();
        assert_eq!(got, "v");
        assert_eq!(
            replica.info_field("replication", "master_port"),
            proxy.port().to_string(),
            "the replica follows its master through the proxy"
        );
        // Redirections name the proxies.
        let other = cluster
            .masters()
            .into_iter()
            .find(|m| !std::ptr::eq(*m, owner))
            .unwrap();
        match other.raw(&["GET", key]) {
            Resp::Error(e) => assert!(e.ends_with(&format!(":{}", proxy.port())), "{e}"),
            r => panic!("expected MOVED, got {r:?}"),
        }
        assert!(std::ptr::eq(cluster.node_by_port(proxy.port()), owner));
        // A restarted node still announces its proxy.
        replica.restart();
        cluster.wait_ready();
        assert_eq!(cluster.slot_map(replica), map);
    }

    /// A watched server: kill, pause and resume act on the server itself,
    /// `stop` and `restart` work as for a plain one.
    #[test]
    fn watched_server_lifecycle() {
        let server = RedisServer::start_inner(&[], true, free_port);
        let pid = server.pid().expect("running");
        let reported = server.info_field("server", "process_id");
        assert_eq!(reported, pid.to_string(), "pid() is the server's own pid");
        server.pause();
        assert!(!server.ping(Duration::from_millis(200)));
        server.resume();
        assert!(server.ping(Duration::from_secs(5)));
        server.stop();
        assert!(!server.is_running());
        assert!(server.dir().exists(), "stop keeps the dir for a restart");
        server.restart();
        assert!(server.is_running());
        assert_ne!(server.pid(), Some(pid));
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query(&mut server.conn())
            .unwrap();
        server.kill();
        assert!(!server.is_running());
        assert!(!server.ping(Duration::from_millis(200)));
        assert!(server.dir().exists(), "kill keeps the dir for a restart");
        server.restart();
        assert_eq!(server.cmd(&["GET", "k"]), "", "restart starts empty");
        let dir = server.dir().to_owned();
        drop(server);
        assert!(!dir.exists());
    }

    /// Helper of [`cluster_dies_with_its_process`]: in a child process,
    /// starts a cluster held in a `static`, prints its nodes, and ends the
    /// process as [`CHILD_ENV`] says (`kill`: SIGKILL itself, `exit`:
    /// `process::exit`, `panic`: the test panics) — never dropping it.
    #[test]
    #[ignore = "run in a child process by cluster_dies_with_its_process"]
    fn cluster_child_process() {
        let Ok(how) = std::env::var(CHILD_ENV) else {
            return;
        };
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        let cluster = CLUSTER.get_or_init(|| Cluster::start(3, 0));
        let mut out = std::io::stdout().lock();
        for n in cluster.nodes() {
            let pid = n.pid().expect("running");
            writeln!(out, "NODE {} {pid} {}", n.port(), n.dir().display()).unwrap();
        }
        out.flush().unwrap();
        drop(out);
        // A killed node's dir must go too (no wrapper watches it any more).
        cluster.kill_node(&cluster.nodes()[0]);
        match how.as_str() {
            "kill" => {
                let me = std::process::id().to_string();
                let _ = Command::new("kill").args(["-KILL", &me]).status();
                unreachable!("still alive after SIGKILL");
            }
            "exit" => std::process::exit(0),
            _ => panic!("child panics on purpose, leaving its cluster in a static"),
        }
    }

    /// The servers of a cluster held in a `static` (never dropped) die, and
    /// their temp dirs go (also the dir of a node killed before), when the
    /// test process ends by SIGKILL, by `process::exit` or by a failing
    /// test.
    #[test]
    fn cluster_dies_with_its_process() {
        let exe = std::env::current_exe().expect("current_exe");
        let scratch = std::env::temp_dir().join(format!(
            "redlease-testkit-child-{}-{}",
            std::process::id(),
            random_u64()
        ));
        fs::create_dir_all(&scratch).unwrap();
        struct RemoveOnDrop<'a>(&'a std::path::Path);
        impl Drop for RemoveOnDrop<'_> {
            fn drop(&mut self) {
                let _ = fs::remove_dir_all(self.0);
            }
        }
        let _cleanup = RemoveOnDrop(&scratch);
        let children: Vec<_> = ["kill", "exit", "panic"]
            .into_iter()
            .map(|how| {
                let out_path = scratch.join(format!("{how}.out"));
                let child = Command::new(&exe)
                    .args(["--exact", "cluster::tests::cluster_child_process"])
                    .args(["--ignored", "--nocapture", "--test-threads", "1"])
                    .env(CHILD_ENV, how)
                    .stdin(Stdio::null())
                    .stdout(File::create(&out_path).unwrap())
                    .stderr(File::create(scratch.join(format!("{how}.err"))).unwrap())
                    .spawn()
                    .expect("spawn the test binary");
                (how, child, out_path)
            })
            .collect();
        let mut nodes = Vec::new();
        for (how, mut child, out_path) in children {
            let mut status = None;
            crate::wait_until(
                &format!("the {how} child process to end"),
                Duration::from_secs(60),
                || {
                    status = child.try_wait().unwrap();
                    status.is_some()
                },
            );
            let out = fs::read_to_string(&out_path).unwrap();
            let lines: Vec<(u16, u32, String)> = out
                .lines()
                .filter_map(|l| {
                    // The harness may print "test ... " on the same line.
                    let mut f = l[l.find("NODE ")? + 5..].splitn(3, ' ');
                    let port = f.next()?.parse().ok()?;
                    let pid = f.next()?.parse().ok()?;
                    Some((port, pid, f.next()?.to_owned()))
                })
                .collect();
            assert_eq!(
                lines.len(),
                3,
                "{how} child ({status:?}) printed {out:?}, stderr: {}",
                fs::read_to_string(scratch.join(format!("{how}.err"))).unwrap_or_default()
            );
            nodes.extend(lines);
        }
        crate::wait_until(
            "the servers of the ended child processes to be gone",
            Duration::from_secs(10),
            || {
                nodes.iter().all(|(port, pid, dir)| {
                    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], *port));
                    !crate::ping(addr, Duration::from_millis(200))
                        && crate::signal(*pid, "0").is_err()
                        && !std::path::Path::new(dir).exists()
                })
            },
        );
    }
}
