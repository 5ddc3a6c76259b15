//! Quorum members that are Redis Clusters, as the simulation runs them.
//!
//! A cluster member has K masters (1 to 3), each with one replica, every one of them a server
//! process of its own with its own address (`127.0.0.1:7000 + n` for process `n`), which the
//! endpoint reaches through its own cluster code: its URL names the masters as seeds, it reads
//! the topology with `CLUSTER SHARDS`, and every connection it opens goes to the process whose
//! address it names. What a cluster answers before a command reaches the data (see
//! [`World::cluster_gate`]), as Redis 7 and 8 do:
//!
//! - a command (or a transaction) whose keys hash to several slots: `-CROSSSLOT`;
//! - a command whose keys' slot another master serves: `-MOVED slot host:port`; on a replica,
//!   `MOVED` to its master; while a shard has no master (a failover under way), every command
//!   with keys: `-CLUSTERDOWN The cluster is down` (`cluster-require-full-coverage`);
//! - a slot migrating away: a command runs if all its keys are still here; if none are, or
//!   (Redis 7) only some, `-ASK slot host:port` to the importing master; Redis 8 answers
//!   `-TRYAGAIN` when only some are; on the importing master, a command after `ASKING` runs,
//!   but one of several keys, some missing, answers `-TRYAGAIN`;
//! - inside `MULTI` a redirected command flags the transaction (`EXEC` then answers
//!   `EXECABORT`), and an `EXEC` whose commands' slot is redirected is discarded and answers the
//!   redirection; `ASKING` holds for the whole transaction;
//! - `WAIT n ms` answers how many replicas have every write so far (the replica catches up);
//! - `PUBLISH` reaches the subscribers of every node of the cluster; `SPUBLISH` (what the
//!   scripts sent to cluster members announce with) only those of the publishing node, and
//!   `SSUBSCRIBE` is routed by the channel's slot as a key is; when a slot leaves a master, the
//!   master unsubscribes every connection from that slot's shard channels with a
//!   `sunsubscribe` push.
//!
//! A cluster's nodes share one clock (hosts kept in step; Redis replicates expiry times as
//! absolute times, and the scripts' scores are times of the node that wrote them). Replicas
//! catch up with their masters every few ms (asynchronous replication): a failover promotes a
//! replica without the master's writes since. Faults of a cluster: a slot migrating while locks
//! are taken (the keys moved one at a time, as `MIGRATE` moves them, then the slot the target's
//! on every node), a slot moved at once (the client's map is wrong until a `MOVED`), a node
//! whose topology replies lag behind a move, and failovers.

use super::*;
use crate::engine::endpoint::cluster::{key_slot, SLOTS};

/// The address of process `n`.
pub(super) fn port(n: usize) -> u16 {
    7000 + n as u16
}

/// The process at port `port`.
pub(super) fn process(port: u16) -> usize {
    usize::from(port) - 7000
}

/// Where a server process is: its member, and its shard if the member is a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    pub member: usize,
    pub shard: Option<usize>,
}

/// The processes of a run: each member's first (its server, or its first master) at the
/// member's own number, then the rest of each cluster's (replicas and further masters), a
/// shard's master before its replica.
pub(super) fn layout(masters: &[usize]) -> Vec<Place> {
    let mut out: Vec<Place> = (0..masters.len())
        .map(|m| Place {
            member: m,
            shard: (masters[m] > 0).then_some(0),
        })
        .collect();
    for (m, &k) in masters.iter().enumerate() {
        for s in 0..k {
            let both = if s == 0 { 1 } else { 2 };
            for _ in 0..both {
                out.push(Place {
                    member: m,
                    shard: Some(s),
                });
            }
        }
    }
    out
}

/// The first process of each shard of member `member` (its masters at the start): the seeds of
/// its URL.
pub(super) fn seeds(layout: &[Place], member: usize) -> impl Iterator<Item = usize> + '_ {
    let mut seen = Vec::new();
    (0..layout.len()).filter(move |&n| {
        let p = layout[n];
        if p.member != member || p.shard.is_none() || seen.contains(&p.shard) {
            return false;
        }
        seen.push(p.shard);
        true
    })
}

/// The hash slots of the run's locks: their keys', whatever the kind.
pub(super) fn lock_slots(arena: &Arena) -> Vec<u16> {
    let mut slots: Vec<u16> = arena
        .keys
        .iter()
        .map(|k| key_slot(k))
        .chain(arena.rw.iter().map(|k| key_slot(k.writer())))
        .chain(arena.sems.iter().map(|k| key_slot(k.holders())))
        .collect();
    slots.sort_unstable();
    slots.dedup();
    slots
}

/// One shard: its master and its replica.
#[derive(Debug)]
pub(super) struct Shard {
    pub master: usize,
    pub replica: usize,
    /// Its master failed, and its replica is not promoted yet.
    pub failed: bool,
}

/// A slot moving from one shard to another.
#[derive(Debug, Clone, Copy)]
pub(super) struct Migration {
    slot: u16,
    from: usize,
    to: usize,
}

/// A cluster member's state: what the cluster's nodes agree on.
#[derive(Debug)]
pub(super) struct Cluster {
    pub shards: Vec<Shard>,
    /// The shard serving each slot.
    owner: Vec<u8>,
    migration: Option<Migration>,
    /// A node that answers topology reads from the map before the last move, until then.
    stale: Option<(usize, Vec<u8>, u64)>,
}

impl Cluster {
    /// No slot migrating, no failover under way, no topology view lagging at `now`.
    pub fn quiet(&self, now: u64) -> bool {
        self.migration.is_none()
            && self.shards.iter().all(|s| !s.failed)
            && !matches!(&self.stale, Some((_, _, until)) if now < *until)
    }
}

/// Where a cluster run's idle-then-check step is: once every caller is done and every fault
/// healed, the clients stay idle (no `close()`) for a while, and then no key of a lock may be
/// left on any master; only then do the clients close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Callers still run.
    Running,
    /// Some client is done; waiting for the others and for the faults to heal.
    Waiting,
    /// Everything healed; the clients idle until the check.
    Quiet,
    /// Checked: the clients close.
    Checked,
}

/// The idle-then-check step, and what idle clients do not read. A client whose callers are
/// done reads its command connections only while its endpoint needs tending (the driver's
/// resender, started when the last operation ended and run until nothing needs it): once
/// that is over, what lands there waits, unread, until the client closes.
#[derive(Debug)]
pub(super) struct Idle {
    pub phase: Phase,
    /// Per client: idle, and no longer tended.
    untended: Vec<bool>,
    /// Connections whose landings wait for the client to read again.
    parked: Vec<usize>,
    /// Every lock whose release returned `Ok`.
    released: Vec<Released>,
    /// When every fault had healed, in ns.
    since: u64,
    /// Until when (in ns) a fault a last cycle met (see [`World::tail`]) excuses what a
    /// release left: the fault is over, and the client has had time to find where its
    /// release goes now.
    pub settle_until: u64,
}

