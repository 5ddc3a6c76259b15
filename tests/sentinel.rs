//! Masters managed by Redis Sentinel as quorum members, and `?wait=N` on members that are not
//! clusters, against real `redis-server` processes (masters, replicas and sentinels started by
//! the tests, stopped by PID).

mod common;

use std::time::Duration;

use common::sentinel::SentinelMember;
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

/// A client whose node timeout leaves a replica time to acknowledge under load.
fn patient_client(urls: &[String]) -> Client {
    one_try_client(urls, ms(2000))
}

/// A master and a replica of it, the replica's link up.
fn master_with_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]).expect("master");
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica");
    assert_settles!(
        matches!(
            cmd(master.addr(), &[b"INFO", b"replication"]),
            Value::Bulk(Some(text)) if String::from_utf8_lossy(&text).contains("state=online")
        ),
        "the replica of {} is linked",
        master.addr()
    );
    // "online" is not yet streaming: the master sends its replica nothing until the
    // replica's first acknowledgment, which comes with its once-a-second cron. A `WAIT`
    // before it blocks up to a second, and every command pipelined behind it on that
    // connection waits with it (the client keeps writing to the node until its oldest reply
    // is a node timeout old). A write acknowledged once opens the stream.
    assert_eq!(
        cmds(
            master.addr(),
            &[
                &[b"SET", b"linked", b"1"],
                &[b"WAIT", b"1", b"10000"],
                &[b"DEL", b"linked"]
            ]
        ),
        vec![
            Value::Simple("OK".into()),
            Value::Integer(1),
            Value::Integer(1)
        ],
        "the replica of {} acknowledges",
        master.addr()
    );
    (master, replica)
}

/// With `?wait=1` on plain members, a grant counts only once `WAIT 1` says a replica has it:
/// while the lock is held, the replicas of a quorum have the key. A master without a replica
/// fails for the grant (`NOREPLICAS`), never a vote.
#[test]
fn a_standalone_grant_counts_only_once_a_replica_has_it() {
    let pairs: Vec<(RedisServer, RedisServer)> = (0..3).map(|_| master_with_replica()).collect();
    let urls: Vec<String> = pairs
        .iter()
        .map(|(m, _)| format!("{}?wait=1", m.url()))
        .collect();
    // `WAIT` is given the node timeout: a replica that is slow to acknowledge on a loaded
    // machine must not fail a grant this test expects.
    let waiting = patient_client(&urls);
    // What the wait costs: lock and release cycles with and without it, in turn.
    let plain_urls: Vec<String> = pairs.iter().map(|(m, _)| m.url()).collect();
    let plain = client(&plain_urls);
    let cycles = |c: &Client| {
        let started = std::time::Instant::now();
        for i in 0..100 {
            c.try_lock(format!("cost:{i}"), TTL)
                .expect("lock")
                .release()
                .expect("release");
        }
        started.elapsed() / 100
    };
    cycles(&plain);
    cycles(&waiting);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        without.push(cycles(&plain));
        with.push(cycles(&waiting));
    }
    without.sort();
    with.sort();
    println!(
        "lock and release, median of 3 runs of 100: {:?} without WAIT, {:?} with WAIT 1",
        without[1], with[1]
    );
    for i in 0..5 {
        let key = format!("wait:{i}");
        let lock = waiting.try_lock(&key, TTL).expect("lock");
        let holding = pairs
            .iter()
            .filter(|(_, r)| get(r.addr(), key.as_bytes()).is_some())
            .count();
        assert!(
            holding >= 2,
            "{holding} replicas of 3 have {key} while it is held"
        );
        lock.release().expect("release");
    }
    for (m, r) in &pairs {
        assert_settles_eq!(dbsize(m.addr()), 0, "a key was left on {}", m.addr());
        assert_settles_eq!(dbsize(r.addr()), 0, "a key was left on {}", r.addr());
    }
    let lonely: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("server"))
        .collect();
    let urls: Vec<String> = lonely
        .iter()
        .map(|s| format!("{}?wait=1", s.url()))
        .collect();
    let waiting = patient_client(&urls);
    match waiting.try_lock("wait:alone", TTL) {
        Err(Error::QuorumUnreachable { failures, .. }) => {
            assert!(failures.len() >= 2, "{failures:?}");
            for f in &failures {
                assert!(
                    matches!(&f.kind, NodeErrorKind::Server { message, .. }
                        if message.starts_with("NOREPLICAS")),
                    "{f:?}"
                );
            }
        }
        other => panic!("a master without a replica cannot grant with WAIT: {other:?}"),
    }
    for s in &lonely {
        assert_settles_eq!(dbsize(s.addr()), 0, "a key was left on {}", s.addr());
    }
}

