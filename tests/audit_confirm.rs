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
    let mut last = String::new();
    let granted = eventually(Duration::from_secs(10), || match c.try_lock(key, TTL) {
        Ok(lock) => lock.release().is_ok(),
        Err(e) => {
            last = format!("{e:?}");
            false
        }
    });
    assert!(granted, "no grant within 10 s: {last}");
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

/// A master of `program` (with a linked replica if `replica`), with `args` on both.
fn pair_of(program: &std::path::Path, args: &[&str], replica: bool) -> Vec<RedisServer> {
    let mut m = vec!["--repl-diskless-sync-delay", "0"];
    m.extend(args);
    let master = RedisServer::start_program(program, &m).expect("master");
    if !replica {
        return vec![master];
    }
    let port = master.port().to_string();
    let mut r = vec!["--replicaof", "127.0.0.1", &port];
    r.extend(args);
    let replica = RedisServer::start_program(program, &r).expect("replica");
    assert_settles!(
        matches!(
            cmd(master.addr(), &[b"INFO", b"replication"]),
            Value::Bulk(Some(text)) if String::from_utf8_lossy(&text).contains("state=online")
        ),
        "the replica of {} is linked",
        master.addr()
    );
    vec![master, replica]
}

/// Members whose replicas (or fsyncs) can never say enough: `?wait=2` on one replica,
/// `?waitaof=1,0` without an append-only file, `?waitaof=1,1` with the replica paused.
/// Lost attempts there leave nothing on the master, their cleanups are kept, and the idle
/// client does not spin on its own waits (its CPU time over 3 s next to a plain client's);
/// `close` is bounded (2 s without progress) and says what it could not confirm.
#[test]
fn short_counts_leave_nothing_and_do_not_spin() {
    let Some(program) = redis8_program() else {
        println!("skipped: WAITAOF needs Redis >= 7.2 and no Redis 8 binary is here (.ci/redis8)");
        return;
    };
    let idle = |c: &redlock_mux::Client, name: &str| {
        let cpu0 = cpu_time();
        std::thread::sleep(Duration::from_secs(3));
        let used = cpu_time() - cpu0;
        println!("{name}: CPU time over 3 s idle: {used:?}");
        let _ = c;
        used
    };
    // The baseline: a plain member, the same lost attempts (keys held by another client).
    let plain_servers = pair_of(&program, &[], false);
    let plain = one_try_client(&[plain_servers[0].url()], ms(400));
    let other = one_try_client(&[plain_servers[0].url()], ms(400));
    let held = other.try_lock("audit:short:0", TTL).expect("held");
    for _ in 0..5 {
        assert!(plain.try_lock("audit:short:0", TTL).is_err());
    }
    let base = idle(&plain, "plain");
    held.release().expect("release");
    let cases: [(&str, &[&str], bool, bool); 3] = [
        ("?wait=2", &[], true, false),
        ("?waitaof=1,0", &[], false, false),
        (
            "?waitaof=1,1",
            &["--appendonly", "yes", "--appendfsync", "always"],
            true,
            true,
        ),
    ];
    let mut spun = Vec::new();
    let mut dishonest = Vec::new();
    for (query, args, replica, pause) in cases {
        let servers = pair_of(&program, args, replica);
        let timeout = if pause { ms(1500) } else { ms(400) };
        let c = one_try_client(&[format!("{}{query}", servers[0].url())], timeout);
        if pause {
            warm(&c, "audit:short:warm");
            servers[1].pause().expect("pause");
        }
        for i in 0..5 {
            let started = Instant::now();
            let got = c.try_lock(format!("audit:short:{i}"), TTL);
            assert!(got.is_err(), "{query}: a grant counted");
            assert!(
                started.elapsed() < timeout * 3,
                "{query}: {:?}",
                started.elapsed()
            );
        }
        let left = eventually(Duration::from_secs(5), || dbsize(servers[0].addr()) == 0);
        let used = idle(&c, query);
        let started = Instant::now();
        let closed = c.clone().close();
        let took = started.elapsed();
        println!("{query}: close {closed:?} in {took:?}");
        if pause {
            servers[1].resume().expect("resume");
        }
        assert!(left, "{query}: keys left {:?}", keys(servers[0].addr()));
        assert!(
            took < Duration::from_secs(4),
            "{query}: close took {took:?}"
        );
        if used > base + ms(200) {
            spun.push(format!("{query}: {used:?} (plain {base:?})"));
        }
        if closed.is_ok() {
            dishonest.push(format!("{query}: close said Ok"));
        }
    }
    assert!(spun.is_empty(), "idle clients spun: {spun:?}");
    assert!(
        dishonest.is_empty(),
        "cleanups no replica confirmed reported delivered: {dishonest:?}"
    );
}