/// A lock whose release returned `Ok`: its entries, its token, its operations.
#[derive(Debug)]
struct Released {
    names: Vec<Vec<u8>>,
    token: Vec<u8>,
    ops: Vec<usize>,
}

impl Idle {
    pub(super) fn new(clients: usize) -> Idle {
        Idle {
            phase: Phase::Running,
            untended: vec![false; clients],
            parked: Vec::new(),
            released: Vec::new(),
            since: 0,
            settle_until: 0,
        }
    }

    /// Whether what lands on `sock` waits unread until its client closes: not in flight
    /// (see [`World::left_check`]).
    pub(super) fn parked(&self, sock: usize) -> bool {
        self.parked.contains(&sock)
    }

    /// A release of the lock of entries `names` and token `token`, of operations `ops`,
    /// returned `Ok`.
    pub(super) fn released(&mut self, names: &[Vec<u8>], token: &[u8], ops: &[usize]) {
        self.released.push(Released {
            names: names.to_vec(),
            token: token.to_vec(),
            ops: ops.to_vec(),
        });
    }
}

/// Every cluster member's state, with its processes placed and sharing the clock of its
/// first; the slots spread evenly over the masters.
pub(super) fn build(p: &Settings, layout: &[Place], nodes: &mut [SimNode]) -> Vec<Option<Cluster>> {
    let mut out = Vec::new();
    for m in 0..p.nodes {
        let k = p.masters[m];
        if k == 0 {
            out.push(None);
            continue;
        }
        let mut shards = Vec::new();
        for s in 0..k {
            let of: Vec<usize> = (0..layout.len())
                .filter(|&n| layout[n].member == m && layout[n].shard == Some(s))
                .collect();
            shards.push(Shard {
                master: of[0],
                replica: of[1],
                failed: false,
            });
        }
        let (offset, ppm) = (nodes[m].offset, nodes[m].ppm);
        for (n, node) in nodes.iter_mut().enumerate() {
            if layout[n].member == m {
                node.place = Some(layout[n]);
                node.offset = offset;
                node.ppm = ppm;
            }
        }
        let owner = (0..SLOTS).map(|s| (s * k / SLOTS) as u8).collect();
        out.push(Some(Cluster {
            shards,
            owner,
            migration: None,
            stale: None,
        }));
    }
    out
}

impl Settings {
    /// In the cluster scenarios, which members are clusters and of how many masters, drawn from
    /// a generator of their own (as [`Settings::versions`]): in half the seeds of
    /// [`Scenario::ClusterModel`] a mix of clusters and standalone servers, else clusters
    /// only.
    pub(super) fn clusters(&mut self, seed: u64, scenario: Scenario) {
        self.masters = vec![0; self.nodes];
        if !scenario.clusters() {
            return;
        }
        let mut rng = Rng::new(seed ^ 0xc105_7e85_c105_7e85);
        let all = scenario != Scenario::ClusterModel || rng.chance(0.5);
        while self.masters.iter().all(|&k| k == 0) {
            for m in 0..self.nodes {
                self.masters[m] = if all || rng.chance(0.5) {
                    rng.range(1, 3) as usize
                } else {
                    0
                };
            }
        }
        self.readdress = scenario == Scenario::ClusterModel && rng.chance(0.1);
        if self.readdress {
            // Waits long enough for the last cycles to try again once the client had the
            // time to find out what changed (see `World::unavailable`).
            self.retry_count = self.retry_count.max(100);
            self.wait_timeout = self.wait_timeout.max(Duration::from_secs(2));
            // Hundreds of addresses under one client: a client learns a master's new address
            // at most once per topology read of a member (`REFRESH_MIN_GAP`, 100 ms), so every
            // member is a cluster with a master that moves, and the callers use them until a
            // horizon of 5 s: a link table that never gives a place back fills up within it.
            for m in &mut self.masters {
                *m = (*m).max(2);
            }
            self.horizon = self.horizon.max(5_000 * MS);
            self.cycles = self.cycles.max(10_000);
        }
        if self.readdress && self.masters.iter().all(|&k| k < 2) {
            // A master that moves needs a seed that stays: a second master.
            let m = rng.below(self.nodes as u64) as usize;
            self.masters[m] = 2;
        }
        if scenario == Scenario::ClusterModel && rng.chance(0.04) {
            // A cluster of more than 64 masters (more links than a `u64` of bits): one member
            // is one, the run kept cheap with few keys and callers.
            let big = rng.below(self.nodes as u64) as usize;
            self.masters[big] = rng.range(65, 90) as usize;
            self.keys = self.keys.min(2);
            self.callers = self.callers.min(2);
        }
        self.wait = u32::from(scenario == Scenario::ClusterWait);
        // Replicas lag by up to a TTL; far behind where the failovers lose grants.
        self.replication = if scenario == Scenario::LossyFailover {
            rng.range(self.ttl_ms / 2, 2 * self.ttl_ms) * MS
        } else {
            rng.range(MS, self.ttl_ms * MS)
        };
    }
}

/// The words of a command.
fn words(command: &[u8]) -> Vec<Vec<u8>> {
    let Ok(resp::Status::Complete((resp::Reply::Array(Some(items)), _))) =
        resp::decode(command, &Limits::default())
    else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|r| match r {
            resp::Reply::Bulk(Some(b)) => Some(b.to_vec()),
            _ => None,
        })
        .collect()
}

/// The keys a command names, as the cluster finds them.
fn keys_of(command: &[u8]) -> Vec<Vec<u8>> {
    let words = words(command);
    let args: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
    let Some(name) = args.first() else {
        return Vec::new();
    };
    let name = name.to_ascii_uppercase();
    match &name[..] {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" => {
            let n = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok())
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            args.iter().skip(3).take(n).map(|k| k.to_vec()).collect()
        }
        b"DEL" | b"EXISTS" => args[1..].iter().map(|k| k.to_vec()).collect(),
        // A shard channel is routed by its slot, as a key.
        b"SSUBSCRIBE" | b"SUNSUBSCRIBE" => args[1..].iter().map(|k| k.to_vec()).collect(),
        b"MULTI" | b"EXEC" | b"DISCARD" | b"PUBLISH" | b"SUBSCRIBE" | b"UNSUBSCRIBE" | b"INFO"
        | b"SCRIPT" | b"COMMAND" | b"AUTH" | b"SELECT" | b"PING" | b"TIME" | b"HELLO"
        | b"CLIENT" => Vec::new(),
        _ => args.get(1).map(|k| vec![k.to_vec()]).unwrap_or_default(),
    }
}

