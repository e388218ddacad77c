//! The wiring of a topology from the builder's settings: one server, the
//! master of a Sentinel group, or a Redis Cluster, each made into a
//! [`Router`] over its nodes. The builder checks the settings it owns; what
//! an address or a seed list means is decided here.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::events::Events;
use crate::net::cluster::{Cluster, NodeSettings, PubSubMode};
use crate::net::node::Node;
use crate::net::pool::{Counters, PoolSettings, Redis, SyncReplicas, Threads};
use crate::net::pubsub::PubSub;
use crate::net::router::Router;
use crate::net::target::{Sentinel, Target};
use crate::net::transport::{Endpoint, TlsOptions};

/// Which servers a client is for: one url, a Sentinel group, or a Cluster's
/// seeds (the last two set by their builders; `info` is then an error that
/// says no url was given).
pub(crate) struct Servers {
    pub(crate) info: redis::RedisResult<redis::ConnectionInfo>,
    pub(crate) sentinel: Option<SentinelSettings>,
    pub(crate) cluster: Option<ClusterSettings>,
}

/// What `sentinel_builder` took.
pub(crate) struct SentinelSettings {
    pub(crate) sentinels: Vec<redis::RedisResult<redis::ConnectionInfo>>,
    pub(crate) master_name: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

/// Each address parsed (errors kept, reported by `build()`).
pub(crate) fn connection_infos<I>(addresses: I) -> Vec<redis::RedisResult<redis::ConnectionInfo>>
where
    I: IntoIterator,
    I::Item: redis::IntoConnectionInfo,
{
    addresses
        .into_iter()
        .map(redis::IntoConnectionInfo::into_connection_info)
        .collect()
}

/// What `cluster_builder` took.
pub(crate) struct ClusterSettings {
    pub(crate) seeds: Vec<redis::RedisResult<redis::ConnectionInfo>>,
    pub(crate) pubsub: PubSubMode,
}

/// The connection settings every node of the topology gets.
pub(crate) struct Settings {
    pub(crate) tls: TlsOptions,
    pub(crate) pool: PoolSettings,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) retry_attempts: u32,
    pub(crate) sync: SyncReplicas,
    pub(crate) events: Events,
}

