//! Auto-extension against real redis-server processes: a kept lock outlives its TTL, a stolen
//! or unreachable one is reported lost, and `with_lock` holds the lock through its closure.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Client, Error, KeepAlive};

const KEY: &str = "keepalive:job";

fn client(cluster: &RedisCluster) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .expect("client")
}

/// Whether a second client, with its own connections, is refused the lock right now.
fn held(cluster: &RedisCluster) -> bool {
    matches!(
        client(cluster).try_lock(KEY, Duration::from_secs(1)),
        Err(Error::Contended { .. })
    )
}

#[test]
fn kept_lock_outlives_its_ttl_and_release_frees_it() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_millis(600);
    let kept = c
        .try_lock(KEY, ttl)
        .expect("lock")
        .keep_alive(KeepAlive::new(ttl));
    // Five TTLs: without extensions the key would have expired four times over.
    for _ in 0..10 {
        thread::sleep(Duration::from_millis(300));
        assert!(!kept.is_lost());
        assert!(held(&cluster), "another client got a kept lock");
    }
    assert!(kept.validity() > Duration::ZERO);
    for server in &cluster.servers {
        assert_eq!(
            get(server.addr(), KEY.as_bytes()).as_deref(),
            Some(kept.token())
        );
    }
    kept.release().expect("release");
    for server in &cluster.servers {
        assert_eq!(get(server.addr(), KEY.as_bytes()), None);
    }
    assert!(!held(&cluster));
}

#[test]
fn a_refused_extension_marks_the_lock_lost_and_notifies() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_secs(3);
    let (tx, lost) = mpsc::channel();
    let kept = c.try_lock(KEY, ttl).expect("lock").keep_alive(
        KeepAlive::new(ttl)
            .interval(Duration::from_millis(100))
            .notify(tx),
    );
    // Someone (an operator, a bug) overwrites the key on every node.
    for server in &cluster.servers {
        set(server.addr(), KEY.as_bytes(), b"intruder");
    }
    let notice = lost
        .recv_timeout(Duration::from_secs(2))
        .expect("lost notice");
    assert_eq!(notice.key, KEY.as_bytes());
    assert!(
        matches!(notice.error, Error::Contended { .. }),
        "{:?}",
        notice.error
    );
    assert!(kept.is_lost());
    assert_eq!(kept.validity(), Duration::ZERO);
    // Releasing a lost lock leaves the other holder's key alone.
    kept.release().expect("release");
    for server in &cluster.servers {
        assert_eq!(
            get(server.addr(), KEY.as_bytes()).as_deref(),
            Some(&b"intruder"[..])
        );
    }
}

#[test]
fn validity_running_out_marks_the_lock_lost_and_calls_back() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(20))
        .build()
        .expect("client");
    let ttl = Duration::from_millis(800);
    let (tx, lost) = mpsc::channel();
    let kept = c.try_lock(KEY, ttl).expect("lock").keep_alive(
        KeepAlive::new(ttl)
            .retry(Duration::from_millis(50))
            .on_lost(move |notice| {
                let _ = tx.send((Instant::now(), notice));
            }),
    );
    // Every node stops answering: extensions cannot win, and the validity runs out.
    for server in &cluster.servers {
        server.pause().expect("pause");
    }
    let paused = Instant::now();
    let got = lost.recv_timeout(Duration::from_secs(3));
    for server in &cluster.servers {
        server.resume().expect("resume");
    }
    let (at, notice) = got.expect("lost notice");
    assert!(
        matches!(notice.error, Error::ValidityExpired { .. }),
        "{:?}",
        notice.error
    );
    assert!(kept.is_lost());
    // Lost no later than the TTL after the nodes went quiet, plus a retry and a node timeout.
    assert!(at.duration_since(paused) <= ttl + Duration::from_millis(500));
}

#[test]
fn with_lock_holds_the_lock_through_the_closure_and_releases_it() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_millis(500);
    let out = c
        .with_lock(KEY, ttl, |guard| {
            for _ in 0..6 {
                thread::sleep(Duration::from_millis(250));
                assert!(held(&cluster), "the lock was free during the closure");
            }
            assert_eq!(guard.key(), KEY.as_bytes());
            !guard.is_lost()
        })
        .expect("with_lock");
    assert!(out, "the lock was lost during the closure");
    for server in &cluster.servers {
        assert_eq!(get(server.addr(), KEY.as_bytes()), None);
    }
}

#[test]
fn many_guards_of_one_client_are_all_kept() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_millis(500);
    let guards: Vec<_> = (0..20)
        .map(|i| {
            c.try_lock(format!("keepalive:many:{i}"), ttl)
                .expect("lock")
                .keep_alive(KeepAlive::new(ttl))
        })
        .collect();
    thread::sleep(Duration::from_millis(1500));
    for g in &guards {
        assert!(!g.is_lost());
        assert!(pttl(cluster.servers[0].addr(), g.key()) > 0, "key expired");
    }
    drop(guards);
    // Each drop returns once a quorum released; the last node may trail a little.
    let deadline = Instant::now() + Duration::from_secs(1);
    while dbsize(cluster.servers[0].addr()) != 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dbsize(cluster.servers[0].addr()), 0);
}

#[test]
fn kept_read_and_write_locks_outlive_their_ttl() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let other = client(&cluster);
    let ttl = Duration::from_millis(600);
    let rw_key = "keepalive:rw";
    let reader = c
        .try_read_lock(rw_key, ttl)
        .expect("read lock")
        .keep_alive(KeepAlive::new(ttl));
    // Three TTLs: an unextended reader would have expired and let the writer in.
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(300));
        assert!(!reader.is_lost());
        assert!(
            matches!(
                other.try_write_lock(rw_key, ttl),
                Err(Error::Contended { .. })
            ),
            "a writer got in past a kept reader"
        );
    }
    reader.release().expect("release reader");
    let writer = c
        .try_write_lock(rw_key, ttl)
        .expect("write lock")
        .keep_alive(KeepAlive::new(ttl));
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(300));
        assert!(!writer.is_lost());
        assert!(
            matches!(
                other.try_read_lock(rw_key, ttl),
                Err(Error::Contended { .. })
            ),
            "a reader got in past a kept writer"
        );
    }
    writer.release().expect("release writer");
    other
        .try_read_lock(rw_key, ttl)
        .expect("free after release")
        .release()
        .expect("release");
}

/// A TTL no node can take is a lost lock, reported as such, never a panic in the keeper.
#[test]
fn an_impossible_keep_alive_ttl_is_reported_lost() {
    let cluster = RedisCluster::start(1).expect("start redis-server");
    let c = client(&cluster);
    let (tx, rx) = mpsc::channel();
    let kept = c
        .lock(KEY, Duration::from_secs(2))
        .expect("lock")
        .keep_alive(
            KeepAlive::new(Duration::MAX)
                .interval(Duration::from_millis(10))
                .notify(tx),
        );
    let lost = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the loss is reported");
    assert!(kept.is_lost(), "{lost:?}");
    let _ = kept.release();
}