/// A member named by its sentinels: locks are granted and released through the master they
/// name (nothing goes to the replica, nothing is left behind), with one of the three sentinels
/// down; and wrong sentinel credentials, or a service no sentinel knows, are `Error::Config`
/// at build, never contention.
#[test]
fn a_member_is_the_master_its_sentinels_name() {
    let members: Vec<SentinelMember> = (0..3)
        .map(|_| SentinelMember::start(Some("sentinel-pw")).expect("sentinel member"))
        .collect();
    let urls: Vec<String> = members
        .iter()
        .map(|m| m.url("?sentinel_password=sentinel-pw"))
        .collect();
    let c = client(&urls);
    for i in 0..20 {
        let key = format!("sentinel:{i}");
        let lock = c.try_lock(&key, TTL).expect("lock");
        for m in &members {
            assert!(
                get(m.servers[0].addr(), key.as_bytes()).is_some(),
                "{key} on the master"
            );
        }
        lock.release().expect("release");
    }
    for m in &members {
        for s in &m.servers {
            assert_settles_eq!(dbsize(s.addr()), 0, "a key was left on {}", s.addr());
        }
    }
    // What a Sentinel member costs next to its master named directly: nothing per lock.
    let direct: Vec<String> = members.iter().map(|m| m.servers[0].url()).collect();
    let plain = client(&direct);
    let cycles = |c: &Client| {
        let started = std::time::Instant::now();
        for i in 0..100 {
            c.try_lock(format!("cost:{i}"), TTL)
                .expect("lock")
                .release()
                .expect("release");
        }
        started.elapsed() / 100
    };
    cycles(&plain);
    cycles(&c);
    let (mut named, mut through) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        named.push(cycles(&plain));
        through.push(cycles(&c));
    }
    named.sort();
    through.sort();
    println!(
        "lock and release, median of 3 runs of 100: {:?} on the masters named directly, {:?} \
         through their sentinels",
        named[1], through[1]
    );
    drop(plain);
    drop(c);
    // One server is one vote, whether named by sentinels or directly.
    let twice = vec![
        urls[0].clone(),
        members[0].servers[0].url(),
        urls[1].clone(),
    ];
    match Client::builder().nodes(&twice).build() {
        Err(Error::Config { failures }) => assert!(
            failures
                .iter()
                .any(|f| format!("{:?}", f.kind).contains("SameServer")),
            "{failures:?}"
        ),
        other => panic!("a master named by sentinels and directly: {other:?}"),
    }
    // The first sentinel down: the next one answers.
    let mut members = members;
    for m in &mut members {
        m.sentinels[0].kill();
    }
    let c = client(&urls);
    c.try_lock("sentinel:one-down", TTL)
        .expect("lock with a sentinel down")
        .release()
        .expect("release");
    drop(c);
    // Wrong credentials for the sentinels, or no password at all: a configuration error.
    for query in ["?sentinel_password=wrong", ""] {
        let urls: Vec<String> = members.iter().map(|m| m.url(query)).collect();
        match Client::builder().nodes(&urls).build() {
            Err(Error::Config { failures }) => assert_eq!(failures.len(), 3, "{failures:?}"),
            other => panic!("wrong sentinel credentials ({query:?}): {other:?}"),
        }
    }
    let unknown: Vec<String> = members
        .iter()
        .map(|m| {
            m.url("?sentinel_password=sentinel-pw")
                .replace(&m.service, "no-such-service")
        })
        .collect();
    match Client::builder().nodes(&unknown).build() {
        Err(Error::Config { failures }) => {
            assert_eq!(failures.len(), 3, "{failures:?}");
            assert!(
                format!("{failures:?}").contains("no-such-service"),
                "{failures:?}"
            );
        }
        other => panic!("a service no sentinel knows: {other:?}"),
    }
}

