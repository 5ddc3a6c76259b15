//! All-or-none locks over sets of keys, against real redis-server processes.

mod common;
use redlock_mux_kit::history;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::{self, Limits, Status, Value};
use redlock_mux::{Client, Error, InvalidArgument, MAX_LOCK_ALL_KEYS};

const TTL: Duration = Duration::from_secs(10);

fn client(cluster: &RedisCluster) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        // Generous: tests share a small, busy machine, and a timed-out node is not the point.
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(2))
        .retry_count(100_000)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// Waits (at most 2 s) until `check` holds; the cleanup of a lost attempt is sent before the
/// call returns but applied by each server in its own time.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !check() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Which of `keys` node `addr` holds with `token`, and which hold something else.
fn held(addr: SocketAddr, keys: &[&str], token: &[u8]) -> (Vec<String>, Vec<String>) {
    let (mut ours, mut other) = (Vec::new(), Vec::new());
    for k in keys {
        match get(addr, k.as_bytes()) {
            Some(v) if v == token => ours.push(k.to_string()),
            Some(_) => other.push(k.to_string()),
            None => {}
        }
    }
    (ours, other)
}

fn all_or_none_on_each_node(n: usize) {
    let cluster = RedisCluster::start(n).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(&cluster);
    let keys = ["a", "b", "c"];
    let refuse = n - c.quorum() + 1;

    // Enough nodes hold some key of the set elsewhere that no quorum can take all of it: the
    // attempt fails, and no node keeps any key of it, not even those that granted.
    for (i, addr) in addrs.iter().enumerate().take(refuse) {
        set(*addr, if i % 2 == 0 { b"b" } else { b"c" }, b"elsewhere");
    }
    let err = c.try_lock_all(["c", "a", "b"], TTL).unwrap_err();
    assert!(err.is_contended(), "{err}");
    for (i, addr) in addrs.iter().enumerate() {
        eventually("lost attempt released", || {
            held(*addr, &keys, b"x").1.len() <= 1
        });
        let left: Vec<Vec<u8>> = keys_of(*addr);
        let expected: Vec<Vec<u8>> = if i < refuse {
            vec![if i % 2 == 0 {
                b"b".to_vec()
            } else {
                b"c".to_vec()
            }]
        } else {
            vec![]
        };
        assert_eq!(left, expected, "node {i} after a lost attempt");
    }

    // One node fewer refuses: a quorum grants the whole set; the refusing nodes hold none of
    // it, the others all of it.
    addrs.iter().for_each(|a| flushall(*a));
    for addr in addrs.iter().take(refuse - 1) {
        set(*addr, b"b", b"elsewhere");
    }
    let set_lock = c.try_lock_all(["c", "a", "b"], TTL).expect("quorum grants");
    let listed: Vec<&[u8]> = set_lock.keys().collect();
    assert_eq!(listed, [&b"a"[..], b"b", b"c"]);
    let token = set_lock.token().to_vec();
    for (i, addr) in addrs.iter().enumerate() {
        let (ours, other) = held(*addr, &keys, &token);
        if i < refuse - 1 {
            assert_eq!((ours, other), (vec![], vec!["b".to_string()]), "node {i}");
        } else {
            assert_eq!(ours, keys, "node {i}");
            for k in keys {
                let ttl = pttl(*addr, k.as_bytes());
                assert!(ttl > 0 && ttl <= 10_000, "node {i} key {k} pttl {ttl}");
            }
        }
    }
    set_lock.release().expect("release");
    for (i, addr) in addrs.iter().enumerate() {
        let expected: Vec<Vec<u8>> = if i < refuse - 1 {
            vec![b"b".to_vec()]
        } else {
            vec![]
        };
        // The release returns once a quorum answered; the others follow.
        eventually("released everywhere", || keys_of(*addr) == expected);
    }
}

fn keys_of(addr: SocketAddr) -> Vec<Vec<u8>> {
    keys(addr)
}

#[test]
fn a_set_is_taken_whole_or_not_at_all_on_each_node_of_3() {
    all_or_none_on_each_node(3);
}

#[test]
fn a_set_is_taken_whole_or_not_at_all_on_each_node_of_5() {
    all_or_none_on_each_node(5);
}

#[test]
fn a_set_and_a_mutex_on_a_shared_key_exclude_each_other() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let c = client(&cluster);
    let lock = c.try_lock("b", TTL).expect("mutex");
    assert!(c.try_lock_all(["a", "b"], TTL).unwrap_err().is_contended());
    // The lost attempt left nothing behind, so "a" alone is free.
    drop(c.try_lock("a", TTL).expect("a is free"));
    lock.release().expect("release");
    let set_lock = c.try_lock_all(["a", "b"], TTL).expect("set");
    assert!(c.try_lock("a", TTL).unwrap_err().is_contended());
    assert!(c.try_lock_all(["b", "z"], TTL).unwrap_err().is_contended());
    drop(c.try_lock_all(["y", "z"], TTL).expect("disjoint set"));
    drop(set_lock);
    // Dropping the guard released it.
    drop(c.try_lock("a", TTL).expect("a after drop"));
    for addr in cluster.addrs() {
        eventually("all released", || dbsize(addr) == 0);
    }
}

