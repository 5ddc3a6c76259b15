//! Masters managed by Redis Sentinel as quorum members, and `?wait=N` on members that are not
//! clusters, against real `redis-server` processes (masters, replicas and sentinels started by
//! the tests, stopped by PID).

mod common;

use std::time::Duration;

use common::sentinel::SentinelMember;
use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, NodeErrorKind};

const TTL: Duration = Duration::from_secs(10);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(ms(500))
        .retry_count(0)
        .build()
        .expect("valid client")
}

/// A master and a replica of it, the replica's link up.
fn master_with_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]).expect("master");
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica");
    assert_settles!(
        matches!(
            cmd(master.addr(), &[b"INFO", b"replication"]),
            Value::Bulk(Some(text)) if String::from_utf8_lossy(&text).contains("state=online")
        ),
        "the replica of {} is linked",
        master.addr()
    );
    (master, replica)
}

/// With `?wait=1` on plain members, a grant counts only once `WAIT 1` says a replica has it:
/// while the lock is held, the replicas of a quorum have the key. A master without a replica
/// fails for the grant (`NOREPLICAS`), never a vote.
#[test]
fn a_standalone_grant_counts_only_once_a_replica_has_it() {
    let pairs: Vec<(RedisServer, RedisServer)> = (0..3).map(|_| master_with_replica()).collect();
    let urls: Vec<String> = pairs
        .iter()
        .map(|(m, _)| format!("{}?wait=1", m.url()))
        .collect();
    let waiting = client(&urls);
    for i in 0..5 {
        let key = format!("wait:{i}");
        let lock = waiting.try_lock(&key, TTL).expect("lock");
        let holding = pairs
            .iter()
            .filter(|(_, r)| get(r.addr(), key.as_bytes()).is_some())
            .count();
        assert!(
            holding >= 2,
            "{holding} replicas of 3 have {key} while it is held"
        );
        lock.release().expect("release");
    }
    for (m, r) in &pairs {
        assert_settles_eq!(dbsize(m.addr()), 0, "a key was left on {}", m.addr());
        assert_settles_eq!(dbsize(r.addr()), 0, "a key was left on {}", r.addr());
    }
    let lonely: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("server"))
        .collect();
    let urls: Vec<String> = lonely
        .iter()
        .map(|s| format!("{}?wait=1", s.url()))
        .collect();
    let waiting = client(&urls);
    match waiting.try_lock("wait:alone", TTL) {
        Err(Error::QuorumUnreachable { failures, .. }) => {
            assert!(failures.len() >= 2, "{failures:?}");
            for f in &failures {
                assert!(
                    matches!(&f.kind, NodeErrorKind::Server { message, .. }
                        if message.starts_with("NOREPLICAS")),
                    "{f:?}"
                );
            }
        }
        other => panic!("a master without a replica cannot grant with WAIT: {other:?}"),
    }
    for s in &lonely {
        assert_settles_eq!(dbsize(s.addr()), 0, "a key was left on {}", s.addr());
    }
}

/// A member named by its sentinels: locks are granted and released through the master they
/// name (nothing goes to the replica, nothing is left behind), with one of the three sentinels
/// down; and wrong sentinel credentials, or a service no sentinel knows, are `Error::Config`
/// at build, never contention.
#[test]
fn a_member_is_the_master_its_sentinels_name() {
    let members: Vec<SentinelMember> = (0..3)
        .map(|_| SentinelMember::start(Some("sentinel-pw")).expect("sentinel member"))
        .collect();
    let urls: Vec<String> = members
        .iter()
        .map(|m| m.url("?sentinel_password=sentinel-pw"))
        .collect();
    let c = client(&urls);
    for i in 0..20 {
        let key = format!("sentinel:{i}");
        let lock = c.try_lock(&key, TTL).expect("lock");
        for m in &members {
            assert!(
                get(m.servers[0].addr(), key.as_bytes()).is_some(),
                "{key} on the master"
            );
        }
        lock.release().expect("release");
    }
    for m in &members {
        for s in &m.servers {
            assert_settles_eq!(dbsize(s.addr()), 0, "a key was left on {}", s.addr());
        }
    }
    drop(c);
    // The first sentinel down: the next one answers.
    let mut members = members;
    for m in &mut members {
        m.sentinels[0].kill();
    }
    let c = client(&urls);
    c.try_lock("sentinel:one-down", TTL)
        .expect("lock with a sentinel down")
        .release()
        .expect("release");
    drop(c);
    // Wrong credentials for the sentinels, or no password at all: a configuration error.
    for query in ["?sentinel_password=wrong", ""] {
        let urls: Vec<String> = members.iter().map(|m| m.url(query)).collect();
        match Client::builder().nodes(&urls).build() {
            Err(Error::Config { failures }) => assert_eq!(failures.len(), 3, "{failures:?}"),
            other => panic!("wrong sentinel credentials ({query:?}): {other:?}"),
        }
    }
    let unknown: Vec<String> = members
        .iter()
        .map(|m| {
            m.url("?sentinel_password=sentinel-pw")
                .replace(&m.service, "no-such-service")
        })
        .collect();
    match Client::builder().nodes(&unknown).build() {
        Err(Error::Config { failures }) => {
            assert_eq!(failures.len(), 3, "{failures:?}");
            assert!(
                format!("{failures:?}").contains("no-such-service"),
                "{failures:?}"
            );
        }
        other => panic!("a service no sentinel knows: {other:?}"),
    }
}
