//! How many masters a client follows on quorum members that are Redis Clusters, against real
//! clusters of `redis-server` 7.0 processes started here: a cluster of more than 64 masters,
//! three clusters of 30 masters each, and a master whose address changes hundreds of times
//! under one client (its links to the addresses that left the topology are closed and their
//! places reused).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::*;
use redlock_mux::resp::Value;
use redlock_mux::Client;

const TTL: Duration = Duration::from_secs(10);

fn client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

/// The slot of `key` is served by the master `owner` names, of each member.
fn owners(members: &[ClusterMember], key: &str) -> Vec<SocketAddr> {
    members
        .iter()
        .map(|m| {
            m.owner(m.slot(key.as_bytes()), m.masters()[0])
                .expect("owner")
        })
        .collect()
}

/// A cluster of 70 masters (Redis allows 1,000): every lock on it is granted and released by
/// the master of its slot, none fails with a `CLUSTERDOWN` the client made up for a healthy
/// cluster, and nothing is left behind.
#[test]
fn a_cluster_of_70_masters_grants_every_lock() {
    let started = Instant::now();
    let member = ClusterMember::start(70, 0).expect("cluster of 70 masters");
    eprintln!("70 masters up in {:?}", started.elapsed());
    let client = client(&[member.url()]);
    let mut failed = Vec::new();
    for i in 0..300 {
        let key = format!("wide:{i}");
        match client.try_lock(&key, TTL) {
            Ok(lock) => lock.release().expect("release"),
            Err(e) => failed.push(format!("{key}: {e}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 300 locks failed on a healthy cluster of 70 masters, first: {:?}",
        failed.len(),
        failed.first()
    );
    assert!(member.keys().is_empty(), "keys left behind");
}

/// Three quorum members, each a cluster of 30 masters (90 masters for one client): while each
/// lock is held, the master of its slot in every member has the key, so the quorum keeps its
/// fault tolerance for every key.
#[test]
fn three_clusters_of_30_masters_each_hold_every_lock() {
    let started = Instant::now();
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(30, 0).expect("cluster of 30 masters"))
        .collect();
    eprintln!("3 x 30 masters up in {:?}", started.elapsed());
    let urls: Vec<String> = members.iter().map(ClusterMember::url).collect();
    let client = client(&urls);
    let mut missing = vec![0usize; members.len()];
    const KEYS: usize = 100;
    for i in 0..KEYS {
        let key = format!("many:{i}");
        let lock = client.try_lock(&key, TTL).expect("lock");
        for (m, owner) in owners(&members, &key).into_iter().enumerate() {
            if !has_key(owner, key.as_bytes()) {
                missing[m] += 1;
            }
        }
        lock.release().expect("release");
    }
    assert_eq!(
        missing,
        vec![0; members.len()],
        "keys of {KEYS} held locks missing on each member's master of their slot"
    );
    for (m, member) in members.iter().enumerate() {
        assert!(member.keys().is_empty(), "keys left on member {m}");
    }
}

/// A master whose address changes 200 times under one client (as a pod restarted with a new
/// IP): it listens on a new loopback address each time, announces it to the cluster
/// (`cluster-announce-ip`), and the client's connections to the old one are cut. A lock on a
/// key of its slots is granted after every move, within the wait timeout: the client follows
/// the cluster for as long as it lives, its links to addresses that left the topology closed
/// and their places reused.
#[test]
fn a_master_that_moves_200_times_is_followed() {
    const MOVES: u32 = 200;
    let member = ClusterMember::start(3, 0).expect("cluster");
    // The first master moves; the URL's first seed stays where it is (it listens on
    // 127.0.0.1 throughout), and reads the topology the moving master announces of itself.
    let master = member.masters()[0];
    let port = master.port();
    let key = (0..1000)
        .map(|i| format!("moving:{i}"))
        .find(|k| member.owner(member.slot(k.as_bytes()), master) == Some(master))
        .expect("a key of the first master");

    move_to(master, "127.0.1.1");
    // A generous wait: each move is followed in well under a second, but the machine may be
    // loaded.
    let client = Client::builder()
        .nodes([member.url()])
        .node_timeout(Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    client
        .lock(&key, TTL)
        .expect("lock before any move")
        .release()
        .expect("release");
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for k in 2..=MOVES + 1 {
        let old = format!("127.0.1.{}:{port}", k - 1);
        move_to(master, &format!("127.0.1.{k}"));
        // The old address is gone: its connections are cut, as a restarted pod's are.
        let _ = common::cmd(master, &[b"CLIENT", b"KILL", b"LADDR", old.as_bytes()]);
        let asked = Instant::now();
        match client.lock(&key, TTL) {
            Ok(lock) => lock.release().expect("release"),
            Err(e) => panic!(
                "move {} (to 127.0.1.{k}): no lock within the wait timeout: {e}",
                k - 1
            ),
        }
        slowest = slowest.max(asked.elapsed());
    }
    eprintln!(
        "{MOVES} moves followed in {:?}; slowest lock after a move: {slowest:?}",
        started.elapsed()
    );
    let connected = match common::cmd(master, &[b"INFO", b"clients"]) {
        Value::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
        other => format!("{other:?}"),
    };
    eprintln!(
        "{}",
        connected
            .lines()
            .find(|l| l.starts_with("connected_clients"))
            .unwrap_or("")
    );
    assert!(member.keys().is_empty(), "keys left behind");
}