#[test]
fn extend_is_all_or_none_and_validity_follows_it() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(&cluster);
    let mut set_lock = c
        .try_lock_all(["k1", "k2"], Duration::from_secs(2))
        .unwrap();
    assert!(set_lock.validity() <= Duration::from_secs(2));
    assert!(set_lock.validity() > Duration::from_secs(1));
    set_lock.extend(Duration::from_secs(30)).expect("extend");
    assert!(set_lock.validity() > Duration::from_secs(20));
    for addr in &addrs {
        for k in [&b"k1"[..], b"k2"] {
            eventually("extended everywhere", || pttl(*addr, k) > 20_000);
        }
    }

    // A quorum of nodes lost one key of the set: extend fails, and on those nodes it changes
    // nothing, not even the key that is still ours. The node that still holds the whole set
    // extends it (as a mutex extend would), which the failed quorum makes harmless.
    for addr in &addrs[..2] {
        cmd(*addr, &[b"DEL", b"k1"]);
        cmd(*addr, &[b"PEXPIRE", b"k2", b"60000"]);
    }
    let err = set_lock.extend(Duration::from_secs(90)).unwrap_err();
    assert!(err.is_contended(), "{err}");
    for addr in &addrs[..2] {
        let ttl = pttl(*addr, b"k2");
        assert!(ttl > 50_000 && ttl <= 60_000, "pttl {ttl}");
    }
    eventually("node 2 extended", || pttl(addrs[2], b"k1") > 60_000);
    set_lock.release().expect("release");
    for addr in &addrs {
        eventually("all released", || dbsize(*addr) == 0);
    }
}

/// Someone else turns key `k` into a hash on every node (`DEL`, then `HSET`).
fn make_hash_everywhere(addrs: &[SocketAddr], k: &[u8]) {
    for addr in addrs {
        cmd(*addr, &[b"DEL", k]);
        assert_eq!(
            cmd(*addr, &[b"HSET", k, b"field", b"value"]),
            Value::Integer(1)
        );
    }
}

#[test]
fn releasing_a_set_frees_every_key_of_ours_even_past_a_key_of_another_type() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(&cluster);
    let set_lock = c.try_lock_all(["a", "b", "c"], TTL).expect("set");
    for addr in &addrs {
        eventually("whole set on every node", || dbsize(*addr) == 3);
    }
    make_hash_everywhere(&addrs, b"b");
    // Every node still releases what holds our token ("a" and "c"), and acknowledges: the hash
    // is not ours, as a key that expired or holds another token is not.
    let released = set_lock.release();
    for (i, addr) in addrs.iter().enumerate() {
        let released_here = || get(*addr, b"a").is_none() && get(*addr, b"c").is_none();
        if !common::eventually(Duration::from_secs(2), released_here) {
            let left: Vec<String> = keys_of(*addr)
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            panic!("node {i}: keys left after the release: {left:?}");
        }
        assert_eq!(keys_of(*addr), vec![b"b".to_vec()], "node {i}");
        assert_eq!(
            cmd(*addr, &[b"HGET", b"b", b"field"]),
            Value::Bulk(Some(b"value".to_vec())),
            "node {i}: the other party's hash is left alone"
        );
    }
    released.expect("release acknowledged");
    // Both keys are free at once.
    drop(c.try_lock_all(["a", "c"], TTL).expect("a and c are free"));
}

#[test]
fn dropping_a_set_frees_every_key_of_ours_past_a_key_of_another_type() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(&cluster);
    // Dropping the guard releases it with the same script, best effort.
    let set_lock = c.try_lock_all(["a", "b", "c"], TTL).expect("set");
    make_hash_everywhere(&addrs, b"b");
    drop(set_lock);
    for addr in &addrs {
        eventually("a and c released", || keys_of(*addr) == vec![b"b".to_vec()]);
    }
}

