//! The Redlock mutex against real `redis-server` processes: quorum arithmetic, failed and
//! paused nodes, cleanup, contention between threads and between processes, extend, release
//! semantics, authentication and the NOSCRIPT fallback.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_mux::resp::{ServerErrorKind, Value};
use redlock_mux::{Client, Error, Lock, NodeErrorKind};

/// How long effects the library does not wait for (nodes outside the quorum, cleanup after a
/// lost attempt) may take to show up on a fresh connection. Generous: the machine is shared.
const SETTLE: Duration = Duration::from_secs(2);
/// Upper bound on a failed attempt against dead or frozen nodes. A liveness bound only: the
/// node timeout is 500 ms, so anything near this means the client waited for something else.
const FAIL_FAST: Duration = Duration::from_secs(3);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A client with a 500 ms node timeout (small, but with room for a busy shared machine) and
/// short retry delays.
fn fast_client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(ms(500))
        .retry_delay(ms(5))
        .build()
        .expect("valid client")
}

fn value(addr: SocketAddr, key: &str) -> Option<Vec<u8>> {
    get(addr, key.as_bytes())
}

/// Waits until `key` on `addr` holds `expected` (`None`: is absent).
fn settles_to(addr: SocketAddr, key: &str, expected: Option<&[u8]>) {
    let ok = eventually(SETTLE, || value(addr, key).as_deref() == expected);
    assert!(
        ok,
        "{key} on {addr}: {:?}, expected {:?}",
        value(addr, key).map(|v| String::from_utf8_lossy(&v).into_owned()),
        expected.map(String::from_utf8_lossy)
    );
}

/// Sets `key` to another holder's token on `addr`, with a 20 s expiry.
fn set_other(addr: SocketAddr, key: &str) {
    let reply = cmd(addr, &[b"SET", key.as_bytes(), b"other", b"PX", b"20000"]);
    assert_eq!(reply, Value::Simple(b"OK".to_vec()));
}

