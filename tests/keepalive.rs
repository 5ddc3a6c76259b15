//! Auto-extension against real redis-server processes: a kept lock outlives its TTL, a stolen
//! or unreachable one is reported lost, and `with_lock` holds the lock through its closure.

mod common;

use std::panic;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::{Client, Error, InvalidArgument, KeepAlive, KeptLock, Lock};

const KEY: &str = "keepalive:job";

fn client(cluster: &RedisCluster) -> Client {
    Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .expect("client")
}

/// Whether a second client, with its own connections, is refused the lock right now.
fn held(cluster: &RedisCluster) -> bool {
    matches!(
        client(cluster).try_lock(KEY, Duration::from_secs(1)),
        Err(Error::Contended { .. })
    )
}

/// How many nodes hold `key` with `token`, after checking that none holds it with any other
/// value. A kept lock is kept on a quorum: on a loaded machine one node's extension may come
/// after the key expired there, while the lock stays valid on the others.
fn holding(cluster: &RedisCluster, key: &[u8], token: &[u8]) -> usize {
    let values: Vec<Option<Vec<u8>>> = cluster
        .servers
        .iter()
        .map(|server| get(server.addr(), key))
        .collect();
    let holding = values.iter().flatten().filter(|v| *v == token).count();
    assert_eq!(
        holding,
        values.iter().flatten().count(),
        "another value of {key:?}: {values:?}"
    );
    holding
}

/// A majority of the test cluster's nodes.
fn quorum(cluster: &RedisCluster) -> usize {
    cluster.servers.len() / 2 + 1
}

#[test]
fn kept_lock_outlives_its_ttl_and_release_frees_it() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_millis(600);
    let kept = c
        .try_lock(KEY, ttl)
        .expect("lock")
        .keep_alive(KeepAlive::new(ttl))
        .expect("keep alive");
    // Five TTLs: without extensions the key would have expired four times over.
    for _ in 0..10 {
        thread::sleep(Duration::from_millis(300));
        assert!(!kept.is_lost());
        assert!(held(&cluster), "another client got a kept lock");
    }
    assert!(kept.validity() > Duration::ZERO);
    assert!(holding(&cluster, KEY.as_bytes(), kept.token()) >= quorum(&cluster));
    kept.release().expect("release");
    for server in &cluster.servers {
        assert_eq!(get(server.addr(), KEY.as_bytes()), None);
    }
    assert!(!held(&cluster));
}

#[test]
fn a_refused_extension_marks_the_lock_lost_and_notifies() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_secs(3);
    let (tx, lost) = mpsc::channel();
    let kept = c
        .try_lock(KEY, ttl)
        .expect("lock")
        .keep_alive(
            KeepAlive::new(ttl)
                .interval(Duration::from_millis(100))
                .notify(tx),
        )
        .expect("keep alive");
    // Someone (an operator, a bug) overwrites the key on every node.
    for server in &cluster.servers {
        set(server.addr(), KEY.as_bytes(), b"intruder");
    }
    let notice = lost
        .recv_timeout(Duration::from_secs(2))
        .expect("lost notice");
    assert_eq!(notice.key, KEY.as_bytes());
    assert!(
        matches!(notice.error, Error::Contended { .. }),
        "{:?}",
        notice.error
    );
    assert!(kept.is_lost());
    assert_eq!(kept.validity(), Duration::ZERO);
    // Releasing a lost lock leaves the other holder's key alone.
    kept.release().expect("release");
    for server in &cluster.servers {
        assert_eq!(
            get(server.addr(), KEY.as_bytes()).as_deref(),
            Some(&b"intruder"[..])
        );
    }
}

#[test]
fn validity_running_out_marks_the_lock_lost_and_calls_back() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(20))
        .build()
        .expect("client");
    let ttl = Duration::from_millis(800);
    let (tx, lost) = mpsc::channel();
    let kept = c
        .try_lock(KEY, ttl)
        .expect("lock")
        .keep_alive(
            KeepAlive::new(ttl)
                .retry(Duration::from_millis(50))
                .on_lost(move |notice| {
                    let _ = tx.send((Instant::now(), notice));
                }),
        )
        .expect("keep alive");
    // Every node stops answering: extensions cannot win, and the validity runs out.
    for server in &cluster.servers {
        server.pause().expect("pause");
    }
    let paused = Instant::now();
    let got = lost.recv_timeout(Duration::from_secs(3));
    for server in &cluster.servers {
        server.resume().expect("resume");
    }
    let (at, notice) = got.expect("lost notice");
    assert!(
        matches!(notice.error, Error::ValidityExpired { .. }),
        "{:?}",
        notice.error
    );
    assert!(kept.is_lost());
    // Lost no later than the TTL after the nodes went quiet, plus a retry and a node timeout.
    assert!(at.duration_since(paused) <= ttl + Duration::from_millis(500));
}

