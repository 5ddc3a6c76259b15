//! Counting semaphores against real redis-server processes: the safety refusal, the per-node
//! sets, the permits marker, wake-ups, extend, resume, `available`, and 3 processes × 4
//! threads contending for k = 2 and k = 3 permits at N = 3 and N = 5, checked for instants
//! with more than k holders.

mod common;
use redlock_mux_kit::history;

use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use history::{History, Kind, Op};
use redlock_mux::resp::Value;
use redlock_mux::{
    Acquire, Cancel, Client, Error, InvalidArgument, KeepAlive, KeyNames, NodeErrorKind,
};

const TTL: Duration = Duration::from_secs(10);

fn client(urls: Vec<String>) -> Client {
    Client::builder()
        .nodes(urls)
        .retry_delay(Duration::from_millis(10))
        .wait_timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

fn zcount_live(addr: std::net::SocketAddr, key: &[u8]) -> i64 {
    match cmd(addr, &[b"ZCOUNT", key, b"(0", b"+inf"]) {
        Value::Integer(n) => n,
        other => panic!("unexpected reply {}", show(&other)),
    }
}

#[test]
fn unsafe_or_unusable_semaphores_are_refused_before_anything_is_sent() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = client(cluster.urls());
    // The fewest slots per node c, then the smallest quorum q, with (k + 1)·q > c·N (no k + 1
    // holders) and k·q ≤ c·N (k fit).
    let shape = |k| {
        let s = c.semaphore("s", k).unwrap();
        (s.slots_per_node(), s.quorum())
    };
    assert_eq!(shape(1), (1, 3));
    assert_eq!(shape(2), (1, 2));
    assert_eq!(shape(3), (2, 3));
    assert_eq!(shape(4), (4, 5));
    let two = c.semaphore("s", 2).unwrap();
    assert_eq!(two.tolerated_failures(), 3);
    assert_eq!(
        (0..6).map(|d| two.usable_permits(d)).collect::<Vec<_>>(),
        [2, 2, 1, 1, 0, 0]
    );
    // The quorum of 4 with 2 slots per node, as before the slots were chosen.
    let four = c.semaphore("s", 2).unwrap().with_quorum(4).unwrap();
    assert_eq!((four.slots_per_node(), four.tolerated_failures()), (2, 1));
    assert_eq!(
        (0..3).map(|d| four.usable_permits(d)).collect::<Vec<_>>(),
        [2, 2, 0]
    );
    // The naive majority admits 3 holders of 2 permits with 2 slots per node, and fits only
    // one with 1: refused, as a bad argument.
    let e = c.semaphore("s", 2).unwrap().with_quorum(3).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(InvalidArgument::UnsafeQuorum {
                permits: 2,
                nodes: 5,
                quorum: 3,
                min: 2
            })
        ),
        "{e:?}"
    );
    assert!(!e.is_contended());
    assert!(c.semaphore("s", 2).unwrap().with_quorum(6).is_err());
    assert_eq!(
        c.semaphore("s", 2)
            .unwrap()
            .with_quorum(5)
            .unwrap()
            .quorum(),
        5
    );
    assert!(matches!(
        c.semaphore("s", 0),
        Err(Error::InvalidArgument(InvalidArgument::BadPermits { .. }))
    ));
    assert!(c.semaphore("s", redlock_mux::MAX_PERMITS + 1).is_err());
    assert!(c.semaphore("", 2).is_err());
    for addr in cluster.addrs() {
        assert_eq!(dbsize(addr), 0);
    }
}