fn integer(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(format!(":{n}\r\n").as_bytes());
}

impl<'a> World<'a> {
    /// The member process `node` belongs to.
    pub(super) fn member_of(&self, node: usize) -> usize {
        self.nodes[node].place.map_or(node, |p| p.member)
    }

    /// Whether what process `node` holds is its member's vote: a standalone server, or a
    /// cluster's master (not a replica, whose copy no command reads).
    pub(super) fn votes(&self, node: usize) -> bool {
        match self.nodes[node].place {
            Some(Place {
                member,
                shard: Some(s),
            }) => self.clusters[member]
                .as_ref()
                .is_some_and(|c| c.shards[s].master == node),
            // A Sentinel member's process: its master only (see `sentinel`).
            Some(Place {
                member,
                shard: None,
            }) => self.sentinels[member]
                .as_ref()
                .is_none_or(|w| w.master == node),
            _ => true,
        }
    }

    /// Whether process `node` was a cluster master that moved to a new address (see
    /// [`World::readdress`]): gone for good, no shard names it.
    pub(super) fn retired(&self, node: usize) -> bool {
        match self.nodes[node].place {
            Some(Place {
                member,
                shard: Some(s),
            }) => self.clusters[member]
                .as_ref()
                .is_some_and(|c| c.shards[s].master != node && c.shards[s].replica != node),
            _ => false,
        }
    }

    /// Whether subscribers of process `listener` hear what `publisher` publishes: its own, or
    /// (a cluster passing messages on to all its nodes) another node's of the same cluster.
    pub(super) fn hears(&self, listener: usize, publisher: usize) -> bool {
        listener == publisher
            || (self.nodes[listener].up
                && matches!(
                    (self.nodes[listener].place, self.nodes[publisher].place),
                    (Some(a), Some(b)) if a.member == b.member
                ))
    }

    /// Client `c`'s connection (`sub`: its subscriber) to process `node`, if it has one.
    pub(super) fn sock_to(&self, c: usize, node: usize, sub: bool) -> Option<usize> {
        let socks = &self.clients[c].socks;
        if self.nodes[node].place.is_none() {
            return socks.get(2 * node + usize::from(sub)).copied().flatten();
        }
        let mine = |&s: &usize| self.socks[s].server == node && self.socks[s].id.sub == sub;
        let all: Vec<usize> = socks.iter().flatten().copied().filter(mine).collect();
        all.iter()
            .copied()
            .find(|&s| self.socks[s].open)
            .or(all.first().copied())
    }

    /// Node `node`'s clock changed: the other nodes of its cluster, if any, share it.
    pub(super) fn share_clock(&mut self, node: usize) {
        let Some(place) = self.nodes[node].place else {
            return;
        };
        let (offset, ppm, jump) = {
            let n = &self.nodes[node];
            (n.offset, n.ppm, n.last_forward_jump)
        };
        for n in &mut self.nodes {
            if n.place.is_some_and(|p| p.member == place.member) {
                (n.offset, n.ppm, n.last_forward_jump) = (offset, ppm, jump);
            }
        }
    }

    /// Replication starts on every cluster member.
    pub(super) fn start_replication(&mut self) {
        for m in 0..self.clusters.len() {
            if self.clusters[m].is_some() {
                let first = m == self.first_cluster();
                let mixed = self.clusters.iter().any(Option::is_none);
                self.stats.cluster_runs += u64::from(first);
                let big = self.clusters[m]
                    .as_ref()
                    .is_some_and(|c| c.shards.len() > 64);
                self.stats.big_clusters += u64::from(big);
                self.stats.mixed_cluster_runs += u64::from(first && mixed);
                let at = self.rng.range(0, self.p.replication);
                self.schedule(at, Ev::Replicate { member: m });
                let shards = self.clusters[m].as_ref().map_or(0, |c| c.shards.len());
                if self.p.readdress && shards >= 2 {
                    // One master other than the first (whose address is the URL's seed)
                    // moves again and again, every 10 to 30 ms until the horizon (more often
                    // than the client reads the topology, and hundreds of times). It serves the
                    // slots of the run's locks from the start, so that the last cycles show
                    // whether locks there are still granted once it moved hundreds of times
                    // (see `World::unavailable`).
                    let shard = self.rng.range(1, shards as u64 - 1) as usize;
                    if let Some(cl) = self.clusters[m].as_mut() {
                        for &slot in &self.lock_slots {
                            cl.owner[usize::from(slot)] = shard as u8;
                        }
                    }
                    let at = self.rng.range(0, 30 * MS);
                    self.schedule(at, Ev::Readdress { member: m, shard });
                }
            }
        }
    }

    fn first_cluster(&self) -> usize {
        self.clusters.iter().position(Option::is_some).unwrap_or(0)
    }

    /// Shard `s` of member `m`'s replica has every write its master made so far.
    fn catch_up(&mut self, m: usize, s: usize) -> bool {
        let Some(cl) = self.clusters[m].as_ref() else {
            return false;
        };
        let (a, b, failed) = (
            cl.shards[s].master,
            cl.shards[s].replica,
            cl.shards[s].failed,
        );
        if failed || !self.nodes[a].up || !self.nodes[b].up || self.nodes[a].server.loading {
            return false;
        }
        let copy = self.nodes[a].server.node.replica();
        self.nodes[b].server.node = copy;
        true
    }

    /// Member `m`'s replicas catch up, and will again, until every client closed.
    pub(super) fn replicate(&mut self, m: usize) {
        let shards = self.clusters[m].as_ref().map_or(0, |c| c.shards.len());
        for s in 0..shards {
            self.catch_up(m, s);
        }
        if !self.clients.iter().all(|c| c.closed) {
            self.schedule(self.p.replication, Ev::Replicate { member: m });
        }
    }