/// How many times `command` (lowercase) has run on `addr`, from `INFO commandstats`.
fn calls(addr: SocketAddr, command: &str) -> u64 {
    let Value::Bulk(Some(info)) = cmd(addr, &[b"INFO", b"commandstats"]) else {
        panic!("INFO commandstats on {addr}");
    };
    let prefix = format!("cmdstat_{command}:calls=");
    String::from_utf8(info)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Script runs (`EVAL` + `EVALSHA`) on `addr` so far.
fn script_runs(addr: SocketAddr) -> u64 {
    calls(addr, "eval") + calls(addr, "evalsha")
}

/// Waits until every node has run more scripts than `before` says: the release or cleanup the
/// client sent without waiting for every node has been processed everywhere.
fn scripts_landed(addrs: &[SocketAddr], before: &[u64]) {
    for (i, &addr) in addrs.iter().enumerate() {
        assert!(
            eventually(SETTLE, || script_runs(addr) > before[i]),
            "node {i} never ran the script"
        );
    }
}

fn all_script_runs(addrs: &[SocketAddr]) -> Vec<u64> {
    addrs.iter().map(|&a| script_runs(a)).collect()
}

/// Node indices set in `mask`.
fn members(mask: u32, n: usize) -> Vec<usize> {
    (0..n).filter(|i| mask >> i & 1 == 1).collect()
}

// ---------------------------------------------------------------------------------------------
// 1 and 9: quorum matrix

/// For every subset S of nodes held by someone else, `try_lock` wins exactly when the nodes
/// outside S are a quorum; winning sets our token on every node outside S and releasing
/// removes only ours; losing leaves none of ours anywhere and the other holder untouched.
fn quorum_matrix(n: usize) {
    let cluster = RedisCluster::start(n).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let quorum = n / 2 + 1;
    assert_eq!(client.nodes(), n);
    assert_eq!(client.quorum(), quorum);
    for mask in 0u32..(1 << n) {
        let key = format!("matrix:{n}:{mask}");
        let held = members(mask, n);
        for &i in &held {
            set_other(addrs[i], &key);
        }
        let should_win = n - held.len() >= quorum;
        let before = all_script_runs(&addrs);
        match client.try_lock(&key, Duration::from_secs(10)) {
            Ok(lock) => {
                assert!(should_win, "n={n} held={held:?}: won without a quorum");
                assert!(lock.validity() > Duration::from_secs(5));
                let token = lock.token().to_vec();
                for (i, &addr) in addrs.iter().enumerate() {
                    let expected: &[u8] = if held.contains(&i) { b"other" } else { &token };
                    settles_to(addr, &key, Some(expected));
                }
                lock.release().expect("release");
            }
            Err(e) => {
                assert!(!should_win, "n={n} held={held:?}: lost with a quorum: {e}");
                match &e {
                    Error::Contended {
                        refused,
                        nodes,
                        failures,
                    } => {
                        // The attempt ends as soon as a quorum is out of reach, so the nodes
                        // still unheard from may not be counted.
                        assert!(*refused > n - quorum && *refused <= held.len(), "{e}");
                        assert_eq!(*nodes, n, "{e}");
                        assert!(failures.is_empty(), "{e}");
                    }
                    other => panic!("n={n} held={held:?}: expected Contended, got {other:?}"),
                }
                assert!(e.is_contended());
            }
        }
        // Released, or cleaned up after the lost attempt, on every node: none of ours is left,
        // and the other holder's keys are untouched.
        scripts_landed(&addrs, &before);
        for (i, &addr) in addrs.iter().enumerate() {
            if !held.contains(&i) {
                assert_settles_eq!(value(addr, &key), None, "node {i} n={n} held={held:?}");
            }
        }
        for &i in &held {
            assert_eq!(value(addrs[i], &key).as_deref(), Some(&b"other"[..]));
            assert!(pttl(addrs[i], key.as_bytes()) > 0);
        }
    }
}

#[test]
fn quorum_matrix_1_node() {
    quorum_matrix(1);
}

#[test]
fn quorum_matrix_3_nodes() {
    quorum_matrix(3);
}

#[test]
fn quorum_matrix_5_nodes() {
    quorum_matrix(5);
}

#[test]
fn even_node_counts_need_more_than_half() {
    for n in [2, 4] {
        quorum_matrix(n);
    }
    // 4 nodes survive one failure, not two: quorum 3.
    let mut cluster = RedisCluster::start(4).expect("start redis-server");
    let client = fast_client(&cluster.urls());
    assert_eq!(client.quorum(), 3);
    cluster.servers[0].kill().expect("kill");
    client
        .try_lock("even", Duration::from_secs(5))
        .expect("3 of 4 alive")
        .release()
        .expect("release");
    cluster.servers[1].kill().expect("kill");
    match client.try_lock("even", Duration::from_secs(5)) {
        Err(Error::QuorumUnreachable {
            quorum: 3,
            nodes: 4,
            failures,
        }) => {
            let dead: Vec<usize> = failures.iter().map(|f| f.node).collect();
            assert_eq!(dead, [0, 1]);
        }
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// 2: killed and paused nodes

/// Asserts `e` is `QuorumUnreachable` naming exactly `nodes`, each failure accepted by `kind_ok`.
fn assert_unreachable(
    e: &Error,
    n: usize,
    nodes: &[usize],
    kind_ok: impl Fn(usize, &NodeErrorKind) -> bool,
) {
    match e {
        Error::QuorumUnreachable {
            quorum,
            nodes: total,
            failures,
        } => {
            assert_eq!((*quorum, *total), (n / 2 + 1, n), "{e}");
            let failed: Vec<usize> = failures.iter().map(|f| f.node).collect();
            assert_eq!(failed, nodes, "{e}");
            for f in failures {
                assert!(
                    kind_ok(f.node, &f.kind),
                    "node {}: {:?} ({e})",
                    f.node,
                    f.kind
                );
                assert!(e.to_string().contains(&f.addr), "{e}");
            }
        }
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
}

fn is_broken(kind: &NodeErrorKind) -> bool {
    matches!(kind, NodeErrorKind::Connect(_) | NodeErrorKind::Io(_))
}

/// Locks `key`, then waits until every node in `nodes` holds our token; releases. Retries for up
/// to 5 s, for nodes that are coming back.
fn lock_reaches(client: &Client, addrs: &[SocketAddr], nodes: &[usize], key: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    for attempt in 0.. {
        if Instant::now() >= deadline {
            return false;
        }
        let key = format!("{key}:{attempt}");
        if let Ok(lock) = client.try_lock(&key, Duration::from_secs(5)) {
            let token = lock.token().to_vec();
            let everywhere = nodes.iter().all(|&i| {
                eventually(ms(200), || {
                    value(addrs[i], &key).as_deref() == Some(&token[..])
                })
            });
            lock.release().expect("release");
            if everywhere {
                return true;
            }
        }
        thread::sleep(ms(50));
    }
    unreachable!()
}

/// How a node is taken out in [`nodes_out`].
#[derive(Clone, Copy, PartialEq)]
enum Out {
    /// kill -9: connections break, then connects are refused.
    Killed,
    /// SIGSTOP: connections stay open and nothing answers, so the per-node timeout applies.
    Paused,
}

/// Takes out all the nodes a quorum can spare: acquisition still succeeds. Takes out one
/// more: it fails fast, naming every node taken out with a fitting error. Brings them back:
/// the client finds them again by itself, and nothing is left behind.
fn nodes_out(n: usize, out: Out) {
    let mut cluster = RedisCluster::start(n).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let spare = n - (n / 2 + 1);
    // Open every connection first, so the faults below hit live connections.
    client
        .try_lock("warm", Duration::from_secs(5))
        .expect("all alive")
        .release()
        .expect("release");
    for server in &mut cluster.servers[..spare] {
        take_out(server, out);
    }
    let lock = client
        .try_lock("alive-quorum", Duration::from_secs(5))
        .expect("a quorum is alive");
    lock.release().expect("release with a quorum alive");

    take_out(&mut cluster.servers[spare], out);
    let gone: Vec<usize> = (0..=spare).collect();
    for attempt in 0..2 {
        // Killed: the first attempt meets broken connections, the second refused connects (or
        // backoff after them). Paused: both time out. Either way the nodes are named.
        let started = Instant::now();
        let e = client
            .try_lock("too-few", Duration::from_secs(5))
            .expect_err("too few alive");
        assert!(
            started.elapsed() < FAIL_FAST,
            "attempt {attempt} took {:?}",
            started.elapsed()
        );
        match out {
            Out::Killed => assert_unreachable(&e, n, &gone, |_, k| is_broken(k)),
            Out::Paused => assert_unreachable(&e, n, &gone, |_, k| *k == NodeErrorKind::Timeout),
        }
    }

    for server in &mut cluster.servers[..=spare] {
        match out {
            Out::Killed => server.restart().expect("restart"),
            Out::Paused => server.resume().expect("resume"),
        }
    }
    // Killed nodes lost everything; paused ones process what was queued to them, cleanup
    // included. Either way nothing of these attempts is left.
    let checked = match out {
        Out::Killed => &addrs[spare + 1..],
        Out::Paused => &addrs[..],
    };
    for &addr in checked {
        settles_to(addr, "too-few", None);
        settles_to(addr, "alive-quorum", None);
    }
    // The client reconnects without help, and the nodes vote again.
    let all: Vec<usize> = (0..n).collect();
    assert!(
        lock_reaches(&client, &addrs, &all, "after-return"),
        "returning nodes never got the lock"
    );
}

fn take_out(server: &mut RedisServer, out: Out) {
    match out {
        Out::Killed => server.kill().expect("kill"),
        Out::Paused => server.pause().expect("pause"),
    }
}

#[test]
fn killed_nodes_3() {
    nodes_out(3, Out::Killed);
}

#[test]
fn killed_nodes_5() {
    nodes_out(5, Out::Killed);
}

#[test]
fn paused_nodes_3() {
    nodes_out(3, Out::Paused);
}

#[test]
fn paused_nodes_5() {
    nodes_out(5, Out::Paused);
}

#[test]
fn killed_and_paused_nodes_5() {
    let mut cluster = RedisCluster::start(5).expect("start redis-server");
    let client = fast_client(&cluster.urls());
    client
        .try_lock("warm", Duration::from_secs(5))
        .expect("all alive")
        .release()
        .expect("release");
    cluster.servers[0].kill().expect("kill");
    cluster.servers[1].pause().expect("pause");
    cluster.servers[2].pause().expect("pause");
    let started = Instant::now();
    let e = client
        .try_lock("mixed", Duration::from_secs(5))
        .expect_err("only 2 of 5 answer");
    assert!(
        started.elapsed() < FAIL_FAST,
        "took {:?}",
        started.elapsed()
    );
    assert_unreachable(&e, 5, &[0, 1, 2], |node, k| match node {
        0 => is_broken(k),
        _ => *k == NodeErrorKind::Timeout,
    });
    cluster.servers[1].resume().expect("resume");
    cluster.servers[2].resume().expect("resume");
    // The resumed nodes still owe the client the replies of the timed-out round, and until
    // they answer, the slow-node breaker keeps new acquisitions off them (they count as timed
    // out at once). On a loaded machine a resumed server may take a moment to be scheduled:
    // the client must take the lock again as soon as they have answered, not at once.
    let mut last = None;
    let back = eventually(Duration::from_secs(5), || {
        match client.try_lock("mixed", Duration::from_secs(5)) {
            Ok(g) => {
                g.release().expect("release");
                true
            }
            Err(e) => {
                last = Some(e);
                false
            }
        }
    });
    assert!(back, "4 of 5 answer again, yet: {last:?}");
}

/// A release written to nodes that then die (their connections reset, every reconnect
/// refused) returns, failed, within its node timeout: it does not wait for as long as the
/// release is kept to send again (the lock's TTL).
#[test]
fn a_release_whose_nodes_die_under_it_returns() {
    let mut cluster = RedisCluster::start(3).expect("start redis-server");
    let client = fast_client(&cluster.urls());
    let guard = client
        .try_lock("dies", Duration::from_secs(60))
        .expect("all alive");
    cluster.servers[1].pause().expect("pause");
    cluster.servers[2].pause().expect("pause");
    let (done, outcome) = std::sync::mpsc::channel();
    let releasing = std::thread::spawn(move || {
        let started = Instant::now();
        let result = guard.release();
        let _ = done.send((result, started.elapsed()));
    });
    // The release is written to nodes 1 and 2 and waits for them; they die.
    std::thread::sleep(ms(100));
    cluster.servers[1].kill().expect("kill");
    cluster.servers[2].kill().expect("kill");
    let (result, took) = outcome
        .recv_timeout(Duration::from_secs(10))
        .expect("release() still waits 10 s after its nodes died");
    releasing.join().expect("the releasing thread");
    assert!(
        matches!(result, Err(Error::QuorumUnreachable { .. })),
        "{result:?}"
    );
    assert!(took < FAIL_FAST, "took {took:?}");
}

// ---------------------------------------------------------------------------------------------
// 3: no leftovers

#[test]
fn no_keys_left_after_release_or_lost_attempts() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = Client::builder()
        .nodes(cluster.urls())
        .node_timeout(ms(500))
        .retry_delay(ms(5))
        .retry_count(3)
        .build()
        .unwrap();

    for i in 0..20 {
        let lock = client
            .lock(format!("job:{i}"), Duration::from_secs(10))
            .unwrap();
        lock.release().unwrap();
    }
    for &addr in &addrs {
        assert!(eventually(SETTLE, || dbsize(addr) == 0), "{:?}", keys(addr));
    }

    // Someone else holds "held" on a quorum (nodes 0 and 1); node 2 is free, so each attempt
    // sets our token there and must clean it up.
    for &addr in &addrs[..2] {
        set_other(addr, "held");
    }
    let e = client
        .try_lock("held", Duration::from_secs(10))
        .unwrap_err();
    assert!(e.is_contended(), "{e}");
    let e = client.lock("held", Duration::from_secs(10)).unwrap_err();
    assert!(e.is_contended(), "{e}");
    assert!(
        eventually(SETTLE, || dbsize(addrs[2]) == 0),
        "{:?}",
        keys(addrs[2])
    );
    for &addr in &addrs[..2] {
        assert_settles_eq!(keys(addr), [b"held".to_vec()]);
        assert_settles_eq!(value(addr, "held").as_deref(), Some(&b"other"[..]));
    }
}

// ---------------------------------------------------------------------------------------------
// 4 and 5: contention

/// A client for many contenders: long node timeout (the machine is busy), fast retries, and a
/// bounded wait.
fn contender(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(ms(500))
        .retry_delay(ms(5))
        .retry_count(100_000)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .expect("valid client")
}

const COUNTER_KEY: &str = "contention";

/// `iterations` times: lock, read the counter on `counter_at`, write it back plus one, release.
/// A lost update would show as a final count below the total.
fn increment_under_lock(client: &Client, counter_at: SocketAddr, iterations: usize) {
    for i in 0..iterations {
        let lock = client
            .lock(COUNTER_KEY, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("iteration {i}: {e}"));
        let n: u64 = get(counter_at, b"counter")
            .map(|v| String::from_utf8(v).unwrap().parse().unwrap())
            .unwrap_or(0);
        set(counter_at, b"counter", (n + 1).to_string().as_bytes());
        assert!(lock.validity() > Duration::ZERO, "lock ran out mid-update");
        lock.release()
            .unwrap_or_else(|e| panic!("iteration {i}: {e}"));
    }
}

fn counter(addr: SocketAddr) -> u64 {
    get(addr, b"counter").map_or(0, |v| String::from_utf8(v).unwrap().parse().unwrap())
}

#[test]
fn contention_threads_one_client() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let at = cluster.addrs()[0];
    let client = contender(&cluster.urls());
    let (threads, iterations) = (8, 50);
    thread::scope(|s| {
        for _ in 0..threads {
            let client = client.clone();
            s.spawn(move || increment_under_lock(&client, at, iterations));
        }
    });
    assert_eq!(counter(at), (threads * iterations) as u64);
}

#[test]
fn contention_threads_separate_clients() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let at = cluster.addrs()[0];
    let urls = cluster.urls();
    let (threads, iterations) = (4, 50);
    thread::scope(|s| {
        for _ in 0..threads {
            let client = contender(&urls);
            s.spawn(move || increment_under_lock(&client, at, iterations));
        }
    });
    assert_eq!(counter(at), (threads * iterations) as u64);
}

/// Set in a child process of [`contention_processes`]: the node URLs, comma-separated.
const CHILD_NODES_ENV: &str = "REDLOCK_MUX_TEST_CHILD_NODES";
const CHILD_ITERATIONS: usize = 40;
const CHILDREN: usize = 4;

#[test]
fn contention_processes() {
    if let Ok(nodes) = std::env::var(CHILD_NODES_ENV) {
        // Child mode: run the loop against the parent's servers.
        let urls: Vec<String> = nodes.split(',').map(str::to_owned).collect();
        let at = urls[0]
            .trim_start_matches("redis://")
            .parse()
            .expect("node address");
        increment_under_lock(&contender(&urls), at, CHILD_ITERATIONS);
        return;
    }
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let exe = std::env::current_exe().expect("test binary");
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "contention_processes", "--nocapture"])
                .env(CHILD_NODES_ENV, cluster.urls().join(","))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut statuses = Vec::new();
    while let Some(mut child) = children.pop() {
        loop {
            if let Some(status) = child.try_wait().expect("wait child") {
                statuses.push(status);
                break;
            }
            if Instant::now() >= deadline {
                // Only our own children, by their handles.
                let _ = child.kill();
                for c in &mut children {
                    let _ = c.kill();
                }
                panic!("child processes still running after 60 s");
            }
            thread::sleep(ms(20));
        }
    }
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
    assert_eq!(
        counter(cluster.addrs()[0]),
        (CHILDREN * CHILD_ITERATIONS) as u64
    );
}

