//! Deterministic simulation of Redlock: the engine's own state machines and the client's own
//! multiplexer on virtual time.
//!
//! The world here is an I/O shell, as the mio driver is. Each simulated client is one
//! [`Endpoint`] (the multiplexer: every node's command and pub/sub connection, the replies owed
//! and whom each belongs to, setups, what each node's server offers, backoff, the slow-node
//! breaker, releases sent again after a broken connection, wake channels, closing) with many
//! callers sharing its one pipelined connection per node. Each caller runs lock cycles with
//! the very machines the library runs: an [`Acquisition`] for every lock taken, a
//! [`HoldRound`] (from [`Hold::round`]) for every extend, downgrade and release, and a kept
//! lock's [`KeptValidity`] for the keeper. The world only does what the driver does: it carries
//! the bytes an endpoint writes over simulated TCP connections to N simulated servers
//! ([`server::Server`] around [`node::Node`]: keys with expiry, sorted sets, hashes with field
//! expiry, the scripts' own Lua source run as Redis runs it, the connection setup, `MULTI`,
//! refused writes;
//! checked against a real `redis-server` by `diff.rs`), feeds the bytes they answer back,
//! reports connects and failures, runs the endpoint's timers, and steps a caller's machine
//! when its mailbox has what it needs or its deadline passes. What to send, in which form, to
//! which node, when to reconnect, what a reply means, whom it belongs to, how long a lock is
//! valid: all of it comes from the engine.
//!
//! The network keeps TCP's promises and breaks them no other way: each connection delivers in
//! order, with delays (some long), split at any byte; it may break (a reset, a crash, a
//! transport that finds a partitioned peer dead), and then a prefix of what was written lands
//! and runs and the rest does not (a command cut in two never runs), while the replies not yet
//! arrived are lost. Partitions hold bytes until they heal, or until the transport gives the
//! connection up. Servers crash (losing their data, or keeping it when persistent), restart
//! (with a new run id, loading their data for a while, sometimes upgraded from Redis 7 to
//! Redis 8 on their data, or downgraded where their data allows), refuse setups (a wrong
//! password; the maximum number of clients), refuse writes for a while (`READONLY`, `MISCONF`,
//! `OOM`) while still answering reads and `PUBLISH`, pause, and may be too slow for the load
//! (their backlog grows). Each server has its own clock that drifts and may jump. Holders
//! pause; keepers run late. Clients close (drop) once their callers are done, often with
//! replies still owed.
//!
//! Every caller records its grants and releases in a [`History`], and increments a per-key
//! counter while it believes it holds the lock; the shared checker (`redlock_mux_kit::history`)
//! looks for overlapping windows, lost updates, fencing tokens out of order, releases reported
//! done that did not happen (the lock's entries still live, when the release returned, on more
//! nodes than it allows), and keys left behind once every release returned and every client
//! closed (in runs without faults). Within the model, once the last fault healed, every caller
//! runs one last cycle and its client stays idle (it does not close): once nothing of that
//! client is in flight to a node, the node may hold nothing of what the cycle released,
//! whatever the release returned (`World::left_check`); no node fails its attempts, once the
//! client had the time to find out what changed, for being sent to the wrong place or in the
//! wrong form (`World::unavailable`); and a write-preferring writer's intent whose withdrawal
//! met a broken connection is gone once nothing is owed there (`World::intent_check`). Lock
//! kinds: the mutex, read and write
//! locks (writers downgrading to readers now and then), all-or-none sets (mixed with single
//! keys), fenced mutexes and fenced write locks, semaphores; callers wait or try once, in fair queues or not,
//! read- or write-preferring; holders extend with any TTL (shorter ones too) and go on working
//! after a failed extend while the guard's validity lasts, or keep their lock alive.
//!
//! Within the model's assumptions (server clocks drift less than the drift factor allows and
//! jump forward at most 1 ms; a crashed server that loses its data stays down longer than the
//! longest TTL; fencing runs on servers that persist their writes; a holder checks its
//! validity before it writes) there must be no violation. Each assumption, broken on purpose,
//! must produce violations, which shows the checker can see them. Within the model the runs
//! press on the validity bound as hard as the assumptions allow: drift factors of 1 to 10 %
//! with node clocks drifting up to 95 % of it, TTLs down to 15 ms, holders that write in their
//! validity's last microseconds; and every grant held to the end of its validity is looked at
//! on the nodes at its last nanosecond, where a quorum must still hold it. Calm runs (no faults) also
//! check liveness: every waiting acquisition gets its lock, no kept lock is lost, and no lock
//! is granted much later than what was in its way was released.
//!
//! Quorum members may be Redis Clusters (the `cluster` module): masters with replicas, slot
//! maps the endpoint reads and follows (`MOVED`, `ASK`), slots migrating mid-round, topology
//! replies that lag, and failovers that lose the writes a replica had not caught up with.
//! Within the model a replica that lost writes is promoted only once every TTL it could have
//! lost ran out, or at once where a grant counts only after `WAIT` (`?wait=1`); promoted at
//! once without `WAIT`, it loses grants, and the checker sees it.
//!
//! `REDLOCK_SIM_SEEDS=100000 cargo test --release --lib engine::sim` runs more seeds;
//! `REDLOCK_SIM_SEED=n` replays one seed with a trace.

mod cluster;
pub(crate) mod node;
mod sentinel;
pub(crate) mod server;

pub(crate) use redlock_mux_kit::history;

use redlock_mux_kit::local_servers;

mod diff;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand_core::{Rng as _, SeedableRng};

use crate::config::{Config, RwPolicy};
use crate::engine::acquire::{Acquisition, Grant, Params};
use crate::engine::endpoint::{CallerId, CallerLoop, ConnId, Endpoint, Io, Next, Probed};
use crate::engine::fair::Tickets;
use crate::engine::hold::{Hold, HoldRound, Step};
use crate::engine::keepalive::{KeptValidity, Schedule};
use crate::engine::keys::{fence_key, Derived, RwKeys, SemKeys};
use crate::engine::kind::{Keys, Spec};
use crate::engine::machine::Machine;
use crate::engine::{Round, Timing};
use crate::error::{Error, NodeErrorKind};
use crate::resp::{self, Limits};
use crate::rng::{Jitter, Token};
use crate::stats::Recorder;
use crate::url::NodeAddr;

use history::{History, Increment, Kind, Report};
use node::Node;
use server::{Refusal, Server, Session};

const MS: u64 = 1_000_000;

/// The simulation's only source of randomness; the machines draw their tokens and jitter
/// from it too.
struct Rng(Jitter);

impl Rng {
    fn new(seed: u64) -> Rng {
        // SplitMix64 spreads nearby seeds over the whole state.
        let mut x = seed;
        let mut bytes = [0u8; 32];
        for chunk in bytes.chunks_mut(8) {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        Rng(Jitter::from_seed(bytes))
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.0.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.0.next_u64() >> 11) as f64) < p * (1u64 << 53) as f64
    }
}

/// Which assumption, if any, a run breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// Every fault, all within the model's assumptions.
    Model,
    /// No fault at all, short delays, keepers on time: every waiting acquisition must get its
    /// lock, no kept lock may be lost (liveness), and no key is left once every release
    /// returned and every client closed.
    Calm,
    /// No fault but one server too slow for the load, whose backlog grows: no key may be left
    /// on it once every release returned and every client closed.
    Slow,
    /// [`Scenario::Slow`] with script caches flushed now and then (`SCRIPT FLUSH`), the slow
    /// node's most often, so that what it answers after a round was decided meets
    /// `NOSCRIPT`: a release refused late must still go again with its body, and an extend's
    /// decision must not wait on the slow node past its round's end.
    SlowFlush,
    /// Crashed nodes restart at once, empty: no persistence, no delayed restart.
    InstantRestart,
    /// Node clocks jump forward by more than the drift allowance.
    ClockJump,
    /// Clients pause past their validity and then write without checking it.
    UncheckedPause,
    /// Crashed nodes restart after the longest TTL, as in the model, but without persistence.
    /// Lock keys have expired by then anyway; fence counters, which never expire, are lost.
    ForgetfulRestart,
    /// Every fault of [`Scenario::Model`], on quorums of which some or all members are Redis
    /// Clusters, plus the cluster's own: slots migrating mid-round (`ASK`, then `MOVED`, the
    /// keys moved as `MIGRATE` moves them), topology replies that lag behind a move, and
    /// failovers that lose the master's last writes, the replica promoted only once every TTL
    /// it could have lost ran out (as a crashed node without persistence stays down).
    ClusterModel,
    /// [`Scenario::ClusterModel`] with every member a cluster whose URL asks for `?wait=1`
    /// (a grant counts only once a replica has it): failovers promote the replica at once.
    ClusterWait,
    /// Clusters without `?wait` whose failovers promote a replica at once, without the
    /// master's last writes: grants are lost with them.
    LossyFailover,
    /// Every fault of [`Scenario::Model`], on quorums of which some or all members are
    /// masters managed by Redis Sentinel (`redis+sentinel://…?wait=1`), plus Sentinel's own
    /// (see the `sentinel` module): failovers to the replica that acknowledged the grants,
    /// sentinels that name the old master for a while, lost `+switch-master` messages, old
    /// masters back as replicas, sentinels down.
    SentinelModel,
    /// Sentinel members without `?wait` whose failovers promote a lagging replica at once,
    /// on a majority of members: grants are lost with them.
    SentinelLossy,
}

impl Scenario {
    /// Runs without faults, in which nothing of a lock may be left behind.
    fn calm(self) -> bool {
        matches!(self, Scenario::Calm | Scenario::Slow | Scenario::SlowFlush)
    }

    /// Runs within the model's assumptions, with every fault it allows.
    fn model(self) -> bool {
        matches!(
            self,
            Scenario::Model
                | Scenario::ClusterModel
                | Scenario::ClusterWait
                | Scenario::SentinelModel
        )
    }

    /// Runs with Redis Cluster members.
    fn clusters(self) -> bool {
        matches!(
            self,
            Scenario::ClusterModel | Scenario::ClusterWait | Scenario::LossyFailover
        )
    }
}

/// Which locks the simulated clients take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locks {
    /// The Redlock mutex.
    Mutex,
    /// Read-write locks: each cycle reads (shared) or writes (exclusive).
    ReadWrite,
    /// The mutex with fencing tokens.
    Fenced,
    /// Read locks and fenced write locks on the same resources.
    FencedWrite,
    /// All-or-none sets of keys, mixed with mutexes on single keys of the same sets.
    All,
    /// Counting semaphores of 2 or 3 permits, with the fewest slots per node and the smallest
    /// quorum they allow (or the slots equal to the permits and its smallest safe quorum).
    Semaphore,
    /// Counting semaphores with the naive majority quorum (and capacity k per node), which
    /// admits more than k holders: a broken assumption.
    NaiveSemaphore,
}

impl Locks {
    fn fenced(self) -> bool {
        matches!(self, Locks::Fenced | Locks::FencedWrite)
    }

    fn semaphore(self) -> bool {
        matches!(self, Locks::Semaphore | Locks::NaiveSemaphore)
    }
}

/// The settings of one run, drawn from its seed.
#[derive(Debug, Clone)]
struct Settings {
    locks: Locks,
    nodes: usize,
    clients: usize,
    /// Callers per client, sharing its endpoint.
    callers: usize,
    keys: usize,
    ttl_ms: u64,
    drift_factor: f64,
    node_timeout: Duration,
    connect_timeout: Duration,
    retry_delay: Duration,
    retry_count: u32,
    wait_timeout: Duration,
    /// Typical one-way delay bounds, in ns.
    delay: (u64, u64),
    /// Chance that a segment takes up to twice the TTL instead (and those behind it wait).
    long_delay: f64,
    /// Chance that a connection breaks before a segment written to it lands.
    request_loss: f64,
    /// Chance that a connection breaks after a command ran, before its reply arrives.
    reply_loss: f64,
    /// Chance that a release announcement to one subscriber is lost.
    wake_loss: f64,
    /// Chance that a write is split into segments that land apart.
    split: f64,
    /// How long a partitioned connection lives before the transport gives it up, in ns.
    dead_after: u64,
    /// Chance that a holder pauses between reading and writing the counter.
    pause: f64,
    /// Chance that a holder's work between reading and writing runs to its validity's last
    /// microseconds.
    pause_to_end: f64,
    /// Chance that a keeper runs late (by up to a TTL).
    slow_keeper: f64,
    /// Chance that a cycle takes its lock with `try_*` (one attempt).
    try_once: f64,
    /// Chance that a cycle keeps its lock alive.
    keep: f64,
    /// Chance that a client waits in fair queues.
    fair: f64,
    /// Nodes whose connection setup is refused (a wrong password).
    refused: usize,
    /// The servers require this password (and the clients' URLs carry it), and the clients
    /// select this database.
    password: Option<&'static str>,
    db: u32,
    /// A semaphore's permits, the slots per node and the quorum its clients use.
    permits: u32,
    slots: u32,
    quorum: usize,
    /// Which nodes run Redis 8 (hash-field commands), drawn apart from the rest (see
    /// [`Settings::versions`]).
    native: Vec<bool>,
    /// Chance that a restart of a node on its data upgrades it to Redis 8 (or downgrades it
    /// back to Redis 7, where its data allows).
    upgrade: f64,
    /// Per command, in ns, on each node: 0 for most; above the load on a slow one.
    service: Vec<u64>,
    /// Mean gap between fault events, in ns; 0 for none.
    fault_gap: u64,
    /// Masters of each member that is a Redis Cluster (each with one replica); 0 for a
    /// standalone member.
    masters: Vec<usize>,
    /// `?wait=N` on the cluster members' URLs.
    wait: u32,
    /// Cluster runs: a master of every member moves to a new address every 10 to 30 ms, for 5 s.
    readdress: bool,
    /// Replicas of each member that is a Sentinel-managed master (1 or 2); 0 for another.
    replicas: Vec<usize>,
    /// How often a cluster's replicas catch up with their masters, in ns.
    replication: u64,
    horizon: u64,
    cycles: u32,
}

impl Settings {
    fn draw(rng: &mut Rng, scenario: Scenario, locks: Locks) -> Settings {
        let ttl_ms = rng.range(50, 150);
        let nodes = if rng.chance(0.7) { 3 } else { 5 };
        // Many callers share one client, or a few clients have one or two each.
        let (clients, callers) = match rng.below(4) {
            0 => (rng.range(2, 4) as usize, 1),
            1 => (rng.range(1, 3) as usize, rng.range(2, 4) as usize),
            2 => (rng.range(1, 2) as usize, rng.range(4, 8) as usize),
            _ => (1, rng.range(8, 16) as usize),
        };
        let mut p = Settings {
            locks,
            nodes,
            clients,
            callers,
            keys: if locks == Locks::All {
                rng.range(2, 3) as usize
            } else {
                rng.range(1, 2) as usize
            },
            ttl_ms,
            drift_factor: 0.01,
            node_timeout: Duration::from_millis(rng.range(5, 20)),
            connect_timeout: Duration::from_millis(rng.range(ttl_ms / 2, 3 * ttl_ms)),
            retry_delay: Duration::from_millis(rng.range(5, 30)),
            retry_count: rng.range(5, 20) as u32,
            wait_timeout: Duration::from_millis(rng.range(300, 1000)),
            delay: (rng.range(50_000, 500_000), rng.range(500_000, 4 * MS)),
            long_delay: if rng.chance(0.3) { 0.02 } else { 0.0 },
            request_loss: if rng.chance(0.5) { 0.01 } else { 0.0 },
            reply_loss: if rng.chance(0.5) { 0.01 } else { 0.0 },
            wake_loss: if rng.chance(0.5) { 0.2 } else { 0.0 },
            split: if rng.chance(0.5) { 0.3 } else { 0.0 },
            dead_after: rng.range(ttl_ms / 2, 2 * ttl_ms) * MS,
            pause: 0.1,
            pause_to_end: 0.0,
            slow_keeper: 0.3,
            try_once: 0.15,
            keep: 0.25,
            fair: if rng.chance(0.5) { 0.5 } else { 0.0 },
            refused: 0,
            password: None,
            db: 0,
            permits: 1,
            slots: 1,
            quorum: nodes / 2 + 1,
            native: vec![false; nodes],
            upgrade: 0.0,
            service: vec![0; nodes],
            fault_gap: rng.range(ttl_ms / 2, 3 * ttl_ms) * MS,
            masters: vec![0; nodes],
            wait: 0,
            readdress: false,
            replicas: vec![0; nodes],
            replication: 0,
            horizon: 1500 * MS,
            cycles: rng.range(3, 8) as u32,
        };
        if rng.chance(0.3) {
            p.password = Some("sim-secret");
        }
        if rng.chance(0.2) {
            p.db = rng.range(1, 15) as u32;
        }
        if rng.chance(0.2) {
            // A server too slow for the load: a command every 0.2 to 2 ms.
            let slow = rng.below(nodes as u64) as usize;
            p.service[slow] = rng.range(200_000, 2 * MS);
        }
        if locks.semaphore() {
            // Enough callers on one key to fill every permit and want more.
            // One draw (as many as before the slots were chosen, so that the rest of a
            // seed's settings stay as they were): 2 or 3 permits, and in a quarter of the runs
            // as many slots per node as permits with their smallest safe quorum, else the
            // shape a client picks (the fewest slots per node, then the smallest quorum).
            // Not 4: on a quorum of every node (k = 4 at N = 5 is c = 4, q = 5), with a
            // server too slow for the load, runs outgrow the event budget.
            let draw = rng.below(8);
            p.permits = 2 + (draw % 2) as u32;
            (p.slots, p.quorum) = if locks == Locks::NaiveSemaphore {
                (p.permits, nodes / 2 + 1)
            } else if draw / 2 == 0 {
                (p.permits, crate::engine::sem::safe_quorum(p.permits, nodes))
            } else {
                crate::engine::sem::shape(p.permits, nodes)
            };
            p.keys = 1;
            if p.clients * p.callers <= p.permits as usize {
                p.clients = rng.range(u64::from(p.permits) + 1, u64::from(p.permits) + 3) as usize;
            }
        }
        if rng.chance(0.1) {
            // A minority refused (the lock works on the others), or too many for a quorum
            // (nothing is granted, and every wait ends with a configuration error, not with
            // contention or the wait's budget).
            let quorum = p.quorum;
            p.refused = if rng.chance(0.5) && quorum < nodes {
                1
            } else {
                nodes - quorum + 1
            };
        }
        match scenario {
            Scenario::Model => {}
            Scenario::ClusterModel | Scenario::ClusterWait => {
                // A cluster has database 0 only; misconfigured members are not what is tested.
                (p.refused, p.db) = (0, 0);
            }
            Scenario::SentinelModel => p.refused = 0,
            Scenario::SentinelLossy => {
                p.refused = 0;
                p.fault_gap = ttl_ms * MS / 2;
                p.request_loss = 0.02;
                p.pause = 0.0;
            }
            Scenario::LossyFailover => {
                (p.refused, p.db) = (0, 0);
                p.fault_gap = ttl_ms * MS / 2;
                p.request_loss = 0.02;
                p.pause = 0.0;
            }
            Scenario::Calm | Scenario::Slow | Scenario::SlowFlush => {
                if p.clients * p.callers < 3 {
                    p.clients = rng.range(3, 6) as usize;
                }
                p.keys = if locks == Locks::All { 2 } else { 1 };
                p.delay = (50_000, 500_000);
                (p.long_delay, p.request_loss, p.reply_loss, p.wake_loss) = (0.0, 0.0, 0.0, 0.0);
                (p.pause, p.slow_keeper, p.try_once) = (0.0, 0.0, 0.0);
                p.refused = 0;
                p.fault_gap = 0;
                // Wake-ups, not the backstop, drive the waiters: a retry count this small
                // is enough only if wake-up retries do not count against it.
                p.retry_delay = Duration::from_millis(1000);
                p.retry_count = rng.range(3, 6) as u32;
                p.wait_timeout = Duration::from_secs(60);
                p.cycles = rng.range(2, 5) as u32;
                p.horizon = 10_000 * MS;
                p.service = vec![0; nodes];
                if scenario != Scenario::Calm {
                    // Well below the offered load: a backlog of many node timeouts builds.
                    let slow = rng.below(nodes as u64) as usize;
                    p.service[slow] = rng.range(MS, 4 * MS);
                    p.cycles = rng.range(3, 6) as u32;
                }
                if scenario == Scenario::SlowFlush {
                    // Its only fault: script caches flushed now and then.
                    p.fault_gap = ttl_ms * MS;
                }
            }
            Scenario::InstantRestart | Scenario::ClockJump => {
                p.fault_gap = ttl_ms * MS / 4;
                p.request_loss = 0.02;
                p.pause = 0.0;
                p.refused = 0;
            }
            Scenario::ForgetfulRestart => {
                p.fault_gap = ttl_ms * MS;
                p.refused = 0;
            }
            Scenario::UncheckedPause if locks.semaphore() => {
                p.pause = 0.5;
                p.refused = 0;
            }
            Scenario::UncheckedPause => {
                p.clients = rng.range(3, 4) as usize;
                p.callers = 1;
                p.keys = if locks == Locks::All { 2 } else { 1 };
                p.pause = 0.5;
                p.refused = 0;
            }
        }
        p
    }

