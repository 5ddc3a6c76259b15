//! Fork and close under pressure: a child forked while a thread of its parent is closing the
//! client, or from a child (grandchildren), or while threads wait with a shared `Cancel`,
//! never waits on a thread it does not have; a child that closes its client leaves its
//! parent's locks and connections alone; concurrent `close` calls, and a client used again
//! after them, behave as documented, within the documented bound and without a busy loop.
//!
//! A binary of its own: these tests fork while other threads of the process run, and one
//! measures the process's CPU time. A child writes its outcome as its exit code and `_exit`s;
//! the parent waits for it with a deadline and kills it by PID when it hangs.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use common::process::*;
use common::*;
use redlock_mux::{Acquire, Cancel, Client, Error, KeepAlive};

/// The tests of this binary run one at a time: one measures the process's CPU time, and the
/// others fork while their threads run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks and releases a key of its own, then closes its copy of the client: 0 when all three
/// worked.
fn child_uses_and_closes(client: &Client, key: &str) -> i32 {
    match client.try_lock(key, Duration::from_secs(10)) {
        Ok(lock) => {
            if lock.release().is_err() {
                return 2;
            }
        }
        Err(_) => return 1,
    }
    match client.clone().close() {
        Ok(()) => 0,
        Err(_) => 3,
    }
}

#[test]
fn a_child_forked_while_another_thread_closes_the_client_never_waits_on_it() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let closes = Arc::new(AtomicUsize::new(0));
    // Two threads close the client again and again, a third locks and releases.
    let mut threads: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            let stop = stop.clone();
            let closes = closes.clone();
            thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(90);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until && n < 1_000_000 {
                    n += 1;
                    let _ = client.clone().close();
                    closes.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    {
        let client = client.clone();
        let stop = stop.clone();
        threads.push(thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(90);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && Instant::now() < until && n < 1_000_000 {
                n += 1;
                if let Ok(lock) = client.try_lock("locker", Duration::from_secs(10)) {
                    let _ = lock.release();
                }
            }
        }));
    }
    assert_settles!(closes.load(Ordering::Relaxed) >= 20);

    let started = Instant::now();
    let (mut forked, mut hung, mut failed) = (0, 0, Vec::new());
    while forked < 30 && hung < 3 && started.elapsed() < Duration::from_secs(60) {
        let key = format!("closing-child:{forked}");
        let pid = fork_child(|| child_uses_and_closes(&client, &key));
        forked += 1;
        match wait_child(pid, Duration::from_secs(5)) {
            None => hung += 1,
            Some(0) => {}
            Some(code) => failed.push(code),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "{forked} children in {:?}: {hung} hung, failed with {failed:?}; {} closes",
        started.elapsed(),
        closes.load(Ordering::Relaxed)
    );
    assert_eq!(
        hung, 0,
        "{hung} of {forked} children forked while two threads closed the client hung \
         (killed after 5 s)"
    );
    assert!(
        failed.len() <= 1,
        "children could not lock, release and close (exit codes {failed:?})"
    );
    client
        .try_lock("after", Duration::from_secs(10))
        .expect("the parent's client still works")
        .release()
        .expect("release");
}

