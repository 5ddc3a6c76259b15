//! When a wait for a lock ends without it, the error says which deadline ended it: the wait
//! timeout or the retry count; a round lost to slow nodes says the per-node timeout, and a
//! late extend the lock's validity.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Client, Deadline, Error};

const TTL: Duration = Duration::from_secs(10);

#[test]
fn a_wait_that_ends_says_which_deadline_ended_it() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let holder = Client::new(cluster.urls()).unwrap();
    let _held = holder.lock("wait", TTL).unwrap();

    // One attempt: its own error, and no wait to end.
    let c = Client::new(cluster.urls()).unwrap();
    let e = c.try_lock("wait", TTL).unwrap_err();
    assert!(matches!(e, Error::Contended { .. }), "{e:?}");
    assert_eq!(e.deadline(), None);

    // The wait timeout.
    let c = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_millis(20))
        .wait_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = Instant::now();
    let e = c.lock("wait", TTL).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(250), "{e}");
    let Error::WaitEnded { deadline, last } = &e else {
        panic!("expected WaitEnded, got {e:?}");
    };
    assert_eq!(*deadline, Deadline::WaitTimeout);
    assert!(matches!(**last, Error::Contended { .. }), "{last:?}");
    assert!(e.is_contended() && !e.is_config(), "{e}");
    assert_eq!(e.deadline(), Some(Deadline::WaitTimeout));
    assert!(e.to_string().contains("wait timeout"), "{e}");

    // The retry count: two retries after the backstop, long before the wait timeout.
    let c = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_millis(20))
        .retry_count(2)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let started = Instant::now();
    let e = c.lock("wait", TTL).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{e}");
    assert_eq!(e.deadline(), Some(Deadline::RetryCount), "{e:?}");
    assert!(e.is_contended(), "{e}");
}

#[test]
fn slow_nodes_and_late_extends_name_their_deadlines() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Warm the connections, so that the nodes are known up.
    drop(c.try_lock("warm", TTL).unwrap());
    for s in &cluster.servers[1..] {
        s.pause().expect("SIGSTOP");
    }
    let e = c.try_lock("slow", TTL).unwrap_err();
    for s in &cluster.servers[1..] {
        s.resume().expect("SIGCONT");
    }
    assert!(matches!(e, Error::QuorumUnreachable { .. }), "{e:?}");
    assert_eq!(e.deadline(), Some(Deadline::NodeTimeout), "{e:?}");

    let mut lock = c.try_lock("late", Duration::from_millis(100)).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let e = lock.extend(TTL).unwrap_err();
    assert!(matches!(e, Error::ValidityExpired { .. }), "{e:?}");
    assert_eq!(e.deadline(), Some(Deadline::Validity));
}
