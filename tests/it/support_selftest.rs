//! Self-test for the integration-test support module (`tests/support`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::{free_port, free_port_from, ping, wait_until, Proxy, RedisServer, Resp};

const SHORT: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(5);

/// A typed connection through `url` with a short read timeout.
fn conn_to(url: &str, read_timeout: Duration) -> redis::Connection {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(WAIT)
        .unwrap();
    conn.set_read_timeout(Some(read_timeout)).unwrap();
    conn
}

fn redis_ping(conn: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(conn)
}

#[test]
fn start_ping_and_admin_helpers() {
    let srv = RedisServer::start();
    assert!(srv.is_running());
    assert!(srv.ping(SHORT));
    assert_eq!(srv.url(), format!("redis://127.0.0.1:{}/", srv.port()));
    assert_eq!(srv.addr().port(), srv.port());
    assert!(srv.log_path().exists());

    assert_eq!(srv.cmd(&["PING"]), "PONG");
    assert_eq!(srv.cmd(&["SET", "k", "v"]), "OK");
    assert_eq!(srv.cmd(&["GET", "k"]), "v");
    assert_eq!(srv.cmd(&["GET", "missing"]), "");
    assert_eq!(srv.cmd(&["INCR", "n"]), "1");

    let mut conn = srv.conn();
    let v: String = redis::cmd("GET").arg("k").query(&mut conn).unwrap();
    assert_eq!(v, "v");

    let before = srv.info_stat("total_commands_processed");
    assert!(before > 0);
    assert_eq!(srv.raw(&["PING"]), Resp::Simple("PONG".into()));
    // +1 for the previous INFO, +1 for the PING.
    assert_eq!(srv.info_stat("total_commands_processed"), before + 2);

    // The typed connection is a normal client; the raw admin one skips itself.
    assert!(srv.client_kill_type("normal") >= 1);
    assert!(redis_ping(&mut conn).is_err());
    assert_eq!(srv.client_kill_type("pubsub"), 0);

    srv.client_pause(10_000, true);
    assert_eq!(srv.cmd(&["GET", "k"]), "v"); // reads still served
    srv.client_unpause();
    assert_eq!(srv.cmd(&["SET", "k", "w"]), "OK");
}

#[test]
fn kill_restart_stop_on_same_port() {
    let srv = RedisServer::start();
    let port = srv.port();
    srv.cmd(&["SET", "k", "v"]);

    srv.kill();
    assert!(!srv.is_running());
    assert!(!srv.ping(SHORT));

    srv.restart();
    assert!(srv.is_running());
    assert_eq!(srv.port(), port);
    assert!(srv.ping(SHORT));
    assert_eq!(
        srv.cmd(&["GET", "k"]),
        "",
        "restart must give an empty dataset"
    );

    srv.cmd(&["SET", "k", "v"]);
    srv.stop();
    assert!(!srv.is_running());
    srv.restart();
    assert_eq!(srv.cmd(&["GET", "k"]), "");

    // restart() of a running server kills it first.
    let pid = srv.pid();
    srv.restart();
    assert_ne!(srv.pid(), pid);
    assert!(srv.ping(SHORT));
}

#[test]
fn pause_and_resume() {
    let srv = RedisServer::start();
    // Connect first: the redis crate's connection handshake itself would
    // time out against a paused server.
    let mut conn = conn_to(&srv.url(), SHORT);
    srv.pause();
    assert!(srv.is_paused());
    assert!(srv.is_running());
    let t = Instant::now();
    assert!(
        redis_ping(&mut conn).is_err(),
        "PING must time out while paused"
    );
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert!(!srv.ping(SHORT));

    srv.resume();
    assert!(!srv.is_paused());
    let mut conn = conn_to(&srv.url(), SHORT);
    assert_eq!(redis_ping(&mut conn).unwrap(), "PONG");
    // Drop while paused must not hang or panic.
    srv.pause();
}

#[test]
fn proxy_forwards_and_delays() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    assert_eq!(proxy.upstream(), srv.addr());

    let mut conn = conn_to(&proxy.url(), WAIT);
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("via-proxy")
        .query(&mut conn)
        .unwrap();
    assert_eq!(srv.cmd(&["GET", "k"]), "via-proxy");
    assert_eq!(proxy.connections_total(), 1);
    assert_eq!(proxy.connections_open(), 1);

    proxy.set_delay(Duration::from_millis(60));
    let t = Instant::now();
    assert_eq!(redis_ping(&mut conn).unwrap(), "PONG");
    assert!(
        t.elapsed() >= Duration::from_millis(120),
        "{:?}",
        t.elapsed()
    );
    proxy.set_delay(Duration::ZERO);

    drop(conn);
    wait_until("proxy pair to close", WAIT, || {
        proxy.connections_open() == 0
    });
}