#[test]
fn a_child_that_closes_its_client_leaves_its_parents_locks_and_connections() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::new(cluster.urls()).expect("client");
    let ttl = Duration::from_secs(20);
    let mut held = Some(client.try_lock("parent:held", ttl).expect("lock"));
    let mut client = Some(client);
    let token = held.as_ref().unwrap().token().to_vec();
    assert_settles!(addrs
        .iter()
        .all(|&a| get(a, b"parent:held").as_deref() == Some(&token[..])));

    // A thread of the parent keeps the connections busy while the child closes and drops.
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicUsize::new(0));
    let rounds = Arc::new(AtomicUsize::new(0));
    let worker = {
        let client = client.clone().unwrap();
        let (stop, errors, rounds) = (stop.clone(), errors.clone(), rounds.clone());
        thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                match client.try_lock("parent:worker", Duration::from_secs(10)) {
                    Ok(lock) => {
                        if lock.release().is_err() {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    assert_settles!(rounds.load(Ordering::Relaxed) >= 50);

    for n in 0..5 {
        let before = errors.load(Ordering::Relaxed);
        // The child uses, closes and drops every handle it has (the parent's guard too), as a
        // child leaving through its cleanup code does.
        let key = format!("child:{n}");
        let pid = fork_child(|| {
            let code = child_uses_and_closes(client.as_ref().unwrap(), &key);
            drop(held.take());
            drop(client.take());
            code
        });
        let code = wait_child(pid, Duration::from_secs(20));
        assert_eq!(code, Some(0), "child {n} could not lock, release and close");
        // The parent's thread goes on without an error over the next 50 rounds.
        let at = rounds.load(Ordering::Relaxed);
        assert_settles!(rounds.load(Ordering::Relaxed) >= at + 50);
        let after = errors.load(Ordering::Relaxed);
        assert_eq!(
            after,
            before,
            "the parent's thread failed {} times after child {n} closed its client",
            after - before
        );
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    for (i, &a) in addrs.iter().enumerate() {
        assert_eq!(
            get(a, b"parent:held").as_deref(),
            Some(&token[..]),
            "the parent's lock left node {i} after its children closed their clients"
        );
    }
    let mut held = held.take().unwrap();
    held.extend(ttl).expect("the parent extends its lock");
    held.release().expect("the parent releases its lock");
    client.take().unwrap().close().expect("the parent closes");
}

#[test]
fn a_grandchild_forked_while_its_parents_threads_use_the_client_never_waits_on_them() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    // The parent's threads use the client too, so that the child inherits a busy client.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let client = client.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(90);
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    if let Ok(lock) = client.try_lock(format!("p:{t}"), Duration::from_secs(10)) {
                        let _ = lock.release();
                    }
                }
            })
        })
        .collect();
    let report = std::env::temp_dir().join(format!("redlock-mux-grand-{}", std::process::id()));
    let _ = std::fs::remove_file(&report);
    // The child starts threads of its own on the client and forks grandchildren among them.
    let pid = fork_child(|| {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let client = client.clone();
                let stop = stop.clone();
                let rounds = rounds.clone();
                thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(60);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                        if let Ok(lock) = client.try_lock(format!("c:{t}"), Duration::from_secs(10))
                        {
                            let _ = lock.release();
                        }
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let until = Instant::now() + Duration::from_secs(10);
        while rounds.load(Ordering::Relaxed) < 100 && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
        let (mut hung, mut failed) = (0, 0);
        let mut n = 0;
        while n < 20 && hung < 3 {
            let key = format!("grandchild:{n}");
            let pid = fork_child(|| child_uses_and_closes(&client, &key));
            n += 1;
            match wait_child(pid, Duration::from_secs(5)) {
                None => hung += 1,
                Some(0) => {}
                Some(_) => failed += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            let _ = t.join();
        }
        let rounds = rounds.load(Ordering::Relaxed);
        let _ = std::fs::write(
            &report,
            format!("{n} grandchildren: {hung} hung, {failed} failed; {rounds} rounds"),
        );
        if hung == 0 && failed <= 1 && rounds >= 100 {
            0
        } else {
            1
        }
    });
    let code = wait_child(pid, Duration::from_secs(90));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let said = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_file(&report);
    eprintln!("child: {code:?}, {said}");
    assert_eq!(code, Some(0), "the child's grandchildren: {said}");
}

