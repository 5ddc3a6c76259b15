//! Quorum members that are Redis Clusters (`redis+cluster://`), against real clusters of
//! `redis-server` 7.0 processes started here: commands land on the master of their lock's
//! slot, a slot migrated while threads lock and release lets no two of them hold at once and
//! leaves nothing behind, a master failover is followed, every lock kind works, and wake-ups
//! go through the master of the lock's slot alone (sharded pub/sub).

mod common;
use redlock_mux_kit::history;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::*;
use history::{History, Kind, Op};
use redlock_mux::{Client, Error};

const TTL: Duration = Duration::from_secs(5);

fn client(urls: &[String]) -> Client {
    Client::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("client")
}

fn members(n: usize, masters: usize) -> Vec<ClusterMember> {
    (0..n)
        .map(|_| ClusterMember::start(masters, 0).expect("cluster"))
        .collect()
}

fn urls(members: &[ClusterMember]) -> Vec<String> {
    members.iter().map(ClusterMember::url).collect()
}

/// Locks on many keys land on the masters that serve their slots: each master of each member
/// ran one `SET NX` per key of its slots and one release per key, and answered no redirection.
#[test]
fn locks_land_on_the_master_of_their_slot() {
    let members = members(3, 3);
    let client = client(&urls(&members));
    let keys: Vec<String> = (0..120).map(|i| format!("route:{i}")).collect();
    let started = Instant::now();
    for key in &keys {
        let lock = client.try_lock(key, TTL).expect("lock");
        lock.release().expect("release");
    }
    let cycle = started.elapsed() / keys.len() as u32;
    for (m, member) in members.iter().enumerate() {
        let mut expected: HashMap<SocketAddr, u64> = HashMap::new();
        for key in &keys {
            let slot = member.slot(key.as_bytes());
            let owner = member.owner(slot, member.masters()[0]).expect("owner");
            *expected.entry(owner).or_default() += 1;
        }
        for master in member.masters() {
            let want = expected.get(&master).copied().unwrap_or(0);
            let sets = ClusterMember::calls(master, "set");
            // The release is a script run by digest.
            let releases = ClusterMember::calls(master, "evalsha");
            eprintln!(
                "member {m} master {master}: {sets} SET, {releases} EVALSHA, {want} keys of its slots"
            );
            assert_eq!(sets, want, "SET on {master} of member {m}");
            assert_eq!(releases, want, "releases on {master} of member {m}");
            assert_eq!(ClusterMember::errors(master, "MOVED"), 0);
            assert_eq!(ClusterMember::errors(master, "ASK"), 0);
            // The release script that announces with SPUBLISH was loaded with the setup.
            assert_eq!(ClusterMember::errors(master, "NOSCRIPT"), 0, "on {master}");
        }
        assert!(member.keys().is_empty(), "keys left on member {m}");
    }
    eprintln!("lock and release, sequential: {cycle:?} per cycle");
}