#[test]
fn permits_are_counted_per_node_released_and_announced() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let c = client(cluster.urls());
    let sem = c.semaphore("backups", 2).unwrap();
    assert_eq!(sem.quorum(), 3);
    assert_eq!(sem.available().unwrap(), 2);
    let a = sem.try_acquire(TTL).unwrap();
    let b = sem.try_acquire(TTL).unwrap();
    assert_eq!((a.permits(), a.quorum(), a.key()), (2, 3, &b"backups"[..]));
    assert!(a.validity() > Duration::from_secs(9));
    assert_eq!(sem.available().unwrap(), 0);
    let e = sem.try_acquire(TTL).unwrap_err();
    assert!(e.is_contended(), "{e:?}");
    let names = KeyNames::new(b"backups");
    assert_eq!(names.semaphore, b"{sem:backups}:s");
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || zcount_live(
            addr,
            &names.semaphore
        ) == 2));
        // The marker: minus the permits.
        assert_eq!(
            cmd(addr, &[b"ZSCORE", &names.semaphore, b"="]),
            Value::Bulk(Some(b"-2".to_vec()))
        );
        assert!(pttl(addr, &names.semaphore) > 9_000);
    }
    // A waiter is woken by the release: it gets the permit long before its retry delay.
    let slow = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(3))
        .wait_timeout(Duration::from_secs(8))
        .build()
        .unwrap();
    let waiter = {
        let sem = slow.semaphore("backups", 2).unwrap();
        thread::spawn(move || {
            let t = Instant::now();
            let p = sem.acquire(TTL);
            let took = t.elapsed();
            // Kept, as if its process had exited: resumed below.
            let token = p.map(|p| {
                let token = p.token().to_vec();
                std::mem::forget(p);
                token
            });
            (token, took)
        })
    };
    thread::sleep(Duration::from_millis(300));
    a.release().unwrap();
    let (won, took) = waiter.join().unwrap();
    let token = won.expect("the waiter got the released permit");
    assert!(took < Duration::from_millis(2500), "woken after {took:?}");
    // Extend and resume work on the permit the waiter took.
    let mut resumed = sem.resume(&token, Duration::from_secs(20)).unwrap();
    assert!(resumed.validity() > Duration::from_secs(19));
    resumed.extend(Duration::from_secs(30)).unwrap();
    for addr in cluster.addrs() {
        assert!(pttl(addr, &names.semaphore) > 25_000);
    }
    drop(resumed);
    drop(b);
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || zcount_live(
            addr,
            &names.semaphore
        ) == 0));
    }
    assert_eq!(sem.available().unwrap(), 2);
    let stats = c.stats();
    assert!(stats.kinds.semaphore.won >= 2, "{stats:?}");
    assert!(stats.kinds.semaphore.contended >= 1, "{stats:?}");
}

#[test]
fn expired_holders_free_their_slots_on_each_node() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let c = client(cluster.urls());
    let sem = c.semaphore("short", 1).unwrap();
    let p = sem.try_acquire(Duration::from_millis(200)).unwrap();
    std::mem::forget(p);
    assert!(sem.try_acquire(TTL).unwrap_err().is_contended());
    thread::sleep(Duration::from_millis(300));
    assert_eq!(sem.available().unwrap(), 1);
    sem.try_acquire(TTL).unwrap().release().unwrap();
}

#[test]
fn clients_that_disagree_on_the_permits_get_a_config_error() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let c = client(cluster.urls());
    let _held = c.semaphore("jobs", 3).unwrap().try_acquire(TTL).unwrap();
    let other = c.semaphore("jobs", 2).unwrap();
    let opts = Acquire::new().timeout(Duration::from_secs(3));
    let t = Instant::now();
    let e = other.acquire_with(TTL, &opts).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "not retried: {e:?}");
    assert!(e.failures().iter().all(|f| matches!(
        &f.kind,
        NodeErrorKind::Setup {
            command: "semaphore",
            ..
        }
    )));
    // k = 3 at N = 3 has 2 slots per node and a quorum of 2; k = 2 has 2 and a quorum of 3,
    // with the marker of the shape before the slots were chosen.
    assert!(
        e.to_string()
            .contains("3 permits, 2 per node, not 2 permits"),
        "{e}"
    );
}

