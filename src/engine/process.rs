//! What a client publishes about its process, so that the holders of a lock
//! can be told apart by more than a UUID: a hash of its own,
//! `redlease_client:{<short id>}` (see `scripts::process_key_name`), with the
//! host name, the process id, the application's name and the client's start,
//! and a lease. The watchdog writes it when the client first holds
//! something, and writes it again every third of its lease while the client
//! lives; nothing of it is per lock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The process key's fields.
pub(crate) mod field {
    /// The client's full id (`Client::id`).
    pub(crate) const ID: &str = "id";
    pub(crate) const HOST: &str = "host";
    pub(crate) const PID: &str = "pid";
    /// The application's name (`ClientBuilder::name`); absent without one.
    pub(crate) const NAME: &str = "name";
    /// When the client was made, in ms since the Unix epoch.
    pub(crate) const STARTED: &str = "started";
    /// The crate's version.
    pub(crate) const VERSION: &str = "version";
}

/// The process key of one client and what it holds.
pub(crate) struct Announce {
    pub(crate) key: String,
    pub(crate) fields: Vec<(&'static str, String)>,
    pub(crate) lease_ms: u64,
}

impl Announce {
    /// The record of the client `id` (its process key `key`), named `name`,
    /// made at `started`, kept for `lease_ms` after each write.
    pub(crate) fn new(
        key: String,
        id: &str,
        name: Option<&str>,
        started: SystemTime,
        lease_ms: u64,
    ) -> Announce {
        let started_ms = started
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis();
        let mut fields = vec![
            (field::ID, id.to_owned()),
            (field::HOST, host_name()),
            (field::PID, std::process::id().to_string()),
            (field::STARTED, started_ms.to_string()),
            (field::VERSION, env!("CARGO_PKG_VERSION").to_owned()),
        ];
        if let Some(name) = name {
            fields.push((field::NAME, name.to_owned()));
        }
        Announce {
            key,
            fields,
            lease_ms,
        }
    }

    /// How often it is written again: a third of its lease, at least every
    /// 50 ms.
    pub(crate) fn every(&self) -> Duration {
        Duration::from_millis((self.lease_ms / 3).max(50))
    }
}

/// The machine's host name, as well as the standard library and the
/// operating system's files tell it without a system call of our own
/// (`"unknown"` when none does).
fn host_name() -> String {
    let from_file = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    from_file("/proc/sys/kernel/hostname")
        .or_else(|| from_file("/etc/hostname"))
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}