#[test]
fn a_child_forked_while_threads_wait_with_a_shared_cancel_never_waits_on_them() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let cancel = Cancel::new();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    // Four threads lock with the same handle: each registers with it and leaves it.
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let client = client.clone();
            let cancel = cancel.clone();
            let stop = stop.clone();
            let rounds = rounds.clone();
            thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(90);
                let opts = Acquire::new()
                    .cancel(&cancel)
                    .timeout(Duration::from_millis(200));
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    if let Ok(lock) =
                        client.lock_with(format!("cancel:{t}"), Duration::from_secs(10), &opts)
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
    let (mut forked, mut hung, mut failed) = (0, 0, Vec::new());
    while forked < 1000 && hung < 2 && started.elapsed() < Duration::from_secs(60) {
        let key = format!("cancel-child:{forked}");
        let pid = fork_child(|| {
            let opts = Acquire::new()
                .cancel(&cancel)
                .timeout(Duration::from_secs(2));
            let code = match client.lock_with(&key, Duration::from_secs(10), &opts) {
                Ok(lock) => match lock.release() {
                    Ok(()) => 0,
                    Err(_) => 2,
                },
                Err(_) => 1,
            };
            // Cancelling in the child cancels the child's calls.
            cancel.cancel();
            match client.lock_with(&key, Duration::from_secs(10), &opts) {
                Err(Error::Cancelled) => code,
                _ => code | 4,
            }
        });
        forked += 1;
        match wait_child(pid, Duration::from_secs(5)) {
            None => hung += 1,
            Some(0) => {}
            Some(code) => failed.push(code),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    eprintln!(
        "{forked} children in {:?}: {hung} hung, failed with {failed:?}; {} rounds",
        started.elapsed(),
        rounds.load(Ordering::Relaxed)
    );
    assert!(
        !cancel.is_cancelled(),
        "a child's cancel reached the parent"
    );
    assert_eq!(
        hung, 0,
        "{hung} of {forked} children forked while 4 threads locked with a shared Cancel hung \
         (killed after 5 s)"
    );
    assert!(failed.len() <= 1, "children failed: {failed:?}");
}

#[test]
fn concurrent_closes_and_a_locker_then_the_client_is_used_again() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::new(cluster.urls()).expect("client");
    let ttl = Duration::from_secs(30);
    let lock = client.try_lock("slow", ttl).expect("lock slow");
    assert_settles!(get(addrs[0], b"slow").is_some());
    // Node 0 answers the release 600 ms after it is sent: both closes wait for it.
    cluster.servers[0].pause().expect("SIGSTOP");
    lock.release()
        .expect("release at the quorum of the other two");
    let resumer = {
        let pid = cluster.servers[0].pid();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(600));
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        })
    };
    let barrier = Arc::new(Barrier::new(3));
    let closers: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let started = Instant::now();
                let outcome = client.close();
                (outcome, started.elapsed())
            })
        })
        .collect();
    let locker = {
        let client = client.clone();
        let barrier = barrier.clone();
        thread::spawn(move || {
            barrier.wait();
            let mut got = 0;
            for n in 0..20 {
                if let Ok(lock) = client.lock(format!("during:{n}"), ttl) {
                    if lock.release().is_ok() {
                        got += 1;
                    }
                }
            }
            got
        })
    };
    let outcomes: Vec<_> = closers.into_iter().map(|c| c.join().unwrap()).collect();
    let got = locker.join().unwrap();
    resumer.join().unwrap();
    cluster.servers[0].resume().expect("SIGCONT");
    eprintln!("closes: {outcomes:?}; locker got {got} of 20");
    for (outcome, waited) in &outcomes {
        assert!(
            outcome.is_ok() && *waited >= Duration::from_millis(450),
            "a close() returned {outcome:?} after {waited:?}, though node 0 answers 600 ms \
             after the release"
        );
        assert!(
            *waited < Duration::from_secs(10),
            "close() waited {waited:?}"
        );
    }
    assert_eq!(
        got, 20,
        "a thread locking during two closes got {got} of 20 locks"
    );
    assert_eq!(get(addrs[0], b"slow"), None, "node 0 kept the released key");
    // Used again after the closes: lock, release, and nothing left behind.
    for n in 0..10 {
        let key = format!("after:{n}");
        client
            .try_lock(&key, ttl)
            .expect("lock after close")
            .release()
            .expect("release after close");
        for (i, &a) in addrs.iter().enumerate() {
            assert_settles_eq!(get(a, key.as_bytes()), None, "{key} left on node {i}");
        }
    }
    client.close().expect("close at last");
}