/// The router over `servers` with `settings`, and a description of where
/// it connects (no password), for `Debug`. Opens no connection.
///
/// # Errors
///
/// [`Error::InvalidUrl`] or [`Error::InvalidArgument`] for addresses that
/// cannot be used.
pub(crate) fn router(servers: &mut Servers, settings: &Settings) -> Result<(Arc<Router>, String)> {
    let bad_url = |e: redis::RedisError| {
        if cfg!(not(feature = "tls")) && e.to_string().contains("TLS") {
            return Error::InvalidUrl(
                "rediss:// needs the `tls` feature, which this build leaves out".to_owned(),
            );
        }
        // redis-rs says "<what> - <kind>[: <detail>]": the kind tells a
        // reader nothing more.
        let what = e.to_string().replace(&format!(" - {:?}", e.kind()), "");
        Error::InvalidUrl(format!(
            "{what} (expected redis://[user[:password]@]host[:port][/db], rediss://... or \
             redis+unix:///path)"
        ))
    };
    let pool = settings.pool.clone();
    let counters = Arc::new(Counters {
        events: settings.events.clone(),
        ..Counters::default()
    });
    if let Some(c) = servers.cluster.take() {
        if c.seeds.is_empty() {
            return Err(Error::invalid(
                "cluster_builder needs at least one seed node address, got none",
            ));
        }
        let mut seeds = Vec::with_capacity(c.seeds.len());
        let mut template = None;
        for info in c.seeds {
            let info = info.map_err(bad_url)?;
            let at = describe(&info);
            if info.redis_settings().db() != 0 {
                return Err(Error::InvalidUrl(format!(
                    "{at}: a cluster has database 0 only"
                )));
            }
            let endpoint = Endpoint::new(&info, &settings.tls)
                .map_err(|e| Error::InvalidUrl(format!("cluster node {at}: {e}")))?;
            seeds.push(endpoint.addr.clone());
            template.get_or_insert(endpoint);
        }
        let template = template.expect("at least one seed");
        let server = format!(
            "cluster of {} seed node(s) ({})",
            seeds.len(),
            seeds
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let cluster = Cluster::new(
            seeds,
            NodeSettings {
                template,
                pool,
                response_timeout: settings.response_timeout,
                retry_attempts: settings.retry_attempts,
                sync: settings.sync,
                counters: Arc::clone(&counters),
            },
            c.pubsub,
        );
        let router = Arc::new(Router::cluster(
            cluster,
            settings.retry_attempts,
            counters,
            settings.response_timeout,
        ));
        return Ok((router, server));
    }
    let (target, server) = match &servers.sentinel {
        None => {
            let info = servers.info.clone().map_err(bad_url)?;
            let server = describe(&info);
            if info.redis_settings().db() < 0 {
                return Err(Error::InvalidUrl(format!(
                    "{server}: a database number is 0 or more (0 unless the url names \
                     another, as in redis://host:6379/1)"
                )));
            }
            let endpoint = Endpoint::new(&info, &settings.tls)
                .map_err(|e| Error::InvalidUrl(format!("{server}: {e}")))?;
            (Target::Fixed(endpoint), server)
        }
        Some(s) => {
            if s.sentinels.is_empty() {
                return Err(Error::invalid(
                    "sentinel_builder needs at least one sentinel address, got none",
                ));
            }
            if s.master_name.is_empty() {
                return Err(Error::invalid("sentinel master name must not be empty"));
            }
            if s.db < 0 {
                return Err(Error::invalid(format!(
                    "master_db({}): a database number is 0 or more",
                    s.db
                )));
            }
            let mut sentinels = Vec::with_capacity(s.sentinels.len());
            let mut template = None;
            for info in &s.sentinels {
                let info = info.clone().map_err(bad_url)?;
                let at = describe(&info);
                sentinels.push(
                    Endpoint::new(&info, &settings.tls)
                        .map_err(|e| Error::InvalidUrl(format!("sentinel {at}: {e}")))?,
                );
                if template.is_none() {
                    let mut redis = redis::RedisConnectionInfo::default().set_db(s.db);
                    if let Some(u) = &s.username {
                        redis = redis.set_username(u);
                    }
                    if let Some(p) = &s.password {
                        redis = redis.set_password(p);
                    }
                    let data = info.set_redis_settings(redis);
                    template = Some(
                        Endpoint::new(&data, &settings.tls)
                            .map_err(|e| Error::InvalidUrl(format!("{at}: {e}")))?,
                    );
                }
            }
            let template = template.expect("at least one sentinel");
            let server = format!(
                "master {:?} of {} sentinel(s) ({})",
                s.master_name,
                sentinels.len(),
                sentinels
                    .iter()
                    .map(|e| e.addr.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let sentinel = Sentinel::new(
                s.master_name.clone(),
                sentinels,
                template,
                settings.connection_timeout,
                settings.response_timeout,
            );
            (Target::Sentinel(Arc::new(sentinel)), server)
        }
    };
    let redis = Arc::new(Redis::new(
        target.clone(),
        pool,
        settings.response_timeout,
        settings.retry_attempts,
        settings.sync,
        Arc::clone(&counters),
        Threads::default(),
    ));
    let node = Node {
        name: server.clone(),
        pubsub: PubSub::new(
            target.clone(),
            settings.connection_timeout,
            settings.response_timeout,
            None,
            settings.events.clone(),
        ),
        redis,
    };
    if let Target::Sentinel(s) = &target {
        // A new master: drop every pooled connection made before, and
        // have the subscriber move (it wakes its waiters to retry).
        let epoch = node.redis.epoch();
        s.on_change(move |_| {
            epoch.fetch_add(1, Ordering::AcqRel);
        });
        let kick = node.pubsub.kicker();
        s.on_change(move |_| kick());
        let events = settings.events.clone();
        s.on_change(move |to| events.failover(to));
    }
    let router = Arc::new(Router::single(
        node,
        settings.retry_attempts,
        counters,
        settings.response_timeout,
    ));
    Ok((router, server))
}

/// Where a client connects, and as whom, without the password.
pub(crate) fn describe(info: &redis::ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let mut out = match info.addr() {
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{host}:{port}"),
        other => other.to_string(),
    };
    if let Some(user) = settings.username() {
        out = format!("{out} as {user:?}");
    } else if settings.password().is_some() {
        out.push_str(" with a password");
    }
    if settings.db() != 0 {
        out = format!("{out}, db {}", settings.db());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::describe;
    use redis::IntoConnectionInfo;

    #[test]
    fn describes_without_passwords() {
        let d = |url: &str| describe(&url.into_connection_info().unwrap());
        assert_eq!(d("redis://:secret@h:1/0"), "h:1 with a password");
        assert_eq!(d("redis://u:secret@h/2"), "h:6379 as \"u\", db 2");
        // redis-rs parses a rediss:// url only with its TLS feature.
        #[cfg(feature = "tls")]
        assert_eq!(d("rediss://h:7/"), "rediss://h:7");
    }
}
