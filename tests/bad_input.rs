//! Invalid arguments: each is refused with its own `InvalidArgument` variant, with a message
//! that says what is wrong, and nothing reaches any server.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, InvalidArgument, MAX_KEY_LEN, MAX_NODES, MAX_TTL};

fn invalid(r: Result<impl std::fmt::Debug, Error>) -> InvalidArgument {
    match r {
        Err(Error::InvalidArgument(a)) => a,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Connections the server has accepted so far, counting the one asking.
fn connections(addr: SocketAddr) -> u64 {
    let Value::Bulk(Some(info)) = cmd(addr, &[b"INFO", b"stats"]) else {
        panic!("INFO stats");
    };
    String::from_utf8(info)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .expect("total_connections_received")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn bad_keys_and_ttls_send_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let addr = server.addr();
    let client = Client::new([server.url()]).unwrap();
    let before = connections(addr);
    let ok_ttl = Duration::from_secs(10);
    let long_key = vec![b'k'; MAX_KEY_LEN + 1];

    for lock in [true, false] {
        let call = |key: &[u8], ttl: Duration| {
            if lock {
                client.lock(key, ttl)
            } else {
                client.try_lock(key, ttl)
            }
        };
        assert_eq!(invalid(call(b"", ok_ttl)), InvalidArgument::EmptyKey);
        assert_eq!(
            invalid(call(&long_key, ok_ttl)),
            InvalidArgument::KeyTooLong {
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            }
        );
        assert_eq!(
            invalid(call(b"k", Duration::ZERO)),
            InvalidArgument::ZeroTtl
        );
        for ttl in [MAX_TTL + Duration::from_millis(1), Duration::MAX] {
            assert_eq!(
                invalid(call(b"k", ttl)),
                InvalidArgument::TtlOutOfRange { ttl }
            );
        }
        // Not longer than the drift allowance (ttl * 0.01 + 2 ms), sub-millisecond included.
        for ttl in [
            Duration::from_micros(1),
            Duration::from_micros(500),
            Duration::from_millis(1),
            Duration::from_millis(2),
            Duration::from_micros(2900),
        ] {
            match invalid(call(b"k", ttl)) {
                InvalidArgument::TtlBelowDrift { ttl: t, drift } => {
                    assert_eq!(t, ttl);
                    assert!(drift >= Duration::from_millis(2), "{drift:?}");
                }
                other => panic!("{ttl:?}: expected TtlBelowDrift, got {other:?}"),
            }
        }
    }
    // The key is checked before the TTL.
    assert_eq!(
        invalid(client.try_lock("", Duration::ZERO)),
        InvalidArgument::EmptyKey
    );

    // One connection more: the one asking. The client never connected, nothing was stored.
    assert_eq!(connections(addr), before + 1);
    assert_eq!(dbsize(addr), 0);

    // A held lock refuses bad extensions without touching the key.
    let mut lock = client.try_lock("held", Duration::from_secs(10)).unwrap();
    let left = pttl(addr, b"held");
    assert_eq!(
        invalid(lock.extend(Duration::ZERO)),
        InvalidArgument::ZeroTtl
    );
    assert!(matches!(
        invalid(lock.extend(Duration::from_millis(1))),
        InvalidArgument::TtlBelowDrift { .. }
    ));
    assert!(matches!(
        invalid(lock.extend(Duration::MAX)),
        InvalidArgument::TtlOutOfRange { .. }
    ));
    assert!(pttl(addr, b"held") <= left);
    assert!(lock.validity() > Duration::from_secs(5));
    lock.release().unwrap();
}

#[test]
fn bad_node_lists_are_refused_before_connecting() {
    // A fake server logs every command it receives: it must see none.
    let fake = FakeServer::start(|_| FakeReply::simple("OK")).expect("fake server");
    let addr = fake.addr();

    assert_eq!(
        invalid(Client::new(Vec::<String>::new())),
        InvalidArgument::NoNodes
    );
    for (a, b) in [
        (format!("{addr}"), format!("{addr}")),
        (format!("{addr}"), format!("redis://{addr}")),
        (format!("redis://{addr}"), format!("redis://{addr}/0")),
        (
            format!("redis://:pw@{addr}/3"),
            format!("redis://user:other@{addr}/3"),
        ),
        // Two databases of one server share its failures: they must not make a quorum.
        (format!("redis://{addr}/1"), format!("redis://{addr}/2")),
    ] {
        assert_eq!(
            invalid(Client::new([a.as_str(), b.as_str()])),
            InvalidArgument::DuplicateNode { url: hidden(&b) },
            "{a} then {b}"
        );
    }
    let many: Vec<String> = (1..=MAX_NODES as u16 + 1)
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    assert_eq!(
        invalid(Client::new(&many)),
        InvalidArgument::TooManyNodes {
            count: MAX_NODES + 1,
            max: MAX_NODES
        }
    );
    // Exactly MAX_NODES is allowed.
    Client::new(&many[..MAX_NODES]).expect("MAX_NODES nodes");

    let port = addr.port();
    let malformed = [
        "".to_string(),
        "   ".to_string(),
        "127.0.0.1".to_string(),
        "127.0.0.1:".to_string(),
        "127.0.0.1:0".to_string(),
        "127.0.0.1:65536".to_string(),
        "127.0.0.1:-1".to_string(),
        "127.0.0.1:port".to_string(),
        format!("http://127.0.0.1:{port}"),
        format!("rediss://127.0.0.1:{port}"),
        format!("redis:/127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}/db"),
        format!("redis://127.0.0.1:{port}/-1"),
        format!("redis://127.0.0.1:{port}/99999999999"),
        format!("redis://:@127.0.0.1:{port}"),
        format!("redis://u:%zz@127.0.0.1:{port}"),
        format!("redis://u:%4@127.0.0.1:{port}"),
        format!("u:pw@127.0.0.1:{port}"),
        format!("127.0.0.1:{port}/2"),
        format!("redis://[::1:{port}"),
        format!("redis://[]:{port}"),
        format!(":{port}"),
        format!("redis://:{port}"),
        format!("no such host.invalid:{port}"),
        format!("host.invalid:{port}"),
        format!("1:2:3:{port}"),
    ];
    for url in &malformed {
        if url.starts_with("rediss://") && cfg!(feature = "tls") {
            // A TLS URL, read as such with the `tls` feature (tests/tls.rs).
            continue;
        }
        let a = invalid(Client::new([url.as_str()]));
        match &a {
            InvalidArgument::BadUrl { url: u, reason } => {
                assert_eq!(*u, hidden(url));
                assert!(!reason.is_empty());
                let message = a.to_string();
                assert!(
                    message.contains(&hidden(url)) && message.contains(reason),
                    "{message}"
                );
            }
            other => panic!("{url:?}: expected BadUrl, got {other:?}"),
        }
        // A bad URL anywhere in the list spoils the whole list.
        let a = invalid(Client::new([fake.url(), url.clone()]));
        assert!(
            matches!(a, InvalidArgument::BadUrl { .. }),
            "{url:?}: {a:?}"
        );
    }

    let bad_options: Vec<(&str, redlock_mux::ClientBuilder)> = vec![
        ("drift_factor", Client::builder().drift_factor(f64::NAN)),
        ("drift_factor", Client::builder().drift_factor(-0.01)),
        ("drift_factor", Client::builder().drift_factor(0.5)),
        ("drift_factor", Client::builder().drift_factor(1.0)),
        (
            "drift_factor",
            Client::builder().drift_factor(f64::INFINITY),
        ),
        (
            "node_timeout",
            Client::builder().node_timeout(Duration::ZERO),
        ),
        (
            "connect_timeout",
            Client::builder().connect_timeout(Duration::ZERO),
        ),
        (
            "node_timeout",
            Client::builder().node_timeout(Duration::MAX),
        ),
        (
            "connect_timeout",
            Client::builder().connect_timeout(Duration::MAX),
        ),
        ("retry_delay", Client::builder().retry_delay(Duration::MAX)),
        (
            "wait_timeout",
            Client::builder().wait_timeout(Duration::MAX),
        ),
    ];
    for (option, builder) in bad_options {
        match invalid(builder.nodes([fake.url()]).build()) {
            InvalidArgument::BadOption { name, reason } => {
                assert_eq!(name, option);
                assert!(!reason.is_empty());
            }
            other => panic!("{option}: expected BadOption, got {other:?}"),
        }
    }
    assert!(fake.commands().is_empty(), "{:?}", fake.commands());

    // The edges that are allowed (a valid client connects at once, so these come last).
    Client::builder()
        .drift_factor(0.0)
        .nodes([fake.url()])
        .build()
        .unwrap();
    Client::builder()
        .drift_factor(0.499)
        .nodes([fake.url()])
        .build()
        .unwrap();
}

#[test]
fn messages_say_what_is_wrong() {
    let cases: Vec<(InvalidArgument, &[&str])> = vec![
        (InvalidArgument::EmptyKey, &["key", "empty"]),
        (
            InvalidArgument::KeyTooLong {
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN,
            },
            &["65537", "65536"],
        ),
        (InvalidArgument::ZeroTtl, &["TTL", "zero"]),
        (
            InvalidArgument::TtlOutOfRange { ttl: Duration::MAX },
            &["TTL"],
        ),
        (
            InvalidArgument::TtlBelowDrift {
                ttl: Duration::from_millis(2),
                drift: Duration::from_micros(2020),
            },
            &["2ms", "2.02ms", "drift"],
        ),
        (InvalidArgument::NoNodes, &["no nodes"]),
        (
            InvalidArgument::TooManyNodes { count: 65, max: 64 },
            &["65", "64"],
        ),
        (
            InvalidArgument::DuplicateNode {
                url: "redis://127.0.0.1:7000".into(),
            },
            &["redis://127.0.0.1:7000", "more than once"],
        ),
        (
            InvalidArgument::BadOption {
                name: "drift_factor",
                reason: "must be at least 0 and less than 0.5",
            },
            &["drift_factor", "less than 0.5"],
        ),
    ];
    for (a, words) in cases {
        let inner = a.to_string();
        let outer = Error::from(a.clone()).to_string();
        assert!(outer.starts_with("invalid argument: "), "{outer}");
        assert!(outer.ends_with(&inner), "{outer}");
        for w in words {
            assert!(inner.contains(w), "{a:?}: {inner:?} lacks {w:?}");
        }
    }
    // What the client produces, not only what the variants print.
    let e = Client::builder()
        .drift_factor(f64::NAN)
        .nodes(["127.0.0.1:7000"])
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("drift_factor"), "{e}");
    let e = Client::new(["127.0.0.1:abc"]).unwrap_err();
    assert!(e.to_string().contains("127.0.0.1:abc"), "{e}");
}

/// `url` as errors show it: with the password (what follows the user and its `:`, or the
/// whole userinfo) hidden.
fn hidden(url: &str) -> String {
    let Some((userinfo, host)) = url.rsplit_once('@') else {
        return url.to_owned();
    };
    let (scheme, userinfo) = match userinfo.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), userinfo),
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}{user}:***@{host}"),
        None => format!("{scheme}***@{host}"),
    }
}
