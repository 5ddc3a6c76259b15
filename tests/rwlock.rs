//! Read-write locks against real redis-server processes (Debian's 7.0, which has no `DELEX`,
//! or 8.2, whose hash-field expiry the read-preferring lock uses without Lua), at N = 1, 3 and
//! 5; the `DELEX` path against a scripted fake. What a node holds is read through helpers that
//! know both representations of readers: a sorted set (7.x, and every scripted path), or fields
//! of a hash at the writer key (8.x, read-preferring).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, RwPolicy};

const SIZES: [usize; 3] = [1, 3, 5];
const TTL: Duration = Duration::from_secs(10);

/// The documented key names for a resource key without a hash tag.
fn writer_key(k: &str) -> Vec<u8> {
    format!("{{rw:{k}}}:w").into_bytes()
}
fn readers_key(k: &str) -> Vec<u8> {
    format!("{{rw:{k}}}:r").into_bytes()
}
fn intents_key(k: &str) -> Vec<u8> {
    format!("{{rw:{k}}}:wi").into_bytes()
}

fn client(cluster: &RedisCluster, policy: RwPolicy) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_millis(10))
        .retry_count(1000)
        .wait_timeout(Duration::from_secs(5))
        .rw_policy(policy)
        .build()
        .expect("client")
}

fn int(addr: SocketAddr, args: &[&[u8]]) -> i64 {
    match cmd(addr, args) {
        Value::Integer(n) => n,
        other => panic!("unexpected reply {}", show(&other)),
    }
}

fn zcard(addr: SocketAddr, key: &[u8]) -> i64 {
    int(addr, &[b"ZCARD", key])
}

/// The members of a sorted set.
fn members(addr: SocketAddr, key: &[u8]) -> Vec<Vec<u8>> {
    match cmd(addr, &[b"ZRANGE", key, b"0", b"-1"]) {
        Value::Array(Some(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::Bulk(Some(b)) => b,
                other => panic!("unexpected member {}", show(&other)),
            })
            .collect(),
        other => panic!("unexpected reply {}", show(&other)),
    }
}

fn key_type(addr: SocketAddr, key: &[u8]) -> Vec<u8> {
    match cmd(addr, &[b"TYPE", key]) {
        Value::Simple(t) => t,
        other => panic!("unexpected reply {}", show(&other)),
    }
}

/// The live readers of lock `k` on a node, in either representation.
fn reader_count(addr: SocketAddr, k: &str) -> i64 {
    let hash = if key_type(addr, &writer_key(k)) == b"hash" {
        int(addr, &[b"HLEN", &writer_key(k)])
    } else {
        0
    };
    zcard(addr, &readers_key(k)) + hash
}

/// The writer's token on a node: the writer key when it is a string.
fn writer_token(addr: SocketAddr, k: &str) -> Option<Vec<u8>> {
    if key_type(addr, &writer_key(k)) == b"hash" {
        return None;
    }
    get(addr, &writer_key(k))
}

/// When a reader expires on a node, in ms on its clock: its score in the reader set, or its
/// field's expiry in the hash at the writer key.
fn reader_expiry(addr: SocketAddr, k: &str, token: &[u8]) -> Option<i64> {
    if let Value::Bulk(Some(s)) = cmd(addr, &[b"ZSCORE", &readers_key(k), token]) {
        return Some(String::from_utf8_lossy(&s).parse().unwrap());
    }
    if key_type(addr, &writer_key(k)) != b"hash" {
        return None;
    }
    match cmd(
        addr,
        &[b"HPEXPIRETIME", &writer_key(k), b"FIELDS", b"1", token],
    ) {
        Value::Array(Some(v)) => match v.first() {
            Some(Value::Integer(at)) if *at > 0 => Some(*at),
            _ => None,
        },
        other => panic!("unexpected reply {}", show(&other)),
    }
}

/// How long the longest-lived reader of `k` may keep the reader key on a node: the reader set's
/// TTL, or the hash's latest field expiry from now (-2 when neither exists).
fn readers_pttl(addr: SocketAddr, k: &str) -> i64 {
    if key_type(addr, &writer_key(k)) != b"hash" {
        return pttl(addr, &readers_key(k));
    }
    let fields = match cmd(addr, &[b"HKEYS", &writer_key(k)]) {
        Value::Array(Some(items)) => items,
        other => panic!("unexpected reply {}", show(&other)),
    };
    let now = node_ms(addr);
    fields
        .iter()
        .filter_map(|f| match f {
            Value::Bulk(Some(tok)) => reader_expiry(addr, k, tok),
            _ => None,
        })
        .map(|at| at - now)
        .max()
        .unwrap_or(-2)
}

