//! A release is owed to a node until that node has run it, not merely answered: a node that
//! answers after the round was decided, with `NOSCRIPT` (its script cache was flushed) or with
//! a refusal that passes (`BUSY`: a script running), still gets the release, while the client
//! sits idle with no call under way; and `close()` says which nodes it could not reach.
//! Against real redis-server processes.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error};

/// Long, so that a key left behind is still there when the test looks.
const TTL: Duration = Duration::from_secs(30);

/// A script that runs until `SCRIPT KILL` (it writes nothing, so it may be killed).
const SPIN: &[u8] = b"local i = 0 while true do i = i + 1 end";

/// Sends `args` on a connection of its own without reading the reply: for a command that does
/// not answer until later (a script that runs on). The connection is returned, to keep open.
fn send_only(addr: SocketAddr, args: &[&[u8]]) -> TcpStream {
    let mut out = Vec::new();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    let mut conn = TcpStream::connect(addr).expect("connect");
    conn.write_all(&out).expect("send");
    conn
}

fn is_busy(addr: SocketAddr) -> bool {
    matches!(
        try_cmd(addr, &[b"PING"], Duration::from_secs(2)),
        Ok(Value::Error(e)) if e.starts_with(b"BUSY")
    )
}

/// How many error replies of `kind` (`BUSY`, `NOSCRIPT`) the server has given.
fn errors(addr: SocketAddr, kind: &str) -> u64 {
    let Value::Bulk(Some(info)) = cmd(addr, &[b"INFO", b"errorstats"]) else {
        panic!("INFO errorstats");
    };
    let prefix = format!("errorstat_{kind}:count=");
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// `GET key`, or `None` while the server still answers BUSY (a killed script ends at its next
/// check, moments after `SCRIPT KILL` returned).
fn get_unless_busy(addr: SocketAddr, key: &[u8]) -> Option<Option<Vec<u8>>> {
    match cmd(addr, &[b"GET", key]) {
        Value::Bulk(value) => Some(value),
        Value::Error(e) if e.starts_with(b"BUSY") => None,
        other => panic!("GET: {}", show(&other)),
    }
}

/// The server at `addr` runs a script that does not end, answering BUSY to everything else
/// meanwhile (after 20 ms); the connection that runs it, to keep open.
fn make_busy(addr: SocketAddr) -> TcpStream {
    assert_eq!(
        cmd(addr, &[b"CONFIG", b"SET", b"busy-reply-threshold", b"20"]),
        Value::Simple(b"OK".to_vec())
    );
    let spin = send_only(addr, &[b"EVAL", SPIN, b"0"]);
    assert!(
        eventually(Duration::from_secs(5), || is_busy(addr)),
        "the server never got busy"
    );
    spin
}

/// Ends the script [`make_busy`] started.
fn kill_script(addr: SocketAddr) {
    assert_eq!(
        cmd(addr, &[b"SCRIPT", b"KILL"]),
        Value::Simple(b"OK".to_vec())
    );
}

fn ok() -> Value {
    Value::Simple(b"OK".to_vec())
}

fn client(urls: Vec<String>, node_timeout: Duration) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(node_timeout)
        .build()
        .expect("client")
}

#[test]
fn a_release_answered_noscript_after_the_decision_is_sent_again_with_its_body() {
    let servers = RedisCluster::start(3).expect("start redis-server");
    let addrs = servers.addrs();
    let client = client(servers.urls(), Duration::from_millis(200));
    let lock = client.try_lock("noscript", TTL).expect("lock");
    assert_settles!(get(addrs[0], b"noscript").is_some());
    // Node 0 forgets every script, and holds writes for longer than the node timeout: the
    // release returns at the quorum of the other two, and node 0 answers NOSCRIPT after that.
    assert_eq!(cmd(addrs[0], &[b"SCRIPT", b"FLUSH"]), ok());
    assert_eq!(
        cmd(addrs[0], &[b"CLIENT", b"PAUSE", b"600", b"WRITE"]),
        ok()
    );
    let released = Instant::now();
    lock.release()
        .expect("release at the quorum of nodes 1 and 2");
    assert!(released.elapsed() < Duration::from_millis(550));
    for &addr in &addrs[1..] {
        assert_eq!(get(addr, b"noscript"), None);
    }
    // The client sits idle: nothing but the library itself may send the body now.
    let gone = eventually(Duration::from_secs(5), || {
        get(addrs[0], b"noscript").is_none()
    });
    let noscripts = errors(addrs[0], "NOSCRIPT");
    assert!(
        gone,
        "node 0 answered NOSCRIPT {noscripts} time(s) and still holds the released key \
         (PTTL {} ms) 5 s later",
        pttl(addrs[0], b"noscript")
    );
    assert!(noscripts >= 1, "node 0 never answered NOSCRIPT");
    client.close().expect("close with nothing owed");
}

