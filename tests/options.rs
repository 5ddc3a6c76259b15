//! Per-call options: a waiting acquisition of every kind waits as its `Acquire` says, in place
//! of the client's wait timeout and retry count.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Acquire, Client, Deadline, Error, InvalidArgument};

const TTL: Duration = Duration::from_secs(10);

/// A client that would wait a minute by default.
fn client(cluster: &RedisCluster) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_millis(40))
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Each kind, waiting with `opts` on a resource held by a write lock (a set: by a mutex on one
/// of its keys).
fn each_kind(c: &Client, opts: &Acquire) -> Vec<(&'static str, Error)> {
    let key = "opt:res";
    vec![
        ("lock", c.lock_with("opt:m", TTL, opts).unwrap_err()),
        ("read", c.read_lock_with(key, TTL, opts).unwrap_err()),
        ("write", c.write_lock_with(key, TTL, opts).unwrap_err()),
        (
            "all",
            c.lock_all_with(["opt:m", "opt:n"], TTL, opts).unwrap_err(),
        ),
        (
            "fenced",
            c.lock_fenced_with("opt:m", TTL, opts).unwrap_err(),
        ),
        (
            "fenced write",
            c.write_lock_fenced_with(key, TTL, opts).unwrap_err(),
        ),
    ]
}

#[test]
fn a_call_waits_its_own_timeout_deadline_and_retry_count() {
    let cluster = RedisCluster::start(3).unwrap();
    let holder = client(&cluster);
    let _m = holder.lock("opt:m", TTL).unwrap();
    let _w = holder.write_lock("opt:res", TTL).unwrap();
    let c = client(&cluster);

    let t0 = Instant::now();
    for (kind, e) in each_kind(&c, &Acquire::new().timeout(Duration::from_millis(150))) {
        assert_eq!(e.deadline(), Some(Deadline::WaitTimeout), "{kind}: {e}");
        assert!(e.is_contended(), "{kind}: {e}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "six 150 ms waits took {:?}",
        t0.elapsed()
    );

    for (kind, e) in each_kind(&c, &Acquire::new().retries(2)) {
        assert_eq!(e.deadline(), Some(Deadline::RetryCount), "{kind}: {e}");
    }

    // A deadline ends the wait, and the earlier of deadline and timeout wins.
    let t0 = Instant::now();
    let opts = Acquire::new()
        .deadline(Instant::now() + Duration::from_millis(200))
        .timeout(Duration::from_secs(30));
    let e = c.lock_with("opt:m", TTL, &opts).unwrap_err();
    assert_eq!(e.deadline(), Some(Deadline::WaitTimeout), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // A deadline already past leaves one attempt; a free lock is still taken.
    let past = Acquire::new().deadline(Instant::now());
    let e = c.lock_with("opt:m", TTL, &past).unwrap_err();
    assert!(e.is_contended(), "{e}");
    c.lock_with("opt:free", TTL, &past)
        .unwrap()
        .release()
        .unwrap();

    // The options wait for the lock like `lock` does.
    let opts = Acquire::new().timeout(Duration::from_secs(5));
    let waiter = std::thread::spawn({
        let c = c.clone();
        move || c.lock_with("opt:m", TTL, &opts).map(|l| l.release())
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(_m);
    waiter.join().unwrap().unwrap().unwrap();
}

#[test]
fn a_timeout_longer_than_a_day_is_refused() {
    let cluster = RedisCluster::start(1).unwrap();
    let c = client(&cluster);
    let e = c
        .lock_with(
            "k",
            TTL,
            &Acquire::new().timeout(Duration::from_secs(2 * 24 * 3600)),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(InvalidArgument::BadOption {
                name: "timeout",
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(dbsize(cluster.addrs()[0]), 0);
}
