//! Cancelling a waiting acquisition from another thread: it returns `Error::Cancelled` at
//! once, at every stage (before its first send, mid-round, parked waiting for a release, in a
//! fair queue), and leaves nothing held on any node.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Acquire, Cancel, Client, Error};

const TTL: Duration = Duration::from_secs(20);
/// How long a cancelled call may take to return: generous, for a loaded machine. Without the
/// cancel each of these calls would block for seconds.
const PROMPT: Duration = Duration::from_millis(300);

/// Every key on `addr` that is not a fence counter (those never expire, by design).
fn lock_keys(addr: std::net::SocketAddr) -> Vec<String> {
    keys(addr)
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .filter(|k| !k.starts_with("redlock-mux:fence:"))
        .collect()
}

/// Runs `acquire` on a thread, cancels it after `after`, and returns how long the call took
/// to return from the cancel, and its error.
fn cancel_after<F>(after: Duration, acquire: F) -> (Duration, Error)
where
    F: FnOnce(&Acquire) -> Result<(), Error> + Send + 'static,
{
    cancel_after_probe(after, acquire, || {})
}

/// [`cancel_after`], running `probe` just before the cancel.
fn cancel_after_probe<F>(after: Duration, acquire: F, probe: impl FnOnce()) -> (Duration, Error)
where
    F: FnOnce(&Acquire) -> Result<(), Error> + Send + 'static,
{
    let cancel = Cancel::new();
    let opts = Acquire::new().cancel(&cancel);
    let t = thread::spawn(move || {
        let r = acquire(&opts);
        (Instant::now(), r)
    });
    thread::sleep(after);
    probe();
    let at = Instant::now();
    cancel.cancel();
    let (returned, r) = t.join().unwrap();
    (returned.saturating_duration_since(at), r.unwrap_err())
}

#[test]
fn cancelled_before_the_first_send_sends_nothing() {
    let cluster = RedisCluster::start(3).unwrap();
    let client = Client::new(cluster.urls()).unwrap();
    let cancel = Cancel::new();
    cancel.cancel();
    let opts = Acquire::new().cancel(&cancel);
    let before: Vec<_> = cluster.addrs().iter().map(|&a| calls_of_set(a)).collect();
    let e = client.lock_with("c:first", TTL, &opts).unwrap_err();
    assert_eq!(e, Error::Cancelled);
    let e = client
        .lock_all_with(["c:a", "c:b"], TTL, &opts)
        .unwrap_err();
    assert_eq!(e, Error::Cancelled);
    for (i, &addr) in cluster.addrs().iter().enumerate() {
        assert_settles_eq!(dbsize(addr), 0, "node {i}");
        assert_settles_eq!(
            calls_of_set(addr),
            before[i],
            "node {i} was sent an attempt"
        );
    }
}