/// N = 5, k = 2: one slot per node and a quorum of 2. Each holder keeps 2 keys and gives the
/// others back at once, so both permits are taken, a third is refused, and every node holds at
/// most one live holder.
#[test]
fn one_slot_per_node_holders_keep_a_quorum_and_give_back_the_rest() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = client(cluster.urls());
    let sem = c.semaphore("one-slot", 2).unwrap();
    assert_eq!((sem.slots_per_node(), sem.quorum()), (1, 2));
    assert_eq!(sem.available().unwrap(), 2);
    let names = KeyNames::new(b"one-slot");
    let live = || -> Vec<i64> {
        cluster
            .addrs()
            .into_iter()
            .map(|a| match cmd(a, &[b"EXISTS", &names.semaphore]) {
                Value::Integer(n) => n,
                other => panic!("unexpected reply {}", show(&other)),
            })
            .collect()
    };
    let a = sem.try_acquire(TTL).unwrap();
    assert_eq!((a.permits(), a.quorum()), (2, 2));
    // The keys beyond the quorum are given back.
    assert!(
        eventually(Duration::from_secs(2), || live().iter().sum::<i64>() == 2),
        "first holder's keys: {:?}",
        live()
    );
    let b = sem.try_acquire(TTL).expect("the second permit");
    assert!(
        eventually(Duration::from_secs(2), || live().iter().sum::<i64>() == 4),
        "two holders' keys: {:?}",
        live()
    );
    let e = sem.try_acquire(TTL).unwrap_err();
    assert!(e.is_contended(), "{e:?}");
    assert_eq!(sem.available().unwrap(), 0);
    // Each key: a holder's token, then the permits.
    for addr in cluster.addrs() {
        if let Value::Bulk(Some(v)) = cmd(addr, &[b"GET", &names.semaphore]) {
            assert!(
                v.starts_with(a.token()) || v.starts_with(b.token()),
                "{v:?}"
            );
            assert!(v.ends_with(b":sem:2"), "{v:?}");
        }
    }
    a.release().unwrap();
    assert_eq!(sem.available().unwrap(), 1);
    let mut c2 = sem.try_acquire(TTL).expect("the released permit");
    c2.extend(Duration::from_secs(20)).unwrap();
    drop(c2);
    drop(b);
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
}

/// How many error replies of `kind` (`NOSCRIPT`) the server at `addr` has given.
fn errors(addr: std::net::SocketAddr, kind: &str) -> u64 {
    let Value::Bulk(Some(info)) = cmd(addr, &[b"INFO", b"errorstats"]) else {
        panic!("INFO errorstats");
    };
    let prefix = format!("errorstat_{kind}:count=");
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// N = 5, k = 2: the give-backs of the grants beyond the quorum go by digest, as a release
/// does (a script's body is 175 bytes more for the node to read and hash, three times per
/// uncontended acquire). A give-back that meets `NOSCRIPT` (the script cache was flushed) goes
/// again with its body, and the key is given back all the same; nothing is left.
#[test]
fn one_slot_give_backs_go_by_digest_and_survive_a_flushed_script_cache() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = client(cluster.urls());
    let sem = c.semaphore("give-back", 2).unwrap();
    assert_eq!((sem.slots_per_node(), sem.quorum()), (1, 2));
    let names = KeyNames::new(b"give-back");
    let live = || -> i64 {
        cluster
            .addrs()
            .into_iter()
            .map(|a| match cmd(a, &[b"EXISTS", &names.semaphore]) {
                Value::Integer(n) => n,
                other => panic!("unexpected reply {}", show(&other)),
            })
            .sum()
    };
    let noscript = || -> u64 {
        cluster
            .addrs()
            .into_iter()
            .map(|a| errors(a, "NOSCRIPT"))
            .sum()
    };
    for addr in cluster.addrs() {
        assert_eq!(
            cmd(addr, &[b"SCRIPT", b"FLUSH"]),
            Value::Simple(b"OK".to_vec())
        );
    }
    let before = noscript();
    let a = sem.try_acquire(TTL).unwrap();
    // Three grants beyond the quorum, each given back by digest: NOSCRIPT, then the body.
    assert!(
        eventually(Duration::from_secs(2), || live() == 2),
        "keys after the give-backs: {}",
        live()
    );
    assert!(
        noscript() >= before + 3,
        "the give-backs went with their body: {} NOSCRIPT replies",
        noscript() - before
    );
    a.release().unwrap();
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
}

