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
    // The smallest safe quorum: ⌊kN/(k+1)⌋ + 1.
    assert_eq!(c.semaphore("s", 1).unwrap().quorum(), 3);
    assert_eq!(c.semaphore("s", 2).unwrap().quorum(), 4);
    assert_eq!(c.semaphore("s", 3).unwrap().quorum(), 4);
    assert_eq!(c.semaphore("s", 4).unwrap().quorum(), 5);
    let two = c.semaphore("s", 2).unwrap();
    assert_eq!(two.tolerated_failures(), 1);
    assert_eq!(
        (0..3).map(|d| two.usable_permits(d)).collect::<Vec<_>>(),
        [2, 2, 0]
    );
    // The naive majority admits 3 holders of 2 permits: refused, as a bad argument.
    let e = c.semaphore("s", 2).unwrap().with_quorum(3).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument(InvalidArgument::UnsafeQuorum {
                permits: 2,
                nodes: 5,
                quorum: 3,
                min: 4
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
    assert!(e.to_string().contains("3 permits, not 2"), "{e}");
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

fn contend(nodes: usize, permits: u32) {
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
    println!("N = {nodes}, k = {permits}: {report}");
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
        contend(nodes, permits);
    }
}