#[test]
fn proxy_cut() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let mut a = conn_to(&proxy.url(), WAIT);
    let mut b = conn_to(&proxy.url(), WAIT);
    assert_eq!(redis_ping(&mut a).unwrap(), "PONG");
    assert_eq!(redis_ping(&mut b).unwrap(), "PONG");

    assert_eq!(proxy.cut(), 2);
    assert!(redis_ping(&mut a).is_err());
    assert!(redis_ping(&mut b).is_err());

    let mut c = conn_to(&proxy.url(), WAIT);
    assert_eq!(redis_ping(&mut c).unwrap(), "PONG");
    assert_eq!(proxy.connections_total(), 3);
}

#[test]
fn proxy_stall_holds_bytes_back() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());

    let mut raw = TcpStream::connect(proxy.addr()).unwrap();
    raw.set_read_timeout(Some(SHORT)).unwrap();
    raw.write_all(b"PING\r\n").unwrap();
    let mut buf = [0u8; 7];
    raw.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n");

    proxy.stall(true);
    raw.write_all(b"PING\r\n").unwrap();
    assert!(
        raw.read(&mut buf).is_err(),
        "nothing may flow while stalled"
    );
    // New connections are accepted but stall too.
    assert!(!ping(proxy.addr(), SHORT));

    proxy.stall(false);
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n", "held-back request must be delivered");
    assert!(ping(proxy.addr(), WAIT));

    // Dropping a stalled proxy with bytes in flight must not hang.
    proxy.stall(true);
    raw.write_all(b"PING\r\n").unwrap();
    let t = Instant::now();
    drop(proxy);
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn proxy_cut_after_request_loses_reply_only() {
    let srv = RedisServer::start();
    let proxy = Proxy::start(srv.addr());
    let mut conn = conn_to(&proxy.url(), WAIT);
    assert_eq!(redis_ping(&mut conn).unwrap(), "PONG");

    proxy.cut_after_request(b"lost-key");
    assert!(proxy.armed());
    let res: redis::RedisResult<()> = redis::cmd("SET").arg("lost-key").arg("1").query(&mut conn);
    assert!(res.is_err(), "reply must be lost, got {res:?}");
    assert!(!proxy.armed());
    wait_until("SET to reach redis", WAIT, || {
        srv.cmd(&["GET", "lost-key"]) == "1"
    });

    // One-shot: the same request goes through on a new connection.
    let mut conn = conn_to(&proxy.url(), WAIT);
    let res: redis::RedisResult<()> = redis::cmd("SET").arg("lost-key").arg("2").query(&mut conn);
    res.unwrap();
    assert_eq!(srv.cmd(&["GET", "lost-key"]), "2");

    proxy.cut_after_request(b"never-sent");
    proxy.disarm();
    assert!(!proxy.armed());
}

#[test]
fn free_port_is_bindable() {
    let port = free_port();
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
}

/// A server's extra port (here a cluster bus port) found taken when the
/// server binds it: the next attempt takes other ports, and the server
/// starts on them.
#[test]
fn an_extra_port_taken_before_the_server_binds_it_is_replaced() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_port = taken.local_addr().expect("local_addr").port();
    let attempts = std::cell::Cell::new(0);
    let (srv, ports) = RedisServer::start_with_ports(1, |ports| {
        attempts.set(attempts.get() + 1);
        // The first attempt's port is taken by the listener above.
        let bus = if attempts.get() == 1 {
            taken_port
        } else {
            ports[0]
        };
        [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus.to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    });
    assert!(attempts.get() >= 2, "the taken port was not tried first");
    assert_ne!(ports[0], taken_port);
    assert_eq!(srv.cmd(&["PING"]), "PONG");
    drop(taken);
}

/// A port the kernel gives again is not handed out twice: the second of
/// two ports asked for at once (a sentinel group's, a server's TLS and bus
/// ports) is another one.
#[test]
fn free_port_never_hands_out_a_port_twice() {
    let port = free_port();
    let mut again = 2;
    let next = free_port_from(&mut || {
        if again > 0 {
            again -= 1;
            port
        } else {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("local_addr").port()
        }
    });
    assert_eq!(again, 0, "the port given again was asked for");
    assert_ne!(next, port, "{port} handed out twice");
}

#[test]
#[should_panic(expected = "timed out after 20ms waiting for the impossible")]
fn wait_until_times_out() {
    wait_until("the impossible", Duration::from_millis(20), || false);
}
