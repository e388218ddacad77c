//! Production connections: TLS (server-verified and mutual), `#insecure`,
//! and ACL users, against redis-servers started here with certificates made
//! at test time.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

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
    let tls_port = free_port();
    let srv = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-ca-cert-file",
        ca.to_str().unwrap(),
        "--tls-auth-clients",
        if mutual { "yes" } else { "no" },
    ]);
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

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(" <- ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

// ---------------------------------------------------------------------------
// ACL
// ---------------------------------------------------------------------------

/// The README's minimal rule for a lock user whose locks are named
/// `orders:*` (keep in sync with the README).
const LOCKER_RULE: &str = "on >lockpw resetkeys ~orders:* ~redisson_lock__channel:* \
    ~redisson_unlock_latch:* ~redlease_acquire_cancel:* ~redlease_force_unlock_latch:* \
    resetchannels &redisson_lock__channel:* -@all +eval +evalsha +exists +get +set +del \
    +hset +hget +hmget +hexists +hdel +pexpire +pttl +publish +subscribe +unsubscribe +ping \
    +role +wait";

fn acl(srv: &RedisServer, user: &str, rule: &str) {
    let mut args = vec!["ACL", "SETUSER", user];
    args.extend(rule.split_whitespace());
    let out = srv.cmd(&args);
    assert_eq!(out.trim(), "OK", "ACL SETUSER {user}: {out}");
}

fn url_as(srv: &RedisServer, user: &str, pw: &str) -> String {
    format!("redis://{user}:{pw}@127.0.0.1:{}/", srv.port())
}

/// Lock, re-entry, wait/wake, watchdog and force_unlock as the README's
/// minimal user.
#[test]
fn readme_acl_rule_runs_every_operation() {
    let srv = RedisServer::start();
    acl(&srv, "locker", LOCKER_RULE);
    let client = || {
        Client::builder(url_as(&srv, "locker", "lockpw"))
            .watchdog_timeout(Duration::from_millis(900))
            .build()
            .expect("the minimal user connects")
    };
    let a = client();
    let b = client();
    let lock = a.lock("orders:1");
    let g = lock.lock().unwrap();
    let again = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_locked().unwrap());
    assert!(lock.remaining_lease().unwrap().is_some());
    drop(again);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2000) {
        thread::sleep(Duration::from_millis(100));
        g.ensure_held().expect("renewed as the minimal user");
    }
    // A waiter on the other client, woken by the release.
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let r = b.lock("orders:1").try_lock_for(Duration::from_secs(20));
        tx.send(r.map(|g| g.is_some())).unwrap();
        b
    });
    wait_until("the waiter to subscribe", Duration::from_secs(10), || {
        a.stats().subscribed_channels == 0
            && srv.subscribers("redisson_lock__channel:{orders:1}") == 1
    });
    g.unlock().unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("waiter ended");
    assert!(
        got.expect("no error as the minimal user"),
        "the waiter acquired"
    );
    let b = waiter.join().unwrap();
    let _held = a
        .lock("orders:2")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    assert!(b.lock("orders:2").force_unlock().unwrap());
    assert!(!a.lock("orders:2").is_locked().unwrap());
}

/// A wrong password is an `is_auth()` error at once, from `build()` and
/// from the first call of a lazily built client, never a pool timeout.
#[test]
fn wrong_password_is_an_auth_error_at_once() {
    let srv = RedisServer::start();
    acl(&srv, "locker", LOCKER_RULE);
    let bad = url_as(&srv, "locker", "wrong");
    let started = Instant::now();
    let err = Client::builder(bad.as_str())
        .connection_timeout(Duration::from_secs(5))
        .build()
        .expect_err("a wrong password must fail");
    let took = started.elapsed();
    eprintln!("wrong password, build() ({took:?}): {}", error_chain(&err));
    assert!(err.is_auth(), "{err:?}");
    assert!(!err.is_connection_error(), "{err:?}");
    assert!(
        took < Duration::from_millis(100),
        "at once, not after 5 s ({took:?})"
    );
    assert!(
        error_chain(&err).contains("WRONGPASS"),
        "what redis said is kept: {}",
        error_chain(&err)
    );

    let lazy = Client::builder(bad.as_str())
        .connection_timeout(Duration::from_secs(5))
        .build_lazy()
        .expect("build_lazy opens no connection");
    for i in 0..3 {
        let started = Instant::now();
        let err = lazy
            .lock("orders:1")
            .try_lock()
            .expect_err("wrong password");
        let took = started.elapsed();
        assert!(err.is_auth(), "call {i}: {err:?}");
        assert!(
            took < Duration::from_millis(100),
            "call {i} at once ({took:?})"
        );
    }
    // An unknown user too.
    let err = Client::open(url_as(&srv, "nobody", "x")).expect_err("unknown user");
    assert!(err.is_auth(), "{err:?}");
}

/// A user without the lock's keys, or without the release channel, gets
/// `is_auth()` errors, not a hang.
#[test]
fn missing_permissions_are_auth_errors() {
    let srv = RedisServer::start();
    acl(&srv, "locker", LOCKER_RULE);
    let c = Client::builder(url_as(&srv, "locker", "lockpw"))
        .connection_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // A lock name outside ~orders:*.
    let started = Instant::now();
    let err = c.lock("invoices:1").lock().expect_err("key not granted");
    assert!(err.is_auth(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "at once");
    eprintln!("key not granted: {}", error_chain(&err));

    // The channel not granted: taking a free lock works, waiting for a
    // busy one fails at the SUBSCRIBE, and releasing changes nothing.
    acl(
        &srv,
        "nochan",
        &LOCKER_RULE
            .replace(">lockpw", ">pw")
            .replace("&redisson_lock__channel:*", ""),
    );
    let holder = Client::open(url_as(&srv, "locker", "lockpw")).unwrap();
    let held = holder
        .lock("orders:busy")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    let n = Client::builder(url_as(&srv, "nochan", "pw"))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = n
        .lock("orders:busy")
        .try_lock_for(Duration::from_secs(20))
        .expect_err("cannot wait without the channel");
    assert!(err.is_auth(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "no hang");
    eprintln!("channel not granted, waiting: {}", error_chain(&err));
    drop(held);

    let g = n
        .lock("orders:free")
        .lock()
        .expect("a free lock needs no channel");
    let err = g.unlock().expect_err("the release publishes");
    assert!(err.is_auth(), "{err:?}");
    eprintln!("channel not granted, releasing: {}", error_chain(&err));
    assert!(
        n.lock("orders:free").is_locked().unwrap(),
        "a release that failed changed nothing"
    );
}