    /// Draws the nodes' server versions from their own generator, so that the rest of a seed's
    /// run does not depend on them: a third of the seeds run Redis 7 only, a third Redis 8
    /// only, a third a mix, in which restarts may upgrade or downgrade a node.
    fn versions(&mut self, seed: u64) {
        let mut rng = Rng::new(seed ^ 0x8e15_8e15_8e15_8e15);
        match rng.below(3) {
            0 => {}
            1 => self.native = vec![true; self.nodes],
            _ => {
                self.native = (0..self.nodes).map(|_| rng.chance(0.5)).collect();
                self.upgrade = 0.5;
            }
        }
    }

    /// Within the model, presses on the validity bound as hard as its assumptions allow,
    /// drawn from a generator of its own (as [`Settings::versions`]): a quarter of the seeds
    /// allow for 5 % drift, another for 10 %, and node clocks then drift by up to 95 % of the
    /// factor (see `run_locks`); a fifth (of those without refused setups) run TTLs of 15 to
    /// 50 ms, where the drift allowance's
    /// fixed 2 ms is a large part; and holders often work until their validity's last
    /// microseconds. Without the drift term, or with the validity counted from a round's
    /// decision rather than its start, grants then outlive their keys within a few dozen seeds.
    fn pressure(&mut self, seed: u64, scenario: Scenario) {
        if !scenario.model() {
            return;
        }
        let mut rng = Rng::new(seed ^ 0xd21f_d21f_d21f_d21f);
        self.drift_factor = match rng.below(4) {
            0 => 0.05,
            1 => 0.1,
            _ => 0.01,
        };
        // Not where setups are refused: there a wait must learn of the refusal within its
        // budget, which a TTL this short leaves no room for when the setup is slow.
        if rng.chance(0.2) && self.refused == 0 {
            self.ttl_ms = rng.range(15, 50);
        }
        self.pause_to_end = 0.15;
    }

    /// The callers of all clients.
    fn all_callers(&self) -> usize {
        self.clients * self.callers
    }
}

const REDIS_7: (u16, u16, u16) = (7, 0, 15);
const REDIS_8: (u16, u16, u16) = (8, 2, 3);

/// A node's memory as the simulation runs it: a hash whose fields all expired is deleted by
/// the expiry cycle 20 ms later, unless a field access deletes it first.
fn node_memory() -> Node {
    let mut node = Node::default();
    node.hash_expiry_lag = Some(20);
    node
}

/// Faults and work, counted over one or many runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    pub seeds: u64,
    pub events: u64,
    /// Callers that ran lock cycles, and the most of them sharing one client.
    pub callers: u64,
    pub most_callers: u64,
    /// Acquisitions started (each runs one or more attempts).
    pub acquisitions: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub clock_jumps: u64,
    pub pauses: u64,
    /// Segments written that never landed, the connection having broken first.
    pub lost_requests: u64,
    /// Segments of replies lost with their connection.
    pub lost_replies: u64,
    pub long_delays: u64,
    /// Writes split into segments that land apart.
    pub split_writes: u64,
    /// Command connections reset by a fault, and those reset with some of what was written
    /// landed and some not.
    pub resets: u64,
    pub mid_batch_resets: u64,
    /// Commands that ran after their connection broke (written before, landed before the
    /// break).
    pub late_commands: u64,
    /// Connections the transport gave up on (a partition).
    pub dead_connections: u64,
    /// Subscriber connections reset (their subscriptions gone until the next subscribe).
    pub subscriber_resets: u64,
    /// Release announcements delivered to a subscriber, and lost on the way.
    pub wakes: u64,
    pub lost_wakes: u64,
    /// Runs with nodes whose connection setup was refused, and the refusals.
    pub refused_runs: u64,
    pub setup_refusals: u64,
    /// Connections refused for the maximum number of clients (a transient setup failure).
    pub max_clients: u64,
    /// Restarts that loaded the data for a while, and commands answered `LOADING`.
    pub loading_restarts: u64,
    pub loading_replies: u64,
    /// Acquisitions that ended with a configuration error.
    pub config_errors: u64,
    /// Periods in which a node refused writes, and the commands it refused then.
    pub refusals: u64,
    pub refused_commands: u64,
    /// Server pauses (the process stopped), and runs with a server too slow for the load.
    pub server_pauses: u64,
    pub slow_runs: u64,
    /// Script caches flushed (`SCRIPT FLUSH`) while their node ran.
    pub script_flushes: u64,
    /// The longest backlog of commands a server had, in ms of its work.
    pub longest_backlog_ms: u64,
    /// Clients closed, and those closed with replies still owed.
    pub closes: u64,
    pub closes_owing: u64,
    /// Grants by what they held.
    pub grants: u64,
    pub fair_grants: u64,
    /// Fair grants checked against waiters queued ahead of them (calm runs).
    pub fifo_checked: u64,
    pub set_grants: u64,
    pub fenced_grants: u64,
    /// Read grants whose window overlapped another reader's: readers really shared.
    pub shared_reads: u64,
    /// Fenced grants that needed the write-back round.
    pub write_backs: u64,
    /// Releases that returned, and those that returned `Ok`.
    pub releases: u64,
    pub releases_ok: u64,
    /// Extends asked for by holders, those with a TTL shorter than the lock's, and those lost.
    pub extends: u64,
    pub shorter_extends: u64,
    pub lost_extends: u64,
    /// Writes made after a lost extend, within the validity it left.
    pub writes_after_lost_extend: u64,
    /// Kept locks, keeper rounds, keepers that ran late, and kept locks lost.
    pub kept: u64,
    pub keeper_rounds: u64,
    pub slow_keepers: u64,
    pub kept_lost: u64,
    /// Write locks downgraded to read locks, and downgrade rounds lost (undone).
    pub downgrades: u64,
    pub lost_downgrades: u64,
    /// Runs whose quorum mixed Redis 7 and Redis 8 nodes, restarts that changed a server's
    /// version on its data (up, and down), and commands sent without Lua to Redis 8 nodes
    /// (`HSETEX`, `MULTI` blocks).
    pub mixed_runs: u64,
    pub upgrades: u64,
    pub server_downgrades: u64,
    pub native_commands: u64,
    /// Runs with cluster members; slot migrations (and those done at once), keys moved,
    /// topology replies that lagged behind a move (the nodes that lagged, the replies),
    /// failovers (and those whose promoted replica lacked some of the master's keys); what
    /// the clusters answered: topology reads, `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, and
    /// `WAIT` (and those a replica reached).
    pub cluster_runs: u64,
    /// Runs whose quorum mixed cluster members and standalone servers.
    pub mixed_cluster_runs: u64,
    pub migrations: u64,
    pub moves_at_once: u64,
    /// Subscriber connections told `sunsubscribe` by a master that a slot left.
    pub shard_unsubscribes: u64,
    pub keys_migrated: u64,
    pub stale_views: u64,
    pub stale_topology_reads: u64,
    pub failovers: u64,
    pub lossy_failovers: u64,
    pub topology_reads: u64,
    pub moved: u64,
    pub asks: u64,
    pub tryagains: u64,
    pub clusterdowns: u64,
    pub waits: u64,
    pub waits_reached: u64,
    /// Failovers whose replica, with every write of its master, was promoted within a
    /// fraction of a TTL; slots moved at once whose old owner was slow after; runs with a
    /// cluster of more than 64 masters; idle-then-check steps run.
    pub quick_failovers: u64,
    pub slow_old_owners: u64,
    pub big_clusters: u64,
    pub idle_checks: u64,
    /// Masters moved to a new address (the old one gone), and the most under one run.
    pub readdresses: u64,
    pub most_readdresses: u64,
    /// Connections whose replies waited unread while their client was idle and untended.
    pub unread_landings: u64,
    /// Last cycles that met a fault of their own while holding or releasing (see
    /// [`World::tail`]): connections broken, quick failovers, slots moved at once with a
    /// slow old owner.
    pub tail_breaks: u64,
    pub tail_failovers: u64,
    pub tail_moves: u64,
    /// Runs with Sentinel members; questions sentinels answered (and with an old master, a
    /// view lagging behind a failover); `+switch-master` messages delivered and lost; ROLE
    /// replies saying `slave`; masters demoted to replicas with their connections up; old
    /// masters back as replicas; sentinels down.
    pub sentinel_runs: u64,
    pub sentinel_questions: u64,
    pub stale_answers: u64,
    pub switches: u64,
    pub lost_switches: u64,
    pub replica_roles: u64,
    pub demotions: u64,
    pub rejoins: u64,
    pub sentinels_down: u64,
    /// Last cycles whose writer's withdrawal of its intent met a broken connection (see
    /// [`World::withdrawal_meets_a_break`]).
    pub broken_withdrawals: u64,
}

impl Stats {
    fn absorb(&mut self, o: &Stats) {
        macro_rules! add {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        add!(
            seeds,
            events,
            callers,
            acquisitions,
            crashes,
            partitions,
            clock_jumps,
            pauses,
            lost_requests,
            lost_replies,
            long_delays,
            split_writes,
            resets,
            mid_batch_resets,
            late_commands,
            dead_connections,
            subscriber_resets,
            wakes,
            lost_wakes,
            refused_runs,
            setup_refusals,
            max_clients,
            loading_restarts,
            loading_replies,
            config_errors,
            refusals,
            refused_commands,
            server_pauses,
            slow_runs,
            script_flushes,
            closes,
            closes_owing,
            grants,
            fair_grants,
            fifo_checked,
            set_grants,
            fenced_grants,
            shared_reads,
            write_backs,
            releases,
            releases_ok,
            extends,
            shorter_extends,
            lost_extends,
            writes_after_lost_extend,
            kept,
            keeper_rounds,
            slow_keepers,
            kept_lost,
            downgrades,
            lost_downgrades,
            mixed_runs,
            upgrades,
            server_downgrades,
            native_commands,
            cluster_runs,
            mixed_cluster_runs,
            migrations,
            moves_at_once,
            shard_unsubscribes,
            keys_migrated,
            stale_views,
            stale_topology_reads,
            failovers,
            lossy_failovers,
            topology_reads,
            moved,
            asks,
            tryagains,
            clusterdowns,
            waits,
            waits_reached,
            quick_failovers,
            slow_old_owners,
            big_clusters,
            idle_checks,
            readdresses,
            unread_landings,
            tail_breaks,
            tail_failovers,
            tail_moves,
            sentinel_runs,
            sentinel_questions,
            stale_answers,
            switches,
            lost_switches,
            replica_roles,
            demotions,
            rejoins,
            sentinels_down,
            broken_withdrawals
        );
        self.most_readdresses = self.most_readdresses.max(o.most_readdresses);
        self.most_callers = self.most_callers.max(o.most_callers);
        self.longest_backlog_ms = self.longest_backlog_ms.max(o.longest_backlog_ms);
    }

    fn faults(&self) -> u64 {
        self.crashes
            + self.partitions
            + self.clock_jumps
            + self.pauses
            + self.lost_requests
            + self.lost_replies
            + self.long_delays
            + self.resets
            + self.dead_connections
            + self.subscriber_resets
            + self.lost_wakes
            + self.setup_refusals
            + self.max_clients
            + self.loading_restarts
            + self.refusals
            + self.server_pauses
            + self.slow_keepers
            + self.migrations
            + self.stale_views
            + self.failovers
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} seeds, {} events, {} callers (up to {} on one client), {} acquisitions, \
             {} grants ({} fair, {} checked for queue order, {} sets, {} fenced), {} releases \
             ({} Ok); \
             {} faults: {} crashes, {} partitions, {} clock jumps, {} holder pauses, \
             {} segments lost with their connection ({} replies), {} long delays, {} split \
             writes, {} connection resets ({} mid-batch, {} commands ran after their \
             connection broke), {} connections given up in partitions, {} subscriber resets, \
             {} wakes lost ({} delivered), {} setup refusals in {} runs ({} configuration \
             errors), {} connections over the client limit, {} restarts loading ({} LOADING \
             replies), {} write refusals ({} commands refused), {} server pauses, {} runs with \
             a slow server (longest backlog {} ms), {} slow keepers; {} clients closed ({} \
             owing replies); {} shared reads, {} fence write-backs; {} extends ({} shorter, {} \
             lost, {} writes after a lost one); {} kept locks ({} keeper rounds, {} lost); {} \
             downgrades ({} lost); {} runs mixing Redis 7 and 8 nodes, {} upgrades, {} \
             downgrades of a server, {} commands without Lua",
            self.seeds,
            self.events,
            self.callers,
            self.most_callers,
            self.acquisitions,
            self.grants,
            self.fair_grants,
            self.fifo_checked,
            self.set_grants,
            self.fenced_grants,
            self.releases,
            self.releases_ok,
            self.faults(),
            self.crashes,
            self.partitions,
            self.clock_jumps,
            self.pauses,
            self.lost_requests + self.lost_replies,
            self.lost_replies,
            self.long_delays,
            self.split_writes,
            self.resets,
            self.mid_batch_resets,
            self.late_commands,
            self.dead_connections,
            self.subscriber_resets,
            self.lost_wakes,
            self.wakes,
            self.setup_refusals,
            self.refused_runs,
            self.config_errors,
            self.max_clients,
            self.loading_restarts,
            self.loading_replies,
            self.refusals,
            self.refused_commands,
            self.server_pauses,
            self.slow_runs,
            self.longest_backlog_ms,
            self.slow_keepers,
            self.closes,
            self.closes_owing,
            self.shared_reads,
            self.write_backs,
            self.extends,
            self.shorter_extends,
            self.lost_extends,
            self.writes_after_lost_extend,
            self.kept,
            self.keeper_rounds,
            self.kept_lost,
            self.downgrades,
            self.lost_downgrades,
            self.mixed_runs,
            self.upgrades,
            self.server_downgrades,
            self.native_commands
        )?;
        if self.tail_breaks + self.tail_failovers + self.tail_moves > 0 {
            write!(
                f,
                "; last cycles meeting a fault: {} connections broken, {} quick failovers, {} \
                 slots moved with a slow old owner",
                self.tail_breaks, self.tail_failovers, self.tail_moves
            )?;
        }
        if self.cluster_runs > 0 {
            write!(
                f,
                "; {} runs with clusters ({} mixed with standalone servers): {} slot migrations ({} at once, {} keys moved), {} \
                 topology views lagging ({} stale replies), {} failovers ({} without some of \
                 the master's keys); {} topology reads, {} MOVED, {} ASK, {} TRYAGAIN, {} \
                 CLUSTERDOWN, {} WAIT ({} reached a replica), {} sunsubscribe pushes; {} quick \
                 failovers, {} slow old owners, {} runs with over 64 masters, {} idle checks, {} masters \
                 moved to a new address (at most {} in a run), {} replies left unread while idle",
                self.cluster_runs,
                self.mixed_cluster_runs,
                self.migrations,
                self.moves_at_once,
                self.keys_migrated,
                self.stale_views,
                self.stale_topology_reads,
                self.failovers,
                self.lossy_failovers,
                self.topology_reads,
                self.moved,
                self.asks,
                self.tryagains,
                self.clusterdowns,
                self.waits,
                self.waits_reached,
                self.shard_unsubscribes,
                self.quick_failovers,
                self.slow_old_owners,
                self.big_clusters,
                self.idle_checks,
                self.readdresses,
                self.most_readdresses,
                self.unread_landings
            )?;
        }
        if self.sentinel_runs > 0 {
            write!(
                f,
                "; {} runs with Sentinel members: {} failovers ({} without some of the \
                 master's keys, {} masters demoted in place, {} old masters back as replicas), \
                 {} sentinel questions ({} answered with an old master), {} +switch-master \
                 ({} lost), {} ROLE slave, {} sentinels down, {} WAIT ({} reached a replica)",
                self.sentinel_runs,
                self.failovers,
                self.lossy_failovers,
                self.demotions,
                self.rejoins,
                self.sentinel_questions,
                self.stale_answers,
                self.switches,
                self.lost_switches,
                self.replica_roles,
                self.sentinels_down,
                self.waits,
                self.waits_reached
            )?;
        }
        Ok(())
    }
}

/// A simulated server process, and the machine it runs on.
struct SimNode {
    server: Server,
    up: bool,
    /// Bumped at every crash: connections the process before accepted are gone with it.
    incarnation: u64,
    /// Wall clock = `offset + t + t * ppm / 1e6`, in ns.
    offset: i64,
    ppm: i64,
    last_forward_jump: Option<u64>,
    /// Its setup is refused: it requires a password the clients do not have. No fault
    /// reaches it, so that the refusal is all a client can learn of it.
    refused: bool,
    /// Commands received and not yet run, oldest first.
    backlog: VecDeque<Work>,
    /// Busy (running a command, or stopped) until then.
    busy_until: u64,
    /// A run of the backlog is scheduled.
    exec_scheduled: bool,
    /// Time per command, in ns.
    service: u64,
    /// The next this many connections are refused for the maximum number of clients.
    reject_connects: u32,
    /// Bumped when a refusal of writes starts, so that only the last one's end ends it.
    refusal_gen: u64,
    /// Its place in a cluster member, if it is a node of one.
    place: Option<cluster::Place>,
}

impl SimNode {
    fn clock_ms(&self, t: u64) -> i64 {
        let t = t as i64;
        (self.offset + t + t * self.ppm / 1_000_000).div_euclid(MS as i64)
    }
}

/// A command a server received and has not run yet.
struct Work {
    sock: usize,
    command: Vec<u8>,
    /// Where it ends in its connection's stream.
    end: u64,
}

/// What travels from a client to a server on one connection, in order.
enum Seg {
    /// The connect.
    Syn,
    /// Bytes written, starting at `offset` in the connection's stream.
    Data { offset: u64, bytes: Vec<u8> },
}

/// What travels back, in order.
enum Back {
    /// The connect is accepted.
    Accepted,
    /// Nothing listens there (the server is down): the connect is refused.
    Refused,
    Data(Vec<u8>),
    /// The server's end is gone.
    Closed(NodeErrorKind),
}

