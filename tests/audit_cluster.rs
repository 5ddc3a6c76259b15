//! Adversarial checks of the cluster paths against real `redis-server` 7.0 clusters: owed
//! deletes whose key's TTL passes, the resender thread while a cluster link owes what never
//! answers (CPU and threads), closing with many owed deletes to a dead master, a failover
//! followed by a migration while a release is owed, and a master that moves address while a
//! lock is held.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::process::{cpu_time, threads};
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error};

fn client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client")
}

/// Many releases owed to a master killed with no replica (its slots served by nobody), the
/// client then idle: the resender does not busy-loop and ends; once the keys' TTL has passed,
/// what was owed is dropped (the keys are gone anyway), so `close()` returns at once with
/// nothing undelivered rather than waiting its limit; and closing is bounded either way.
#[test]
fn owed_deletes_to_a_dead_master_cost_no_cpu_and_lapse_with_their_ttl() {
    let ttl = Duration::from_secs(3);
    let mut cluster = ClusterMember::start(3, 0).expect("cluster");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let dead = cluster.masters()[0];
    let keys = cluster.keys_of(dead, "dead", 40);
    let threads_before = threads();
    let locks: Vec<_> = keys
        .iter()
        .map(|k| client.try_lock(k, ttl).expect("lock"))
        .collect();
    let taken = Instant::now();
    cluster.servers[0].kill().expect("kill -9");
    for lock in locks {
        lock.release().expect("the standalone members release");
    }
    // Idle for 6 s: the resender may try for its 10 s, but must not spin.
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut peak_threads = threads();
    while t0.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(100));
        peak_threads = peak_threads.max(threads());
    }
    let cpu = (cpu_time() - cpu0).as_millis() / 10;
    let wall = t0.elapsed();
    // Wait for the resender's own limit to pass, then count threads again.
    std::thread::sleep(Duration::from_secs(6));
    let threads_after = threads();
    let start = Instant::now();
    let closed = client.close();
    let close_took = start.elapsed();
    eprintln!(
        "idle {wall:?}: cpu {cpu} ticks; threads before {threads_before}, peak {peak_threads}, \
         after {threads_after}; TTL passed {:?} ago; close took {close_took:?}: {closed:?}",
        taken.elapsed().saturating_sub(ttl)
    );
    assert!(
        cpu < 150,
        "{cpu} ticks of CPU (1/100 s) in {wall:?} idle: the client spins on what is owed"
    );
    assert!(
        threads_after <= threads_before + 2,
        "threads: {threads_before} before, {threads_after} 12 s after the releases"
    );
    assert!(
        close_took < Duration::from_secs(10),
        "close took {close_took:?}"
    );
    assert!(
        closed.is_ok(),
        "every owed delete's key had expired ({:?} ago), yet close reports: {closed:?}",
        taken.elapsed().saturating_sub(ttl)
    );
}

/// Many releases owed to a dead master with no replica, long TTL: close is bounded by its
/// documented 10 s, and says the cluster member is undelivered.
#[test]
fn close_with_many_owed_deletes_to_a_dead_cluster_is_bounded() {
    let ttl = Duration::from_secs(60);
    let mut cluster = ClusterMember::start(3, 0).expect("cluster");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let locks: Vec<_> = (0..200)
        .map(|i| client.try_lock(format!("many:{i}"), ttl).expect("lock"))
        .collect();
    // Every master dies: the whole cluster is gone.
    for s in cluster.servers.iter_mut() {
        s.kill().expect("kill -9");
    }
    for lock in locks {
        lock.release().expect("the standalone members release");
    }
    let start = Instant::now();
    let closed = client.close();
    let close_took = start.elapsed();
    eprintln!("close took {close_took:?}: {closed:?}");
    assert!(
        close_took <= Duration::from_millis(10_500),
        "close took {close_took:?}, more than its 10 s"
    );
    assert!(
        matches!(&closed, Err(Error::Undelivered { failures }) if failures.len() == 1),
        "{closed:?}"
    );
}

