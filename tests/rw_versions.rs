//! Read-write locks on quorums that mix Redis 7.0 and Redis 8.2 nodes, and on a node upgraded
//! from 7.0 to 8.2 on its own AOF while a reader holds the lock.
//!
//! On a node with hash-field expiry (8.x) the read-preferring lock goes without Lua: readers are
//! fields of a hash at the writer key, and a writer is `SET NX` plus a check of the reader set in
//! one transaction. Every other path (fair, write-preferring, fenced, and every 7.x node) keeps
//! the scripts. These tests run every path against one lock at once, with the history checker,
//! and upgrade a node under a held reader.
//!
//! Redis 7.0 is `redis-server` on `PATH`; Redis 8.2 is what `.ci/install` caches (or
//! `REDLOCK_MUX_REDIS8_SERVER`). Without an 8.2 binary the tests say so and pass.

mod common;
use redlock_mux_kit::history;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use history::{History, Increment, Kind, Op};
use redlock_mux::resp::Value;
use redlock_mux::{Client, ClientBuilder, RwPolicy};

const KEY: &[u8] = b"mixed";

/// The Redis 8 binary, or `None` after saying why the test does nothing.
fn redis8(test: &str) -> Option<PathBuf> {
    let found = redis8_program();
    if found.is_none() {
        eprintln!(
            "{test}: skipped, no Redis 8 redis-server (run `bash .ci/install`, or set \
             {REDIS8_SERVER_ENV})"
        );
    }
    found
}

/// Whether the node has hash-field expiry (`HSETEX`, Redis 8.0).
fn native(addr: SocketAddr) -> bool {
    matches!(cmd(addr, &[b"COMMAND", b"INFO", b"HSETEX"]),
        Value::Array(Some(items)) if matches!(items.first(), Some(Value::Array(Some(_)))))
}

/// The calls of `command` in the node's `INFO commandstats`.
fn calls(addr: SocketAddr, command: &str) -> i64 {
    match cmd(addr, &[b"INFO", b"commandstats"]) {
        Value::Bulk(Some(text)) => String::from_utf8_lossy(&text)
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap()),
        other => panic!("unexpected reply {}", show(&other)),
    }
}

fn builder(urls: Vec<String>) -> ClientBuilder {
    Client::builder()
        .nodes(urls)
        .retry_delay(Duration::from_millis(5))
        .retry_count(1000)
        .wait_timeout(Duration::from_millis(800))
        // Generous: the machine may be loaded.
        .node_timeout(Duration::from_millis(250))
        .connect_timeout(Duration::from_secs(2))
}

/// How a contender takes the lock: the Lua-free path where nodes have it, or one of the
/// scripted ones, all on the same lock.
#[derive(Debug, Clone, Copy)]
enum Path_ {
    /// Read-preferring, unfair: native on 8.x nodes.
    Native,
    /// Read-preferring behind the fair queue: scripts everywhere.
    Fair,
    /// Write-preferring (intents): scripts everywhere.
    WritePreferring,
}

fn client(urls: &[String], path: Path_) -> Client {
    let b = builder(urls.to_vec());
    match path {
        Path_::Native => b.rw_policy(RwPolicy::ReadPreferring),
        Path_::Fair => b.rw_policy(RwPolicy::ReadPreferring).fair(true),
        Path_::WritePreferring => b.rw_policy(RwPolicy::WritePreferring),
    }
    .build()
    .expect("client")
}