    /// The cluster's answer to a command on process `node`, before it reaches the data (see
    /// the module docs); `None`: it runs.
    pub(super) fn cluster_gate(
        &mut self,
        node: usize,
        sock: usize,
        now_ms: i64,
        command: &[u8],
        name: &[u8],
    ) -> Option<Vec<u8>> {
        let place = self.nodes[node].place?;
        let (m, shard) = (place.member, place.shard?);
        match name {
            b"ASKING" => {
                self.socks[sock].session.asking = true;
                return Some(b"+OK\r\n".to_vec());
            }
            b"CLUSTER" => return Some(self.topology_reply(m, node, command)),
            b"WAIT" => {
                let mine = self.clusters[m]
                    .as_ref()
                    .is_some_and(|c| c.shards[shard].master == node);
                let reached = mine && self.catch_up(m, shard);
                self.stats.waits += 1;
                self.stats.waits_reached += u64::from(reached);
                return Some(format!(":{}\r\n", u8::from(reached)).into_bytes());
            }
            _ => {}
        }
        let session = &mut self.socks[sock].session;
        let in_multi = session.queued().is_some();
        let exec = name == b"EXEC";
        let commands: Vec<Vec<u8>> = if exec {
            session
                .queued()
                .map(<[Vec<u8>]>::to_vec)
                .unwrap_or_default()
        } else {
            vec![command.to_vec()]
        };
        let asking = session.asking;
        // ASKING holds for the next command, or for a whole transaction.
        let multi_after = (in_multi && !exec && name != b"DISCARD") || name == b"MULTI";
        if !multi_after {
            session.asking = false;
        }
        let keys: Vec<Vec<u8>> = commands.iter().flat_map(|c| keys_of(c)).collect();
        let first = keys.first()?;
        let slot = key_slot(first);
        let cl = self.clusters[m].as_ref()?;
        let masters: Vec<usize> = cl.shards.iter().map(|s| s.master).collect();
        let addr = |s: usize| format!("127.0.0.1:{}", port(masters[s]));
        let owner = usize::from(cl.owner[slot as usize]);
        let migration = cl.migration.filter(|g| g.slot == slot);
        let down = cl.shards.iter().any(|s| s.failed);
        let v8 = self.nodes[node].server.version.0 >= 8;
        let mut present = |n: usize| {
            keys.iter()
                .filter(|k| self.nodes[n].server.node.has_key(now_ms, k))
                .count()
        };
        // Redis refuses a command (or a transaction) whose keys hash to several slots before
        // it looks at who serves them.
        let answer: Option<String> = if keys.iter().any(|k| key_slot(k) != slot) {
            Some("CROSSSLOT Keys in request don't hash to the same slot".to_owned())
        } else if masters[shard] != node {
            Some(format!("MOVED {slot} {}", addr(owner)))
        } else if down {
            Some("CLUSTERDOWN The cluster is down".to_owned())
        } else if owner == shard {
            match migration {
                Some(g) if g.from == shard => {
                    let to = addr(g.to);
                    let here = present(node);
                    if here == keys.len() {
                        None
                    } else if here > 0 && v8 {
                        Some("TRYAGAIN Multiple keys request during rehashing of slot".to_owned())
                    } else {
                        Some(format!("ASK {slot} {to}"))
                    }
                }
                _ => None,
            }
        } else if migration.is_some_and(|g| g.to == shard) && asking {
            if keys.len() > 1 && present(node) < keys.len() {
                Some("TRYAGAIN Multiple keys request during rehashing of slot".to_owned())
            } else {
                None
            }
        } else {
            Some(format!("MOVED {slot} {}", addr(owner)))
        };
        let answer = answer?;
        let stats = &mut self.stats;
        match answer.split(' ').next() {
            Some("MOVED") => stats.moved += 1,
            Some("ASK") => stats.asks += 1,
            Some("TRYAGAIN") => stats.tryagains += 1,
            Some("CROSSSLOT") => {}
            _ => stats.clusterdowns += 1,
        }
        let session = &mut self.socks[sock].session;
        if exec {
            session.discard_multi();
        } else {
            session.flag_multi();
        }
        Some(format!("-{answer}\r\n").into_bytes())
    }

    /// What process `node` of member `m` answers to `CLUSTER SHARDS` (or `SLOTS`): the slot
    /// map, or the one before the last move while its view lags.
    fn topology_reply(&mut self, m: usize, node: usize, command: &[u8]) -> Vec<u8> {
        let sub = words(command)
            .get(1)
            .map(|s| s.to_ascii_uppercase())
            .unwrap_or_default();
        let now = self.now;
        self.stats.topology_reads += 1;
        let stale = self.clusters[m].as_ref().is_some_and(
            |cl| matches!(&cl.stale, Some((n, _, until)) if *n == node && now < *until),
        );
        self.stats.stale_topology_reads += u64::from(stale);
        let Some(cl) = self.clusters[m].as_ref() else {
            return b"-ERR This instance has cluster support disabled\r\n".to_vec();
        };
        let map = match &cl.stale {
            Some((_, map, _)) if stale => map,
            _ => &cl.owner,
        };
        let mut by_shard: Vec<Vec<(usize, usize)>> = vec![Vec::new(); cl.shards.len()];
        for (slot, &o) in map.iter().enumerate() {
            let out = &mut by_shard[usize::from(o)];
            match out.last_mut() {
                Some((_, b)) if *b + 1 == slot => *b = slot,
                _ => out.push((slot, slot)),
            }
        }
        let ranges = |s: usize| by_shard[s].clone();
        let mut out = Vec::new();
        let node_info = |out: &mut Vec<u8>, n: usize, master: bool, healthy: bool| {
            resp::write_array_len(out, 14);
            resp::write_bulk(out, b"id");
            resp::write_bulk(out, &self.nodes[n].server.run_id);
            resp::write_bulk(out, b"port");
            integer(out, i64::from(port(n)));
            resp::write_bulk(out, b"ip");
            resp::write_bulk(out, b"127.0.0.1");
            resp::write_bulk(out, b"endpoint");
            resp::write_bulk(out, b"127.0.0.1");
            resp::write_bulk(out, b"role");
            resp::write_bulk(out, if master { b"master" } else { b"replica" });
            resp::write_bulk(out, b"replication-offset");
            integer(out, 0);
            resp::write_bulk(out, b"health");
            resp::write_bulk(out, if healthy { b"online" } else { b"fail" });
        };
        match &sub[..] {
            b"SHARDS" => {
                resp::write_array_len(&mut out, cl.shards.len());
                for (s, shard) in cl.shards.iter().enumerate() {
                    let r = ranges(s);
                    resp::write_array_len(&mut out, 4);
                    resp::write_bulk(&mut out, b"slots");
                    resp::write_array_len(&mut out, 2 * r.len());
                    for (a, b) in r {
                        integer(&mut out, a as i64);
                        integer(&mut out, b as i64);
                    }
                    resp::write_bulk(&mut out, b"nodes");
                    resp::write_array_len(&mut out, 2);
                    let up = !shard.failed && self.nodes[shard.master].up;
                    node_info(&mut out, shard.master, true, up);
                    node_info(&mut out, shard.replica, false, self.nodes[shard.replica].up);
                }
            }
            b"SLOTS" => {
                let all: Vec<(usize, usize, usize)> = (0..cl.shards.len())
                    .flat_map(|s| ranges(s).into_iter().map(move |(a, b)| (a, b, s)))
                    .collect();
                resp::write_array_len(&mut out, all.len());
                for (a, b, s) in all {
                    resp::write_array_len(&mut out, 3);
                    integer(&mut out, a as i64);
                    integer(&mut out, b as i64);
                    let n = cl.shards[s].master;
                    resp::write_array_len(&mut out, 3);
                    resp::write_bulk(&mut out, b"127.0.0.1");
                    integer(&mut out, i64::from(port(n)));
                    resp::write_bulk(&mut out, &self.nodes[n].server.run_id);
                }
            }
            _ => out.extend_from_slice(b"-ERR unknown subcommand\r\n"),
        }
        out
    }