/// How long after the masters of a majority of members are killed the lock may go ungranted:
/// the sentinels' down-after (1 s), their election and the promotion, then a question to the
/// sentinels and a connect to the new master. An election that fails (sentinels slow to vote
/// on busy cores) is tried again only after twice the failover timeout (2 × 3 s), so the bound
/// leaves room for a few: 2.3 s is typical on a quiet machine.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

/// The masters of two of three Sentinel members are killed (`SIGKILL`) while 8 threads lock and
/// release one key: no two holders at any time (the history checker), the lock is granted
/// again within [`FAILOVER_BOUND`] once the sentinels promote replicas, and nothing is left
/// once every release returned. Each member has two replicas and `?wait=1`: a grant counts
/// only once a replica has it, and the sentinels promote the replica with the most data, so a
/// failover keeps every grant (without `wait`, a failover that loses the last writes may let a
/// second holder in: see the README).
#[test]
fn a_failover_of_a_majority_keeps_one_holder_and_is_followed() {
    use redlock_mux_kit::history::{History, Kind, Op};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::Instant;

    const KEY: &str = "failover";
    const SHORT_TTL: Duration = Duration::from_secs(3);
    let starting: Vec<_> = (0..3)
        .map(|_| thread::spawn(|| SentinelMember::start_with(2, None).expect("sentinel member")))
        .collect();
    let mut members: Vec<SentinelMember> = starting
        .into_iter()
        .map(|t| t.join().expect("start"))
        .collect();
    let urls: Vec<String> = members.iter().map(|m| m.url("?wait=1")).collect();
    let client = Client::builder()
        .nodes(&urls)
        .node_timeout(ms(300))
        .retry_delay(ms(20))
        .wait_timeout(ms(500))
        .build()
        .expect("client");
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // When each granted acquisition was called, and when it was granted.
    let grants = Arc::new(Mutex::new(Vec::<(Duration, Duration)>::new()));
    let hard_stop = origin + Duration::from_secs(40);
    let workers: Vec<_> = (0..8u64)
        .map(|id| {
            let (client, stop, grants) = (client.clone(), stop.clone(), grants.clone());
            thread::spawn(move || {
                let mut h = History::default();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) && Instant::now() < hard_stop && n < 20_000 {
                    n += 1;
                    let invoke = origin.elapsed();
                    let Ok(lock) = client.lock(KEY, SHORT_TTL) else {
                        continue;
                    };
                    let ok = origin.elapsed();
                    grants.lock().unwrap().push((invoke, ok));
                    let op = h.push(Op {
                        client: id,
                        kind: Kind::Mutex,
                        key: KEY.as_bytes().to_vec(),
                        invoke,
                        ok: Some(ok),
                        fence: None,
                        valid_until: Some(ok + lock.validity()),
                        release: None,
                    });
                    thread::sleep(ms(1));
                    h.ops[op].release = Some(origin.elapsed());
                    let _ = lock.release();
                }
                h
            })
        })
        .collect();
    let flowing = eventually(Duration::from_secs(10), || {
        !grants.lock().unwrap().is_empty()
    });
    assert!(flowing, "no grant before the failover");
    thread::sleep(ms(500));
    let old: Vec<_> = members[..2].iter().map(|m| m.servers[0].addr()).collect();
    // Both stopped at once (SIGSTOP), then killed (SIGKILL): killing one after the other
    // would leave the second alive while the first is reaped.
    for m in &members[..2] {
        m.servers[0].pause().expect("stop the master");
    }
    let killed = origin.elapsed();
    for m in &mut members[..2] {
        m.servers[0].kill().expect("kill the master");
    }
    // The first grant of an acquisition called after the masters died.
    let granted_again = || {
        grants
            .lock()
            .unwrap()
            .iter()
            .filter(|&&(invoke, _)| invoke > killed)
            .map(|&(_, ok)| ok)
            .min()
    };
    let regained = eventually(FAILOVER_BOUND, || granted_again().is_some());
    let after = granted_again();
    let moved = |m: &SentinelMember, was| m.named_master().is_some_and(|a| a != was);
    let promoted = eventually(FAILOVER_BOUND, || {
        members[..2].iter().zip(&old).all(|(m, &was)| moved(m, was))
    });
    let named: Vec<_> = members.iter().map(|m| m.named_master()).collect();
    thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let mut h = History::default();
    for w in workers {
        h.merge(w.join().expect("worker"));
    }
    let report = h.check();
    println!(
        "masters of 2 of 3 members killed at {killed:?}: next grant {:?} later; {report}; \
         masters named now {named:?} (were {old:?})",
        after.map(|t| t - killed)
    );
    assert_eq!(report.lock_violations(), 0, "{report}");
    assert!(
        regained,
        "no grant within {FAILOVER_BOUND:?} of the masters' death: {report}"
    );
    assert!(promoted, "the sentinels promoted no replica: {named:?}");
    // Every release returned. A release that a dead master acknowledged but had not passed
    // on to its replica when it died lives out its TTL on the promoted one: wait that long.
    for m in &members {
        for s in m.servers.iter().filter(|s| !old.contains(&s.addr())) {
            let clean = eventually(SHORT_TTL + Duration::from_secs(2), || {
                matches!(
                    try_cmd(s.addr(), &[b"DBSIZE"], CLIENT_TIMEOUT),
                    Ok(Value::Integer(0))
                )
            });
            assert!(clean, "a key was left on {}", s.addr());
        }
    }
}