// ---------------------------------------------------------------------------------------------
// 6: extend

#[test]
fn extend_keeps_the_key_past_the_original_ttl() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let mut lock = client.try_lock("ext", ms(300)).expect("lock");
    let before = lock.validity();
    assert!(before <= ms(300));
    lock.extend(Duration::from_secs(2)).expect("extend");
    let after = lock.validity();
    assert!(
        after > before && after > Duration::from_secs(1),
        "{after:?}"
    );
    thread::sleep(ms(600));
    let token = lock.token().to_vec();
    for &addr in &addrs {
        assert_settles_eq!(value(addr, "ext").as_deref(), Some(&token[..]));
        assert_settles!(pttl(addr, b"ext") > 0);
    }
    assert!(lock.validity() > Duration::ZERO);
    lock.release().expect("release");
    for &addr in &addrs {
        settles_to(addr, "ext", None);
    }
}

#[test]
fn extend_after_validity_ran_out_is_refused() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let client = fast_client(&cluster.urls());
    let mut lock = client.try_lock("late", ms(100)).expect("lock");
    thread::sleep(ms(200));
    assert_eq!(lock.validity(), Duration::ZERO);
    match lock.extend(Duration::from_secs(5)) {
        Err(Error::ValidityExpired { .. }) => {}
        other => panic!("expected ValidityExpired, got {other:?}"),
    }
}

