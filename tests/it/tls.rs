//! TLS (server-verified and mutual) and `#insecure`, against redis-servers
//! started here with certificates made at test time.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error_chain;
use crate::support::{free_port, wait_until, RedisServer};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use redlease::Client;

/// A CA, a server certificate (for 127.0.0.1 and localhost) and a client
/// certificate it signed, as PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn issue(cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().expect("key");
    let mut p =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![usage];
    (p, key)
}

fn pki(name: &str) -> Pki {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, format!("redlease test CA {name}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let (sp, sk) = issue(
        "localhost",
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let server = sp.signed_by(&sk, &ca_cert, &ca_key).expect("server cert");
    let (cp, ck) = issue("redlease client", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let client = cp.signed_by(&ck, &ca_cert, &ca_key).expect("client cert");
    Pki {
        ca: ca_cert.pem(),
        server_cert: server.pem(),
        server_key: sk.serialize_pem(),
        client_cert: client.pem(),
        client_key: ck.serialize_pem(),
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).expect("write pem");
    p
}

/// A server with a plain port (for the test's own admin commands) and a TLS
/// port that wants client certificates when `mutual`.
struct TlsServer {
    srv: RedisServer,
    tls_port: u16,
    pki: Pki,
    _dir: tempdir::Dir,
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!(
                "redlease-pki-{}-{tag}-{}",
                std::process::id(),
                super::free_port()
            ));
            std::fs::create_dir_all(&p).expect("pki dir");
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tls_server(mutual: bool) -> TlsServer {
    let pki = pki("main");
    let dir = tempdir::Dir::new(if mutual { "mtls" } else { "tls" });
    let cert = write(&dir.0, "server.crt", &pki.server_cert);
    let key = write(&dir.0, "server.key", &pki.server_key);
    let ca = write(&dir.0, "ca.crt", &pki.ca);
    let (srv, ports) = RedisServer::start_with_ports(1, |ports| {
        vec![
            "--tls-port".to_owned(),
            ports[0].to_string(),
            "--tls-cert-file".to_owned(),
            cert.to_str().unwrap().to_owned(),
            "--tls-key-file".to_owned(),
            key.to_str().unwrap().to_owned(),
            "--tls-ca-cert-file".to_owned(),
            ca.to_str().unwrap().to_owned(),
            "--tls-auth-clients".to_owned(),
            if mutual { "yes" } else { "no" }.to_owned(),
        ]
    });
    let tls_port = ports[0];
    TlsServer {
        srv,
        tls_port,
        pki,
        _dir: dir,
    }
}

impl TlsServer {
    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// Clients connected to the TLS port.
    fn tls_clients(&self) -> usize {
        let laddr = format!("laddr=127.0.0.1:{} ", self.tls_port);
        self.srv
            .cmd(&["CLIENT", "LIST"])
            .lines()
            .filter(|l| l.contains(&laddr))
            .count()
    }
}

/// Everything over mutual TLS: lock, re-entry, a waiter woken by pub/sub
/// (the holder's lease is long, so only the release message can wake it in
/// time), watchdog renewal across several leases, force_unlock.
#[test]
fn mutual_tls_lock_wait_wake_and_watchdog() {
    let t = tls_server(true);
    let client = || {
        Client::builder(t.url())
            .tls_root_certificate(t.pki.ca.clone())
            .tls_client_identity(t.pki.client_cert.clone(), t.pki.client_key.clone())
            .watchdog_timeout(Duration::from_millis(900))
            .build()
            .expect("mutual TLS client")
    };
    let a = client();
    let b = client();
    let lock = a.lock("tls:orders");
    let g = lock.lock().expect("lock over TLS");
    let again = lock.lock().expect("re-entry over TLS");
    assert_eq!(lock.hold_count().unwrap(), 2);
    drop(again);

    // Watchdog: held across three leases, renewed over TLS.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2700) {
        thread::sleep(Duration::from_millis(100));
        g.ensure_held().expect("renewed over TLS");
    }
    let pttl: i64 = t.srv.cmd(&["PTTL", "tls:orders"]).trim().parse().unwrap();
    assert!(pttl > 0, "the watchdog kept the lease alive (pttl {pttl})");
    assert!(a.stats().renewals >= 3, "{:?}", a.stats());
    drop(g);

    // Wait and wake: the holder takes a 30 s lease; the waiter on another
    // client must be woken by the release message.
    let held = a
        .lock("tls:wake")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let g = b
            .lock("tls:wake")
            .try_lock_for(Duration::from_secs(20))
            .expect("waiter");
        tx.send(Instant::now()).unwrap();
        drop(g);
        b
    });
    wait_until(
        "the waiter to subscribe over TLS",
        Duration::from_secs(10),
        || t.srv.subscribers("redisson_lock__channel:{tls:wake}") == 1,
    );
    let released = Instant::now();
    held.unlock().unwrap();
    let woke = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter acquired after the release");
    let b = waiter.join().unwrap();
    let latency = woke.duration_since(released);
    eprintln!("TLS wake-up after release: {latency:?}");
    assert!(
        latency < Duration::from_secs(5),
        "woken by the release message, not the 30 s lease ({latency:?})"
    );
    // Pool and subscriber connections both went to the TLS port.
    assert!(t.tls_clients() >= 2, "clients on the TLS port");
    assert_eq!(b.stats().subscriber_reconnects, 0);

    let _held = a
        .lock("tls:orders")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    assert!(b.lock("tls:orders").force_unlock().unwrap());
    assert!(!a.lock("tls:orders").is_locked().unwrap());
}

