//! Nodes that answer but refuse writes: a replica (`READONLY`), a node that cannot persist
//! (`MISCONF`), a node out of memory (`OOM`). A release that such nodes refused must never be
//! reported as done: either it fails, naming the refusal, or it really removed the lock's
//! entries on a quorum. Every lock kind's release is checked, on Redis 7.0 and on Redis 8.2
//! (whose read-preferring read-write lock goes without Lua).
//!
//! Two nodes of three refuse: a release can then only be done if one of them really ran it.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, KeyNames, NodeErrorKind, RwPolicy};

const TTL: Duration = Duration::from_secs(20);

/// How a node is made to refuse writes, and how it is made whole again.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// A replica of a master that does not exist: `READONLY`.
    ReadOnly,
    /// The last background save failed and `stop-writes-on-bgsave-error` is on: `MISCONF`.
    Misconf,
    /// `maxmemory` far below what the node uses, no eviction: `OOM` for commands that may grow
    /// memory.
    Oom,
}

fn info(addr: SocketAddr, section: &[u8]) -> String {
    match cmd(addr, &[b"INFO", section]) {
        Value::Bulk(Some(text)) => String::from_utf8_lossy(&text).into_owned(),
        other => panic!("INFO: {}", show(&other)),
    }
}

impl Refusal {
    fn apply(self, addr: SocketAddr, scratch: &Path) {
        match self {
            Refusal::ReadOnly => {
                // Port 1 on loopback: nothing listens there, so the node stays a replica that
                // never syncs, and keeps its data.
                cmd(addr, &[b"REPLICAOF", b"127.0.0.1", b"1"]);
            }
            Refusal::Misconf => {
                // A background save into a directory that is then removed fails; with a save
                // point configured, the node refuses writes until a save succeeds.
                let dir = scratch.join(format!("misconf-{}", addr.port()));
                std::fs::create_dir_all(&dir).unwrap();
                cmd(
                    addr,
                    &[b"CONFIG", b"SET", b"dir", dir.to_str().unwrap().as_bytes()],
                );
                cmd(addr, &[b"CONFIG", b"SET", b"save", b"3600 1"]);
                cmd(
                    addr,
                    &[b"CONFIG", b"SET", b"stop-writes-on-bgsave-error", b"yes"],
                );
                std::fs::remove_dir_all(&dir).unwrap();
                cmd(addr, &[b"BGSAVE"]);
                assert!(
                    eventually(Duration::from_secs(10), || info(addr, b"persistence")
                        .contains("rdb_last_bgsave_status:err")),
                    "the background save did not fail"
                );
            }
            Refusal::Oom => {
                cmd(
                    addr,
                    &[b"CONFIG", b"SET", b"maxmemory-policy", b"noeviction"],
                );
                cmd(addr, &[b"CONFIG", b"SET", b"maxmemory", b"1"]);
            }
        }
    }

    fn undo(self, addr: SocketAddr, scratch: &Path) {
        match self {
            Refusal::ReadOnly => {
                cmd(addr, &[b"REPLICAOF", b"NO", b"ONE"]);
            }
            Refusal::Misconf => {
                cmd(addr, &[b"CONFIG", b"SET", b"save", b""]);
                let _ = scratch;
            }
            Refusal::Oom => {
                cmd(addr, &[b"CONFIG", b"SET", b"maxmemory", b"0"]);
            }
        }
    }

    /// Whether a release refused this way can really have removed nothing: deletes are not
    /// refused when out of memory, so under `OOM` a release may well be done.
    fn refuses_deletes(self) -> bool {
        !matches!(self, Refusal::Oom)
    }
}

/// Entries of every lock kind left on the node for `key`: the mutex key, the writer key (a
/// string, or a hash of readers on Redis 8), and the reader set.
fn entries(addr: SocketAddr, key: &[u8]) -> i64 {
    let names = KeyNames::new(key);
    let mut n = 0;
    for name in [&names.mutex, &names.writer, &names.readers] {
        n += match cmd(addr, &[b"TYPE", name]) {
            Value::Simple(t) if t == b"none" => 0,
            Value::Simple(t) if t == b"hash" => match cmd(addr, &[b"HLEN", name]) {
                Value::Integer(k) => k,
                other => panic!("HLEN: {}", show(&other)),
            },
            Value::Simple(t) if t == b"zset" => match cmd(addr, &[b"ZCARD", name]) {
                Value::Integer(k) => k,
                other => panic!("ZCARD: {}", show(&other)),
            },
            Value::Simple(_) => 1,
            other => panic!("TYPE: {}", show(&other)),
        };
    }
    n
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Mutex,
    Read,
    Write,
}