    /// A cluster fault: a slot migrating (`at_once`: moved in one step, keys and all, the
    /// clients' maps wrong until a `MOVED`), or a failover.
    pub(super) fn cluster_fault(&mut self, failover: bool, at_once: bool) {
        let members: Vec<usize> = (0..self.clusters.len())
            .filter(|&m| {
                self.clusters[m].as_ref().is_some_and(|c| {
                    c.migration.is_none()
                        && c.shards.iter().all(|s| !s.failed)
                        && (failover || c.shards.len() >= 2)
                })
            })
            .collect();
        if members.is_empty() {
            return;
        }
        let m = members[self.rng.below(members.len() as u64) as usize];
        // The slot of one of the locks: its shard fails over, or it migrates.
        let slot = self.lock_slots[self.rng.below(self.lock_slots.len() as u64) as usize];
        let Some(cl) = self.clusters[m].as_ref() else {
            return;
        };
        if failover {
            let s = usize::from(cl.owner[slot as usize]);
            return self.failover(m, s);
        }
        let from = usize::from(cl.owner[slot as usize]);
        let other = self.rng.below(cl.shards.len() as u64 - 1) as usize;
        let to = if other >= from { other + 1 } else { other };
        let (a, b) = (cl.shards[from].master, cl.shards[to].master);
        if !self.nodes[a].up || !self.nodes[b].up {
            return;
        }
        self.stats.migrations += 1;
        let g = Migration { slot, from, to };
        if let Some(cl) = self.clusters[m].as_mut() {
            cl.migration = Some(g);
        }
        if at_once {
            self.stats.moves_at_once += 1;
            self.log(format_args!(
                "member {m}: slot {slot} moves at once from node {a} to node {b}"
            ));
            while self.move_one(m, g) {}
            if self.rng.chance(0.5) {
                // The old owner is slow for a while: its `MOVED` to a round's command (a
                // release's) comes after the other members decided the round.
                let slow = self.rng.range(0, 2 * self.p.node_timeout.as_nanos() as u64);
                self.nodes[a].busy_until = self.nodes[a].busy_until.max(self.now + slow);
                self.stats.slow_old_owners += 1;
            }
            return self.migration_ends(m);
        }
        self.log(format_args!(
            "member {m}: slot {slot} migrates from node {a} to node {b}"
        ));
        let first = self.rng.range(0, self.p.ttl_ms * MS);
        self.schedule(first, Ev::MigrateKey { member: m });
    }

    /// Moves one key of the migrating slot from its source to its target, if one is left.
    fn move_one(&mut self, m: usize, g: Migration) -> bool {
        let Some(cl) = self.clusters[m].as_ref() else {
            return false;
        };
        let (a, b) = (cl.shards[g.from].master, cl.shards[g.to].master);
        let now_ms = self.nodes[a].clock_ms(self.now);
        let names = self.nodes[a].server.node.live_key_names(now_ms);
        let Some(name) = names.into_iter().find(|k| key_slot(k) == g.slot) else {
            return false;
        };
        let moved = self.nodes[a]
            .server
            .node
            .take_keys(now_ms, |k| k == name.as_slice());
        self.nodes[b].server.node.put_keys(moved);
        self.stats.keys_migrated += 1;
        true
    }

    /// The next key of member `m`'s migrating slot moves (`MIGRATE`), or, once none is left,
    /// the slot changes hands a moment later.
    pub(super) fn migrate_key(&mut self, m: usize) {
        let Some(g) = self.clusters[m].as_ref().and_then(|c| c.migration) else {
            return;
        };
        let Some(cl) = self.clusters[m].as_ref() else {
            return;
        };
        let (a, b) = (cl.shards[g.from].master, cl.shards[g.to].master);
        if !self.nodes[a].up || !self.nodes[b].up {
            // MIGRATE fails while either is down: it is tried again later.
            let later = self.p.ttl_ms * MS / 4;
            return self.schedule(later, Ev::MigrateKey { member: m });
        }
        if self.move_one(m, g) {
            let next = self.rng.range(0, 2 * MS);
            self.schedule(next, Ev::MigrateKey { member: m });
        } else {
            let end = self.rng.range(0, self.p.ttl_ms * MS / 2);
            self.schedule(end, Ev::MigrationEnds { member: m });
        }
    }

    /// Member `m`'s migrating slot is its target's (`CLUSTER SETSLOT … NODE` on every node):
    /// its source answers `MOVED` from now on. Half the time one master's topology replies
    /// lag behind for a while.
    pub(super) fn migration_ends(&mut self, m: usize) {
        self.end_migration(m, true);
    }

    /// [`World::migration_ends`], where one master's view may lag only if `may_lag`.
    fn end_migration(&mut self, m: usize, may_lag: bool) {
        let Some(g) = self.clusters[m].as_ref().and_then(|c| c.migration) else {
            return;
        };
        // Keys written since the last move (none, unless its source was down) go too.
        while self.move_one(m, g) {}
        let lag = may_lag && self.rng.chance(0.5);
        let until = self.now + self.rng.range(0, 4 * self.p.ttl_ms * MS);
        let Some(cl) = self.clusters[m].as_mut() else {
            return;
        };
        let before = cl.owner.clone();
        cl.owner[g.slot as usize] = g.to as u8;
        cl.migration = None;
        let source = cl.shards[g.from].master;
        self.unsubscribe_moved(source, g.slot);
        let Some(cl) = self.clusters[m].as_mut() else {
            return;
        };
        let k = cl.shards.len();
        let who = cl.shards[self.rng.below(k as u64) as usize].master;
        let cl = self.clusters[m].as_mut().expect("a cluster");
        if lag {
            cl.stale = Some((who, before, until));
            self.stats.stale_views += 1;
        }
        self.log(format_args!(
            "member {m}: slot {} is shard {}'s now",
            g.slot, g.to
        ));
    }