/// A failover the sentinels are asked for (`SENTINEL FAILOVER`) leaves the old master up, and
/// taking writes until the sentinels demote it a few seconds later: the client hears
/// `+switch-master` (or, were that lost, a `READONLY` once it is demoted) and the member's
/// grants go to the master the sentinels name. (Before its `+switch-master` subscription, the
/// client kept writing to the old master for the whole 10 s this test waits.) Nothing is left
/// once the TTL of what was granted on the old master before the switch has passed.
#[test]
fn a_demoted_master_is_left_for_the_one_the_sentinels_name() {
    let members: Vec<SentinelMember> = (0..3)
        .map(|_| SentinelMember::start(None).expect("sentinel member"))
        .collect();
    let urls: Vec<String> = members.iter().map(|m| m.url("")).collect();
    let c = client(&urls);
    c.try_lock("demoted:warm", TTL)
        .expect("lock")
        .release()
        .expect("release");
    let m = &members[0];
    let was = m.named_master().expect("a master");
    assert_eq!(
        m.sentinels[0].cmd(&[b"SENTINEL", b"FAILOVER", m.service.as_bytes()]),
        Value::Simple(b"OK".to_vec())
    );
    let moved = eventually(FAILOVER_BOUND, || {
        m.named_master().is_some_and(|a| a != was)
    });
    assert!(moved, "the sentinels did not fail over");
    let now = m.named_master().expect("the new master");
    // Grants keep coming from the other members meanwhile; member 0's come from the new
    // master once the client found it.
    // A lock taken on the old master just before the switch is released on the new one: the
    // old master keeps its key until its resync as a replica drops it, or its TTL (short here).
    const SHORT_TTL: Duration = Duration::from_secs(3);
    let mut i = 0;
    let found = eventually(Duration::from_secs(10), || {
        i += 1;
        let key = format!("demoted:{i}");
        let Ok(lock) = c.try_lock(&key, SHORT_TTL) else {
            return false;
        };
        // The sentinels cut the clients of the servers they reconfigure: a probe cut
        // meanwhile is asked again.
        let there = matches!(
            try_cmd(now, &[b"GET", key.as_bytes()], CLIENT_TIMEOUT),
            Ok(Value::Bulk(Some(_)))
        );
        lock.release().expect("release");
        there
    });
    assert!(found, "no grant reached the new master {now} (was {was})");
    for s in &m.servers {
        let clean = eventually(SHORT_TTL + Duration::from_secs(2), || {
            matches!(
                try_cmd(s.addr(), &[b"DBSIZE"], CLIENT_TIMEOUT),
                Ok(Value::Integer(0))
            )
        });
        let keys: Vec<String> = keys(s.addr())
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert!(
            clean,
            "keys left on {} (the master was {was}, is {now}): {keys:?}",
            s.addr()
        );
    }
    for m in &members[1..] {
        assert_settles_eq!(dbsize(m.servers[0].addr()), 0, "a key was left");
    }
}

