//! Threads contend for one lock on three real `redis-server` processes while a node is killed
//! (-9) and restarted after longer than the TTL, frozen with SIGSTOP and thawed, and while
//! holders overstay their validity. The shared history checker must find no overlapping
//! windows and no lost counter updates, and no lock key may be left once everyone released.

mod common;
#[path = "common/history.rs"]
mod history;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::RedisCluster;
use history::{History, Increment, Kind, Op};
use redlock_mux::Client;

const TTL: Duration = Duration::from_millis(300);
const KEY: &[u8] = b"fault:counter";
const THREADS: u64 = 4;
const RUN_FOR: Duration = Duration::from_millis(1500);

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// kill -9 of node 0, restarted after longer than the TTL.
    KillAndDelayedRestart,
    /// SIGSTOP of node 1 for about a TTL, then SIGCONT.
    StopAndContinue,
    /// Every holder sometimes sleeps past its validity, then checks before it writes.
    HoldPastValidity,
}

/// Runs the contention under `fault` and returns the merged history and faults injected.
fn contend(cluster: &mut RedisCluster, fault: Fault) -> (History, u32) {
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(20))
        .retry_delay(Duration::from_millis(10))
        .retry_count(1000)
        .wait_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let origin = Instant::now();
    let counter = Arc::new(AtomicU64::new(0));
    let merged = Arc::new(Mutex::new(History::default()));
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let (client, counter, merged) = (client.clone(), counter.clone(), merged.clone());
            let overstay = matches!(fault, Fault::HoldPastValidity);
            thread::spawn(move || {
                let mut h = History::default();
                let at = || origin.elapsed();
                while origin.elapsed() < RUN_FOR {
                    let invoke = at();
                    let Ok(lock) = client.lock(KEY, TTL) else {
                        continue;
                    };
                    let validity = lock.validity();
                    let ok = at();
                    let op = h.push(Op {
                        client: id,
                        kind: Kind::Mutex,
                        key: KEY.to_vec(),
                        invoke,
                        ok: Some(ok),
                        fence: None,
                        // Measured after the grant, so never earlier than the lock's own.
                        valid_until: Some(ok + validity),
                        release: None,
                    });
                    // A read-modify-write that loses updates unless the lock is exclusive.
                    let read = counter.load(Ordering::SeqCst);
                    let pause = if overstay && invoke.as_millis() % 3 == 0 {
                        TTL
                    } else {
                        Duration::from_millis(2)
                    };
                    thread::sleep(pause);
                    // Check the validity before writing, then write at once.
                    let written = at();
                    if lock.validity() > Duration::ZERO {
                        counter.store(read + 1, Ordering::SeqCst);
                        h.increments.push(Increment {
                            client: id,
                            key: KEY.to_vec(),
                            read,
                            at: written,
                            op,
                        });
                    }
                    h.ops[op].release = Some(at());
                    let _ = lock.release();
                }
                merged.lock().unwrap().merge(h);
            })
        })
        .collect();
    let mut faults = 0;
    while origin.elapsed() < RUN_FOR {
        thread::sleep(Duration::from_millis(150));
        match fault {
            Fault::KillAndDelayedRestart => {
                cluster.servers[0].kill().expect("kill -9");
                thread::sleep(TTL + Duration::from_millis(100));
                cluster.servers[0].restart().expect("restart");
            }
            Fault::StopAndContinue => {
                cluster.servers[1].pause().expect("SIGSTOP");
                thread::sleep(TTL);
                cluster.servers[1].resume().expect("SIGCONT");
            }
            Fault::HoldPastValidity => thread::sleep(Duration::from_millis(200)),
        }
        faults += 1;
    }
    for w in workers {
        w.join().expect("worker panicked");
    }
    let mut history = std::mem::take(&mut *merged.lock().unwrap());
    history
        .counters
        .insert(KEY.to_vec(), (0, counter.load(Ordering::SeqCst)));
    (history, faults)
}

#[test]
fn no_overlap_or_lost_update_under_node_faults() {
    let mut cluster = RedisCluster::start(3).expect("start redis-server");
    for fault in [
        Fault::KillAndDelayedRestart,
        Fault::StopAndContinue,
        Fault::HoldPastValidity,
    ] {
        let (history, faults) = contend(&mut cluster, fault);
        let report = history.check();
        println!(
            "{fault:?}: {faults} faults injected, {} holders found their validity gone before writing; {report}",
            report.windows - report.increments
        );
        assert!(faults > 0, "{fault:?}: no fault was injected");
        assert!(
            report.windows > 0,
            "{fault:?}: nobody got the lock: {report}"
        );
        assert_eq!(report.overlaps.len(), 0, "{fault:?}: {report}");
        assert_eq!(report.lost_updates, 0, "{fault:?}: {report}");
        // Everyone released: no node may keep the lock's key.
        thread::sleep(Duration::from_millis(100));
        for addr in cluster.addrs() {
            let left: Vec<_> = common::keys(addr)
                .into_iter()
                .filter(|k| k.starts_with(b"fault:"))
                .collect();
            assert!(left.is_empty(), "{fault:?}: {addr} still holds {left:?}");
        }
    }
}