/// One contender: reads and writes `KEY` until `until`, fenced writes on odd turns of the
/// scripted paths, and a read-modify-write of `counter` under every write.
fn contender(
    client: &Client,
    id: u64,
    path: Path_,
    origin: Instant,
    counter: &AtomicU64,
    until: Instant,
) -> History {
    const TTL: Duration = Duration::from_millis(1000);
    let mut h = History::default();
    let mut n = 0u64;
    // Bounded in count and in time.
    while Instant::now() < until && n < 400 {
        n += 1;
        let write = (n + id) % 5 >= 3;
        let invoke = origin.elapsed();
        let held = if !write {
            client
                .read_lock(KEY, TTL)
                .map(|l| (Kind::Read, Box::new(l) as Box<dyn Held>))
        } else if matches!(path, Path_::Fair) && n % 2 == 1 {
            client
                .write_lock_fenced(KEY, TTL)
                .map(|l| (Kind::Write, Box::new(l) as Box<dyn Held>))
        } else {
            client
                .write_lock(KEY, TTL)
                .map(|l| (Kind::Write, Box::new(l) as Box<dyn Held>))
        };
        let Ok((kind, mut held)) = held else {
            continue;
        };
        let ok = origin.elapsed();
        let op = h.push(Op {
            client: id,
            kind,
            key: KEY.to_vec(),
            invoke,
            ok: Some(ok),
            fence: None,
            valid_until: Some(ok + held.validity()),
            release: None,
        });
        let read = counter.load(Ordering::SeqCst);
        thread::sleep(Duration::from_millis(2));
        if n % 7 == 0 && held.extend(TTL) {
            h.ops[op].valid_until = Some(origin.elapsed() + held.validity());
        }
        if kind == Kind::Write && held.validity() > Duration::ZERO {
            counter.store(read + 1, Ordering::SeqCst);
            h.increments.push(Increment {
                client: id,
                key: KEY.to_vec(),
                read,
                at: origin.elapsed(),
                op,
            });
        }
        h.ops[op].release = Some(origin.elapsed());
        held.release();
    }
    h
}

/// What a contender does with any of the guards.
trait Held {
    fn validity(&self) -> Duration;
    fn extend(&mut self, ttl: Duration) -> bool;
    fn release(self: Box<Self>);
}

macro_rules! held {
    ($($t:ty),*) => {$(
        impl Held for $t {
            fn validity(&self) -> Duration {
                <$t>::validity(self)
            }
            fn extend(&mut self, ttl: Duration) -> bool {
                <$t>::extend(self, ttl).is_ok()
            }
            fn release(self: Box<Self>) {
                let _ = <$t>::release(*self);
            }
        }
    )*};
}
held!(
    redlock_mux::ReadLock,
    redlock_mux::WriteLock,
    redlock_mux::FencedWriteLock
);

/// Runs native, fair and write-preferring contenders on one lock over `cluster` for `run`,
/// and checks the merged history.
fn contend(cluster: &RedisCluster, run: Duration) -> history::Report {
    let urls = cluster.urls();
    let origin = Instant::now();
    let until = origin + run;
    let counter = Arc::new(AtomicU64::new(0));
    let paths = [
        Path_::Native,
        Path_::Native,
        Path_::Native,
        Path_::Fair,
        Path_::WritePreferring,
    ];
    let workers: Vec<_> = paths
        .iter()
        .enumerate()
        .map(|(i, &path)| {
            let client = client(&urls, path);
            let counter = counter.clone();
            thread::spawn(move || contender(&client, i as u64, path, origin, &counter, until))
        })
        .collect();
    let mut h = History::default();
    for w in workers {
        h.merge(w.join().expect("contender"));
    }
    h.counters
        .insert(KEY.to_vec(), (0, counter.load(Ordering::SeqCst)));
    h.check()
}