#[test]
fn extending_a_set_with_a_key_of_another_type_is_refused_and_changes_nothing() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addrs = cluster.addrs();
    let c = client(&cluster);
    let mut set_lock = c.try_lock_all(["a", "b", "c"], TTL).expect("set");
    for addr in &addrs {
        eventually("whole set on every node", || dbsize(*addr) == 3);
    }
    make_hash_everywhere(&addrs, b"b");
    // The set is no longer ours on any node: the extend is refused (the set is held
    // elsewhere), not a node failure, and no key's TTL changes.
    let err = set_lock.extend(Duration::from_secs(90)).unwrap_err();
    assert!(err.is_contended(), "{err}");
    for (i, addr) in addrs.iter().enumerate() {
        for k in [&b"a"[..], b"c"] {
            let ttl = pttl(*addr, k);
            assert!(ttl > 0 && ttl <= 10_000, "node {i} key {k:?} pttl {ttl}");
        }
        assert_eq!(pttl(*addr, b"b"), -1, "node {i}: the hash keeps no expiry");
    }
    set_lock.release().expect("release");
    for addr in &addrs {
        eventually("a and c released", || keys_of(*addr) == vec![b"b".to_vec()]);
    }
}

/// Subscribes to every wake channel on `addr`; returns the connection once confirmed.
fn subscribe_wakes(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut out = Vec::new();
    resp::encode_command(&mut out, &[b"PSUBSCRIBE", b"redlock-mux:wake:*"]);
    stream.write_all(&out).unwrap();
    let confirmed = read_messages(&mut stream, 1);
    assert_eq!(confirmed.len(), 1, "PSUBSCRIBE not confirmed");
    stream
}

/// Reads pub/sub messages until `want` arrived or a read times out.
fn read_messages(stream: &mut TcpStream, want: usize) -> Vec<Value> {
    let mut buf = Vec::new();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while got.len() < want {
        while let Ok(Status::Complete((reply, used))) = resp::decode(&buf, &Limits::default()) {
            got.push(reply.to_value());
            buf.drain(..used);
        }
        if got.len() >= want {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    got
}

#[test]
fn releasing_a_set_announces_each_released_key_on_its_wake_channel() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let addr = cluster.addrs()[0];
    let c = client(&cluster);
    let mut sub = subscribe_wakes(addr);
    let set_lock = c.try_lock_all(["w2", "w1", "w3"], TTL).unwrap();
    // One key expired (here: deleted) on this node before the release: it is not announced.
    cmd(addr, &[b"DEL", b"w3"]);
    set_lock.release().unwrap();
    let channels: Vec<Value> = read_messages(&mut sub, 3)
        .into_iter()
        .map(|m| match m {
            Value::Array(Some(items)) if items.len() == 4 => items[2].clone(),
            other => panic!("not a pmessage: {}", show(&other)),
        })
        .collect();
    let bulk = |s: &str| Value::Bulk(Some(s.as_bytes().to_vec()));
    assert_eq!(
        channels,
        [bulk("redlock-mux:wake:w1"), bulk("redlock-mux:wake:w2")]
    );
}

#[test]
fn bad_sets_are_refused_before_anything_is_sent() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let c = client(&cluster);
    let invalid = |e: Error| match e {
        Error::InvalidArgument(a) => a,
        other => panic!("not an invalid argument: {other}"),
    };
    assert_eq!(
        invalid(c.try_lock_all(Vec::<&str>::new(), TTL).unwrap_err()),
        InvalidArgument::NoKeys
    );
    assert_eq!(
        invalid(c.lock_all(["a", "b", "a"], TTL).unwrap_err()),
        InvalidArgument::DuplicateKey { key: b"a".to_vec() }
    );
    let many: Vec<String> = (0..=MAX_LOCK_ALL_KEYS).map(|i| format!("k{i}")).collect();
    assert_eq!(
        invalid(c.try_lock_all(&many, TTL).unwrap_err()),
        InvalidArgument::TooManyKeys {
            count: MAX_LOCK_ALL_KEYS + 1,
            max: MAX_LOCK_ALL_KEYS
        }
    );
    assert_eq!(
        invalid(c.try_lock_all(["a", ""], TTL).unwrap_err()),
        InvalidArgument::EmptyKey
    );
    assert_eq!(
        invalid(c.try_lock_all(["a"], Duration::ZERO).unwrap_err()),
        InvalidArgument::ZeroTtl
    );
    for addr in cluster.addrs() {
        assert_settles_eq!(dbsize(addr), 0);
    }
    // The cap itself is allowed.
    let set_lock = c.try_lock_all(&many[..MAX_LOCK_ALL_KEYS], TTL).unwrap();
    assert_eq!(set_lock.keys().len(), MAX_LOCK_ALL_KEYS);
    let addr = cluster.addrs()[0];
    eventually("whole set on node 0", || {
        dbsize(addr) == MAX_LOCK_ALL_KEYS as i64
    });
}

/// A small deterministic generator for the key sets each worker picks.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// 1 to 3 distinct keys out of `universe`.
    fn subset(&mut self, universe: usize) -> Vec<usize> {
        let want = 1 + (self.next() % 3) as usize;
        let mut set = Vec::new();
        while set.len() < want {
            let k = (self.next() % universe as u64) as usize;
            if !set.contains(&k) {
                set.push(k);
            }
        }
        set
    }
}