    /// Slot `slot` left process `node`: it unsubscribes every connection from the shard
    /// channels of that slot, with a `sunsubscribe` push for each, as Redis does.
    fn unsubscribe_moved(&mut self, node: usize, slot: u16) {
        let incarnation = self.nodes[node].incarnation;
        for sock in 0..self.socks.len() {
            let s = &mut self.socks[sock];
            if s.server != node || !s.server_open || s.accepted != Some(incarnation) {
                continue;
            }
            let gone: Vec<Vec<u8>> = s
                .session
                .shard_channels
                .iter()
                .filter(|c| key_slot(c) == slot)
                .cloned()
                .collect();
            if gone.is_empty() {
                continue;
            }
            let mut out = Vec::new();
            for ch in gone {
                s.session.shard_channels.remove(&ch);
                let left = s.session.shard_channels.len();
                server::subscription_reply(&mut out, b"sunsubscribe", &ch, left);
            }
            self.stats.shard_unsubscribes += 1;
            self.send_to_client(sock, Back::Data(out));
        }
    }

    /// Shard `s` of member `m`'s master fails. Its replica, without the writes it had not
    /// replicated yet, is promoted: within the model once every TTL it may have lost ran
    /// out, or at once where a grant counts only once a replica has it (`?wait=1`); at once
    /// without `WAIT` in the scenario that breaks the assumption.
    fn failover(&mut self, m: usize, s: usize) {
        let Some(cl) = self.clusters[m].as_ref() else {
            return;
        };
        let (a, b) = (cl.shards[s].master, cl.shards[s].replica);
        if !self.nodes[a].up || !self.nodes[b].up {
            return;
        }
        let now_ms = self.nodes[a].clock_ms(self.now);
        self.nodes[a].server.node.live_keys_at(now_ms);
        self.nodes[b].server.node.live_keys_at(now_ms);
        if self.scenario == Scenario::ClusterModel && self.p.locks.fenced() {
            // Within the model, fencing assumes that no member loses its counter (the README's
            // "Fencing tokens strictly increase only while no node loses its counter"): as a
            // standalone node persists it (`appendfsync always`), the replica has every raise
            // of it, which on a real cluster takes `?wait` (a raise is followed by `WAIT`).
            // Without that, a lossy failover hands out a token again (seed 1429 of fenced
            // mutexes: 10 twice).
            let fences = &self.arena.fences;
            let write_fences = &self.arena.write_fences;
            let counters = self.nodes[a].server.node.replica().take_keys(now_ms, |k| {
                fences.iter().any(|f| f == k) || write_fences.iter().any(|f| f == k)
            });
            self.nodes[b].server.node.put_keys(counters);
        }
        let same = self.nodes[a]
            .server
            .node
            .same_data(&self.nodes[b].server.node);
        self.stats.failovers += 1;
        self.stats.lossy_failovers += u64::from(!same);
        self.kill(a);
        if let Some(cl) = self.clusters[m].as_mut() {
            cl.shards[s].failed = true;
        }
        let max_ttl = 2 * self.p.ttl_ms * MS;
        let after = match self.scenario {
            Scenario::ClusterWait => self.rng.range(0, max_ttl),
            Scenario::LossyFailover => self.rng.range(0, self.p.ttl_ms * MS / 2),
            // A replica that has every write of its master loses no grant: promoted within a
            // fraction of a TTL, while the keys it took over still live (what a release
            // re-sent after the break owes goes to it).
            _ if same && self.rng.chance(0.7) => {
                self.stats.quick_failovers += 1;
                self.rng.range(0, self.p.ttl_ms * MS / 4)
            }
            _ => self.rng.range(max_ttl, 3 * max_ttl),
        };
        self.log(format_args!(
            "member {m}: master {a} fails; replica {b} is promoted in {after} ns"
        ));
        self.schedule(
            after,
            Ev::Promote {
                member: m,
                shard: s,
            },
        );
    }

    /// Shard `s` of member `m`'s replica is its master now; the old master comes back later as
    /// its replica.
    pub(super) fn promote(&mut self, m: usize, s: usize) {
        let Some(cl) = self.clusters[m].as_mut() else {
            return;
        };
        let shard = &mut cl.shards[s];
        (shard.master, shard.replica) = (shard.replica, shard.master);
        shard.failed = false;
        let b = shard.master;
        self.nodes[b].server.refusal = None;
        self.log(format_args!("member {m}: node {b} is promoted"));
        let max_ttl = 2 * self.p.ttl_ms * MS;
        let back = self.rng.range(max_ttl / 4, max_ttl);
        self.schedule(
            back,
            Ev::Rejoin {
                member: m,
                shard: s,
            },
        );
    }

    /// Shard `s` of member `m`'s failed master restarts, as a replica of the promoted one.
    pub(super) fn rejoin(&mut self, m: usize, s: usize) {
        let Some(cl) = self.clusters[m].as_ref() else {
            return;
        };
        let (a, b) = (cl.shards[s].replica, cl.shards[s].master);
        if self.nodes[a].up {
            return;
        }
        let id = run_id(&mut self.rng);
        let n = &mut self.nodes[a];
        n.up = true;
        n.server.run_id = id;
        n.server.loading = false;
        n.server.refusal = None;
        n.server.node = node_memory();
        self.log(format_args!(
            "member {m}: node {a} is back, a replica of {b}"
        ));
        self.catch_up(m, s);
    }
}