/// Every lock kind works on a quorum of cluster members, mixed with a standalone member: a
/// mutex, a fenced lock, read and write locks, a semaphore, a fair queue, a kept-alive lock,
/// an all-or-none set of keys of one slot; wake-ups reach a waiter.
#[test]
fn every_lock_kind_works_on_cluster_members() {
    let clusters = members(2, 3);
    let standalone = common::RedisServer::start().expect("server");
    let mut nodes = urls(&clusters);
    nodes.push(standalone.url());
    let client = client(&nodes);

    let lock = client.try_lock("kinds:mutex", TTL).expect("mutex");
    assert!(client
        .try_lock("kinds:mutex", TTL)
        .unwrap_err()
        .is_contended());
    lock.release().expect("release");

    let fenced = client.try_lock_fenced("kinds:fenced", TTL).expect("fenced");
    let first = fenced.fencing_token();
    fenced.release().expect("release");
    let fenced = client.try_lock_fenced("kinds:fenced", TTL).expect("fenced");
    assert!(fenced.fencing_token() > first, "fencing tokens grow");
    fenced.release().expect("release");

    let r1 = client.try_read_lock("kinds:rw", TTL).expect("read");
    let r2 = client.try_read_lock("kinds:rw", TTL).expect("second read");
    assert!(
        client.try_write_lock("kinds:rw", TTL).is_err(),
        "readers keep a writer out"
    );
    r1.release().expect("release");
    r2.release().expect("release");
    let w = client.try_write_lock("kinds:rw", TTL).expect("write");
    assert!(
        client.try_read_lock("kinds:rw", TTL).is_err(),
        "a writer keeps readers out"
    );
    let r = w.downgrade().expect("downgrade");
    r.release().expect("release");

    let sem = client.semaphore("kinds:sem", 2).expect("semaphore");
    let p1 = sem.try_acquire(TTL).expect("permit");
    let p2 = sem.try_acquire(TTL).expect("permit");
    assert!(sem.try_acquire(TTL).is_err(), "two permits only");
    p1.release().expect("release");
    p2.release().expect("release");
    // One permit: one key per node, in the slot of the semaphore's hash tag.
    let one = client.semaphore("kinds:sem1", 1).expect("semaphore");
    assert_eq!(one.slots_per_node(), 1);
    let mut p = one.try_acquire(TTL).expect("permit");
    assert!(one.try_acquire(TTL).unwrap_err().is_contended());
    p.extend(TTL).expect("extend");
    p.release().expect("release");
    one.try_acquire(TTL)
        .expect("permit")
        .release()
        .expect("release");

    let set = client
        .try_lock_all(["{order:42}:a", "{order:42}:b", "{order:42}:c"], TTL)
        .expect("all-or-none on one slot");
    set.release().expect("release");
    match client.try_lock_all(["order:1", "order:2"], TTL) {
        Err(Error::InvalidArgument(redlock_mux::InvalidArgument::KeysInSeveralSlots {
            ..
        })) => {}
        other => panic!("keys of two slots: {other:?}"),
    }

    let kept = client
        .try_lock("kinds:kept", Duration::from_millis(600))
        .expect("lock")
        .keep_alive(redlock_mux::KeepAlive::new(Duration::from_millis(600)))
        .unwrap_or_else(|_| panic!("keep alive"));
    thread::sleep(Duration::from_millis(1500));
    assert!(!kept.is_lost(), "kept alive past its TTL");
    assert!(client.try_lock("kinds:kept", TTL).is_err());
    kept.release().expect("release");

    // A waiter is woken by the holder's release, announced on the clusters' pub/sub (the
    // client's members are the clusters alone), in arrival order with a fair client.
    let fair = Client::builder()
        .nodes(urls(&clusters))
        .node_timeout(Duration::from_millis(500))
        .fair(true)
        .retry_delay(Duration::from_secs(5))
        .build()
        .expect("client");
    let held = fair.try_lock("kinds:fair", TTL).expect("lock");
    let waiter = {
        let fair = fair.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let lock = fair.lock("kinds:fair", TTL).expect("waiter");
            let waited = started.elapsed();
            lock.release().expect("release");
            waited
        })
    };
    thread::sleep(Duration::from_millis(300));
    held.release().expect("release");
    let waited = waiter.join().unwrap();
    eprintln!("fair waiter woken after {waited:?}");
    // Without the wake-up it would wait for its 5 s retry delay.
    assert!(
        waited < Duration::from_secs(4),
        "woken by the release: {waited:?}"
    );

    for (m, c) in clusters.iter().enumerate() {
        assert!(
            common::eventually(Duration::from_secs(5), || lock_keys(c).is_empty()),
            "keys left on member {m}: {:?}",
            lock_keys(c)
        );
    }
}