/// How many times the server at `addr` ran `command` (`INFO commandstats`).
fn calls(addr: std::net::SocketAddr, command: &str) -> u64 {
    let Value::Bulk(Some(info)) = cmd(addr, &[b"INFO", b"commandstats"]) else {
        panic!("INFO commandstats");
    };
    let prefix = format!("cmdstat_{command}:calls=");
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// N = 5, k = 2: a node that answered a holder's give-back holds nothing of it, and that
/// answer (or, while the give-back is on its way, the answer to come) is its part of the
/// holder's release. So a release goes only to the 2 nodes the holder kept, and returns at the
/// first of their answers once the give-backs are answered (4 of 5 nodes then hold nothing of
/// it): a cycle runs 5 compare-and-deletes, as a mutex's does, not 8. Nothing is left behind.
#[test]
fn a_release_after_the_give_backs_goes_only_to_the_nodes_kept() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = client(cluster.urls());
    let sem = c.semaphore("kept", 2).unwrap();
    assert_eq!((sem.slots_per_node(), sem.quorum()), (1, 2));
    let scripts = || -> u64 {
        cluster
            .addrs()
            .into_iter()
            .map(|a| calls(a, "evalsha") + calls(a, "eval"))
            .sum()
    };
    let before = scripts();
    const CYCLES: u64 = 8;
    for cycle in 0..CYCLES {
        let p = sem.try_acquire(TTL).unwrap();
        if cycle % 2 == 0 {
            // `available` waits for every node's answer, each behind the give-back sent
            // there: the give-backs' answers are read by then.
            assert_eq!(sem.available().unwrap(), 1);
        }
        p.release().unwrap();
        for addr in cluster.addrs() {
            assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
        }
    }
    // Behind everything sent before it on every connection: all of it has run.
    assert_eq!(sem.available().unwrap(), 2);
    assert_eq!(
        scripts() - before,
        5 * CYCLES,
        "compare-and-deletes in {CYCLES} cycles (3 give-backs and 2 releases each)"
    );
}

/// With one slot per node (N = 5, k = 2, quorum 2) a node's part of a permit is one string key,
/// taken with `SET NX PX GET` as a mutex takes its key: the holder's token followed by the
/// permits. A key that holds another semaphore's permits, a sorted set of the shape with more
/// slots per node, or another lock's value is refused as a configuration error, never as
/// contention.
#[test]
fn one_slot_per_node_is_one_string_key_per_node() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = client(cluster.urls());
    let opts = Acquire::new().timeout(Duration::from_secs(3));
    let sem = c.semaphore("strings", 2).unwrap();
    assert_eq!((sem.slots_per_node(), sem.quorum()), (1, 2));
    let names = KeyNames::new(b"strings");
    let key = &names.semaphore;
    let held_by = |token: &[u8]| -> usize {
        cluster
            .addrs()
            .into_iter()
            .filter(|&addr| match cmd(addr, &[b"GET", key]) {
                Value::Bulk(Some(v)) => v.starts_with(token) && v.len() > token.len(),
                _ => false,
            })
            .count()
    };
    let a = sem.try_acquire(TTL).unwrap();
    // The grants beyond the quorum are given back at once.
    assert!(
        eventually(Duration::from_secs(2), || held_by(a.token()) == 2),
        "the first holder's keys: {}",
        held_by(a.token())
    );
    for addr in cluster.addrs() {
        let kind = cmd(addr, &[b"TYPE", key]);
        assert!(
            kind == Value::Simple(b"string".to_vec()) || kind == Value::Simple(b"none".to_vec()),
            "{}",
            show(&kind)
        );
        if kind == Value::Simple(b"string".to_vec()) {
            assert!(pttl(addr, key) > 9_000);
        }
    }
    let b = sem.try_acquire(TTL).expect("the second permit");
    assert!(eventually(Duration::from_secs(2), || held_by(b.token()) == 2));
    let e = sem.try_acquire(TTL).unwrap_err();
    assert!(e.is_contended(), "{e:?}");
    assert_eq!(sem.available().unwrap(), 0);
    // Another number of permits with one slot per node (k = 1: quorum 3) is refused by the
    // four nodes that hold a permit of 2: a configuration error, not contention.
    let one = c.semaphore("strings", 1).unwrap();
    assert_eq!(one.slots_per_node(), 1);
    let t = Instant::now();
    let e = one.acquire_with(TTL, &opts).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "not retried: {e:?}");
    assert!(
        e.to_string()
            .contains("2 permits, 1 per node, not 1 permits"),
        "{e}"
    );
    // A waiter is woken by the release: it gets the permit long before its retry delay.
    let slow = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(3))
        .wait_timeout(Duration::from_secs(8))
        .build()
        .unwrap();
    let waiter = {
        let sem = slow.semaphore("strings", 2).unwrap();
        thread::spawn(move || {
            let t = Instant::now();
            let p = sem.acquire(TTL);
            let took = t.elapsed();
            (p.and_then(|p| p.release()), took)
        })
    };
    thread::sleep(Duration::from_millis(300));
    // Release, extend and keep-alive work on the keys.
    let a_token = a.token().to_vec();
    a.release().unwrap();
    let (released, took) = waiter.join().unwrap();
    released.expect("the waiter got the released permit");
    assert!(took < Duration::from_millis(2500), "woken after {took:?}");
    assert!(eventually(Duration::from_secs(2), || held_by(&a_token) == 0));
    let mut c2 = sem.try_acquire(TTL).expect("the released permit");
    c2.extend(Duration::from_secs(20)).unwrap();
    assert!(
        cluster
            .addrs()
            .into_iter()
            .filter(|&addr| pttl(addr, key) > 15_000)
            .count()
            >= 2
    );
    // Resume from the token, and keep-alive.
    let token = c2.token().to_vec();
    std::mem::forget(c2);
    let resumed = sem.resume(&token, Duration::from_secs(30)).unwrap();
    assert!(resumed.validity() > Duration::from_secs(29));
    assert!(sem
        .resume(b"0123456789abcdef0123456789abcdef01234567", TTL)
        .is_err());
    let ttl = Duration::from_millis(600);
    let kept = resumed
        .keep_alive(KeepAlive::new(ttl))
        .map_err(|e| e.error)
        .unwrap();
    drop(b);
    thread::sleep(Duration::from_millis(1500));
    assert!(!kept.is_lost());
    kept.release().unwrap();
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
    let stats = c.stats();
    assert!(stats.kinds.semaphore.won >= 3, "{stats:?}");
    assert!(stats.kinds.semaphore.contended >= 1, "{stats:?}");
    // A value no semaphore wrote (a mutex on the same key name) is told apart too.
    for addr in cluster.addrs() {
        cmd(addr, &[b"SET", key, b"a-mutex-token", b"PX", b"10000"]);
    }
    let e = sem.acquire_with(TTL, &opts).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(e.failures().iter().all(|f| matches!(
        &f.kind,
        NodeErrorKind::Setup {
            command: "semaphore",
            ..
        }
    )));
    for addr in cluster.addrs() {
        cmd(addr, &[b"DEL", key]);
    }
}