/// One TCP connection between a client and a server: its client end and its server end.
struct Sock {
    client: usize,
    id: ConnId,
    /// The server process it connects to (the endpoint's link `id.node` may be any node of a
    /// cluster member).
    server: usize,
    /// The client still has it: no failure reported, not closed.
    open: bool,
    /// The client knows it is connected.
    connected: bool,
    /// Bytes the client wrote to it so far.
    sent: u64,
    /// Each way, what is on its way, with its arrival time, and whether a partition holds it.
    to_server: VecDeque<(u64, Seg)>,
    to_client: VecDeque<(u64, Back)>,
    /// Each way: a partition holds it; a landing is scheduled.
    held: [bool; 2],
    landing: [bool; 2],
    /// The server process that accepted it.
    accepted: Option<u64>,
    session: Session,
    /// The server's end is there: replies go out.
    server_open: bool,
    /// After a break: how much of the stream may still land (and run), at most.
    cut: Option<u64>,
    /// The server refused its setup (a wrong password).
    setup_refused: bool,
}

/// The machine a caller is driving, if any.
enum Job<'a> {
    None,
    Acquire(Box<Acquisition<'a>>),
    Round(Box<HoldRound<'a>>, Purpose),
}

/// Why a hold round was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The holder extends its lock itself.
    Extend {
        ttl_ms: u64,
    },
    /// The keeper extends a kept lock.
    Keep,
    Release,
    /// The holder of a write lock downgrades it to a read lock; the round started at `at`
    /// (virtual ns).
    Downgrade {
        at: u64,
    },
}

/// What a cycle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Mutex,
    Read,
    Write,
    Permit,
}

/// The lock a cycle takes, and what it holds once granted.
struct Cycle<'a> {
    spec: Spec<'a>,
    /// The history's ops (one per key of a set).
    ops: Vec<usize>,
    keys: Vec<usize>,
    side: Side,
    wait: bool,
    keep: Option<Schedule>,
    held: Option<Held>,
    /// Its queue entry (its kind, then its waiter id), and (in calm runs) the waiters that
    /// were queued on a quorum when it started, with the tickets they queued with.
    member: Vec<u8>,
    ahead: Vec<(Vec<u8>, f64)>,
    /// The TTL its keys are written with, in ms: the run's, or (a last cycle within the
    /// model) [`LAST_TTL_MS`] more.
    ttl_ms: u64,
    /// A writer's waiter id, which names its intent; empty for the others.
    waiter: Vec<u8>,
}

struct Held {
    /// Which grant (every grant of the run has its own number).
    grant: u64,
    token: Token,
    hold: Hold,
    /// Work steps (read, then write) left.
    steps: u32,
    reading: bool,
    read: Vec<u64>,
    kept: Option<KeptValidity>,
    /// The holder is done, and releases once the keeper's round in flight is over.
    release_wanted: bool,
    releasing: bool,
    lost_extend: bool,
}

/// Timer slots of a caller.
const MACHINE: usize = 0;
const HOLDER: usize = 1;
const KEEPER: usize = 2;

/// One caller of a client's endpoint: a thread running lock cycles.
struct Caller<'a> {
    id: CallerId,
    /// Its number in the history, over every client's callers.
    global: u64,
    /// The loop (and the endpoint's run) of the machine being driven.
    lp: Option<CallerLoop>,
    job: Job<'a>,
    cycle: Option<Cycle<'a>>,
    /// Carried from one acquisition to the next, as the driver does.
    spread: Duration,
    timers: [u64; 3],
    cycles_left: u32,
    /// No cycle left to run.
    done: bool,
    /// Where it is with its last cycle, run once every fault healed (runs within the model).
    last: Last,
    /// When its operation under way (an acquisition, or a round of its held lock) began, in
    /// ns: it must return within [`World::live_bound`].
    since: Option<u64>,
}

/// A caller's last cycle, run within the model once every fault healed: what its release
/// owes every node must reach them while the client stays idle (see [`World::left_check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Last {
    /// To run once the faults are over.
    Due,
    /// Running now.
    Running,
    /// Run, or not run at all.
    Over,
}

/// A release of a last cycle (see [`Last`]), to be looked for on the nodes: none of them may
/// still hold its token once nothing of its client is in flight to them.
struct LeftCheck {
    client: usize,
    token: Token,
    names: Vec<Vec<u8>>,
    /// When the release returned, in ns.
    at: u64,
    /// Still to look at: its client does not close meanwhile.
    pending: bool,
}

/// A writer's intent on a node, looked for there (see [`World::intent_check`]).
struct IntentCheck {
    client: usize,
    node: usize,
    /// The intent set, and the waiter id that names the writer's intent in it.
    name: Vec<u8>,
    waiter: Vec<u8>,
}

/// A simulated client: one endpoint, shared by its callers.
struct Client<'a> {
    config: &'a Config,
    ep: Endpoint,
    /// The socket of each of the endpoint's connections (by [`ConnId::index`]), if any.
    socks: Vec<Option<usize>>,
    callers: Vec<Caller<'a>>,
    /// This client's wall clock offset (fair queue tickets), in ns.
    clock: u64,
    /// The tickets it hands its fair waiters, as a process does.
    tickets: Tickets,
    /// The endpoint's timer: its id, and when it is set for.
    timer: (u64, Option<u64>),
    /// Warming up its connections, as a client does before its first lock, until then.
    warming: Option<u64>,
    closing: bool,
    closed: bool,
}

#[derive(Debug)]
enum Ev {
    /// The head of what travels on a connection arrives (at the server, or `back` at the
    /// client).
    Land {
        sock: usize,
        back: bool,
    },
    /// A server runs what its backlog holds.
    Exec {
        node: usize,
    },
    Timer {
        client: usize,
        caller: usize,
        slot: usize,
        id: u64,
    },
    /// The endpoint's timer.
    Endpoint {
        client: usize,
        id: u64,
    },
    /// A client's warm-up is over, whatever it came to.
    WarmedUp {
        client: usize,
    },
    Fault,
    Restart {
        node: usize,
    },
    /// A partition heals; the transport gives up the connections it still cuts after
    /// `dead_after`.
    Heal {
        generation: u64,
    },
    Dead {
        generation: u64,
    },
    RefusalEnds {
        node: usize,
        generation: u64,
    },
    LoadingEnds {
        node: usize,
        incarnation: u64,
    },
    /// A cluster member's replicas catch up with their masters.
    Replicate {
        member: usize,
    },
    /// The replica of a cluster member's failed master is promoted.
    Promote {
        member: usize,
        shard: usize,
    },
    /// A failed master comes back, as a replica of the one promoted in its place.
    Rejoin {
        member: usize,
        shard: usize,
    },
    /// The next key of a slot migrating between two masters of a cluster member moves.
    MigrateKey {
        member: usize,
    },
    /// The migrating slot is the target's, on every node.
    MigrationEnds {
        member: usize,
    },
    /// A last cycle's release is looked for on the nodes (see [`World::left_check`]).
    LeftCheck {
        check: usize,
    },
    /// A client's command connection to a node breaks (see
    /// [`World::withdrawal_meets_a_break`]).
    BreakTo {
        client: usize,
        node: usize,
    },
    /// A writer's intent is looked for on a node (see [`World::intent_check`]).
    IntentCheck {
        check: usize,
    },
    /// A cluster master moves to a new address (see [`World::readdress`]).
    Readdress {
        member: usize,
        shard: usize,
    },
    /// Cluster runs: whether every client is idle and every fault healed (see
    /// [`World::idle_check`]).
    IdleCheck,
    /// A last cycle's hold (or its release, on its way) meets a fault (see [`World::tail`]).
    Tail {
        client: usize,
        caller: usize,
        grant: u64,
    },
    /// Something of a Sentinel member (see the `sentinel` module).
    Sentinel(sentinel::Event),
    /// The last instant of a grant's validity: what the nodes hold of it is looked at.
    ValidityEnd {
        client: usize,
        caller: usize,
        grant: u64,
        /// The validity's end, in ns.
        until: u64,
    },
}

struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// At most this many events per run: a run that does not settle is a bug in the simulation.
const MAX_EVENTS: u64 = 4_000_000;

/// What the clients' locks are made of, owned for the whole run: the machines borrow it.
struct Arena {
    configs: Vec<Arc<Config>>,
    keys: Vec<Vec<u8>>,
    rw: Vec<RwKeys>,
    fences: Vec<Vec<u8>>,
    write_fences: Vec<Vec<u8>>,
    sems: Vec<SemKeys>,
}

struct World<'a> {
    scenario: Scenario,
    p: Settings,
    rng: Rng,
    base: Instant,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Queued>>,
    nodes: Vec<SimNode>,
    /// The state of each member that is a Redis Cluster.
    clusters: Vec<Option<cluster::Cluster>>,
    /// The state of each member that is a Sentinel-managed master.
    sentinels: Vec<Option<sentinel::Watched>>,
    /// The hash slots the run's lock keys live in.
    lock_slots: Vec<u16>,
    clients: Vec<Client<'a>>,
    socks: Vec<Sock>,
    arena: &'a Arena,
    /// Every all-or-none set of keys (sorted), for `Keys::All`.
    sets: &'a [Vec<&'a [u8]>],
    /// Storage for the holds that hold rounds update.
    holds: std::slice::IterMut<'a, Hold>,
    /// `blocked[client][node]`: a partition cuts that link.
    blocked: Vec<Vec<bool>>,
    partition: u64,
    counters: Vec<u64>,
    history: History,
    stats: Stats,
    /// What the engine got wrong beyond the history's reach (liveness, configuration errors).
    failures: Vec<String>,
    /// The releases of the last cycles, looked for on the nodes.
    left_checks: Vec<LeftCheck>,
    /// The intents of writers whose withdrawal met a broken connection, looked for on their
    /// node (see [`World::intent_check`]).
    intent_checks: Vec<IntentCheck>,
    /// When a last cycle first found every fault healed, in ns (see [`World::unavailable`]).
    quiet_since: Option<u64>,
    /// In calm runs, the fair waiters by their queue entry: their client, and how far its
    /// ticket is past its wall clock when it started (two waiters of one client that start at
    /// once have tickets a microsecond apart).
    fair_waiters: BTreeMap<Vec<u8>, (usize, i64)>,
    trace: bool,
    /// Cluster runs: where the idle-then-check step is (see [`World::idle_check`]).
    idle: cluster::Idle,
}

/// What one seed produced.
pub(crate) struct Outcome {
    pub history: History,
    pub report: Report,
    pub stats: Stats,
    /// Violations the history checker does not see: a configuration error retried or
    /// reported as something else, or (in calm runs) a wait that did not get its lock, or a
    /// kept lock lost.
    pub failures: Vec<String>,
}

impl Outcome {
    /// The history's violations plus the failures.
    pub fn violations(&self) -> u64 {
        self.report.violations() + self.failures.len() as u64
    }
}

/// Runs one seed of `scenario` with mutexes.
pub(crate) fn run(seed: u64, scenario: Scenario, trace: bool) -> Outcome {
    run_locks(seed, scenario, Locks::Mutex, trace)
}

fn key_name(k: usize) -> Vec<u8> {
    format!("lock:{k}").into_bytes()
}

/// Runs one seed of `scenario` with clients that take `locks`.
pub(crate) fn run_locks(seed: u64, scenario: Scenario, locks: Locks, trace: bool) -> Outcome {
    let mut rng = Rng::new(seed);
    let mut p = Settings::draw(&mut rng, scenario, locks);
    p.versions(seed);
    p.pressure(seed, scenario);
    p.clusters(seed, scenario);
    p.sentinels(seed, scenario);
    let mut layout = cluster::layout(&p.masters);
    sentinel::layout(&p, &mut layout);
    let addrs: Vec<NodeAddr> = (0..p.nodes)
        .map(|i| {
            let auth = p.password.map_or(String::new(), |pw| format!(":{pw}@"));
            if p.replicas[i] > 0 {
                return sentinel::url(&p, &layout, i, &auth);
            }
            if p.masters[i] > 0 {
                let seeds: Vec<String> = cluster::seeds(&layout, i)
                    .map(|n| format!("127.0.0.1:{}", cluster::port(n)))
                    .collect();
                let wait = if p.wait > 0 {
                    format!("?wait={}", p.wait)
                } else {
                    String::new()
                };
                let url = format!("redis+cluster://{auth}{}{wait}", seeds.join(","));
                return NodeAddr::parse(&url).expect("a cluster address");
            }
            let db = if p.db == 0 {
                String::new()
            } else {
                format!("/{}", p.db)
            };
            NodeAddr::parse(&format!("redis://{auth}127.0.0.1:{}{db}", cluster::port(i)))
                .expect("an address")
        })
        .collect();
    // One configuration per fairness and policy.
    let configs = [(false, false), (false, true), (true, false), (true, true)]
        .into_iter()
        .map(|(fair, write_preferring)| {
            Arc::new(Config {
                nodes: addrs.clone(),
                node_timeout: p.node_timeout,
                connect_timeout: p.connect_timeout,
                // The simulated transport gives a cut connection up after `dead_after`.
                dead_peer_timeout: Duration::from_nanos(p.dead_after),
                retry_count: p.retry_count,
                retry_delay: p.retry_delay,
                wait_timeout: p.wait_timeout,
                drift_factor: p.drift_factor,
                fair,
                fair_after: Duration::ZERO,
                limits: Limits::default(),
                rw_policy: if write_preferring {
                    RwPolicy::WritePreferring
                } else {
                    RwPolicy::ReadPreferring
                },
                masters: Default::default(),
            })
        })
        .collect();
    // A cluster runs a script only on keys of one slot, and the library refuses an all-or-none
    // set whose keys hash to several (`InvalidArgument::KeysInSeveralSlots`): with cluster
    // members, the keys of all-or-none runs share one hash tag, as the README asks of callers.
    let keys: Vec<Vec<u8>> = (0..p.keys)
        .map(|k| {
            if scenario.clusters() && p.locks == Locks::All {
                format!("{{lock}}:{k}").into_bytes()
            } else {
                key_name(k)
            }
        })
        .collect();
    let rw: Vec<RwKeys> = keys.iter().map(|k| RwKeys::new(k)).collect();
    let arena = Arena {
        configs,
        fences: keys.iter().map(|k| fence_key(k)).collect(),
        write_fences: rw.iter().map(|k| fence_key(k.writer())).collect(),
        sems: keys.iter().map(|k| SemKeys::new(k)).collect(),
        keys,
        rw,
    };
    // Every set of two keys or more, sorted (the keys' names sort as their numbers).
    let sets: Vec<Vec<&[u8]>> = (1u32..1 << p.keys)
        .filter(|m| m.count_ones() >= 2)
        .map(|m| {
            (0..p.keys)
                .filter(|k| m & 1 << k != 0)
                .map(|k| arena.keys[k].as_slice())
                .collect()
        })
        .collect();
    let mut holds = vec![Hold::new(Instant::now()); 1 << 15];
    run_world(
        seed, scenario, p, rng, &arena, &sets, &mut holds, trace, layout,
    )
}

/// A run id: 40 hex digits.
fn run_id(rng: &mut Rng) -> [u8; 40] {
    let mut id = [0u8; 40];
    for b in &mut id {
        *b = b"0123456789abcdef"[rng.below(16) as usize];
    }
    id
}

#[allow(clippy::too_many_arguments)]
fn run_world<'a>(
    seed: u64,
    scenario: Scenario,
    p: Settings,
    mut rng: Rng,
    arena: &'a Arena,
    sets: &'a [Vec<&'a [u8]>],
    holds: &'a mut [Hold],
    trace: bool,
    layout: Vec<cluster::Place>,
) -> Outcome {
    let base = Instant::now();
    // Within the model, relative drift stays under the factor: up to 95 % of it.
    let max_ppm = match scenario {
        s if s.model() => (p.drift_factor * 0.95 * 1e6) as u64,
        _ => 0,
    };
    let refused: Vec<usize> = {
        let mut r = Vec::new();
        while r.len() < p.refused {
            let n = rng.below(p.nodes as u64) as usize;
            if !r.contains(&n) {
                r.push(n);
            }
        }
        r
    };
    let mut nodes: Vec<SimNode> = (0..layout.len())
        .map(|i| {
            let i = layout[i].member;
            let version = if p.native[i] { REDIS_8 } else { REDIS_7 };
            let mut server = Server::new(node_memory(), version, run_id(&mut rng));
            server.password = if refused.contains(&i) {
                Some(b"another-secret".to_vec())
            } else {
                p.password.map(|pw| pw.as_bytes().to_vec())
            };
            SimNode {
                server,
                refused: refused.contains(&i),
                up: true,
                incarnation: 0,
                offset: rng.range(1 << 40, 1 << 41) as i64,
                ppm: rng.range(0, 2 * max_ppm) as i64 - max_ppm as i64,
                last_forward_jump: None,
                backlog: VecDeque::new(),
                busy_until: 0,
                exec_scheduled: false,
                // Nor is it slow: its refusal comes well within a node timeout.
                service: if refused.contains(&i) {
                    0
                } else {
                    p.service[i]
                },
                reject_connects: 0,
                refusal_gen: 0,
                place: None,
            }
        })
        .collect();
    let clusters = cluster::build(&p, &layout, &mut nodes);
    let sentinels = sentinel::build(&p, &layout, &mut nodes);
    let clients = (0..p.clients)
        .map(|c| {
            let fair = rng.chance(p.fair);
            let write_preferring = rng.chance(0.5);
            let config = &arena.configs[usize::from(fair) * 2 + usize::from(write_preferring)];
            let mut ep = Endpoint::new(config.clone(), Arc::new(Recorder::new(p.nodes)), base);
            let callers = (0..p.callers)
                .map(|k| Caller {
                    id: ep.open_caller(),
                    global: (c * p.callers + k) as u64,
                    lp: None,
                    job: Job::None,
                    cycle: None,
                    spread: Duration::ZERO,
                    timers: [0; 3],
                    cycles_left: p.cycles,
                    done: false,
                    last: if scenario.model() {
                        Last::Due
                    } else {
                        Last::Over
                    },
                    since: None,
                })
                .collect();
            Client {
                config,
                ep,
                socks: vec![None; 2 * p.nodes],
                callers,
                clock: rng.range(0, 2 * MS),
                tickets: Tickets::new(),
                timer: (0, None),
                warming: Some(p.connect_timeout.as_nanos() as u64),
                closing: false,
                closed: false,
            }
        })
        .collect();
    let mixed = p.native.contains(&true) && p.native.contains(&false);
    let slow = p.service.iter().any(|&s| s > 0);
    let p_clients = p.clients;
    let mut w = World {
        scenario,
        blocked: vec![vec![false; nodes.len()]; p.clients],
        partition: 0,
        counters: vec![0; p.keys],
        rng,
        base,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        nodes,
        clusters,
        sentinels,
        lock_slots: cluster::lock_slots(arena),
        clients,
        socks: Vec::new(),
        arena,
        sets,
        holds: holds.iter_mut(),
        history: History::default(),
        stats: Stats {
            seeds: 1,
            callers: p.all_callers() as u64,
            most_callers: p.callers as u64,
            refused_runs: u64::from(!refused.is_empty()),
            mixed_runs: u64::from(mixed),
            slow_runs: u64::from(slow),
            ..Stats::default()
        },
        p,
        failures: Vec::new(),
        left_checks: Vec::new(),
        intent_checks: Vec::new(),
        quiet_since: None,
        fair_waiters: BTreeMap::new(),
        trace,
        idle: cluster::Idle::new(p_clients),
    };
    if scenario == Scenario::Calm {
        // What each fair waiter queued with, as the nodes saw it.
        for n in &mut w.nodes {
            n.server.node.first_scores = Some(BTreeMap::new());
        }
    }
    if trace {
        eprintln!("seed {seed} {scenario:?}: {:?}; refused {refused:?}", w.p);
    }
    for c in 0..w.p.clients {
        // A client warms its connections up as it is built, until every setup is answered or
        // the connect timeout has passed: then its callers start.
        let start = w.instant(0);
        w.clients[c].ep.connect_all(start);
        let deadline = w.p.connect_timeout.as_nanos() as u64;
        w.schedule(deadline, Ev::WarmedUp { client: c });
        w.after_io(c);
    }
    w.start_replication();
    w.start_sentinels();
    if w.p.fault_gap > 0 {
        let first_fault = w.rng.below(2 * w.p.fault_gap);
        w.schedule(first_fault, Ev::Fault);
    }
    while let Some(Reverse(q)) = w.queue.pop() {
        w.now = q.at;
        w.stats.events += 1;
        assert!(
            w.stats.events < MAX_EVENTS,
            "seed {seed}: the simulation did not settle"
        );
        w.handle(q.ev);
    }
    for (c, client) in w.clients.iter().enumerate() {
        if !client.closed {
            w.failures
                .push(format!("client {c} never finished closing"));
        }
        // Liveness, in every scenario: no caller is left inside an operation that never
        // returned.
        for (k, caller) in client.callers.iter().enumerate() {
            if let Some(since) = caller.since {
                w.failures.push(format!(
                    "caller {c}.{k}'s operation, begun at {} ms, never returned",
                    since / MS
                ));
            }
        }
    }
    for (k, v) in w.counters.iter().enumerate() {
        w.history.counters.insert(w.arena.keys[k].clone(), (0, *v));
    }
    w.stats.shared_reads = shared_reads(&w.history);
    if w.scenario == Scenario::Calm && !w.p.locks.semaphore() {
        let late = late_grants(&w.history, w.p.retry_delay / 4);
        w.failures.extend(late);
    }
    let report = w.history.check();
    if trace {
        for (i, op) in w.history.ops.iter().enumerate() {
            eprintln!("op {i}: {op:?} window {:?}", op.window());
        }
        eprintln!("{report}\n{}\n{:?}", w.stats, w.failures);
    }
    Outcome {
        history: w.history,
        report,
        stats: w.stats,
        failures: w.failures,
    }
}