/// A waiter on cluster members is woken by the release, announced with `SPUBLISH` on the
/// master that owns the lock's slot alone (no cluster-wide `PUBLISH`), and heard on a
/// subscription to that master; once the slot migrates to another master while the waiter
/// waits, the subscription follows it and the next release wakes the waiter from there.
#[test]
fn a_release_wakes_a_waiter_through_the_master_of_its_slot_alone() {
    const KEY: &str = "wake:sharded";
    let members = members(3, 3);
    // A retry delay long enough that only a wake-up explains a quick grant.
    let retry = Duration::from_secs(10);
    let client = Client::builder()
        .nodes(urls(&members))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(retry)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    // The wake channel of a key without a hash tag is `redlock-mux:wake:{KEY}`, in its slot.
    let slot = members[0].slot(KEY.as_bytes());
    let channel_slot = members[0].slot(format!("redlock-mux:wake:{{{KEY}}}").as_bytes());
    assert_eq!(slot, channel_slot);
    let owners: Vec<SocketAddr> = members
        .iter()
        .map(|m| m.owner(slot, m.masters()[0]).expect("owner"))
        .collect();

    // Holds the lock, starts a waiter, runs `meanwhile`, releases: how long after the release
    // the waiter got the lock, and how long it waited in all.
    let wait_for_release = |meanwhile: &dyn Fn()| {
        let held = client.try_lock(KEY, TTL).expect("lock");
        let waiter = {
            let client = client.clone();
            thread::spawn(move || {
                let started = Instant::now();
                let lock = client.lock(KEY, TTL).expect("waiter");
                let (granted, waited) = (Instant::now(), started.elapsed());
                lock.release().expect("release");
                (granted, waited)
            })
        };
        thread::sleep(Duration::from_millis(300));
        meanwhile();
        let released = Instant::now();
        held.release().expect("release");
        let (granted, waited) = waiter.join().unwrap();
        (granted.saturating_duration_since(released), waited)
    };

    let before = client.stats().wakeups;
    let (after_release, waited) = wait_for_release(&|| {});
    let wakeups = client.stats().wakeups - before;
    eprintln!("waiter granted {after_release:?} after the release ({waited:?} in all), {wakeups} wake-ups");
    assert!(wakeups >= 1, "woken by an announcement");
    assert!(waited < retry / 2, "not by its retry timer: {waited:?}");
    for (m, member) in members.iter().enumerate() {
        for master in member.masters() {
            let (spublish, publish) = (
                ClusterMember::calls(master, "spublish"),
                ClusterMember::calls(master, "publish"),
            );
            let (ssubscribe, subscribe) = (
                ClusterMember::calls(master, "ssubscribe"),
                ClusterMember::calls(master, "subscribe"),
            );
            eprintln!(
                "member {m} master {master}{}: {spublish} SPUBLISH, {publish} PUBLISH, \
                 {ssubscribe} SSUBSCRIBE, {subscribe} SUBSCRIBE",
                if master == owners[m] {
                    " (the slot's)"
                } else {
                    ""
                }
            );
            assert_eq!(publish, 0, "no cluster-wide PUBLISH on {master}");
            assert_eq!(subscribe, 0, "no SUBSCRIBE on {master}");
            if master == owners[m] {
                assert!(spublish >= 2, "both releases announced on {master}");
                assert!(ssubscribe >= 1, "the waiter subscribed on {master}");
            } else {
                assert_eq!(spublish, 0, "SPUBLISH on {master}, not the slot's");
                assert_eq!(ssubscribe, 0, "SSUBSCRIBE on {master}, not the slot's");
            }
        }
    }

    // While a waiter waits, subscribed on the slot's master, the slot (the held key with it)
    // moves to another master of every member: each old owner drops the subscription
    // (`sunsubscribe`), the client subscribes at the new owner, and the release, made there,
    // wakes the waiter.
    let targets: Vec<SocketAddr> = members
        .iter()
        .zip(&owners)
        .map(|(m, &o)| {
            m.masters()
                .into_iter()
                .find(|&a| a != o)
                .expect("another master")
        })
        .collect();
    let before = client.stats().wakeups;
    let (after_release, waited) = wait_for_release(&|| {
        for ((m, &from), &to) in members.iter().zip(&owners).zip(&targets) {
            m.migrate(slot, from, to, || {});
        }
        // Time for the pushes to be read and the subscriptions to move.
        thread::sleep(Duration::from_millis(300));
    });
    let wakeups = client.stats().wakeups - before;
    eprintln!(
        "after the slot moved: waiter granted {after_release:?} after the release ({waited:?} \
         in all), {wakeups} wake-ups"
    );
    assert!(wakeups >= 1, "woken by an announcement from the new owner");
    assert!(waited < retry / 2, "not by its retry timer: {waited:?}");
    for (m, member) in members.iter().enumerate() {
        let to = targets[m];
        let spublish = ClusterMember::calls(to, "spublish");
        let ssubscribe = ClusterMember::calls(to, "ssubscribe");
        let moved = ClusterMember::errors(owners[m], "MOVED");
        eprintln!(
            "member {m} new owner {to}: {spublish} SPUBLISH, {ssubscribe} SSUBSCRIBE; \
             {moved} MOVED from the old owner"
        );
        assert!(spublish >= 1, "announced on the new owner {to}");
        assert!(ssubscribe >= 1, "subscribed at the new owner {to}");
        for master in member.masters() {
            assert_eq!(ClusterMember::calls(master, "publish"), 0);
        }
        assert!(
            common::eventually(Duration::from_secs(5), || lock_keys(member).is_empty()),
            "keys left on member {m}: {:?}",
            lock_keys(member)
        );
    }
}

/// The keys of a member but its fence counters, which live on by design.
fn lock_keys(member: &ClusterMember) -> Vec<Vec<u8>> {
    let mut keys = member.keys();
    keys.retain(|k| !k.starts_with(b"redlock-mux:fence:"));
    keys
}

