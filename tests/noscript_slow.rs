//! A node slow for its load whose script cache was flushed, against real redis-server
//! processes: what the simulation's slow-flush runs found, on real servers. A release that
//! meets `NOSCRIPT` only after the time it was kept for still goes again with the script's
//! body, and leaves nothing behind; an extend that meets `NOSCRIPT` on a slow node still ends
//! when the validity it could have ends, not when the slow node answers the body.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error};
use redlock_mux_kit::fault_proxy::{FaultProxy, ProxyFault};

fn ok() -> Value {
    Value::Simple(b"OK".to_vec())
}

/// How many error replies of `kind` (`NOSCRIPT`) the server has given.
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

/// Node 0 holds writes (`CLIENT PAUSE WRITE`) for longer than the lock's TTL, with its script
/// cache flushed. The lock is granted and released at the quorum of nodes 1 and 2; node 0 runs
/// the grant's `SET` only when the pause ends, then answers the release `NOSCRIPT`: more than a
/// TTL after the release was sent, but the key was just written and lives on for a whole TTL.
/// The release must go again with its body while the client sits idle, so that the key is gone
/// long before that TTL runs out.
#[test]
fn a_release_answered_noscript_after_its_ttl_by_a_slow_node_still_deletes_the_late_write() {
    const TTL: Duration = Duration::from_secs(2);
    const PAUSE_MS: u64 = 3_000;
    const WINDOW: Duration = Duration::from_secs(1);
    let servers = RedisCluster::start(3).expect("start redis-server");
    let addrs = servers.addrs();
    let client = Client::builder()
        .nodes(servers.urls())
        .node_timeout(Duration::from_millis(200))
        .retry_count(0)
        .build()
        .expect("client");
    assert_eq!(cmd(addrs[0], &[b"SCRIPT", b"FLUSH"]), ok());
    let paused = Instant::now();
    assert_eq!(
        cmd(
            addrs[0],
            &[
                b"CLIENT",
                b"PAUSE",
                PAUSE_MS.to_string().as_bytes(),
                b"WRITE"
            ]
        ),
        ok()
    );
    let lock = client
        .try_lock("late", TTL)
        .expect("lock at the quorum of nodes 1 and 2");
    lock.release()
        .expect("release at the quorum of nodes 1 and 2");
    let sent = paused.elapsed();
    assert!(
        sent < Duration::from_millis(PAUSE_MS) - TTL,
        "the release went out {sent:?} into the pause: too late for this test"
    );
    for &addr in &addrs[1..] {
        assert_eq!(get(addr, b"late"), None);
    }
    assert_eq!(
        get(addrs[0], b"late"),
        None,
        "node 0 ran the SET during its pause"
    );
    // The client sits idle. Node 0 runs the SET and answers NOSCRIPT when the pause ends.
    assert!(
        eventually(Duration::from_millis(PAUSE_MS + 5_000), || errors(
            addrs[0], "NOSCRIPT"
        ) >= 1),
        "node 0 never answered NOSCRIPT"
    );
    let answered = paused.elapsed();
    // The SET ran just before: without the body the key would live on for the TTL.
    let gone = eventually(WINDOW, || get(addrs[0], b"late").is_none());
    assert!(
        gone,
        "node 0 answered the release NOSCRIPT {answered:?} after the pause began ({:?} after \
         the release was sent, its TTL {TTL:?}) and still holds the key it wrote late (PTTL {} \
         ms) {WINDOW:?} later: the release was not sent again with its body",
        answered.saturating_sub(sent),
        pttl(addrs[0], b"late")
    );
    for &addr in &addrs {
        assert_settles_eq!(dbsize(addr), 0, "a key was left on {addr}");
    }
    client.close().expect("close with nothing owed");
}

/// Node 0 is slow (every chunk each way 400 ms late, through a proxy) and its script cache is
/// flushed; node 2 lost the lock. An extend that shortens the TTL to 1 s: node 1 runs it and
/// holds the lock for 1 s, node 2 refuses, node 0 answers `NOSCRIPT` after 800 ms and is sent
/// the body, which it answers after 1.6 s. The extend is lost, and the holder must learn so
/// when what node 1 holds ends, at 1 s, not when node 0 answers the body: until then it would
/// count a validity that no quorum gives it.
#[test]
fn an_extend_that_meets_noscript_on_a_slow_node_ends_with_its_validity() {
    const DELAY: Duration = Duration::from_millis(400);
    const SHORTER: Duration = Duration::from_millis(1_000);
    let servers = RedisCluster::start(3).expect("start redis-server");
    let addrs = servers.addrs();
    let proxy = FaultProxy::start(addrs[0], DELAY).expect("proxy");
    let mut urls = servers.urls();
    urls[0] = proxy.url();
    let client = Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_secs(3))
        .retry_count(0)
        .build()
        .expect("client");
    let mut lock = client
        .try_lock("ext", Duration::from_secs(30))
        .expect("lock on every node");
    assert_settles!(get(addrs[0], b"ext").is_some());
    assert_eq!(cmd(addrs[0], &[b"SCRIPT", b"FLUSH"]), ok());
    assert_eq!(cmd(addrs[2], &[b"DEL", b"ext"]), Value::Integer(1));
    proxy.set(ProxyFault::Delay);
    let started = Instant::now();
    let outcome = lock.extend(SHORTER);
    let returned = started.elapsed();
    let validity = lock.validity();
    proxy.set(ProxyFault::None);
    assert!(
        matches!(outcome, Err(Error::ValidityExpired { .. })),
        "the extend was not lost at the end of its validity: {outcome:?} after {returned:?}"
    );
    assert!(
        returned < SHORTER + Duration::from_millis(300),
        "the extend, lost once node 1's shorter TTL ran out ({SHORTER:?}), returned only after \
         {returned:?}, when slow node 0 answered the script's body: the holder counted its old \
         validity meanwhile"
    );
    assert_eq!(
        validity,
        Duration::ZERO,
        "validity left after a lost extend"
    );
    assert!(
        errors(addrs[0], "NOSCRIPT") >= 1,
        "node 0 never answered NOSCRIPT"
    );
    lock.release().expect("release");
    for &addr in &addrs {
        assert_settles_eq!(dbsize(addr), 0, "a key was left on {addr}");
    }
    client.close().expect("close");
}