/// Grants that came more than `bound` after every lock in their way was released: their
/// waiter missed the release's announcement and slept out its backstop (with no announcement
/// lost, in a calm run, there is no other reason). The acquisitions of all-or-none sets are
/// the ops of one caller that share their start; a set was in the way until its last key was
/// free. A reader counts every holder of its key as in its way: a writer waiting for the
/// readers to leave may keep it out (the write-preferring policy).
fn late_grants(h: &History, bound: Duration) -> Vec<String> {
    let mut free_since: BTreeMap<(u64, Duration), Duration> = BTreeMap::new();
    for o in &h.ops {
        let Some(ok) = o.ok else {
            continue;
        };
        let mut since = o.invoke;
        for p in &h.ops {
            let in_way = p.key == o.key
                && (o.kind.exclusive() || p.kind.exclusive() || o.kind == Kind::Read);
            match p.release {
                Some(r) if in_way && !std::ptr::eq(p, o) && r <= ok => since = since.max(r),
                _ => {}
            }
        }
        let at = free_since.entry((o.client, o.invoke)).or_insert(since);
        *at = (*at).max(since);
    }
    let mut late = Vec::new();
    for o in &h.ops {
        let (Some(ok), Some(&since)) = (o.ok, free_since.get(&(o.client, o.invoke))) else {
            continue;
        };
        if ok.saturating_sub(since) > bound {
            late.push(format!(
                "caller {} got {:?} {:?} after what was in its way was released (at {since:?})",
                o.client,
                String::from_utf8_lossy(&o.key),
                ok - since
            ));
        }
    }
    late.dedup();
    late
}

/// Read windows that overlap another read window of the same key.
fn shared_reads(h: &History) -> u64 {
    let reads: Vec<(&[u8], (Duration, Duration))> = h
        .ops
        .iter()
        .filter(|o| o.kind == Kind::Read)
        .filter_map(|o| Some((&o.key[..], o.window()?)))
        .collect();
    reads
        .iter()
        .enumerate()
        .filter(|&(i, (k, (a0, a1)))| {
            reads
                .iter()
                .enumerate()
                .any(|(j, (l, (b0, b1)))| i != j && k == l && a0 < b1 && b0 < a1)
        })
        .count() as u64
}

fn reset_error() -> NodeErrorKind {
    NodeErrorKind::Io(io::ErrorKind::ConnectionReset)
}