#[test]
fn failed_extend_deletes_nothing() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let mut lock = client
        .try_lock("lost", Duration::from_secs(5))
        .expect("lock");
    let token = lock.token().to_vec();
    for &addr in &addrs {
        settles_to(addr, "lost", Some(&token));
    }
    // Our key vanishes on a quorum; node 1 gets another holder's key.
    cmd(addrs[0], &[b"DEL", b"lost"]);
    cmd(addrs[1], &[b"DEL", b"lost"]);
    set_other(addrs[1], "lost");
    let validity = lock.validity();
    let e = lock.extend(Duration::from_secs(10)).expect_err("extend");
    assert!(e.is_contended(), "{e}");
    assert!(
        lock.validity() <= validity,
        "a failed extend grew the validity"
    );
    assert_eq!(value(addrs[0], "lost"), None);
    assert_eq!(value(addrs[1], "lost").as_deref(), Some(&b"other"[..]));
    assert_eq!(value(addrs[2], "lost").as_deref(), Some(&token[..]));
    assert!(pttl(addrs[2], b"lost") > 0);
}

// ---------------------------------------------------------------------------------------------
// 7: release after expiry

#[test]
fn release_after_expiry_leaves_the_next_holder_alone() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let a = client.try_lock("shared", ms(100)).expect("lock A");
    thread::sleep(ms(200));
    let b = client
        .try_lock("shared", Duration::from_secs(10))
        .expect("lock B after A expired");
    let b_token = b.token().to_vec();
    for &addr in &addrs {
        settles_to(addr, "shared", Some(&b_token));
    }
    let before = all_script_runs(&addrs);
    a.release().expect("late release is acknowledged");
    scripts_landed(&addrs, &before);
    for &addr in &addrs {
        assert_settles_eq!(value(addr, "shared").as_deref(), Some(&b_token[..]));
    }
    b.release().expect("release B");
    for &addr in &addrs {
        settles_to(addr, "shared", None);
    }
}