/// The node's clock in ms, as the scripts read it.
fn node_ms(addr: SocketAddr) -> i64 {
    match cmd(addr, &[b"TIME"]) {
        Value::Array(Some(t)) => match (&t[0], &t[1]) {
            (Value::Bulk(Some(s)), Value::Bulk(Some(us))) => {
                let s: i64 = String::from_utf8_lossy(s).parse().unwrap();
                let us: i64 = String::from_utf8_lossy(us).parse().unwrap();
                s * 1000 + us / 1000
            }
            _ => panic!("bad TIME"),
        },
        other => panic!("unexpected reply {}", show(&other)),
    }
}

/// Waits up to 2 s for `cond`: cleanup after a lost round is sent without waiting for replies.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn many_readers_hold_the_lock_at_once_and_exclude_a_writer() {
    for n in SIZES {
        let cluster = RedisCluster::start(n).expect("redis");
        let client = client(&cluster, RwPolicy::ReadPreferring);
        let readers: Vec<_> = (0..4)
            .map(|_| client.try_read_lock("doc", TTL).expect("reader"))
            .collect();
        for addr in cluster.addrs() {
            eventually("every node holds the readers", || {
                reader_count(addr, "doc") == 4
            });
            assert_settles_eq!(writer_token(addr, "doc"), None);
        }
        for r in &readers {
            assert!(r.validity() > Duration::from_secs(9));
            assert_eq!(r.key(), b"doc");
            assert_eq!(r.token().len(), 40);
        }
        assert!(client
            .try_write_lock("doc", TTL)
            .unwrap_err()
            .is_contended());
        for r in readers {
            r.release().expect("release");
        }
        for addr in cluster.addrs() {
            assert_settles_eq!(reader_count(addr, "doc"), 0, "N={n}");
        }
        let w = client
            .try_write_lock("doc", TTL)
            .expect("writer after readers left");
        for addr in cluster.addrs() {
            assert_settles_eq!(
                get(addr, &writer_key("doc")).as_deref(),
                Some(w.token()),
                "N={n}"
            );
        }
    }
}

#[test]
fn a_writer_excludes_readers_and_writers_until_released() {
    for n in SIZES {
        let cluster = RedisCluster::start(n).expect("redis");
        let client = client(&cluster, RwPolicy::ReadPreferring);
        let mut w = client.try_write_lock("doc", TTL).expect("writer");
        assert!(client.try_read_lock("doc", TTL).unwrap_err().is_contended());
        assert!(client
            .try_write_lock("doc", TTL)
            .unwrap_err()
            .is_contended());
        // The refused attempts left nothing behind.
        for addr in cluster.addrs() {
            eventually("the refused reader is gone", || {
                zcard(addr, &readers_key("doc")) == 0
            });
            assert_settles_eq!(get(addr, &writer_key("doc")).as_deref(), Some(w.token()));
        }
        w.extend(Duration::from_secs(20)).expect("extend");
        assert!(w.validity() > Duration::from_secs(19));
        for addr in cluster.addrs() {
            assert_settles!(pttl(addr, &writer_key("doc")) > 19_000);
        }
        w.release().expect("release");
        for addr in cluster.addrs() {
            assert_settles_eq!(get(addr, &writer_key("doc")), None);
        }
        drop(
            client
                .try_read_lock("doc", TTL)
                .expect("reader after release"),
        );
    }
}

