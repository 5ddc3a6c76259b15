//! `Client::close` while another thread of the client leads the polling: it waits as
//! documented (for the nodes to answer what they owe, 10 s at most), whoever leads, and leaves
//! the client as it was, with no busy loop behind.
//!
//! One test in its own binary: it measures the process's CPU time, which other tests running
//! at the same time would add to.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::process::*;
use common::*;
use redlock_mux::{Acquire, Client};

const TTL: Duration = Duration::from_secs(30);

#[test]
fn close_waits_for_a_slow_node_while_another_thread_leads_and_leaves_no_busy_loop() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    // No retry before the wait ends: a waiter sends nothing after its first attempt, and waits
    // for a release announcement that does not come.
    let client = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(60))
        .build()
        .expect("client");
    let other = Client::new(cluster.urls()).expect("other client");
    let held = other.try_lock("busy", TTL).expect("lock busy");

    let lock = client.try_lock("slow", TTL).expect("lock slow");
    assert_settles!(get(addrs[0], b"slow").is_some());

    // A thread waits for `busy`: it leads the client's polling while it waits.
    let waiter = {
        let client = client.clone();
        thread::spawn(move || {
            client.lock_with(
                "busy",
                TTL,
                &Acquire::new().timeout(Duration::from_millis(2500)),
            )
        })
    };
    assert_settles!(client.stats().kinds.mutex.contended >= 1);

    // Node 0 is stopped for 500 ms: the release returns at the quorum of the other two, and
    // node 0 still owes its answer when `close` is called.
    cluster.servers[0].pause().expect("SIGSTOP");
    lock.release()
        .expect("release at the quorum of the other two");
    let resumer = {
        let pid = cluster.servers[0].pid();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(500));
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        })
    };
    let started = Instant::now();
    let outcome = client.clone().close();
    let waited = started.elapsed();
    resumer.join().unwrap();
    cluster.servers[0].resume().expect("SIGCONT");
    eprintln!("close() while another thread leads: {outcome:?} after {waited:?}");
    assert!(
        outcome.is_ok() && waited >= Duration::from_millis(400),
        "close() while another thread leads returned {outcome:?} after {waited:?}, \
         though node 0 answers its release 500 ms after the call"
    );
    assert!(
        waited < Duration::from_secs(10),
        "close() waited {waited:?}"
    );
    assert_eq!(
        get(addrs[0], b"slow"),
        None,
        "the release owed to node 0 was not run when close() returned"
    );

    let waited = waiter.join().unwrap();
    assert!(waited.is_err(), "the waiter got a held lock");

    // The client is usable and idle: a thread waits for `busy` and sends nothing after its
    // first attempt. From 2 s on (when a client left closing would spin: no node has
    // answered anything for that long), 3 s of that wait cost next to no CPU.
    let idle = {
        let client = client.clone();
        thread::spawn(move || {
            client.lock_with(
                "busy",
                TTL,
                &Acquire::new().timeout(Duration::from_millis(5500)),
            )
        })
    };
    thread::sleep(Duration::from_secs(2));
    let before = cpu_time();
    thread::sleep(Duration::from_secs(3));
    let used = cpu_time().saturating_sub(before);
    eprintln!("CPU used in 3 s of an idle wait after close(): {used:?}");
    assert!(
        idle.join().unwrap().is_err(),
        "the idle wait got a held lock"
    );
    assert!(
        used < Duration::from_millis(100),
        "3 s of a wait with nothing to send or read, after close(), used {used:?} of CPU"
    );
    held.release().expect("release busy");
    client.close().expect("close");
}