/// A server certificate from a CA the client does not trust: `build()`
/// fails at once with an error that says what to set.
#[test]
fn untrusted_server_certificate_is_a_clear_error() {
    let t = tls_server(false);
    let other = pki("other");
    let started = Instant::now();
    let err = Client::builder(t.url())
        .tls_root_certificate(other.ca)
        .connection_timeout(Duration::from_secs(5))
        .build()
        .expect_err("an untrusted certificate must fail");
    let took = started.elapsed();
    let chain = error_chain(&err);
    eprintln!("untrusted CA ({took:?}): {chain}");
    assert!(chain.contains("tls_root_certificate"), "{chain}");
    assert!(!err.is_auth(), "{err:?}");
    assert!(
        took < Duration::from_secs(5),
        "within the connection timeout ({took:?})"
    );

    // The right CA works, without a client certificate (not required here).
    let ok = Client::builder(t.url())
        .tls_root_certificate(t.pki.ca.clone())
        .build()
        .expect("the right CA");
    ok.lock("x").lock().unwrap().unlock().unwrap();
}

/// A server that wants a client certificate, and a client without one.
#[test]
fn missing_client_certificate_is_a_clear_error() {
    let t = tls_server(true);
    let started = Instant::now();
    let err = Client::builder(t.url())
        .tls_root_certificate(t.pki.ca.clone())
        .connection_timeout(Duration::from_secs(5))
        .build()
        .expect_err("no client certificate must fail");
    let took = started.elapsed();
    let chain = error_chain(&err);
    eprintln!("no client certificate ({took:?}): {chain}");
    assert!(chain.contains("tls_client_identity"), "{chain}");
    assert!(
        took < Duration::from_secs(5),
        "within the connection timeout ({took:?})"
    );
}

/// `#insecure` keeps redis-rs's meaning: no certificate checks at all.
#[test]
fn insecure_fragment_skips_verification() {
    let t = tls_server(false);
    let client = Client::open(format!("rediss://127.0.0.1:{}/#insecure", t.tls_port))
        .expect("#insecure connects without the CA");
    let g = client.lock("insecure").lock().unwrap();
    g.unlock().unwrap();
}

/// TLS settings on a plain url, bad PEM: refused up front.
#[test]
fn bad_tls_settings_are_refused_up_front() {
    let plain = Client::builder("redis://127.0.0.1:1/")
        .tls_root_certificate("not pem")
        .build_lazy()
        .expect_err("certificates with a redis:// url");
    assert!(plain.is_invalid_argument(), "{plain:?}");
    assert!(plain.to_string().contains("rediss://"), "{plain}");
    let pem = Client::builder("rediss://127.0.0.1:1/")
        .tls_root_certificate("not pem")
        .build_lazy()
        .expect_err("bad PEM");
    assert!(pem.is_invalid_argument(), "{pem:?}");
    assert!(pem.to_string().contains("tls_root_certificate"), "{pem}");
    let key = Client::builder("rediss://127.0.0.1:1/")
        .tls_client_identity(pki("k").client_cert, "no key here")
        .build_lazy()
        .expect_err("bad key");
    assert!(key.to_string().contains("tls_client_identity"), "{key}");
}