/// The error a Sentinel member's failure gives says what failed, naming the service and the
/// sentinels asked: no sentinel could be reached; the sentinels do not know the service; the
/// master they named could not be reached (it is named too).
#[test]
fn a_member_that_fails_says_what_failed() {
    let mut member = SentinelMember::start(None).expect("sentinel member");
    let service = member.service.clone();
    let sentinels: Vec<String> = member
        .sentinels
        .iter()
        .map(|s| s.addr().to_string())
        .collect();
    let names_all = |text: &str, what: &str| {
        assert!(text.contains(&service), "{what}: no service in {text}");
        for s in &sentinels {
            assert!(
                text.contains(s.as_str()),
                "{what}: sentinel {s} not in {text}"
            );
        }
    };
    // No sentinel can be reached: the same sentinels' ports, nothing listening.
    let gone: Vec<String> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .expect("bind")
                .local_addr()
                .unwrap()
                .to_string()
        })
        .collect();
    let url = format!("redis+sentinel://{}/{}", gone.join(","), member.service);
    let c = client(&[url]);
    let text = c
        .try_lock("sentinel:why", TTL)
        .expect_err("no sentinel")
        .to_string();
    println!("sentinels down: {text}");
    assert!(text.contains("could be reached"), "sentinels down: {text}");
    assert!(
        text.contains(&member.service),
        "sentinels down: no service in {text}"
    );
    for s in &gone {
        assert!(
            text.contains(s.as_str()),
            "sentinels down: {s} not in {text}"
        );
    }
    drop(c);
    // No sentinel knows the service.
    let unknown = member.url("").replace(&member.service, "no-such-service");
    let text = match Client::builder().nodes([unknown]).build() {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a service no sentinel knows"),
    };
    println!("unknown service: {text}");
    assert!(text.contains("no-such-service"), "unknown service: {text}");
    assert!(text.contains("does not know"), "unknown service: {text}");
    for s in &sentinels {
        assert!(
            text.contains(s.as_str()),
            "unknown service: sentinel {s} not in {text}"
        );
    }
    // The master the sentinels name is down (killed; the sentinels still name it).
    let c = client(&[member.url("")]);
    c.try_lock("sentinel:why", TTL)
        .expect("lock")
        .release()
        .expect("release");
    let master = member.servers[0].addr().to_string();
    member.servers[0].kill().expect("kill the master");
    let text = c
        .try_lock("sentinel:why", TTL)
        .expect_err("master down")
        .to_string();
    println!("master down: {text}");
    names_all(&text, "master down");
    assert!(
        text.contains(&master),
        "master down: master {master} not in {text}"
    );
    assert!(text.contains("master"), "master down: {text}");
}