#[test]
fn readers_score_by_the_node_clock_and_extend_only_themselves() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = client(&cluster, RwPolicy::ReadPreferring);
    let mut r = client.try_read_lock("doc", TTL).expect("reader");
    let other = client.try_read_lock("doc", TTL).expect("reader");
    for addr in cluster.addrs() {
        eventually("every node holds the readers", || {
            reader_count(addr, "doc") == 2
        });
        let score = reader_expiry(addr, "doc", r.token()).expect("no expiry");
        let expected = node_ms(addr) + 10_000;
        assert_settles!(
            (expected - 1_000..=expected).contains(&score),
            "score {score} should be the node's clock plus the TTL ({expected})"
        );
        // The readers last at least as long as the longest-lived one.
        assert_settles!(readers_pttl(addr, "doc") > 9_000);
    }
    r.extend(Duration::from_secs(30)).expect("extend");
    assert!(r.validity() > Duration::from_secs(29));
    for addr in cluster.addrs() {
        eventually("every node extended the reader", || {
            readers_pttl(addr, "doc") > 29_000
        });
        let score_of = |tok: &[u8]| reader_expiry(addr, "doc", tok).expect("no expiry");
        assert_settles!(score_of(r.token()) - node_ms(addr) > 29_000);
        assert_settles!(score_of(other.token()) - node_ms(addr) < 10_001);
    }
    // A reader that is gone cannot extend.
    let tok = other.token().to_vec();
    other.release().expect("release");
    for addr in cluster.addrs() {
        assert_settles!(!members(addr, &readers_key("doc")).contains(&tok));
        assert_settles_eq!(reader_expiry(addr, "doc", &tok), None);
    }
}

#[test]
fn expired_readers_do_not_block_a_writer_and_an_abandoned_set_disappears() {
    for n in SIZES {
        let cluster = RedisCluster::start(n).expect("redis");
        let client = client(&cluster, RwPolicy::ReadPreferring);
        let short = Duration::from_millis(300);
        // Two readers that die without releasing.
        std::mem::forget(client.try_read_lock("doc", short).expect("reader"));
        std::mem::forget(client.try_read_lock("doc", short).expect("reader"));
        assert!(client
            .try_write_lock("doc", TTL)
            .unwrap_err()
            .is_contended());
        thread::sleep(short + Duration::from_millis(20));
        drop(
            client
                .try_write_lock("doc", TTL)
                .expect("expired readers do not count"),
        );

        std::mem::forget(client.try_read_lock("gone", short).expect("reader"));
        // The acquire returns at the quorum: the last node may run the script moments later.
        for addr in cluster.addrs() {
            eventually("every node holds the reader", || {
                readers_pttl(addr, "gone") > 0
            });
            let left = readers_pttl(addr, "gone");
            assert_settles!(left <= 300, "N={n}: the readers' TTL is {left}");
        }
        thread::sleep(short + Duration::from_millis(20));
        for addr in cluster.addrs() {
            // A hash whose last field expired is deleted by the server's expiry cycle.
            eventually("the expired reader is gone", || dbsize(addr) == 0);
            assert_settles_eq!(readers_pttl(addr, "gone"), -2, "N={n}");
        }
    }
}

#[test]
fn a_joining_reader_prunes_expired_readers_and_never_shortens_the_set() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = client(&cluster, RwPolicy::ReadPreferring);
    let short = Duration::from_millis(300);
    // A reader that dies without releasing creates the readers, with its own TTL.
    let dead = client.try_read_lock("doc", short).expect("reader");
    let dead_token = dead.token().to_vec();
    std::mem::forget(dead);
    // A longer reader joins the readers that are there: they last long enough to cover it.
    let long = client
        .try_read_lock("doc", Duration::from_secs(30))
        .expect("reader");
    for addr in cluster.addrs() {
        eventually("every node holds both readers", || {
            reader_count(addr, "doc") == 2
        });
        assert_settles!(readers_pttl(addr, "doc") > 29_000);
    }
    thread::sleep(short + Duration::from_millis(20));
    // A shorter reader joins later: the expired one is pruned, and the readers still last as
    // long as the longest one.
    let third = client.try_read_lock("doc", TTL).expect("reader");
    for addr in cluster.addrs() {
        eventually("every node pruned the expired reader", || {
            reader_count(addr, "doc") == 2 && reader_expiry(addr, "doc", &dead_token).is_none()
        });
        assert_settles!(reader_expiry(addr, "doc", long.token()).is_some());
        assert_settles!(reader_expiry(addr, "doc", third.token()).is_some());
        assert_settles!(readers_pttl(addr, "doc") > 28_000);
    }
    third.release().expect("release");
    long.release().expect("release");
    for addr in cluster.addrs() {
        eventually("the readers are gone", || dbsize(addr) == 0);
    }
}

/// Sets a conflicting holder on the first `k` nodes: a foreign writer (against a reader) or
/// a foreign live reader (against a writer).
fn foreign_holder(addrs: &[SocketAddr], k: usize, against_write: bool) {
    for &addr in &addrs[..k] {
        if against_write {
            int(addr, &[b"ZADD", &readers_key("m"), b"1e15", b"foreign"]);
        } else {
            cmd(
                addr,
                &[b"SET", &writer_key("m"), b"foreign", b"PX", b"60000"],
            );
        }
    }
}