/// How many SET and EVALSHA/EVAL commands `addr` has run.
fn calls_of_set(addr: std::net::SocketAddr) -> u64 {
    let info = cmd(addr, &[b"INFO", b"commandstats"]);
    let text = show(&info);
    ["cmdstat_set:", "cmdstat_evalsha:", "cmdstat_eval:"]
        .iter()
        .filter_map(|name| {
            let at = text.find(name)?;
            let rest = &text[at + name.len()..];
            let calls = rest.strip_prefix("calls=")?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

#[test]
fn cancelled_mid_round_returns_at_once_and_the_attempt_is_undone_everywhere() {
    let cluster = RedisCluster::start(3).unwrap();
    let addrs = cluster.addrs();
    // Node 0 refuses, node 2 grants, node 1 is frozen: the round waits for node 1 until the
    // node timeout (5 s).
    set(addrs[0], b"c:mid", b"someone else");
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    cluster.servers[1].pause().unwrap();
    let (took, e) = cancel_after(Duration::from_millis(200), {
        let client = client.clone();
        move |opts| client.lock_with("c:mid", TTL, opts).map(drop)
    });
    cluster.servers[1].resume().unwrap();
    eprintln!("cancel mid-round returned {took:?} after the cancel");
    assert_eq!(e, Error::Cancelled);
    assert!(took < PROMPT, "took {took:?}");
    // Node 1 runs the attempt, then its cleanup, queued behind it on the same connection.
    for (i, &addr) in addrs.iter().enumerate().skip(1) {
        assert!(
            eventually(Duration::from_secs(3), || lock_keys(addr).is_empty()),
            "node {i} still holds {:?}",
            lock_keys(addr)
        );
    }
    assert_eq!(
        get(addrs[0], b"c:mid").as_deref(),
        Some(&b"someone else"[..])
    );
}

/// Every kind, parked waiting for a release with its backstop seconds away.
#[test]
fn cancelled_while_waiting_for_a_release_every_kind() {
    let cluster = RedisCluster::start(3).unwrap();
    let holder = Client::new(cluster.urls()).unwrap();
    let waiter = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    type Acquire3 = fn(&Client, &Acquire) -> Result<(), Error>;
    let kinds: [(&str, Acquire3); 6] = [
        ("lock", |c, o| c.lock_with("c:m", TTL, o).map(drop)),
        ("read", |c, o| c.read_lock_with("c:rw", TTL, o).map(drop)),
        ("write", |c, o| c.write_lock_with("c:rw", TTL, o).map(drop)),
        ("all", |c, o| {
            c.lock_all_with(["c:m", "c:other"], TTL, o).map(drop)
        }),
        ("fenced", |c, o| c.lock_fenced_with("c:m", TTL, o).map(drop)),
        ("fenced write", |c, o| {
            c.write_lock_fenced_with("c:rw", TTL, o).map(drop)
        }),
    ];
    let mut worst = Duration::ZERO;
    for (kind, acquire) in kinds {
        let m = holder.lock("c:m", TTL).unwrap();
        let w = holder.write_lock("c:rw", TTL).unwrap();
        let (took, e) = cancel_after(Duration::from_millis(300), {
            let waiter = waiter.clone();
            move |opts| acquire(&waiter, opts)
        });
        assert_eq!(e, Error::Cancelled, "{kind}");
        assert!(took < PROMPT, "{kind}: took {took:?}");
        worst = worst.max(took);
        // The holder's locks are untouched; once they are released, nothing is left.
        // (The last node may get the holder's SET moments after its lock returned.)
        for (i, &addr) in cluster.addrs().iter().enumerate() {
            assert!(
                eventually(Duration::from_secs(2), || get(addr, b"c:m").as_deref()
                    == Some(m.token())),
                "{kind}: node {i}"
            );
        }
        m.release().unwrap();
        w.release().unwrap();
        // A release returns at the quorum; the last node gets it moments later.
        for (i, &addr) in cluster.addrs().iter().enumerate() {
            assert!(
                eventually(Duration::from_secs(2), || lock_keys(addr).is_empty()),
                "{kind}: node {i}: {:?}",
                lock_keys(addr)
            );
        }
    }
    eprintln!("cancel while waiting: slowest return {worst:?} after the cancel");
}

#[test]
fn cancelled_in_a_fair_queue_leaves_the_queue_on_every_node() {
    let cluster = RedisCluster::start(3).unwrap();
    let client = Client::builder()
        .nodes(cluster.urls())
        .fair(true)
        .retry_delay(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for kind in ["lock", "write"] {
        let held = client.lock("c:fair", TTL).unwrap();
        let w = client.write_lock("c:fairrw", TTL).unwrap();
        let addrs = cluster.addrs();
        let (took, e) = cancel_after_probe(
            Duration::from_millis(300),
            {
                let client = client.clone();
                move |opts| match kind {
                    "lock" => client.lock_with("c:fair", TTL, opts).map(drop),
                    _ => client.write_lock_with("c:fairrw", TTL, opts).map(drop),
                }
            },
            || {
                // The waiter is queued on every node by now.
                for (i, &addr) in addrs.iter().enumerate() {
                    assert!(lock_keys(addr).len() > 2, "{kind}: node {i}: not queued");
                }
            },
        );
        eprintln!("cancel in a fair queue ({kind}) returned {took:?} after the cancel");
        assert_eq!(e, Error::Cancelled);
        assert!(took < PROMPT, "took {took:?}");
        // Only the holders' keys are left: no queue entry, no queue.
        for (i, &addr) in cluster.addrs().iter().enumerate() {
            let sorted = || {
                let mut left = lock_keys(addr);
                left.sort();
                left
            };
            assert_settles_eq!(
                sorted(),
                vec!["c:fair".to_owned(), "{rw:c:fairrw}:w".to_owned()],
                "{kind}: node {i}"
            );
        }
        held.release().unwrap();
        w.release().unwrap();
    }
}

#[test]
fn a_cancel_does_not_touch_a_lock_already_won() {
    let cluster = RedisCluster::start(3).unwrap();
    let client = Client::new(cluster.urls()).unwrap();
    let cancel = Cancel::new();
    let lock = client
        .lock_with("c:won", TTL, &Acquire::new().cancel(&cancel))
        .unwrap();
    cancel.cancel();
    assert!(lock.validity() > Duration::ZERO);
    for &addr in &cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || get(addr, b"c:won")
            .as_deref()
            == Some(lock.token())));
    }
    lock.release().unwrap();
}

/// Several waiters share one client: one of them polls for all (the leader) while the others
/// are parked. Cancelling each, the parked ones included, makes it return at once, and the
/// ones left waiting still get the lock once it is released.
#[test]
fn cancelled_waiters_sharing_a_client_return_at_once_leader_or_parked() {
    let cluster = RedisCluster::start(3).unwrap();
    // A long retry delay: only the cancel (or a release) can end a wait in time.
    let client = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let holder = client.lock("c:shared", TTL).unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (client, cancel) = (client.clone(), Cancel::new());
            let opts = Acquire::new().cancel(&cancel);
            let t = thread::spawn(move || {
                let r = client
                    .lock_with("c:shared", TTL, &opts)
                    .map(|l| l.release());
                (Instant::now(), r)
            });
            (cancel, t)
        })
        .collect();
    // Every waiter has tried once and waits: one leads, the others are parked.
    thread::sleep(Duration::from_millis(300));
    let mut waiters = waiters.into_iter();
    for (cancel, t) in waiters.by_ref().take(3) {
        let at = Instant::now();
        cancel.cancel();
        let (returned, r) = t.join().unwrap();
        assert_eq!(r.unwrap_err(), Error::Cancelled);
        let took = returned.saturating_duration_since(at);
        assert!(took < PROMPT, "a cancelled waiter took {took:?} to return");
    }
    // The last one is still waiting, and gets the lock at the release.
    holder.release().unwrap();
    for (_, t) in waiters {
        let (_, r) = t.join().unwrap();
        assert!(matches!(r, Ok(Ok(()))), "{r:?}");
    }
    for addr in cluster.addrs() {
        eventually(Duration::from_secs(3), || lock_keys(addr).is_empty());
    }
}
