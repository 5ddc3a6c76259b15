//! Every lock kind has every capability from the one engine: the fenced write lock, fair
//! queues for all-or-none sets and fenced locks, and keep-alive for every guard, against real
//! redis-server processes.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, KeepAlive, KeyNames};

const TTL: Duration = Duration::from_secs(10);

fn client(urls: &[String], fair: bool) -> Client {
    Client::builder()
        .nodes(urls)
        .fair(fair)
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(100))
        .wait_timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

fn integer(v: Value) -> i64 {
    match v {
        Value::Integer(n) => n,
        Value::Bulk(Some(b)) => String::from_utf8_lossy(&b).parse().expect("a number"),
        Value::Bulk(None) => 0,
        other => panic!("not a number: {other:?}"),
    }
}

fn zcard(addr: std::net::SocketAddr, key: &[u8]) -> i64 {
    integer(cmd(addr, &[b"ZCARD", key]))
}

#[test]
fn fenced_write_locks_hand_out_increasing_tokens_and_exclude_readers_and_writers() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster.urls(), false);
    let names = KeyNames::new(b"doc");

    let first = c.try_write_lock_fenced("doc", TTL).expect("fenced writer");
    assert!(first.fencing_token() >= 1);
    assert_eq!(first.key(), b"doc");
    for e in [
        c.try_read_lock("doc", TTL).map(drop).unwrap_err(),
        c.try_write_lock("doc", TTL).map(drop).unwrap_err(),
        c.try_write_lock_fenced("doc", TTL).map(drop).unwrap_err(),
    ] {
        assert!(e.is_contended(), "{e}");
    }
    let t1 = first.fencing_token();
    first.release().expect("release");

    // A plain writer excludes a fenced one, and raises no counter.
    let plain = c.try_write_lock("doc", TTL).expect("plain writer");
    assert!(c
        .try_write_lock_fenced("doc", TTL)
        .unwrap_err()
        .is_contended());
    plain.release().expect("release");

    // Nodes whose counters ran ahead (they granted writes the third missed): the token is past
    // them, and written back to a quorum before it is handed out. Two of three, so that every
    // quorum of two includes one of them, whichever nodes answer first.
    for addr in &cluster.addrs()[..2] {
        set(*addr, &names.writer_fence, b"100");
    }
    let second = c.write_lock_fenced("doc", TTL).expect("fenced writer");
    let t2 = second.fencing_token();
    assert!(t2 > 100 && t2 > t1, "{t1} then {t2}");
    let at_token = cluster
        .addrs()
        .iter()
        .filter(|a| integer(cmd(**a, &[b"GET", &names.writer_fence])) >= t2 as i64)
        .count();
    assert!(at_token >= 2, "the token is on {at_token} nodes");
    // The fenced mutex on the same resource is another lock, with its own counter.
    let mutex = c.try_lock_fenced("doc", TTL).expect("fenced mutex");
    assert!(mutex.fencing_token() < t2);
    drop(mutex);
    second.release().expect("release");
    for addr in cluster.addrs() {
        assert!(
            eventually(Duration::from_secs(2), || get(addr, &names.writer)
                .is_none()),
            "the writer key is left"
        );
    }
}

/// A waiter that got its lock, and the fencing token it got with it.
type Served = (usize, Option<u64>);