#[test]
fn quorum_matrix_for_read_and_write_with_cleanup_after_a_failure() {
    for n in SIZES {
        let mut cluster = RedisCluster::start(n).expect("redis");
        let addrs = cluster.addrs();
        let client = client(&cluster, RwPolicy::ReadPreferring);
        let q = n / 2 + 1;
        for against_write in [false, true] {
            for k in 0..=n {
                addrs.iter().for_each(|a| flushall(*a));
                foreign_holder(&addrs, k, against_write);
                let won = if against_write {
                    client.try_write_lock("m", TTL).map(|l| l.token().to_vec())
                } else {
                    client.try_read_lock("m", TTL).map(|l| l.token().to_vec())
                };
                let side = if against_write { "write" } else { "read" };
                match won {
                    Ok(_) => assert!(n - k >= q, "N={n} k={k}: {side} won without a quorum"),
                    Err(e) => {
                        assert!(n - k < q, "N={n} k={k}: {side} lost with a quorum: {e}");
                        assert!(e.is_contended(), "{e}");
                    }
                }
                // Won and released, or lost and cleaned up: only the foreign holder is left.
                for (i, &addr) in addrs.iter().enumerate() {
                    let foreign = i < k;
                    eventually("the attempt left nothing", || {
                        let readers = members(addr, &readers_key("m"));
                        let writer = get(addr, &writer_key("m"));
                        if against_write {
                            readers
                                == if foreign {
                                    vec![b"foreign".to_vec()]
                                } else {
                                    vec![]
                                }
                                && writer.is_none()
                        } else {
                            readers.is_empty() && writer == foreign.then(|| b"foreign".to_vec())
                        }
                    });
                }
            }
        }
        // Failed nodes: the last `k` are killed.
        addrs.iter().for_each(|a| flushall(*a));
        for k in 1..=n {
            cluster.servers[n - k].kill().expect("kill");
            // Each guard is dropped (released) at once, before the other side tries.
            let read = client.try_read_lock("f", TTL).map(drop);
            let write = client.try_write_lock("f", TTL).map(drop);
            if n - k >= q {
                read.expect("read with a quorum up");
                write.expect("write with a quorum up");
            } else {
                for e in [read.unwrap_err(), write.unwrap_err()] {
                    assert!(
                        matches!(e, Error::QuorumUnreachable { .. }),
                        "N={n} k={k}: {e}"
                    );
                }
            }
        }
    }
}

#[test]
fn write_preferring_lets_a_writer_through_a_stream_of_readers() {
    // The bound: once the writer's first attempt has left its intent on a quorum, no new
    // reader gets in, so the writer waits at most for the longest reader hold in place (20 ms
    // here; the readers' TTL if they never release) plus one retry delay (at most 1.5 × 10 ms)
    // plus a round: about 40 ms on loopback. It is asserted at 1 s to stay clear of scheduling
    // noise on a loaded two-core machine; the measured figure is printed.
    const HOLD: Duration = Duration::from_millis(20);
    const BOUND: Duration = Duration::from_secs(1);
    for n in [3, 5] {
        let cluster = RedisCluster::start(n).expect("redis");
        let client = client(&cluster, RwPolicy::WritePreferring);
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(5));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (client, stop, reads, start) =
                    (client.clone(), stop.clone(), reads.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        if let Ok(r) = client.try_read_lock("hot", TTL) {
                            reads.fetch_add(1, Ordering::SeqCst);
                            thread::sleep(HOLD);
                            let _ = r.release();
                        } else {
                            thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        start.wait();
        // Let the readers overlap so that the lock is never free of readers.
        eventually("the readers are busy", || {
            reads.load(Ordering::SeqCst) >= 20
        });
        let t = Instant::now();
        let w = client.write_lock("hot", TTL);
        let waited = t.elapsed();
        let reads_before = reads.load(Ordering::SeqCst);
        let w = w.expect("the writer got in");
        // While the writer holds, no reader gets in.
        thread::sleep(Duration::from_millis(100));
        assert_eq!(reads.load(Ordering::SeqCst), reads_before);
        w.release().expect("release");
        eventually("the readers resume", || {
            reads.load(Ordering::SeqCst) > reads_before
        });
        stop.store(true, Ordering::SeqCst);
        readers.into_iter().for_each(|t| t.join().expect("reader"));
        eprintln!("N={n}: the writer waited {waited:?} behind 4 readers holding {HOLD:?} each");
        assert!(waited < BOUND, "N={n}: the writer waited {waited:?}");
        for addr in cluster.addrs() {
            eventually("the intent is withdrawn", || {
                pttl(addr, &intents_key("hot")) == -2
            });
        }
    }
}

#[test]
fn a_dead_writers_intent_holds_readers_back_only_until_it_expires() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = client(&cluster, RwPolicy::WritePreferring);
    for addr in cluster.addrs() {
        let until = (node_ms(addr) + 300).to_string();
        int(
            addr,
            &[b"ZADD", &intents_key("d"), until.as_bytes(), b"dead"],
        );
        int(addr, &[b"PEXPIRE", &intents_key("d"), b"300"]);
    }
    assert!(client.try_read_lock("d", TTL).unwrap_err().is_contended());
    thread::sleep(Duration::from_millis(320));
    drop(client.try_read_lock("d", TTL).expect("the intent expired"));
}