// ---------------------------------------------------------------------------------------------
// 8: drop, Send/Sync, parallel holders

const _: () = {
    const fn send<T: Send>() {}
    const fn send_sync_clone<T: Send + Sync + Clone>() {}
    send::<Lock>();
    send_sync_clone::<Client>();
};

#[test]
fn dropping_a_lock_releases_it() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    {
        let lock = client.try_lock("dropped", Duration::from_secs(10)).unwrap();
        for &addr in &addrs {
            settles_to(addr, "dropped", Some(lock.token()));
        }
    }
    for &addr in &addrs {
        settles_to(addr, "dropped", None);
    }
    // A lock moved to another thread and dropped there is released too.
    let lock = client.try_lock("moved", Duration::from_secs(10)).unwrap();
    thread::spawn(move || drop(lock)).join().unwrap();
    for &addr in &addrs {
        settles_to(addr, "moved", None);
    }
    client.try_lock("dropped", Duration::from_secs(1)).unwrap();
}

#[test]
fn two_threads_hold_locks_at_the_same_time() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let holding = Arc::new(AtomicUsize::new(0));
    let addrs = &addrs;
    thread::scope(|s| {
        for t in 0..2 {
            let (client, holding) = (client.clone(), holding.clone());
            s.spawn(move || {
                let key = format!("parallel:{t}");
                let lock = client.try_lock(&key, Duration::from_secs(10)).unwrap();
                holding.fetch_add(1, Ordering::SeqCst);
                let both = eventually(Duration::from_secs(5), || {
                    holding.load(Ordering::SeqCst) == 2
                });
                assert!(both, "the other thread never held its lock alongside");
                for &addr in addrs {
                    settles_to(addr, &key, Some(lock.token()));
                }
                lock.release().unwrap();
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 10: AUTH and SELECT

#[test]
fn password_and_database_from_the_url() {
    let server = RedisServer::start_with(&["--requirepass", "pw"]).expect("start redis-server");
    let addr = server.addr();
    let url = format!("redis://:pw@{addr}/2");
    let client = Client::builder()
        .nodes([&url])
        .node_timeout(ms(500))
        .build()
        .unwrap();
    let lock = client.try_lock("authed", Duration::from_secs(10)).unwrap();
    let replies = cmds(
        addr,
        &[
            &[b"AUTH", b"pw"],
            &[b"GET", b"authed"],
            &[b"SELECT", b"2"],
            &[b"GET", b"authed"],
        ],
    );
    assert_eq!(replies[1], Value::Bulk(None), "key must not be in db 0");
    assert_eq!(replies[3], Value::Bulk(Some(lock.token().to_vec())));
    lock.release().unwrap();
    let replies = cmds(addr, &[&[b"AUTH", b"pw"], &[b"SELECT", b"2"], &[b"DBSIZE"]]);
    assert_eq!(replies[2], Value::Integer(0));

    // A wrong password is a typed configuration error naming the node, from `build` itself.
    let e = Client::builder()
        .nodes([format!("redis://:nope@{addr}/2")])
        .node_timeout(ms(500))
        .build()
        .unwrap_err();
    match e.failures() {
        [f] => {
            assert_eq!((f.node, f.addr.as_str()), (0, addr.to_string().as_str()));
            assert!(
                matches!(
                    &f.kind,
                    NodeErrorKind::Setup { command: "AUTH", cause }
                        if matches!(**cause, NodeErrorKind::Server { kind: ServerErrorKind::WrongPass, .. })
                ),
                "{:?}",
                f.kind
            );
        }
        other => panic!("expected one failure, got {other:?} ({e})"),
    }
    assert!(matches!(e, Error::Config { .. }), "{e}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    // Missing the password entirely: NOAUTH, shown by the setup.
    let e = Client::builder()
        .nodes([server.url()])
        .node_timeout(ms(500))
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e.failures(),
            [f] if matches!(&f.kind, NodeErrorKind::Setup { cause, .. }
                if matches!(**cause, NodeErrorKind::Server { kind: ServerErrorKind::NoAuth, .. }))
        ),
        "{e:?}"
    );
    assert!(e.is_config(), "{e}");
}

#[test]
fn acl_user_from_the_url() {
    let server = RedisServer::start_with(&["--requirepass", "pw"]).expect("start redis-server");
    let addr = server.addr();
    let reply = cmd_auth(
        addr,
        "pw",
        &[
            b"ACL", b"SETUSER", b"app", b"on", b">apppw", b"~*", b"+@all",
        ],
    );
    assert_eq!(reply, Value::Simple(b"OK".to_vec()));
    let client = Client::builder()
        .nodes([format!("redis://app:apppw@{addr}")])
        .node_timeout(ms(500))
        .build()
        .unwrap();
    let mut lock = client.try_lock("acl", Duration::from_secs(10)).unwrap();
    assert_eq!(
        cmd_auth(addr, "pw", &[b"GET", b"acl"]),
        Value::Bulk(Some(lock.token().to_vec()))
    );
    lock.extend(Duration::from_secs(20)).expect("extend");
    lock.release().expect("release");
    assert_eq!(cmd_auth(addr, "pw", &[b"DBSIZE"]), Value::Integer(0));
}

// ---------------------------------------------------------------------------------------------
// 11: NOSCRIPT fallback

#[test]
fn release_survives_script_flush() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    for round in 0..20 {
        let key = format!("flushed:{round}");
        let lock = client.try_lock(&key, Duration::from_secs(10)).unwrap();
        for &addr in &addrs {
            settles_to(addr, &key, Some(lock.token()));
            assert_settles_eq!(
                cmd(addr, &[b"SCRIPT", b"FLUSH"]),
                Value::Simple(b"OK".to_vec())
            );
        }
        lock.release().expect("release after SCRIPT FLUSH");
        for &addr in &addrs {
            settles_to(addr, &key, None);
        }
    }
}

#[test]
fn release_and_extend_survive_script_flush() {
    let cluster = RedisCluster::start(3).expect("start redis-server");
    let addrs = cluster.addrs();
    let client = fast_client(&cluster.urls());
    let mut lock = client.try_lock("flushed", Duration::from_secs(10)).unwrap();
    let evals: Vec<u64> = addrs.iter().map(|&a| calls(a, "eval")).collect();
    for &addr in &addrs {
        assert_settles_eq!(
            cmd(addr, &[b"SCRIPT", b"FLUSH"]),
            Value::Simple(b"OK".to_vec())
        );
    }
    lock.extend(Duration::from_secs(20))
        .expect("extend after SCRIPT FLUSH");
    for &addr in &addrs {
        assert!(eventually(SETTLE, || pttl(addr, b"flushed") > 10_000));
        assert_settles_eq!(
            cmd(addr, &[b"SCRIPT", b"FLUSH"]),
            Value::Simple(b"OK".to_vec())
        );
    }
    lock.release().expect("release after SCRIPT FLUSH");
    for (i, &addr) in addrs.iter().enumerate() {
        settles_to(addr, "flushed", None);
        // The fallback really went through EVAL (once for extend, once for release).
        assert!(
            eventually(SETTLE, || calls(addr, "eval") >= evals[i] + 2),
            "node {i}: EVAL calls {} -> {}",
            evals[i],
            calls(addr, "eval")
        );
    }
}