#[test]
fn close_returns_once_a_release_answered_noscript_has_run() {
    let servers = RedisCluster::start(3).expect("start redis-server");
    let addrs = servers.addrs();
    let client = client(servers.urls(), Duration::from_millis(200));
    let lock = client.try_lock("closing", TTL).expect("lock");
    assert_settles!(get(addrs[0], b"closing").is_some());
    assert_eq!(cmd(addrs[0], &[b"SCRIPT", b"FLUSH"]), ok());
    assert_eq!(
        cmd(addrs[0], &[b"CLIENT", b"PAUSE", b"400", b"WRITE"]),
        ok()
    );
    lock.release()
        .expect("release at the quorum of nodes 1 and 2");
    // `close` waits for node 0, which answers NOSCRIPT once the pause ends: an `Ok` must mean
    // that the release ran there.
    let started = Instant::now();
    let outcome = client.close();
    let waited = started.elapsed();
    let left = get(addrs[0], b"closing");
    assert!(
        outcome.is_ok() && left.is_none(),
        "close() returned {outcome:?} after {waited:?}, with the released key still on node 0 \
         (PTTL {} ms, {} NOSCRIPT)",
        pttl(addrs[0], b"closing"),
        errors(addrs[0], "NOSCRIPT")
    );
}

#[test]
fn a_release_refused_busy_is_sent_again_once_the_script_ends() {
    let servers = RedisCluster::start(3).expect("start redis-server");
    let addrs = servers.addrs();
    let client = client(servers.urls(), Duration::from_millis(200));
    let lock = client.try_lock("busy", TTL).expect("lock");
    assert_settles!(get(addrs[0], b"busy").is_some());
    // Node 0 runs a script that does not end, and answers BUSY to everything else meanwhile.
    let _spin = make_busy(addrs[0]);
    lock.release()
        .expect("release at the quorum of nodes 1 and 2");
    for &addr in &addrs[1..] {
        assert_eq!(get(addr, b"busy"), None);
    }
    // The client sits idle while node 0 stays busy for a while, then the script is killed.
    std::thread::sleep(Duration::from_millis(300));
    kill_script(addrs[0]);
    let gone = eventually(Duration::from_secs(5), || {
        get_unless_busy(addrs[0], b"busy") == Some(None)
    });
    // Counting the test's own probes that found it busy.
    let busy = errors(addrs[0], "BUSY");
    assert!(
        gone,
        "node 0 answered BUSY {busy} time(s) and still holds the released key (PTTL {} ms) \
         5 s after the script was killed",
        pttl(addrs[0], b"busy")
    );
    println!("node 0 answered BUSY {busy} time(s), the test's probes included");
    client.close().expect("close with nothing owed");
}

#[test]
fn close_waits_for_a_release_refused_busy_and_names_the_node_if_it_stays_busy() {
    let servers = RedisCluster::start(3).expect("start redis-server");
    let addrs = servers.addrs();

    // Busy for half a second after the release: `close` sees the release run.
    let client = client(servers.urls(), Duration::from_millis(200));
    let lock = client.try_lock("busy:a", TTL).expect("lock");
    assert_settles!(get(addrs[0], b"busy:a").is_some());
    let spin = make_busy(addrs[0]);
    lock.release()
        .expect("release at the quorum of nodes 1 and 2");
    let busy_node = addrs[0];
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        kill_script(busy_node);
        drop(spin);
    });
    let started = Instant::now();
    let outcome = client.close();
    let waited = started.elapsed();
    killer.join().unwrap();
    let left = get_unless_busy(addrs[0], b"busy:a");
    assert!(
        outcome.is_ok() && left == Some(None),
        "close() returned {outcome:?} after {waited:?}; node 0 then had {left:?} for the \
         released key ({} BUSY)",
        errors(addrs[0], "BUSY")
    );

    // Busy for good: `close` gives up within its 10 s, naming node 0.
    let client = self::client(servers.urls(), Duration::from_millis(200));
    let lock = client.try_lock("busy:b", TTL).expect("lock");
    assert_settles!(get(addrs[0], b"busy:b").is_some());
    let _spin = make_busy(addrs[0]);
    lock.release()
        .expect("release at the quorum of nodes 1 and 2");
    let started = Instant::now();
    let outcome = client.close();
    let waited = started.elapsed();
    match outcome {
        Err(Error::Undelivered { failures }) => {
            assert_eq!(
                failures.iter().map(|f| f.node).collect::<Vec<_>>(),
                [0],
                "{failures:?}"
            );
        }
        other => panic!("close() with node 0 busy for good: {other:?} after {waited:?}"),
    }
    assert!(
        waited < Duration::from_secs(12),
        "close() waited {waited:?}"
    );
    println!("close() gave up on the busy node after {waited:?}");
    kill_script(addrs[0]);
}