/// A release owed to a killed master, whose replica is promoted and whose slot then migrates to
/// another master, all before the release: the delete reaches the slot's final owner; nothing
/// is left on any master.
#[test]
fn a_release_owed_across_a_failover_then_a_migration_reaches_the_final_owner() {
    let ttl = Duration::from_secs(60);
    let mut cluster = ClusterMember::start(3, 1).expect("cluster with a replica");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let old = cluster.masters()[0];
    let other = cluster.masters()[1];
    let replica = cluster.servers[3].addr();
    let key = cluster.key_of(old, "fm");
    let slot = cluster.slot(key.as_bytes());
    let lock = client.try_lock(&key, ttl).expect("lock");
    assert!(
        common::eventually(Duration::from_secs(5), || has_key(replica, key.as_bytes())),
        "the replica has it"
    );
    cluster.servers[0].kill().expect("kill -9");
    assert!(
        common::eventually(common::cluster::SETTLE, || is_master(replica)
            && cluster.owner(slot, replica) == Some(replica)),
        "the replica was promoted"
    );
    // Wait until every live master agrees the cluster is ok again.
    assert!(common::eventually(common::cluster::SETTLE, || {
        [other, cluster.masters()[2], replica].iter().all(|a| {
            matches!(common::cmd(*a, &[b"CLUSTER", b"INFO"]), Value::Bulk(Some(b))
                if String::from_utf8_lossy(&b).contains("cluster_state:ok"))
        })
    }));
    cluster.migrate(slot, replica, other, || {});
    assert!(has_key(other, key.as_bytes()), "the key moved");
    lock.release().expect("the standalone members release");
    let released = Instant::now();
    let gone = common::eventually(Duration::from_secs(10), || {
        !has_key(other, key.as_bytes()) && !has_key(replica, key.as_bytes())
    });
    eprintln!(
        "gone: {gone} {:?} after the release; PTTL on the final owner {}",
        released.elapsed(),
        common::pttl(other, key.as_bytes())
    );
    assert!(
        gone,
        "{key} left on the slot's final owner after the release"
    );
    let start = Instant::now();
    let closed = client.close();
    eprintln!("close took {:?}: {closed:?}", start.elapsed());
    assert!(start.elapsed() <= Duration::from_millis(10_500));
}

/// A master moves address while a lock is held on it (its old address gone, its connections
/// cut): the release must still delete the key, which lives on the same server at its new
/// address, well within its TTL; and closing is bounded with nothing undelivered.
#[test]
fn a_lock_held_while_its_master_moves_is_deleted_by_the_release() {
    let ttl = Duration::from_secs(60);
    let cluster = ClusterMember::start(3, 0).expect("cluster");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let master = cluster.masters()[0];
    let port = master.port();
    let key = cluster.key_of(master, "mv");
    move_to(master, "127.0.1.1");
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let mut released_all = Vec::new();
    for round in 2..6u32 {
        let lock = client.try_lock(&key, ttl).expect("lock");
        assert!(common::get(master, key.as_bytes()).is_some(), "held");
        let old = format!("127.0.1.{}:{port}", round - 1);
        move_to(master, &format!("127.0.1.{round}"));
        let _ = common::cmd(master, &[b"CLIENT", b"KILL", b"LADDR", old.as_bytes()]);
        lock.release().expect("the standalone members release");
        let released = Instant::now();
        let gone = common::eventually(Duration::from_secs(10), || {
            common::get(master, key.as_bytes()).is_none()
        });
        released_all.push((gone, released.elapsed()));
        assert!(
            gone,
            "round {round}: the moved master still holds {key} {:?} after the release (PTTL {})",
            released.elapsed(),
            common::pttl(master, key.as_bytes())
        );
    }
    eprintln!("key gone after each release: {released_all:?}");
    let start = Instant::now();
    let closed = client.close();
    eprintln!("close took {:?}: {closed:?}", start.elapsed());
    closed.expect("nothing owed");
    assert!(cluster.keys().is_empty(), "keys left behind");
}

