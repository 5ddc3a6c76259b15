//! Deterministic simulation of Redlock over the sans-IO core.
//!
//! N simulated nodes ([`node::Node`]: keys with expiry, sorted sets, the scripts' semantics in
//! Rust) sit behind a simulated network that delays, loses and partitions messages. Simulated
//! clients run the real client's algorithm on virtual time: the real [`Round`], the real
//! [`Retry`] budget, and the real `ops` ([`Acquire`], [`Extend`], [`Release`]) whose `encode`
//! output is what the nodes execute and whose `classify` reads the nodes' RESP replies. Each
//! node has its own clock that drifts and may jump; nodes crash, losing everything, and
//! restart; clients pause. One seeded RNG drives everything, so a seed replays exactly.
//!
//! Every client increments a per-key counter while it believes it holds the lock, and records
//! its grants in a [`History`]; the shared checker (`tests/common/history.rs`) then looks for
//! overlapping windows and lost updates.
//!
//! Clients take the mutex, read-write locks (readers share, writers exclude everyone; each
//! client read- or write-preferring), or the fenced mutex, whose tokens the checker requires to
//! strictly increase in grant order. Fencing runs within the model on nodes that persist every
//! write (a restart keeps the counters); restarting without persistence, even after the TTL,
//! must show tokens going backwards.
//!
//! Within the model's assumptions (node clocks drift less than the drift factor allows and
//! jump forward at most 1 ms; a crashed node stays down longer than the longest TTL; a client
//! checks its validity before it writes) there must be no violation. Each assumption, broken
//! on purpose, must produce violations, which shows the checker can see them.
//!
//! `REDLOCK_SIM_SEEDS=100000 cargo test --release --lib engine::sim` runs more seeds;
//! `REDLOCK_SIM_SEED=n` replays one seed with a trace.

mod node;

#[path = "../../../tests/common/history.rs"]
pub(crate) mod history;

#[path = "../../../tests/common/local_servers.rs"]
mod local_servers;

mod diff;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::{Duration, Instant};

use rand_core::{Rng as _, SeedableRng};

use crate::engine::fair::AttemptIds;
use crate::engine::fencing::{FenceRead, FenceWrite, FencedAcquire};
use crate::engine::keys::fence_key;
use crate::engine::ops::{Acquire, Extend, Op, Release, ScriptForm, Verdict};
use crate::engine::rw::{
    ReadAcquire, ReadExtend, RwKeys, SetRelease, WriteAcquire, WriteCleanup, WriteRelease,
};
use crate::engine::{Decision, Retry, Round, Timing, Vote};
use crate::error::NodeErrorKind;
use crate::resp::{self, Limits, Status};
use crate::rng::{Entropy as _, Jitter};

use history::{History, Increment, Kind, Report};
use node::Node;

const MS: u64 = 1_000_000;

/// The simulation's only source of randomness.
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
    /// Crashed nodes restart at once, empty: no persistence, no delayed restart.
    InstantRestart,
    /// Node clocks jump forward by more than the drift allowance.
    ClockJump,
    /// Clients pause past their validity and then write without checking it.
    UncheckedPause,
    /// Crashed nodes restart after the longest TTL, as in the model, but without persistence.
    /// Lock keys have expired by then anyway; fence counters, which never expire, are lost.
    ForgetfulRestart,
}

/// Which lock the simulated clients take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locks {
    /// The Redlock mutex.
    Mutex,
    /// Read-write locks: each cycle reads (shared) or writes (exclusive); each client is
    /// read-preferring or write-preferring, as `RwPolicy` sets the intent TTL.
    ReadWrite,
    /// The mutex with fencing tokens, written back to a quorum when the grant's nodes disagree.
    Fenced,
}

/// The settings of one run, drawn from its seed.
#[derive(Debug, Clone)]
struct Params {
    locks: Locks,
    nodes: usize,
    clients: usize,
    keys: usize,
    ttl_ms: u64,
    drift_factor: f64,
    node_timeout: Duration,
    retry_delay: Duration,
    retry_count: u32,
    wait_timeout: Duration,
    /// Typical one-way delay bounds, in ns.
    delay: (u64, u64),
    /// Chance that a message takes up to twice the TTL instead.
    long_delay: f64,
    request_loss: f64,
    reply_loss: f64,
    /// Chance that a holder pauses between reading and writing the counter.
    pause: f64,
    /// Mean gap between fault events, in ns.
    fault_gap: u64,
    horizon: u64,
    cycles: u32,
}

impl Params {
    fn draw(rng: &mut Rng, scenario: Scenario, locks: Locks) -> Params {
        let ttl_ms = rng.range(50, 150);
        let mut p = Params {
            locks,
            nodes: if rng.chance(0.7) { 3 } else { 5 },
            clients: rng.range(2, 4) as usize,
            keys: rng.range(1, 2) as usize,
            ttl_ms,
            drift_factor: 0.01,
            node_timeout: Duration::from_millis(rng.range(5, 20)),
            retry_delay: Duration::from_millis(rng.range(5, 30)),
            retry_count: rng.range(5, 20) as u32,
            wait_timeout: Duration::from_millis(rng.range(300, 1000)),
            delay: (rng.range(50_000, 500_000), rng.range(500_000, 4 * MS)),
            long_delay: if rng.chance(0.3) { 0.02 } else { 0.0 },
            request_loss: if rng.chance(0.5) { 0.03 } else { 0.0 },
            reply_loss: if rng.chance(0.5) { 0.03 } else { 0.0 },
            pause: 0.1,
            fault_gap: rng.range(ttl_ms / 2, 3 * ttl_ms) * MS,
            horizon: 1500 * MS,
            cycles: rng.range(3, 8) as u32,
        };
        match scenario {
            Scenario::Model => {}
            Scenario::InstantRestart | Scenario::ClockJump => {
                p.fault_gap = ttl_ms * MS / 4;
                p.request_loss = 0.05;
                p.pause = 0.0;
            }
            Scenario::ForgetfulRestart => p.fault_gap = ttl_ms * MS,
            Scenario::UncheckedPause => {
                p.clients = rng.range(3, 4) as usize;
                p.keys = 1;
                p.pause = 0.5;
            }
        }
        p
    }
}

