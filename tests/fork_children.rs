//! Children forked from a process whose client is in use: a child never waits on a lock held
//! by a thread it does not have, never releases, extends or keeps alive a lock its parent
//! took, and keeps alive the locks it takes itself.
//!
//! A binary of its own, apart from `fork.rs`: these tests fork while other threads of the
//! process run, on purpose. A child only uses the client, writes its report with plain system
//! calls, and `_exit`s; the parent waits for it with a deadline and kills it by PID when it
//! hangs.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::process::*;
use common::*;
use redlock_mux::{Client, Error, KeepAlive};

#[test]
fn a_child_forked_while_threads_use_the_client_never_waits_on_them() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let client = client.clone();
            let stop = stop.clone();
            let rounds = rounds.clone();
            thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(120);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until && n < 1_000_000 {
                    n += 1;
                    if let Ok(lock) =
                        client.try_lock(format!("worker:{t}"), Duration::from_secs(10))
                    {
                        let _ = lock.release();
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    assert_settles!(rounds.load(Ordering::Relaxed) >= 100);

    let started = Instant::now();
    let (mut forked, mut hung, mut failed) = (0, 0, 0);
    // 40 children, in 60 s at most; five that hang are enough to tell.
    while forked < 40 && hung < 5 && started.elapsed() < Duration::from_secs(60) {
        let key = format!("child:{forked}");
        let pid = fork_child(|| match client.try_lock(&key, Duration::from_secs(10)) {
            Ok(lock) => match lock.release() {
                Ok(()) => 0,
                Err(_) => 2,
            },
            Err(_) => 1,
        });
        forked += 1;
        match wait_child(pid, Duration::from_secs(5)) {
            None => hung += 1,
            Some(0) => {}
            Some(_) => failed += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    eprintln!(
        "{forked} children in {:?}: {hung} hung, {failed} failed; {} rounds of the 4 threads",
        started.elapsed(),
        rounds.load(Ordering::Relaxed)
    );
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(
        hung, 0,
        "{hung} of {forked} children forked while 4 threads used the client hung in try_lock \
         (killed after 5 s)"
    );
    assert!(
        failed <= 1,
        "{failed} of {forked} children could not lock and release a free key"
    );
    client
        .try_lock("after", Duration::from_secs(10))
        .expect("the parent's client still works")
        .release()
        .expect("release");
}

#[test]
fn a_child_never_releases_or_extends_its_parents_locks() {
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::new(cluster.urls()).expect("client");
    let ttl = Duration::from_secs(20);
    let dropped = client.try_lock("inherited:dropped", ttl).expect("lock");
    let released = client.try_lock("inherited:released", ttl).expect("lock");
    let mut extended = client.try_lock("inherited:extended", ttl).expect("lock");
    let kept = client.try_lock("inherited:kept", ttl).expect("lock");
    let tokens: Vec<(&[u8], Vec<u8>)> = vec![
        (b"inherited:dropped", dropped.token().to_vec()),
        (b"inherited:released", released.token().to_vec()),
        (b"inherited:extended", extended.token().to_vec()),
        (b"inherited:kept", kept.token().to_vec()),
    ];
    for (key, token) in &tokens {
        assert_settles!(addrs
            .iter()
            .all(|&a| get(a, key).as_deref() == Some(&token[..])));
    }

    let pid = fork_child(|| {
        // As a child returning from `main` does, or cleanup code: drop, release, extend.
        drop(dropped);
        let mut code = 0;
        if !matches!(released.release(), Err(Error::OtherProcess { .. })) {
            code |= 1;
        }
        if !matches!(
            extended.extend(Duration::from_secs(1)),
            Err(Error::OtherProcess { .. })
        ) {
            code |= 2;
        }
        match kept.keep_alive(KeepAlive::new(Duration::from_secs(1))) {
            Ok(_) => code |= 4,
            Err(refused) if !matches!(refused.error, Error::OtherProcess { .. }) => code |= 8,
            Err(_) => {}
        }
        code
    });
    let code = wait_child(pid, Duration::from_secs(20));
    let mut changed = Vec::new();
    for (key, token) in &tokens {
        for (i, &a) in addrs.iter().enumerate() {
            if get(a, key).as_deref() != Some(&token[..]) || pttl(a, key) < 10_000 {
                changed.push(format!("{} on node {i}", String::from_utf8_lossy(key)));
            }
        }
    }
    assert!(
        changed.is_empty(),
        "a child's drop, release, extend or keep-alive changed its parent's locks: {changed:?}"
    );
    assert_eq!(
        code,
        Some(0),
        "the child's release, extend or keep_alive of an inherited lock was not refused with \
         Error::OtherProcess (exit code: bit 0 release, 1 extend, 2-3 keep_alive)"
    );
    let other = Client::new(cluster.urls()).expect("other client");
    for (key, _) in &tokens {
        let taken = other.try_lock(key, ttl);
        assert!(
            taken.as_ref().is_err_and(Error::is_contended),
            "another client took {}: {taken:?}",
            String::from_utf8_lossy(key)
        );
    }
    extended
        .extend(ttl)
        .expect("the parent still extends its lock");
    extended
        .release()
        .expect("the parent still releases its lock");
}

#[test]
fn a_child_keeps_alive_the_locks_it_takes_itself() {
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::new(cluster.urls()).expect("client");
    // The parent keeps a lock alive: the client's keeper thread runs in the parent.
    let parents = client
        .try_lock("kept:parent", Duration::from_secs(3))
        .expect("lock")
        .keep_alive(KeepAlive::new(Duration::from_secs(3)))
        .expect("keep alive");
    let report = std::env::temp_dir().join(format!("redlock-mux-kept-{}", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let ttl = Duration::from_millis(1200);
    let pid = fork_child(|| {
        let kept = match client.try_lock("kept:child", ttl) {
            Ok(lock) => match lock.keep_alive(KeepAlive::new(ttl)) {
                Ok(kept) => kept,
                Err(_) => return 2,
            },
            Err(_) => return 1,
        };
        let token = kept.token().to_vec();
        // Three TTLs: the lock lives only if someone extends it.
        let until = Instant::now() + ttl * 3;
        // What the library promises is a quorum, not every node: on a loaded machine one
        // node's extension may come after its key expired there.
        let quorum = addrs.len() / 2 + 1;
        let mut fewest = addrs.len();
        while Instant::now() < until {
            let holding = addrs
                .iter()
                .filter(|&&a| get(a, b"kept:child").as_deref() == Some(&token[..]))
                .count();
            fewest = fewest.min(holding);
            thread::sleep(Duration::from_millis(50));
        }
        let lost = kept.is_lost();
        let released = kept.release().is_ok();
        let _ = std::fs::write(
            &report,
            format!(
                "held on {fewest} of {} nodes at the least (quorum {quorum}), lost {lost}, \
                 released {released}",
                addrs.len()
            ),
        );
        if fewest >= quorum && !lost && released {
            0
        } else {
            3
        }
    });
    let code = wait_child(pid, Duration::from_secs(20));
    let said = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_file(&report);
    assert_eq!(
        code,
        Some(0),
        "the child's kept lock (TTL {ttl:?}, kept 3 TTLs) was not kept alive: {said}"
    );
    assert!(!parents.is_lost(), "the parent's kept lock was lost");
    parents.release().expect("release the parent's lock");
}