#[test]
fn with_lock_holds_the_lock_through_the_closure_and_releases_it() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_millis(500);
    let out = c
        .with_lock(KEY, ttl, |guard| {
            for _ in 0..6 {
                thread::sleep(Duration::from_millis(250));
                assert!(held(&cluster), "the lock was free during the closure");
            }
            assert_eq!(guard.key(), KEY.as_bytes());
            !guard.is_lost()
        })
        .expect("with_lock");
    assert!(out, "the lock was lost during the closure");
    for server in &cluster.servers {
        assert_eq!(get(server.addr(), KEY.as_bytes()), None);
    }
}

#[test]
fn many_guards_of_one_client_are_all_kept() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_millis(500);
    let guards: Vec<_> = (0..20)
        .map(|i| {
            c.try_lock(format!("keepalive:many:{i}"), ttl)
                .expect("lock")
                .keep_alive(KeepAlive::new(ttl))
                .expect("keep alive")
        })
        .collect();
    thread::sleep(Duration::from_millis(1500));
    for g in &guards {
        assert!(!g.is_lost());
        assert!(
            holding(&cluster, g.key(), g.token()) >= quorum(&cluster),
            "key expired"
        );
    }
    drop(guards);
    // Each drop returns once a quorum released; the last node may trail a little.
    let deadline = Instant::now() + Duration::from_secs(1);
    while dbsize(cluster.servers[0].addr()) != 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dbsize(cluster.servers[0].addr()), 0);
}

#[test]
fn kept_read_and_write_locks_outlive_their_ttl() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let other = client(&cluster);
    let ttl = Duration::from_millis(600);
    let rw_key = "keepalive:rw";
    let reader = c
        .try_read_lock(rw_key, ttl)
        .expect("read lock")
        .keep_alive(KeepAlive::new(ttl))
        .expect("keep alive");
    // Three TTLs: an unextended reader would have expired and let the writer in.
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(300));
        assert!(!reader.is_lost());
        assert!(
            matches!(
                other.try_write_lock(rw_key, ttl),
                Err(Error::Contended { .. })
            ),
            "a writer got in past a kept reader"
        );
    }
    reader.release().expect("release reader");
    let writer = c
        .try_write_lock(rw_key, ttl)
        .expect("write lock")
        .keep_alive(KeepAlive::new(ttl))
        .expect("keep alive");
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(300));
        assert!(!writer.is_lost());
        assert!(
            matches!(
                other.try_read_lock(rw_key, ttl),
                Err(Error::Contended { .. })
            ),
            "a reader got in past a kept writer"
        );
    }
    writer.release().expect("release writer");
    other
        .try_read_lock(rw_key, ttl)
        .expect("free after release")
        .release()
        .expect("release");
}