/// Threads lock and release one key while its slot moves to another master on every member
/// (`SETSLOT MIGRATING`/`IMPORTING`, a pause in which clients meet `ASK`, `MIGRATE`, `SETSLOT
/// NODE`, then `MOVED`): no two of them ever hold it at once, and nothing is left behind.
#[test]
fn a_slot_migrated_while_threads_lock_lets_no_two_hold() {
    const THREADS: u64 = 4;
    const KEY: &str = "migrate:hot";
    let members = members(3, 3);
    let client = client(&urls(&members));
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let client = client.clone();
            let stop = stop.clone();
            let history = history.clone();
            thread::spawn(move || {
                let mut h = History::default();
                let mut granted = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let invoke = origin.elapsed();
                    let Ok(lock) = client.try_lock(KEY, Duration::from_millis(800)) else {
                        thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    let ok = origin.elapsed();
                    let op = h.push(Op {
                        client: id,
                        kind: Kind::Mutex,
                        key: KEY.as_bytes().to_vec(),
                        invoke,
                        ok: Some(ok),
                        fence: None,
                        valid_until: Some(ok + lock.validity()),
                        release: None,
                    });
                    thread::sleep(Duration::from_millis(2));
                    h.ops[op].release = Some(origin.elapsed());
                    let _ = lock.release();
                    granted += 1;
                }
                history.lock().unwrap().merge(h);
                granted
            })
        })
        .collect();
    let started = Instant::now();
    let mut moves = 0;
    for round in 0..2 {
        for member in &members {
            let slot = member.slot(KEY.as_bytes());
            let from = member.owner(slot, member.masters()[0]).expect("owner");
            let to = member
                .masters()
                .into_iter()
                .find(|&a| a != from)
                .expect("another master");
            member.migrate(slot, from, to, || thread::sleep(Duration::from_millis(150)));
            moves += 1;
            eprintln!("round {round}: slot {slot} moved {from} -> {to}");
        }
        thread::sleep(Duration::from_millis(200));
    }
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let granted: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let report = history.lock().unwrap().check();
    let mut redirects = (0, 0);
    for member in &members {
        for master in member.masters() {
            redirects.0 += ClusterMember::errors(master, "MOVED");
            redirects.1 += ClusterMember::errors(master, "ASK");
        }
    }
    eprintln!(
        "{moves} slot moves in {:?}: {granted} grants, {} MOVED and {} ASK answered, \
         {} lock violations",
        started.elapsed(),
        redirects.0,
        redirects.1,
        report.lock_violations()
    );
    assert_eq!(report.lock_violations(), 0, "{report:?}");
    assert!(granted > 0);
    for (m, c) in members.iter().enumerate() {
        assert!(
            common::eventually(Duration::from_secs(5), || lock_keys(c).is_empty()),
            "keys left on member {m}: {:?}",
            lock_keys(c)
        );
    }
}

/// A master of one member fails over to its replica (`CLUSTER FAILOVER`): the client follows
/// the `MOVED` replies and the topology read, and locks on its slots keep working on the new
/// master.
#[test]
fn locks_keep_working_after_a_master_failover() {
    let failing = ClusterMember::start(3, 1).expect("cluster with a replica");
    let mut all = vec![failing];
    all.extend(members(2, 3));
    let client = client(&urls(&all));
    let member = &all[0];
    let old = member.masters()[0];
    let replica = member.servers[3].addr();
    // A key whose slot the failing master serves.
    let key = (0..10_000)
        .map(|i| format!("failover:{i}"))
        .find(|k| member.owner(member.slot(k.as_bytes()), old) == Some(old))
        .expect("a key of the first master");
    for _ in 0..20 {
        client
            .try_lock(&key, TTL)
            .expect("lock")
            .release()
            .expect("release");
    }
    let before = ClusterMember::calls(replica, "set");
    let v = common::cmd(replica, &[b"CLUSTER", b"FAILOVER"]);
    assert!(matches!(v, redlock_mux::resp::Value::Simple(_)), "{v:?}");
    let promoted = Instant::now();
    assert!(
        common::eventually(common::cluster::SETTLE, || {
            member.owner(member.slot(key.as_bytes()), replica) == Some(replica)
        }),
        "the replica took over"
    );
    let mut first_ok = None;
    let mut failed = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ok = 0;
    while ok < 50 && Instant::now() < deadline {
        match client.try_lock(&key, TTL) {
            // Granted with the new master's vote: the key is there while held.
            Ok(lock) if common::get(replica, key.as_bytes()).is_some() => {
                lock.release().expect("release");
                first_ok.get_or_insert_with(|| promoted.elapsed());
                ok += 1;
            }
            // Granted by the other members while this one's command was still on its way
            // to the new master (its connection is set up on the first MOVED).
            Ok(lock) => {
                lock.release().expect("release");
                failed += 1;
            }
            Err(_) => failed += 1,
        }
    }
    let after = ClusterMember::calls(replica, "set") - before;
    eprintln!(
        "failover: first grant with the new master's vote {:?} after the promotion, {failed} \
         attempts before without it, {after} SET on the new master",
        first_ok
    );
    assert_eq!(ok, 50, "locks keep working after the failover");
    assert!(after >= 50, "the new master serves the slot: {after} SET");
}