const UNIVERSE: usize = 6;

fn key_name(k: usize) -> String {
    format!("res:{k}")
}

#[test]
fn overlapping_sets_taken_from_threads_never_overlap() {
    let cluster = RedisCluster::start(3).expect("redis-server");
    let c = client(&cluster);
    let owners: Arc<Vec<AtomicUsize>> =
        Arc::new((0..UNIVERSE).map(|_| AtomicUsize::new(0)).collect());
    let origin = Instant::now();
    let workers: Vec<_> = (1..=4)
        .map(|id: usize| {
            let c = c.clone();
            let owners = owners.clone();
            thread::spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ id as u64);
                let mut windows = Vec::new();
                for _ in 0..60 {
                    let set = rng.subset(UNIVERSE);
                    let invoke = origin.elapsed();
                    let lock = c
                        .lock_all(set.iter().map(|&k| key_name(k)), TTL)
                        .expect("lock_all");
                    let from = origin.elapsed();
                    let valid_until = from + lock.validity();
                    for &k in &set {
                        let prev = owners[k].swap(id, Ordering::SeqCst);
                        assert_eq!(prev, 0, "key {k} taken by {id} while {prev} held it");
                    }
                    thread::sleep(Duration::from_micros(200));
                    for &k in &set {
                        owners[k].store(0, Ordering::SeqCst);
                    }
                    let to = origin.elapsed();
                    lock.release().expect("release");
                    windows.push((set, invoke, from, valid_until, to));
                }
                windows
            })
        })
        .collect();
    let windows: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    assert_eq!(windows.len(), 240);
    // The shared history checker: a set's grant is an exclusive window on each of its keys.
    let mut h = history::History::default();
    for (n, (set, invoke, from, valid_until, to)) in windows.iter().enumerate() {
        for &k in set {
            h.push(history::Op {
                client: n as u64,
                kind: history::Kind::Mutex,
                key: key_name(k).into_bytes(),
                invoke: *invoke,
                ok: Some(*from),
                fence: None,
                valid_until: Some(*valid_until),
                release: Some(*to),
            });
        }
    }
    let report = h.check();
    assert_eq!(report.violations(), 0, "{report}");
    let mut overlapping_pairs = 0;
    for (i, (s1, _, f1, _, t1)) in windows.iter().enumerate() {
        for (s2, _, f2, _, t2) in &windows[i + 1..] {
            if s1.iter().any(|k| s2.contains(k)) {
                overlapping_pairs += 1;
                assert!(
                    t1 < f2 || t2 < f1,
                    "sets {s1:?} and {s2:?} were held at once"
                );
            }
        }
    }
    assert!(
        overlapping_pairs > 1000,
        "too few sets shared keys to test anything"
    );
}

/// Set in a child process: the lock nodes' URLs and the referee's address.
const CHILD_ENV: &str = "REDLOCK_MUX_MULTI_CHILD";

/// One child's share of the work: every key it takes is counted up on the referee while held
/// (`INCR` must find it free) and down before release; a clash is counted as a violation.
fn child_worker(spec: &str) {
    let (urls, rest) = spec.split_once(';').expect("spec");
    let (referee, seed) = rest.split_once(';').expect("spec");
    let referee: SocketAddr = referee.parse().expect("referee");
    let c = Client::builder()
        .nodes(urls.split(','))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(2))
        .retry_count(100_000)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let mut rng = XorShift(seed.parse().expect("seed"));
    for _ in 0..40 {
        let set = rng.subset(UNIVERSE);
        let lock = c
            .lock_all(set.iter().map(|&k| key_name(k)), TTL)
            .expect("lock_all");
        for &k in &set {
            let holder = format!("held:{k}");
            if cmd(referee, &[b"INCR", holder.as_bytes()]) != Value::Integer(1) {
                cmd(referee, &[b"INCR", b"violations"]);
            }
        }
        thread::sleep(Duration::from_micros(300));
        for &k in &set {
            cmd(referee, &[b"DECR", format!("held:{k}").as_bytes()]);
        }
        cmd(referee, &[b"INCR", b"grants"]);
        lock.release().expect("release");
    }
}

#[test]
fn overlapping_sets_taken_from_processes_never_overlap() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child_worker(&spec);
        return;
    }
    let cluster = RedisCluster::start(3).expect("redis-server");
    let referee = RedisServer::start().expect("referee");
    let urls = cluster.urls().join(",");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (1..=3u64)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "overlapping_sets_taken_from_processes_never_overlap",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, format!("{urls};{};{}", referee.addr(), 7919 * i))
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("child").success(), "a child failed");
    }
    assert_eq!(get(referee.addr(), b"grants"), Some(b"120".to_vec()));
    assert_eq!(get(referee.addr(), b"violations"), None);
}