/// A cluster member with `?waitaof=0,1` whose replica has no append-only file: a lost
/// attempt's cleanup on its master can never be confirmed there, and is kept. The master
/// then fails over to its replica (`CLUSTER FAILOVER`, the old master's connection stays up)
/// and the client reads the new topology: the kept cleanup must go to the slot's new master
/// (as it would had the connection broken), not be dropped with the link to the old one.
#[test]
#[ignore = "unconfirmed: the old master drops its clients at the failover and the trigger may not reach the promoted one; 2 of 3 runs passed, 1 counted one script (see the review notes)"]
fn a_kept_cleanup_follows_a_cluster_failover() {
    let Some(program) = redis8_program() else {
        println!("skipped: WAITAOF needs Redis >= 7.2 and no Redis 8 binary is here (.ci/redis8)");
        return;
    };
    let member = common::cluster::ClusterMember::start_program(&program, 3, 1).expect("cluster");
    let old = member.masters()[0];
    let replica = member.servers[3].addr();
    // Seeded on another master: the old master has a link of its own.
    let url = format!("redis+cluster://{}?waitaof=0,1", member.masters()[1]);
    let c = one_try_client(&[url], ms(500));
    let key = (0..10_000)
        .map(|i| format!("audit:cfo:{i}"))
        .find(|k| member.owner(member.slot(k.as_bytes()), old) == Some(old))
        .expect("a key of the first master");
    let trigger = (0..10_000)
        .map(|i| format!("audit:cfo:t:{i}"))
        .find(|k| member.owner(member.slot(k.as_bytes()), old) == Some(old))
        .expect("another key of the first master");
    assert!(c.try_lock(&key, TTL).is_err(), "a grant no replica fsynced");
    assert_settles_eq!(dbsize(old), 0, "the cleanup ran on the old master");
    let v = cmd(replica, &[b"CLUSTER", b"FAILOVER"]);
    assert!(matches!(v, Value::Simple(_)), "{v:?}");
    assert!(
        eventually(common::cluster::SETTLE, || {
            member.owner(member.slot(key.as_bytes()), replica) == Some(replica)
        }),
        "the replica took over"
    );
    let before = script_calls(replica);
    // One attempt on the promoted master: MOVED, then a topology read; its own cleanup is one
    // script call there.
    let stats = |a| match cmd(a, &[b"INFO", b"commandstats"]) {
        Value::Bulk(Some(t)) => String::from_utf8_lossy(&t)
            .lines()
            .filter(|l| l.starts_with("cmdstat"))
            .map(|l| l.split(",usec=").next().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    println!("promoted before the trigger: {}", stats(replica));
    let t = c.try_lock(&trigger, TTL).map(|_| ());
    println!("trigger: {t:?}");
    let again = eventually(Duration::from_secs(5), || {
        script_calls(replica) >= before + 2
    });
    let after = script_calls(replica);
    println!("scripts on the promoted master: {before} -> {after}");
    let third = (0..10_000)
        .map(|i| format!("audit:cfo:u:{i}"))
        .find(|k| member.owner(member.slot(k.as_bytes()), replica) == Some(replica))
        .expect("a key of the promoted master");
    let b2 = script_calls(replica);
    let t = c.try_lock(&third, TTL).map(|_| ());
    println!("third: {t:?}");
    std::thread::sleep(ms(1000));
    println!("promoted at the end: {}", stats(replica));
    println!("one more attempt there: {b2} -> {}", script_calls(replica),);
    assert!(
        again,
        "the cleanup kept for the old master was not sent to the promoted one \
         ({before} -> {after} scripts: the trigger's cleanup only)"
    );
}

/// [`a_kept_cleanup_follows_a_cluster_failover`] where the old master's connection stays up:
/// every slot of the master moves to another (a scale-in), the client reads the new topology
/// and closes its link to the master that serves nothing now. The cleanup kept there must go
/// to the slot's new master, not be dropped with the link.
#[test]
fn a_kept_cleanup_follows_its_slot_when_the_link_is_closed() {
    let Some(program) = redis8_program() else {
        println!("skipped: WAITAOF needs Redis >= 7.2 and no Redis 8 binary is here (.ci/redis8)");
        return;
    };
    let member = common::cluster::ClusterMember::start_program(&program, 3, 1).expect("cluster");
    let old = member.masters()[0];
    let new = member.masters()[1];
    let url = format!("redis+cluster://{new}?waitaof=0,1");
    let c = one_try_client(&[url], ms(500));
    let of_old = |prefix: &str| {
        (0..10_000)
            .map(|i| format!("{prefix}{i}"))
            .find(|k| member.owner(member.slot(k.as_bytes()), old) == Some(old))
            .expect("a key of the first master")
    };
    let (key, trigger) = (of_old("audit:move:"), of_old("audit:move:t:"));
    // The cleanup is owed for the attempt's TTL: long enough for the slots to move on a
    // loaded machine (16,384 slots, on every node).
    const KEPT: Duration = Duration::from_secs(120);
    let attempt = std::time::Instant::now();
    assert!(
        c.try_lock(&key, KEPT).is_err(),
        "a grant no replica fsynced"
    );
    assert_settles_eq!(dbsize(old), 0, "the cleanup ran on the old master");
    let before = script_calls(new);
    // Every slot of the old master to the new one, on every node (the new one first, its
    // epoch bumped so that its claim wins).
    let _ = cmd(new, &[b"CLUSTER", b"BUMPEPOCH"]);
    let new_id = member.node_id(new);
    let slots: Vec<String> = (0..16384u16)
        .filter(|s| member.owner(*s, old) == Some(old))
        .map(|s| s.to_string())
        .collect::<Vec<_>>();
    assert!(!slots.is_empty());
    let mut nodes = vec![new, old];
    nodes.extend(
        member
            .servers
            .iter()
            .map(|s| s.addr())
            .filter(|a| *a != new && *a != old),
    );
    for addr in nodes {
        let commands: Vec<Vec<&[u8]>> = slots
            .iter()
            .map(|s| {
                vec![
                    &b"CLUSTER"[..],
                    b"SETSLOT",
                    s.as_bytes(),
                    b"NODE",
                    new_id.as_bytes(),
                ]
            })
            .collect();
        let refs: Vec<&[&[u8]]> = commands.iter().map(|c| &c[..]).collect();
        let _ = cmds(addr, &refs);
    }
    assert!(
        eventually(common::cluster::SETTLE, || {
            member.owner(member.slot(key.as_bytes()), new) == Some(new)
                && member.owner(member.slot(key.as_bytes()), old) == Some(new)
        }),
        "the slots moved"
    );
    // One attempt there: MOVED from the old master, a topology read, its own cleanup (one
    // script call on the new master).
    let t = c.try_lock(&trigger, TTL).map(|_| ());
    println!("trigger: {t:?}");
    // Handed on once the trigger's MOVED is read, or, when a topology read came first (the
    // periodic one, every 10 s), once the old link has answered what it owed.
    let again = eventually(Duration::from_secs(15), || script_calls(new) >= before + 2);
    assert!(
        attempt.elapsed() < KEPT,
        "the slots took longer to move than the cleanup is kept"
    );
    let after = script_calls(new);
    println!(
        "scripts on the new master: {before} -> {after}; old master still connected: {:?}",
        script_calls(old)
    );
    assert!(
        again,
        "the cleanup kept for the old master was not sent to the slot's new one \
         ({before} -> {after} scripts: the trigger's cleanup only)"
    );
}

/// `?wait=1`, the replica paused (SIGSTOP) while a lock is released: the master ran the
/// release, but its `WAIT` fell short (the release reports it). Once the replica continues
/// (SIGCONT) and catches up, a later `WAIT` on the same connection confirms the release: it is
/// not owed until the connection breaks, and `close` says nothing is left (the truth: the
/// replica has it too). While the replica stays paused, `close` says the release is not known
/// to have arrived, within its limit.
#[test]
fn a_release_no_replica_acknowledged_is_confirmed_once_the_replica_continues() {
    let (master, replica) = master_with_replica();
    let url = format!("{}?wait=1", master.url());
    let paused = one_try_client(std::slice::from_ref(&url), ms(400));
    warm(&paused, "audit:confirm:warm");
    let lock = paused.try_lock("audit:confirm:paused", TTL).expect("lock");
    replica.pause().expect("pause the replica");
    assert!(
        lock.release().is_err(),
        "a release no replica acknowledged counted"
    );
    let started = Instant::now();
    let closed = paused.close();
    let took = started.elapsed();
    println!("close with the replica paused: {closed:?} in {took:?}");
    replica.resume().expect("resume the replica");
    assert!(
        matches!(&closed, Err(Error::Undelivered { failures }) if failures.iter().any(|f| f.node == 0)),
        "close said {closed:?} with a release no replica has"
    );
    // Within its limit (10 s). (Measured 2.0 s and 4.0 s: an own `WAIT`'s reply may be taken
    // as progress once.)
    assert!(took < Duration::from_millis(10_500), "close took {took:?}");
    let c = one_try_client(&[url], ms(400));
    warm(&c, "audit:confirm:warm");
    let lock = c.try_lock("audit:confirm:release", TTL).expect("lock");
    replica.pause().expect("pause the replica");
    let released = lock.release();
    println!("release with the replica paused: {released:?}");
    assert!(
        released.is_err(),
        "a release no replica acknowledged counted"
    );
    assert_settles_eq!(dbsize(master.addr()), 0, "the release ran on the master");
    replica.resume().expect("resume the replica");
    assert_settles_eq!(dbsize(replica.addr()), 0, "the replica caught up");
    let started = Instant::now();
    let closed = c.close();
    let took = started.elapsed();
    println!("close once the replica continued: {closed:?} in {took:?}");
    assert!(
        closed.is_ok(),
        "close said {closed:?} once the replica had the release"
    );
    assert!(took < Duration::from_secs(4), "close took {took:?}");
}
