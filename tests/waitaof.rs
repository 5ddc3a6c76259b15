//! `?waitaof=L,R`: a grant counts only once `WAITAOF` says the master and its replicas fsynced
//! it, against real `redis-server` processes with append-only files (Redis 8.2: `WAITAOF`
//! needs 7.2), started by the test in their own temporary directories and stopped by PID.
//! Apart from tests/sentinel.rs so that its fsyncs do not run beside the timing of the
//! `?wait=N` tests there.

mod common;

use std::time::Duration;

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::{Client, Error, NodeErrorKind};

const TTL: Duration = Duration::from_secs(10);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn client(urls: &[String]) -> Client {
    one_try_client(urls, ms(500))
}

/// A master (and, with `replica`, a replica of it) of `program` persisting with an append-only
/// file fsynced every second, in its own temporary directory.
fn aof_master(program: &std::path::Path, replica: bool) -> (RedisServer, Option<RedisServer>) {
    let aof = ["--appendonly", "yes", "--appendfsync", "everysec"];
    let mut args = vec!["--repl-diskless-sync-delay", "0"];
    args.extend(aof);
    let master = RedisServer::start_program(program, &args).expect("master");
    if !replica {
        return (master, None);
    }
    let port = master.port().to_string();
    let mut args = vec!["--replicaof", "127.0.0.1", &port];
    args.extend(aof);
    let replica = RedisServer::start_program(program, &args).expect("replica");
    assert_settles!(
        matches!(
            cmd(master.addr(), &[b"INFO", b"replication"]),
            Value::Bulk(Some(text)) if String::from_utf8_lossy(&text).contains("state=online")
        ),
        "the replica of {} is linked",
        master.addr()
    );
    (master, Some(replica))
}

/// With `?waitaof=L,R` a grant counts only once `WAITAOF L R` says the master (L = 1) and R
/// replicas fsynced it to their append-only files; a master without the file, or without the
/// replica asked for, fails for the grant, never a vote; malformed values are `BadUrl`.
/// `WAITAOF` needs Redis 7.2: the test runs Redis 8.2 (`.ci/redis8`), and says it skipped
/// without it.
#[test]
fn a_grant_counts_only_once_waitaof_says_it_is_fsynced() {
    for bad in ["2,0", "0,0", "1", "1,17", "a,b", "1,1,1", ""] {
        let url = format!("redis://127.0.0.1:6379?waitaof={bad}");
        match Client::new([url.as_str()]) {
            Err(Error::InvalidArgument(redlock_mux::InvalidArgument::BadUrl {
                reason, ..
            })) => {
                assert!(reason.contains("waitaof"), "{url}: {reason}")
            }
            other => panic!("{url}: expected BadUrl, got {other:?}"),
        }
    }
    let Some(program) = redis8_program() else {
        println!("skipped: WAITAOF needs Redis >= 7.2 and no Redis 8 binary is here (.ci/redis8)");
        return;
    };
    let pairs: Vec<_> = (0..3).map(|_| aof_master(&program, true)).collect();
    let urls: Vec<String> = pairs
        .iter()
        .enumerate()
        // The first asks for a replica's acknowledgement too: `WAIT`, then `WAITAOF`.
        .map(|(i, (m, _))| match i {
            0 => format!("{}?wait=1&waitaof=1,1", m.url()),
            _ => format!("{}?waitaof=1,1", m.url()),
        })
        .collect();
    // `appendfsync everysec` fsyncs once a second: the node timeout, which bounds WAITAOF's,
    // leaves room for one.
    let aof_client = |urls: &[String]| {
        Client::builder()
            .nodes(urls)
            .node_timeout(ms(2500))
            .retry_count(0)
            .build()
            .expect("valid client")
    };
    let c = aof_client(&urls);
    for i in 0..3 {
        let key = format!("waitaof:{i}");
        let mut lock = c.try_lock(&key, TTL).expect("lock");
        let holding = pairs
            .iter()
            .filter(|(_, r)| get(r.as_ref().expect("replica").addr(), key.as_bytes()).is_some())
            .count();
        assert!(
            holding >= 2,
            "{holding} replicas of 3 have {key} while it is held"
        );
        lock.extend(TTL).expect("extend");
        lock.release().expect("release");
    }
    for (m, _) in &pairs {
        assert_settles_eq!(dbsize(m.addr()), 0, "a key was left on {}", m.addr());
    }
    // Masters that cannot say it: two without an append-only file (WAITAOF 1 refused), one
    // without a replica (a short count).
    let plain = RedisServer::start_program(&program, &[]).expect("server");
    let other = RedisServer::start_program(&program, &[]).expect("server");
    let (lonely, _) = aof_master(&program, false);
    let urls = [
        format!("{}?waitaof=1,0", plain.url()),
        format!("{}?waitaof=0,1", lonely.url()),
        format!("{}?waitaof=1,1", other.url()),
    ];
    // None of these needs a fsync to come: the usual node timeout bounds the short count.
    let failing = client(&urls);
    match failing.try_lock("waitaof:refused", TTL) {
        Err(Error::QuorumUnreachable { failures, .. }) => {
            assert!(failures.len() >= 2, "{failures:?}");
            for f in &failures {
                assert!(
                    matches!(&f.kind, NodeErrorKind::Server { message, .. }
                        if message.starts_with("WAITAOF 1 ")
                            || message.starts_with("NOREPLICAS WAITAOF 0 1")),
                    "{f:?}"
                );
            }
            println!("{failures:?}");
        }
        other => panic!("no member could say the grant was fsynced: {other:?}"),
    }
    for s in [&plain, &other, &lonely] {
        assert_settles_eq!(dbsize(s.addr()), 0, "a key was left on {}", s.addr());
    }
}
