//! Fencing tokens over a quorum, against real redis-server processes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Client, Error, NodeErrorKind};

const TTL: Duration = Duration::from_secs(5);

fn client(urls: Vec<String>) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(1))
        .retry_count(1_000_000)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// The fenced resource of the critique: it keeps the largest token it has seen and refuses a
/// write whose token is not larger. Under the lock no write may ever be refused.
#[derive(Default)]
struct Store {
    largest: Mutex<u64>,
}

impl Store {
    fn write(&self, token: u64) -> Result<(), u64> {
        let mut largest = self.largest.lock().unwrap();
        if token <= *largest {
            return Err(*largest);
        }
        *largest = token;
        Ok(())
    }
}

/// `clients` threads, each with its own client, take the fenced lock on one key until
/// `grants` grants in all were made (or `stop` is set), each writing its token to the store.
/// Failed attempts (a node going down mid-round) are retried. Returns the grants made.
fn contend(
    urls: &[String],
    clients: usize,
    grants: u64,
    ttl: Duration,
    store: &Arc<Store>,
    stop: &Arc<AtomicBool>,
    made: &Arc<AtomicU64>,
) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let c = client(urls.to_vec());
            let (store, stop, made) = (store.clone(), stop.clone(), made.clone());
            thread::spawn(move || {
                while made.load(Ordering::SeqCst) < grants
                    && !stop.load(Ordering::SeqCst)
                    && Instant::now() < deadline
                {
                    let lock = match c.lock_fenced("fenced:res", ttl) {
                        Ok(lock) => lock,
                        // Nodes killed in the middle of a round make it fail; try again.
                        Err(Error::InvalidArgument(e)) => panic!("lock_fenced: {e}"),
                        Err(_) => continue,
                    };
                    let token = lock.fencing_token();
                    if let Err(largest) = store.write(token) {
                        panic!("token {token} issued after {largest}");
                    }
                    made.fetch_add(1, Ordering::SeqCst);
                    let _ = lock.release();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    made.load(Ordering::SeqCst)
}

fn tokens_strictly_increase(n: usize) {
    let cluster = RedisCluster::start(n).expect("redis-server");
    let store = Arc::new(Store::default());
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let made = contend(&cluster.urls(), 4, 2000, TTL, &store, &stop, &made);
    assert!(made >= 2000, "only {made} grants");
    // Every grant raised the counter on a quorum; none skipped it.
    let largest = *store.largest.lock().unwrap();
    assert!(
        largest >= made,
        "largest token {largest} after {made} grants"
    );
}

#[test]
fn tokens_strictly_increase_across_clients_on_3_nodes() {
    tokens_strictly_increase(3);
}

#[test]
fn tokens_strictly_increase_across_clients_on_5_nodes() {
    tokens_strictly_increase(5);
}

/// Nodes are killed (a minority at a time) and restarted while clients take the lock; with
/// AOF `appendfsync always` a restarted node keeps its counters, so tokens keep increasing.
fn tokens_survive_restarts_with_aof(n: usize) {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut servers: Vec<RedisServer> = (0..n)
        .map(|_| RedisServer::start_with(&aof).expect("redis-server"))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let store = Arc::new(Store::default());
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let background = {
        let (urls, store, stop, made) = (urls.clone(), store.clone(), stop.clone(), made.clone());
        // A short TTL: a release sent while a node was down leaves its key there (restored
        // from the AOF), and a later quorum may need that node once the key has expired.
        let ttl = Duration::from_secs(1);
        thread::spawn(move || contend(&urls, 3, u64::MAX, ttl, &store, &stop, &made))
    };
    let minority = (n - 1) / 2;
    let grants = || made.load(Ordering::SeqCst);
    let mut seen = 0;
    for round in 0..n {
        // Let some grants happen, then kill a minority mid-stream.
        let until = Instant::now() + Duration::from_secs(5);
        while grants() < seen + 100 && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(grants() >= seen + 100, "no progress before round {round}");
        let victims: Vec<usize> = (0..minority).map(|k| (round + k) % n).collect();
        for &v in &victims {
            servers[v].kill().expect("kill");
        }
        thread::sleep(Duration::from_millis(100));
        for &v in &victims {
            servers[v].restart().expect("restart");
        }
        seen = grants();
    }
    let until = Instant::now() + Duration::from_secs(5);
    while grants() < seen + 100 && Instant::now() < until {
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
    let total = background.join().expect("contenders");
    assert!(grants() >= seen + 100, "no progress after the last restart");
    assert!(total >= 100 * (n as u64 + 1), "only {total} grants");
}

#[test]
fn tokens_keep_increasing_across_node_restarts_with_aof_on_3_nodes() {
    tokens_survive_restarts_with_aof(3);
}

#[test]
fn tokens_keep_increasing_across_node_restarts_with_aof_on_5_nodes() {
    tokens_survive_restarts_with_aof(5);
}

#[test]
fn a_holder_that_outlived_its_lock_has_the_smaller_token() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let c = client(cluster.urls());
    let stale = c
        .try_lock_fenced("job", Duration::from_millis(100))
        .expect("first");
    // The first holder pauses past its validity; the lock goes to someone else.
    thread::sleep(Duration::from_millis(150));
    assert_eq!(stale.validity(), Duration::ZERO);
    let fresh = c.try_lock_fenced("job", TTL).expect("second");
    assert!(fresh.fencing_token() > stale.fencing_token());
    let store = Store::default();
    store.write(fresh.fencing_token()).unwrap();
    assert_eq!(
        store.write(stale.fencing_token()),
        Err(fresh.fencing_token())
    );
    // Extending keeps the token.
    let mut fresh = fresh;
    let token = fresh.fencing_token();
    fresh.extend(TTL).expect("extend");
    assert_eq!(fresh.fencing_token(), token);
}

#[test]
fn fenced_and_plain_locks_exclude_each_other_and_the_counter_never_expires() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(cluster.urls());
    let first = c.try_lock_fenced("acct", TTL).expect("fenced");
    assert_eq!(first.key(), b"acct");
    assert!(c.try_lock("acct", TTL).unwrap_err().is_contended());
    let t1 = first.fencing_token();
    first.release().expect("release");
    let fence = b"redlock-mux:fence:{acct}";
    let with_counter = addrs
        .iter()
        .filter(|a| get(**a, fence) == Some(t1.to_string().into_bytes()))
        .count();
    assert!(
        with_counter >= c.quorum(),
        "counter on {with_counter} nodes"
    );
    for addr in &addrs {
        // The release returns once a quorum answered; the others follow.
        let deadline = Instant::now() + Duration::from_secs(2);
        while get(*addr, b"acct").is_some() {
            assert!(Instant::now() < deadline, "not released on {addr}");
            thread::sleep(Duration::from_millis(5));
        }
        if get(*addr, fence).is_some() {
            assert_settles_eq!(pttl(*addr, fence), -1, "the counter must not expire");
        }
    }
    // A plain lock neither reads nor raises the counter, and excludes fenced ones.
    let plain = c.try_lock("acct", TTL).expect("plain");
    assert!(c.try_lock_fenced("acct", TTL).unwrap_err().is_contended());
    plain.release().expect("release");
    let second = c.try_lock_fenced("acct", TTL).expect("fenced again");
    assert_eq!(second.fencing_token(), t1 + 1);
}

#[test]
fn a_counter_that_is_not_a_number_fails_the_node_instead_of_counting_from_zero() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(cluster.urls());
    for addr in &addrs[..2] {
        set(*addr, b"redlock-mux:fence:{doc}", b"not a number");
    }
    let err = c.try_lock_fenced("doc", TTL).unwrap_err();
    let Error::QuorumUnreachable { failures, .. } = &err else {
        panic!("expected QuorumUnreachable, got {err}");
    };
    assert_eq!(failures.len(), 2);
    for f in failures {
        assert!(
            matches!(&f.kind, NodeErrorKind::Server { message, .. } if message.contains("fence counter")),
            "{f}"
        );
    }
    // The node that granted was released again, and nobody holds the key.
    let deadline = Instant::now() + Duration::from_secs(2);
    while get(addrs[2], b"doc").is_some() {
        assert!(Instant::now() < deadline, "lost attempt not released");
        thread::sleep(Duration::from_millis(5));
    }
    for addr in &addrs[..2] {
        assert_settles_eq!(get(*addr, b"doc"), None);
    }
}