/// The first word of a command, upper case.
fn command_name(command: &[u8]) -> Vec<u8> {
    match resp::decode(command, &Limits::default()) {
        Ok(resp::Status::Complete((resp::Reply::Array(Some(items)), _))) => match items.first() {
            Some(resp::Reply::Bulk(Some(w))) => w.to_ascii_uppercase(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// The commands in `bytes` (one encode's output), each as its own slice.
fn commands(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match resp::decode(&bytes[at..], &Limits::default()) {
            Ok(resp::Status::Complete((_, used))) => {
                out.push(&bytes[at..at + used]);
                at += used;
            }
            other => panic!("the engine wrote something that is not a command: {other:?}"),
        }
    }
    out
}

/// Whether `command` runs the script `script` (by digest or with its body).
fn runs_script(command: &[u8], script: &crate::engine::ops::Script) -> bool {
    let Ok(resp::Status::Complete((resp::Reply::Array(Some(items)), _))) =
        resp::decode(command, &Limits::default())
    else {
        return false;
    };
    match (items.first(), items.get(1)) {
        (Some(resp::Reply::Bulk(Some(name))), Some(resp::Reply::Bulk(Some(arg)))) => {
            if name.eq_ignore_ascii_case(b"EVALSHA") {
                arg.eq_ignore_ascii_case(&script.sha)
            } else {
                name.eq_ignore_ascii_case(b"EVAL") && *arg == script.body.as_bytes()
            }
        }
        _ => false,
    }
}

/// A published message, as a subscriber receives it.
fn message_push(channel: &[u8], message: &[u8], sharded: bool) -> Vec<u8> {
    let mut out = Vec::new();
    resp::write_array_len(&mut out, 3);
    resp::write_bulk(&mut out, if sharded { b"smessage" } else { b"message" });
    resp::write_bulk(&mut out, channel);
    resp::write_bulk(&mut out, message);
    out
}

impl<'a> World<'a> {
    fn instant(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    fn nanos(&self, i: Instant) -> u64 {
        i.saturating_duration_since(self.base).as_nanos() as u64
    }

    fn schedule(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at: self.now + delay,
            seq: self.seq,
            ev,
        }));
    }

    /// Replaces caller `k` of client `c`'s timer in `slot` (there is at most one) by one
    /// `delay` from now.
    fn set_timer(&mut self, c: usize, k: usize, slot: usize, delay: u64) {
        let caller = &mut self.clients[c].callers[k];
        caller.timers[slot] += 1;
        let id = caller.timers[slot];
        self.schedule(
            delay,
            Ev::Timer {
                client: c,
                caller: k,
                slot,
                id,
            },
        );
    }

    fn cancel_timer(&mut self, c: usize, k: usize, slot: usize) {
        self.clients[c].callers[k].timers[slot] += 1;
    }

    fn log(&self, what: fmt::Arguments<'_>) {
        if self.trace {
            eprintln!("{:>10.3} ms  {what}", self.now as f64 / MS as f64);
        }
    }

    fn caller(&mut self, c: usize, k: usize) -> &mut Caller<'a> {
        &mut self.clients[c].callers[k]
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Land { sock, back: false } => self.land_at_server(sock),
            Ev::Land { sock, back: true } => self.land_at_client(sock),
            Ev::Exec { node } => self.exec(node),
            Ev::Timer {
                client,
                caller,
                slot,
                id,
            } if self.clients[client].callers[caller].timers[slot] == id => {
                match slot {
                    MACHINE => self.drive(client, caller),
                    HOLDER => self.holder(client, caller),
                    _ => self.keeper(client, caller),
                }
                self.after_io(client);
            }
            Ev::Timer { .. } => {}
            Ev::Endpoint { client, id }
                if self.clients[client].timer.0 == id && self.untended(client) =>
            {
                // An idle client nobody drives runs no timer (see `cluster::Idle`).
                self.clients[client].timer.1 = None;
            }
            Ev::Endpoint { client, id } if self.clients[client].timer.0 == id => {
                let now = self.instant(self.now);
                let cl = &mut self.clients[client];
                cl.timer.1 = None;
                if cl.ep.poll_timeout().is_some_and(|t| t <= now) {
                    cl.ep.handle_timeout(now);
                }
                self.after_io(client);
            }
            Ev::Endpoint { .. } => {}
            Ev::WarmedUp { client } => self.warmed_up(client),
            Ev::Fault => self.fault(),
            Ev::Restart { node } => self.restart(node),
            Ev::Heal { generation } if generation == self.partition => {
                self.log(format_args!("partition heals"));
                self.blocked.iter_mut().flatten().for_each(|b| *b = false);
                for s in 0..self.socks.len() {
                    for back in [false, true] {
                        if std::mem::take(&mut self.socks[s].held[usize::from(back)]) {
                            self.release_held(s, back);
                        }
                    }
                }
            }
            Ev::Heal { .. } => {}
            Ev::Dead { generation } if generation == self.partition => self.partition_dead(),
            Ev::Dead { .. } => {}
            Ev::RefusalEnds { node, generation } if self.nodes[node].refusal_gen == generation => {
                self.log(format_args!("node {node} takes writes again"));
                self.nodes[node].server.refusal = None;
            }
            Ev::RefusalEnds { .. } => {}
            Ev::ValidityEnd {
                client,
                caller,
                grant,
                until,
            } => self.validity_end(client, caller, grant, until),
            Ev::Replicate { member } => self.replicate(member),
            Ev::Promote { member, shard } => self.promote(member, shard),
            Ev::Rejoin { member, shard } => self.rejoin(member, shard),
            Ev::MigrateKey { member } => self.migrate_key(member),
            Ev::LeftCheck { check } => self.left_check(check),
            Ev::BreakTo { client, node } => {
                if let Some(sock) = self.sock_to(client, node, false) {
                    if self.socks[sock].open {
                        self.stats.resets += 1;
                        self.log(format_args!(
                            "client {client}'s connection to {node} resets"
                        ));
                        self.break_sock(sock, reset_error());
                    }
                }
            }
            Ev::IntentCheck { check } => self.intent_check(check),
            Ev::MigrationEnds { member } => self.migration_ends(member),
            Ev::IdleCheck => self.idle_check(),
            Ev::Sentinel(e) => self.sentinel_event(e),
            Ev::Readdress { member, shard } => self.readdress(member, shard),
            Ev::Tail {
                client,
                caller,
                grant,
            } => self.tail(client, caller, grant),
            Ev::LoadingEnds { node, incarnation } => {
                if self.nodes[node].incarnation == incarnation {
                    self.nodes[node].server.loading = false;
                    self.kick(node);
                }
            }
        }
    }

    // --- the network: TCP connections, in order, held by partitions, broken ---------------

    fn delay(&mut self) -> u64 {
        self.delay_to(None)
    }

    /// A one-way delay on a connection to `node`: a node whose setup is refused answers it
    /// well within a node timeout (how fast a misconfiguration shows is not what is tested).
    fn delay_to(&mut self, node: Option<usize>) -> u64 {
        if node.is_some_and(|n| self.nodes[n].refused) {
            let most = (self.p.node_timeout.as_nanos() as u64 / 4).max(self.p.delay.0);
            return self.rng.range(self.p.delay.0.min(most), most);
        }
        if self.rng.chance(self.p.long_delay) {
            self.stats.long_delays += 1;
            return self
                .rng
                .range(self.p.ttl_ms * MS / 2, 2 * self.p.ttl_ms * MS);
        }
        self.rng.range(self.p.delay.0, self.p.delay.1)
    }

    /// Sends `seg` on connection `sock` towards its server: it arrives after what was sent
    /// before it.
    fn send_to_server(&mut self, sock: usize, seg: Seg) {
        let d = self.delay_to(Some(self.socks[sock].server));
        let s = &mut self.socks[sock];
        let at = (self.now + d).max(s.to_server.back().map_or(0, |(t, _)| *t));
        s.to_server.push_back((at, seg));
        self.wake_landing(sock, false);
    }

    /// Sends `back` on connection `sock` towards its client.
    fn send_to_client(&mut self, sock: usize, back: Back) {
        let d = self.delay_to(Some(self.socks[sock].server));
        let s = &mut self.socks[sock];
        let at = (self.now + d).max(s.to_client.back().map_or(0, |(t, _)| *t));
        s.to_client.push_back((at, back));
        self.wake_landing(sock, true);
    }

    /// Schedules the landing of the head of one direction of `sock`, if none is and a
    /// partition does not hold it.
    fn wake_landing(&mut self, sock: usize, back: bool) {
        let s = &mut self.socks[sock];
        let b = usize::from(back);
        if s.landing[b] || s.held[b] {
            return;
        }
        let head = if back {
            s.to_client.front().map(|(t, _)| *t)
        } else {
            s.to_server.front().map(|(t, _)| *t)
        };
        if let Some(at) = head {
            s.landing[b] = true;
            self.schedule(at.saturating_sub(self.now), Ev::Land { sock, back });
        }
    }

    /// Whether the head of one direction of `sock` lands now: not held by a partition (which
    /// then holds it), and due.
    fn lands(&mut self, sock: usize, back: bool) -> bool {
        let b = usize::from(back);
        self.socks[sock].landing[b] = false;
        if self.blocked(sock) {
            self.socks[sock].held[b] = true;
            return false;
        }
        let s = &self.socks[sock];
        let head = if back {
            s.to_client.front().map(|(t, _)| *t)
        } else {
            s.to_server.front().map(|(t, _)| *t)
        };
        match head {
            Some(at) if at <= self.now => true,
            Some(_) => {
                self.wake_landing(sock, back);
                false
            }
            None => false,
        }
    }

    /// A partition held one direction of `sock`; it healed: what waited goes on, in order.
    fn release_held(&mut self, sock: usize, back: bool) {
        let d = self.delay();
        let mut at = self.now + d;
        let s = &mut self.socks[sock];
        let queue: Vec<&mut u64> = if back {
            s.to_client.iter_mut().map(|(t, _)| t).collect()
        } else {
            s.to_server.iter_mut().map(|(t, _)| t).collect()
        };
        for t in queue {
            at = at.max(*t);
            *t = at;
        }
        self.wake_landing(sock, back);
    }

    fn blocked(&self, sock: usize) -> bool {
        let s = &self.socks[sock];
        self.blocked[s.client][s.server]
    }

    fn land_at_server(&mut self, sock: usize) {
        if !self.lands(sock, false) {
            return;
        }
        let Some((_, seg)) = self.socks[sock].to_server.pop_front() else {
            return;
        };
        self.wake_landing(sock, false);
        let node = self.socks[sock].server;
        match seg {
            Seg::Syn => {
                // A node that is down, or a handshake broken on its way, refuses it.
                if !self.nodes[node].up || self.socks[sock].cut.is_some() {
                    self.send_to_client(sock, Back::Refused);
                    return;
                }
                let n = &mut self.nodes[node];
                let s = &mut self.socks[sock];
                s.accepted = Some(n.incarnation);
                s.server_open = true;
                self.send_to_client(sock, Back::Accepted);
                let n = &mut self.nodes[node];
                if n.reject_connects > 0 {
                    // Over the limit of clients: the server says so, and closes.
                    n.reject_connects -= 1;
                    self.stats.max_clients += 1;
                    self.send_to_client(
                        sock,
                        Back::Data(b"-ERR max number of clients reached\r\n".to_vec()),
                    );
                    self.close_server_end(sock, reset_error());
                }
            }
            Seg::Data { offset, mut bytes } => {
                let s = &self.socks[sock];
                let n = &self.nodes[node];
                if !n.up || s.accepted != Some(n.incarnation) {
                    // The process that accepted the connection is gone.
                    self.stats.lost_requests += 1;
                    return;
                }
                if let Some(cut) = s.cut {
                    let end = offset + bytes.len() as u64;
                    if end > cut {
                        self.stats.lost_requests += 1;
                        bytes.truncate(cut.saturating_sub(offset) as usize);
                    }
                }
                let commands = self.socks[sock].session.receive(&bytes);
                for (command, end) in commands {
                    self.nodes[node]
                        .backlog
                        .push_back(Work { sock, command, end });
                }
                let n = &self.nodes[node];
                let backlog_ms = n.backlog.len() as u64 * n.service / MS;
                self.stats.longest_backlog_ms = self.stats.longest_backlog_ms.max(backlog_ms);
                self.kick(node);
            }
        }
    }

    fn land_at_client(&mut self, sock: usize) {
        if self.unread(sock) {
            return;
        }
        if !self.lands(sock, true) {
            return;
        }
        let Some((_, back)) = self.socks[sock].to_client.pop_front() else {
            return;
        };
        self.wake_landing(sock, true);
        let (c, id) = (self.socks[sock].client, self.socks[sock].id);
        if !self.socks[sock].open {
            if matches!(back, Back::Data(_)) {
                self.stats.lost_replies += 1;
            }
            return;
        }
        let now = self.instant(self.now);
        let ep = &mut self.clients[c].ep;
        match back {
            Back::Accepted => {
                self.socks[sock].connected = true;
                if ep.is_open(id) {
                    ep.handle_connected(id);
                }
            }
            Back::Refused => {
                self.socks[sock].open = false;
                let why = NodeErrorKind::Connect(io::ErrorKind::ConnectionRefused);
                ep.handle_connect_failed(id, why, now);
            }
            Back::Data(bytes) => {
                if self.trace && std::env::var_os("REDLOCK_SIM_WIRE").is_some() {
                    self.log(format_args!(
                        "client {c} gets on {id:?}: {:?}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(90)])
                    ));
                }
                let ep = &mut self.clients[c].ep;
                let mut rest = &bytes[..];
                while !rest.is_empty() && ep.is_open(id) {
                    let Some(buf) = ep.recv_buf(id, now) else {
                        break;
                    };
                    let n = buf.len().min(rest.len());
                    buf[..n].copy_from_slice(&rest[..n]);
                    ep.handle_recv(id, n, now);
                    rest = &rest[n..];
                }
            }
            Back::Closed(why) => {
                self.socks[sock].open = false;
                ep.handle_failed(id, why, now);
            }
        }
        self.after_io(c);
    }

    /// The server's end of `sock` goes (a crash, a reset, a refusal): its client is told once
    /// what was sent before has arrived.
    fn close_server_end(&mut self, sock: usize, why: NodeErrorKind) {
        let s = &mut self.socks[sock];
        if !s.server_open {
            return;
        }
        s.server_open = false;
        if s.cut.is_none() {
            s.cut = Some(s.session.received);
        }
        self.send_to_client(sock, Back::Closed(why));
    }

    /// Connection `sock` breaks (a reset on the way): of what its client wrote, a prefix
    /// lands and runs, and the rest does not (a command cut in two never runs); what its server
    /// answered and has not arrived yet may be lost; its client learns of it a moment later.
    fn break_sock(&mut self, sock: usize, why: NodeErrorKind) {
        let s = &self.socks[sock];
        if !s.server_open && s.cut.is_some() {
            return;
        }
        if s.accepted.is_none() {
            // Its handshake is still on its way: the connect fails (see `land_at_server`),
            // and nothing of it reaches the server. (Left open at the server's end, it would
            // be accepted later and swallow all that its client writes, with no word.)
            self.socks[sock].cut = Some(0);
            return;
        }
        let (landed, sent) = (s.session.received, s.sent);
        let cut = self.rng.range(landed, sent.max(landed));
        if cut > landed && cut < sent {
            self.stats.mid_batch_resets += 1;
        }
        let lose_replies = self.rng.chance(0.5);
        let s = &mut self.socks[sock];
        s.cut = Some(cut);
        if lose_replies {
            // The reset overtakes the replies on their way: they are lost.
            let lost = s.to_client.len() as u64;
            s.to_client.clear();
            self.stats.lost_replies += lost;
        }
        self.close_server_end(sock, why);
    }

    /// The client closes `sock` (the endpoint gave it up, or the client closed): of what was
    /// on its way to the server, a prefix lands; nothing comes back.
    fn close_client_end(&mut self, sock: usize) {
        let s = &mut self.socks[sock];
        if !s.open {
            return;
        }
        s.open = false;
        if s.cut.is_none() {
            let (landed, sent) = (s.session.received, s.sent);
            let cut = self.rng.range(landed, sent.max(landed));
            self.socks[sock].cut = Some(cut);
        }
        self.socks[sock].server_open = false;
    }

    /// The transport gives up the connections a partition still cuts: nothing more of what
    /// they carry lands.
    fn partition_dead(&mut self) {
        for sock in 0..self.socks.len() {
            let s = &self.socks[sock];
            if !s.open || !self.blocked(sock) {
                continue;
            }
            self.stats.dead_connections += 1;
            let (c, id) = (s.client, s.id);
            let now = self.instant(self.now);
            let s = &mut self.socks[sock];
            s.open = false;
            s.server_open = false;
            s.cut = Some(s.cut.unwrap_or(s.session.received).min(s.session.received));
            s.to_client.clear();
            let connecting = !s.connected;
            let why = NodeErrorKind::Io(io::ErrorKind::TimedOut);
            let ep = &mut self.clients[c].ep;
            if ep.is_open(id) {
                if connecting {
                    ep.handle_connect_failed(id, why, now);
                } else {
                    ep.handle_failed(id, why, now);
                }
            }
            self.log(format_args!(
                "client {c}'s connection {id:?} is given up in the partition"
            ));
            self.after_io(c);
        }
    }

    // --- the servers: a backlog run in order of arrival -------------------------------------

    /// Schedules a run of node `node`'s backlog, once it can work.
    fn kick(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        if n.exec_scheduled || n.backlog.is_empty() || !n.up {
            return;
        }
        n.exec_scheduled = true;
        let at = n.busy_until.max(self.now);
        self.schedule(at - self.now, Ev::Exec { node });
    }

    /// Runs what node `node` received, in order: everything at once on a fast server, one
    /// command per service time on a slow one.
    fn exec(&mut self, node: usize) {
        self.nodes[node].exec_scheduled = false;
        if !self.nodes[node].up || self.nodes[node].busy_until > self.now {
            return self.kick(node);
        }
        // What each connection is answered in this run goes out in one segment (or a few).
        let mut replies: Vec<(usize, Vec<u8>)> = Vec::new();
        while let Some(work) = self.nodes[node].backlog.pop_front() {
            self.run_command(node, work, &mut replies);
            let service = self.nodes[node].service;
            if service > 0 {
                self.nodes[node].busy_until = self.now + service;
                break;
            }
        }
        for (sock, bytes) in replies {
            if self.socks[sock].server_open {
                self.reply(sock, bytes);
            }
        }
        self.kick(node);
    }

    fn run_command(&mut self, node: usize, work: Work, replies: &mut Vec<(usize, Vec<u8>)>) {
        let s = &self.socks[work.sock];
        if s.cut.is_some_and(|cut| work.end > cut) {
            // Cut off by a break before it all landed.
            return;
        }
        let n = &self.nodes[node];
        if s.accepted != Some(n.incarnation) {
            return;
        }
        let name = command_name(&work.command);
        if s.setup_refused
            && !matches!(
                name.as_slice(),
                b"AUTH"
                    | b"SELECT"
                    | b"SCRIPT"
                    | b"INFO"
                    | b"COMMAND"
                    | b"SUBSCRIBE"
                    | b"UNSUBSCRIBE"
            )
        {
            self.failures.push(format!(
                "a lock command ({}) reached node {node} behind a refused setup",
                String::from_utf8_lossy(&name)
            ));
        }
        if !s.server_open {
            self.stats.late_commands += 1;
        }
        if name == b"HSETEX" || name == b"MULTI" {
            self.stats.native_commands += 1;
        }
        if runs_script(&work.command, &crate::engine::fencing::FENCE_WRITE) {
            self.stats.write_backs += 1;
        }
        let now_ms = self.nodes[node].clock_ms(self.now);
        let mut out = Vec::new();
        if self.trace && std::env::var_os("REDLOCK_SIM_WIRE").is_some() {
            self.log(format_args!(
                "node {node} runs {:?} from sock {} (client {})",
                String::from_utf8_lossy(&work.command[..work.command.len().min(90)]),
                work.sock,
                self.socks[work.sock].client
            ));
        }
        let gate = match self.cluster_gate(node, work.sock, now_ms, &work.command, &name) {
            None => self.sentinel_gate(node, work.sock, &work.command, &name),
            answer => answer,
        };
        if let Some(answer) = gate {
            out = answer;
        } else {
            let session = &mut self.socks[work.sock].session;
            self.nodes[node]
                .server
                .execute(session, now_ms, &work.command, &mut out);
        }
        let refused = [&b"-READONLY"[..], b"-MISCONF", b"-OOM"]
            .iter()
            .any(|r| out.starts_with(r));
        self.stats.refused_commands += u64::from(refused);
        self.stats.loading_replies += u64::from(out.starts_with(b"-LOADING"));
        if out.starts_with(b"-") && (name == b"AUTH" || out.starts_with(b"-NOAUTH")) {
            if !self.socks[work.sock].setup_refused {
                self.stats.setup_refusals += 1;
            }
            self.socks[work.sock].setup_refused = true;
        }
        self.publish(node);
        if !self.socks[work.sock].server_open {
            return;
        }
        // Messages are lost up to the horizon: the last cycles run without faults.
        if !self.nodes[node].refused
            && self.now <= self.p.horizon
            && self.rng.chance(self.p.reply_loss)
        {
            // The command ran; the connection breaks before its reply arrives.
            self.stats.lost_replies += 1;
            let s = &mut self.socks[work.sock];
            s.cut = Some(s.session.received);
            self.close_server_end(work.sock, reset_error());
            return;
        }
        match replies.iter_mut().find(|(s, _)| *s == work.sock) {
            Some((_, bytes)) => bytes.extend_from_slice(&out),
            None => replies.push((work.sock, out)),
        }
    }

    /// Sends what a server answered on `sock`, in one segment or a few.
    fn reply(&mut self, sock: usize, bytes: Vec<u8>) {
        if bytes.len() > 1 && self.rng.chance(self.p.split) {
            self.stats.split_writes += 1;
            let at = self.rng.range(1, bytes.len() as u64 - 1) as usize;
            self.send_to_client(sock, Back::Data(bytes[..at].to_vec()));
            self.send_to_client(sock, Back::Data(bytes[at..].to_vec()));
        } else {
            self.send_to_client(sock, Back::Data(bytes));
        }
    }

    /// Carries what node `node` published to the connections subscribed to it.
    fn publish(&mut self, node: usize) {
        let outbox = std::mem::take(&mut self.nodes[node].server.node.outbox);
        if outbox.is_empty() {
            return;
        }
        for (channel, message, sharded) in outbox {
            for sock in 0..self.socks.len() {
                let s = &self.socks[sock];
                // A cluster's nodes pass what one of them publishes on to the others; a
                // sharded message stays on the node that published it (the slot's master).
                let heard = if sharded {
                    s.server == node && s.session.shard_channels.contains(&channel)
                } else {
                    self.hears(s.server, node) && s.session.channels.contains(&channel)
                };
                if !heard
                    || !s.id.sub
                    || !s.server_open
                    || s.accepted != Some(self.nodes[s.server].incarnation)
                {
                    continue;
                }
                if self.rng.chance(self.p.wake_loss) {
                    self.stats.lost_wakes += 1;
                    continue;
                }
                self.stats.wakes += 1;
                let push = message_push(&channel, &message, sharded);
                self.send_to_client(sock, Back::Data(push));
            }
        }
    }

    // --- the clients' I/O shell: what the driver does, and nothing else ---------------------

    /// After anything reached client `c`'s endpoint: the system calls it asks for, the bytes it
    /// has to write, the callers it posted to, its timer, and its closing.
    fn after_io(&mut self, c: usize) {
        loop {
            self.do_io(c);
            self.flush(c);
            let Some(k) = self.clients[c].ep.poll_notified() else {
                break;
            };
            if self.clients[c].callers[k].lp.is_some() {
                self.drive(c, k);
            }
        }
        if self.clients[c].warming.is_some() && self.clients[c].ep.is_settled() {
            self.warmed_up(c);
        }
        let now = self.instant(self.now);
        let cl = &mut self.clients[c];
        if cl.closing && !cl.closed {
            if let Some(left) = cl.ep.close_outcome(now) {
                return self.closed(c, left);
            }
        }
        if self.clients[c].closed
            && (self.clusters.iter().any(Option::is_some)
                || self.sentinels.iter().any(Option::is_some))
        {
            // The client is gone (a driver drops a closed endpoint): its timers with it, such
            // as a cluster member's periodic topology read, which would run for ever.
            return;
        }
        let due = self.clients[c].ep.poll_timeout().map(|t| self.nanos(t));
        let cl = &mut self.clients[c];
        if let Some(t) = due {
            let t = t.max(self.now);
            if cl.timer.1.is_none_or(|at| t < at) {
                cl.timer.0 += 1;
                cl.timer.1 = Some(t);
                let id = cl.timer.0;
                self.schedule(t - self.now, Ev::Endpoint { client: c, id });
            }
        }
    }

    /// Client `c` is built: its callers start their cycles.
    fn warmed_up(&mut self, c: usize) {
        if self.clients[c].warming.take().is_none() {
            return;
        }
        for k in 0..self.p.callers {
            let start = self.rng.below(self.p.ttl_ms * MS);
            self.set_timer(c, k, HOLDER, start);
        }
    }

    /// Makes the system calls client `c`'s endpoint asks for.
    fn do_io(&mut self, c: usize) {
        while let Some(io) = self.clients[c].ep.poll_io() {
            self.log(format_args!("client {c}: {io:?}"));
            match io {
                Io::Connect(id) => {
                    let server = match self.clients[c].ep.connect_addr(id) {
                        crate::url::Target::Tcp(a) => cluster::process(a.port()),
                        crate::url::Target::Unix(_) => unreachable!("no unix sockets here"),
                    };
                    assert!(server < self.nodes.len(), "a connect to no server: {id:?}");
                    let socks = &mut self.clients[c].socks;
                    if socks.len() <= id.index() {
                        socks.resize(id.index() + 1, None);
                    }
                    if let Some(old) = self.clients[c].socks[id.index()] {
                        self.close_client_end(old);
                    }
                    let sock = self.socks.len();
                    self.socks.push(Sock {
                        client: c,
                        id,
                        server,
                        open: true,
                        connected: false,
                        sent: 0,
                        to_server: VecDeque::new(),
                        to_client: VecDeque::new(),
                        held: [false; 2],
                        landing: [false; 2],
                        accepted: None,
                        session: Session::default(),
                        server_open: false,
                        cut: None,
                        setup_refused: false,
                    });
                    self.clients[c].socks[id.index()] = Some(sock);
                    self.send_to_server(sock, Seg::Syn);
                }
                Io::Close(id) => {
                    if let Some(&Some(sock)) = self.clients[c].socks.get(id.index()) {
                        self.close_client_end(sock);
                    }
                }
                // The simulated servers are plaintext Redis: none answers a TLS hello.
                Io::Probe { id, .. } => {
                    let now = self.instant(self.now);
                    self.clients[c].ep.handle_probed(id, Probed::Nothing, now);
                }
                // The simulated sentinels name masters by address; a name is looked up in the
                // simulation's own table: `localhost` alone.
                Io::Resolve { member, switch } => {
                    let now = self.instant(self.now);
                    let ep = &mut self.clients[c].ep;
                    let addr = ep
                        .name_to_resolve(member, switch)
                        .filter(|&(host, _)| host == "localhost")
                        .map(|(_, port)| ([127, 0, 0, 1], port).into());
                    ep.handle_resolved(member, switch, addr, now);
                }
            }
        }
    }

    /// Writes what each of client `c`'s connections has pending, once connected.
    fn flush(&mut self, c: usize) {
        let now = self.instant(self.now);
        for i in 0..self.clients[c].socks.len() {
            let Some(sock) = self.clients[c].socks[i] else {
                continue;
            };
            let id = ConnId::from_index(i);
            let s = &self.socks[sock];
            let ep = &mut self.clients[c].ep;
            if !s.open || !s.connected || !ep.is_open(id) || !ep.wants_write(id) {
                continue;
            }
            let bytes = ep.pending(id).to_vec();
            ep.handle_sent(id, bytes.len(), now);
            self.write(sock, bytes);
        }
    }

    /// Sends what a client wrote on `sock`, in one segment or a few.
    fn write(&mut self, sock: usize, bytes: Vec<u8>) {
        let offset = self.socks[sock].sent;
        self.socks[sock].sent += bytes.len() as u64;
        let cuts: Vec<usize> = if bytes.len() > 1 && self.rng.chance(self.p.split) {
            self.stats.split_writes += 1;
            let a = self.rng.range(1, bytes.len() as u64 - 1) as usize;
            let b = self.rng.range(1, bytes.len() as u64 - 1) as usize;
            vec![a.min(b), a.max(b)]
        } else {
            Vec::new()
        };
        let mut start = 0;
        for end in cuts.into_iter().chain([bytes.len()]) {
            if end > start {
                self.send_to_server(
                    sock,
                    Seg::Data {
                        offset: offset + start as u64,
                        bytes: bytes[start..end].to_vec(),
                    },
                );
            }
            start = end;
        }
        let refused = self.nodes[self.socks[sock].server].refused;
        if !refused && self.now <= self.p.horizon && self.rng.chance(self.p.request_loss) {
            // The connection breaks while this write is on its way.
            self.break_sock(sock, reset_error());
        }
    }

    // --- the callers: machines stepped on the endpoint, as the driver steps them -------------

    /// Starts `job` for caller `k` of client `c`, and drives it.
    fn start_job(&mut self, c: usize, k: usize, job: Job<'a>) {
        let id = self.clients[c].callers[k].id;
        let run = self.clients[c].ep.begin(id);
        let caller = self.caller(c, k);
        caller.lp = Some(CallerLoop::new(id, run));
        caller.job = job;
        self.drive(c, k);
    }

    /// Steps caller `k` of client `c`'s machine, and acts on its outcome once it has one.
    fn drive(&mut self, c: usize, k: usize) {
        match std::mem::replace(&mut self.caller(c, k).job, Job::None) {
            Job::None => {}
            Job::Acquire(mut m) => match self.step(c, k, &mut *m) {
                Some(outcome) => {
                    self.caller(c, k).spread = m.learnt_spread();
                    self.unavailable(c, k, &m.into_round());
                    self.acquired(c, k, outcome);
                }
                None => self.caller(c, k).job = Job::Acquire(m),
            },
            Job::Round(mut m, purpose) => match self.step(c, k, &mut *m) {
                Some(outcome) => {
                    let hold = m.hold();
                    self.round_over(c, k, purpose, outcome, hold);
                }
                None => self.caller(c, k).job = Job::Round(m, purpose),
            },
        }
    }

    /// The caller loop for one caller, as the driver runs it (see `endpoint::caller`): the
    /// machine takes its mail (or its deadline), the endpoint queues its commands and they are
    /// written, until it waits for its mailbox or its deadline (the machine timer is set), or is
    /// over (the run finishes).
    fn step<M: Machine>(&mut self, c: usize, k: usize, m: &mut M) -> Option<M::Output> {
        let id = self.clients[c].callers[k].id;
        let mut lp = self
            .caller(c, k)
            .lp
            .take()
            .expect("a caller loop under way");
        for _ in 0..100_000 {
            let now = self.instant(self.now);
            // Nobody polls here: the network hands the endpoint every byte as it lands, so
            // reading late nodes, or every connection, finds nothing left unread.
            match lp.next(
                &mut self.clients[c].ep,
                m,
                now,
                &mut self.rng.0,
                false,
                false,
            ) {
                Next::ReadLate | Next::ReadAll | Next::Again => {}
                Next::Io | Next::Timers => {
                    self.do_io(c);
                    self.flush(c);
                }
                Next::Wait { until, wanted } => {
                    if self.clients[c].ep.is_ready(id, wanted) {
                        continue;
                    }
                    let at = self.nanos(until);
                    self.set_timer(c, k, MACHINE, at - self.now);
                    self.caller(c, k).lp = Some(lp);
                    return None;
                }
                Next::Done(outcome) => {
                    self.cancel_timer(c, k, MACHINE);
                    self.clients[c].ep.finish(id, lp.run(), now);
                    return Some(outcome);
                }
            }
        }
        panic!("a machine that never waits");
    }

    /// Client `c` is done: it closes once its callers' cycles are over, as a program drops its
    /// client, with replies maybe still owed.
    fn maybe_close(&mut self, c: usize) {
        let cl = &self.clients[c];
        if cl.closing || !cl.callers.iter().all(|k| k.done) || self.idles_first(c) {
            return;
        }
        // Idle, not closing, while what its last releases owe is looked for.
        if self.left_checks.iter().any(|l| l.client == c && l.pending) {
            return;
        }
        let now = self.instant(self.now);
        self.log(format_args!("client {c} closes"));
        let cl = &mut self.clients[c];
        cl.closing = true;
        self.stats.closes += 1;
        self.stats.closes_owing += u64::from(cl.ep.busy(now));
        cl.ep.begin_close(now);
    }

    /// Client `c`'s closing is over, leaving compare-and-deletes undelivered to `left`: its
    /// sockets close.
    fn closed(&mut self, c: usize, left: Vec<usize>) {
        self.log(format_args!("client {c} closed; undelivered to {left:?}"));
        self.clients[c].closed = true;
        for i in 0..self.clients[c].socks.len() {
            if let Some(sock) = self.clients[c].socks[i] {
                self.close_client_end(sock);
            }
        }
        if self.scenario.calm() && self.clients.iter().all(|cl| cl.closed) {
            self.left_behind();
        }
    }

    /// Every release returned and every client closed: the keys still on the nodes are left
    /// behind (fence counters, which never expire, are not lock keys).
    fn left_behind(&mut self) {
        for node in 0..self.nodes.len() {
            let now_ms = self.nodes[node].clock_ms(self.now);
            let n = &mut self.nodes[node];
            for key in n.server.node.live_key_names(now_ms) {
                let fence =
                    self.arena.fences.contains(&key) || self.arena.write_fences.contains(&key);
                if !fence {
                    self.log(format_args!(
                        "left behind on node {node}: {:?}",
                        String::from_utf8_lossy(&key)
                    ));
                    self.history.left_behind.push((node, key));
                }
            }
        }
    }

    /// Caller `k` of client `c`'s release returned `Ok`: the nodes on which the lock's entries
    /// are still live now (none of them may be, beyond those the release quorum allows).
    fn record_release(&mut self, c: usize, k: usize) {
        let cycle = self.clients[c].callers[k].cycle.as_ref().expect("a cycle");
        let token = cycle.held.as_ref().expect("held").token;
        let token = token.as_bytes();
        let names = entry_names(&cycle.spec);
        let quorum = cycle.spec.release_quorum(self.p.nodes);
        let ops = cycle.ops.clone();
        self.idle.released(&names, token, &ops);
        let mut live_on = Vec::new();
        for node in 0..self.nodes.len() {
            if !self.nodes[node].up || !self.votes(node) {
                continue;
            }
            let now_ms = self.nodes[node].clock_ms(self.now);
            let mem = &mut self.nodes[node].server.node;
            if names
                .iter()
                .any(|name| mem.holds_token(now_ms, name, token))
            {
                live_on.push(self.member_of(node));
            }
        }
        live_on.sort_unstable();
        live_on.dedup();
        for op in ops {
            self.history.releases.push(history::Release {
                op,
                at: Duration::from_nanos(self.now),
                live_on: live_on.clone(),
                nodes: self.p.nodes,
                quorum,
            });
        }
    }

    /// Whether a fault is still under way: a node down, loading, refusing writes or paused, a
    /// partition, a cluster's slot migrating, a failover not over, a topology view lagging.
    fn faults_active(&self) -> bool {
        let now = self.now;
        self.nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| !self.retired(i))
            .any(|(i, n)| {
                // A Sentinel member's replica refuses writes for good: no fault.
                let refusing = n.server.refusal.is_some() && !self.is_sentinel_replica(i);
                !n.up || n.server.loading || refusing || n.busy_until > now
            })
            || self.blocked.iter().flatten().any(|&b| b)
            || self.clusters.iter().flatten().any(|cl| !cl.quiet(now))
            || self.sentinels.iter().flatten().any(|s| !s.quiet(now))
    }

    /// Caller `k` of client `c`'s last cycle released (whatever the release returned): its
    /// token is looked for on the nodes a little later.
    fn look_for_what_is_left(&mut self, c: usize, k: usize) {
        let cycle = self.clients[c].callers[k].cycle.as_ref().expect("a cycle");
        let Some(held) = cycle.held.as_ref() else {
            return;
        };
        let check = LeftCheck {
            client: c,
            token: held.token,
            names: entry_names(&cycle.spec),
            at: self.now,
            pending: true,
        };
        self.left_checks.push(check);
        let check = self.left_checks.len() - 1;
        let after = 2 * self.p.node_timeout.as_nanos() as u64;
        self.schedule(after, Ev::LeftCheck { check });
    }

    /// A last cycle's release returned, with no fault left to excuse anything: no node may
    /// still hold what it released once its client has nothing in flight to that node (no
    /// byte on the wire either way, nothing waiting in the server's backlog) and its
    /// connection there is up. The client does nothing meanwhile but what its endpoint's own
    /// timers do (it does not close): owed work must be driven all the same. Looked at again
    /// while something is in flight there, until what is left expires.
    fn left_check(&mut self, i: usize) {
        let (c, token, at) = {
            let chk = &self.left_checks[i];
            (chk.client, chk.token, chk.at)
        };
        let names = std::mem::take(&mut self.left_checks[i].names);
        let mut again = false;
        // A fault a last cycle met (see [`World::tail`]) is over, and the client had the time
        // to find where its release now goes.
        let settling = self.now < self.idle.settle_until || self.faults_active();
        for node in 0..self.nodes.len() {
            if !self.nodes[node].up || !self.votes(node) {
                continue;
            }
            let now_ms = self.nodes[node].clock_ms(self.now);
            let mem = &mut self.nodes[node].server.node;
            let left: Vec<&Vec<u8>> = names
                .iter()
                .filter(|name| mem.holds_token(now_ms, name, token.as_bytes()))
                .collect();
            if left.is_empty() {
                continue;
            }
            // A cluster client may have more than one connection to a node (one it was given,
            // one to the name the node announces): what is on its way on any of them counts.
            let down = self
                .sock_to(c, node, false)
                .is_some_and(|s| !self.socks[s].open || !self.socks[s].connected);
            // What the client finds out about its cluster (a topology read on its way)
            // counts as in flight too.
            let member = self.member_of(node);
            let finding = (0..self.nodes.len())
                .any(|n| n != node && self.member_of(n) == member && self.in_flight_to(c, n));
            let busy = down || settling || finding || self.in_flight_to(c, node);
            if busy {
                again = true;
                continue;
            }
            let what: Vec<String> = left
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            let msg = format!(
                "left behind after the faults healed: node {node} (member {}) holds {what:?} of client {c}'s release {:?} ms after it returned, with nothing in flight there",
                self.member_of(node),
                (self.now - at) / MS
            );
            self.log(format_args!("{msg}"));
            self.failures.push(msg);
        }
        self.left_checks[i].names = names;
        if again && self.now - at > (QUIET_WAIT * self.p.ttl_ms + 2 * LAST_TTL_MS) * MS {
            self.failures.push(format!(
                "client {c}'s last release still has something in flight, or a connection not up, {} ms after it returned",
                (self.now - at) / MS
            ));
            again = false;
        }
        if again {
            let after = (self.p.node_timeout.as_nanos() as u64 / 4).max(MS / 4);
            self.schedule(after, Ev::LeftCheck { check: i });
            return;
        }
        self.left_checks[i].pending = false;
        self.maybe_close(c);
        self.after_io(c);
    }

    /// Something client `c` wrote to node `node` is on its way there and will run (on a
    /// broken connection, only what lies before the break), or waits in the node's backlog.
    fn will_run_at(&self, c: usize, node: usize) -> bool {
        self.clients[c].socks.iter().flatten().any(|&s| {
            let sock = &self.socks[s];
            sock.server == node
                && !sock.id.sub
                && (sock.to_server.iter().any(|(_, seg)| match seg {
                    Seg::Data { offset, .. } => sock.cut.is_none_or(|cut| *offset < cut),
                    Seg::Syn => sock.cut.is_none(),
                }) || self.nodes[node].backlog.iter().any(|w| w.sock == s))
        })
    }

    /// Something of client `c` is on its way to or from node `node`, on any of its
    /// connections there but subscribers', or waits in the node's backlog. A reply parked
    /// unread while its client idles (see [`cluster::Idle`]) is not: the client reads it only
    /// when it closes, and what it owes waits on it meanwhile.
    fn in_flight_to(&self, c: usize, node: usize) -> bool {
        self.clients[c].socks.iter().flatten().any(|&s| {
            let sock = &self.socks[s];
            sock.server == node
                && !sock.id.sub
                && (!sock.to_server.is_empty()
                    || (!sock.to_client.is_empty() && !self.idle.parked(s))
                    || self.nodes[node].backlog.iter().any(|w| w.sock == s))
        })
    }

    // --- faults ----------------------------------------------------------------------------

    fn fault(&mut self) {
        if self.now > self.p.horizon {
            return;
        }
        let gap = self
            .rng
            .range(self.p.fault_gap / 2, self.p.fault_gap * 3 / 2);
        self.schedule(gap, Ev::Fault);
        let max_ttl = 2 * self.p.ttl_ms * MS;
        let node = self.rng.below(self.nodes.len() as u64) as usize;
        let client = self.rng.below(self.p.clients as u64) as usize;
        if self.nodes[node].refused {
            // A node whose setup is refused shows that refusal, and nothing else.
            return;
        }
        let kind = match self.scenario {
            Scenario::ClusterModel | Scenario::ClusterWait => self.rng.below(12),
            Scenario::LossyFailover => 10,
            // Sentinel's own faults (14), or those of the model.
            Scenario::SentinelModel => match self.rng.below(12) {
                k if k >= 9 => 14,
                k => k,
            },
            Scenario::SentinelLossy => 14,
            // A crashed node cannot show that its setup would be refused: runs with
            // misconfigured nodes keep theirs up, so that the check on configuration
            // errors (see `acquired`) applies.
            Scenario::Model if self.p.refused > 0 => 1 + self.rng.below(8),
            Scenario::Model => self.rng.below(9),
            Scenario::InstantRestart | Scenario::ForgetfulRestart => 0,
            Scenario::ClockJump => 2,
            Scenario::SlowFlush => 13,
            Scenario::UncheckedPause | Scenario::Calm | Scenario::Slow => return,
        };
        match kind {
            0 => self.crash(node),
            1 => {
                self.stats.partitions += 1;
                self.partition += 1;
                for c in 0..self.p.clients {
                    let cut_client = self.rng.chance(0.5);
                    for n in 0..self.nodes.len() {
                        self.blocked[c][n] =
                            cut_client && self.rng.chance(0.5) && !self.nodes[n].refused;
                    }
                }
                let heal = self.rng.range(max_ttl / 8, max_ttl);
                self.log(format_args!("partition {:?}", self.blocked));
                let generation = self.partition;
                self.schedule(heal, Ev::Heal { generation });
                self.schedule(self.p.dead_after, Ev::Dead { generation });
            }
            2 => {
                let ttl = self.p.ttl_ms * MS;
                let by: i64 = if self.scenario == Scenario::ClockJump {
                    self.rng.range(ttl / 2, 2 * ttl) as i64
                } else if self.rng.chance(0.5)
                    && self.nodes[node]
                        .last_forward_jump
                        .is_none_or(|t| self.now - t > 2 * max_ttl)
                {
                    // Within the drift allowance's fixed 2 ms, once per two TTLs at most.
                    self.nodes[node].last_forward_jump = Some(self.now);
                    self.rng.range(0, MS) as i64
                } else {
                    -(self.rng.range(0, 50 * MS) as i64)
                };
                self.stats.clock_jumps += 1;
                self.log(format_args!("node {node} clock jumps by {by} ns"));
                self.nodes[node].offset += by;
                self.share_clock(node);
            }
            3 => {
                // The connection breaks (a proxy, a NAT, a reset): part of what was written to
                // it lands and runs, the rest does not.
                if let Some(sock) = self.sock_to(client, node, false) {
                    if self.socks[sock].open {
                        self.stats.resets += 1;
                        self.log(format_args!(
                            "client {client}'s connection to {node} resets"
                        ));
                        self.break_sock(sock, reset_error());
                    }
                }
            }
            4 => {
                if let Some(sock) = self.sock_to(client, node, true) {
                    if self.socks[sock].open {
                        self.stats.subscriber_resets += 1;
                        self.log(format_args!(
                            "client {client}'s subscriber to {node} resets"
                        ));
                        self.break_sock(sock, reset_error());
                    }
                }
            }
            5 => {
                // Writes refused for a while: a replica, a failed save, memory full.
                let refusal = match self.rng.below(3) {
                    0 => Refusal::ReadOnly,
                    1 => Refusal::Misconf,
                    _ => Refusal::Oom,
                };
                let n = &mut self.nodes[node];
                n.server.refusal = Some(refusal);
                n.refusal_gen += 1;
                let generation = n.refusal_gen;
                self.stats.refusals += 1;
                let lasts = self.rng.range(max_ttl / 8, max_ttl);
                self.log(format_args!("node {node} refuses writes ({refusal:?})"));
                self.schedule(lasts, Ev::RefusalEnds { node, generation });
            }
            6 => {
                // The server process stops (SIGSTOP) and goes on later: connections stay.
                let pause = self.rng.range(max_ttl / 8, max_ttl);
                let n = &mut self.nodes[node];
                n.busy_until = n.busy_until.max(self.now + pause);
                self.stats.server_pauses += 1;
                self.log(format_args!("node {node} pauses for {pause} ns"));
            }
            7 => {
                // The server is at its limit of clients for the next few connections.
                self.nodes[node].reject_connects += self.rng.range(1, 3) as u32;
            }
            13 => {
                // `SCRIPT FLUSH`, the slow node's cache more often than not.
                let node = if self.rng.chance(0.7) {
                    (0..self.nodes.len())
                        .max_by_key(|&n| self.p.service[n])
                        .unwrap_or(node)
                } else {
                    node
                };
                self.stats.script_flushes += 1;
                self.log(format_args!("node {node}'s script cache is flushed"));
                self.nodes[node].server.node.forget_scripts();
            }
            14 => self.sentinel_fault(),
            9 => self.cluster_fault(false, false),
            10 => self.cluster_fault(true, false),
            11 => self.cluster_fault(false, true),
            _ => {
                // A client's command connection to a node breaks from the server's side
                // (an idle timeout, `CLIENT KILL`), whatever is in flight.
                if let Some(sock) = self.sock_to(client, node, false) {
                    if self.socks[sock].open {
                        self.stats.resets += 1;
                        self.log(format_args!(
                            "node {node} kills client {client}'s connection"
                        ));
                        self.close_server_end(sock, reset_error());
                    }
                }
            }
        }
    }

    /// Node `node`'s server crashes: its connections close, what it had not run is gone, and
    /// it restarts later (with its data if it persists it).
    fn crash(&mut self, node: usize) {
        if !self.nodes[node].up {
            return;
        }
        if self.sentinel_crash(node) {
            return;
        }
        self.stats.crashes += 1;
        self.kill(node);
        let max_ttl = 2 * self.p.ttl_ms * MS;
        if self.scenario == Scenario::InstantRestart {
            self.log(format_args!("node {node} crashes and restarts at once"));
            self.restart(node);
        } else {
            let down = self.rng.range(max_ttl, 3 * max_ttl);
            self.log(format_args!("node {node} crashes for {down} ns"));
            self.schedule(down, Ev::Restart { node });
        }
    }

    /// Node `node`'s server process is gone: its connections close, and what it had not run
    /// is lost.
    fn kill(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.up = false;
        n.incarnation += 1;
        n.backlog.clear();
        n.exec_scheduled = false;
        n.busy_until = 0;
        n.server.refusal = None;
        for sock in 0..self.socks.len() {
            let s = &self.socks[sock];
            if s.server == node && s.accepted == Some(self.nodes[node].incarnation - 1) {
                self.socks[sock].to_server.clear();
                self.close_server_end(sock, reset_error());
            }
        }
    }

    /// Node `node`'s server starts again: a new process (a new run id), loading its data for a
    /// while if it kept any. Within the model, fencing runs on nodes that persist every
    /// acknowledged write (AOF, `appendfsync always`), and a node restarted as another version
    /// of Redis restarts on its data: a Redis 7 node upgraded to Redis 8 (readers stay in
    /// sorted sets, new ones become hash fields), or a Redis 8 node downgraded to Redis 7 when
    /// its data holds no hash (which Redis 7 could not load).
    fn restart(&mut self, node: usize) {
        let mut persistent = self.p.locks.fenced() && self.scenario.model();
        // A cluster's nodes run one version: a restart does not change it.
        let in_cluster = self.nodes[node].place.is_some();
        if !in_cluster && self.p.upgrade > 0.0 && self.rng.chance(self.p.upgrade) {
            let server = &self.nodes[node].server;
            if !server.has_hash_fields() {
                self.log(format_args!("node {node} is upgraded to Redis 8"));
                self.nodes[node].server.version = REDIS_8;
                self.stats.upgrades += 1;
                persistent = true;
            } else if !server.node.has_hashes() {
                self.log(format_args!("node {node} is downgraded to Redis 7"));
                self.nodes[node].server.version = REDIS_7;
                self.stats.server_downgrades += 1;
                persistent = true;
            }
        }
        let id = run_id(&mut self.rng);
        let loading = persistent && self.rng.chance(0.5);
        let n = &mut self.nodes[node];
        n.up = true;
        n.server.run_id = id;
        // A process killed while it loaded does not load on: this one loads only if drawn.
        n.server.loading = false;
        if persistent {
            n.server.node.forget_scripts();
        } else {
            n.server.node = node_memory();
        }
        self.log(format_args!("node {node} restarts"));
        if loading {
            let n = &mut self.nodes[node];
            n.server.loading = true;
            let incarnation = n.incarnation;
            self.stats.loading_restarts += 1;
            let lasts = self.rng.range(0, self.p.ttl_ms * MS);
            self.schedule(lasts, Ev::LoadingEnds { node, incarnation });
        }
        self.sentinel_restarted(node);
    }
    // --- the clients' programs -------------------------------------------------------------

    /// Starts the next lock cycle of caller `k` of client `c`; once it has none left, the
    /// client may close.
    fn start_cycle(&mut self, c: usize, k: usize) {
        if self.clients[c].callers[k].cycles_left == 0 || self.now > self.p.horizon {
            if self.clients[c].callers[k].last != Last::Due {
                self.caller(c, k).last = Last::Over;
                self.caller(c, k).done = true;
                return self.maybe_close(c);
            }
            // Within the model, one more cycle once the last fault healed (none starts after
            // the horizon): its release must leave nothing on any node, with no fault to
            // excuse it.
            let quiet = self.now > self.p.horizon && !self.faults_active();
            if !quiet && self.now < self.p.horizon + QUIET_WAIT * self.p.ttl_ms * MS {
                let poll = self.p.node_timeout.as_nanos() as u64;
                return self.set_timer(c, k, HOLDER, poll);
            }
            // A master moved until the horizon: the callers go on with ordinary cycles until
            // the client had the time to find out where it is now (see
            // `World::unavailable`), so that the last cycle's every attempt is judged, its
            // first included, even one the other members grant at once.
            let warming = quiet && self.p.readdress && {
                let since = *self.quiet_since.get_or_insert(self.now);
                self.now < since + self.availability_grace()
            };
            if !warming {
                self.caller(c, k).last = if !quiet {
                    // Never quiet (bounded, so that the run ends): no last cycle to look at.
                    Last::Over
                } else {
                    Last::Running
                };
                if self.clients[c].callers[k].last == Last::Over {
                    return self.start_cycle(c, k);
                }
                self.log(format_args!("caller {c}.{k} runs its last cycle"));
                self.quiet_since.get_or_insert(self.now);
            }
        }
        let global = self.clients[c].callers[k].global;
        let arena = self.arena;
        let key = self.rng.below(self.p.keys as u64) as usize;
        let (side, spec, keys) = match self.p.locks {
            Locks::Mutex => (Side::Mutex, mutex(arena, key, None), vec![key]),
            Locks::Fenced => (
                Side::Mutex,
                mutex(arena, key, Some(&arena.fences[key])),
                vec![key],
            ),
            Locks::ReadWrite | Locks::FencedWrite if self.rng.chance(0.6) => {
                let spec = Spec {
                    keys: Keys::Read {
                        resource: &arena.keys[key],
                        keys: &arena.rw[key],
                    },
                    fence: None,
                };
                (Side::Read, spec, vec![key])
            }
            Locks::ReadWrite | Locks::FencedWrite => {
                let fence = (self.p.locks == Locks::FencedWrite)
                    .then(|| arena.write_fences[key].as_slice());
                let spec = Spec {
                    keys: Keys::Write {
                        resource: &arena.keys[key],
                        keys: &arena.rw[key],
                    },
                    fence,
                };
                (Side::Write, spec, vec![key])
            }
            Locks::All if self.rng.chance(0.6) => {
                let set = self.rng.below(self.sets.len() as u64) as usize;
                let set: &'a [&'a [u8]] = &self.sets[set];
                let keys = set
                    .iter()
                    .map(|k| arena.keys.iter().position(|n| n == k).expect("a key"))
                    .collect();
                let spec = Spec {
                    keys: Keys::All(set),
                    fence: None,
                };
                (Side::Mutex, spec, keys)
            }
            Locks::All => (Side::Mutex, mutex(arena, key, None), vec![key]),
            Locks::Semaphore | Locks::NaiveSemaphore => {
                let spec = Spec {
                    keys: Keys::Semaphore {
                        resource: &arena.keys[key],
                        keys: &arena.sems[key],
                        permits: self.p.permits,
                        capacity: self.p.slots,
                        quorum: self.p.quorum,
                    },
                    fence: None,
                };
                (Side::Permit, spec, vec![key])
            }
        };
        let kind = match side {
            Side::Mutex => Kind::Mutex,
            Side::Read => Kind::Read,
            Side::Write => Kind::Write,
            Side::Permit => Kind::Permit {
                permits: self.p.permits,
            },
        };
        let invoke = Duration::from_nanos(self.now);
        let ops = keys
            .iter()
            .map(|&k| {
                self.history.push(history::Op {
                    client: global,
                    kind,
                    key: self.arena.keys[k].clone(),
                    invoke,
                    ok: None,
                    fence: None,
                    valid_until: None,
                    release: None,
                })
            })
            .collect();
        let wait = !self.rng.chance(self.p.try_once);
        // A last cycle's keys live long enough for what its release owes after a fault (see
        // `World::tail`) to be looked for while they would still be there.
        let ttl_ms = match self.clients[c].callers[k].last {
            Last::Running => self.p.ttl_ms + LAST_TTL_MS,
            _ => self.p.ttl_ms,
        };
        let timing = self.timing(ttl_ms);
        let keep = if wait && self.rng.chance(self.p.keep) {
            // Kept with any TTL, shorter than the lock's too, at the default interval or one
            // of its own (which may be refused).
            let keep_ttl = self.rng.range(ttl_ms / 2, 2 * ttl_ms);
            let interval = self
                .rng
                .chance(0.3)
                .then(|| Duration::from_millis(self.rng.range(1, keep_ttl)));
            Schedule::new(
                self.timing(keep_ttl),
                interval,
                self.clients[c].config.retry_delay,
                self.p.node_timeout,
            )
            .ok()
        } else {
            None
        };
        let now = self.instant(self.now);
        let cl = &mut self.clients[c];
        let config = cl.config;
        // Its wall clock in microseconds, as a ticket: the process makes it later than the
        // last it handed out.
        let wall = (self.now + cl.clock) / 1000;
        let params = Params {
            ttl_ms,
            timing,
            wait,
            fair: config.fair,
            ticket: if config.fair {
                cl.tickets.next(wall)
            } else {
                0
            },
            spread: cl.callers[k].spread,
        };
        let bump = params.ticket as i64 - wall as i64;
        let ahead = if config.fair && wait {
            self.queued(&keys)
        } else {
            Vec::new()
        };
        if self.trace {
            eprintln!(
                "{:>10.3} ms  caller {c}.{k} takes {side:?} on {keys:?} (ops {ops:?}), wait {wait}, fair {}, keep {}",
                self.now as f64 / MS as f64,
                config.fair,
                keep.is_some()
            );
        }
        self.stats.acquisitions += 1;
        self.caller(c, k).cycle = Some(Cycle {
            spec,
            ops,
            keys,
            side,
            wait,
            keep,
            held: None,
            member: Vec::new(),
            ahead,
            ttl_ms,
            waiter: Vec::new(),
        });
        let round = Round::new(self.p.nodes, now, None, None);
        let m = Acquisition::new(spec, config, params, now, round, &mut self.rng.0);
        if side == Side::Write {
            if let Some(cy) = self.caller(c, k).cycle.as_mut() {
                cy.waiter = m.waiter().to_vec();
            }
        }
        if config.fair && wait && self.scenario == Scenario::Calm {
            let mut member = match side {
                Side::Read => b"r".to_vec(),
                Side::Write => b"w".to_vec(),
                Side::Mutex | Side::Permit => Vec::new(),
            };
            member.extend_from_slice(m.waiter());
            self.fair_waiters.insert(member.clone(), (c, bump));
            if let Some(cy) = self.caller(c, k).cycle.as_mut() {
                cy.member = member;
            }
        }
        self.caller(c, k).since = Some(self.now);
        self.start_job(c, k, Job::Acquire(Box::new(m)));
    }

    /// In calm runs of mutexes and read-write locks, the fair queue of `keys` (a single key)
    /// and its entries' expiries.
    fn queue_keys(&self, keys: &[usize]) -> Option<(Vec<u8>, Vec<u8>)> {
        if self.scenario != Scenario::Calm || keys.len() != 1 {
            return None;
        }
        match self.p.locks {
            Locks::Mutex => Some((
                Derived::MutexQueue.of(&self.arena.keys[keys[0]]).to_vec(),
                Derived::MutexQueueExpiries
                    .of(&self.arena.keys[keys[0]])
                    .to_vec(),
            )),
            Locks::ReadWrite => Some((
                self.arena.rw[keys[0]].queue().to_vec(),
                self.arena.rw[keys[0]].queue_expiries().to_vec(),
            )),
            _ => None,
        }
    }

    /// In calm runs of mutexes and read-write locks, the waiters queued on a quorum of nodes
    /// in the fair queue of `keys` (a single key), with the tickets they queued with.
    fn queued(&mut self, keys: &[usize]) -> Vec<(Vec<u8>, f64)> {
        let Some((queue, expiries)) = self.queue_keys(keys) else {
            return Vec::new();
        };
        let mut seen: BTreeMap<Vec<u8>, (f64, usize)> = BTreeMap::new();
        for node in 0..self.nodes.len() {
            let now_ms = self.nodes[node].clock_ms(self.now);
            let mem = &mut self.nodes[node].server.node;
            for (member, ticket) in mem.queue_entries(now_ms, &queue, &expiries) {
                seen.entry(member).or_insert((ticket, 0)).1 += 1;
            }
        }
        seen.into_iter()
            .filter(|(_, (_, n))| *n >= self.p.quorum)
            .map(|(m, (t, _))| (m, t))
            .collect()
    }

    /// The ticket `member` first queued with in the fair queue of `keys`, on any node: what
    /// the waiter wrote, whatever its client meant to write.
    fn written_ticket(&self, keys: &[usize], member: &[u8]) -> Option<f64> {
        let (queue, _) = self.queue_keys(keys)?;
        let at = (queue, member.to_vec());
        self.nodes
            .iter()
            .find_map(|n| n.server.node.first_scores.as_ref()?.get(&at).copied())
    }

    /// A fair waiter of a calm run was granted. Judged by the tickets the waiters queued with
    /// (what the nodes hold, not what the simulation gave their clients): no waiter queued on
    /// a quorum before it started may still be waiting (but readers may pass readers) if it is
    /// ahead of it in the queue, and if it is behind, its ticket may be later only by as much
    /// as their clients' clocks disagree; a ticket that is not in the order the waiters
    /// arrived (a ticket written newest first, a client serving its own waiters last come
    /// first) is found so.
    fn check_fifo(&mut self, c: usize, k: usize) {
        let cycle = self.clients[c].callers[k].cycle.as_ref().expect("a cycle");
        if cycle.ahead.is_empty() || cycle.member.is_empty() {
            return;
        }
        let (ahead, member, side, keys) = (
            cycle.ahead.clone(),
            cycle.member.clone(),
            cycle.side,
            cycle.keys.clone(),
        );
        let Some(own) = self.written_ticket(&keys, &member) else {
            return;
        };
        self.stats.fifo_checked += 1;
        let still: Vec<Vec<u8>> = self.queued(&keys).into_iter().map(|(m, _)| m).collect();
        let name = |m: &[u8]| String::from_utf8_lossy(m).into_owned();
        for (other, t) in ahead {
            let reader = other.first() == Some(&b'r');
            if !still.contains(&other) || (reader && side == Side::Read) {
                continue;
            }
            if (t, &other) < (own, &member) {
                self.failures.push(format!(
                    "fair queue order: caller {c}.{k} ({}, ticket {own}) was granted while {} \
                     (ticket {t}), queued ahead of it before it started, still waits",
                    name(&member),
                    name(&other)
                ));
                continue;
            }
            // The other waiter started first, yet queued with a later ticket: only its
            // client's clock being ahead (or its own earlier waiters) may explain it.
            let Some(&(oc, bump)) = self.fair_waiters.get(&other) else {
                continue;
            };
            let skew = self.clients[oc].clock as i64 - self.clients[c].clock as i64;
            let allowed =
                skew.div_euclid(1000) + i64::from(skew.rem_euclid(1000) != 0) + bump.max(0);
            if t - own > allowed as f64 {
                self.failures.push(format!(
                    "fair queue order: caller {c}.{k} ({}) queued with ticket {own}, ahead of {} \
                     (ticket {t}, client {oc}), which was queued before it started: tickets \
                     {} µs out of arrival order, clocks {skew} ns apart",
                    name(&member),
                    name(&other),
                    t - own
                ));
            }
        }
    }

    fn timing(&self, ttl_ms: u64) -> Timing {
        Timing {
            ttl: Duration::from_millis(ttl_ms),
            drift_factor: self.p.drift_factor,
        }
    }

    /// The acquisition of client `c`'s cycle is over.
    fn acquired(&mut self, c: usize, k: usize, outcome: Result<Grant, Error>) {
        self.returned(c, k, "an acquisition");
        let refused_quorum = self.p.nodes - self.p.refused < self.p.quorum;
        let wait = self.clients[c].callers[k]
            .cycle
            .as_ref()
            .is_some_and(|cy| cy.wait);
        let grant = match outcome {
            Ok(grant) => grant,
            Err(e) => {
                self.log(format_args!("caller {c}.{k} gives up: {e}"));
                // Which nodes accept the setup but failed the last attempt: the network's
                // doing (a reset, a pause, a partition), which may decide a round before every
                // refused setup is in.
                let network = e.failures().iter().any(|f| !self.nodes[f.node].refused);
                if e.is_config() {
                    self.stats.config_errors += 1;
                } else if refused_quorum && wait && !network {
                    // One attempt (`try_*`) may be decided by a node's refusal before every
                    // refused setup is in; a wait lost only on the refused nodes must find out,
                    // and end at once.
                    self.failures.push(format!(
                        "too few nodes accept the setup for a quorum, yet the acquisition ended with: {e}"
                    ));
                }
                if self.scenario == Scenario::Calm {
                    self.failures
                        .push(format!("a wait in a calm run ended with: {e}"));
                }
                return self.end_cycle(c, k);
            }
        };
        if refused_quorum {
            self.failures
                .push("granted though too few nodes accept the setup".into());
        }
        if self.clients[c].config.fair {
            self.check_fifo(c, k);
        }
        let now = self.instant(self.now);
        let steps = self.rng.range(1, 3) as u32;
        let kept_steps = self.rng.range(3, 6) as u32;
        let fair = self.clients[c].config.fair;
        let cycle = self.clients[c].callers[k].cycle.as_mut().expect("a cycle");
        self.stats.grants += 1;
        self.stats.fair_grants += u64::from(fair);
        self.stats.set_grants += u64::from(matches!(cycle.spec.keys, Keys::All(_)));
        self.stats.fenced_grants += u64::from(grant.fencing_token.is_some());
        for &op in &cycle.ops {
            let op = &mut self.history.ops[op];
            op.ok = Some(Duration::from_nanos(self.now));
            op.valid_until = Some(grant.valid_until - self.base);
            op.fence = grant.fencing_token;
        }
        let kept = cycle
            .keep
            .map(|plan| KeptValidity::new(plan, now, grant.valid_until));
        let steps = if kept.is_some() { kept_steps } else { steps };
        let grant_id = self.stats.grants;
        cycle.held = Some(Held {
            grant: grant_id,
            token: grant.token,
            hold: Hold::new(grant.valid_until).written_with(Duration::from_millis(cycle.ttl_ms)),
            steps,
            reading: true,
            read: Vec::new(),
            kept,
            release_wanted: false,
            releasing: false,
            lost_extend: false,
        });
        let ops = cycle.ops.clone();
        self.log(format_args!(
            "caller {c}.{k} holds {ops:?} until {:?}, fence {:?}",
            grant.valid_until, grant.fencing_token
        ));
        if let Some(due) = self.kept_due(c, k, now) {
            self.stats.kept += 1;
            self.set_keeper(c, k, due);
        } else {
            self.look_at_validity_end(c, k, grant_id, grant.valid_until);
        }
        self.maybe_tail(c, k, false);
        self.withdrawal_meets_a_break(c, k);
        self.next_step(c, k);
    }

    /// Within the model ([`Scenario::Model`]), the last cycle of a write-preferring writer
    /// whose lost attempts left its intent on some node: half the time, its withdrawal meets
    /// a broken connection on its way to one of those nodes. Once the client owes that node
    /// nothing (no withdrawal kept for its next connection, nothing in flight), the node may
    /// hold the intent no more (see [`World::intent_check`]): an intent left there keeps
    /// readers out with no writer waiting.
    fn withdrawal_meets_a_break(&mut self, c: usize, k: usize) {
        if self.scenario != Scenario::Model || self.clients[c].callers[k].last != Last::Running {
            return;
        }
        let config = self.clients[c].config;
        let Some(cy) = self.clients[c].callers[k].cycle.as_ref() else {
            return;
        };
        if cy.side != Side::Write || config.rw_policy != RwPolicy::WritePreferring {
            return;
        }
        let name = self.arena.rw[cy.keys[0]].intents().to_vec();
        let waiter = cy.waiter.clone();
        let holding: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| {
                let now_ms = self.nodes[n].clock_ms(self.now);
                self.nodes[n].up
                    && self.nodes[n]
                        .server
                        .node
                        .holds_token(now_ms, &name, &waiter)
            })
            .collect();
        if holding.is_empty() || !self.rng.chance(0.5) {
            return;
        }
        let node = holding[self.rng.below(holding.len() as u64) as usize];
        self.stats.broken_withdrawals += 1;
        self.schedule(0, Ev::BreakTo { client: c, node });
        self.intent_checks.push(IntentCheck {
            client: c,
            node,
            name,
            waiter,
        });
        let check = self.intent_checks.len() - 1;
        self.schedule(MS / 4, Ev::IntentCheck { check });
    }

    /// A writer's intent, whose withdrawal met a broken connection (see
    /// [`World::withdrawal_meets_a_break`]), is looked for on its node: still there while its
    /// client owes that node nothing and has nothing on its way there that will still run,
    /// it is left behind. Looked at again while something is owed or on its way, until it is
    /// gone or expired.
    fn intent_check(&mut self, i: usize) {
        let (c, node) = (self.intent_checks[i].client, self.intent_checks[i].node);
        if !self.nodes[node].up || self.clients[c].closing {
            return;
        }
        let now_ms = self.nodes[node].clock_ms(self.now);
        let chk = &self.intent_checks[i];
        let live = self.nodes[node]
            .server
            .node
            .holds_token(now_ms, &chk.name, &chk.waiter);
        if !live {
            return;
        }
        let now = self.instant(self.now);
        let owed = self.clients[c]
            .ep
            .undelivered(now)
            .contains(&self.member_of(node));
        if owed || self.will_run_at(c, node) {
            let after = (self.p.node_timeout.as_nanos() as u64 / 4).max(MS / 4);
            self.schedule(after, Ev::IntentCheck { check: i });
            return;
        }
        let msg = format!(
            "a writer's intent left behind: node {node} holds {:?} of client {c}'s writer, whose withdrawal met a broken connection, with nothing owed or in flight there",
            String::from_utf8_lossy(&self.intent_checks[i].name)
        );
        self.log(format_args!("{msg}"));
        self.failures.push(msg);
    }

    /// How long after every fault healed a client has had the time to find out what changed:
    /// two topology reads' least gap, and a connect (see [`World::unavailable`]), in ns.
    fn availability_grace(&self) -> u64 {
        200 * MS + self.p.connect_timeout.as_nanos() as u64
    }

    /// Availability once every fault healed (within the model, [`Scenario::Model`] and
    /// [`Scenario::ClusterModel`]): a last cycle (see [`Last`]) may lose its lock to
    /// contention, but its attempts that start once the client had the time to find out
    /// what changed (a topology read, a connect) are not failed by a node for being sent
    /// to the wrong place or in the wrong form: `CLUSTERDOWN` (which the client also makes
    /// up for a slot it knows no master of), `MOVED`, `ASK`, or a command the server does
    /// not have (alone, or in a transaction it then aborts). A client that stops following its cluster (links to masters that moved,
    /// never given up, until there is no room for the new ones) fails every lock on their
    /// slots for good; one that keeps what it learnt of a server across a restart as
    /// another version sends it commands it lacks. `round` is the acquisition's last
    /// attempt.
    fn unavailable(&mut self, c: usize, k: usize, round: &Round) {
        use crate::resp::ServerErrorKind as K;
        let last = self.clients[c].callers[k].last == Last::Running;
        if !last || !matches!(self.scenario, Scenario::Model | Scenario::ClusterModel) {
            return;
        }
        let Some(since) = self.quiet_since else {
            return;
        };
        // A last cycle's own fault (see [`World::tail`]), met before or during this attempt,
        // settled first.
        let grace = self.availability_grace();
        if self.nanos(round.start()) < (since + grace).max(self.idle.settle_until) {
            return;
        }
        let failed = round.failures().find(|(_, f)| match f {
            NodeErrorKind::Server { kind, message } => {
                matches!(kind, K::ClusterDown | K::Moved | K::Ask | K::ExecAbort)
                    || message.starts_with("ERR unknown command")
            }
            _ => false,
        });
        if let Some((node, why)) = failed {
            self.failures.push(format!(
                "caller {c}.{k}'s last cycle, every fault healed, failed on member {node}: {why}"
            ));
        }
    }

    /// Looks at the nodes at the last nanosecond of grant `grant`'s validity, which ends at
    /// `until`, unless the holder releases, keeps or extends it before.
    fn look_at_validity_end(&mut self, c: usize, k: usize, grant: u64, until: Instant) {
        let until = self.nanos(until);
        if until > self.now + 1 {
            self.schedule(
                until - 1 - self.now,
                Ev::ValidityEnd {
                    client: c,
                    caller: k,
                    grant,
                    until,
                },
            );
        }
    }

    /// The last instant of grant `grant`'s validity (ending at `until`), if caller `k` of
    /// client `c` still holds it with that validity (not released, downgraded, kept, or
    /// extended since): the nodes on which its entries
    /// are live then. Fewer than its quorum, and another client could have the lock while this
    /// one still counts it valid. Nodes that are down are looked at too: within the model a
    /// crashed node restarts without its data only after every TTL it held ran out, which is as
    /// if it had kept them until then.
    fn validity_end(&mut self, c: usize, k: usize, grant: u64, until: u64) {
        let Some(cycle) = self.clients[c].callers[k].cycle.as_ref() else {
            return;
        };
        let Some(held) = cycle.held.as_ref() else {
            return;
        };
        if held.grant != grant
            || self.nanos(held.hold.valid_until()) != until
            || held.releasing
            || held.release_wanted
            || held.kept.is_some()
            || cycle
                .ops
                .iter()
                .any(|&op| self.history.ops[op].release.is_some())
        {
            return;
        }
        let token = held.token;
        let quorum = cycle.spec.quorum(self.p.nodes);
        let spec_keys = cycle.spec.keys;
        let ops = cycle.ops.clone();
        for op in ops {
            let names: Vec<Vec<u8>> = match spec_keys {
                Keys::Mutex(key) => vec![key.to_vec()],
                Keys::All(_) => vec![self.history.ops[op].key.clone()],
                Keys::Read { keys, .. }
                | Keys::Write { keys, .. }
                | Keys::Downgraded { keys, .. } => {
                    vec![keys.writer().to_vec(), keys.readers().to_vec()]
                }
                Keys::Semaphore { keys, .. } => vec![keys.holders().to_vec()],
            };
            let mut live_on = Vec::new();
            for node in 0..self.nodes.len() {
                if !self.votes(node) {
                    continue;
                }
                let now_ms = self.nodes[node].clock_ms(self.now);
                let mem = &mut self.nodes[node].server.node;
                if names
                    .iter()
                    .any(|name| mem.holds_token(now_ms, name, token.as_bytes()))
                {
                    live_on.push(self.member_of(node));
                }
            }
            live_on.sort_unstable();
            live_on.dedup();
            if live_on.len() < quorum {
                self.log(format_args!(
                    "op {op}'s validity ends with its entries live on {live_on:?} only"
                ));
            }
            self.history.validity_ends.push(history::ValidityEnd {
                op,
                at: Duration::from_nanos(self.now),
                live_on,
                quorum,
            });
        }
    }

    /// When a kept lock's first extension is due.
    fn kept_due(&mut self, c: usize, k: usize, now: Instant) -> Option<Instant> {
        let held = self.clients[c].callers[k].cycle.as_ref()?.held.as_ref()?;
        Some(held.kept.as_ref()?.next_due(now))
    }

    /// Schedules the keeper at `due`, or later when it runs slow.
    fn set_keeper(&mut self, c: usize, k: usize, due: Instant) {
        let mut at = self.nanos(due).max(self.now);
        if self.rng.chance(self.p.slow_keeper) {
            self.stats.slow_keepers += 1;
            at += self.rng.below(self.p.ttl_ms * MS);
        }
        self.set_timer(c, k, KEEPER, at - self.now);
    }

    /// The validity the holder sees at `now`: its guard's, or its kept lock's.
    fn valid(&mut self, c: usize, k: usize) -> bool {
        let now = self.instant(self.now);
        let Some(held) = self.clients[c].callers[k]
            .cycle
            .as_mut()
            .and_then(|cy| cy.held.as_mut())
        else {
            return false;
        };
        match held.kept.as_ref() {
            Some(kept) => kept.left(now).is_some(),
            None => held.hold.validity(now) > Duration::ZERO,
        }
    }

    /// How long a caller's operation may take, in ns, in every scenario: its wait timeout
    /// (which bounds an acquisition; a round of a held lock takes much less) and a generous
    /// allowance beyond it (connect timeouts, a round's node timeouts, a slow node's backlog).
    fn live_bound(&self) -> u64 {
        let wait = self.p.wait_timeout.as_nanos() as u64;
        let connect = self.p.connect_timeout.as_nanos() as u64;
        wait + 4 * connect + (20 * self.p.ttl_ms + 1000) * MS
    }

    /// Caller `k` of client `c`'s operation (`what`) returned: a caller that took longer than
    /// [`World::live_bound`] is a liveness failure, whatever the scenario.
    fn returned(&mut self, c: usize, k: usize, what: &str) {
        let Some(since) = self.caller(c, k).since.take() else {
            return;
        };
        let took = self.now - since;
        if took > self.live_bound() {
            self.failures.push(format!(
                "caller {c}.{k}'s {what} returned {} ms after it began, past its wait timeout and then some ({} ms)",
                took / MS,
                self.live_bound() / MS
            ));
        }
    }

    /// The TTL caller `k` of client `c`'s cycle writes its keys with, in ms.
    fn cycle_ttl(&self, c: usize, k: usize) -> u64 {
        self.clients[c].callers[k]
            .cycle
            .as_ref()
            .map_or(self.p.ttl_ms, |cy| cy.ttl_ms)
    }

    /// Schedules the holder's next work step.
    fn next_step(&mut self, c: usize, k: usize) {
        let now = self.instant(self.now);
        let ttl = self.cycle_ttl(c, k) * MS;
        let Some(held) = self.clients[c].callers[k]
            .cycle
            .as_ref()
            .and_then(|cy| cy.held.as_ref())
        else {
            return;
        };
        let left = match &held.kept {
            Some(_) => ttl,
            None => held.hold.validity(now).as_nanos() as u64,
        };
        let work = self.rng.below(left / 2 + 1);
        self.set_timer(c, k, HOLDER, work);
    }

    /// The holder's work: read the counters, then (after a while, maybe a pause) write them.
    fn holder(&mut self, c: usize, k: usize) {
        let Some(cycle) = self.clients[c].callers[k].cycle.as_ref() else {
            return self.start_cycle(c, k);
        };
        let Some(held) = cycle.held.as_ref() else {
            return;
        };
        if held.releasing || held.release_wanted {
            return;
        }
        let (reading, keys, ops, side) = (
            held.reading,
            cycle.keys.clone(),
            cycle.ops.clone(),
            cycle.side,
        );
        let checked = self.scenario != Scenario::UncheckedPause;
        if reading {
            if !self.valid(c, k) {
                self.log(format_args!("caller {c}.{k} finds its validity gone"));
                return self.start_release(c, k);
            }
            let read = keys.iter().map(|&k| self.counters[k]).collect();
            let now = self.instant(self.now);
            let ttl = self.cycle_ttl(c, k) * MS;
            let held = self.held(c, k);
            held.read = read;
            held.reading = false;
            let held_for_validity = held.kept.is_none();
            let left = if held.kept.is_some() {
                ttl
            } else {
                held.hold.validity(now).as_nanos() as u64
            };
            let mut work = self.rng.below(left / 2 + 1);
            if held_for_validity
                && self.p.pause_to_end > 0.0
                && self.rng.chance(self.p.pause_to_end)
            {
                // The write lands in the validity's last 50 us, when the check still passes.
                work = left.saturating_sub(self.rng.range(1, 50_000));
                self.log(format_args!("caller {c}.{k} works to its validity's end"));
            } else if self.rng.chance(self.p.pause) {
                self.stats.pauses += 1;
                work += if self.scenario == Scenario::UncheckedPause {
                    self.rng.range(left, left + ttl)
                } else {
                    self.rng.range(0, 2 * ttl)
                };
                self.log(format_args!("caller {c}.{k} pauses for {work} ns"));
            }
            return self.set_timer(c, k, HOLDER, work);
        }
        if checked && !self.valid(c, k) {
            self.log(format_args!("caller {c}.{k} finds its validity gone"));
            return self.start_release(c, k);
        }
        if matches!(side, Side::Mutex | Side::Write) {
            let held = self.held(c, k);
            let read = held.read.clone();
            let after_lost = held.lost_extend;
            self.stats.writes_after_lost_extend += u64::from(after_lost);
            let global = self.clients[c].callers[k].global;
            for ((key, op), r) in keys.into_iter().zip(ops).zip(read) {
                self.counters[key] = r + 1;
                self.history.increments.push(Increment {
                    client: global,
                    key: self.arena.keys[key].clone(),
                    read: r,
                    at: Duration::from_nanos(self.now),
                    op,
                });
            }
        }
        let held = self.held(c, k);
        held.reading = true;
        held.steps = held.steps.saturating_sub(1);
        let (steps, kept) = (held.steps, held.kept.is_some());
        if steps == 0 || !self.valid(c, k) {
            return self.start_release(c, k);
        }
        if !kept && side == Side::Write && self.rng.chance(0.3) {
            // The writer goes on as a reader: any TTL, as for an extend. Its write window ends
            // as the round starts (it writes no more); its read window starts there.
            let ttl = self.cycle_ttl(c, k);
            let ttl_ms = self.rng.range((ttl / 4).max(10), 2 * ttl);
            let ops = self.clients[c].callers[k]
                .cycle
                .as_ref()
                .expect("a cycle")
                .ops
                .clone();
            for op in ops {
                self.history.ops[op].release = Some(Duration::from_nanos(self.now));
            }
            self.log(format_args!("caller {c}.{k} downgrades for {ttl_ms} ms"));
            let step = Step::Downgrade {
                ttl_ms,
                timing: self.timing(ttl_ms),
            };
            return self.start_round(c, k, step, Purpose::Downgrade { at: self.now });
        }
        if !kept && self.rng.chance(0.4) {
            // Any TTL, a shorter one than the lock's too.
            let ttl = self.cycle_ttl(c, k);
            let ttl_ms = self.rng.range((ttl / 4).max(10), 2 * ttl);
            self.stats.extends += 1;
            self.stats.shorter_extends += u64::from(ttl_ms < ttl);
            let step = Step::Extend {
                ttl_ms,
                timing: self.timing(ttl_ms),
            };
            return self.start_round(c, k, step, Purpose::Extend { ttl_ms });
        }
        self.next_step(c, k);
    }

    fn held(&mut self, c: usize, k: usize) -> &mut Held {
        self.clients[c].callers[k]
            .cycle
            .as_mut()
            .and_then(|cy| cy.held.as_mut())
            .expect("held")
    }

    /// The keeper's turn for client `c`'s kept lock.
    fn keeper(&mut self, c: usize, k: usize) {
        let now = self.instant(self.now);
        let Some(held) = self.clients[c].callers[k]
            .cycle
            .as_mut()
            .and_then(|cy| cy.held.as_mut())
        else {
            return;
        };
        if held.releasing || held.release_wanted {
            return;
        }
        let Some(kept) = held.kept.as_ref() else {
            return;
        };
        if kept.round_starts(now).is_err() {
            self.stats.kept_lost += 1;
            self.log(format_args!("caller {c}.{k}'s kept lock is lost"));
            return;
        }
        let ttl = kept.plan().ttl();
        let ttl_ms = ttl.as_millis() as u64;
        self.stats.keeper_rounds += 1;
        self.record_until(c, k);
        let step = Step::Extend {
            ttl_ms,
            timing: self.timing(ttl_ms),
        };
        self.start_round(c, k, step, Purpose::Keep);
    }

    /// Writes the holder's end of validity into the history.
    fn record_until(&mut self, c: usize, k: usize) {
        let cycle = self.clients[c].callers[k].cycle.as_ref().expect("a cycle");
        let held = cycle.held.as_ref().expect("held");
        let until = held
            .kept
            .as_ref()
            .map_or(held.hold.valid_until(), KeptValidity::until);
        for &op in &cycle.ops {
            self.history.ops[op].valid_until = Some(until - self.base);
        }
    }

    /// Starts a round of `step` on the held lock.
    fn start_round(&mut self, c: usize, k: usize, step: Step, purpose: Purpose) {
        let now = self.instant(self.now);
        let Some(slot) = self.holds.next() else {
            // Out of storage: this caller stops here (its lock expires on its own).
            self.failures
                .push("the simulation ran out of storage for holds".into());
            self.caller(c, k).cycles_left = 0;
            return self.end_cycle(c, k);
        };
        let cl = &mut self.clients[c];
        let config = cl.config;
        let cycle = cl.callers[k].cycle.as_ref().expect("a cycle");
        let held = cycle.held.as_ref().expect("held");
        *slot = held.hold;
        let round = Round::new(self.p.nodes, now, None, None);
        let m = slot.round(cycle.spec, held.token, config, step, now, round);
        self.caller(c, k).since = Some(self.now);
        self.start_job(c, k, Job::Round(Box::new(m), purpose));
    }

    fn start_release(&mut self, c: usize, k: usize) {
        let busy = matches!(self.clients[c].callers[k].job, Job::Round(..));
        let held = self.held(c, k);
        if busy {
            held.release_wanted = true;
            return;
        }
        held.releasing = true;
        self.cancel_timer(c, k, KEEPER);
        self.cancel_timer(c, k, HOLDER);
        let ops = self.clients[c].callers[k]
            .cycle
            .as_ref()
            .expect("a cycle")
            .ops
            .clone();
        for op in ops {
            self.history.ops[op].release = Some(Duration::from_nanos(self.now));
        }
        self.log(format_args!("caller {c}.{k} releases"));
        self.start_round(c, k, Step::Release, Purpose::Release);
        self.maybe_tail(c, k, true);
    }

    /// A round of the held lock is over; `hold` is what it left.
    fn round_over(
        &mut self,
        c: usize,
        k: usize,
        purpose: Purpose,
        result: Result<(), Error>,
        hold: Hold,
    ) {
        self.returned(c, k, "a round of a held lock");
        let now = self.instant(self.now);
        self.log(format_args!(
            "caller {c}.{k}: {purpose:?} {result:?}, valid until {:?}",
            hold.valid_until()
        ));
        if purpose == Purpose::Release {
            if self.clients[c].callers[k].last == Last::Running {
                self.look_for_what_is_left(c, k);
            }
            self.stats.releases += 1;
            if result.is_ok() {
                self.stats.releases_ok += 1;
                self.record_release(c, k);
            } else if self.scenario.calm() {
                self.failures.push(format!(
                    "a release in a run without faults failed: {result:?}"
                ));
            }
            return self.end_cycle(c, k);
        }
        if let Purpose::Downgrade { at } = purpose {
            return self.downgraded(c, k, at, result, hold);
        }
        if purpose == Purpose::Keep && result.is_err() {
            self.stats.lost_extends += 1;
        }
        let held = self.held(c, k);
        held.hold = hold;
        if matches!(purpose, Purpose::Extend { .. }) && held.kept.is_none() {
            // A new validity (or, lost, one capped where the TTL it asked for may have landed).
            let (grant, until) = (held.grant, held.hold.valid_until());
            self.look_at_validity_end(c, k, grant, until);
        }
        let held = self.held(c, k);
        match purpose {
            Purpose::Extend { .. } => {
                if result.is_err() {
                    held.lost_extend = true;
                    self.stats.lost_extends += 1;
                }
                self.record_until(c, k);
                if self.held(c, k).release_wanted || !self.valid(c, k) {
                    return self.start_release(c, k);
                }
                // Won or not, the holder goes on while its guard's validity lasts.
                self.next_step(c, k);
            }
            Purpose::Keep => {
                let kept = held.kept.as_ref().expect("kept");
                let next = kept.round_ended(result, hold.valid_until(), now);
                self.record_until(c, k);
                if self.held(c, k).release_wanted {
                    return self.start_release(c, k);
                }
                match next {
                    Ok(due) => self.set_keeper(c, k, due),
                    Err(e) => {
                        self.stats.kept_lost += 1;
                        self.held(c, k).kept.as_ref().expect("kept").set_lost();
                        self.log(format_args!("caller {c}.{k}'s kept lock is lost: {e}"));
                    }
                }
            }
            Purpose::Release | Purpose::Downgrade { .. } => unreachable!(),
        }
    }

    /// Client `c`'s downgrade round, started at `at`, is over: won, the cycle goes on as a
    /// reader with the same token; lost, it was undone on every node and nothing is held.
    fn downgraded(&mut self, c: usize, k: usize, at: u64, result: Result<(), Error>, hold: Hold) {
        if let Err(e) = result {
            self.stats.lost_downgrades += 1;
            self.log(format_args!("caller {c}.{k}'s downgrade is lost: {e}"));
            if self.scenario == Scenario::Calm {
                self.failures
                    .push(format!("a downgrade in a calm run was lost: {e}"));
            }
            return self.end_cycle(c, k);
        }
        self.stats.downgrades += 1;
        let steps = self.rng.range(1, 3) as u32;
        let cycle = self.clients[c].callers[k].cycle.as_mut().expect("a cycle");
        let Keys::Write { resource, keys } = cycle.spec.keys else {
            unreachable!("only a write lock downgrades");
        };
        cycle.spec = Spec {
            keys: Keys::Downgraded { resource, keys },
            fence: None,
        };
        cycle.side = Side::Read;
        let key = cycle.keys[0];
        let held = cycle.held.as_mut().expect("held");
        held.hold = hold;
        held.steps = steps;
        held.reading = true;
        held.lost_extend = false;
        // The read window starts with the round: every node of its quorum held our writer key
        // or our reader from then on.
        let global = self.clients[c].callers[k].global;
        let op = self.history.push(history::Op {
            client: global,
            kind: Kind::Read,
            key: self.arena.keys[key].clone(),
            invoke: Duration::from_nanos(at),
            ok: Some(Duration::from_nanos(at)),
            fence: None,
            valid_until: Some(hold.valid_until() - self.base),
            release: None,
        });
        let cycle = self.clients[c].callers[k].cycle.as_mut().expect("a cycle");
        cycle.ops = vec![op];
        if self.held(c, k).release_wanted || !self.valid(c, k) {
            return self.start_release(c, k);
        }
        self.next_step(c, k);
    }

    fn end_cycle(&mut self, c: usize, k: usize) {
        if self.scenario == Scenario::Calm {
            let kept_lost = self.clients[c].callers[k]
                .cycle
                .as_ref()
                .and_then(|cy| cy.held.as_ref())
                .and_then(|h| h.kept.as_ref())
                .is_some_and(KeptValidity::was_lost);
            if kept_lost {
                self.failures
                    .push("a kept lock was lost in a calm run".into());
            }
        }
        self.cancel_timer(c, k, KEEPER);
        let cl = self.caller(c, k);
        cl.cycle = None;
        cl.job = Job::None;
        cl.cycles_left = cl.cycles_left.saturating_sub(1);
        let think = self.rng.below(self.p.ttl_ms * MS / 2);
        self.set_timer(c, k, HOLDER, think);
    }
}