/// A fair semaphore with one slot per node (N = 5, k = 2) serves its waiters through the fair
/// queue's script, and refuses a sorted set where its key should be as a configuration error.
#[test]
fn a_fair_one_slot_semaphore_serves_its_waiters() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = Client::builder()
        .nodes(cluster.urls())
        .fair(true)
        .retry_delay(Duration::from_millis(20))
        .wait_timeout(Duration::from_secs(8))
        .build()
        .unwrap();
    let sem = c.semaphore("fair-one", 2).unwrap();
    assert_eq!(sem.slots_per_node(), 1);
    let held: Vec<_> = (0..2).map(|_| sem.acquire(TTL).unwrap()).collect();
    assert!(sem.try_acquire(TTL).unwrap_err().is_contended());
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || {
                let p = sem.acquire(Duration::from_secs(2))?;
                thread::sleep(Duration::from_millis(20));
                p.release()
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    drop(held);
    for w in waiters {
        w.join().unwrap().expect("every fair waiter got a permit");
    }
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
    // The shape with two slots per node holds a sorted set there.
    let older = c.semaphore("fair-one", 2).unwrap().with_quorum(4).unwrap();
    let kept = older.try_acquire(TTL).unwrap();
    let opts = Acquire::new().timeout(Duration::from_secs(3));
    let e = sem.acquire_with(TTL, &opts).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(
        e.to_string()
            .contains("more than 1 per node, not 2 permits, 1 per node"),
        "{e}"
    );
    kept.release().unwrap();
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
}

/// N = 5, k = 2 (quorum 2) keeps taking permits with three of the five nodes frozen
/// (SIGSTOP), where the quorum of 4 that 2 slots per node need stops at the second.
#[test]
fn one_slot_per_node_tolerates_three_failures_of_five() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(300))
        .retry_delay(Duration::from_millis(10))
        .wait_timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let sem = c.semaphore("frozen", 2).unwrap();
    let old = c
        .semaphore("frozen-old", 2)
        .unwrap()
        .with_quorum(4)
        .unwrap();
    for s in &cluster.servers[..3] {
        s.pause().expect("SIGSTOP");
    }
    let taken = sem.acquire(TTL);
    let refused = old.try_acquire(TTL);
    for s in &cluster.servers[..3] {
        s.resume().expect("SIGCONT");
    }
    let p = taken.expect("a permit with 2 of 5 nodes up");
    assert!(refused.is_err(), "a quorum of 4 with 2 nodes up");
    p.release().unwrap();
}

