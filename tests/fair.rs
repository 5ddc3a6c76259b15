//! The FIFO-fair policy against real redis-server: waiters from several processes are served in
//! arrival order, and a waiter that dies while queued blocks nobody past its entry's expiry.

mod common;

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::Client;

const CHILD_ENV: &str = "REDLOCK_FAIR_CHILD";
const TTL: Duration = Duration::from_secs(10);

fn fair_client(urls: &[String], retry_delay: Duration) -> Client {
    Client::builder()
        .nodes(urls)
        .fair(true)
        .retry_delay(retry_delay)
        .retry_count(10_000)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Spawns this test binary as a waiter process: it locks `key` fairly, appends `id` to the list
/// `order` on node 0, holds the lock briefly and releases it.
fn spawn_waiter(urls: &[String], key: &str, id: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "waiter_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, format!("{}|{key}|{id}", urls.join(",")))
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The body of a waiter process; does nothing when run as an ordinary test.
#[test]
fn waiter_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split('|');
    let urls: Vec<String> = parts.next().unwrap().split(',').map(String::from).collect();
    let key = parts.next().unwrap().to_owned();
    let id = parts.next().unwrap().to_owned();
    let client = fair_client(&urls, Duration::from_millis(100));
    let lock = client.lock(&key, TTL).expect("waiter gets the lock");
    let node0 = urls[0].trim_start_matches("redis://").parse().unwrap();
    cmd(node0, &[b"RPUSH", b"order", id.as_bytes()]);
    thread::sleep(Duration::from_millis(30));
    lock.release().unwrap();
}

fn queue_len(addr: std::net::SocketAddr, key: &str) -> i64 {
    match cmd(addr, &[b"ZCARD", format!("{{{key}}}:q").as_bytes()]) {
        Value::Integer(n) => n,
        other => panic!("ZCARD: {other:?}"),
    }
}

fn wait_for_queue(cluster: &RedisCluster, key: &str, len: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.addrs().iter().any(|a| queue_len(*a, key) < len) {
        assert!(Instant::now() < deadline, "waiters did not queue");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn waiters_from_several_processes_acquire_in_arrival_order() {
    let cluster = RedisCluster::start(3).unwrap();
    let urls = cluster.urls();
    let holder = fair_client(&urls, Duration::from_millis(100));
    let lock = holder.lock("fifo", TTL).unwrap();
    let mut children = Vec::new();
    for id in 0..5 {
        children.push(spawn_waiter(&urls, "fifo", id));
        // Each waiter is queued on every node before the next one arrives.
        wait_for_queue(&cluster, "fifo", id as i64 + 1);
    }
    lock.release().unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let order = cmd(cluster.addrs()[0], &[b"LRANGE", b"order", b"0", b"-1"]);
    let want: Vec<Value> = (0..5)
        .map(|i| Value::Bulk(Some(i.to_string().into_bytes())))
        .collect();
    assert_eq!(order, Value::Array(Some(want)));
    for addr in cluster.addrs() {
        assert_settles_eq!(queue_len(addr, "fifo"), 0, "the queue is left empty");
        assert_settles_eq!(get(addr, b"fifo"), None, "the lock is free");
    }
}

#[test]
fn a_waiter_killed_while_queued_blocks_nobody_past_its_expiry() {
    let cluster = RedisCluster::start(3).unwrap();
    let urls = cluster.urls();
    let holder = fair_client(&urls, Duration::from_millis(100));
    let lock = holder.lock("dead", TTL).unwrap();
    // The first waiter queues, so it is the head, then dies without leaving.
    let mut doomed = spawn_waiter(&urls, "dead", 0);
    wait_for_queue(&cluster, "dead", 1);
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let next = fair_client(&urls, Duration::from_millis(100));
    let t = thread::spawn(move || {
        let l = next.lock("dead", TTL).unwrap();
        let at = Instant::now();
        l.release().unwrap();
        at
    });
    // Give the next waiter time to fail once and queue behind the dead one.
    thread::sleep(Duration::from_millis(150));
    let released = Instant::now();
    lock.release().unwrap();
    let acquired = t.join().unwrap();
    // The dead entry lives 3 × 100 ms + 50 ms after its last refresh; allow generous slack.
    let waited = acquired.saturating_duration_since(released);
    assert!(waited < Duration::from_secs(5), "blocked for {waited:?}");
    assert_eq!(
        cmd(cluster.addrs()[0], &[b"LRANGE", b"order", b"0", b"-1"]),
        Value::Array(Some(vec![])),
        "the dead waiter never got the lock"
    );
}

#[test]
fn a_free_fair_lock_needs_no_queue() {
    let cluster = RedisCluster::start(3).unwrap();
    let c = fair_client(&cluster.urls(), Duration::from_millis(100));
    let lock = c.try_lock("free", TTL).unwrap();
    for addr in cluster.addrs() {
        assert_settles_eq!(
            keys(addr),
            vec![b"free".to_vec()],
            "only the lock key exists"
        );
    }
    lock.release().unwrap();
    for addr in cluster.addrs() {
        assert_settles_eq!(dbsize(addr), 0);
    }
}

fn rw_queue_len(addr: std::net::SocketAddr, key: &str) -> i64 {
    match cmd(addr, &[b"ZCARD", format!("{{rw:{key}}}:q").as_bytes()]) {
        Value::Integer(n) => n,
        other => panic!("ZCARD: {other:?}"),
    }
}

/// Readers at the head of the queue share the lock; a writer behind them waits for both, and a
/// reader behind the writer waits for the writer.
#[test]
fn consecutive_readers_at_the_head_share_and_later_arrivals_wait_their_turn() {
    use std::sync::{Arc, Mutex};
    let cluster = RedisCluster::start(3).unwrap();
    let urls = cluster.urls();
    let holder = fair_client(&urls, Duration::from_millis(100));
    let first = holder.write_lock("doc", TTL).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for (i, write) in [false, false, true, false].into_iter().enumerate() {
        let client = fair_client(&urls, Duration::from_millis(100));
        let log = log.clone();
        threads.push(thread::spawn(move || {
            let hold = Duration::from_millis(150);
            let (start, end) = if write {
                let g = client.write_lock("doc", TTL).unwrap();
                let start = Instant::now();
                thread::sleep(hold);
                let end = Instant::now();
                g.release().unwrap();
                (start, end)
            } else {
                let g = client.read_lock("doc", TTL).unwrap();
                let start = Instant::now();
                thread::sleep(hold);
                let end = Instant::now();
                g.release().unwrap();
                (start, end)
            };
            log.lock().unwrap().push((i, start, end));
        }));
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster
            .addrs()
            .iter()
            .any(|a| rw_queue_len(*a, "doc") < i as i64 + 1)
        {
            assert!(Instant::now() < deadline, "waiter {i} did not queue");
            thread::sleep(Duration::from_millis(10));
        }
    }
    first.release().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let mut log = log.lock().unwrap().clone();
    log.sort_by_key(|e| e.0);
    let [(_, r1s, r1e), (_, r2s, r2e), (_, ws, we), (_, r3s, _)] = log[..] else {
        panic!("{log:?}")
    };
    assert!(
        r1s < r2e && r2s < r1e,
        "the two readers at the head held the lock together"
    );
    assert!(ws >= r1e && ws >= r2e, "the writer waited for both readers");
    assert!(
        r3s >= we,
        "the last reader waited for the writer ahead of it"
    );
    for addr in cluster.addrs() {
        assert_settles_eq!(rw_queue_len(addr, "doc"), 0);
    }
}

/// A continuous stream of overlapping readers cannot keep a fair writer out: once it has
/// queued, new readers queue behind it.
#[test]
fn a_stream_of_readers_does_not_starve_a_fair_writer() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cluster = RedisCluster::start(3).unwrap();
    let urls = cluster.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let client = fair_client(&urls, Duration::from_millis(20));
            let stop = stop.clone();
            thread::spawn(move || {
                let mut n = 0;
                let end = Instant::now() + Duration::from_secs(15);
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    let g = client.read_lock("feed", TTL).unwrap();
                    thread::sleep(Duration::from_millis(40));
                    g.release().unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    // Let the readers overlap so that the lock is never free of readers.
    thread::sleep(Duration::from_millis(300));
    let writer = fair_client(&urls, Duration::from_millis(20));
    let asked = Instant::now();
    let g = writer.write_lock("feed", TTL).unwrap();
    let waited = asked.elapsed();
    g.release().unwrap();
    stop.store(true, Ordering::Relaxed);
    let reads: usize = readers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(reads > 8, "the readers kept reading ({reads})");
    // Bound: the readers ahead of it finish their 40 ms holds, plus wake-ups and rounds.
    assert!(
        waited < Duration::from_secs(3),
        "the writer waited {waited:?}"
    );
}

/// What one waiter of [`queued_in_order_then_released`] saw: when it got the lock, and when it
/// let it go (or why it did not get it).
type Held = Result<(Instant, Instant), String>;

/// Under `fair(true)` with `policy`: a writer holds `key`; a reader, a writer and a reader
/// queue behind it in that order; the holder releases. Returns the instant of the release and
/// what each waiter saw, in queue order. Each waiter holds its lock for 100 ms.
fn queued_in_order_then_released(
    cluster: &RedisCluster,
    key: &'static str,
    policy: redlock_mux::RwPolicy,
) -> (Instant, Vec<Held>) {
    let fair_rw = || {
        Client::builder()
            .nodes(cluster.urls())
            .fair(true)
            .rw_policy(policy)
            .retry_delay(Duration::from_millis(100))
            .wait_timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let holder = fair_rw().write_lock(key, TTL).unwrap();
    let mut waiters = Vec::new();
    for (i, write) in [false, true, false].into_iter().enumerate() {
        let client = fair_rw();
        waiters.push(thread::spawn(move || -> Held {
            let hold = |start: Instant| {
                thread::sleep(Duration::from_millis(100));
                (start, Instant::now())
            };
            if write {
                let g = client.write_lock(key, TTL).map_err(|e| e.to_string())?;
                let held = hold(Instant::now());
                g.release().map_err(|e| e.to_string())?;
                Ok(held)
            } else {
                let g = client.read_lock(key, TTL).map_err(|e| e.to_string())?;
                let held = hold(Instant::now());
                g.release().map_err(|e| e.to_string())?;
                Ok(held)
            }
        }));
        // Each waiter is queued on every node before the next one arrives.
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster
            .addrs()
            .iter()
            .any(|a| rw_queue_len(*a, key) < i as i64 + 1)
        {
            assert!(Instant::now() < deadline, "waiter {i} did not queue");
            thread::sleep(Duration::from_millis(5));
        }
    }
    // Let every waiter go through at least one more lost round (and its cleanup) while queued.
    thread::sleep(Duration::from_millis(300));
    let released = Instant::now();
    holder.release().unwrap();
    let held = waiters.into_iter().map(|t| t.join().unwrap()).collect();
    (released, held)
}

/// The reader at the head of a fair queue gets a released lock at once, whatever the policy:
/// under `WritePreferring`, the writer queued behind it must not hold it back with its intent
/// (while the queue holds the writer back behind the reader). Then the queue order is kept.
#[test]
fn the_reader_at_the_head_of_a_fair_queue_gets_a_released_lock_at_once_under_either_policy() {
    use redlock_mux::RwPolicy;
    let cluster = RedisCluster::start(3).unwrap();
    for (policy, key) in [
        (RwPolicy::WritePreferring, "head-wp"),
        (RwPolicy::ReadPreferring, "head-rp"),
    ] {
        let (released, held) = queued_in_order_then_released(&cluster, key, policy);
        let at = |h: &Held| match h {
            Ok((s, _)) => Ok(s.saturating_duration_since(released)),
            Err(e) => Err(e.clone()),
        };
        let summary = format!(
            "{policy:?}: from the release, reader 1 {:?}, writer {:?}, reader 2 {:?}",
            at(&held[0]),
            at(&held[1]),
            at(&held[2])
        );
        // One round trip after the release announcement; generous for a loaded machine.
        assert!(
            matches!(at(&held[0]), Ok(d) if d < Duration::from_millis(500)),
            "the reader at the head did not get the lock at once. {summary}"
        );
        let [Ok((_, r1e)), Ok((ws, we)), Ok((r2s, _))] = held[..] else {
            panic!("a waiter did not get the lock. {summary}");
        };
        assert!(
            ws >= r1e,
            "{policy:?}: the writer waited for the reader ahead of it"
        );
        assert!(
            r2s >= we,
            "{policy:?}: the last reader waited for the writer ahead of it"
        );
        for addr in cluster.addrs() {
            assert_settles_eq!(rw_queue_len(addr, key), 0, "{policy:?}: the queue is empty");
            assert_settles_eq!(
                cmd(addr, &[b"EXISTS", format!("{{rw:{key}}}:wi").as_bytes()]),
                Value::Integer(0),
                "{policy:?}: no intent is left"
            );
        }
    }
}

/// Eight fair waiters take turns on one lock: at each release only the head of the queue (and
/// at the most the one behind it, which cannot know whether the lock was held when it learnt
/// its place) tries again, not every waiter. Without ranks, each waiter retried at every
/// release it waited through: about one retry per waiter ahead of it.
#[test]
fn at_a_release_only_the_head_of_a_fair_queue_tries_again() {
    const WAITERS: usize = 8;
    const CYCLES: usize = 4;
    let cluster = RedisCluster::start(3).unwrap();
    // No backstop retry within the test: every retry is a wake-up or follows a subscription.
    let client = fair_client(&cluster.urls(), Duration::from_secs(5));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(WAITERS));
    let threads: Vec<_> = (0..WAITERS)
        .map(|_| {
            let client = client.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..CYCLES {
                    let lock = client.lock("turns", TTL).unwrap();
                    thread::sleep(Duration::from_millis(2));
                    lock.release().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = client.stats();
    let acquisitions = (WAITERS * CYCLES) as u64;
    println!(
        "{acquisitions} acquisitions: {} retries, {} wake-ups",
        stats.retries, stats.wakeups
    );
    // Per acquisition: the retry once subscribed, the retry as the head, and now and then one
    // or two more; waiting through seven releases and retrying at each makes about eight.
    assert!(
        stats.retries <= 5 * acquisitions,
        "{} retries for {acquisitions} acquisitions",
        stats.retries
    );
    for addr in cluster.addrs() {
        assert_eq!(queue_len(addr, "turns"), 0, "every waiter left the queue");
    }
}