/// Node 2 is down while tokens are issued on nodes 0 and 1; then node 0 restarts, node 1 goes
/// down and node 2 comes back, so the next quorum is {0, 2}: only node 0 can remember the
/// latest token. Returns that token and the next one.
fn token_after_restart(server_args: &[&str]) -> (u64, u64) {
    let mut servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(server_args).expect("redis-server"))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    servers[2].kill().expect("kill");
    let c = client(urls.clone());
    let mut last = 0;
    for _ in 0..50 {
        let lock = c.try_lock_fenced("restart", TTL).expect("grant on {0, 1}");
        assert!(lock.fencing_token() > last);
        last = lock.fencing_token();
        lock.release().expect("release");
    }
    servers[0].restart().expect("restart 0");
    servers[1].kill().expect("kill 1");
    servers[2].restart().expect("restart 2");
    let next = client(urls)
        .try_lock_fenced("restart", TTL)
        .expect("grant on {0, 2}")
        .fencing_token();
    (last, next)
}

#[test]
fn a_node_restarted_with_aof_always_keeps_its_counter() {
    let (last, next) = token_after_restart(&["--appendonly", "yes", "--appendfsync", "always"]);
    assert_eq!(last, 50);
    assert_eq!(next, last + 1);
}

#[test]
fn a_node_restarted_without_persistence_forgets_and_tokens_go_back() {
    // The limit the docs state: a node that loses its counter breaks strict increase.
    let (last, next) = token_after_restart(&[]);
    assert_eq!(last, 50);
    assert_eq!(next, 1);
}
