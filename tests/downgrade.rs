//! Write-to-read downgrade against real redis-server processes: no writer gets in between,
//! readers join right after it, and the quorum matrix of the downgrade round (N = 3 and 5,
//! with 0..=N nodes refusing or frozen), with nothing left held after a lost round.

mod common;
use redlock_mux_kit::history;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use history::{History, Kind, Op};
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, KeepAlive};

const TTL: Duration = Duration::from_secs(10);

fn writer_key(k: &str) -> Vec<u8> {
    format!("{{rw:{k}}}:w").into_bytes()
}
fn readers_key(k: &str) -> Vec<u8> {
    format!("{{rw:{k}}}:r").into_bytes()
}

fn client(cluster: &RedisCluster, node_timeout: Duration) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .node_timeout(node_timeout)
        .retry_delay(Duration::from_millis(10))
        .retry_count(1000)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// Whether the sorted set `key` on `addr` has `member`.
fn has_member(addr: SocketAddr, key: &[u8], member: &[u8]) -> bool {
    !matches!(cmd(addr, &[b"ZSCORE", key, member]), Value::Bulk(None))
}

/// Whether `token` is a reader of `k` on `addr`: a member of the reader set, or (on Redis 8, where
/// the read-preferring lock goes without Lua) a field of the hash at the writer key.
fn is_reader(addr: SocketAddr, k: &str, token: &[u8]) -> bool {
    has_member(addr, &readers_key(k), token)
        || cmd(addr, &[b"HEXISTS", &writer_key(k), token]) == Value::Integer(1)
}

/// Whether `addr` holds anything of the lock taken with `token`: the writer key with it, or a
/// reader entry with it.
fn holds(addr: SocketAddr, k: &str, token: &[u8]) -> bool {
    get(addr, &writer_key(k)).as_deref() == Some(token) || has_member(addr, &readers_key(k), token)
}

#[test]
fn a_downgrade_keeps_the_token_and_moves_it_from_the_writer_key_to_the_readers() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let client = client(&cluster, Duration::from_millis(500));
    let writer = client.write_lock("doc", TTL).expect("write lock");
    let token = writer.token().to_vec();
    let reader = writer.downgrade().expect("downgrade");
    assert_eq!(reader.token(), token);
    assert_eq!(reader.key(), b"doc");
    assert!(reader.validity() > Duration::from_secs(9) && reader.validity() <= TTL);
    for &addr in &cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || {
            get(addr, &writer_key("doc")).is_none() && has_member(addr, &readers_key("doc"), &token)
        }));
        // The reader's score is its expiry on the node's clock, as every reader's is.
        let ttl = pttl(addr, &readers_key("doc"));
        assert!(ttl > 9_000 && ttl <= 10_000, "{ttl}");
    }
    // Other readers join at once; a writer does not.
    let other = client.try_read_lock("doc", TTL).expect("another reader");
    assert!(matches!(
        client.try_write_lock("doc", TTL),
        Err(Error::Contended { .. })
    ));
    other.release().expect("release");
    // The downgraded reader extends as a reader, and a shorter TTL is given when asked for.
    let mut reader = reader;
    reader.extend(Duration::from_secs(20)).expect("extend");
    assert!(reader.validity() > TTL);
    reader.release().expect("release");
    for &addr in &cluster.addrs() {
        assert!(eventually(Duration::from_secs(2), || !holds(
            addr, "doc", &token
        )));
    }
    client.try_write_lock("doc", TTL).expect("free again");

    // Kept alive as any read lock is; an invalid TTL is refused, and the write lock released.
    let reader = client
        .write_lock("kept", TTL)
        .expect("write lock")
        .downgrade()
        .expect("downgrade");
    let kept = reader
        .keep_alive(KeepAlive::new(Duration::from_secs(2)))
        .expect("keep-alive");
    assert!(!kept.is_lost());
    assert!(client.try_write_lock("kept", TTL).is_err());
    kept.release().expect("release");
    let writer = client.write_lock("bad-ttl", TTL).expect("write lock");
    assert!(matches!(
        writer.downgrade_for(Duration::ZERO),
        Err(Error::InvalidArgument(_))
    ));
    client
        .try_write_lock("bad-ttl", TTL)
        .expect("released after the refusal")
        .release()
        .expect("release");

    let writer = client.write_lock_fenced("fenced", TTL).expect("fenced");
    assert!(writer.fencing_token() >= 1);
    let reader = writer
        .downgrade_for(Duration::from_secs(3))
        .expect("downgrade");
    assert!(reader.validity() <= Duration::from_secs(3));
    drop(reader);
    client
        .try_write_lock("fenced", TTL)
        .expect("released on drop");
}

