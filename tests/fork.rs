//! A client used on both sides of `fork()`: the child must never read or write the parent's
//! connections (each would read replies meant for the other, and could take another process's
//! `+OK` for its own vote). Parent and child loop `try_lock` + release on one key at once for a
//! few seconds; a marker file created exclusively while the lock is held catches any overlap.
//!
//! One test in its own binary: the child of a multi-threaded test process has only the forking
//! thread, and must not meet locks other test threads held at the fork.

mod common;

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

use common::process::*;
use common::*;
use redlock_mux::{Client, NodeErrorKind};

/// What one process counted.
#[derive(Default, Debug)]
struct Counts {
    granted: u32,
    contended: u32,
    /// Errors that only crossed replies produce: a reply the command never returns.
    crossed: u32,
    other: u32,
    overlaps: u32,
}

fn contend(client: &Client, marker: &Path, until: Instant) -> Counts {
    let mut c = Counts::default();
    let mut rounds = 0;
    while Instant::now() < until && rounds < 20_000 {
        rounds += 1;
        match client.try_lock("forked", Duration::from_secs(10)) {
            Ok(lock) => {
                c.granted += 1;
                match OpenOptions::new().write(true).create_new(true).open(marker) {
                    Ok(_) => {
                        let _ = fs::remove_file(marker);
                    }
                    Err(_) => c.overlaps += 1,
                }
                if lock.release().is_err() {
                    c.other += 1;
                }
            }
            Err(e) if e.is_contended() => c.contended += 1,
            Err(e) => {
                let crossed = e.failures().iter().any(|f| {
                    matches!(
                        f.kind,
                        NodeErrorKind::UnexpectedReply | NodeErrorKind::Protocol(_)
                    )
                });
                if crossed {
                    c.crossed += 1;
                } else {
                    c.other += 1;
                }
            }
        }
    }
    c
}

#[test]
fn a_client_used_after_fork_opens_its_own_connections() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    // The connections are open and used before the fork.
    client
        .try_lock("forked", Duration::from_secs(10))
        .expect("lock")
        .release()
        .expect("release");
    let dir = std::env::temp_dir().join(format!("redlock-mux-fork-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("held");
    let report = dir.join("child");
    let until = Instant::now() + Duration::from_secs(3);
    let pid = sys::fork_process();
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let c = contend(&client, &marker, until);
        let text = format!(
            "{} {} {} {} {}",
            c.granted, c.contended, c.crossed, c.other, c.overlaps
        );
        let ok = fs::write(&report, text).is_ok();
        std::mem::forget(client);
        sys::exit(if ok { 0 } else { 1 });
    }
    let parent = contend(&client, &marker, until);
    let status = sys::wait(pid);
    let child = fs::read_to_string(&report).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    assert_eq!(status, 0, "the child failed (status {status})");
    let n: Vec<u32> = child.split(' ').filter_map(|v| v.parse().ok()).collect();
    let [granted, contended, crossed, other, overlaps] = n[..] else {
        panic!("no report from the child: {child:?}")
    };
    eprintln!(
        "parent: {parent:?}; child: granted {granted}, contended {contended}, crossed {crossed}, \
         other {other}, overlaps {overlaps}"
    );
    assert_eq!(
        parent.crossed + crossed,
        0,
        "replies crossed between the processes"
    );
    assert_eq!(
        parent.overlaps + overlaps,
        0,
        "both processes held the lock at once"
    );
    assert!(
        parent.granted > 0 && granted > 0,
        "a process never got the lock"
    );
    // Healthy nodes: failures are the exception (a loaded machine may time out a few).
    let rounds = parent.granted + parent.contended + granted + contended;
    assert!(
        parent.other + other <= (rounds / 100).max(3),
        "{} failed rounds of {rounds}",
        parent.other + other
    );
    // The parent's connections still work after the child is gone.
    client
        .try_lock("after", Duration::from_secs(10))
        .expect("lock after the child")
        .release()
        .expect("release");
}