/// 7.0 and 8.2 nodes in one quorum, N = 3 and N = 5, with readers and writers on every path
/// contending: no reader beside a writer, no two writers, no lost update.
#[test]
fn mixed_quorums_never_let_a_writer_beside_a_reader_or_another_writer() {
    let Some(r8) = redis8("mixed_quorums") else {
        return;
    };
    let r7 = redis7_program();
    let layouts: [&[bool]; 2] = [&[false, true, true], &[true, false, true, false, true]];
    for layout in layouts {
        let programs: Vec<Option<&Path>> = layout
            .iter()
            .map(|&eight| Some(if eight { r8.as_path() } else { r7.as_path() }))
            .collect();
        let cluster = RedisCluster::start_programs(&programs).expect("redis");
        let kinds: Vec<bool> = cluster.addrs().into_iter().map(native).collect();
        if kinds.iter().all(|&k| k) {
            eprintln!("mixed_quorums: skipped, the redis-server on PATH has HSETEX too");
            return;
        }
        assert_eq!(
            kinds, layout,
            "the 8.2 nodes have HSETEX, the 7.0 nodes not"
        );
        let report = contend(&cluster, Duration::from_millis(1500));
        eprintln!("N={} layout {layout:?}: {report}", layout.len());
        assert_eq!(report.violations(), 0, "{report}");
        assert!(report.windows > 10, "too few grants: {report}");
        // Both paths ran on the 8.2 nodes: the transaction, and the scripts.
        for (addr, eight) in cluster.addrs().into_iter().zip(layout) {
            if *eight {
                assert!(calls(addr, "hsetex") > 0 && calls(addr, "exec") > 0);
                assert!(calls(addr, "evalsha") + calls(addr, "eval") > 0);
            } else {
                assert_eq!(calls(addr, "hsetex"), 0);
            }
        }
    }
}

/// On an 8.2 node the read-preferring acquisitions send no script.
#[test]
fn read_preferring_acquires_take_the_native_path_on_redis_8() {
    let Some(r8) = redis8("native_path") else {
        return;
    };
    let cluster = RedisCluster::start_programs(&[Some(&r8), Some(&r8), Some(&r8)]).expect("redis");
    let client = client(&cluster.urls(), Path_::Native);
    let scripts = |addr| calls(addr, "evalsha") + calls(addr, "eval");
    let (r1, r2) = (
        client
            .try_read_lock(KEY, Duration::from_secs(5))
            .expect("reader"),
        client
            .try_read_lock(KEY, Duration::from_secs(5))
            .expect("reader"),
    );
    assert!(client
        .try_write_lock(KEY, Duration::from_secs(5))
        .unwrap_err()
        .is_contended());
    r1.release().expect("release");
    r2.release().expect("release");
    let w = client
        .try_write_lock(KEY, Duration::from_secs(5))
        .expect("writer");
    for addr in cluster.addrs() {
        // Two writers' transactions, and the two readers' releases, each one transaction.
        assert!(eventually(Duration::from_secs(2), || calls(addr, "exec") == 4));
        assert_eq!(calls(addr, "hsetex"), 2, "two readers");
        assert_eq!(calls(addr, "hdel"), 2, "two releases");
        // The refused writer's cleanup is a script; nothing else was.
        assert!(scripts(addr) <= 1, "scripts on {addr}: {}", scripts(addr));
        assert_eq!(get(addr, b"{rw:mixed}:w").as_deref(), Some(w.token()));
    }
}