/// A semaphore a version with as many slots per node as permits wrote (a sorted set, its marker
/// minus the permits) is refused as a configuration error by one that picks one slot per node
/// (one string key), and the reverse.
#[test]
fn semaphores_of_another_shape_are_refused_as_configuration_errors() {
    let cluster = RedisCluster::start(5).expect("cluster");
    let c = client(cluster.urls());
    let opts = Acquire::new().timeout(Duration::from_secs(3));
    // The older shape: 2 slots per node, quorum 4.
    let older = c.semaphore("shapes", 2).unwrap().with_quorum(4).unwrap();
    assert_eq!(older.slots_per_node(), 2);
    let held = older.try_acquire(TTL).unwrap();
    let names = KeyNames::new(b"shapes");
    assert_eq!(
        cmd(cluster.addrs()[0], &[b"ZSCORE", &names.semaphore, b"="]),
        Value::Bulk(Some(b"-2".to_vec()))
    );
    let newer = c.semaphore("shapes", 2).unwrap();
    assert_eq!(newer.slots_per_node(), 1);
    let e = newer.acquire_with(TTL, &opts).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(
        e.to_string()
            .contains("has more than 1 per node, not 2 permits, 1 per node"),
        "{e}"
    );
    held.release().unwrap();
    // The reverse.
    let held = newer.try_acquire(TTL).unwrap();
    let e = older.acquire_with(TTL, &opts).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(
        e.to_string()
            .contains("has 1 per node or another lock, not 2 permits"),
        "{e}"
    );
    held.release().unwrap();
    for addr in cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || dbsize(addr) == 0));
    }
}

#[test]
fn a_kept_permit_outlives_its_ttl_and_a_waiter_can_be_cancelled() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let c = client(cluster.urls());
    let sem = c.semaphore("kept", 1).unwrap();
    let ttl = Duration::from_millis(600);
    let kept = sem
        .try_acquire(ttl)
        .unwrap()
        .keep_alive(KeepAlive::new(ttl))
        .map_err(|e| e.error)
        .unwrap();
    thread::sleep(Duration::from_millis(1500));
    assert!(!kept.is_lost());
    assert!(sem.try_acquire(TTL).unwrap_err().is_contended());
    // A waiter, cancelled from another thread, leaves nothing behind.
    let cancel = Cancel::new();
    let waiter = {
        let (sem, cancel) = (sem.clone(), cancel.clone());
        thread::spawn(move || sem.acquire_with(TTL, &Acquire::new().cancel(&cancel)))
    };
    thread::sleep(Duration::from_millis(200));
    cancel.cancel();
    assert!(matches!(waiter.join().unwrap(), Err(Error::Cancelled)));
    kept.release().unwrap();
    assert_eq!(sem.available().unwrap(), 1);
    assert!(c.stats().cancellations >= 1);
}

#[test]
fn a_fair_semaphore_serves_its_waiters() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let c = Client::builder()
        .nodes(cluster.urls())
        .fair(true)
        .retry_delay(Duration::from_millis(20))
        .wait_timeout(Duration::from_secs(8))
        .build()
        .unwrap();
    let sem = c.semaphore("fair", 2).unwrap();
    let held: Vec<_> = (0..2).map(|_| sem.acquire(TTL).unwrap()).collect();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || {
                let p = sem.acquire(Duration::from_secs(2))?;
                thread::sleep(Duration::from_millis(20));
                p.release()
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    drop(held);
    for w in waiters {
        w.join().unwrap().expect("every fair waiter got a permit");
    }
}

// ---- 3 processes × 4 threads ----------------------------------------------------------------

const CHILD_ENV: &str = "REDLOCK_MUX_SEM_CHILD";
const THREADS: usize = 4;
const PROCESSES: usize = 3;
/// Each thread stops after this many grants or this long, whichever comes first.
const GRANTS: usize = 40;
const RUN_FOR: Duration = Duration::from_millis(3000);

fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
}

