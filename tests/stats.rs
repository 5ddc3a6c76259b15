//! `Client::stats`: rounds by kind and outcome, node failures and latency, wake-ups, retries
//! and cancellations, counted against real servers.

mod common;

use std::thread;
use std::time::Duration;

use common::*;
use redlock_mux::{Acquire, Cancel, Client};

const TTL: Duration = Duration::from_secs(10);

#[test]
fn stats_count_rounds_failures_latency_wakeups_retries_and_cancellations() {
    let cluster = RedisCluster::start(3).unwrap();
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .retry_delay(Duration::from_secs(5))
        .build()
        .unwrap();
    let zero = client.stats();
    assert_eq!(zero.nodes.len(), 3);
    assert_eq!(zero.kinds.mutex.won, 0);

    for _ in 0..20 {
        client.lock("s:m", TTL).unwrap().release().unwrap();
    }
    let held = client.write_lock("s:rw", TTL).unwrap();
    assert!(client.try_read_lock("s:rw", TTL).is_err());
    assert!(client.try_lock_all(["s:m", "s:n"], TTL).is_ok());
    let s = client.stats();
    assert_eq!(s.kinds.mutex.won, 20, "{s:?}");
    assert_eq!(s.kinds.write.won, 1, "{s:?}");
    assert_eq!(s.kinds.read.contended, 1, "{s:?}");
    assert_eq!(s.kinds.all.won, 1, "{s:?}");
    // Each round is decided at the quorum, but every reply is timed, the slowest node's ones
    // too (read later, behind the next command on the same connection): 43 rounds, each
    // answered by every node, less at most the last few replies still in flight.
    let samples: usize = s.nodes.iter().map(|n| n.latency_samples).sum();
    assert!(samples >= 2 * 40, "{s:?}");
    for n in &s.nodes {
        assert!(n.latency_samples >= 40, "every node is timed: {n:?}");
        let (Some(p50), Some(p99)) = (n.latency_p50, n.latency_p99) else {
            panic!("no latency for {n:?}");
        };
        assert!(p50 <= p99 && p99 < Duration::from_secs(1), "{n:?}");
        assert_eq!(n.failures.total(), 0, "{n:?}");
    }

    // A waiter woken by a release retries.
    let waiter = thread::spawn({
        let client = client.clone();
        move || client.write_lock("s:rw", TTL).unwrap().release().unwrap()
    });
    thread::sleep(Duration::from_millis(300));
    held.release().unwrap();
    waiter.join().unwrap();
    let s = client.stats();
    assert!(s.wakeups >= 1, "{s:?}");
    assert!(s.retries >= 1, "{s:?}");
    assert!(s.kinds.write.contended >= 1, "{s:?}");

    // A cancelled wait.
    let m = client.lock("s:c", TTL).unwrap();
    let cancel = Cancel::new();
    let t = thread::spawn({
        let (client, cancel) = (client.clone(), cancel.clone());
        move || client.lock_with("s:c", TTL, &Acquire::new().cancel(&cancel))
    });
    thread::sleep(Duration::from_millis(200));
    cancel.cancel();
    assert!(t.join().unwrap().is_err());
    assert_eq!(client.stats().cancellations, 1);
    m.release().unwrap();

    // Two nodes frozen: the round is unreachable, and both time out.
    cluster.servers[1].pause().unwrap();
    cluster.servers[2].pause().unwrap();
    let e = client.try_lock("s:u", TTL).unwrap_err();
    cluster.servers[1].resume().unwrap();
    cluster.servers[2].resume().unwrap();
    let s = client.stats();
    assert!(!e.is_contended(), "{e}");
    assert_eq!(s.kinds.mutex.unreachable, 1, "{s:?}");
    assert_eq!(s.nodes[0].failures.total(), 0, "{s:?}");
    assert_eq!(s.nodes[1].failures.timeout, 1, "{s:?}");
    assert_eq!(s.nodes[2].failures.timeout, 1, "{s:?}");
}