/// The subscriber's TLS stream is read by its thread while waiters write
/// SUBSCRIBE/UNSUBSCRIBE to it: many waiters on many locks, releases
/// arriving all the while, and no record out of order (the subscriber never
/// has to reconnect) and no waiter stranded.
#[test]
fn tls_subscriber_under_concurrent_subscribes_and_messages() {
    let t = tls_server(false);
    let client = || {
        Client::builder(t.url())
            .tls_root_certificate(t.pki.ca.clone())
            .build()
            .expect("TLS client")
    };
    let holders = client();
    let waiters = client();
    const LOCKS: usize = 8;
    const ROUNDS: usize = 25;
    thread::scope(|s| {
        for l in 0..LOCKS {
            let holders = &holders;
            let waiters = &waiters;
            s.spawn(move || {
                let name = format!("tls:stress:{l}");
                for r in 0..ROUNDS {
                    let held = holders
                        .lock(name.as_str())
                        .lock_with_lease(Duration::from_secs(30))
                        .unwrap();
                    let (tx, rx) = mpsc::channel();
                    let n = name.clone();
                    let waiter = s.spawn(move || {
                        let g = waiters
                            .lock(n.as_str())
                            .try_lock_for(Duration::from_secs(20))
                            .expect("waiter");
                        tx.send(()).unwrap();
                        g.map(|g| g.unlock().unwrap()).is_some()
                    });
                    // Release at different moments relative to the waiter's
                    // SUBSCRIBE.
                    thread::sleep(Duration::from_millis((r % 4) as u64));
                    held.unlock().unwrap();
                    rx.recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|_| panic!("{name} round {r}: waiter stranded"));
                    assert!(waiter.join().unwrap(), "{name} round {r}: acquired");
                }
            });
        }
    });
    let stats = waiters.stats();
    eprintln!("TLS subscriber stress: {stats:?}");
    assert_eq!(stats.subscriber_reconnects, 0, "{stats:?}");
}

/// A 3-master Redis Cluster over mutual TLS (clients and the cluster bus):
/// the slot map read over TLS names the TLS ports, and the client reaches
/// every master through TLS with the one configuration it was built with:
/// locks spread over all masters, a waiter woken through a sharded channel,
/// the watchdog renewing past the lease.
#[test]
fn cluster_over_mutual_tls() {
    let pki = pki("cluster");
    let dir = tempdir::Dir::new("cluster");
    let cert = write(&dir.0, "server.crt", &pki.server_cert);
    let key = write(&dir.0, "server.key", &pki.server_key);
    let client_cert = write(&dir.0, "client.crt", &pki.client_cert);
    let client_key = write(&dir.0, "client.key", &pki.client_key);
    let ca = write(&dir.0, "ca.crt", &pki.ca);
    let path = |p: &PathBuf| p.to_str().expect("utf-8 path").to_owned();
    let nodes: Vec<(RedisServer, u16)> = (0..3)
        .map(|_| {
            let (srv, ports) = RedisServer::start_with_ports(2, |ports| {
                let (tls_port, bus_port) = (ports[0], ports[1]);
                vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    "nodes.conf".to_owned(),
                    "--cluster-node-timeout".to_owned(),
                    "1000".to_owned(),
                    "--cluster-port".to_owned(),
                    bus_port.to_string(),
                    "--tls-port".to_owned(),
                    tls_port.to_string(),
                    "--tls-cluster".to_owned(),
                    "yes".to_owned(),
                    "--tls-cert-file".to_owned(),
                    path(&cert),
                    "--tls-key-file".to_owned(),
                    path(&key),
                    // The bus's outgoing connections present a client
                    // certificate.
                    "--tls-client-cert-file".to_owned(),
                    path(&client_cert),
                    "--tls-client-key-file".to_owned(),
                    path(&client_key),
                    "--tls-ca-cert-file".to_owned(),
                    path(&ca),
                    "--tls-auth-clients".to_owned(),
                    "yes".to_owned(),
                ]
            });
            (srv, ports[0])
        })
        .collect();
    let mut create = std::process::Command::new(crate::support::redis_cli_path());
    create.args([
        "--tls",
        "--cacert",
        &path(&ca),
        "--cert",
        &path(&client_cert),
    ]);
    create.args(["--key", &path(&client_key), "--cluster", "create"]);
    for (_, tls_port) in &nodes {
        create.arg(format!("127.0.0.1:{tls_port}"));
    }
    create.arg("--cluster-yes");
    let out = create
        .stdin(std::process::Stdio::null())
        .output()
        .expect("redis-cli runs");
    assert!(
        out.status.success(),
        "redis-cli --cluster create over TLS: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for (node, _) in &nodes {
        wait_until(
            "the TLS cluster to be ready",
            Duration::from_secs(30),
            || {
                let info = node.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            },
        );
    }
    let client = || {
        Client::cluster_builder([format!("rediss://127.0.0.1:{}/", nodes[0].1)])
            .tls_root_certificate(pki.ca.as_bytes().to_vec())
            .tls_client_identity(
                pki.client_cert.as_bytes().to_vec(),
                pki.client_key.as_bytes().to_vec(),
            )
            .watchdog_timeout(Duration::from_millis(900))
            .build()
            .expect("a client of the TLS cluster")
    };
    let (a, b) = (client(), client());
    let guards: Vec<_> = (0..30)
        .map(|i| a.lock(format!("tls-cluster:{i}")).lock().expect("lock"))
        .collect();
    for (node, tls_port) in &nodes {
        assert_ne!(node.cmd(&["DBSIZE"]), "0", "locks on every master");
        let laddr = format!("laddr=127.0.0.1:{tls_port} ");
        assert!(
            node.cmd(&["CLIENT", "LIST"])
                .lines()
                .any(|l| l.contains(&laddr)),
            "the client reached the master on {tls_port} over TLS"
        );
    }
    // Past the lease: renewed over TLS.
    thread::sleep(Duration::from_millis(1500));
    for g in &guards {
        g.ensure_held().expect("renewed over TLS");
    }
    let (tx, rx) = mpsc::channel();
    let w = b.clone();
    thread::spawn(move || {
        let got = w
            .lock("tls-cluster:0")
            .try_lock_for(Duration::from_secs(20))
            .map(|g| g.is_some());
        tx.send(got).expect("report");
    });
    wait_until("the waiter's subscription", Duration::from_secs(10), || {
        b.stats().subscribed_channels == 2
    });
    let released = Instant::now();
    drop(guards);
    let got = rx.recv_timeout(Duration::from_secs(20)).expect("report");
    assert!(got.expect("no error over TLS"), "the waiter acquired");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken by the release over TLS"
    );
    assert_eq!(a.stats().locks_lost, 0);
}

