//! An outside review of the confirmation of lost attempts' cleanups on `?wait` members (a
//! compare-and-delete kept until a later `WAIT` says the replicas have it), against real
//! `redis-server` processes started by the tests (stopped by PID).

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::Value;
use redlock_mux::Error;

const TTL: Duration = Duration::from_secs(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

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
    (master, replica)
}

/// This process's CPU time (user + system), from /proc/self/stat.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// `?wait=1`, the replica paused (SIGSTOP) : a lost attempt's cleanup ran on the master but no
/// `WAIT` can confirm it. The key is gone from the master; the client idles without spinning;
/// `close` says the cleanup is not known to have arrived (the truth: the replica lacks it), and
/// returns within the bound its documentation gives for a node that makes no progress (2 s),
/// well within 10 s.
#[test]
fn a_paused_replica_keeps_a_cleanup_without_spinning_and_close_is_bounded() {
    let (master, replica) = master_with_replica();
    let url = format!("{}?wait=1", master.url());
    let c = one_try_client(&[url], ms(400));
    // Warm: the connection is open and set up.
    c.try_lock("audit:confirm:warm", TTL)
        .expect("warm lock")
        .release()
        .expect("warm release");
    replica.pause().expect("pause the replica");
    let started = Instant::now();
    let got = c.try_lock("audit:confirm:lost", TTL);
    println!(
        "try_lock with the replica paused: {:?} in {:?}",
        got.as_ref().map(|_| ()),
        started.elapsed()
    );
    assert!(got.is_err(), "a grant no replica acknowledged counted");
    assert_settles_eq!(dbsize(master.addr()), 0, "the cleanup ran on the master");
    // Idle for 3 s: the endpoint's own WAITs back off (10 ms -> 1 s), each a tenth of a second.
    let cpu0 = cpu_time();
    std::thread::sleep(Duration::from_secs(3));
    let idle_cpu = cpu_time() - cpu0;
    println!("CPU time of the idle client over 3 s with a kept cleanup: {idle_cpu:?}");
    let started = Instant::now();
    let closed = c.clone().close();
    let took = started.elapsed();
    println!("close with a kept cleanup and the replica paused: {closed:?} in {took:?}");
    replica.resume().expect("resume the replica");
    assert!(idle_cpu < ms(300), "an idle client spun: {idle_cpu:?} of CPU in 3 s");
    assert!(
        matches!(&closed, Err(Error::Undelivered { failures }) if failures.iter().any(|f| f.node == 0)),
        "close said {closed:?} with a cleanup no replica has"
    );
    assert!(
        took < Duration::from_secs(4),
        "close took {took:?}: a node that makes no progress is given up after 2 s"
    );
}