/// Settings that cannot keep the lock are refused at once, with the guard given back still
/// held; `?` turns the refusal into an `Error` and releases the guard.
#[test]
fn keep_alive_refuses_settings_that_cannot_keep_the_lock() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let ttl = Duration::from_secs(2);
    let mut lock = c.try_lock(KEY, ttl).expect("lock");
    let refusals = [
        // Not shorter than the validity an extension gives.
        KeepAlive::new(ttl).interval(ttl),
        KeepAlive::new(ttl).interval(Duration::ZERO),
        // A third of 3 ms is not shorter than the ~1 ms of validity it gives.
        KeepAlive::new(Duration::from_millis(3)),
        // Not above the drift allowance; too long for any node.
        KeepAlive::new(Duration::from_millis(2)),
        KeepAlive::new(Duration::MAX).interval(Duration::from_millis(10)),
    ];
    for settings in refusals {
        let what = format!("{settings:?}");
        let refused = lock.keep_alive(settings).expect_err(&what);
        assert!(
            matches!(refused.error, Error::InvalidArgument(_)),
            "{what}: {refused}"
        );
        lock = refused.into_inner();
        assert!(held(&cluster), "{what}: the refused guard was released");
    }
    let refused = lock
        .keep_alive(KeepAlive::new(ttl).interval(ttl * 2))
        .expect_err("refused");
    assert!(
        matches!(
            refused.error,
            Error::InvalidArgument(InvalidArgument::KeepAliveInterval { .. })
        ),
        "{refused}"
    );
    // With `?`, the guard is dropped with the refusal, and so released.
    let keep = |lock: Lock| -> Result<KeptLock, Error> {
        Ok(lock.keep_alive(KeepAlive::new(ttl).interval(ttl * 2))?)
    };
    let error = keep(refused.into_inner()).expect_err("refused");
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    assert!(!held(&cluster), "the guard was not released");

    // The read-write guards come back the same way.
    let reader = c.try_read_lock("keepalive:rw", ttl).expect("read lock");
    let reader = reader
        .keep_alive(KeepAlive::new(ttl).interval(ttl))
        .expect_err("refused")
        .into_inner();
    reader
        .keep_alive(KeepAlive::new(ttl))
        .expect("keep alive")
        .release()
        .expect("release");
    let writer = c.try_write_lock("keepalive:rw", ttl).expect("write lock");
    let writer = writer
        .keep_alive(KeepAlive::new(ttl).interval(Duration::ZERO))
        .expect_err("refused")
        .into_inner();
    writer.release().expect("release");

    // `with_lock` refuses a TTL it cannot keep before taking the lock.
    let out = c.with_lock("keepalive:never", Duration::from_millis(3), |_| ());
    assert!(
        matches!(
            out,
            Err(Error::InvalidArgument(
                InvalidArgument::KeepAliveInterval { .. }
            ))
        ),
        "{out:?}"
    );
    for server in &cluster.servers {
        assert_eq!(get(server.addr(), b"keepalive:never"), None);
    }
}

/// Freezes every node of `cluster` until dropped (SIGSTOP, then SIGCONT), also when a test
/// fails.
struct Frozen<'a>(&'a RedisCluster);

impl<'a> Frozen<'a> {
    fn new(cluster: &'a RedisCluster) -> Frozen<'a> {
        for s in &cluster.servers {
            s.pause().expect("SIGSTOP");
        }
        Frozen(cluster)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        for s in &self.0.servers {
            let _ = s.resume();
        }
    }
}

/// A 600 ms lock kept alive with a 6 s TTL: the default interval (2 s) is far longer than the
/// validity left, so the first extension must come by the validity, not by the interval.
#[test]
fn a_short_lock_kept_with_a_longer_ttl_is_extended_in_time() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let taken = Instant::now();
    let kept = c
        .try_lock(KEY, Duration::from_millis(600))
        .expect("lock")
        .keep_alive(KeepAlive::new(Duration::from_secs(6)))
        .expect("keep alive");
    for _ in 0..12 {
        thread::sleep(Duration::from_millis(100));
        if !held(&cluster) {
            panic!(
                "another client took the kept lock {:?} after it was taken; is_lost() = {}",
                taken.elapsed(),
                kept.is_lost()
            );
        }
        assert!(!kept.is_lost());
    }
    assert!(
        kept.validity() > Duration::from_secs(3),
        "{:?}",
        kept.validity()
    );
    kept.release().expect("release");
}

/// No extension can win (every node frozen): `is_lost` and `validity` tell the truth the
/// moment the validity ends, whether or not the keeper has run since.
#[test]
fn is_lost_turns_true_as_soon_as_the_validity_ends() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let lock = c.try_lock(KEY, Duration::from_millis(600)).expect("lock");
    let deadline = Instant::now() + lock.validity();
    let frozen = Frozen::new(&cluster);
    let kept = lock
        .keep_alive(KeepAlive::new(Duration::from_secs(6)))
        .expect("keep alive");
    assert!(!kept.is_lost());
    thread::sleep(deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(5));
    let (lost, left) = (kept.is_lost(), kept.validity());
    drop(frozen);
    assert!(
        lost && left.is_zero(),
        "validity over, yet is_lost() = {lost}, validity() = {left:?}"
    );
    assert!(kept.is_lost(), "once lost, always lost");
}