/// A write lock whose writer key went on some nodes, downgraded: a node where the downgrade
/// was not applied keeps its writer key no longer than the read lock, whose release takes it.
#[test]
fn a_writer_key_left_on_a_node_the_downgrade_missed_goes_with_the_read_lock() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let client = client(&cluster, Duration::from_millis(300));
    let addrs = cluster.addrs();
    let writer = client.write_lock("left", TTL).expect("write lock");
    let token = writer.token().to_vec();
    cluster.servers[2].pause().expect("pause");
    let reader = writer.downgrade().expect("a quorum of 2 of 3");
    cluster.servers[2].resume().expect("resume");
    reader.release().expect("release");
    for &addr in &addrs {
        assert!(eventually(Duration::from_secs(3), || !holds(
            addr, "left", &token
        )));
    }
}

/// The quorum matrix of the downgrade round: with `bad` of N nodes refusing (the writer key is
/// gone there) or frozen (SIGSTOP), the round is won exactly when N − bad is a quorum. A lost
/// round leaves nothing of the lock on any node (the frozen ones too, once they run again),
/// and the caller holds nothing; a won one leaves nothing once the read lock is released.
#[test]
fn the_downgrade_round_is_won_exactly_with_a_quorum_and_a_lost_one_leaves_nothing() {
    for n in [3usize, 5] {
        let cluster = RedisCluster::start(n).expect("cluster");
        let client = client(&cluster, Duration::from_millis(500));
        let addrs = cluster.addrs();
        let quorum = n / 2 + 1;
        for frozen in [false, true] {
            for bad in 0..=n {
                let k = format!("m{n}-{bad}-{frozen}");
                let case = format!(
                    "N={n}, {bad} nodes {}",
                    if frozen { "frozen" } else { "refusing" }
                );
                let writer = client.write_lock(&k, TTL).expect("write lock");
                let token = writer.token().to_vec();
                for (server, &addr) in cluster.servers.iter().zip(&addrs).take(bad) {
                    if frozen {
                        server.pause().expect("pause");
                    } else {
                        cmd(addr, &[b"DEL", &writer_key(&k)]);
                    }
                }
                let result = writer.downgrade();
                if frozen {
                    for server in &cluster.servers[..bad] {
                        server.resume().expect("resume");
                    }
                }
                match result {
                    Ok(reader) => {
                        assert!(n - bad >= quorum, "{case}: won without a quorum");
                        assert!(reader.validity() > Duration::ZERO, "{case}");
                        // A writer is refused while the read lock is held.
                        assert!(
                            client.try_write_lock(&k, TTL).is_err(),
                            "{case}: a writer got in"
                        );
                        reader.release().expect("release");
                    }
                    Err(e) => {
                        assert!(n - bad < quorum, "{case}: lost with a quorum: {e}");
                        if frozen {
                            assert!(
                                matches!(e, Error::QuorumUnreachable { .. }),
                                "{case}: {e:?}"
                            );
                        } else {
                            assert!(matches!(e, Error::Contended { .. }), "{case}: {e:?}");
                        }
                    }
                }
                for &addr in &addrs {
                    assert!(
                        eventually(Duration::from_secs(3), || !holds(addr, &k, &token)),
                        "{case}: left on {addr}"
                    );
                }
                // Nothing held: a writer takes the lock at once.
                client
                    .try_write_lock(&k, TTL)
                    .unwrap_or_else(|e| panic!("{case}: not free afterwards: {e}"))
                    .release()
                    .expect("release");
            }
        }
    }
}