/// Faults and work, counted over one or many runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    pub seeds: u64,
    pub events: u64,
    pub rounds: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub clock_jumps: u64,
    pub pauses: u64,
    pub lost_requests: u64,
    pub lost_replies: u64,
    pub long_delays: u64,
    /// Read grants whose window overlapped another reader's: readers really shared.
    pub shared_reads: u64,
    /// Rounds lost by write-preferring writers, each of which leaves (or refreshes) an intent.
    pub intents: u64,
    /// Fenced grants that needed the write-back round.
    pub write_backs: u64,
}

impl Stats {
    fn absorb(&mut self, o: &Stats) {
        self.seeds += o.seeds;
        self.events += o.events;
        self.rounds += o.rounds;
        self.crashes += o.crashes;
        self.partitions += o.partitions;
        self.clock_jumps += o.clock_jumps;
        self.pauses += o.pauses;
        self.lost_requests += o.lost_requests;
        self.lost_replies += o.lost_replies;
        self.long_delays += o.long_delays;
        self.shared_reads += o.shared_reads;
        self.intents += o.intents;
        self.write_backs += o.write_backs;
    }

    fn faults(&self) -> u64 {
        self.crashes
            + self.partitions
            + self.clock_jumps
            + self.pauses
            + self.lost_requests
            + self.lost_replies
            + self.long_delays
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} seeds, {} events, {} rounds; {} faults: {} crashes, {} partitions, {} clock jumps, {} client pauses, {} requests lost, {} replies lost after the command ran, {} long delays; {} shared reads, {} writer intents, {} fence write-backs",
            self.seeds,
            self.events,
            self.rounds,
            self.faults(),
            self.crashes,
            self.partitions,
            self.clock_jumps,
            self.pauses,
            self.lost_requests,
            self.lost_replies,
            self.long_delays,
            self.shared_reads,
            self.intents,
            self.write_backs
        )
    }
}

/// A simulated node and its clock.
struct SimNode {
    mem: Node,
    up: bool,
    /// Messages sent before this instant were on connections the crash reset.
    crashed_at: u64,
    /// Wall clock = `offset + t + t * ppm / 1e6`, in ns.
    offset: i64,
    ppm: i64,
    last_forward_jump: Option<u64>,
}

impl SimNode {
    fn clock_ms(&self, t: u64) -> i64 {
        let t = t as i64;
        (self.offset + t + t * self.ppm / 1_000_000).div_euclid(MS as i64)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    Acquire,
    Extend,
    Release,
    /// After a lost round, to every node; replies unread.
    Cleanup,
    /// A write-preferring writer withdraws its intent; replies unread.
    Withdraw,
    /// A fenced grant writes its token back to a quorum.
    FenceWrite,
}

/// What a client's current cycle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Mutex,
    Fenced,
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between lock cycles; the timer starts the next one.
    Idle,
    /// Waiting out the retry delay; the timer starts the next attempt.
    Backoff,
    /// A round of `Cmd` is in flight.
    InRound,
    /// Holding; the timer runs the next step.
    Read,
    Write,
    Done,
}

struct SimClient {
    side: Side,
    /// The write-preferring intent TTL of this client's writes; 0 when read-preferring.
    intent_ms: u64,
    /// The counters the fenced acquisition read, for this cycle's token.
    fence: FenceRead,
    key: usize,
    /// This attempt's token: a new one for every attempt, as the client draws them.
    token: Vec<u8>,
    /// The waiter's id (its first attempt's token), which names a writer's intent.
    waiter: Vec<u8>,
    timing: Timing,
    ttl_ms: u64,
    cmd: Cmd,
    round: Round,
    /// The round in flight (0: none). Replies carry it, so late ones are ignored.
    tag: u64,
    /// Nodes sent the script's body this round, after a `NOSCRIPT`.
    resent: Vec<bool>,
    phase: Phase,
    retry: Option<Retry>,
    valid_until: Instant,
    op: usize,
    read: u64,
    extended: bool,
    cycles_left: u32,
    timer: u64,
}