/// Takes a lock of `kind` on all three nodes, makes nodes 0 and 1 refuse writes, and releases:
/// the release fails naming the refusal, or the lock's entries are really gone from a quorum.
fn release_on_refusing_nodes(program: &Path, refusal: Refusal, kind: Kind) {
    // `dir` is a protected setting; the MISCONF refusal moves it.
    let servers = (0..3)
        .map(|_| RedisServer::start_program(program, &["--enable-protected-configs", "yes"]))
        .collect::<std::io::Result<Vec<_>>>()
        .expect("start redis-server");
    let cluster = RedisCluster { servers };
    let addrs = cluster.addrs();
    let scratch = tempdir();
    let client = Client::builder()
        .nodes(cluster.urls())
        .rw_policy(RwPolicy::ReadPreferring)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let key = format!("refused:{kind:?}");
    let release: Box<dyn FnOnce() -> Result<(), Error>> = match kind {
        Kind::Mutex => {
            let l = client.try_lock(&key, TTL).expect("lock");
            Box::new(move || l.release())
        }
        Kind::Read => {
            let l = client.try_read_lock(&key, TTL).expect("read lock");
            Box::new(move || l.release())
        }
        Kind::Write => {
            let l = client.try_write_lock(&key, TTL).expect("write lock");
            Box::new(move || l.release())
        }
    };
    for &addr in &addrs {
        assert_settles!(entries(addr, key.as_bytes()) > 0);
    }
    for &addr in &addrs[..2] {
        refusal.apply(addr, &scratch);
    }
    let outcome = release();
    let left: Vec<i64> = addrs.iter().map(|&a| entries(a, key.as_bytes())).collect();
    for &addr in &addrs[..2] {
        refusal.undo(addr, &scratch);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let holding = left.iter().filter(|&&n| n > 0).count();
    match outcome {
        Ok(()) => assert!(
            holding < 2,
            "{refusal:?} {kind:?}: release() returned Ok, yet {holding} of 3 nodes still hold \
             the lock ({left:?} entries)"
        ),
        Err(e) => {
            let named = e.failures().iter().any(|f| {
                matches!(&f.kind, NodeErrorKind::Server { message, .. }
                if message.starts_with(match refusal {
                    Refusal::ReadOnly => "READONLY",
                    Refusal::Misconf => "MISCONF",
                    Refusal::Oom => "OOM",
                }))
            });
            assert!(
                named,
                "{refusal:?} {kind:?}: the failure does not name it: {e}"
            );
            assert!(
                !e.is_contended(),
                "{refusal:?} {kind:?}: reported as contention: {e}"
            );
        }
    }
    if refusal.refuses_deletes() {
        assert!(
            holding >= 2,
            "{refusal:?} {kind:?}: the refusing nodes removed the lock ({left:?} entries)"
        );
    }
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "redlock-mux-refused-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn every_release(program: &Path) {
    for refusal in [Refusal::ReadOnly, Refusal::Misconf, Refusal::Oom] {
        for kind in [Kind::Mutex, Kind::Read, Kind::Write] {
            release_on_refusing_nodes(program, refusal, kind);
        }
    }
}

#[test]
fn a_release_refused_by_a_quorum_is_never_reported_done_on_redis_7() {
    every_release(&redis7_program());
}

#[test]
fn a_release_refused_by_a_quorum_is_never_reported_done_on_redis_8() {
    let Some(redis8) = redis8_program() else {
        eprintln!(
            "a_release_refused_by_a_quorum_is_never_reported_done_on_redis_8: skipped, no \
             Redis 8 redis-server (run `bash .ci/install`, or set {REDIS8_SERVER_ENV})"
        );
        return;
    };
    every_release(&redis8);
}