/// As with Redis's default `cluster-node-timeout` (15 s), the replica of a killed master is
/// promoted only after more than 10 s: a release owed to the dead master meanwhile (the client
/// idle after it returned at the standalone members' quorum) must still reach the promoted
/// replica once it serves the slot, well before the key's 60 s TTL.
#[test]
fn a_release_owed_through_a_slow_failover_reaches_the_promoted_replica() {
    let ttl = Duration::from_secs(60);
    let mut cluster = ClusterMember::start(3, 1).expect("cluster with a replica");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let old = cluster.masters()[0];
    let replica = cluster.servers[3].addr();
    let key = cluster.key_of(old, "slow");
    let slot = cluster.slot(key.as_bytes());
    let ok = |v: Value| assert!(matches!(v, Value::Simple(_)), "{v:?}");
    ok(common::cmd(
        replica,
        &[b"CONFIG", b"SET", b"cluster-replica-no-failover", b"yes"],
    ));
    let lock = client.try_lock(&key, ttl).expect("lock");
    assert!(
        common::eventually(Duration::from_secs(5), || has_key(replica, key.as_bytes())),
        "the replica has it"
    );
    cluster.servers[0].kill().expect("kill -9");
    lock.release().expect("the standalone members release");
    let released = Instant::now();
    // The failover comes 12 s later; the idle client meanwhile spins on nothing.
    let cpu0 = cpu_time();
    std::thread::sleep(Duration::from_secs(12));
    let cpu = (cpu_time() - cpu0).as_millis() / 10;
    assert!(
        cpu < 200,
        "{cpu} ticks of CPU (1/100 s) in 12 s idle, a release owed to a dead master"
    );
    ok(common::cmd(
        replica,
        &[b"CONFIG", b"SET", b"cluster-replica-no-failover", b"no"],
    ));
    ok(common::cmd(
        replica,
        &[b"CLUSTER", b"FAILOVER", b"TAKEOVER"],
    ));
    assert!(
        common::eventually(common::cluster::SETTLE, || is_master(replica)
            && cluster.owner(slot, replica) == Some(replica)),
        "the replica was promoted"
    );
    let promoted = Instant::now();
    let gone = common::eventually(Duration::from_secs(10), || {
        !has_key(replica, key.as_bytes())
    });
    let left = common::pttl(replica, key.as_bytes());
    eprintln!(
        "promoted {:?} after the release; the key gone from it: {gone} ({:?} after the \
         promotion; PTTL now {left} ms)",
        promoted - released,
        promoted.elapsed()
    );
    assert!(
        gone,
        "the promoted replica still holds {key} {:?} after the release returned (PTTL {left} ms)",
        released.elapsed()
    );
    let start = Instant::now();
    let closed = client.close();
    eprintln!("close took {:?}: {closed:?}", start.elapsed());
    assert!(start.elapsed() <= Duration::from_millis(10_500));
}

/// A release owed to a dead master with no replica and a long TTL, the client's last handle
/// then dropped after the resender's 10 s: the resender lets the client go (and its drop
/// settles) instead of living on until the key's TTL.
#[test]
fn a_dropped_client_lets_its_resender_go() {
    let ttl = Duration::from_secs(120);
    let mut cluster = ClusterMember::start(3, 0).expect("cluster");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let threads_before = threads();
    let client = client(&nodes);
    let key = cluster.key_of(cluster.masters()[0], "drop");
    let lock = client.try_lock(&key, ttl).expect("lock");
    cluster.servers[0].kill().expect("kill -9");
    lock.release().expect("the standalone members release");
    std::thread::sleep(Duration::from_secs(11));
    let threads_held = threads();
    let dropped = Instant::now();
    drop(client);
    let drop_took = dropped.elapsed();
    let back = common::eventually(Duration::from_secs(15), || threads() <= threads_before);
    eprintln!(
        "threads: {threads_before} before, {threads_held} 11 s after the release; drop took \
         {drop_took:?}; back to {} {:?} after the drop",
        threads(),
        dropped.elapsed()
    );
    assert!(back, "the resender outlived its dropped client");
}

/// How many clients the server at `addr` has, this probe's own connection aside.
fn clients_of(addr: SocketAddr) -> usize {
    let Value::Bulk(Some(b)) = common::cmd(addr, &[b"INFO", b"clients"]) else {
        panic!("INFO clients");
    };
    let info = String::from_utf8_lossy(&b).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .expect("connected_clients")
        - 1
}

/// A cluster of 30 masters under 16 threads that lock (and wait) on shared keys: every lock is
/// granted, nothing is left behind, and the client keeps at most one command connection and one
/// pub/sub connection per master.
#[test]
fn a_cluster_of_30_masters_under_16_threads_keeps_two_connections_per_master() {
    let started = Instant::now();
    let member = ClusterMember::start(30, 0).expect("cluster of 30 masters");
    eprintln!("30 masters up in {:?}", started.elapsed());
    let client = Client::builder()
        .nodes([member.url()])
        .node_timeout(Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let failed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..16 {
            let client = &client;
            let failed = &failed;
            s.spawn(move || {
                for i in 0..40 {
                    let key = format!("hundred:{}", (t * 7 + i * 13) % 50);
                    match client.lock(&key, Duration::from_secs(10)) {
                        Ok(lock) => lock.release().expect("release"),
                        Err(e) => {
                            eprintln!("{key}: {e}");
                            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let per_master: Vec<usize> = member.masters().iter().map(|a| clients_of(*a)).collect();
    let most = per_master.iter().max().copied().unwrap_or(0);
    let total: usize = per_master.iter().sum();
    eprintln!(
        "in {:?}: {} failed; connections per master: at most {most}, {total} in all",
        started.elapsed(),
        failed.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert_eq!(failed.into_inner(), 0, "locks failed on a healthy cluster");
    assert!(most <= 2, "connections per master: {per_master:?}");
    assert!(member.keys().is_empty(), "keys left behind");
    client.close().expect("nothing owed");
}
