//! Waiting without polling: a release wakes blocked `lock()` callers through pub/sub, and the
//! jittered retry delay is only the backstop for lost announcements.

mod common;
use redlock_mux_kit::fault_proxy;

use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
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
            assert_settles_eq!(dbsize(addr), 0, "N={n}: a key was left behind");
        }
    }
}

/// The nodes run a release one after another. Node 0 runs it first; the holder's release
/// reaches nodes 1 to 4 300 µs later (through delaying proxies), after the retry that node 0's
/// announcement set off: they refuse it, then run the release and announce it, within a
/// millisecond of node 0's announcement. Those announcements are news for the retry, which
/// they postdate: the waiter must try again then, not sleep out its 4–12 s backstop. (The
/// waiter reaches nodes 1 to 4 through proxies too, slow while it makes its first attempts, so
/// that node 0's refusal is among those that decide them and its announcement wakes it.)
#[test]
fn a_release_that_reaches_a_node_after_the_retry_it_set_off_still_wakes_the_waiter() {
    let cluster = RedisCluster::start(5).unwrap();
    let addrs = cluster.addrs();
    let proxies = |delay| -> Vec<fault_proxy::FaultProxy> {
        addrs[1..]
            .iter()
            .map(|&a| fault_proxy::FaultProxy::start(a, delay).unwrap())
            .collect()
    };
    let set = |ps: &[fault_proxy::FaultProxy], fault| ps.iter().for_each(|p| p.set(fault));
    let through = |ps: &[fault_proxy::FaultProxy]| {
        let mut urls = cluster.urls();
        for (i, p) in ps.iter().enumerate() {
            urls[i + 1] = p.url();
        }
        urls
    };
    let build = |urls: Vec<String>, retry_delay| {
        Client::builder()
            .nodes(urls)
            .node_timeout(Duration::from_secs(1))
            .retry_delay(retry_delay)
            .retry_count(1000)
            .wait_timeout(Duration::from_secs(20))
            .build()
            .unwrap()
    };
    let (holder_paths, waiter_paths) = (
        proxies(Duration::from_micros(300)),
        proxies(Duration::from_millis(5)),
    );
    let holder = build(through(&holder_paths), Duration::from_millis(50));
    let waiter = build(through(&waiter_paths), Duration::from_secs(8));
    // The timing is not in the test's hands: on a busy machine one round may miss it, so
    // there are several.
    for round in 0..8 {
        let lock = holder.lock("late", TTL).unwrap();
        set(&waiter_paths, fault_proxy::ProxyFault::Delay);
        let w = waiter.clone();
        let t = thread::spawn(move || {
            let got = w.lock("late", TTL).unwrap();
            let at = Instant::now();
            got.release().unwrap();
            at
        });
        // Let the waiter fail its first attempts and subscribe.
        thread::sleep(Duration::from_millis(500));
        set(&waiter_paths, fault_proxy::ProxyFault::None);
        set(&holder_paths, fault_proxy::ProxyFault::Delay);
        let released = Instant::now();
        lock.release().unwrap();
        set(&holder_paths, fault_proxy::ProxyFault::None);
        let gap = t.join().unwrap().saturating_duration_since(released);
        assert!(
            gap < Duration::from_secs(2),
            "round {round}: the waiter took {gap:?} after the release, so it slept out its backstop"
        );
    }
}

