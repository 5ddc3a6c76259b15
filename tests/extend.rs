//! A failed extend against real redis-server processes: the guard never claims more validity
//! than the nodes may now hold, for every kind of guard.
//!
//! The scenario: a 10 s lock on 3 nodes; 2 nodes are frozen (SIGSTOP); `extend(300 ms)` fails
//! for want of a quorum, but the frozen nodes run it when they resume (SIGCONT), and the one
//! that answered ran it at once. Every node then lets the lock go about 300 ms later, so the
//! guard must not claim more than that.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Client, Error, FencedLock, KeepAlive, Lock, MultiLock, ReadLock, WriteLock};

/// The TTL the lock is taken with.
const LONG: Duration = Duration::from_secs(10);
/// The TTL of the extend that fails.
const SHORT: Duration = Duration::from_millis(300);
/// How long the frozen nodes get to answer. Small next to `LONG`, so the failed round leaves
/// most of the old validity, and generous enough for a loaded machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

fn client(cluster: &RedisCluster) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .node_timeout(NODE_TIMEOUT)
        .retry_count(0)
        .build()
        .expect("client")
}

/// What the scenario needs of a guard.
trait Guard {
    fn validity(&self) -> Duration;
    fn extend(&mut self, ttl: Duration) -> Result<(), Error>;
}

macro_rules! guard {
    ($($t:ty),*) => {$(
        impl Guard for $t {
            fn validity(&self) -> Duration {
                <$t>::validity(self)
            }
            fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
                <$t>::extend(self, ttl)
            }
        }
    )*};
}
guard!(Lock, ReadLock, WriteLock, MultiLock, FencedLock);

/// Freezes nodes 1 and 2, runs `during`, and resumes them, also if `during` panics.
fn with_two_frozen<R>(cluster: &RedisCluster, during: impl FnOnce() -> R) -> R {
    struct Resume<'a>(&'a RedisCluster);
    impl Drop for Resume<'_> {
        fn drop(&mut self) {
            for s in &self.0.servers[1..] {
                let _ = s.resume();
            }
        }
    }
    let _resume = Resume(cluster);
    for s in &cluster.servers[1..] {
        s.pause().expect("SIGSTOP");
    }
    during()
}

/// Waits (at most 5 s) until `steal` wins with a client of its own; returns when it did.
fn stolen(cluster: &RedisCluster, steal: impl Fn(&Client) -> bool) -> Instant {
    let other = client(cluster);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if steal(&other) {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "nobody else got the lock: the frozen nodes never applied the extend"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// The scenario of the module docs, for the guard `take` makes and the rival `steal` tries.
fn failed_shorter_extend<G: Guard>(
    take: impl FnOnce(&Client) -> G,
    steal: impl Fn(&Client) -> bool,
) {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let mut guard = take(&c);
    // Loads the extend script on every node, so the frozen ones run it from their cache.
    guard.extend(LONG).expect("first extend");
    assert!(guard.validity() > LONG / 2);
    let (error, claimed) = with_two_frozen(&cluster, || {
        let error = guard.extend(SHORT).expect_err("extend without a quorum");
        (error, guard.validity())
    });
    assert!(
        matches!(error, Error::QuorumUnreachable { .. }),
        "{error:?}"
    );
    stolen(&cluster, steal);
    let left = guard.validity();
    assert!(
        left.is_zero(),
        "two holders: another client holds the lock while the guard claims {left:?} \
         ({claimed:?} right after the failed extend)"
    );
    assert!(
        claimed <= SHORT,
        "after a failed extend to {SHORT:?} the guard claimed {claimed:?}"
    );
}

#[test]
fn failed_shorter_extend_caps_a_mutex() {
    failed_shorter_extend(
        |c| c.try_lock("ext:mutex", LONG).expect("lock"),
        |o| o.try_lock("ext:mutex", LONG).is_ok(),
    );
}

#[test]
fn failed_shorter_extend_caps_a_read_lock() {
    failed_shorter_extend(
        |c| c.try_read_lock("ext:rw", LONG).expect("read lock"),
        |o| o.try_write_lock("ext:rw", LONG).is_ok(),
    );
}

#[test]
fn failed_shorter_extend_caps_a_write_lock() {
    failed_shorter_extend(
        |c| c.try_write_lock("ext:rw", LONG).expect("write lock"),
        |o| o.try_write_lock("ext:rw", LONG).is_ok(),
    );
}

#[test]
fn failed_shorter_extend_caps_a_lock_all_set() {
    failed_shorter_extend(
        |c| c.try_lock_all(["ext:a", "ext:b"], LONG).expect("lock_all"),
        |o| o.try_lock_all(["ext:a", "ext:b"], LONG).is_ok(),
    );
}

#[test]
fn failed_shorter_extend_caps_a_fenced_lock() {
    failed_shorter_extend(
        |c| c.try_lock_fenced("ext:fenced", LONG).expect("fenced lock"),
        |o| o.try_lock_fenced("ext:fenced", LONG).is_ok(),
    );
}

/// A failed extend to a longer TTL does not lengthen the validity, nor shorten it.
#[test]
fn failed_longer_extend_keeps_the_validity() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let mut lock = c.try_lock("ext:longer", SHORT * 4).expect("lock");
    lock.extend(SHORT * 4).expect("first extend");
    let (error, before, after) = with_two_frozen(&cluster, || {
        let before = lock.validity();
        let error = lock.extend(LONG).expect_err("extend without a quorum");
        (error, before, lock.validity())
    });
    assert!(
        matches!(error, Error::QuorumUnreachable { .. }),
        "{error:?}"
    );
    assert!(after <= before, "{after:?} > {before:?}");
    // Only the failed round's time is gone.
    assert!(
        before - after <= NODE_TIMEOUT * 4,
        "{before:?} -> {after:?}"
    );
}

/// Through keep-alive: the keeper extends a 10 s lock to 300 ms while two nodes are frozen.
#[test]
fn failed_shorter_extend_caps_a_kept_lock() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let key = "ext:kept";
    let mut lock = c.try_lock(key, LONG).expect("lock");
    lock.extend(LONG).expect("first extend");
    let node0 = cluster.servers[0].addr();
    let kept = with_two_frozen(&cluster, || {
        // Retries come too late to matter: only the first extension counts here.
        let kept = lock
            .keep_alive(
                KeepAlive::new(SHORT)
                    .interval(Duration::from_millis(50))
                    .retry(Duration::from_secs(5)),
            )
            .expect("keep alive");
        // The node that answers ran the extension; the round then waits for the frozen ones.
        assert!(
            eventually(Duration::from_secs(3), || pttl(node0, key.as_bytes())
                <= SHORT.as_millis() as i64),
            "the keeper never extended"
        );
        thread::sleep(NODE_TIMEOUT * 2);
        kept
    });
    stolen(&cluster, |o| o.try_lock(key, LONG).is_ok());
    let left = kept.validity();
    assert!(
        left.is_zero(),
        "two holders: another client holds the lock while the kept lock claims {left:?}"
    );
}