/// A contender hammers `try_write_lock` while the holder writes, downgrades, reads, and
/// releases: no contender wins before the read lock is released, and the history checker finds
/// no overlap.
#[test]
fn no_writer_gets_in_between_a_write_lock_and_its_downgraded_read_lock() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let holder = client(&cluster, Duration::from_millis(500));
    let start = Instant::now();
    let history = Arc::new(Mutex::new(History::default()));
    let released = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let contenders: Vec<_> = (0..2)
        .map(|c| {
            let client = client(&cluster, Duration::from_millis(500));
            let (history, stop) = (history.clone(), stop.clone());
            thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut tries = 0u32;
                let mut wins = 0u32;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && tries < 50_000 {
                    tries += 1;
                    let invoke = start.elapsed();
                    if let Ok(w) = client.try_write_lock("hot", Duration::from_secs(2)) {
                        wins += 1;
                        let ok = start.elapsed();
                        let valid_until = ok + w.validity();
                        let release = start.elapsed();
                        drop(w);
                        history.lock().unwrap().push(Op {
                            client: 1 + c,
                            kind: Kind::Write,
                            key: b"hot".to_vec(),
                            invoke,
                            ok: Some(ok),
                            fence: None,
                            valid_until: Some(valid_until),
                            release: Some(release),
                        });
                    }
                }
                (tries, wins)
            })
        })
        .collect();
    let rounds = 15;
    for _ in 0..rounds {
        let invoke = start.elapsed();
        let writer = holder
            .write_lock("hot", Duration::from_secs(2))
            .expect("holder's write lock");
        let ok = start.elapsed();
        let write_until = ok + writer.validity();
        thread::sleep(Duration::from_millis(5));
        let downgrade_at = start.elapsed();
        let reader = writer.downgrade().expect("downgrade");
        let read_until = downgrade_at + reader.validity();
        thread::sleep(Duration::from_millis(20));
        let release = start.elapsed();
        reader.release().expect("release");
        released.lock().unwrap().push(release);
        let mut h = history.lock().unwrap();
        h.push(Op {
            client: 0,
            kind: Kind::Write,
            key: b"hot".to_vec(),
            invoke,
            ok: Some(ok),
            fence: None,
            valid_until: Some(write_until),
            release: Some(downgrade_at),
        });
        // The read lock counts from the downgrade's start: the nodes of its quorum held our
        // writer key or our reader all along.
        h.push(Op {
            client: 0,
            kind: Kind::Read,
            key: b"hot".to_vec(),
            invoke: downgrade_at,
            ok: Some(downgrade_at),
            fence: None,
            valid_until: Some(read_until),
            release: Some(release),
        });
        drop(h);
        // Let a contender win now and then, so the runs interleave.
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for t in contenders {
        let (tries, _wins) = t.join().expect("contender");
        total += tries;
    }
    let h = history.lock().unwrap();
    let report = h.check();
    assert_eq!(report.violations(), 0, "{report}");
    assert!(total > rounds, "the contenders tried: {total}");
    assert_eq!(
        h.ops.iter().filter(|o| o.kind == Kind::Read).count(),
        rounds as usize
    );
}

/// Readers waiting behind the write lock join as soon as it is downgraded, while the
/// downgraded read lock is still held: they are woken by the downgrade, not by a retry delay
/// (which is far longer than the test).
#[test]
fn waiting_readers_join_right_after_the_downgrade() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let client = client(&cluster, Duration::from_millis(500));
    let writer = client.write_lock("join", TTL).expect("write lock");
    let joined = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let reader_client = Client::builder()
                .nodes(cluster.urls())
                .retry_delay(Duration::from_secs(60))
                .retry_count(3)
                .wait_timeout(Duration::from_secs(120))
                .build()
                .expect("client");
            let joined = joined.clone();
            thread::spawn(move || {
                let r = reader_client.read_lock("join", TTL).expect("reader");
                joined.store(true, Ordering::SeqCst);
                r
            })
        })
        .collect();
    // The readers are refused and subscribe; give them time to do so.
    thread::sleep(Duration::from_millis(300));
    assert!(
        !joined.load(Ordering::SeqCst),
        "a reader got in beside the writer"
    );
    let reader = writer.downgrade().expect("downgrade");
    assert!(
        eventually(Duration::from_secs(20), || readers
            .iter()
            .all(|r| r.is_finished())),
        "the waiting readers did not join"
    );
    let others: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let tokens: Vec<&[u8]> = others.iter().map(|r| r.token()).collect();
    // Three readers at once on a quorum: the downgraded one and the two that joined.
    let together = cluster
        .addrs()
        .iter()
        .filter(|&&a| {
            has_member(a, &readers_key("join"), reader.token())
                && tokens.iter().all(|t| is_reader(a, "join", t))
        })
        .count();
    assert!(together >= 2, "{together}");
    assert!(reader.validity() > Duration::ZERO);
    reader.release().expect("release");
}

/// A downgrade adds our reader and never removes another one. A node may hold a live reader
/// beside our writer key for a moment: a writer on a Redis 8 node is refused by a reader in the
/// reader set only after its `SET NX` went in (the reader, from before an upgrade or from a
/// client on the Lua path, votes first; the writer's key then comes out as cleanup). Dropping
/// that reader's entry would free the node under it.
#[test]
fn a_downgrade_leaves_other_readers_in_place() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let client = client(&cluster, Duration::from_millis(500));
    let writer = client.write_lock("kept", TTL).expect("write lock");
    for addr in cluster.addrs() {
        assert_settles!(holds(addr, "kept", writer.token()));
        // Live for ever, as far as this test goes.
        cmd(addr, &[b"ZADD", &readers_key("kept"), b"+inf", b"other"]);
    }
    let reader = writer.downgrade().expect("downgrade");
    for addr in cluster.addrs() {
        assert_settles!(has_member(addr, &readers_key("kept"), reader.token()));
        assert!(
            has_member(addr, &readers_key("kept"), b"other"),
            "the other reader was dropped on {addr}"
        );
    }
}