/// A 7.0 node with an AOF holds a reader in its sorted set; it is restarted as 8.2 on the same
/// AOF while the reader holds. A writer is refused there, and on the quorum, until the reader
/// releases (first lock) or expires (second lock); then it gets in. The reader extends across
/// the upgrade.
#[test]
fn a_node_upgraded_on_its_aof_under_a_reader_keeps_writers_out_until_the_reader_leaves() {
    let Some(r8) = redis8("upgrade") else {
        return;
    };
    let r7 = redis7_program();
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut cluster = RedisCluster {
        servers: (0..3)
            .map(|_| RedisServer::start_program(&r7, &aof))
            .collect::<std::io::Result<_>>()
            .expect("redis"),
    };
    let addrs = cluster.addrs();
    if native(addrs[0]) {
        eprintln!("upgrade: skipped, the redis-server on PATH has HSETEX already");
        return;
    }
    let quorum = client(&cluster.urls(), Path_::Native);
    let mut released = quorum
        .try_read_lock("up:a", Duration::from_secs(20))
        .expect("reader");
    let expiring = quorum
        .try_read_lock("up:b", Duration::from_millis(2500))
        .expect("reader");
    let expires_at = Instant::now() + expiring.validity();
    for addr in &addrs {
        assert!(eventually(Duration::from_secs(2), || {
            cmd(*addr, &[b"ZCARD", b"{rw:up:b}:r"]) == Value::Integer(1)
        }));
    }
    // The upgrade: kill the 7.0 process by its PID, start 8.2 on its directory and AOF.
    cluster.servers[0].restart_as(&r8).expect("restart as 8.2");
    assert!(native(addrs[0]), "node 0 runs 8.2 now");
    for key in [&b"{rw:up:a}:r"[..], b"{rw:up:b}:r"] {
        assert_eq!(
            cmd(addrs[0], &[b"ZCARD", key]),
            Value::Integer(1),
            "reloaded"
        );
    }
    // The upgraded node alone, and the quorum: a writer is refused while the readers hold.
    let node0 = client(&[cluster.servers[0].url()], Path_::Native);
    for key in ["up:a", "up:b"] {
        let e = node0
            .try_write_lock(key, Duration::from_secs(5))
            .unwrap_err();
        assert!(e.is_contended(), "{e}");
        let e = quorum
            .try_write_lock(key, Duration::from_secs(5))
            .unwrap_err();
        assert!(e.is_contended(), "{e}");
    }
    assert!(
        calls(addrs[0], "exec") >= 2,
        "the 8.2 node was asked natively"
    );
    // The reader extends on the upgraded node too (its entry is in the sorted set there).
    // An extend returns at the quorum and does not retry a node whose connection was still
    // coming back after the restart, so it is repeated (a few times at most) until the
    // upgraded node answered it.
    let token = released.token().to_vec();
    let left = || {
        let score = match cmd(addrs[0], &[b"ZSCORE", b"{rw:up:a}:r", &token]) {
            Value::Bulk(Some(s)) => String::from_utf8_lossy(&s).parse::<f64>().unwrap(),
            other => panic!("no reader: {}", show(&other)),
        };
        let now_ms = match cmd(addrs[0], &[b"TIME"]) {
            Value::Array(Some(t)) => match (&t[0], &t[1]) {
                (Value::Bulk(Some(s)), Value::Bulk(Some(us))) => {
                    let s: f64 = String::from_utf8_lossy(s).parse().unwrap();
                    let us: f64 = String::from_utf8_lossy(us).parse().unwrap();
                    s * 1000.0 + us / 1000.0
                }
                _ => panic!("bad TIME"),
            },
            other => panic!("bad TIME {}", show(&other)),
        };
        score - now_ms
    };
    for _ in 0..5 {
        released.extend(Duration::from_secs(30)).expect("extend");
        if eventually(Duration::from_millis(500), || left() > 25_000.0) {
            break;
        }
    }
    assert!(
        left() > 25_000.0,
        "extended on the 8.2 node: {} ms left",
        left()
    );
    // Released: the writer gets in on the upgraded node, then on the quorum.
    released.release().expect("release");
    let w = node0
        .try_write_lock("up:a", Duration::from_secs(5))
        .expect("writer on node 0");
    w.release().expect("release");
    drop(
        quorum
            .try_write_lock("up:a", Duration::from_secs(5))
            .expect("writer on the quorum"),
    );
    // Expired: refused until then, in after.
    std::mem::forget(expiring);
    if Instant::now() + Duration::from_millis(300) < expires_at {
        assert!(node0
            .try_write_lock("up:b", Duration::from_secs(5))
            .unwrap_err()
            .is_contended());
    }
    thread::sleep(expires_at.saturating_duration_since(Instant::now()) + Duration::from_millis(50));
    let mut got = None;
    eventually(Duration::from_secs(3), || {
        got = node0.try_write_lock("up:b", Duration::from_secs(5)).ok();
        got.is_some()
    });
    got.expect("writer on node 0 after the reader expired")
        .release()
        .expect("release");
    let mut got = None;
    eventually(Duration::from_secs(3), || {
        got = quorum.try_write_lock("up:b", Duration::from_secs(5)).ok();
        got.is_some()
    });
    assert!(
        got.is_some(),
        "writer on the quorum after the reader expired"
    );
}