/// A waiter that retries at once, after an attempt lost to two quick refusals while a slow node
/// had yet to grant it, must not meet that attempt's lock there. Node 0 is 300 ms away and node
/// 2 100 ms, node 1 is near; another client's lock is on nodes 1 and 2. An announcement on node
/// 1 sets off an attempt; node 1 refuses it, then its lock goes and node 1 announces it: news
/// for the attempt, which node 2 refuses next, before node 0 grants it. The waiter retries at
/// once, and nodes 0 and 1 are free: it must get the lock then, not after its 5–15 s backstop
/// (the retry would be refused on node 0 by the waiter's own lock if it got there before that
/// lock's cleanup, and the cleanup's announcement, the waiter's own, wakes nobody).
#[test]
fn a_retry_at_once_is_not_refused_by_the_lock_of_the_attempt_it_replaces() {
    let cluster = RedisCluster::start(3).unwrap();
    let addrs = cluster.addrs();
    let far = fault_proxy::FaultProxy::start(addrs[0], Duration::from_millis(300)).unwrap();
    let mid = fault_proxy::FaultProxy::start(addrs[2], Duration::from_millis(100)).unwrap();
    far.set(fault_proxy::ProxyFault::Delay);
    mid.set(fault_proxy::ProxyFault::Delay);
    let mut urls = cluster.urls();
    (urls[0], urls[2]) = (far.url(), mid.url());
    let waiter = Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_secs(3))
        .retry_delay(Duration::from_secs(10))
        .retry_count(1000)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (key, chan, other) = (
        &b"own"[..],
        &b"redlock-mux:wake:own"[..],
        &b"0123456789abcdef"[..],
    );
    // The timing is not in the test's hands: on a busy machine one round may miss it, so
    // there are several.
    for round in 0..4 {
        for &a in &addrs[1..] {
            cmd(a, &[b"SET", key, other, b"PX", b"60000"]);
        }
        let w = waiter.clone();
        let t = thread::spawn(move || {
            let got = w.lock("own", TTL).unwrap();
            let at = Instant::now();
            got.release().unwrap();
            at
        });
        // Let the waiter lose its first attempts, subscribe, and wait.
        thread::sleep(Duration::from_millis(2000));
        cmd(addrs[1], &[b"PUBLISH", chan, other]);
        thread::sleep(Duration::from_millis(50));
        let released = Instant::now();
        cmd(addrs[1], &[b"DEL", key]);
        cmd(addrs[1], &[b"PUBLISH", chan, other]);
        let gap = t.join().unwrap().saturating_duration_since(released);
        assert!(
            gap < Duration::from_secs(3),
            "round {round}: the waiter took {gap:?} after nodes 0 and 1 were free, so it slept \
             out its backstop"
        );
        cmd(addrs[2], &[b"DEL", key]);
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
        assert_settles_eq!(dbsize(addr), 0);
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

/// How many waiters queue up in the crowd tests.
const CROWD: usize = 64;

/// Runs `f` on its own thread and returns what it returns; fails the test (instead of hanging
/// it) once `limit` has passed. The caller keeps the servers, so that they stop either way.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // It panicked: show why.
            std::panic::resume_unwind(t.join().unwrap_err())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("still running after {limit:?}"),
    }
}