/// The fault suite's overlap check with one member a cluster: threads lock and release one key
/// on two standalone servers and a cluster while the cluster's master of that key is killed
/// (kill -9) and started again after longer than the TTL. The cluster fails for the rounds in
/// between (a broken connection, then `CLUSTERDOWN` until it heals), never casting a wrong vote:
/// no two threads hold at once, it votes again once it is back, and nothing is left behind.
#[test]
fn a_cluster_member_whose_master_is_killed_casts_no_wrong_vote() {
    const THREADS: u64 = 4;
    const KEY: &str = "fault:cluster";
    let ttl = Duration::from_millis(300);
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let mut cluster = ClusterMember::start(3, 0).expect("cluster");
    let slot = cluster.slot(KEY.as_bytes());
    let master = cluster.owner(slot, cluster.masters()[0]).expect("owner");
    let k = cluster
        .masters()
        .iter()
        .position(|&a| a == master)
        .expect("a master");
    let nodes = vec![standalone[0].url(), standalone[1].url(), cluster.url()];
    let client = Client::builder()
        .nodes(&nodes)
        .node_timeout(Duration::from_millis(50))
        .build()
        .expect("client");
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let client = client.clone();
            let stop = stop.clone();
            let history = history.clone();
            thread::spawn(move || {
                let mut h = History::default();
                while !stop.load(Ordering::Relaxed) {
                    let invoke = origin.elapsed();
                    let Ok(lock) = client.try_lock(KEY, ttl) else {
                        thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    let ok = origin.elapsed();
                    let op = h.push(Op {
                        client: id,
                        kind: Kind::Mutex,
                        key: KEY.as_bytes().to_vec(),
                        invoke,
                        ok: Some(ok),
                        fence: None,
                        valid_until: Some(ok + lock.validity()),
                        release: None,
                    });
                    thread::sleep(Duration::from_millis(2));
                    h.ops[op].release = Some(origin.elapsed());
                    let _ = lock.release();
                }
                history.lock().unwrap().merge(h);
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(400));
    cluster.servers[k].kill().expect("kill -9");
    let killed = Instant::now();
    thread::sleep(ttl + Duration::from_millis(200));
    cluster.servers[k].restart().expect("restart");
    cluster.wait_ok().expect("the cluster heals");
    let healed = killed.elapsed();
    // The cluster votes again: a grant while its master holds the key.
    let back = Instant::now();
    let voted = common::eventually(Duration::from_secs(10), || {
        client
            .try_lock(KEY, ttl)
            .map(|lock| {
                let there = common::get(master, KEY.as_bytes()).is_some();
                let _ = lock.release();
                there
            })
            .unwrap_or(false)
    });
    let voted_after = back.elapsed();
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let report = history.lock().unwrap().check();
    let grants = history.lock().unwrap().ops.len();
    eprintln!(
        "master killed, restarted after {:?} and healed {healed:?} after the kill; voting again \
         {voted_after:?} after; {grants} grants, {} lock violations; {:?}",
        ttl + Duration::from_millis(200),
        report.lock_violations(),
        client.stats().nodes[2].failures
    );
    assert_eq!(report.lock_violations(), 0, "{report:?}");
    assert!(voted, "the cluster member votes again after it healed");
    let nothing_left = || {
        lock_keys(&cluster).is_empty()
            && standalone
                .iter()
                .all(|s| common::get(s.addr(), KEY.as_bytes()).is_none())
    };
    assert!(
        common::eventually(Duration::from_secs(5), nothing_left),
        "keys left"
    );
}

/// With `?wait=N` on a cluster URL, a grant counts only once `WAIT N` says that many replicas
/// have it: while the lock is held, every member's replica has the key; a master without a
/// replica fails the member (`NOREPLICAS`), never a vote. Prints what the wait costs.
#[test]
fn a_grant_waits_for_a_replica_when_the_url_asks() {
    const CYCLES: u32 = 100;
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(3, 1).expect("cluster with a replica"))
        .collect();
    let plain = client(&urls(&members));
    let waiting_urls: Vec<String> = members
        .iter()
        .map(|m| format!("{}?wait=1", m.url()))
        .collect();
    // A replica's acknowledgment may take a while on a loaded machine: a grant whose `WAIT`
    // runs out fails, rightly, but this test is about what a grant that succeeded promises.
    let waiting = Client::builder()
        .nodes(&waiting_urls)
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    // redis-cli gives every cluster the same slot ranges, in the order of its masters; the
    // replica is the first master's.
    let owned_by = |k: &String, i: usize| {
        members
            .iter()
            .all(|m| m.owner(m.slot(k.as_bytes()), m.masters()[0]) == Some(m.masters()[i]))
    };
    let replicated: Vec<String> = (0..1000)
        .map(|i| format!("wait:{i}"))
        .filter(|k| owned_by(k, 0))
        .take(10)
        .collect();
    let bare = (0..1000)
        .map(|i| format!("nowait:{i}"))
        .find(|k| owned_by(k, 1))
        .expect("a key of the second master");
    assert_eq!(replicated.len(), 10);
    let cycles = |client: &Client| {
        let started = Instant::now();
        for i in 0..CYCLES {
            let key = &replicated[i as usize % replicated.len()];
            client
                .try_lock(key, TTL)
                .expect("lock")
                .release()
                .expect("release");
        }
        started.elapsed() / CYCLES
    };
    // Warm both up, then measure in turn.
    cycles(&plain);
    cycles(&waiting);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        without.push(cycles(&plain));
        with.push(cycles(&waiting));
    }
    without.sort();
    with.sort();
    eprintln!(
        "lock and release, median of 3 runs of {CYCLES}: {:?} without WAIT, {:?} with WAIT 1",
        without[1], with[1]
    );
    // A grant returns at a quorum of members: what is promised is that the replicas of the
    // members that granted it have the key, at least a quorum of them. The third member's
    // `WAIT` may still be running (here it is: its master is paused for the first key), and
    // its replica has the key once it is done.
    let quorum = members.len() / 2 + 1;
    let replicas_holding = |key: &str| {
        members
            .iter()
            .filter(|m| {
                let got = common::cmds(
                    m.servers[3].addr(),
                    &[&[b"READONLY"], &[b"GET", key.as_bytes()]],
                );
                matches!(&got[1], redlock_mux::resp::Value::Bulk(Some(_)))
            })
            .count()
    };
    let late = members[2].masters()[0];
    for (i, key) in replicated[..3].iter().enumerate() {
        if i == 0 {
            // Shorter than the node timeout: the paused member answers late, not never.
            common::cmd(late, &[b"CLIENT", b"PAUSE", b"400", b"WRITE"]);
        }
        let lock = waiting.try_lock(key, TTL).expect("lock");
        let holding = replicas_holding(key);
        assert!(
            holding >= quorum,
            "{holding} replicas of {} have {key} while it is held, fewer than a quorum",
            members.len()
        );
        if i == 0 {
            common::cmd(late, &[b"CLIENT", b"UNPAUSE"]);
        }
        common::assert_settles_eq!(
            replicas_holding(key),
            members.len(),
            "every member's replica has {key} once every member answered"
        );
        lock.release().expect("release");
    }
    for m in &members {
        for server in &m.servers {
            common::assert_settles_eq!(
                common::dbsize(server.addr()),
                0,
                "a key was left on {}",
                server.addr()
            );
        }
    }
    match waiting.try_lock(&bare, TTL) {
        Err(Error::QuorumUnreachable { failures, .. }) => {
            // The round ends once a quorum is out of reach.
            assert!(failures.len() >= 2, "{failures:?}");
            for f in &failures {
                assert!(
                    matches!(&f.kind, redlock_mux::NodeErrorKind::Server { message, .. }
                        if message.starts_with("NOREPLICAS")),
                    "{f:?}"
                );
            }
        }
        other => panic!("a master without a replica cannot grant with WAIT: {other:?}"),
    }
    plain
        .try_lock(&bare, TTL)
        .expect("without WAIT it can")
        .release()
        .expect("release");
}