#[test]
fn read_preferring_writers_leave_no_intent() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = client(&cluster, RwPolicy::ReadPreferring);
    let r = client.try_read_lock("p", TTL).expect("reader");
    assert!(client.try_write_lock("p", TTL).unwrap_err().is_contended());
    drop(client.try_read_lock("p", TTL).expect("a second reader"));
    for addr in cluster.addrs() {
        assert_settles_eq!(pttl(addr, &intents_key("p")), -2);
    }
    r.release().expect("release");
}

#[test]
fn closures_release_even_when_they_panic() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = client(&cluster, RwPolicy::ReadPreferring);
    let seen = client
        .read("c", TTL, |r| {
            assert!(r.validity() > Duration::ZERO);
            r.token().to_vec()
        })
        .expect("read");
    assert_eq!(seen.len(), 40);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        client.write("c", TTL, |_w| panic!("the work failed"))
    }));
    assert!(panicked.is_err());
    for addr in cluster.addrs() {
        assert_settles_eq!(dbsize(addr), 0, "{:?}", keys(addr));
    }
    let n = client
        .write("c", TTL, |w| {
            w.extend(Duration::from_secs(20)).expect("extend");
            7
        })
        .expect("write after the panic");
    assert_eq!(n, 7);
}

#[test]
fn keys_with_a_hash_tag_keep_it() {
    let cluster = RedisCluster::start(1).expect("redis");
    let client = client(&cluster, RwPolicy::ReadPreferring);
    let w = client.try_write_lock("user:{42}", TTL).expect("writer");
    assert_eq!(
        get(cluster.addrs()[0], b"user:{42}:rw:w").as_deref(),
        Some(w.token())
    );
}

/// Scripted fake: no installable server has `DELEX` (Redis 8.4), so this node answers
/// `INFO server` as 8.4 and `COMMAND INFO DELEX HSETEX` as 8.4 would without `HSETEX` (so
/// that the writer takes the lock with the script), and answers a transaction as Redis does: `+OK` to `MULTI`, `+QUEUED`
/// to each command (or `refusal` to `DELEX`, as a replica would), then `EXEC` with every
/// queued command's reply, or `EXECABORT` if one was refused.
fn delex_node(refusal: Option<&'static str>) -> FakeServer {
    // `Some((replies, refused))` inside a transaction: the queued commands' replies, and
    // whether one of them was refused.
    let multi = Mutex::new(None::<(Vec<FakeReply>, bool)>);
    FakeServer::start(move |args| {
        let name = args[0].to_ascii_uppercase();
        let mut multi = multi.lock().unwrap();
        let reply = match name.as_slice() {
            b"COMMAND" => FakeReply::Bytes(
                b"*2\r\n*3\r\n$5\r\ndelex\r\n:-2\r\n*1\r\n+write\r\n$-1\r\n".to_vec(),
            ),
            b"SCRIPT" => FakeReply::bulk(Some(b"0000000000000000000000000000000000000000")),
            // A fast path is used only on a server it was verified on: Redis 8.4 here.
            b"INFO" => FakeReply::bulk(Some(
                b"# Server\r\nredis_version:8.4.0\r\n\
                  run_id:0000000000000000000000000000000000000001\r\n",
            )),
            b"EVALSHA" | b"EVAL" => FakeReply::integer(1),
            b"MULTI" => {
                *multi = Some((Vec::new(), false));
                return FakeReply::simple("OK");
            }
            b"DELEX" => match refusal {
                Some(r) => {
                    if let Some((_, refused)) = multi.as_mut() {
                        *refused = true;
                    }
                    return FakeReply::error(r);
                }
                None => FakeReply::integer(1),
            },
            b"PUBLISH" => FakeReply::integer(0),
            b"EXEC" => {
                return match multi.take() {
                    None => FakeReply::error("ERR EXEC without MULTI"),
                    Some((_, true)) => FakeReply::error(
                        "EXECABORT Transaction discarded because of previous errors.",
                    ),
                    Some((queued, false)) => {
                        let mut out = format!("*{}\r\n", queued.len()).into_bytes();
                        for r in queued {
                            let FakeReply::Bytes(b) = r else {
                                unreachable!()
                            };
                            out.extend_from_slice(&b);
                        }
                        FakeReply::Bytes(out)
                    }
                };
            }
            _ => FakeReply::error("ERR unexpected"),
        };
        match multi.as_mut() {
            Some((queued, _)) if matches!(name.as_slice(), b"DELEX" | b"PUBLISH") => {
                queued.push(reply);
                FakeReply::simple("QUEUED")
            }
            _ => reply,
        }
    })
    .expect("fake")
}