/// Not a test of its own: the body of each child process of
/// [`three_processes_of_four_threads_never_exceed_the_permits`], which runs this test binary
/// again with the nodes, key and permits in the environment. It prints one line per grant.
#[test]
fn semaphore_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split(' ');
    let proc_id: u64 = parts.next().unwrap().parse().unwrap();
    let key = parts.next().unwrap().to_owned();
    let permits: u32 = parts.next().unwrap().parse().unwrap();
    let urls: Vec<String> = parts.map(str::to_owned).collect();
    // A long node timeout: with a quorum of every node (k = 2 at N = 3), one node slowed by a
    // loaded machine would fail the round, and the test is about holders, not latency.
    let c = Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(5))
        .wait_timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let sem = c.semaphore(&key, permits).unwrap();
    let start = Barrier::new(THREADS);
    let lines: Vec<String> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (sem, start) = (&sem, &start);
                s.spawn(move || {
                    start.wait();
                    let begun = Instant::now();
                    let mut out = Vec::new();
                    let mut n = 0;
                    while n < GRANTS && begun.elapsed() < RUN_FOR {
                        let invoke = wall();
                        let Ok(p) = sem.acquire(Duration::from_secs(3)) else {
                            continue;
                        };
                        // The window: from after the grant returned to the end of the validity
                        // it reported, or the start of the release, whichever is first.
                        let ok = wall();
                        let valid_until = ok + p.validity();
                        thread::sleep(Duration::from_millis(1 + (n as u64 * 7 + t as u64) % 6));
                        let release = wall();
                        let _ = p.release();
                        out.push(format!(
                            "GRANT {} {} {} {} {}",
                            proc_id * 100 + t as u64,
                            invoke.as_micros(),
                            ok.as_micros(),
                            valid_until.as_micros(),
                            release.as_micros()
                        ));
                        n += 1;
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    for line in lines {
        println!("{line}");
    }
}

/// `pause`: while the children run, the nodes are frozen one after the other (SIGSTOP for
/// 250 ms, by PID, then SIGCONT), each longer than the children's node timeout.
fn contend(nodes: usize, permits: u32, pause: bool) {
    let cluster = RedisCluster::start(nodes).expect("cluster");
    let key = format!("sem-n{nodes}-k{permits}");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            let spec = format!("{p} {key} {permits} {}", cluster.urls().join(" "));
            Command::new(&exe)
                .args([
                    "--exact",
                    "semaphore_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, spec)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    if pause {
        // Bounded: 8 pauses of 250 ms and gaps of 100 ms, within the children's 3 s.
        for i in 0..8 {
            let server = &cluster.servers[i % nodes];
            server.pause().expect("SIGSTOP");
            thread::sleep(Duration::from_millis(250));
            server.resume().expect("SIGCONT");
            thread::sleep(Duration::from_millis(100));
        }
    }
    let mut h = History::default();
    for child in children {
        let out = child.wait_with_output().expect("child output");
        assert!(out.status.success(), "child failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(rest) = line.strip_prefix("GRANT ") else {
                continue;
            };
            let v: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            let us = Duration::from_micros;
            h.push(Op {
                client: v[0],
                kind: Kind::Permit { permits },
                key: key.clone().into_bytes(),
                invoke: us(v[1]),
                ok: Some(us(v[2])),
                fence: None,
                valid_until: Some(us(v[3])),
                release: Some(us(v[4])),
            });
        }
    }
    let report = h.check();
    println!("N = {nodes}, k = {permits}, pauses {pause}: {report}");
    // What makes the run mean something is that holders overlapped (and the checker saw no
    // more than the permits at any instant), not a rate: twelve threads on two permits with a
    // quorum of every node split their votes often, and a loaded machine grants only a few
    // dozen.
    assert!(
        report.ops >= 10 && report.max_holders >= 2,
        "too few grants to mean anything: {report}"
    );
    assert_eq!(report.violations(), 0, "{report}");
    assert!(
        report.max_holders >= 2,
        "the permits were never shared: {report}"
    );
}

#[test]
fn three_processes_of_four_threads_never_exceed_the_permits() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    for (nodes, permits) in [(3, 2), (3, 3), (5, 2), (5, 3)] {
        contend(nodes, permits, false);
    }
}

/// As above, with the nodes frozen one after the other while the children contend: at N = 5,
/// k = 2 (1 slot per node, quorum 2) and k = 3 (2 slots, quorum 3), and at N = 7, k = 3 (1
/// slot, quorum 2), never more holders than permits.
#[test]
fn a_paused_node_never_lets_more_holders_in_than_permits() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    for (nodes, permits) in [(5, 2), (5, 3), (7, 3)] {
        contend(nodes, permits, true);
    }
}
