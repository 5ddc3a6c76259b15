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

/// A lock granted and released within 10 s (the replica's first acknowledgements may take a
/// while on a loaded machine), trying every 50 ms.
fn warm(c: &redlock_mux::Client, key: &str) {
    let granted = eventually(Duration::from_secs(10), || match c.try_lock(key, TTL) {
        Ok(lock) => lock.release().is_ok(),
        Err(_) => false,
    });
    assert!(granted, "no grant within 10 s");
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
    warm(&c, "audit:confirm:warm");
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
    assert!(
        idle_cpu < ms(300),
        "an idle client spun: {idle_cpu:?} of CPU in 3 s"
    );
    assert!(
        matches!(&closed, Err(Error::Undelivered { failures }) if failures.iter().any(|f| f.node == 0)),
        "close said {closed:?} with a cleanup no replica has"
    );
    assert!(
        took < Duration::from_secs(4),
        "close took {took:?}: a node that makes no progress is given up after 2 s"
    );
}

/// The calls of scripts (`EVAL`, `EVALSHA`, `FCALL`...) `addr` ran so far.
fn script_calls(addr: std::net::SocketAddr) -> u64 {
    let Value::Bulk(Some(text)) = cmd(addr, &[b"INFO", b"commandstats"]) else {
        panic!("INFO commandstats");
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"))
        .filter_map(|l| {
            let calls = l.split("calls=").nth(1)?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// A client with a lost attempt's cleanup kept on a `?wait=1` member (replica paused), the
/// same key granted meanwhile to another client, then every connection of the master killed:
/// the cleanup goes again on the next connection, and, a compare-and-delete of the lost
/// attempt's own token, leaves the new holder's key alone; the new holder releases it.
#[test]
fn a_cleanup_sent_again_leaves_the_next_holder_alone() {
    let (master, replica) = master_with_replica();
    let waits = one_try_client(&[format!("{}?wait=1", master.url())], ms(400));
    let plain = one_try_client(&[master.url()], ms(400));
    warm(&waits, "audit:again:warm");
    replica.pause().expect("pause the replica");
    let key = "audit:again:key";
    assert!(waits.try_lock(key, TTL).is_err(), "a grant with no replica");
    assert_settles_eq!(dbsize(master.addr()), 0, "the cleanup ran on the master");
    let held = plain.try_lock(key, TTL).expect("the next holder");
    let token = get(master.addr(), key.as_bytes()).expect("the next holder's key");
    let before = script_calls(master.addr());
    // Every normal connection goes (the probe's is the next one).
    cmd(master.addr(), &[b"CLIENT", b"KILL", b"TYPE", b"normal"]);
    // The cleanup goes again on the next connection, within the node timeout and a reconnect.
    let again = eventually(Duration::from_secs(5), || {
        script_calls(master.addr()) > before
    });
    let after = script_calls(master.addr());
    println!("scripts run on the master after the kill: {before} -> {after}");
    let still = get(master.addr(), key.as_bytes());
    replica.resume().expect("resume the replica");
    assert!(
        again,
        "the kept cleanup was not sent again on the next connection"
    );
    assert_eq!(
        still.as_deref(),
        Some(&token[..]),
        "the cleanup sent again deleted the next holder's key"
    );
    held.release().expect("the next holder releases");
    assert!(waits.close().is_ok(), "close once the replica is back");
    assert_settles_eq!(dbsize(master.addr()), 0, "a key was left");
}

/// A forked child of a client with a kept cleanup (replica paused) does not send it (the
/// parent owes it, on its own connection), and its `close` owes nothing.
#[test]
fn a_forked_child_does_not_send_its_parents_kept_cleanup() {
    let (master, replica) = master_with_replica();
    let c = one_try_client(&[format!("{}?wait=1", master.url())], ms(400));
    warm(&c, "audit:forked:warm");
    replica.pause().expect("pause the replica");
    assert!(
        c.try_lock("audit:forked:key", TTL).is_err(),
        "a grant with no replica"
    );
    assert_settles_eq!(dbsize(master.addr()), 0, "the cleanup ran on the master");
    let before = script_calls(master.addr());
    let c2 = c.clone();
    let pid = common::process::fork_child(move || match c2.close() {
        Ok(()) => 0,
        Err(Error::Undelivered { .. }) => 3,
        Err(_) => 4,
    });
    let code = common::process::wait_child(pid, Duration::from_secs(15));
    let after = script_calls(master.addr());
    replica.resume().expect("resume the replica");
    println!("the child's close: exit {code:?}; scripts on the master {before} -> {after}");
    assert_eq!(code, Some(0), "the child's close (3: Undelivered)");
    assert_eq!(after, before, "the child sent its parent's cleanup");
}
