//! Broken and hostile servers: every bad reply is a typed error naming the node, never a panic,
//! and the client recovers once the server behaves again.
//!
//! These tests use `FakeServer`, a scripted fake, because no installable server produces these
//! replies (truncated or garbled frames, oversized lengths, RESP3 frames, wrong reply types).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::{DecodeError, ServerErrorKind};
use redlock_mux::{Client, Error, NodeErrorKind};

/// How a misbehaving server answers lock commands, and what the client must make of it.
struct Case {
    name: &'static str,
    behaviour: Behaviour,
    expect: fn(&NodeErrorKind) -> bool,
}

#[derive(Clone)]
enum Behaviour {
    /// Lock commands get this; connection setup is answered properly.
    Reply(FakeReply),
    /// Nothing is answered until the mode changes (a stalled server).
    Stall,
    /// The connection is closed at its first command.
    CloseOnConnect,
}

fn bytes(b: &[u8]) -> Behaviour {
    Behaviour::Reply(FakeReply::Bytes(b.to_vec()))
}

fn cases() -> Vec<Case> {
    use NodeErrorKind as K;
    vec![
        Case {
            name: "truncated simple string, then close",
            behaviour: Behaviour::Reply(FakeReply::BytesThenClose(b"+O".to_vec())),
            expect: |k| matches!(k, K::Io(_)),
        },
        Case {
            name: "truncated bulk string, then close",
            behaviour: Behaviour::Reply(FakeReply::BytesThenClose(b"$10\r\nabc".to_vec())),
            expect: |k| matches!(k, K::Io(_)),
        },
        Case {
            name: "oversized bulk length",
            behaviour: bytes(b"$999999999999\r\n"),
            expect: |k| {
                matches!(
                    k,
                    K::Protocol(DecodeError::BulkTooLong {
                        len: 999_999_999_999,
                        ..
                    })
                )
            },
        },
        Case {
            name: "integer to SET",
            behaviour: bytes(b":5\r\n"),
            expect: |k| *k == K::UnexpectedReply,
        },
        Case {
            name: "array to SET",
            behaviour: bytes(b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
            expect: |k| *k == K::UnexpectedReply,
        },
        Case {
            name: "unknown status",
            behaviour: bytes(b"+WEIRD\r\n"),
            expect: |k| *k == K::UnexpectedReply,
        },
        Case {
            name: "nonsense bytes",
            behaviour: bytes(b"hello world\r\n"),
            expect: |k| matches!(k, K::Protocol(DecodeError::UnknownType(b'h'))),
        },
        Case {
            name: "bare LF",
            behaviour: bytes(b"+OK\n"),
            expect: |k| matches!(k, K::Protocol(DecodeError::MissingCrlf)),
        },
        Case {
            name: "RESP3 map",
            behaviour: bytes(b"%1\r\n+a\r\n+b\r\n"),
            expect: |k| matches!(k, K::Protocol(DecodeError::Resp3(b'%'))),
        },
        Case {
            name: "ERR",
            behaviour: Behaviour::Reply(FakeReply::error("ERR boom")),
            expect: |k| matches!(k, K::Server { kind: ServerErrorKind::Err, message } if message == "ERR boom"),
        },
        Case {
            name: "LOADING",
            behaviour: Behaviour::Reply(FakeReply::error(
                "LOADING Redis is loading the dataset in memory",
            )),
            expect: |k| {
                matches!(
                    k,
                    K::Server {
                        kind: ServerErrorKind::Loading,
                        ..
                    }
                )
            },
        },
        Case {
            name: "READONLY",
            behaviour: Behaviour::Reply(FakeReply::error(
                "READONLY You can't write against a read only replica.",
            )),
            expect: |k| {
                matches!(
                    k,
                    K::Server {
                        kind: ServerErrorKind::ReadOnly,
                        ..
                    }
                )
            },
        },
        Case {
            name: "silent",
            behaviour: Behaviour::Stall,
            expect: |k| *k == K::Timeout,
        },
        Case {
            name: "closes on connect",
            behaviour: Behaviour::CloseOnConnect,
            expect: |k| matches!(k, K::Io(_)),
        },
    ]
}

/// Mode 0: a well-behaved server; mode `i + 1`: `cases()[i]`.
const GOOD: usize = 0;

/// A fake whose behaviour follows `mode`.
fn hostile_fake(mode: Arc<AtomicUsize>) -> FakeServer {
    let behaviours: Vec<Behaviour> = cases().into_iter().map(|c| c.behaviour).collect();
    FakeServer::start(move |args| {
        let stall_until = Instant::now() + Duration::from_secs(5);
        loop {
            let m = mode.load(Ordering::SeqCst);
            let behaviour = m.checked_sub(1).map(|i| &behaviours[i]);
            let setup = args[0].eq_ignore_ascii_case(b"SCRIPT");
            return match behaviour {
                Some(Behaviour::Stall) if Instant::now() < stall_until => {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Some(Behaviour::CloseOnConnect) => FakeReply::Close,
                Some(Behaviour::Reply(reply)) if !setup => reply.clone(),
                _ if setup => FakeReply::bulk(Some(&[b'0'; 40])),
                _ if args[0].eq_ignore_ascii_case(b"SET") => FakeReply::simple("OK"),
                _ => FakeReply::integer(1),
            };
        }
    })
    .expect("fake server")
}

fn client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        // Small, with room for a busy machine; the silent case waits this long.
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid client")
}

/// Longer than the reconnect backoff after one failure (10 ms).
const BACKOFF: Duration = Duration::from_millis(100);

#[test]
fn one_hostile_node_fails_typed_and_recovers() {
    let mode = Arc::new(AtomicUsize::new(GOOD));
    let fake = hostile_fake(mode.clone());
    let addr = fake.addr().to_string();
    let client = client(&[fake.url()]);
    client
        .try_lock("warm", Duration::from_secs(5))
        .expect("well-behaved fake")
        .release()
        .expect("release");
    for (i, case) in cases().iter().enumerate() {
        mode.store(i + 1, Ordering::SeqCst);
        let started = Instant::now();
        let e = client
            .try_lock(format!("hostile:{i}"), Duration::from_secs(5))
            .expect_err(case.name);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{}: took {:?}",
            case.name,
            started.elapsed()
        );
        match &e {
            Error::QuorumUnreachable {
                quorum: 1,
                nodes: 1,
                failures,
            } => match failures.as_slice() {
                [f] => {
                    assert_eq!(
                        (f.node, f.addr.as_str()),
                        (0, addr.as_str()),
                        "{}",
                        case.name
                    );
                    assert!((case.expect)(&f.kind), "{}: {:?}", case.name, f.kind);
                }
                other => panic!("{}: {other:?}", case.name),
            },
            other => panic!("{}: expected QuorumUnreachable, got {other:?}", case.name),
        }
        assert!(e.to_string().contains(&addr), "{}: {e}", case.name);

        mode.store(GOOD, Ordering::SeqCst);
        thread::sleep(BACKOFF);
        let key = format!("recovered:{i}");
        let lock = client
            .try_lock(&key, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{}: no recovery: {e}", case.name));
        lock.release()
            .unwrap_or_else(|e| panic!("{}: release: {e}", case.name));
        let saw = fake
            .commands()
            .iter()
            .any(|c| c[0].eq_ignore_ascii_case(b"SET") && c[1] == key.as_bytes());
        assert!(saw, "{}: the fake never got the SET", case.name);
    }
}

#[test]
fn quorum_holds_with_one_hostile_node_of_three() {
    let mode = Arc::new(AtomicUsize::new(GOOD));
    let fake = hostile_fake(mode.clone());
    let cluster = RedisCluster::start(2).expect("start redis-server");
    let real = cluster.addrs();
    // The fake in the middle: node 1.
    let urls = vec![
        cluster.urls()[0].clone(),
        fake.url(),
        cluster.urls()[1].clone(),
    ];
    let client = client(&urls);
    for (i, case) in cases().iter().enumerate() {
        mode.store(i + 1, Ordering::SeqCst);
        let key = format!("hostile:{i}");
        let lock = client
            .try_lock(&key, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for &addr in &real {
            assert_eq!(get(addr, key.as_bytes()).as_deref(), Some(lock.token()));
        }
        lock.release()
            .unwrap_or_else(|e| panic!("{}: release: {e}", case.name));
        for &addr in &real {
            assert!(
                eventually(Duration::from_secs(2), || get(addr, key.as_bytes())
                    .is_none()),
                "{}: key left on {addr}",
                case.name
            );
        }

        // The fake is back. Outside the quorum, it may get its commands only when the client
        // next uses the connection (a reconnect finishing after the round was decided), so
        // look for it over a few bounded attempts.
        mode.store(GOOD, Ordering::SeqCst);
        thread::sleep(BACKOFF);
        let back = (0..20).any(|j| {
            let key = format!("recovered:{i}:{j}");
            let lock = client
                .try_lock(&key, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            lock.release().unwrap();
            let saw = fake
                .commands()
                .iter()
                .any(|c| c[0].eq_ignore_ascii_case(b"SET") && c[1] == key.as_bytes());
            if !saw {
                thread::sleep(Duration::from_millis(20));
            }
            saw
        });
        assert!(back, "{}: the fake never got a SET again", case.name);
    }
}