/// On Redis 8 clusters, the read-write lock goes without Lua (readers as hash fields with
/// `HSETEX`, a writer as `SET NX` and a check in one transaction), and its transactions are
/// routed by their keys' slot like any command.
#[test]
fn the_read_write_lock_without_lua_works_on_redis_8_clusters() {
    let Some(redis8) = common::redis8_program() else {
        eprintln!("skipped: no Redis 8 server (see .ci/redis8)");
        return;
    };
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start_program(&redis8, 3, 0).expect("Redis 8 cluster"))
        .collect();
    let client = client(&urls(&members));
    for i in 0..20 {
        let key = format!("rw8:{i}");
        let r1 = client.try_read_lock(&key, TTL).expect("read");
        let r2 = client.try_read_lock(&key, TTL).expect("second read");
        assert!(
            client.try_write_lock(&key, TTL).is_err(),
            "readers keep a writer out"
        );
        r1.release().expect("release");
        r2.release().expect("release");
        let w = client.try_write_lock(&key, TTL).expect("write");
        assert!(
            client.try_read_lock(&key, TTL).is_err(),
            "a writer keeps readers out"
        );
        w.release().expect("release");
    }
    let (mut hsetex, mut multi, mut evalsha, mut spublish) = (0, 0, 0, 0);
    for m in &members {
        for master in m.masters() {
            hsetex += ClusterMember::calls(master, "hsetex");
            spublish += ClusterMember::calls(master, "spublish");
            assert_eq!(ClusterMember::calls(master, "publish"), 0, "no PUBLISH");
            multi += ClusterMember::calls(master, "multi");
            evalsha += ClusterMember::calls(master, "evalsha");
            assert_eq!(ClusterMember::errors(master, "CROSSSLOT"), 0);
            assert_eq!(ClusterMember::errors(master, "MOVED"), 0);
        }
        assert!(
            common::eventually(Duration::from_secs(5), || lock_keys(m).is_empty()),
            "keys left: {:?}",
            lock_keys(m)
        );
    }
    eprintln!(
        "Redis 8 clusters: {hsetex} HSETEX, {multi} MULTI, {evalsha} EVALSHA, {spublish} SPUBLISH"
    );
    // Each reader's release announces with SPUBLISH in its transaction, in the lock's slot.
    assert!(spublish >= 120, "{spublish} SPUBLISH");
    assert!(
        hsetex >= 120 && multi > 0,
        "the native path: {hsetex} HSETEX, {multi} MULTI"
    );
}

