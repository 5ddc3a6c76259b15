//! How many masters a client follows on quorum members that are Redis Clusters, against real
//! clusters of `redis-server` 7.0 processes started here: a cluster of more than 64 masters,
//! and three clusters of 30 masters each.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::ClusterMember;
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

/// Whether the master at `addr` has `key`.
fn has_key(addr: SocketAddr, key: &[u8]) -> bool {
    matches!(common::cmd(addr, &[b"GET", key]), Value::Bulk(Some(_)))
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