/// How long, in TTLs past the horizon, callers wait for the last fault to heal before their
/// last cycle (faults stop at the horizon, and heal within a few TTLs).
const QUIET_WAIT: u64 = 20;

/// How much longer than the run's a last cycle's TTL is within the model, in ms: longer than
/// what a client takes to find where its release goes after a fault (see `World::tail`: two
/// connect timeouts of up to 3 TTLs, two topology reads' least gap of 100 ms), so that what
/// the release owes is looked for while its keys would still be there.
const LAST_TTL_MS: u64 = 1500;

/// The keys that hold the entries of the lock `spec` (its token's).
fn entry_names(spec: &Spec<'_>) -> Vec<Vec<u8>> {
    match spec.keys {
        Keys::Mutex(key) => vec![key.to_vec()],
        Keys::Read { keys, .. } | Keys::Write { keys, .. } | Keys::Downgraded { keys, .. } => {
            vec![keys.writer().to_vec(), keys.readers().to_vec()]
        }
        Keys::All(set) => set.iter().map(|k| k.to_vec()).collect(),
        Keys::Semaphore { keys, .. } => vec![keys.holders().to_vec()],
    }
}

fn mutex<'a>(arena: &'a Arena, key: usize, fence: Option<&'a Vec<u8>>) -> Spec<'a> {
    Spec {
        keys: Keys::Mutex(&arena.keys[key]),
        fence: fence.map(Vec::as_slice),
    }
}