/// A master of one member is killed (kill -9) and its replica promoted by the cluster itself:
/// the member fails meanwhile (a broken connection, then no master for the slot), and once
/// the topology read finds the new master, locks on its slots get its vote again.
#[test]
fn locks_get_the_promoted_replicas_vote_after_a_master_is_killed() {
    let failing = ClusterMember::start(3, 1).expect("cluster with a replica");
    let mut all = vec![failing];
    all.extend(members(2, 3));
    let client = client(&urls(&all));
    let old = all[0].masters()[0];
    let replica = all[0].servers[3].addr();
    let key = (0..10_000)
        .map(|i| format!("killed:{i}"))
        .find(|k| all[0].owner(all[0].slot(k.as_bytes()), old) == Some(old))
        .expect("a key of the first master");
    for _ in 0..20 {
        client
            .try_lock(&key, TTL)
            .expect("lock")
            .release()
            .expect("release");
    }
    all[0].servers[0].kill().expect("kill -9");
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(20);
    let mut without = 0;
    let mut voted = None;
    let mut promoted = None;
    while voted.is_none() && Instant::now() < deadline {
        if promoted.is_none() && is_master(replica) {
            promoted = Some(killed.elapsed());
        }
        match client.try_lock(&key, TTL) {
            // Granted with the promoted replica's vote: the key is there while held.
            Ok(lock) if has_key(replica, key.as_bytes()) => {
                voted = Some(killed.elapsed());
                lock.release().expect("release");
            }
            Ok(lock) => {
                without += 1;
                lock.release().expect("release");
            }
            Err(e) => panic!("the two other members grant meanwhile: {e}"),
        }
        thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "master killed: the replica promoted {promoted:?} and voting {voted:?} after the kill \
         ({without} grants without it meanwhile)"
    );
    assert!(voted.is_some(), "the promoted replica votes within 20 s");
    for _ in 0..20 {
        let lock = client.try_lock(&key, TTL).expect("lock");
        lock.release().expect("release");
    }
}

/// A release owed to a master that was killed (SIGKILL) goes to whoever owns the key's slot
/// once the cluster says so: the promoted replica. The release returns at the quorum of the two
/// standalone members; the client then stays idle, and the promoted replica must lose the key
/// well within its 60 s TTL. Closing takes at most its documented 10 s.
#[test]
fn a_release_owed_to_a_killed_master_goes_to_the_promoted_replica() {
    let ttl = Duration::from_secs(60);
    let mut cluster = ClusterMember::start(3, 1).expect("cluster with a replica");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let old = cluster.masters()[0];
    let replica = cluster.servers[3].addr();
    let key = cluster.key_of(old, "k2");
    let slot = cluster.slot(key.as_bytes());
    let lock = client.try_lock(&key, ttl).expect("lock");
    assert!(
        common::get(old, key.as_bytes()).is_some(),
        "the master has it"
    );
    assert!(
        common::eventually(Duration::from_secs(5), || has_key(replica, key.as_bytes())),
        "the replica has it"
    );
    cluster.servers[0].kill().expect("kill -9");
    let killed = Instant::now();
    assert!(
        common::eventually(common::cluster::SETTLE, || is_master(replica)
            && cluster.owner(slot, replica) == Some(replica)),
        "the replica was promoted"
    );
    let promoted = killed.elapsed();
    lock.release().expect("the standalone members release");
    let released = Instant::now();
    let gone = common::eventually(Duration::from_secs(10), || {
        !has_key(replica, key.as_bytes())
    });
    let gone_after = released.elapsed();
    let left = common::pttl(replica, key.as_bytes());
    let start = Instant::now();
    let closed = client.close();
    let close_took = start.elapsed();
    eprintln!(
        "promoted {promoted:?} after the kill; the key gone from the new master: {gone} \
         ({gone_after:?} after the release; PTTL now {left} ms); close took {close_took:?}: \
         {closed:?}"
    );
    assert!(
        gone,
        "the promoted replica still holds {key} {gone_after:?} after the release returned \
         (PTTL {left} ms)"
    );
    assert!(
        close_took <= Duration::from_millis(10_500),
        "close took {close_took:?}, more than its 10 s"
    );
}