/// One keeper thread serves every kept lock of a client. While it waits on one lock's slow
/// round (every node frozen, a 2 s node timeout), another lock's validity runs out: its
/// `is_lost` must say so at once, not when the keeper comes back to it.
#[test]
fn a_busy_keeper_does_not_hide_a_lost_lock() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build()
        .expect("client");
    let slow = c
        .try_lock("keepalive:slow", Duration::from_secs(10))
        .expect("lock");
    let short = c.try_lock(KEY, Duration::from_millis(400)).expect("lock");
    let deadline = Instant::now() + short.validity();
    let frozen = Frozen::new(&cluster);
    // Due first: its round then holds the keeper for the 2 s node timeout.
    let slow = slow
        .keep_alive(KeepAlive::new(Duration::from_secs(10)).interval(Duration::from_millis(20)))
        .expect("keep alive");
    let short = short
        .keep_alive(KeepAlive::new(Duration::from_millis(400)))
        .expect("keep alive");
    thread::sleep(deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(5));
    let (lost, left) = (short.is_lost(), short.validity());
    drop(frozen);
    assert!(
        lost && left.is_zero(),
        "validity over, yet is_lost() = {lost}, validity() = {left:?}"
    );
    drop((slow, short));
}

/// A panicking `on_lost` callback must not take the keeper thread down: the other kept lock of
/// the same client is still extended, and its loss still reported.
#[test]
fn a_panicking_callback_does_not_stop_the_keeper() {
    // The panic is reported through the panic hook: record that it was. Any other panic goes
    // on to the hook in place (the test harness's). The planted one is not printed: with
    // RUST_BACKTRACE set, that hook resolves a backtrace on the keeper thread: 130 ms on an idle
    // machine, a good part of b's 600 ms TTL, and more under load (a full-suite run once lost
    // b, most likely that way). This test is about the keeper surviving the panic, not about
    // how fast a hook is.
    static REPORTED: AtomicBool = AtomicBool::new(false);
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let on_keeper = thread::current().name() == Some("redlock-mux-keeper");
        if on_keeper && info.to_string().contains("panics on purpose") {
            REPORTED.store(true, Ordering::SeqCst);
            eprintln!("the keeper reported the planted panic: {info}");
            return;
        }
        previous(info);
    }));
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let c = client(&cluster);
    let (a_key, b_key) = ("keepalive:panics", "keepalive:survives");
    let a = c
        .try_lock(a_key, Duration::from_secs(3))
        .expect("lock")
        .keep_alive(
            KeepAlive::new(Duration::from_secs(3))
                .interval(Duration::from_millis(50))
                .on_lost(|_| panic!("on_lost callback panics on purpose")),
        )
        .expect("keep alive");
    let ttl = Duration::from_millis(600);
    let (tx, b_lost) = mpsc::channel();
    let b = c
        .try_lock(b_key, ttl)
        .expect("lock")
        .keep_alive(KeepAlive::new(ttl).notify(tx))
        .expect("keep alive");
    // A's key is taken over on every node: its next extension is refused, its callback panics.
    for server in &cluster.servers {
        set(server.addr(), a_key.as_bytes(), b"intruder");
    }
    assert!(
        eventually(Duration::from_secs(3), || REPORTED.load(Ordering::SeqCst)),
        "a's callback never ran, or its panic was not reported"
    );
    assert!(a.is_lost());
    // Well past B's TTL: only the keeper can have kept it.
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(1500) {
        thread::sleep(Duration::from_millis(100));
        assert!(
            !b.is_lost(),
            "b was lost {:?} after a's callback panicked",
            since.elapsed()
        );
    }
    assert!(holding(&cluster, b_key.as_bytes(), b.token()) >= quorum(&cluster));
    // B's own loss is still noticed, and told.
    for server in &cluster.servers {
        set(server.addr(), b_key.as_bytes(), b"intruder");
    }
    let notice = b_lost
        .recv_timeout(Duration::from_secs(3))
        .expect("b's loss is reported");
    assert_eq!(notice.key, b_key.as_bytes());
    assert!(b.is_lost());
    drop((a, b));
}