#[test]
fn close_gives_up_on_a_stopped_node_within_its_bound_while_another_thread_leads() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(60))
        .build()
        .expect("client");
    let other = Client::new(cluster.urls()).expect("other client");
    let ttl = Duration::from_secs(30);
    let held = other.try_lock("busy", ttl).expect("lock busy");
    let lock = client.try_lock("stopped", ttl).expect("lock");
    assert_settles!(get(addrs[0], b"stopped").is_some());
    // A thread waits 12 s for `busy`, leading the polling the whole time.
    let waiter = {
        let client = client.clone();
        thread::spawn(move || {
            client.lock_with(
                "busy",
                ttl,
                &Acquire::new().timeout(Duration::from_secs(12)),
            )
        })
    };
    assert_settles!(client.stats().kinds.mutex.contended >= 1);
    cluster.servers[0].pause().expect("SIGSTOP");
    lock.release()
        .expect("release at the quorum of the other two");
    let cpu = cpu_time();
    let started = Instant::now();
    let outcome = client.clone().close();
    let waited = started.elapsed();
    let used = cpu_time().saturating_sub(cpu);
    // Node 0 stays stopped while the waiter goes on leading: 3 s of it cost next to no CPU.
    let cpu = cpu_time();
    thread::sleep(Duration::from_secs(3));
    let after = cpu_time().saturating_sub(cpu);
    cluster.servers[0].resume().expect("SIGCONT");
    eprintln!(
        "close() with node 0 stopped: {outcome:?} after {waited:?}, {used:?} of CPU; \
         {after:?} of CPU in the 3 s after"
    );
    assert!(
        after < Duration::from_millis(150),
        "3 s of a wait after close() gave up on a stopped node used {after:?} of CPU"
    );
    let named: Vec<usize> = match &outcome {
        Err(e) => e.failures().iter().map(|f| f.node).collect(),
        Ok(()) => Vec::new(),
    };
    assert!(
        matches!(outcome, Err(Error::Undelivered { .. })) && named == [0],
        "close() with node 0 stopped returned {outcome:?}"
    );
    assert!(
        waited >= Duration::from_millis(1900) && waited <= Duration::from_secs(10),
        "close() with node 0 stopped waited {waited:?} (no progress for 2 s gives up, 10 s \
         at most)"
    );
    assert!(
        used < waited / 10,
        "close() used {used:?} of CPU in {waited:?}"
    );
    let _ = waiter.join().unwrap();
    held.release().expect("release busy");
}

/// What every key on every node holds: its value (`DUMP`) and whether it expires within 10 s.
fn snapshot(addrs: &[std::net::SocketAddr]) -> Vec<String> {
    let mut all = Vec::new();
    for (i, &a) in addrs.iter().enumerate() {
        let mut names = keys(a);
        names.sort();
        for k in names {
            let ttl = pttl(a, &k);
            all.push(format!(
                "node {i} {}: {} expires soon: {}",
                String::from_utf8_lossy(&k),
                show(&cmd(a, &[b"DUMP", &k])),
                (0..10_000).contains(&ttl)
            ));
        }
    }
    all
}

#[test]
fn a_child_leaves_its_parents_permits_rw_locks_sets_and_fenced_locks_alone() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::new(cluster.urls()).expect("client");
    let ttl = Duration::from_secs(20);
    let sem = client.semaphore("audit:sem", 1).expect("semaphore");
    let permit = sem.try_acquire(ttl).expect("permit");
    let mut read = client.try_read_lock("audit:read", ttl).expect("read lock");
    let write = client
        .try_write_lock("audit:write", ttl)
        .expect("write lock");
    let write2 = client
        .try_write_lock("audit:write2", ttl)
        .expect("write lock");
    let mut all = client
        .try_lock_all(["audit:a", "audit:b"], ttl)
        .expect("lock all");
    let fenced = client.try_lock_fenced("audit:fenced", ttl).expect("fenced");
    thread::sleep(Duration::from_millis(100));
    let before = snapshot(&addrs);
    assert!(before.len() >= 6 * 3, "keys: {before:?}");

    let pid = fork_child(move || {
        let other = |r: Result<(), Error>| matches!(r, Err(Error::OtherProcess { .. }));
        let mut code = 0;
        if !other(permit.release()) {
            code |= 1;
        }
        if !other(read.extend(Duration::from_secs(1))) {
            code |= 2;
        }
        drop(read);
        if !other(write.downgrade().map(drop)) {
            code |= 4;
        }
        drop(write2);
        if !other(all.extend(Duration::from_secs(1))) {
            code |= 8;
        }
        if !other(all.release()) {
            code |= 16;
        }
        drop(fenced);
        drop(sem);
        // The child's own locks of every kind work, and are released.
        let own = client.semaphore("child:sem", 1).expect("semaphore");
        let ok = own.try_acquire(ttl).and_then(|p| p.release()).is_ok()
            && client
                .try_write_lock("child:write", ttl)
                .and_then(|w| w.downgrade())
                .and_then(|r| r.release())
                .is_ok()
            && client
                .try_lock_all(["child:a", "child:b"], ttl)
                .and_then(|m| m.release())
                .is_ok();
        if !ok {
            code |= 32;
        }
        if client.close().is_err() {
            code |= 64;
        }
        code
    });
    let code = wait_child(pid, Duration::from_secs(20));
    let after: Vec<String> = snapshot(&addrs)
        .into_iter()
        .filter(|k| !k.contains("child:"))
        .collect();
    let changed: Vec<_> = before.iter().filter(|k| !after.contains(k)).collect();
    assert!(
        changed.is_empty(),
        "the child changed its parent's keys: {changed:?}\nafter: {after:?}"
    );
    assert_eq!(
        code,
        Some(0),
        "the child's calls on inherited guards were not all refused with OtherProcess, or its \
         own failed (bits: 0 permit, 1 read extend, 2 downgrade, 3-4 lock_all, 5 own, 6 close)"
    );
    let leftover: Vec<_> = snapshot(&addrs)
        .into_iter()
        .filter(|k| k.contains("child:") && !k.contains("fence"))
        .collect();
    assert!(leftover.is_empty(), "the child left keys: {leftover:?}");
}

