//! Connection setup against real redis-server: a refused `AUTH` or `SELECT`, or a server that
//! is not Redis, is an `Error::Config` returned at once (from `build`, or from a lock call that
//! cannot reach a quorum without the misconfigured nodes), and no lock command is ever sent on
//! a connection whose setup has not been answered.

mod common;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::{ServerErrorKind, Value};
use redlock_mux::{Client, ClientBuilder, Error, NodeErrorKind, NodeFailure};

const TTL: Duration = Duration::from_secs(30);
/// A config error must come long before this: it is never waited out.
const WAIT: Duration = Duration::from_secs(20);
/// "At once", generously, for a loaded machine.
const AT_ONCE: Duration = Duration::from_secs(5);

fn builder(urls: impl IntoIterator<Item = String>) -> ClientBuilder {
    Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(20))
        .wait_timeout(WAIT)
}

/// Builds a client for `url` and, if that works, waits for a lock with it.
fn build_and_lock(url: String) -> (Result<(), Error>, Duration) {
    let start = Instant::now();
    let r = builder([url])
        .build()
        .and_then(|c| c.lock("setup:key", TTL).map(drop));
    (r, start.elapsed())
}

/// Checks for a while that `dbsize` stays zero: a command sent late would show up.
fn stays_empty(what: &str, dbsize: impl Fn() -> i64) {
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        let n = dbsize();
        assert_eq!(n, 0, "{what}: {n} keys written although the setup failed");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The one setup failure of a config error, with the command that failed.
fn setup_failure(r: Result<(), Error>, elapsed: Duration) -> (NodeFailure, &'static str) {
    let e = r.expect_err("a setup error must fail the call");
    assert!(e.is_config(), "expected Error::Config, got {e:?} ({e})");
    assert!(!e.is_contended(), "{e}");
    assert!(
        elapsed < AT_ONCE,
        "the config error took {elapsed:?}: it must not be waited out"
    );
    let Error::Config { failures } = &e else {
        unreachable!()
    };
    let [f] = failures.as_slice() else {
        panic!("expected one failure, got {failures:?}");
    };
    let NodeErrorKind::Setup { command, .. } = &f.kind else {
        panic!("expected a Setup failure, got {:?}", f.kind);
    };
    assert!(e.to_string().contains(&f.addr), "{e}");
    (f.clone(), command)
}

fn server_error_kind(f: &NodeFailure) -> ServerErrorKind {
    match &f.kind {
        NodeErrorKind::Setup { cause, .. } => match &**cause {
            NodeErrorKind::Server { kind, .. } => *kind,
            other => panic!("expected a server error, got {other:?}"),
        },
        other => panic!("expected a Setup failure, got {other:?}"),
    }
}

#[test]
fn a_password_for_a_server_without_one_is_a_config_error_and_writes_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let addr = server.addr();
    let (r, elapsed) = build_and_lock(format!("redis://:secret@{addr}"));
    stays_empty("db 0", || dbsize(addr));
    let (f, command) = setup_failure(r, elapsed);
    assert_eq!(command, "AUTH");
    assert_eq!(server_error_kind(&f), ServerErrorKind::Err);
}

#[test]
fn a_wrong_password_is_a_config_error_and_writes_nothing() {
    let server = RedisServer::start_with(&["--requirepass", "pw"]).expect("start redis-server");
    let addr = server.addr();
    let (r, elapsed) = build_and_lock(format!("redis://:nope@{addr}"));
    let authed_dbsize = || match cmd_auth(addr, "pw", &[b"DBSIZE"]) {
        Value::Integer(n) => n,
        other => panic!("DBSIZE: {}", show(&other)),
    };
    stays_empty("db 0", authed_dbsize);
    let (f, command) = setup_failure(r, elapsed);
    assert_eq!(command, "AUTH");
    assert_eq!(server_error_kind(&f), ServerErrorKind::WrongPass);
}

