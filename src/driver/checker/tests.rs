//! The driver's hand-off under shuttle: several callers, a cancelled waiter, the resender and
//! a close while another caller leads, over three in-memory nodes, one of them slow.
//!
//! `REDLOCK_CHECKER_RUNS` sets the schedules per test (default 150);
//! `REDLOCK_CHECKER_REPLAY` replays a failing schedule, as printed (`replay_a_schedule`), and
//! `REDLOCK_CHECKER_TRACE` prints each wait with the virtual clock.

use std::cell::Cell;
use std::time::Duration;

use super::net::Net;
use super::world::{join, spawn_joinable, wait_ended, World};
use crate::{Acquire, Cancel, Client};

const PORTS: [u16; 3] = [17001, 17002, 17003];
/// Long, so that a caller left asleep until its own deadline shows.
const NODE_TIMEOUT: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(600);
/// How late, in virtual time, any thread may return: a run needs a few retry delays, a close
/// while others send at most its limit (10 s), and a caller woken by its node timeout
/// returns after a minute.
const PROMPT: Duration = Duration::from_secs(20);
/// How often the waiters try again (with jitter), and how many times at most: a close waits
/// for what they keep sending, up to its own limit.
const RETRY: Duration = Duration::from_millis(5);
const WAITER_RETRIES: u32 = 30;
/// How much later than the fast nodes the slow one runs each command and answers.
const SLOW: Duration = Duration::from_millis(5);

thread_local! {
    /// Runs of the test on this thread, to say which one failed.
    static RUNS: Cell<usize> = const { Cell::new(0) };
}

fn runs() -> usize {
    std::env::var("REDLOCK_CHECKER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150)
}

fn elapsed() -> Duration {
    World::get().lock().now
}

/// The live keys of every node whose name holds `part`.
fn keys_with(part: &str) -> Vec<String> {
    let world = World::get();
    let mut s = world.lock();
    let now_ms = 1_000_000 + s.now.as_millis() as i64;
    let mut out = Vec::new();
    for (n, server) in s.net.servers.iter_mut().enumerate() {
        for k in server.node.live_key_names(now_ms) {
            let k = String::from_utf8_lossy(&k).into_owned();
            if k.contains(part) {
                out.push(format!("node {n}: {k}"));
            }
        }
    }
    out
}

/// One run: see the module's documentation.
fn run() {
    let run = RUNS.with(|r| {
        r.set(r.get() + 1);
        r.get()
    });
    let world = World::install(
        Net::new(&PORTS, &[Duration::ZERO, Duration::ZERO, SLOW]),
        run,
    );
    let client = Client::builder()
        .nodes(PORTS.iter().map(|p| format!("redis://127.0.0.1:{p}")))
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(RETRY)
        .build()
        .expect("client");
    let busy = client.try_lock("busy", TTL).expect("busy");
    // Two callers, each taking and releasing a lock of its own twice: releases return at the
    // quorum of the two fast nodes, and the slow node's are left to the resender.
    let workers: Vec<_> = (0..2)
        .map(|i| {
            let client = client.clone();
            spawn_joinable(move || {
                for round in 0..2 {
                    let lock = client
                        .try_lock(format!("work{i}"), TTL)
                        .unwrap_or_else(|e| panic!("run {run}: caller {i} round {round}: {e}"));
                    lock.release()
                        .unwrap_or_else(|e| panic!("run {run}: caller {i} release: {e}"));
                }
                let at = elapsed();
                assert!(
                    at <= PROMPT,
                    "run {run}: caller {i} returned at {at:?} of virtual time: it slept to its \
                     node timeout (a lost wake-up)"
                );
            })
        })
        .collect();
    // Two waiters for the lock that is held: they try again every few milliseconds, and read
    // for the others when their own deadline passes, until they give up or are cancelled
    // after the close.
    let cancel = Cancel::new();
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let client = client.clone();
            let cancel = cancel.clone();
            spawn_joinable(move || {
                let opts = Acquire::new().cancel(&cancel).retries(WAITER_RETRIES);
                let got = client.lock_with("busy", TTL, &opts);
                // The lock is held all along: getting it would make two holders.
                assert!(got.is_err(), "run {run}: waiter {i} got the held lock");
                let at = elapsed();
                assert!(
                    at <= PROMPT,
                    "run {run}: the cancelled waiter {i} returned at {at:?} of virtual time"
                );
            })
        })
        .collect();
    // A close once the callers returned, while the waiter or the resender may lead: it returns
    // once every node ran their releases (the slow one's included).
    let closer = {
        let client = client.clone();
        let workers = workers.iter().map(|w| w.thread().id()).collect::<Vec<_>>();
        spawn_joinable(move || {
            for w in workers {
                wait_ended(w);
            }
            let closed = client.close();
            let at = elapsed();
            let left = keys_with("work");
            assert!(
                closed.is_ok() && left.is_empty(),
                "run {run}: close() returned {closed:?} at {at:?} of virtual time with {left:?} \
                 still held"
            );
            assert!(at <= PROMPT, "run {run}: close() returned at {at:?}");
        })
    };
    let canceller = {
        let closer = closer.thread().id();
        spawn_joinable(move || {
            wait_ended(closer);
            cancel.cancel();
        })
    };
    for w in workers {
        join(w);
    }
    join(closer);
    for w in waiters {
        join(w);
    }
    join(canceller);
    busy.release().expect("release busy");
    client.close().expect("close");
    let left = keys_with("");
    assert!(
        left.is_empty(),
        "run {run}: keys left after close: {left:?}"
    );
    // This thread ends: the clock may move for the threads left (the resender, until it sees
    // the client gone).
    world.leave();
}

#[test]
fn hand_off_under_random_schedules() {
    shuttle::check_random(run, runs());
}

#[test]
fn hand_off_under_pct_schedules() {
    shuttle::check_pct(run, runs(), 3);
}

/// Replays the schedule in `REDLOCK_CHECKER_REPLAY` (as a failure prints it), if set.
#[test]
fn replay_a_schedule() {
    if let Ok(schedule) = std::env::var("REDLOCK_CHECKER_REPLAY") {
        shuttle::replay(run, schedule.trim());
    }
}