/// Waiters of one kind queue fairly and are served in arrival order.
fn served_in_arrival_order(
    name: &str,
    queue: &[u8],
    hold: impl FnOnce(&Client) -> Box<dyn std::any::Any>,
    take: impl Fn(&Client) -> Option<u64> + Send + Sync + 'static,
) {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let urls = cluster.urls();
    let holder = hold(&client(&urls, false));
    let take = Arc::new(take);
    let served: Arc<Mutex<Vec<Served>>> = Arc::default();
    let mut waiters = Vec::new();
    for id in 0..3 {
        let (take, served, c) = (take.clone(), served.clone(), client(&urls, true));
        waiters.push(thread::spawn(move || {
            let token = take(&c);
            served.lock().unwrap().push((id, token));
        }));
        // Each waiter is queued on every node before the next one comes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster
            .addrs()
            .iter()
            .any(|a| zcard(*a, queue) < id as i64 + 1)
        {
            assert!(
                Instant::now() < deadline,
                "{name}: waiter {id} did not queue"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
    drop(holder);
    for w in waiters {
        w.join().expect("waiter");
    }
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|(id, _)| *id).collect();
    assert_eq!(order, [0, 1, 2], "{name}: served out of arrival order");
    let tokens: Vec<u64> = served.iter().filter_map(|(_, t)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "{name}: fencing tokens {tokens:?}"
    );
    for addr in cluster.addrs() {
        assert!(
            eventually(Duration::from_secs(2), || zcard(addr, queue) == 0),
            "{name}: the queue is left"
        );
    }
}

/// Each waiter holds its lock a little, so that the next one is served by a release.
fn briefly<G>(guard: G) {
    thread::sleep(Duration::from_millis(30));
    drop(guard);
}

#[test]
fn fair_all_or_none_sets_are_served_in_arrival_order() {
    let names = KeyNames::new(b"acct:1");
    served_in_arrival_order(
        "lock_all",
        &names.mutex_queue,
        |c| Box::new(c.lock("acct:2", TTL).expect("holder")),
        |c| {
            let set = c.lock_all(["acct:2", "acct:1"], TTL).expect("set");
            briefly(set);
            None
        },
    );
}

#[test]
fn fair_fenced_mutexes_are_served_in_arrival_order_with_increasing_tokens() {
    let names = KeyNames::new(b"ledger");
    served_in_arrival_order(
        "lock_fenced",
        &names.mutex_queue,
        |c| Box::new(c.lock("ledger", TTL).expect("holder")),
        |c| {
            let lock = c.lock_fenced("ledger", TTL).expect("fenced");
            let token = lock.fencing_token();
            briefly(lock);
            Some(token)
        },
    );
}

#[test]
fn fair_fenced_writers_are_served_in_arrival_order_with_increasing_tokens() {
    let names = KeyNames::new(b"catalog");
    served_in_arrival_order(
        "write_lock_fenced",
        &names.rw_queue,
        |c| Box::new(c.read_lock("catalog", TTL).expect("holder")),
        |c| {
            let lock = c.write_lock_fenced("catalog", TTL).expect("fenced writer");
            let token = lock.fencing_token();
            briefly(lock);
            Some(token)
        },
    );
}

#[test]
fn every_kind_of_guard_can_be_kept_alive() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster.urls(), false);
    let ttl = Duration::from_millis(600);
    let keep = || KeepAlive::new(ttl).interval(Duration::from_millis(150));
    let set = c
        .try_lock_all(["k:a", "k:b"], ttl)
        .unwrap()
        .keep_alive(keep())
        .unwrap();
    let fenced = c
        .try_lock_fenced("k:f", ttl)
        .unwrap()
        .keep_alive(keep())
        .unwrap();
    let writer = c
        .try_write_lock_fenced("k:w", ttl)
        .unwrap()
        .keep_alive(keep())
        .unwrap();
    assert_eq!(set.fencing_token(), None);
    let (tf, tw) = (fenced.fencing_token(), writer.fencing_token());
    assert!(tf.is_some() && tw.is_some(), "{tf:?} {tw:?}");
    // Well past the TTL, every lock is still held, by its first grant.
    thread::sleep(ttl * 3);
    for kept in [&set, &fenced, &writer] {
        assert!(!kept.is_lost(), "{:?} was lost", kept.key());
        assert!(kept.validity() > Duration::ZERO);
    }
    assert!(c.try_lock_all(["k:b"], TTL).unwrap_err().is_contended());
    assert!(c.try_lock_fenced("k:f", TTL).unwrap_err().is_contended());
    assert!(c.try_read_lock("k:w", TTL).unwrap_err().is_contended());
    assert_eq!((fenced.fencing_token(), writer.fencing_token()), (tf, tw));
    for kept in [set, fenced, writer] {
        kept.release().expect("release");
    }
    drop(
        c.try_lock_all(["k:a", "k:b", "k:f"], TTL)
            .expect("all free again"),
    );
    drop(c.try_write_lock("k:w", TTL).expect("free again"));
}