impl World<'_> {
    /// Client `c`'s callers are done: in [`Scenario::ClusterModel`] it stays idle, without
    /// `close()`, until the idle-then-check step is over (see [`Idle`]). Whether it must wait.
    pub(super) fn idles_first(&mut self, c: usize) -> bool {
        if self.scenario != Scenario::ClusterModel || self.idle.phase == Phase::Checked {
            return false;
        }
        let now = self.instant(self.now);
        if !self.clients[c].ep.needs_tending(now) {
            self.idle.untended[c] = true;
        }
        if self.idle.phase == Phase::Running {
            self.idle.phase = Phase::Waiting;
            self.schedule(self.p.ttl_ms * MS / 8, Ev::IdleCheck);
        }
        true
    }

    /// Whether what lands on `sock` waits unread: its client is idle and untended (see
    /// [`Idle`]); it is then parked until the client closes.
    pub(super) fn unread(&mut self, sock: usize) -> bool {
        let s = &self.socks[sock];
        let c = s.client;
        if self.idle.phase == Phase::Running
            || self.idle.phase == Phase::Checked
            || s.id.sub
            || !self.clients[c].callers.iter().all(|k| k.done)
        {
            return false;
        }
        if !self.idle.untended[c] {
            let now = self.instant(self.now);
            if self.clients[c].ep.needs_tending(now) {
                return false;
            }
            self.idle.untended[c] = true;
        }
        if !self.idle.parked.contains(&sock) {
            self.idle.parked.push(sock);
            self.stats.unread_landings += 1;
        }
        true
    }

    /// Whether client `c` is idle and untended: its endpoint's timers do not run either.
    pub(super) fn untended(&self, c: usize) -> bool {
        matches!(self.idle.phase, Phase::Waiting | Phase::Quiet) && self.idle.untended[c]
    }

    /// Every fault healed: no partition, every standalone server up and taking writes, no
    /// shard without a master, no slot migrating, no master paused or loading. A failed
    /// master need not be back: its replica serves in its place.
    fn healed(&self) -> bool {
        if self.blocked.iter().flatten().any(|&b| b) {
            return false;
        }
        if self
            .clusters
            .iter()
            .flatten()
            .any(|c| c.migration.is_some() || c.shards.iter().any(|s| s.failed))
        {
            return false;
        }
        (0..self.nodes.len()).filter(|&n| self.votes(n)).all(|n| {
            let node = &self.nodes[n];
            node.up
                && node.server.refusal.is_none()
                && !node.server.loading
                && node.busy_until <= self.now
        })
    }

    /// The idle-then-check step: once every caller is done, the horizon passed and every
    /// fault healed, the clients idle half a TTL more; then no key of a lock (fence counters
    /// apart) may be left on any master or standalone server, and the clients close.
    pub(super) fn idle_check(&mut self) {
        match self.idle.phase {
            Phase::Waiting => {
                let done = self
                    .clients
                    .iter()
                    .all(|c| c.callers.iter().all(|k| k.done));
                // A last cycle's fault (see [`World::tail`]) settled, and its release looked
                // for.
                let settled = self.now >= self.idle.settle_until
                    && !self.left_checks.iter().any(|l| l.pending);
                if done && settled && self.now > self.p.horizon && self.healed() {
                    self.idle.phase = Phase::Quiet;
                    self.idle.since = self.now;
                    self.log(format_args!("every fault healed: the clients idle"));
                    self.schedule(self.p.ttl_ms * MS / 2, Ev::IdleCheck);
                } else {
                    self.schedule(self.p.ttl_ms * MS / 8, Ev::IdleCheck);
                }
            }
            Phase::Quiet => {
                // What a client wrote may still be on its way to a master (a long delay, a
                // segment held behind a lost one): looked at once it has landed and run.
                let in_flight = self
                    .socks
                    .iter()
                    .any(|s| !s.id.sub && !s.to_server.is_empty() && self.votes(s.server))
                    || (0..self.nodes.len())
                        .any(|n| self.votes(n) && !self.nodes[n].backlog.is_empty());
                if in_flight && self.now < self.idle.since + QUIET_WAIT * self.p.ttl_ms * MS {
                    let after = (self.p.node_timeout.as_nanos() as u64 / 4).max(MS / 4);
                    self.schedule(after, Ev::IdleCheck);
                    return;
                }
                self.idle.phase = Phase::Checked;
                self.stats.idle_checks += 1;
                // Entries of a released lock that still hold its token.
                let released = std::mem::take(&mut self.idle.released);
                for node in 0..self.nodes.len() {
                    if !self.votes(node) || !self.nodes[node].up {
                        continue;
                    }
                    let now_ms = self.nodes[node].clock_ms(self.now);
                    for Released { names, token, ops } in &released {
                        for key in names {
                            let mem = &mut self.nodes[node].server.node;
                            if mem.holds_token(now_ms, key, token) {
                                self.log(format_args!(
                                    "left behind on node {node} after idling: {:?} of ops {ops:?}",
                                    String::from_utf8_lossy(key)
                                ));
                                self.history.left_behind.push((node, key.clone()));
                            }
                        }
                    }
                }
                // The clients close, and read what waited.
                for sock in std::mem::take(&mut self.idle.parked) {
                    self.schedule(0, Ev::Land { sock, back: true });
                }
                for c in 0..self.clients.len() {
                    self.maybe_close(c);
                    self.after_io(c);
                }
            }
            Phase::Running | Phase::Checked => {}
        }
    }
}

impl World<'_> {
    /// Shard `s` of member `m`'s master moves to a new address, its data with it (a pod
    /// restarted with a new IP on its volume): a new process at a new port takes its place,
    /// and the old one is gone for good, with its connections. Again a few ms later, until the
    /// horizon: hundreds of addresses under one client.
    pub(super) fn readdress(&mut self, m: usize, s: usize) {
        if self.now > self.p.horizon {
            return;
        }
        let next = self.rng.range(10 * MS, 30 * MS);
        self.schedule(
            next,
            Ev::Readdress {
                member: m,
                shard: s,
            },
        );
        self.move_master(m, s);
    }

    /// Shard `s` of member `m`'s master moves to a new address now (see
    /// [`World::readdress`]), unless the shard is failing over or migrating, or its master is
    /// down, paused or loading. Whether it moved.
    fn move_master(&mut self, m: usize, s: usize) -> bool {
        let Some(cl) = self.clusters[m].as_ref() else {
            return false;
        };
        let a = cl.shards[s].master;
        if cl.shards[s].failed || cl.migration.is_some() || !self.nodes[a].up {
            return false;
        }
        if self.nodes[a].busy_until > self.now || self.nodes[a].server.loading {
            return false;
        }
        let n = self.nodes.len();
        let old = &self.nodes[a];
        let mut server = Server::new(
            old.server.node.replica(),
            old.server.version,
            run_id(&mut self.rng),
        );
        server.password = old.server.password.clone();
        let node = SimNode {
            server,
            refused: false,
            up: true,
            incarnation: 0,
            offset: old.offset,
            ppm: old.ppm,
            last_forward_jump: old.last_forward_jump,
            backlog: VecDeque::new(),
            busy_until: 0,
            exec_scheduled: false,
            service: old.service,
            reject_connects: 0,
            refusal_gen: 0,
            place: old.place,
        };
        self.nodes.push(node);
        for row in &mut self.blocked {
            row.push(false);
        }
        self.kill(a);
        // The old process never comes back (no shard names it any more).
        self.nodes[a].server.node = node_memory();
        if let Some(cl) = self.clusters[m].as_mut() {
            cl.shards[s].master = n;
        }
        self.stats.readdresses += 1;
        self.stats.most_readdresses += 1;
        self.log(format_args!(
            "member {m}: master {a} moves to a new address, node {n}"
        ));
        true
    }
}