#[derive(Debug)]
enum Ev {
    Deliver {
        node: usize,
        client: usize,
        tag: u64,
        sent: u64,
        bytes: Vec<u8>,
    },
    Reply {
        client: usize,
        node: usize,
        tag: u64,
        bytes: Vec<u8>,
    },
    Timer {
        client: usize,
        id: u64,
    },
    Fault,
    Restart {
        node: usize,
    },
    Heal,
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
const MAX_EVENTS: u64 = 1_000_000;

struct World {
    scenario: Scenario,
    p: Params,
    rng: Rng,
    base: Instant,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Queued>>,
    nodes: Vec<SimNode>,
    clients: Vec<SimClient>,
    /// `blocked[client][node]`: a partition cuts that link.
    blocked: Vec<Vec<bool>>,
    /// Last arrival per link, so each link delivers in order like a TCP connection.
    request_link: Vec<Vec<u64>>,
    reply_link: Vec<Vec<u64>>,
    counters: Vec<u64>,
    history: History,
    stats: Stats,
    trace: bool,
}

/// What one seed produced.
pub(crate) struct Outcome {
    pub history: History,
    pub report: Report,
    pub stats: Stats,
}

/// Runs one seed of `scenario`.
pub(crate) fn run(seed: u64, scenario: Scenario, trace: bool) -> Outcome {
    run_locks(seed, scenario, Locks::Mutex, trace)
}

/// Runs one seed of `scenario` with clients that take `locks`.
pub(crate) fn run_locks(seed: u64, scenario: Scenario, locks: Locks, trace: bool) -> Outcome {
    let mut rng = Rng::new(seed);
    let p = Params::draw(&mut rng, scenario, locks);
    let base = Instant::now();
    let timing = Timing {
        ttl: Duration::from_millis(p.ttl_ms),
        drift_factor: p.drift_factor,
    };
    // Within the model, relative drift stays under the factor: 0.8 % against 1 %.
    let max_ppm = match scenario {
        Scenario::Model => 8_000,
        _ => 0,
    };
    let nodes = (0..p.nodes)
        .map(|_| SimNode {
            mem: Node::default(),
            up: true,
            crashed_at: 0,
            offset: rng.range(1 << 40, 1 << 41) as i64,
            ppm: rng.range(0, 2 * max_ppm) as i64 - max_ppm as i64,
            last_forward_jump: None,
        })
        .collect();
    // As `RwPolicy::WritePreferring` sets it: two retry delays and node timeouts.
    let write_preferring = 2 * (p.retry_delay + p.node_timeout).as_millis() as u64;
    let clients = (0..p.clients)
        .map(|_| SimClient {
            side: Side::Mutex,
            intent_ms: if locks == Locks::ReadWrite && rng.chance(0.5) {
                write_preferring
            } else {
                0
            },
            fence: FenceRead::new(),
            key: 0,
            token: Vec::new(),
            waiter: Vec::new(),
            timing,
            ttl_ms: p.ttl_ms,
            cmd: Cmd::Acquire,
            round: Round::new(p.nodes, base, p.node_timeout, None, None),
            tag: 0,
            resent: vec![false; p.nodes],
            phase: Phase::Idle,
            retry: None,
            valid_until: base,
            op: 0,
            read: 0,
            extended: false,
            cycles_left: p.cycles,
            timer: 0,
        })
        .collect();
    let mut w = World {
        scenario,
        blocked: vec![vec![false; p.nodes]; p.clients],
        request_link: vec![vec![0; p.nodes]; p.clients],
        reply_link: vec![vec![0; p.nodes]; p.clients],
        counters: vec![0; p.keys],
        p,
        rng,
        base,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        nodes,
        clients,
        history: History::default(),
        stats: Stats {
            seeds: 1,
            ..Stats::default()
        },
        trace,
    };
    if trace {
        eprintln!("seed {seed} {scenario:?}: {:?}", w.p);
    }
    for c in 0..w.p.clients {
        let start = w.rng.below(w.p.ttl_ms * MS);
        w.set_timer(c, start);
    }
    let first_fault = w.rng.below(2 * w.p.fault_gap);
    w.schedule(first_fault, Ev::Fault);
    while let Some(Reverse(q)) = w.queue.pop() {
        w.now = q.at;
        w.stats.events += 1;
        assert!(
            w.stats.events < MAX_EVENTS,
            "seed {seed}: the simulation did not settle"
        );
        w.handle(q.ev);
    }
    for (k, v) in w.counters.iter().enumerate() {
        w.history.counters.insert(key_name(k), (0, *v));
    }
    w.stats.shared_reads = shared_reads(&w.history);
    let report = w.history.check();
    if trace {
        for (i, op) in w.history.ops.iter().enumerate() {
            eprintln!("op {i}: {op:?} window {:?}", op.window());
        }
        eprintln!("{report}\n{}", w.stats);
    }
    Outcome {
        history: w.history,
        report,
        stats: w.stats,
    }
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

fn key_name(k: usize) -> Vec<u8> {
    format!("lock:{k}").into_bytes()
}

impl World {
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

    /// Replaces client `c`'s timer (there is at most one) by one `delay` from now.
    fn set_timer(&mut self, c: usize, delay: u64) {
        self.clients[c].timer += 1;
        let id = self.clients[c].timer;
        self.schedule(delay, Ev::Timer { client: c, id });
    }

    fn log(&self, what: fmt::Arguments<'_>) {
        if self.trace {
            eprintln!("{:>10.3} ms  {what}", self.now as f64 / MS as f64);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver {
                node,
                client,
                tag,
                sent,
                bytes,
            } => self.deliver(node, client, tag, sent, &bytes),
            Ev::Reply {
                client,
                node,
                tag,
                bytes,
            } => self.reply(client, node, tag, &bytes),
            Ev::Timer { client, id } if self.clients[client].timer == id => self.timer(client),
            Ev::Timer { .. } => {}
            Ev::Fault => self.fault(),
            Ev::Restart { node } => {
                self.log(format_args!("node {node} restarts"));
                self.nodes[node].up = true;
            }
            Ev::Heal => {
                self.log(format_args!("partition heals"));
                self.blocked.iter_mut().flatten().for_each(|b| *b = false);
            }
        }
    }

    // --- the network -----------------------------------------------------------------------

    fn delay(&mut self) -> u64 {
        if self.rng.chance(self.p.long_delay) {
            self.stats.long_delays += 1;
            return self
                .rng
                .range(self.p.ttl_ms * MS / 2, 2 * self.p.ttl_ms * MS);
        }
        self.rng.range(self.p.delay.0, self.p.delay.1)
    }

    fn send(&mut self, client: usize, node: usize, tag: u64, bytes: Vec<u8>) {
        if self.blocked[client][node] {
            return;
        }
        if self.rng.chance(self.p.request_loss) {
            self.stats.lost_requests += 1;
            return;
        }
        let at = (self.now + self.delay()).max(self.request_link[client][node]);
        self.request_link[client][node] = at;
        let sent = self.now;
        self.schedule(
            at - self.now,
            Ev::Deliver {
                node,
                client,
                tag,
                sent,
                bytes,
            },
        );
    }

    fn deliver(&mut self, node: usize, client: usize, tag: u64, sent: u64, bytes: &[u8]) {
        let n = &mut self.nodes[node];
        if !n.up || sent < n.crashed_at || self.blocked[client][node] {
            return;
        }
        let now_ms = n.clock_ms(self.now);
        let reply = n.mem.execute(now_ms, bytes);
        if tag == 0 {
            return; // A cleanup: nobody reads its reply.
        }
        if self.rng.chance(self.p.reply_loss) {
            self.stats.lost_replies += 1;
            return;
        }
        let at = (self.now + self.delay()).max(self.reply_link[client][node]);
        self.reply_link[client][node] = at;
        self.schedule(
            at - self.now,
            Ev::Reply {
                client,
                node,
                tag,
                bytes: reply,
            },
        );
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
        let max_ttl = self.p.ttl_ms * MS;
        let node = self.rng.below(self.p.nodes as u64) as usize;
        let kind = match self.scenario {
            Scenario::Model => self.rng.below(3),
            Scenario::InstantRestart | Scenario::ForgetfulRestart => 0,
            Scenario::ClockJump => 2,
            Scenario::UncheckedPause => return,
        };
        match kind {
            0 => {
                if !self.nodes[node].up {
                    return;
                }
                self.stats.crashes += 1;
                // Within the model, fencing runs on nodes that persist every acknowledged write
                // (AOF, `appendfsync always`): a restart keeps the data, not the script cache.
                let persistent = self.p.locks == Locks::Fenced && self.scenario == Scenario::Model;
                let n = &mut self.nodes[node];
                if persistent {
                    n.mem.forget_scripts();
                } else {
                    n.mem = Node::default();
                }
                n.crashed_at = self.now;
                if self.scenario == Scenario::InstantRestart {
                    self.log(format_args!("node {node} crashes and restarts at once"));
                } else {
                    n.up = false;
                    let down = self.rng.range(max_ttl, 3 * max_ttl);
                    self.log(format_args!("node {node} crashes for {down} ns"));
                    self.schedule(down, Ev::Restart { node });
                }
            }
            1 => {
                self.stats.partitions += 1;
                for c in 0..self.p.clients {
                    let cut_client = self.rng.chance(0.5);
                    for n in 0..self.p.nodes {
                        self.blocked[c][n] = cut_client && self.rng.chance(0.5);
                    }
                }
                let heal = self.rng.range(max_ttl / 4, 2 * max_ttl);
                self.log(format_args!("partition {:?}", self.blocked));
                self.schedule(heal, Ev::Heal);
            }
            _ => {
                let by: i64 = if self.scenario == Scenario::ClockJump {
                    self.rng.range(max_ttl / 2, 2 * max_ttl) as i64
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
            }
        }
    }

    // --- clients ---------------------------------------------------------------------------

    fn timer(&mut self, c: usize) {
        match self.clients[c].phase {
            Phase::Idle => self.start_acquire(c),
            Phase::Backoff => {
                // Simulated waiters are never told of releases: every retry is a backstop's.
                if let Some(r) = self.clients[c].retry.as_mut() {
                    r.count_retry();
                }
                // A new token for every retry, and new counters read with it.
                self.clients[c].token = self.new_token();
                self.clients[c].fence = FenceRead::new();
                self.begin_attempt(c)
            }
            Phase::InRound => {
                let now = self.instant(self.now);
                self.clients[c].round.handle_timeout(now);
                self.after_input(c);
            }
            Phase::Read => self.read_step(c),
            Phase::Write => self.write_step(c),
            Phase::Done => {}
        }
    }

    /// Runs `f` with the op client `c` is sending now.
    fn with_op<R>(cl: &SimClient, f: impl FnOnce(&dyn Op) -> R) -> R {
        let key = key_name(cl.key);
        let (token, ttl_ms) = (&cl.token[..], cl.ttl_ms);
        let ids = AttemptIds {
            waiter: &cl.waiter,
            token,
        };
        match (cl.side, cl.cmd) {
            (Side::Mutex, Cmd::Acquire) => f(&Acquire {
                key: &key,
                token,
                ttl_ms,
            }),
            (Side::Fenced, Cmd::Acquire) => f(&FencedAcquire {
                key: &key,
                fence: &fence_key(&key),
                token,
                ttl_ms,
                read: &cl.fence,
            }),
            (Side::Fenced, Cmd::FenceWrite) => f(&FenceWrite {
                key: &key,
                fence: &fence_key(&key),
                token,
                value: cl.fence.token().unwrap_or(0),
            }),
            (Side::Mutex | Side::Fenced, Cmd::Extend) => f(&Extend {
                key: &key,
                token,
                ttl_ms,
            }),
            (Side::Mutex | Side::Fenced, _) => f(&Release { key: &key, token }),
            (Side::Read, cmd) => {
                let keys = RwKeys::new(&key);
                match cmd {
                    Cmd::Acquire => f(&ReadAcquire {
                        keys: &keys,
                        token,
                        ttl_ms,
                    }),
                    Cmd::Extend => f(&ReadExtend {
                        keys: &keys,
                        token,
                        ttl_ms,
                    }),
                    _ => f(&SetRelease {
                        resource: &key,
                        set: keys.readers(),
                        token,
                    }),
                }
            }
            (Side::Write, cmd) => {
                let keys = RwKeys::new(&key);
                let intent_ms = cl.intent_ms;
                match cmd {
                    Cmd::Acquire => f(&WriteAcquire {
                        keys: &keys,
                        ids,
                        ttl_ms,
                        intent_ms,
                    }),
                    Cmd::Extend => f(&Extend {
                        key: keys.writer(),
                        token,
                        ttl_ms,
                    }),
                    Cmd::Cleanup => f(&WriteCleanup {
                        resource: &key,
                        keys: &keys,
                        ids,
                        intent_ms,
                    }),
                    Cmd::Withdraw => f(&SetRelease {
                        resource: &key,
                        set: keys.intents(),
                        token: &cl.waiter,
                    }),
                    _ => f(&WriteRelease {
                        resource: &key,
                        keys: &keys,
                        token,
                    }),
                }
            }
        }
    }

    /// Sends `cmd` to every node, replies unread (a cleanup, an intent withdrawal).
    fn broadcast(&mut self, c: usize, cmd: Cmd) {
        self.clients[c].cmd = cmd;
        let bytes = self.encode(c, ScriptForm::Body);
        for n in 0..self.p.nodes {
            self.send(c, n, 0, bytes.clone());
        }
    }

    fn encode(&self, c: usize, form: ScriptForm) -> Vec<u8> {
        let mut out = Vec::new();
        Self::with_op(&self.clients[c], |op| op.encode(&mut out, form));
        out
    }

    /// Starts a round of `cmd` on every node.
    fn start_round(&mut self, c: usize, cmd: Cmd, timing: Option<Timing>, hold: Option<Instant>) {
        self.stats.rounds += 1;
        let now = self.instant(self.now);
        let timeout = self.p.node_timeout;
        let cl = &mut self.clients[c];
        cl.cmd = cmd;
        cl.tag += 1;
        cl.phase = Phase::InRound;
        cl.resent.iter_mut().for_each(|r| *r = false);
        cl.round.reset(now, timeout, timing, hold);
        let tag = cl.tag;
        let bytes = self.encode(c, ScriptForm::Sha);
        for n in 0..self.p.nodes {
            self.send(c, n, tag, bytes.clone());
        }
        self.after_input(c);
    }

    fn reply(&mut self, c: usize, node: usize, tag: u64, bytes: &[u8]) {
        if self.clients[c].tag != tag || self.clients[c].phase != Phase::InRound {
            return;
        }
        let reply = match resp::decode(bytes, &Limits::default()) {
            Ok(Status::Complete((r, n))) if n == bytes.len() => r,
            other => panic!("the simulated node sent an undecodable reply: {other:?}"),
        };
        let verdict = Self::with_op(&self.clients[c], |op| op.classify(&reply));
        let now = self.instant(self.now);
        match verdict {
            Verdict::Vote(v) => self.clients[c].round.handle_vote(node, v, now),
            Verdict::NoScript if !self.clients[c].resent[node] => {
                self.clients[c].resent[node] = true;
                let body = self.encode(c, ScriptForm::Body);
                self.send(c, node, tag, body);
            }
            Verdict::NoScript => self.clients[c].round.handle_vote(
                node,
                Vote::Failed(NodeErrorKind::UnexpectedReply),
                now,
            ),
        }
        self.after_input(c);
    }

    fn after_input(&mut self, c: usize) {
        let cl = &self.clients[c];
        match cl.round.decision() {
            None => {
                let at = cl
                    .round
                    .poll_timeout()
                    .expect("undecided rounds have a deadline");
                let delay = self.nanos(at).saturating_sub(self.now);
                self.set_timer(c, delay);
            }
            Some(d) => {
                // Further replies to this round are ignored, as the driver drops them.
                self.clients[c].phase = Phase::Idle;
                match self.clients[c].cmd {
                    Cmd::Acquire => self.acquired(c, d),
                    Cmd::Extend => self.extended(c, d),
                    Cmd::FenceWrite => self.written_back(c, d),
                    Cmd::Release | Cmd::Cleanup | Cmd::Withdraw => self.finish_cycle(c),
                }
            }
        }
    }

    fn start_acquire(&mut self, c: usize) {
        if self.clients[c].cycles_left == 0 || self.now > self.p.horizon {
            self.clients[c].phase = Phase::Done;
            return;
        }
        let token: Vec<u8> = self.new_token();
        let key = self.rng.below(self.p.keys as u64) as usize;
        let (side, kind) = match self.p.locks {
            Locks::Mutex => (Side::Mutex, Kind::Mutex),
            Locks::Fenced => (Side::Fenced, Kind::Mutex),
            Locks::ReadWrite if self.rng.chance(0.6) => (Side::Read, Kind::Read),
            Locks::ReadWrite => (Side::Write, Kind::Write),
        };
        let op = self.history.push(history::Op {
            client: c as u64,
            kind,
            key: key_name(key),
            invoke: Duration::from_nanos(self.now),
            ok: None,
            fence: None,
            valid_until: None,
            release: None,
        });
        let now = self.instant(self.now);
        let cl = &mut self.clients[c];
        cl.waiter = token.clone();
        cl.token = token;
        cl.side = side;
        cl.fence = FenceRead::new();
        cl.key = key;
        cl.op = op;
        cl.extended = false;
        cl.retry = Some(Retry::new(
            now,
            self.p.wait_timeout,
            self.p.retry_count,
            true,
        ));
        self.log(format_args!("client {c} acquires lock:{key} (op {op})"));
        self.begin_attempt(c);
    }

    /// A random token, as the client draws them.
    fn new_token(&mut self) -> Vec<u8> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        (0..40).map(|_| HEX[self.rng.below(16) as usize]).collect()
    }

    fn begin_attempt(&mut self, c: usize) {
        let timing = self.clients[c].timing;
        self.start_round(c, Cmd::Acquire, Some(timing), None);
    }

    fn acquired(&mut self, c: usize, d: Decision) {
        let writer_intent = self.clients[c].side == Side::Write && self.clients[c].intent_ms > 0;
        if let Decision::Won {
            valid_until: Some(until),
            ..
        } = d
        {
            if writer_intent {
                // Nodes that refused may still hold this writer's intent.
                self.broadcast(c, Cmd::Withdraw);
            }
            self.clients[c].valid_until = until;
            let cl = &self.clients[c];
            if cl.side == Side::Fenced && cl.fence.holders() < crate::engine::quorum(self.p.nodes) {
                // The token is not on a quorum yet: write it back before the validity ends.
                self.stats.write_backs += 1;
                let timing = cl.timing;
                return self.start_round(c, Cmd::FenceWrite, Some(timing), Some(until));
            }
            return self.granted(c);
        }
        self.log(format_args!("client {c} lost a round: {d:?}"));
        if writer_intent {
            self.stats.intents += 1;
        }
        // Seed 004 step 5: unlock every node, even those that said no or did not answer.
        self.broadcast(c, Cmd::Cleanup);
        let delay = self.rng.0.around(self.p.retry_delay);
        let now = self.instant(self.now);
        let next = self.clients[c]
            .retry
            .as_mut()
            .and_then(|r| r.next_attempt(now, delay));
        match next {
            Some(at) => {
                self.clients[c].phase = Phase::Backoff;
                let delay = self.nanos(at) - self.now;
                self.set_timer(c, delay);
            }
            None => {
                if writer_intent {
                    self.broadcast(c, Cmd::Withdraw);
                }
                self.finish_cycle(c)
            }
        }
    }

    /// The lock is the caller's (with its fencing token, if fenced) until `valid_until`.
    fn granted(&mut self, c: usize) {
        let cl = &self.clients[c];
        let (op, until) = (cl.op, cl.valid_until);
        if cl.side == Side::Fenced {
            self.history.ops[op].fence = cl.fence.token();
        }
        self.history.ops[op].ok = Some(Duration::from_nanos(self.now));
        self.history.ops[op].valid_until = Some(until - self.base);
        self.log(format_args!("client {c} holds op {op} until {until:?}"));
        self.hold(c);
    }

    /// The fenced grant's write-back round is over.
    fn written_back(&mut self, c: usize, d: Decision) {
        if matches!(d, Decision::Won { .. }) {
            return self.granted(c);
        }
        self.log(format_args!(
            "client {c} could not write its token back: {d:?}"
        ));
        self.start_release(c);
    }

    /// The holder's work: read the counter after a while, then write it.
    fn hold(&mut self, c: usize) {
        let left = self.validity_left(c);
        self.clients[c].phase = Phase::Read;
        let work = self.rng.below(left / 2 + 1);
        self.set_timer(c, work);
    }

    fn validity_left(&self, c: usize) -> u64 {
        self.nanos(self.clients[c].valid_until)
            .saturating_sub(self.now)
    }

    fn read_step(&mut self, c: usize) {
        let left = self.validity_left(c);
        if left == 0 {
            return self.start_release(c);
        }
        self.clients[c].read = self.counters[self.clients[c].key];
        let mut work = self.rng.below(left / 2 + 1);
        if self.rng.chance(self.p.pause) {
            self.stats.pauses += 1;
            let ttl = self.p.ttl_ms * MS;
            work += if self.scenario == Scenario::UncheckedPause {
                self.rng.range(left, left + ttl)
            } else {
                self.rng.range(0, 2 * ttl)
            };
            self.log(format_args!("client {c} pauses for {work} ns"));
        }
        self.clients[c].phase = Phase::Write;
        self.set_timer(c, work);
    }

    fn write_step(&mut self, c: usize) {
        let checked = self.scenario != Scenario::UncheckedPause;
        if checked && self.validity_left(c) == 0 {
            self.log(format_args!("client {c} finds its validity gone"));
            return self.start_release(c);
        }
        let cl = &self.clients[c];
        if cl.side == Side::Read {
            // Readers share the key: they only read.
            return self.start_release(c);
        }
        self.counters[cl.key] = cl.read + 1;
        self.history.increments.push(Increment {
            client: c as u64,
            key: key_name(cl.key),
            read: cl.read,
            at: Duration::from_nanos(self.now),
            op: cl.op,
        });
        let (timing, hold, extended) = (cl.timing, cl.valid_until, cl.extended);
        if !extended && self.validity_left(c) > 0 && self.rng.chance(0.3) {
            self.clients[c].extended = true;
            self.start_round(c, Cmd::Extend, Some(timing), Some(hold));
        } else {
            self.start_release(c);
        }
    }

    fn extended(&mut self, c: usize, d: Decision) {
        if let Decision::Won {
            valid_until: Some(until),
            ..
        } = d
        {
            self.clients[c].valid_until = until;
            let op = self.clients[c].op;
            self.history.ops[op].valid_until = Some(until - self.base);
            self.log(format_args!("client {c} extends op {op} to {until:?}"));
            return self.hold(c);
        }
        self.start_release(c);
    }

    fn start_release(&mut self, c: usize) {
        let op = self.clients[c].op;
        self.history.ops[op].release = Some(Duration::from_nanos(self.now));
        self.start_round(c, Cmd::Release, None, None);
    }

    fn finish_cycle(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.cycles_left = cl.cycles_left.saturating_sub(1);
        cl.phase = Phase::Idle;
        let think = self.rng.below(self.p.ttl_ms * MS / 2);
        self.set_timer(c, think);
    }
}

/// Seeds to run: `REDLOCK_SIM_SEEDS`, or `default`.
fn seed_count(default: u64) -> u64 {
    std::env::var("REDLOCK_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `seeds` of `scenario` on every core; returns the merged report, the stats and the
/// seeds that found violations.
pub(crate) fn run_many(
    seeds: std::ops::Range<u64>,
    scenario: Scenario,
) -> (Report, Stats, Vec<u64>) {
    run_many_locks(seeds, scenario, Locks::Mutex)
}

/// [`run_many`] with clients that take `locks`.
pub(crate) fn run_many_locks(
    seeds: std::ops::Range<u64>,
    scenario: Scenario,
    locks: Locks,
) -> (Report, Stats, Vec<u64>) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let results: Vec<(Report, Stats, Vec<u64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                s.spawn(move || {
                    let mut report = Report::default();
                    let mut stats = Stats::default();
                    let mut failing = Vec::new();
                    for seed in seeds.filter(|s| s % threads == t) {
                        let out = run_locks(seed, scenario, locks, false);
                        if out.report.violations() > 0 {
                            failing.push(seed);
                        }
                        report.absorb(&out.report);
                        stats.absorb(&out.stats);
                    }
                    (report, stats, failing)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    let mut report = Report::default();
    let mut stats = Stats::default();
    let mut failing = Vec::new();
    for (r, s, f) in results {
        report.absorb(&r);
        stats.absorb(&s);
        failing.extend(f);
    }
    failing.sort_unstable();
    (report, stats, failing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds CI runs within the model; `REDLOCK_SIM_SEEDS` overrides.
    const CI_SEEDS: u64 = 2000;
    /// Seeds CI runs within the model for each other kind of lock.
    const LOCK_SEEDS: u64 = 600;
    /// Seeds each broken scenario runs.
    const BROKEN_SEEDS: u64 = 200;

    fn replay_hint(seed: u64, scenario: Scenario) -> String {
        let test = match scenario {
            Scenario::Model => "within_the_model_no_seed_finds_a_violation",
            _ => "broken_assumptions_produce_violations",
        };
        format!(
            "seed {seed} ({scenario:?}); replay: REDLOCK_SIM_SEED={seed} cargo test --lib engine::sim::tests::{test} -- --nocapture"
        )
    }

    /// `REDLOCK_SIM_SEED=n` replays just that seed, with a trace, in every scenario test.
    fn replay_seed() -> Option<u64> {
        std::env::var("REDLOCK_SIM_SEED").ok()?.parse().ok()
    }

    #[test]
    fn within_the_model_no_seed_finds_a_violation() {
        if let Some(seed) = replay_seed() {
            let out = run(seed, Scenario::Model, true);
            assert_eq!(out.report.violations(), 0, "{}", out.report);
            return;
        }
        let (report, stats, failing) = run_many(0..seed_count(CI_SEEDS), Scenario::Model);
        println!("simulation within the model: {stats}\nchecker: {report}");
        for &seed in &failing {
            println!("{}", replay_hint(seed, Scenario::Model));
        }
        assert!(failing.is_empty(), "violations in {} seeds", failing.len());
        assert_eq!(report.violations(), 0, "{report}");
        // The runs did real work under every kind of fault.
        assert!(report.windows > stats.seeds as usize, "{report}");
        assert!(report.increments > stats.seeds as usize, "{report}");
        for (what, n) in [
            ("crashes", stats.crashes),
            ("partitions", stats.partitions),
            ("clock jumps", stats.clock_jumps),
            ("pauses", stats.pauses),
            ("lost requests", stats.lost_requests),
            ("lost replies", stats.lost_replies),
            ("long delays", stats.long_delays),
        ] {
            assert!(n > 0, "no {what} were injected: {stats}");
        }
    }

    #[test]
    fn broken_assumptions_produce_violations() {
        let scenarios = [
            Scenario::InstantRestart,
            Scenario::ClockJump,
            Scenario::UncheckedPause,
        ];
        if let Some(seed) = replay_seed() {
            for s in scenarios {
                run(seed, s, true);
            }
            return;
        }
        for scenario in scenarios {
            let (report, stats, failing) = run_many(0..BROKEN_SEEDS, scenario);
            println!("{scenario:?}: {stats}\nchecker: {report}");
            if let Some(&seed) = failing.first() {
                println!("e.g. {}", replay_hint(seed, scenario));
            }
            assert!(
                report.violations() > 0,
                "{scenario:?} breaks an assumption, yet the checker found nothing: {report}"
            );
            if scenario == Scenario::UncheckedPause {
                assert!(
                    report.lost_updates > 0 && report.writes_outside > 0,
                    "{report}"
                );
            } else {
                assert!(!report.overlaps.is_empty(), "{report}");
            }
        }
    }

    /// Read-write and fenced clients under every fault within the model: readers may share,
    /// writers exclude everyone, and fencing tokens strictly increase in grant order.
    #[test]
    fn read_write_and_fenced_clients_within_the_model() {
        for locks in [Locks::ReadWrite, Locks::Fenced] {
            if let Some(seed) = replay_seed() {
                let out = run_locks(seed, Scenario::Model, locks, true);
                assert_eq!(out.report.violations(), 0, "{}", out.report);
                continue;
            }
            let (report, stats, failing) =
                run_many_locks(0..seed_count(LOCK_SEEDS), Scenario::Model, locks);
            println!("{locks:?} within the model: {stats}\nchecker: {report}");
            for &seed in &failing {
                println!(
                    "{locks:?} seed {seed}; replay: REDLOCK_SIM_SEED={seed} cargo test --lib engine::sim::tests::read_write_and_fenced -- --nocapture"
                );
            }
            assert!(failing.is_empty(), "violations in {} seeds", failing.len());
            assert_eq!(report.violations(), 0, "{report}");
            assert!(report.windows > stats.seeds as usize, "{report}");
            assert!(stats.crashes > 0 && stats.partitions > 0 && stats.lost_replies > 0);
            // What the runs held: both sides and shared reads, or tokens on every grant.
            let ops: Vec<history::Op> = (0..20)
                .flat_map(|seed| run_locks(seed, Scenario::Model, locks, false).history.ops)
                .filter(|op| op.window().is_some())
                .collect();
            match locks {
                Locks::ReadWrite => {
                    for kind in [Kind::Read, Kind::Write] {
                        assert!(ops.iter().any(|op| op.kind == kind), "no {kind:?} grants");
                    }
                    assert!(stats.shared_reads > 0 && stats.intents > 0, "{stats}");
                }
                _ => {
                    assert!(
                        ops.iter().all(|op| op.fence.is_some()),
                        "a grant without a token"
                    );
                    assert!(stats.write_backs > 0, "{stats}");
                }
            }
        }
    }

    /// Nodes that restart without their state forget the fence counters: tokens go backwards,
    /// even when the restart waits out the TTL and the lock itself holds. Restarting at once
    /// breaks read-write locks too. The checker must see both.
    #[test]
    fn restarts_without_persistence_break_fencing() {
        let runs = [
            (Scenario::InstantRestart, Locks::Fenced),
            (Scenario::ForgetfulRestart, Locks::Fenced),
            (Scenario::InstantRestart, Locks::ReadWrite),
        ];
        if let Some(seed) = replay_seed() {
            for (scenario, locks) in runs {
                run_locks(seed, scenario, locks, true);
            }
            return;
        }
        for (scenario, locks) in runs {
            let (report, stats, failing) = run_many_locks(0..BROKEN_SEEDS, scenario, locks);
            println!("{locks:?}, {scenario:?}: {stats}\nchecker: {report}");
            if let Some(&seed) = failing.first() {
                println!(
                    "e.g. seed {seed}; replay: REDLOCK_SIM_SEED={seed} cargo test --lib engine::sim::tests::restarts_without -- --nocapture"
                );
            }
            match (scenario, locks) {
                (Scenario::InstantRestart, Locks::ReadWrite) => {
                    assert!(!report.overlaps.is_empty(), "{report}")
                }
                (Scenario::InstantRestart, _) => {
                    assert!(report.fencing_violations > 0, "{report}")
                }
                _ => {
                    // The lock keys expired before the node came back: the lock held, the
                    // counters did not.
                    assert!(report.fencing_violations > 0, "{report}");
                    assert!(report.overlaps.is_empty(), "{report}");
                }
            }
        }
    }

    #[test]
    fn a_seed_replays_exactly() {
        for seed in [1, 77, 4242] {
            let a = run(seed, Scenario::Model, false);
            let b = run(seed, Scenario::Model, false);
            assert_eq!(format!("{:?}", a.history), format!("{:?}", b.history));
            assert_eq!(a.stats, b.stats);
            assert!(!a.history.ops.is_empty());
        }
        let a = run(1, Scenario::Model, false);
        let b = run(2, Scenario::Model, false);
        assert_ne!(format!("{:?}", a.history), format!("{:?}", b.history));
    }
}