/// Seeds to run: `REDLOCK_SIM_SEEDS`, or `default`.
fn seed_count(default: u64) -> u64 {
    std::env::var("REDLOCK_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// What many seeds produced together.
#[derive(Default)]
pub(crate) struct Summary {
    pub report: Report,
    pub stats: Stats,
    /// The seeds with violations, sorted.
    pub failing: Vec<u64>,
    /// The first few failures beyond the history checker's, with their seeds.
    pub failures: Vec<(u64, String)>,
}

impl Summary {
    fn absorb(&mut self, o: Summary) {
        self.report.absorb(&o.report);
        self.stats.absorb(&o.stats);
        self.failing.extend(o.failing);
        self.failures.extend(o.failures);
    }
}

/// Runs `seeds` of `scenario` with clients that take `locks`, on every core.
pub(crate) fn run_many_locks(
    seeds: std::ops::Range<u64>,
    scenario: Scenario,
    locks: Locks,
) -> Summary {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let results: Vec<Summary> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                s.spawn(move || {
                    let mut sum = Summary::default();
                    for seed in seeds.filter(|s| s % threads == t) {
                        let out = run_locks(seed, scenario, locks, false);
                        if out.violations() > 0 {
                            sum.failing.push(seed);
                        }
                        sum.failures
                            .extend(out.failures.into_iter().take(2).map(|f| (seed, f)));
                        sum.report.absorb(&out.report);
                        sum.stats.absorb(&out.stats);
                    }
                    sum
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    let mut sum = Summary::default();
    for r in results {
        sum.absorb(r);
    }
    sum.failing.sort_unstable();
    sum.failures.sort();
    sum
}

#[cfg(test)]
mod tests;