/// A client with the default retry settings, as a user would have it, and a long wait timeout:
/// a waiting `lock()` must get the lock however many others are served first. The node timeout
/// is long too: 64 threads with connections of their own on a loaded 2-core machine can miss
/// the default 50 ms, which would fail a release, and that is not what these tests are about.
fn patient(urls: &[String], fair: bool) -> Client {
    Client::builder()
        .nodes(urls)
        .fair(fair)
        .node_timeout(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// `CROWD` waiters of one client each take `key`, note their number in `order` while they
/// hold it, hold it for 10 ms and release it. `arrived(i)` is called after waiter `i` has
/// started. Returns what each waiter's `lock()` returned, by waiter.
fn crowd(
    client: &Client,
    key: &'static str,
    order: &Arc<Mutex<Vec<usize>>>,
    arrived: impl FnMut(usize),
) -> Vec<thread::JoinHandle<Result<(), String>>> {
    crowd_for(client, key, TTL, order, arrived)
}

/// As [`crowd`], with locks of `ttl`.
fn crowd_for(
    client: &Client,
    key: &'static str,
    ttl: Duration,
    order: &Arc<Mutex<Vec<usize>>>,
    mut arrived: impl FnMut(usize),
) -> Vec<thread::JoinHandle<Result<(), String>>> {
    (0..CROWD)
        .map(|i| {
            let (client, order) = (client.clone(), order.clone());
            let t = thread::spawn(move || {
                let lock = client
                    .lock(key, ttl)
                    .map_err(|e| format!("waiter {i}: {e}"))?;
                order.lock().unwrap().push(i);
                thread::sleep(Duration::from_millis(10));
                lock.release().map_err(|e| format!("waiter {i}: {e}"))
            });
            arrived(i);
            t
        })
        .collect()
}

/// A caller parked on the shared client is woken as soon as what it waits for has come, by
/// whichever caller read it: not at its own timeout. With node timeouts and a TTL of a minute,
/// one waiter left asleep with its won round (its replies read by another waiter, which then
/// parked too) holds the lock, unknowing, for that minute: 64 waiters, served in about a
/// second, would take far longer than the 20 s allowed.
#[test]
fn every_waiter_is_woken_by_whichever_caller_read_its_replies() {
    const LONG: Duration = Duration::from_secs(60);
    let cluster = RedisCluster::start(3).unwrap();
    let urls = cluster.urls();
    let served = within(Duration::from_secs(20), move || {
        let holder = patient(&urls, false).lock("crowd", LONG).unwrap();
        let client = Client::builder()
            .nodes(&urls)
            .node_timeout(LONG)
            .wait_timeout(LONG)
            .build()
            .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiters = crowd_for(&client, "crowd", LONG, &order, |_| {});
        thread::sleep(Duration::from_millis(300));
        holder.release().unwrap();
        for t in waiters {
            t.join().unwrap().unwrap();
        }
        let served = order.lock().unwrap().len();
        served
    });
    assert_eq!(served, CROWD);
}

/// Waiters blocked in `lock()` wait up to the wait timeout, however many releases wake them
/// first: 64 fair waiters that arrive one after the other all get the lock, in arrival order.
#[test]
fn sixty_four_fair_waiters_all_get_the_lock_in_arrival_order() {
    let cluster = RedisCluster::start(3).unwrap();
    let (urls, addrs) = (cluster.urls(), cluster.addrs());
    let order = within(Duration::from_secs(30), move || {
        let holder = patient(&urls, true).lock("crowd", TTL).unwrap();
        let client = patient(&urls, true);
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiters = crowd(&client, "crowd", &order, |i| {
            // Waiter i is queued on every node before waiter i + 1 arrives.
            let queued = eventually(Duration::from_secs(10), || {
                addrs
                    .iter()
                    .all(|a| cmd(*a, &[b"ZCARD", b"{crowd}:q"]) == Value::Integer(i as i64 + 1))
            });
            assert!(queued, "waiter {i} did not queue");
        });
        holder.release().unwrap();
        let failed: Vec<String> = waiters
            .into_iter()
            .filter_map(|t| t.join().unwrap().err())
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {CROWD} waiters gave up: {failed:?}",
            failed.len()
        );
        let order = order.lock().unwrap().clone();
        order
    });
    assert_eq!(order, (0..CROWD).collect::<Vec<_>>(), "served out of order");
}

/// The same without a fair queue: 64 waiters that arrive together all get the lock.
#[test]
fn sixty_four_plain_waiters_all_get_the_lock() {
    let cluster = RedisCluster::start(3).unwrap();
    let (urls, addrs) = (cluster.urls(), cluster.addrs());
    let served = within(Duration::from_secs(30), move || {
        let holder = patient(&urls, false).lock("crowd", TTL).unwrap();
        let client = patient(&urls, false);
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiters = crowd(&client, "crowd", &order, |_| {});
        // Let every waiter fail its first attempt and wait.
        thread::sleep(Duration::from_millis(300));
        holder.release().unwrap();
        let failed: Vec<String> = waiters
            .into_iter()
            .filter_map(|t| t.join().unwrap().err())
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {CROWD} waiters gave up: {failed:?}",
            failed.len()
        );
        for addr in addrs {
            assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
        }
        let served = order.lock().unwrap().len();
        served
    });
    assert_eq!(served, CROWD);
}