/// A TLS connection the server closed while it sat idle (`CLIENT KILL`, as
/// a Sentinel does to the old master's clients; the server's `timeout`):
/// Redis sends a close_notify before the end of the stream, and the pool's
/// idle check reads it as closed, so the first call sent at most once (a
/// latch's count-down, a semaphore's added permits) runs on a new
/// connection instead of failing as "may have run". A healthy idle TLS
/// connection (session tickets waiting) is kept.
#[test]
fn an_idle_tls_connection_the_server_closed_is_replaced() {
    let t = tls_server(false);
    let c = Client::builder(t.url())
        .tls_root_certificate(t.pki.ca.clone())
        .pool_size(1)
        .response_timeout(Duration::from_millis(500))
        .build()
        .expect("TLS client");
    // The ids of the clients connected to the TLS port.
    let tls_clients = || -> Vec<String> {
        let laddr = format!("laddr=127.0.0.1:{}", t.tls_port);
        t.srv
            .cmd(&["CLIENT", "LIST", "TYPE", "normal"])
            .lines()
            .filter(|l| l.contains(&laddr))
            .filter_map(|l| l.split(' ').next().map(str::to_owned))
            .collect()
    };
    let latch = c.count_down_latch("tls:idle:latch");
    assert!(latch.try_set_count(5).expect("set the count"));
    let sem = c.semaphore("tls:idle:sem");
    assert!(sem.try_set_permits(1).expect("set the permits"));
    // Idle longer than the pool's idle check (10 ms) asks for, healthy:
    // kept.
    let before = tls_clients();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(latch.count().expect("count"), 5);
    assert_eq!(
        tls_clients(),
        before,
        "a healthy idle TLS connection was replaced"
    );
    // Closed by the server while idle: replaced, and the call runs.
    assert!(
        t.srv.client_kill_type("normal") >= 1,
        "killed the pool's connection"
    );
    thread::sleep(Duration::from_millis(50));
    latch
        .count_down()
        .unwrap_or_else(|e| panic!("count_down on an idle TLS client after CLIENT KILL: {e}"));
    assert_eq!(t.srv.cmd(&["GET", "tls:idle:latch"]), "4");
    assert!(
        t.srv.client_kill_type("normal") >= 1,
        "killed the pool's connection"
    );
    thread::sleep(Duration::from_millis(50));
    sem.add_permits(1)
        .unwrap_or_else(|e| panic!("add_permits on an idle TLS client after CLIENT KILL: {e}"));
    assert_eq!(t.srv.cmd(&["GET", "tls:idle:sem"]), "2");
}