#[test]
fn a_database_the_server_does_not_have_is_a_config_error_and_writes_nothing() {
    // A default server has databases 0 to 15.
    let server = RedisServer::start().expect("start redis-server");
    let addr = server.addr();
    let (r, elapsed) = build_and_lock(format!("redis://{addr}/16"));
    stays_empty("db 0", || dbsize(addr));
    let (f, command) = setup_failure(r, elapsed);
    assert_eq!(command, "SELECT");
    assert_eq!(server_error_kind(&f), ServerErrorKind::Err);
    assert!(f.kind.to_string().contains("DB index"), "{}", f.kind);
}

#[test]
fn a_server_that_is_not_redis_is_a_config_error_and_gets_no_lock_command() {
    // Answers everything as a web server would: not RESP at all.
    let fake =
        FakeServer::start(|_| FakeReply::Bytes(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()))
            .expect("fake server");
    let (r, elapsed) = build_and_lock(fake.url());
    let (f, _) = setup_failure(r, elapsed);
    match &f.kind {
        NodeErrorKind::Setup { cause, .. } => {
            assert!(matches!(**cause, NodeErrorKind::Protocol(_)), "{cause:?}")
        }
        other => panic!("{other:?}"),
    }
    for command in fake.commands() {
        let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
        assert!(
            ["AUTH", "SELECT", "SCRIPT", "INFO", "COMMAND"].contains(&name.as_str()),
            "{name} was sent before the setup was answered"
        );
    }
}

/// Makes `addr` (with password `pw`) drop its password and every client connection, so the
/// client's next connect sends an `AUTH` that the server refuses.
fn drop_password_and_clients(addr: SocketAddr) {
    let replies = cmds(
        addr,
        &[
            &[b"AUTH", b"pw"],
            &[b"CONFIG", b"SET", b"requirepass", b""],
            &[b"CLIENT", b"KILL", b"TYPE", b"normal"],
        ],
    );
    assert_eq!(
        replies[1],
        Value::Simple(b"OK".to_vec()),
        "{}",
        show(&replies[1])
    );
}

#[test]
fn a_setup_error_on_reconnect_fails_at_once_only_without_a_quorum() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--requirepass", "pw"]).expect("start redis-server"))
        .collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let client = builder(addrs.iter().map(|a| format!("redis://:pw@{a}")))
        .build()
        .expect("client");
    let held = |addr: SocketAddr| match cmd_auth(addr, "pw", &[b"DBSIZE"]) {
        Value::Integer(n) => n,
        other => panic!("DBSIZE: {}", show(&other)),
    };

    // Node 0 loses its password and the client's connections: every reconnect is refused.
    // Two nodes are still enough, so locks keep working, and node 0 never gets a key.
    drop_password_and_clients(addrs[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..20 {
        assert!(Instant::now() < deadline, "20 locks took too long");
        let lock = client
            .lock(format!("setup:{i}"), TTL)
            .unwrap_or_else(|e| panic!("lock {i}: two nodes still make a quorum: {e}"));
        assert_eq!(dbsize(addrs[0]), 0, "lock {i} wrote to node 0");
        lock.release().expect("release");
        thread::sleep(Duration::from_millis(15));
    }
    stays_empty("node 0", || dbsize(addrs[0]));

    // Node 1 too: no quorum is possible any more, and that is reported at once.
    drop_password_and_clients(addrs[1]);
    let start = Instant::now();
    let r = client.lock("setup:last", TTL).map(drop);
    let elapsed = start.elapsed();
    stays_empty("node 0", || dbsize(addrs[0]));
    stays_empty("node 1", || dbsize(addrs[1]));
    let e = r.expect_err("no quorum without nodes 0 and 1");
    assert!(e.is_config(), "expected Error::Config, got {e:?} ({e})");
    assert!(elapsed < AT_ONCE, "the config error took {elapsed:?}");
    let mut nodes: Vec<usize> = e.failures().iter().map(|f| f.node).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, [0, 1], "{e}");
    assert!(e.failures().iter().all(|f| matches!(
        f.kind,
        NodeErrorKind::Setup {
            command: "AUTH",
            ..
        }
    )));
    // The node that works holds nothing either: the attempt's cleanup reached it.
    assert!(
        eventually(Duration::from_secs(2), || held(addrs[2]) == 0),
        "a key was left on node 2"
    );
}