#[test]
fn writer_release_uses_delex_where_the_node_has_it() {
    let fake = delex_node(None);
    let client = Client::new([fake.url()]).expect("client");
    // The connection's setup (and its COMMAND INFO) is answered before the first round is.
    let w = client.try_write_lock("k", TTL).expect("writer");
    let token = w.token().to_vec();
    w.release().expect("release");
    let commands = fake.commands();
    assert!(commands.iter().any(|c| c
        == &[
            b"COMMAND".to_vec(),
            b"INFO".to_vec(),
            b"DELEX".to_vec(),
            b"HSETEX".to_vec()
        ]));
    // The release and its announcement (DELEX is no script), in one transaction.
    let [.., multi, delex, publish, exec] = commands.as_slice() else {
        panic!("{commands:?}")
    };
    assert_eq!(multi, &[b"MULTI".to_vec()]);
    assert_eq!(
        delex,
        &[
            b"DELEX".to_vec(),
            writer_key("k"),
            b"IFEQ".to_vec(),
            token.clone()
        ]
    );
    assert_eq!(
        publish,
        &[
            b"PUBLISH".to_vec(),
            b"redlock-mux:wake:k".to_vec(),
            token[..16].to_vec()
        ]
    );
    assert_eq!(exec, &[b"EXEC".to_vec()]);
}

/// A node that refuses the `DELEX` (a replica: `READONLY`) while its `PUBLISH` would still go
/// through: the release fails, naming the refusal, and is never acknowledged by the
/// announcement's reply.
#[test]
fn a_delex_the_node_refused_is_never_counted_as_a_release() {
    let fake = delex_node(Some(
        "READONLY You can't write against a read only replica.",
    ));
    let client = Client::new([fake.url()]).expect("client");
    let w = client.try_write_lock("k", TTL).expect("writer");
    let e = w.release().expect_err("a refused release must fail");
    assert!(!e.is_contended(), "{e}");
    assert!(
        e.failures()
            .iter()
            .any(|f| f.kind.to_string().contains("READONLY")),
        "the failure does not name the refusal: {e}"
    );
}

/// Redis 7.0 has no `DELEX`: the writer release is the compare-and-delete script, and it
/// announces the release on the wake channel.
#[test]
fn writer_release_falls_back_to_lua_and_announces_itself() {
    let cluster = RedisCluster::start(1).expect("redis");
    let addr = cluster.addrs()[0];
    let client = client(&cluster, RwPolicy::ReadPreferring);
    let w = client.try_write_lock("k", TTL).expect("writer");
    assert_eq!(
        cmd(addr, &[b"COMMAND", b"INFO", b"DELEX"]),
        Value::Array(Some(vec![Value::Bulk(None)]))
    );
    let stats = |name: &str| -> i64 {
        match cmd(addr, &[b"INFO", b"commandstats"]) {
            Value::Bulk(Some(text)) => String::from_utf8_lossy(&text)
                .lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse().unwrap()),
            _ => 0,
        }
    };
    let before = stats("publish");
    w.release().expect("release");
    assert_eq!(get(addr, &writer_key("k")), None);
    assert_eq!(stats("publish"), before + 1, "the release is announced");
}
