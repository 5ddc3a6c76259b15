//! Waiting without polling: a release wakes blocked `lock()` callers through pub/sub, and the
//! jittered retry delay is only the backstop for lost announcements.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::Client;

const TTL: Duration = Duration::from_secs(10);

fn client(cluster: &RedisCluster, retry_delay: Duration) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .retry_delay(retry_delay)
        .retry_count(1000)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The waiter's backstop is 4–12 s, so it can only get the lock in time if the release woke it.
#[test]
fn release_wakes_the_waiter_before_its_retry_delay() {
    for n in [1, 3, 5] {
        let cluster = RedisCluster::start(n).unwrap();
        let holder = client(&cluster, Duration::from_millis(50));
        let waiter = client(&cluster, Duration::from_secs(8));
        let lock = holder.lock("job", TTL).unwrap();
        let (tx, rx) = mpsc::channel();
        let t = thread::spawn(move || {
            let _ = tx.send(());
            let got = waiter.lock("job", TTL).unwrap();
            let at = Instant::now();
            got.release().unwrap();
            at
        });
        rx.recv().unwrap();
        // Let the waiter fail its first attempt and subscribe.
        thread::sleep(Duration::from_millis(300));
        let released = Instant::now();
        lock.release().unwrap();
        let acquired = t.join().unwrap();
        let gap = acquired.saturating_duration_since(released);
        assert!(
            gap < Duration::from_secs(2),
            "N={n}: waiter took {gap:?} after the release, so it slept out its backstop"
        );
        for addr in cluster.addrs() {
            assert_eq!(dbsize(addr), 0, "N={n}: a key was left behind");
        }
    }
}

/// Killing the waiter's subscriber connections loses the announcement; the backstop retry
/// still gets the lock.
#[test]
fn lost_wake_up_falls_back_to_the_retry_delay() {
    let cluster = RedisCluster::start(3).unwrap();
    let holder = client(&cluster, Duration::from_millis(50));
    let waiter = client(&cluster, Duration::from_millis(400));
    let lock = holder.lock("job", TTL).unwrap();
    let t = thread::spawn(move || {
        let start = Instant::now();
        let got = waiter.lock("job", TTL).unwrap();
        drop(got);
        start.elapsed()
    });
    thread::sleep(Duration::from_millis(300));
    for addr in cluster.addrs() {
        // Subscriber connections are the only ones of type pubsub.
        cmd(addr, &[b"CLIENT", b"KILL", b"TYPE", b"pubsub"]);
    }
    lock.release().unwrap();
    let waited = t.join().unwrap();
    assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    for addr in cluster.addrs() {
        assert_eq!(dbsize(addr), 0);
    }
}

/// A release is announced on the key's wake channel by the release script itself.
#[test]
fn release_publishes_on_the_wake_channel() {
    let cluster = RedisCluster::start(1).unwrap();
    let addr = cluster.addrs()[0];
    let c = client(&cluster, Duration::from_millis(50));
    let lock = c.lock("chan", TTL).unwrap();
    let subscriber = thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        redlock_mux::resp::encode_command(&mut out, &[b"SUBSCRIBE", b"redlock-mux:wake:chan"]);
        s.write_all(&out).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let n = s.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if got.windows(7).any(|w| w == b"message") {
                break;
            }
        }
        got
    });
    thread::sleep(Duration::from_millis(200));
    lock.release().unwrap();
    let got = subscriber.join().unwrap();
    assert!(
        got.windows(7).any(|w| w == b"message"),
        "no message: {}",
        String::from_utf8_lossy(&got)
    );
}