/// In a child: takes `key` for `ttl`, keeps it alive for three TTLs while checking every node
/// holds it, then releases it. 0 when it lived and was released; the report says what failed.
fn child_keeps_its_own(
    client: &Client,
    addrs: &[std::net::SocketAddr],
    key: &str,
) -> (i32, String) {
    let ttl = Duration::from_millis(2000);
    let (lost_tx, lost_rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    let kept = match client.try_lock(key, ttl) {
        Ok(lock) => match lock.keep_alive(KeepAlive::new(ttl).notify(lost_tx)) {
            Ok(kept) => kept,
            Err(e) => return (2, format!("keep_alive: {:?}", e.error)),
        },
        Err(e) => return (1, format!("try_lock: {e}")),
    };
    let token = kept.token().to_vec();
    // The lock returns at a quorum: the last node may take a moment more.
    let holds = |a| get(a, key.as_bytes()).as_deref() == Some(&token[..]);
    let settle = Instant::now() + Duration::from_secs(2);
    while !addrs.iter().all(|&a| holds(a)) && Instant::now() < settle {
        thread::sleep(Duration::from_millis(5));
    }
    let until = Instant::now() + ttl * 3;
    let mut expired = Vec::new();
    while Instant::now() < until {
        for (i, &a) in addrs.iter().enumerate() {
            if !holds(a) && !expired.contains(&i) {
                expired.push(i);
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    let lost = kept.is_lost();
    let released = kept.release();
    let notice = lost_rx
        .try_recv()
        .ok()
        .map(|l| format!("{} at {:?}", l.error, started.elapsed()));
    let said = format!(
        "expired on nodes {expired:?}, lost {lost} ({notice:?}), released {released:?}; {:?}",
        client.stats()
    );
    let code = if expired.is_empty() && !lost && released.is_ok() {
        0
    } else {
        3
    };
    (code, said)
}

#[test]
fn a_child_forked_while_its_parents_keeper_extends_keeps_its_own_locks() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(1500))
        .build()
        .expect("client");
    let ttl = Duration::from_secs(3);
    let kept = client
        .try_lock("kept:parent", ttl)
        .expect("lock")
        .keep_alive(KeepAlive::new(ttl))
        .expect("keep alive");
    let kept_at = Instant::now();
    // Nodes 0 and 1 stop before the first extension (due at 1 s): it is in flight, waiting
    // for them, when the child is forked.
    thread::sleep(Duration::from_millis(500));
    cluster.servers[0].pause().expect("SIGSTOP");
    cluster.servers[1].pause().expect("SIGSTOP");
    while kept_at.elapsed() < Duration::from_millis(1300) {
        thread::sleep(Duration::from_millis(10));
    }
    let report = std::env::temp_dir().join(format!("redlock-mux-midextend-{}", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let pid = fork_child(|| {
        let (code, said) = child_keeps_its_own(&client, &addrs, "kept:child");
        let _ = std::fs::write(&report, said);
        code
    });
    cluster.servers[0].resume().expect("SIGCONT");
    cluster.servers[1].resume().expect("SIGCONT");
    let code = wait_child(pid, Duration::from_secs(20));
    let said = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_file(&report);
    eprintln!("child: {code:?}: {said}");
    assert_eq!(
        code,
        Some(0),
        "a child forked while its parent's keeper extended did not keep its own lock: {said}"
    );
    assert!(!kept.is_lost(), "the parent's kept lock was lost");
    kept.release().expect("release the parent's lock");
}

#[test]
fn a_child_forked_from_a_lost_lock_callback_keeps_its_own_locks() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    // A loaded machine may take a while to set up the child's connections.
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(1000))
        .build()
        .expect("client");
    let ttl = Duration::from_secs(3);
    let report = std::env::temp_dir().join(format!("redlock-mux-onlost-{}", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let (tx, forked) = std::sync::mpsc::channel();
    let kept = {
        let client = client.clone();
        let addrs = addrs.clone();
        let report = report.clone();
        client
            .clone()
            .try_lock("lost:parent", ttl)
            .expect("lock")
            .keep_alive(KeepAlive::new(ttl).on_lost(move |_| {
                // On the keeper thread: the child is a copy of it.
                let pid = fork_child(|| {
                    let (code, said) = child_keeps_its_own(&client, &addrs, "lost:child");
                    let _ = std::fs::write(&report, said);
                    code
                });
                let _ = tx.send(pid);
            }))
            .expect("keep alive")
    };
    // Someone deletes the key: the next extension is refused, and the lock is lost.
    for &a in &addrs {
        cmd(a, &[b"DEL", b"lost:parent"]);
    }
    let pid = forked
        .recv_timeout(Duration::from_secs(10))
        .expect("the lost-lock callback ran");
    let code = wait_child(pid, Duration::from_secs(20));
    let said = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_file(&report);
    eprintln!("child: {code:?}: {said}");
    assert_eq!(
        code,
        Some(0),
        "a child forked from a lost-lock callback did not keep its own lock: {said}"
    );
    assert!(kept.is_lost());
    // The parent's keeper still works for new locks.
    let again = client
        .try_lock("lost:again", ttl)
        .expect("lock")
        .keep_alive(KeepAlive::new(ttl))
        .expect("keep alive");
    thread::sleep(Duration::from_millis(1500));
    assert!(!again.is_lost());
    again.release().expect("release");
}

#[test]
fn close_waits_for_the_node_when_the_leading_thread_returns_during_it() {
    let _serial = serial();
    let cluster = RedisCluster::start(3).expect("redis");
    let addrs = cluster.addrs();
    let client = Client::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(60))
        .build()
        .expect("client");
    let other = Client::new(cluster.urls()).expect("other client");
    let ttl = Duration::from_secs(30);
    let held = other.try_lock("busy", ttl).expect("lock busy");
    let lock = client.try_lock("slow", ttl).expect("lock slow");
    assert_settles!(get(addrs[0], b"slow").is_some());
    // The leader gives up its wait 300 ms after close() begins; node 0 answers at 1 s.
    let barrier = Arc::new(Barrier::new(2));
    let waiter = {
        let client = client.clone();
        let barrier = barrier.clone();
        thread::spawn(move || {
            barrier.wait();
            client.lock_with(
                "busy",
                ttl,
                &Acquire::new().timeout(Duration::from_millis(300)),
            )
        })
    };
    cluster.servers[0].pause().expect("SIGSTOP");
    lock.release()
        .expect("release at the quorum of the other two");
    let resumer = {
        let pid = cluster.servers[0].pid();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(1000));
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        })
    };
    barrier.wait();
    let cpu = cpu_time();
    let started = Instant::now();
    let outcome = client.clone().close();
    let waited = started.elapsed();
    let used = cpu_time().saturating_sub(cpu);
    resumer.join().unwrap();
    cluster.servers[0].resume().expect("SIGCONT");
    let left = waiter.join().unwrap();
    eprintln!("close(): {outcome:?} after {waited:?}, {used:?} of CPU; the waiter: {left:?}");
    assert!(left.is_err(), "the waiter got a held lock");
    assert!(
        outcome.is_ok() && waited >= Duration::from_millis(850) && waited < Duration::from_secs(10),
        "close() returned {outcome:?} after {waited:?}, though node 0 answers 1 s after the \
         release (the leading thread returned at 300 ms)"
    );
    assert!(
        used < Duration::from_millis(200),
        "close() used {used:?} of CPU in {waited:?}"
    );
    assert_eq!(get(addrs[0], b"slow"), None, "node 0 kept the released key");
    held.release().expect("release busy");
}