/// A release made while no master serves its key's slot (the master killed and marked failed,
/// its replica not elected yet) is kept for the cluster member and goes to the master the
/// cluster elects next. The replica takes over only when told (`cluster-replica-no-failover`),
/// after the client has read a topology with no master for the slot (its own CLUSTERDOWN says
/// so) and the release returned; the client then stays idle, and the promoted replica must
/// lose the key well within its 60 s TTL.
#[test]
fn a_release_while_its_slot_has_no_master_goes_to_the_master_elected_next() {
    let ttl = Duration::from_secs(60);
    let mut cluster = ClusterMember::start(3, 1).expect("cluster with a replica");
    let client = client(&[cluster.url()]);
    let old = cluster.masters()[0];
    let replica = cluster.servers[3].addr();
    ok(common::cmd(
        replica,
        &[b"CONFIG", b"SET", b"cluster-replica-no-failover", b"yes"],
    ));
    let key = cluster.key_of(old, "nomaster");
    let slot = cluster.slot(key.as_bytes());
    // Another key of the same slot, to see what the client knows of it.
    let probe = format!("{{{key}}}:probe");
    let lock = client.try_lock(&key, ttl).expect("lock");
    assert!(
        common::eventually(Duration::from_secs(5), || has_key(replica, key.as_bytes())),
        "the replica has it"
    );
    cluster.servers[0].kill().expect("kill -9");
    let killed = Instant::now();
    let mut last = String::new();
    let masterless = common::eventually(common::cluster::SETTLE, || {
        last = format!("{:?}", client.try_lock(&probe, ttl).map(|_| ()));
        last.contains("no master serves hash slot")
    });
    assert!(
        masterless,
        "the client never read a topology without a master for slot {slot}: {last}"
    );
    let failed = killed.elapsed();
    let released = lock.release();
    ok(common::cmd(
        replica,
        &[b"CLUSTER", b"FAILOVER", b"TAKEOVER"],
    ));
    assert!(
        common::eventually(common::cluster::SETTLE, || is_master(replica)
            && cluster.owner(slot, replica) == Some(replica)),
        "the replica was promoted"
    );
    let promoted = Instant::now();
    let gone = common::eventually(Duration::from_secs(10), || {
        !has_key(replica, key.as_bytes())
    });
    let left = common::pttl(replica, key.as_bytes());
    eprintln!(
        "slot {slot} without a master {failed:?} after the kill; the release: {released:?};          the key gone from the new master: {gone} ({:?} after the promotion; PTTL now {left} ms)",
        promoted.elapsed()
    );
    assert!(
        gone,
        "the promoted replica still holds {key} {:?} after its promotion (PTTL {left} ms)",
        promoted.elapsed()
    );
    client.close().expect("nothing owed");
}

/// Closing gives up after 2 s without progress when a release is owed to a slot that no master
/// serves any more (its master killed, no replica): the other masters still answer topology
/// reads, which are no progress on what is owed. Close tells the truth: the cluster member is
/// undelivered.
#[test]
fn close_gives_up_within_its_limit_when_a_slot_lost_its_master() {
    let ttl = Duration::from_secs(60);
    let mut cluster = ClusterMember::start(3, 0).expect("cluster");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let old = cluster.masters()[0];
    let key = cluster.key_of(old, "lost");
    let lock = client.try_lock(&key, ttl).expect("lock");
    cluster.servers[0].kill().expect("kill -9");
    lock.release().expect("the standalone members release");
    let start = Instant::now();
    let closed = client.close();
    let close_took = start.elapsed();
    eprintln!("close took {close_took:?}: {closed:?}");
    assert!(
        matches!(&closed, Err(Error::Undelivered { failures }) if failures.len() == 1),
        "the release owed to the cluster is undelivered: {closed:?}"
    );
    // Nothing answers what is owed: closing gives up after 2 s without progress (topology
    // reads are no progress on it), well before its 10 s.
    assert!(
        close_took < Duration::from_secs(5),
        "close took {close_took:?}, though nothing answered what was owed"
    );
}

/// A release whose `MOVED` comes after its round was decided is followed while the client is
/// idle: the key's slot migrated while the lock was held, its old owner frozen so that it
/// answers after the standalone members, the client left alone after the release returned:
/// the slot's new owner loses the key well within its 60 s TTL.
#[test]
fn a_release_moved_after_its_round_is_followed_while_the_client_is_idle() {
    let ttl = Duration::from_secs(60);
    let cluster = ClusterMember::start(3, 0).expect("cluster");
    let standalone = [
        common::RedisServer::start().expect("server"),
        common::RedisServer::start().expect("server"),
    ];
    let nodes = vec![cluster.url(), standalone[0].url(), standalone[1].url()];
    let client = client(&nodes);
    let masters = cluster.masters();
    let (from, to) = (masters[0], masters[1]);
    let key = cluster.key_of(from, "moved");
    let slot = cluster.slot(key.as_bytes());
    let lock = client.try_lock(&key, ttl).expect("lock");
    cluster.migrate(slot, from, to, || {});
    assert!(common::get(to, key.as_bytes()).is_some(), "the key moved");
    cluster.servers[0].pause().expect("SIGSTOP");
    let released = lock.release();
    let returned = Instant::now();
    cluster.servers[0].resume().expect("SIGCONT");
    released.expect("the standalone members release");
    let gone = common::eventually(Duration::from_secs(5), || {
        common::get(to, key.as_bytes()).is_none()
    });
    let left = common::pttl(to, key.as_bytes());
    eprintln!(
        "the key gone from the slot's new owner: {gone} ({:?} after the release returned; \
         PTTL now {left} ms); MOVED answered by the old owner: {}",
        returned.elapsed(),
        ClusterMember::errors(from, "MOVED")
    );
    assert!(
        gone,
        "the slot's new owner still holds {key} after the release returned (PTTL {left} ms)"
    );
    client.close().expect("nothing owed");
}