impl World<'_> {
    /// Within the model ([`Scenario::Model`], [`Scenario::ClusterModel`]), a last cycle runs
    /// once every fault healed, and the nodes must then hold nothing of what its release
    /// released (see [`World::left_check`]). In half of them, a fault of its own hits while
    /// its release is on its way (see [`World::tail`]), and in cluster runs, in half of them
    /// too, one while its lock is held: what the release owes must then reach whoever holds
    /// the keys once the fault is over.
    pub(super) fn maybe_tail(&mut self, c: usize, k: usize, releasing: bool) {
        let caller = &self.clients[c].callers[k];
        // Cluster runs draw one as the lock is taken and one as it is released (a slot moved
        // under the held lock, a failover between a break and its resend); the others as it
        // is released.
        let drawn = match self.scenario {
            Scenario::Model => releasing,
            Scenario::ClusterModel => true,
            _ => false,
        };
        if caller.last != Last::Running || !drawn {
            return;
        }
        let Some(grant) = caller
            .cycle
            .as_ref()
            .and_then(|cy| cy.held.as_ref())
            .map(|h| h.grant)
        else {
            return;
        };
        if !self.rng.chance(0.5) {
            return;
        }
        // While the release's bytes are on their way, or a moment into the hold.
        let after = if releasing {
            0
        } else {
            self.rng.range(0, 2 * MS)
        };
        self.schedule(
            after,
            Ev::Tail {
                client: c,
                caller: k,
                grant,
            },
        );
    }

    /// How long after a fault of a last cycle is over the client has to find where what it
    /// owes goes: a connection's failure seen (a connect to a master that died fails only at
    /// the connect timeout), the topology read again (at most every 100 ms, and a read may
    /// just have told of the fault), a connection to the new master set up, and what is owed
    /// sent there.
    fn settle(&self) -> u64 {
        let gap = crate::engine::endpoint::cluster::REFRESH_MIN_GAP.as_nanos() as u64;
        let connect = self.p.connect_timeout.as_nanos() as u64;
        2 * gap
            + 2 * connect
            + 3 * self.p.node_timeout.as_nanos() as u64
            + 4 * self.p.delay.1
            + 40 * MS
    }

    /// Caller `k` of client `c`'s last cycle, still holding grant `grant` (or releasing it),
    /// meets a fault: in cluster runs, on a cluster member of two masters or more and the
    /// shard serving the lock's slot, a quick failover (the replica with every write of its
    /// master, promoted within a few ms: a release on its way to the master, or re-sent after
    /// the break, owes the promoted replica its delete) or the slot moved at once with its old
    /// owner slow (its `MOVED` to the release comes after the round was decided, to an idle
    /// client); otherwise, and in a quarter of cluster runs, the client's command connection
    /// to a node breaks (part of what was on its way lands and runs; the release must be sent
    /// again). Every one heals within a few ms.
    pub(super) fn tail(&mut self, c: usize, k: usize, grant: u64) {
        let Some(cycle) = self.clients[c].callers[k].cycle.as_ref() else {
            return;
        };
        if cycle.held.as_ref().is_none_or(|h| h.grant != grant) {
            return;
        }
        let slot = entry_names(&cycle.spec).first().map(|n| key_slot(n));
        let members: Vec<usize> = (0..self.clusters.len())
            .filter(|&m| {
                self.clusters[m]
                    .as_ref()
                    .is_some_and(|cl| cl.migration.is_none() && cl.shards.iter().all(|s| !s.failed))
            })
            .collect();
        let settle = self.settle();
        let (Some(slot), false, false) = (slot, members.is_empty(), self.rng.chance(0.25)) else {
            return self.tail_break(c);
        };
        let m = members[self.rng.below(members.len() as u64) as usize];
        let Some(cl) = self.clusters[m].as_ref() else {
            return;
        };
        let s = usize::from(cl.owner[slot as usize]);
        let shards = cl.shards.len();
        if shards < 2 {
            // A cluster of one master has one seed: once it fails, the client has no node to
            // learn of the promoted replica from until it is back (as with any client).
            return self.tail_break(c);
        }
        let (a, b) = (cl.shards[s].master, cl.shards[s].replica);
        if !self.nodes[a].up || self.nodes[a].server.loading {
            return;
        }
        match self.rng.below(2) {
            0 => {
                let other = self.rng.below(shards as u64 - 1) as usize;
                let to = if other >= s { other + 1 } else { other };
                let target = cl.shards[to].master;
                if !self.nodes[target].up {
                    return;
                }
                let g = Migration { slot, from: s, to };
                if let Some(cl) = self.clusters[m].as_mut() {
                    cl.migration = Some(g);
                }
                self.stats.migrations += 1;
                self.stats.moves_at_once += 1;
                self.stats.slow_old_owners += 1;
                self.stats.tail_moves += 1;
                // Slow past the node timeout: its `MOVED` comes after the round's decision.
                let nt = self.p.node_timeout.as_nanos() as u64;
                let slow = self.rng.range(nt, 3 * nt);
                self.log(format_args!(
                    "last cycle: member {m}: slot {slot} moves at once from node {a} to node {target}; node {a} slow for {slow} ns"
                ));
                while self.move_one(m, g) {}
                self.nodes[a].busy_until = self.nodes[a].busy_until.max(self.now + slow);
                self.end_migration(m, false);
                self.idle.settle_until = self.idle.settle_until.max(self.now + slow + settle);
            }
            _ => {
                if !self.nodes[b].up || !self.catch_up(m, s) {
                    return;
                }
                // The replica has every write: promoted at once, it loses nothing.
                self.stats.failovers += 1;
                self.stats.quick_failovers += 1;
                self.stats.tail_failovers += 1;
                self.kill(a);
                if let Some(cl) = self.clusters[m].as_mut() {
                    cl.shards[s].failed = true;
                }
                let after = self.rng.range(MS / 2, 4 * MS);
                self.log(format_args!(
                    "last cycle: member {m}: master {a} fails; replica {b} is promoted in {after} ns"
                ));
                self.schedule(
                    after,
                    Ev::Promote {
                        member: m,
                        shard: s,
                    },
                );
                self.idle.settle_until = self.idle.settle_until.max(self.now + after + settle);
            }
        }
    }

    /// Client `c`'s command connection to a node that votes (a standalone server or a
    /// cluster's master) breaks (see [`World::tail`]).
    fn tail_break(&mut self, c: usize) {
        let open: Vec<usize> = (0..self.nodes.len())
            .filter_map(|n| self.sock_to(c, n, false))
            .filter(|&s| self.socks[s].open && self.votes(self.socks[s].server))
            .collect();
        if open.is_empty() {
            return;
        }
        let sock = open[self.rng.below(open.len() as u64) as usize];
        self.stats.tail_breaks += 1;
        self.stats.resets += 1;
        self.log(format_args!(
            "last cycle: client {c}'s connection to {} resets",
            self.socks[sock].server
        ));
        self.break_sock(sock, reset_error());
        self.idle.settle_until = self.idle.settle_until.max(self.now + self.settle());
    }
}
