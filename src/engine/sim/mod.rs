//! Deterministic simulation of Redlock: the engine's own state machines on virtual time.
//!
//! The world here is a driver. Its simulated clients run the very machines the real driver
//! runs: an [`Acquisition`] for every lock taken, a [`HoldRound`] (from [`Hold::round`]) for
//! every extend and release, and a keep-alive [`Schedule`] for kept locks. The world polls
//! their transmits, encodes them, carries the bytes over a simulated network to N simulated
//! nodes ([`node::Node`]: keys with expiry, sorted sets, the scripts' semantics in Rust,
//! checked against a real `redis-server` by `diff.rs`), and feeds the replies, connection
//! failures, deadlines, published release announcements and subscription confirmations back.
//! Nothing of the client's procedure is written here: what to send, when to retry, what a
//! reply means, how long a lock is valid, all come from the engine.
//!
//! The network delays, loses and partitions messages, delivers in order per connection,
//! resets connections (bytes already written still reach the node; their replies are lost,
//! and the machine is told of every reply it was owed), refuses the setup of connections to
//! misconfigured nodes (nothing is ever written there), and carries pub/sub: subscriptions,
//! their confirmations, and the release announcements, delayed or lost, on subscriber
//! connections that are reset and reconnect. Each node has its own clock that drifts and may
//! jump; nodes crash, losing everything, and restart. Holders pause; keepers run late.
//!
//! Every client records its grants in a [`History`], and increments a per-key counter while
//! it believes it holds the lock; the shared checker (`redlock_mux_kit::history`) looks for
//! overlapping windows, lost updates and fencing tokens out of order. Lock kinds: the mutex,
//! read and write locks (writers downgrading to readers now and then), all-or-none sets (mixed
//! with single keys), fenced mutexes and fenced write locks; clients wait or try once, in fair queues or not, read- or write-preferring;
//! holders extend with any TTL (shorter ones too) and go on working after a failed extend
//! while the guard's validity lasts, or keep their lock alive with a keeper.
//!
//! Within the model's assumptions (node clocks drift less than the drift factor allows and
//! jump forward at most 1 ms; a crashed node stays down longer than the longest TTL; fencing
//! runs on nodes that persist their writes; a client checks its validity before it writes)
//! there must be no violation. Each assumption, broken on purpose, must produce violations,
//! which shows the checker can see them. Calm runs (no faults) also check liveness: every
//! waiting acquisition gets its lock, no kept lock is lost, and no lock is granted much
//! later than what was in its way was released (a waiter that missed the announcement sleeps
//! out its backstop).
//!
//! `REDLOCK_SIM_SEEDS=100000 cargo test --release --lib engine::sim` runs more seeds;
//! `REDLOCK_SIM_SEED=n` replays one seed with a trace.

mod node;

pub(crate) use redlock_mux_kit::history;

use redlock_mux_kit::local_servers;

mod diff;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use rand_core::{Rng as _, SeedableRng};

use crate::config::{Config, RwPolicy};
use crate::engine::acquire::{Acquisition, Grant, Params};
use crate::engine::hold::{Hold, HoldRound, Step};
use crate::engine::keepalive::Schedule;
use crate::engine::keys::{fence_key, RwKeys, SemKeys};
use crate::engine::kind::{Keys, Spec};
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::Caps;
use crate::engine::{Round, Timing};
use crate::error::{Error, NodeErrorKind};
use crate::resp::{self, Limits, ServerErrorKind, Status, Value};
use crate::rng::{Jitter, Token};
use crate::url::NodeAddr;

use history::{History, Increment, Kind, Report};
use node::Node;

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
    /// lock and no kept lock may be lost (liveness).
    Calm,
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
    /// Counting semaphores of 2 or 3 permits, with the smallest safe quorum.
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
    /// Chance that a release announcement to one subscriber is lost.
    wake_loss: f64,
    /// Chance that a holder pauses between reading and writing the counter.
    pause: f64,
    /// Chance that a keeper runs late (by up to a TTL).
    slow_keeper: f64,
    /// Chance that a cycle takes its lock with `try_*` (one attempt).
    try_once: f64,
    /// Chance that a cycle keeps its lock alive.
    keep: f64,
    /// Chance that a client waits in fair queues.
    fair: f64,
    /// Nodes whose connection setup is refused (a wrong password, say).
    refused: usize,
    /// A semaphore's permits, and the quorum its clients use.
    permits: u32,
    quorum: usize,
    /// Which nodes run Redis 8 (hash-field expiry), drawn apart from the rest (see
    /// [`Settings::versions`]).
    native: Vec<bool>,
    /// Chance that a restart of a Redis 7 node upgrades it to Redis 8 on its persisted data.
    upgrade: f64,
    /// Mean gap between fault events, in ns; 0 for none.
    fault_gap: u64,
    horizon: u64,
    cycles: u32,
}

impl Settings {
    fn draw(rng: &mut Rng, scenario: Scenario, locks: Locks) -> Settings {
        let ttl_ms = rng.range(50, 150);
        let nodes = if rng.chance(0.7) { 3 } else { 5 };
        let mut p = Settings {
            locks,
            nodes,
            clients: rng.range(2, 4) as usize,
            keys: if locks == Locks::All {
                rng.range(2, 3) as usize
            } else {
                rng.range(1, 2) as usize
            },
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
            wake_loss: if rng.chance(0.5) { 0.2 } else { 0.0 },
            pause: 0.1,
            slow_keeper: 0.3,
            try_once: 0.15,
            keep: 0.25,
            fair: if rng.chance(0.5) { 0.5 } else { 0.0 },
            refused: 0,
            permits: 1,
            quorum: nodes / 2 + 1,
            native: vec![false; nodes],
            upgrade: 0.0,
            fault_gap: rng.range(ttl_ms / 2, 3 * ttl_ms) * MS,
            horizon: 1500 * MS,
            cycles: rng.range(3, 8) as u32,
        };
        if locks.semaphore() {
            // Enough clients on one key to fill every permit and want more.
            p.permits = rng.range(2, 3) as u32;
            p.quorum = if locks == Locks::NaiveSemaphore {
                nodes / 2 + 1
            } else {
                crate::engine::sem::safe_quorum(p.permits, nodes)
            };
            p.keys = 1;
            p.clients = rng.range(u64::from(p.permits) + 1, u64::from(p.permits) + 3) as usize;
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
            Scenario::Calm => {
                p.clients = rng.range(3, 7) as usize;
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
            }
            Scenario::InstantRestart | Scenario::ClockJump => {
                p.fault_gap = ttl_ms * MS / 4;
                p.request_loss = 0.05;
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
                p.keys = if locks == Locks::All { 2 } else { 1 };
                p.pause = 0.5;
                p.refused = 0;
            }
        }
        p
    }
}

impl Settings {
    /// Draws the nodes' server versions from their own generator, so that the rest of a seed's
    /// run is what it was before versions were drawn: a third of the seeds run Redis 7 only, a
    /// third Redis 8 only, a third a mix, in which restarts may upgrade a node.
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
}

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
    /// Acquisition attempts (transmits of an attempt to every node).
    pub attempts: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub clock_jumps: u64,
    pub pauses: u64,
    pub lost_requests: u64,
    pub lost_replies: u64,
    pub long_delays: u64,
    /// Command connections reset with commands in flight.
    pub resets: u64,
    /// Commands written to a connection that was then reset, executed by the node anyway.
    pub late_commands: u64,
    /// Subscriber connections reset (their subscriptions gone until the next subscribe).
    pub subscriber_resets: u64,
    /// Release announcements delivered to a subscriber, and lost on the way.
    pub wakes: u64,
    pub lost_wakes: u64,
    /// Runs with nodes whose connection setup was refused, and the refusals.
    pub refused_runs: u64,
    pub setup_refusals: u64,
    /// Acquisitions that ended with a configuration error.
    pub config_errors: u64,
    /// Grants by what they held.
    pub grants: u64,
    pub fair_grants: u64,
    pub set_grants: u64,
    pub fenced_grants: u64,
    /// Read grants whose window overlapped another reader's: readers really shared.
    pub shared_reads: u64,
    /// Cleanups of lost attempts by write-preferring writers (each leaves an intent).
    pub intents: u64,
    /// Fenced grants that needed the write-back round.
    pub write_backs: u64,
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
    /// Runs whose quorum mixed Redis 7 and Redis 8 nodes, upgrades of a node to Redis 8 on
    /// its data, and commands sent without Lua to Redis 8 nodes (`HSETEX`, `MULTI` blocks).
    pub mixed_runs: u64,
    pub upgrades: u64,
    pub native_commands: u64,
}

impl Stats {
    fn absorb(&mut self, o: &Stats) {
        macro_rules! add {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        add!(
            seeds,
            events,
            attempts,
            crashes,
            partitions,
            clock_jumps,
            pauses,
            lost_requests,
            lost_replies,
            long_delays,
            resets,
            late_commands,
            subscriber_resets,
            wakes,
            lost_wakes,
            refused_runs,
            setup_refusals,
            config_errors,
            grants,
            fair_grants,
            set_grants,
            fenced_grants,
            shared_reads,
            intents,
            write_backs,
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
            native_commands
        );
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
            + self.subscriber_resets
            + self.lost_wakes
            + self.setup_refusals
            + self.slow_keepers
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} seeds, {} events, {} attempts, {} grants ({} fair, {} sets, {} fenced); \
             {} faults: {} crashes, {} partitions, {} clock jumps, {} client pauses, \
             {} requests lost, {} replies lost after the command ran, {} long delays, \
             {} connection resets ({} commands ran after their connection was reset), \
             {} subscriber resets, {} wakes lost ({} delivered), {} setup refusals in {} runs \
             ({} configuration errors), {} slow keepers; {} shared reads, {} writer intents, \
             {} fence write-backs; {} extends ({} shorter, {} lost, {} writes after a lost one); \
             {} kept locks ({} keeper rounds, {} lost); {} downgrades ({} lost); {} runs mixing \
             Redis 7 and 8 nodes, {} upgrades, {} commands without Lua",
            self.seeds,
            self.events,
            self.attempts,
            self.grants,
            self.fair_grants,
            self.set_grants,
            self.fenced_grants,
            self.faults(),
            self.crashes,
            self.partitions,
            self.clock_jumps,
            self.pauses,
            self.lost_requests,
            self.lost_replies,
            self.long_delays,
            self.resets,
            self.late_commands,
            self.subscriber_resets,
            self.lost_wakes,
            self.wakes,
            self.setup_refusals,
            self.refused_runs,
            self.config_errors,
            self.slow_keepers,
            self.shared_reads,
            self.intents,
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
            self.native_commands
        )
    }
}

/// A simulated node and its clock.
struct SimNode {
    mem: Node,
    /// Redis 8: hash-field expiry, so the read-preferring lock goes without Lua here.
    native: bool,
    up: bool,
    /// Messages sent before this instant were on connections the crash reset.
    crashed_at: u64,
    /// Wall clock = `offset + t + t * ppm / 1e6`, in ns.
    offset: i64,
    ppm: i64,
    last_forward_jump: Option<u64>,
    /// Its connection setup is refused: nothing may ever be written here.
    refused: bool,
    /// Subscriptions, per client: the subscriber connection's epoch, and its channels.
    subs: BTreeMap<usize, (u64, BTreeSet<Vec<u8>>)>,
}

impl SimNode {
    fn clock_ms(&self, t: u64) -> i64 {
        let t = t as i64;
        (self.offset + t + t * self.ppm / 1_000_000).div_euclid(MS as i64)
    }
}

/// Reconnect backoff bounds, as the driver's.
const BACKOFF_MIN: u64 = 10 * MS;
const BACKOFF_MAX: u64 = 1000 * MS;

/// A client's connection to one node (commands, or subscriptions).
#[derive(Debug, Default)]
struct Conn {
    /// Bumped at every new connection: what came on an older one is dropped.
    epoch: u64,
    up: bool,
    /// Down (after a failure) until then; then it may connect again.
    down_until: u64,
    backoff: u64,
    last_error: Option<NodeErrorKind>,
    /// Nothing arrives before its setup is answered.
    ready_at: u64,
    /// The tagged commands whose replies it owes: run, tag.
    owed: Vec<(u64, Tag)>,
    /// Last arrival on this connection, each way: TCP keeps the order.
    request_link: u64,
    reply_link: u64,
}

impl Conn {
    /// The connection failed at `now` with `why`: it may reconnect after a backoff.
    fn fail(&mut self, now: u64, why: NodeErrorKind) -> Vec<(u64, Tag)> {
        self.up = false;
        self.epoch += 1;
        self.backoff = (self.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
        self.down_until = now + self.backoff;
        self.last_error = Some(why);
        std::mem::take(&mut self.owed)
    }

    /// A new connection: its setup takes a round trip before the first command arrives.
    fn connect(&mut self, now: u64, setup: u64) {
        self.up = true;
        self.epoch += 1;
        self.backoff = 0;
        self.last_error = None;
        self.ready_at = now + setup;
        self.request_link = 0;
        self.reply_link = 0;
    }
}

/// What a cycle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Mutex,
    Read,
    Write,
    Permit,
}

/// The machine a client is driving, if any.
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
}

struct Held {
    token: Token,
    hold: Hold,
    /// Work steps (read, then write) left.
    steps: u32,
    reading: bool,
    read: Vec<u64>,
    kept: Option<Kept>,
    /// The holder is done, and releases once the keeper's round in flight is over.
    release_wanted: bool,
    releasing: bool,
    lost_extend: bool,
}

/// A kept lock's state, as the keeper and the holder share it (see `src/keepalive.rs`).
struct Kept {
    plan: Schedule,
    until: Instant,
    lost: bool,
}

impl Kept {
    /// The validity left, `None` once lost (its end having passed is a loss).
    fn left(&mut self, now: Instant) -> Option<Duration> {
        if !self.lost && self.until > now {
            return Some(self.until - now);
        }
        self.lost = true;
        None
    }
}

/// Timer slots of a client.
const MACHINE: usize = 0;
const HOLDER: usize = 1;
const KEEPER: usize = 2;

struct Client<'a> {
    config: &'a Config,
    conns: Vec<Conn>,
    subs: Vec<Conn>,
    /// Subscriptions confirmed and expected since the last subscription was sent.
    confirmed: usize,
    expected: usize,
    subscribing: bool,
    /// The id of the machine being driven; replies of earlier ones are dropped.
    run: u64,
    job: Job<'a>,
    cycle: Option<Cycle<'a>>,
    /// Carried from one acquisition to the next, as the driver does.
    spread: Duration,
    /// This client's wall clock offset (fair queue tickets), in ns.
    clock: u64,
    timers: [u64; 3],
    cycles_left: u32,
}

#[derive(Debug)]
enum Ev {
    /// Bytes written to a command connection reach the node.
    Deliver {
        node: usize,
        client: usize,
        sent: u64,
        epoch: u64,
        slot: Option<(u64, Tag)>,
        bytes: Vec<u8>,
    },
    Reply {
        client: usize,
        node: usize,
        epoch: u64,
        run: u64,
        tag: Tag,
        bytes: Vec<u8>,
    },
    /// A command's node timeout passed: unanswered, its machine counts the node as failed.
    /// (Until the simulation drives the endpoint, which decides this for real clients.)
    NodeTimeout {
        client: usize,
        node: usize,
        epoch: u64,
        run: u64,
        tag: Tag,
    },
    /// The setup of a connection was refused: the command behind it fails.
    SetupRefused {
        client: usize,
        node: usize,
        run: u64,
        tag: Tag,
    },
    /// A SUBSCRIBE or UNSUBSCRIBE reaches the node.
    SubDeliver {
        node: usize,
        client: usize,
        sent: u64,
        epoch: u64,
        bytes: Vec<u8>,
    },
    Confirmed {
        client: usize,
        node: usize,
        epoch: u64,
        count: usize,
    },
    Wake {
        client: usize,
        node: usize,
        epoch: u64,
        channel: Vec<u8>,
        message: Vec<u8>,
    },
    /// The client sees node `node` close its connections (a crash).
    Closed {
        client: usize,
        node: usize,
        epoch: u64,
        sub_epoch: u64,
    },
    Timer {
        client: usize,
        slot: usize,
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
const MAX_EVENTS: u64 = 2_000_000;

/// What a machine is told.
enum Input<'b> {
    /// Nothing: only poll it (it was just made).
    Poll,
    Reply(usize, Tag, &'b [u8]),
    Failure(usize, Tag, NodeErrorKind),
    Timeout,
    Wake(usize, &'b [u8], &'b [u8]),
    Subscribed,
}

/// What the clients' locks are made of, owned for the whole run: the machines borrow it.
struct Arena {
    configs: Vec<Config>,
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
    clients: Vec<Client<'a>>,
    arena: &'a Arena,
    /// Every all-or-none set of keys (sorted), for `Keys::All`.
    sets: &'a [Vec<&'a [u8]>],
    /// Storage for the holds that hold rounds update.
    holds: std::slice::IterMut<'a, Hold>,
    /// `blocked[client][node]`: a partition cuts that link.
    blocked: Vec<Vec<bool>>,
    counters: Vec<u64>,
    history: History,
    stats: Stats,
    /// What the engine got wrong beyond the history's reach (liveness, configuration errors).
    failures: Vec<String>,
    trace: bool,
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
    let addrs: Vec<NodeAddr> = (0..p.nodes)
        .map(|i| NodeAddr::parse(&format!("127.0.0.1:{}", 7000 + i)).expect("an address"))
        .collect();
    // One configuration per fairness and policy.
    let configs = [(false, false), (false, true), (true, false), (true, true)]
        .into_iter()
        .map(|(fair, write_preferring)| Config {
            nodes: addrs.clone(),
            node_timeout: p.node_timeout,
            connect_timeout: Duration::from_secs(1),
            dead_peer_timeout: Duration::from_secs(3),
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
        })
        .collect();
    let keys: Vec<Vec<u8>> = (0..p.keys).map(key_name).collect();
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
    let mut holds = vec![Hold::new(Instant::now()); 1 << 13];
    run_world(seed, scenario, p, rng, &arena, &sets, &mut holds, trace)
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
) -> Outcome {
    let base = Instant::now();
    // Within the model, relative drift stays under the factor: 0.8 % against 1 %.
    let max_ppm = match scenario {
        Scenario::Model => 8_000,
        _ => 0,
    };
    let refused: BTreeSet<usize> = {
        let mut r = BTreeSet::new();
        while r.len() < p.refused {
            r.insert(rng.below(p.nodes as u64) as usize);
        }
        r
    };
    let nodes = (0..p.nodes)
        .map(|i| SimNode {
            mem: node_memory(),
            native: p.native[i],
            up: true,
            crashed_at: 0,
            offset: rng.range(1 << 40, 1 << 41) as i64,
            ppm: rng.range(0, 2 * max_ppm) as i64 - max_ppm as i64,
            last_forward_jump: None,
            refused: refused.contains(&i),
            subs: BTreeMap::new(),
        })
        .collect();
    let clients = (0..p.clients)
        .map(|_| {
            let fair = rng.chance(p.fair);
            let write_preferring = rng.chance(0.5);
            Client {
                config: &arena.configs[usize::from(fair) * 2 + usize::from(write_preferring)],
                conns: (0..p.nodes).map(|_| Conn::default()).collect(),
                subs: (0..p.nodes).map(|_| Conn::default()).collect(),
                confirmed: 0,
                expected: 0,
                subscribing: false,
                run: 0,
                job: Job::None,
                cycle: None,
                spread: Duration::ZERO,
                clock: rng.range(0, 2 * MS),
                timers: [0; 3],
                cycles_left: p.cycles,
            }
        })
        .collect();
    let mixed = p.native.contains(&true) && p.native.contains(&false);
    let mut w = World {
        scenario,
        blocked: vec![vec![false; p.nodes]; p.clients],
        counters: vec![0; p.keys],
        p,
        rng,
        base,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        nodes,
        clients,
        arena,
        sets,
        holds: holds.iter_mut(),
        history: History::default(),
        stats: Stats {
            seeds: 1,
            refused_runs: u64::from(!refused.is_empty()),
            mixed_runs: u64::from(mixed),
            ..Stats::default()
        },
        failures: Vec::new(),
        trace,
    };
    if trace {
        eprintln!("seed {seed} {scenario:?}: {:?}; refused {refused:?}", w.p);
    }
    for c in 0..w.p.clients {
        let start = w.rng.below(w.p.ttl_ms * MS);
        w.set_timer(c, HOLDER, start);
    }
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
    for (k, v) in w.counters.iter().enumerate() {
        w.history.counters.insert(key_name(k), (0, *v));
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
/// the ops of one client that share their start; a set was in the way until its last key was
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
                "client {} got {:?} {:?} after what was in its way was released (at {since:?})",
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

/// The commands in `bytes` (one encode's output), each as its own slice.
fn commands(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match resp::decode(&bytes[at..], &Limits::default()) {
            Ok(Status::Complete((_, used))) => {
                out.push(&bytes[at..at + used]);
                at += used;
            }
            other => panic!("the engine wrote something that is not a command: {other:?}"),
        }
    }
    out
}

/// A command's arguments.
fn args(command: &[u8]) -> Vec<Vec<u8>> {
    let Ok(Status::Complete((reply, _))) = resp::decode(command, &Limits::default()) else {
        return Vec::new();
    };
    match reply.to_value() {
        Value::Array(Some(items)) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::Bulk(Some(b)) => Some(b),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn reset_error() -> NodeErrorKind {
    NodeErrorKind::Io(io::ErrorKind::ConnectionReset)
}

fn setup_error() -> NodeErrorKind {
    NodeErrorKind::Setup {
        command: "AUTH",
        cause: Box::new(NodeErrorKind::Server {
            kind: ServerErrorKind::Err,
            message: "ERR AUTH <password> called without any password configured".into(),
        }),
    }
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

    /// Replaces client `c`'s timer in `slot` (there is at most one) by one `delay` from now.
    fn set_timer(&mut self, c: usize, slot: usize, delay: u64) {
        self.clients[c].timers[slot] += 1;
        let id = self.clients[c].timers[slot];
        self.schedule(
            delay,
            Ev::Timer {
                client: c,
                slot,
                id,
            },
        );
    }

    fn cancel_timer(&mut self, c: usize, slot: usize) {
        self.clients[c].timers[slot] += 1;
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
                sent,
                epoch,
                slot,
                bytes,
            } => self.deliver(node, client, sent, epoch, slot, &bytes),
            Ev::Reply {
                client,
                node,
                epoch,
                run,
                tag,
                bytes,
            } => {
                let conn = &mut self.clients[client].conns[node];
                if conn.epoch != epoch {
                    return;
                }
                if let Some(i) = conn.owed.iter().position(|&o| o == (run, tag)) {
                    conn.owed.remove(i);
                }
                if run == self.clients[client].run {
                    self.drive(client, Input::Reply(node, tag, &bytes));
                }
            }
            Ev::NodeTimeout {
                client,
                node,
                epoch,
                run,
                tag,
            } => {
                let conn = &self.clients[client].conns[node];
                if conn.epoch == epoch
                    && conn.owed.contains(&(run, tag))
                    && run == self.clients[client].run
                {
                    self.drive(client, Input::Failure(node, tag, NodeErrorKind::Timeout));
                }
            }
            Ev::SetupRefused {
                client,
                node,
                run,
                tag,
            } => {
                if run == self.clients[client].run {
                    self.drive(client, Input::Failure(node, tag, setup_error()));
                }
            }
            Ev::SubDeliver {
                node,
                client,
                sent,
                epoch,
                bytes,
            } => self.sub_deliver(node, client, sent, epoch, &bytes),
            Ev::Confirmed {
                client,
                node,
                epoch,
                count,
            } => {
                let cl = &mut self.clients[client];
                if cl.subs[node].epoch != epoch || !cl.subscribing {
                    return;
                }
                cl.confirmed += count;
                if cl.confirmed >= cl.expected {
                    cl.subscribing = false;
                    self.drive(client, Input::Subscribed);
                }
            }
            Ev::Wake {
                client,
                node,
                epoch,
                channel,
                message,
            } => {
                if self.clients[client].subs[node].epoch == epoch {
                    self.stats.wakes += 1;
                    self.drive(client, Input::Wake(node, &channel, &message));
                }
            }
            Ev::Closed {
                client,
                node,
                epoch,
                sub_epoch,
            } => {
                if self.clients[client].conns[node].epoch == epoch {
                    self.reset(client, node);
                }
                let sub = &mut self.clients[client].subs[node];
                if sub.epoch == sub_epoch && sub.up {
                    sub.fail(self.now, reset_error());
                }
            }
            Ev::Timer { client, slot, id } if self.clients[client].timers[slot] == id => match slot
            {
                MACHINE => self.drive(client, Input::Timeout),
                HOLDER => self.holder(client),
                _ => self.keeper(client),
            },
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

    // --- the driver: machines in, bytes out ------------------------------------------------

    /// Feeds `input` to client `c`'s machine, sends what it transmits, and acts on its outcome.
    fn drive(&mut self, c: usize, input: Input<'_>) {
        match std::mem::replace(&mut self.clients[c].job, Job::None) {
            Job::None => {}
            Job::Acquire(mut m) => {
                self.feed(&mut *m, input);
                self.pump(c, &mut *m);
                match m.poll_outcome() {
                    Some(outcome) => {
                        self.cancel_timer(c, MACHINE);
                        self.clients[c].spread = m.learnt_spread();
                        self.acquired(c, outcome);
                    }
                    None => {
                        self.arm(c, m.poll_timeout());
                        self.clients[c].job = Job::Acquire(m);
                    }
                }
            }
            Job::Round(mut m, purpose) => {
                self.feed(&mut *m, input);
                self.pump(c, &mut *m);
                match m.poll_outcome() {
                    Some(outcome) => {
                        self.cancel_timer(c, MACHINE);
                        let hold = m.hold();
                        self.round_over(c, purpose, outcome, hold);
                    }
                    None => {
                        self.arm(c, m.poll_timeout());
                        self.clients[c].job = Job::Round(m, purpose);
                    }
                }
            }
        }
    }

    fn feed<M: Machine>(&mut self, m: &mut M, input: Input<'_>) {
        let now = self.instant(self.now);
        let rng = &mut self.rng.0;
        match input {
            Input::Poll => {}
            Input::Reply(node, tag, bytes) => {
                let reply = match resp::decode(bytes, &Limits::default()) {
                    Ok(Status::Complete((r, n))) if n == bytes.len() => r,
                    other => panic!("the simulated node sent an undecodable reply: {other:?}"),
                };
                m.handle_reply(node, tag, &reply, now, rng);
            }
            Input::Failure(node, tag, why) => m.handle_failure(node, tag, why, now, rng),
            Input::Timeout => {
                // The machine timer fires at the machine's deadline; a deadline that moved
                // later since is re-armed by `drive`.
                if m.poll_timeout().is_some_and(|t| t <= now) {
                    m.handle_timeout(now, rng);
                }
            }
            Input::Wake(node, channel, message) => m.handle_wake(node, channel, message, now, rng),
            Input::Subscribed => m.handle_subscribed(now, rng),
        }
    }

    fn arm(&mut self, c: usize, at: Option<Instant>) {
        // A machine that is not done always has a deadline; should one not, it still gets
        // its input, as the driver does.
        let at = at.map_or(self.now + self.p.node_timeout.as_nanos() as u64, |t| {
            self.nanos(t)
        });
        let delay = at.saturating_sub(self.now);
        self.set_timer(c, MACHINE, delay);
    }

    /// Sends every transmit `m` has.
    fn pump<M: Machine>(&mut self, c: usize, m: &mut M) {
        while let Some(t) = m.poll_transmit() {
            match (t.to, t.what) {
                (To::All, What::Acquire { .. }) => self.stats.attempts += 1,
                (To::All, What::FenceWrite { .. }) => self.stats.write_backs += 1,
                (To::All, What::Cleanup { .. })
                    if self.clients[c].config.rw_policy == RwPolicy::WritePreferring
                        && self.clients[c]
                            .cycle
                            .as_ref()
                            .is_some_and(|cy| cy.side == Side::Write) =>
                {
                    self.stats.intents += 1
                }
                _ => {}
            }
            match t.to {
                To::All => {
                    for n in 0..self.p.nodes {
                        self.send_command(c, n, &t, m);
                    }
                }
                To::Node(n) => self.send_command(c, n, &t, m),
                To::Subscribers => self.send_subscribers(c, &t, m),
            }
        }
    }

    fn delay(&mut self) -> u64 {
        if self.rng.chance(self.p.long_delay) {
            self.stats.long_delays += 1;
            return self
                .rng
                .range(self.p.ttl_ms * MS / 2, 2 * self.p.ttl_ms * MS);
        }
        self.rng.range(self.p.delay.0, self.p.delay.1)
    }

    /// A round trip on a quiet network: what a connection's setup takes.
    fn setup_time(&mut self) -> u64 {
        self.rng.range(self.p.delay.0, self.p.delay.1) * 2
    }

    /// Sends `t` on client `c`'s command connection to node `n`, as the driver does: a tagged
    /// command that cannot be sent is a failure of that node at once; an untagged one goes
    /// only where something of ours may be (a connection that is up, or still owes replies).
    fn send_command<M: Machine>(&mut self, c: usize, n: usize, t: &Transmit, m: &mut M) {
        let now = self.now;
        let run = self.clients[c].run;
        let conn = &mut self.clients[c].conns[n];
        if !conn.up {
            let failure = if now < conn.down_until {
                Some(conn.last_error.clone().unwrap_or(NodeErrorKind::Backoff))
            } else if t.tag.is_none() {
                return;
            } else if !self.nodes[n].up {
                let why = NodeErrorKind::Connect(io::ErrorKind::ConnectionRefused);
                conn.fail(now, why.clone());
                Some(why)
            } else if self.nodes[n].refused {
                // The setup goes out and is refused a round trip later; nothing behind it is
                // ever written there. The connection stays down with that reason.
                let rtt = self.setup_time();
                let conn = &mut self.clients[c].conns[n];
                conn.fail(now + rtt, setup_error());
                self.stats.setup_refusals += 1;
                let tag = t.tag.expect("tagged");
                self.schedule(
                    rtt,
                    Ev::SetupRefused {
                        client: c,
                        node: n,
                        run,
                        tag,
                    },
                );
                return;
            } else {
                let rtt = self.setup_time();
                self.clients[c].conns[n].connect(now, rtt);
                None
            };
            if let Some(why) = failure {
                if let Some(tag) = t.tag {
                    let now = self.instant(now);
                    m.handle_failure(n, tag, why, now, &mut self.rng.0);
                }
                return;
            }
        }
        let mut bytes = Vec::new();
        let caps = Caps {
            delex: false,
            hsetex: self.nodes[n].native,
        };
        m.encode(t, caps, &mut bytes);
        let conn = &mut self.clients[c].conns[n];
        let slot = t.tag.map(|tag| (run, tag));
        if let Some(s) = slot {
            conn.owed.push(s);
        }
        let epoch = conn.epoch;
        if let Some(tag) = t.tag {
            let timeout = self.p.node_timeout.as_nanos() as u64;
            self.schedule(
                timeout,
                Ev::NodeTimeout {
                    client: c,
                    node: n,
                    epoch,
                    run,
                    tag,
                },
            );
        }
        if self.blocked[c][n] {
            return;
        }
        if self.rng.chance(self.p.request_loss) {
            self.stats.lost_requests += 1;
            return;
        }
        let d = self.delay();
        let conn = &mut self.clients[c].conns[n];
        let at = (now + d).max(conn.request_link).max(conn.ready_at);
        conn.request_link = at;
        self.schedule(
            at - now,
            Ev::Deliver {
                node: n,
                client: c,
                sent: now,
                epoch,
                slot,
                bytes,
            },
        );
    }

    fn deliver(
        &mut self,
        node: usize,
        client: usize,
        sent: u64,
        epoch: u64,
        slot: Option<(u64, Tag)>,
        bytes: &[u8],
    ) {
        let n = &mut self.nodes[node];
        if !n.up || sent < n.crashed_at || self.blocked[client][node] {
            return;
        }
        if n.refused {
            self.failures.push(format!(
                "a command reached node {node}, whose connection setup was refused"
            ));
            return;
        }
        let live = self.clients[client].conns[node].epoch == epoch;
        if !live {
            // Written to a connection that was reset since: it still runs.
            self.stats.late_commands += 1;
        }
        let now_ms = n.clock_ms(self.now);
        if bytes.starts_with(b"*8\r\n$6\r\nHSETEX") || bytes.starts_with(b"*1\r\n$5\r\nMULTI") {
            self.stats.native_commands += 1;
        }
        // One write runs at once on the node (a `MULTI` ... `EXEC` in it too); the last reply
        // is the vote.
        let last = self.nodes[node]
            .mem
            .execute_all(now_ms, &commands(bytes))
            .pop();
        self.publish(node);
        let (Some((run, tag)), Some(reply), true) = (slot, last, live) else {
            return;
        };
        if self.rng.chance(self.p.reply_loss) {
            self.stats.lost_replies += 1;
            return;
        }
        let d = self.delay();
        let conn = &mut self.clients[client].conns[node];
        let at = (self.now + d).max(conn.reply_link);
        conn.reply_link = at;
        self.schedule(
            at - self.now,
            Ev::Reply {
                client,
                node,
                epoch,
                run,
                tag,
                bytes: reply,
            },
        );
    }

    /// Carries what node `node` published to the clients subscribed to it.
    fn publish(&mut self, node: usize) {
        for (channel, message) in std::mem::take(&mut self.nodes[node].mem.outbox) {
            let to: Vec<(usize, u64)> = self.nodes[node]
                .subs
                .iter()
                .filter(|(_, (_, chans))| chans.contains(&channel))
                .map(|(&c, &(epoch, _))| (c, epoch))
                .collect();
            for (client, epoch) in to {
                if self.blocked[client][node] || self.clients[client].subs[node].epoch != epoch {
                    continue;
                }
                if self.rng.chance(self.p.wake_loss) {
                    self.stats.lost_wakes += 1;
                    continue;
                }
                let d = self.delay();
                let sub = &mut self.clients[client].subs[node];
                let at = (self.now + d).max(sub.reply_link);
                sub.reply_link = at;
                self.schedule(
                    at - self.now,
                    Ev::Wake {
                        client,
                        node,
                        epoch,
                        channel: channel.clone(),
                        message: message.clone(),
                    },
                );
            }
        }
    }

    /// Sends a subscription change on every subscriber connection that can take it, as the
    /// driver does, and counts the confirmations a subscription expects.
    fn send_subscribers<M: Machine>(&mut self, c: usize, t: &Transmit, m: &mut M) {
        let now = self.now;
        let mut expected = 0;
        for n in 0..self.p.nodes {
            let sub = &self.clients[c].subs[n];
            if !sub.up {
                if now < sub.down_until {
                    continue;
                }
                if !self.nodes[n].up || self.nodes[n].refused || self.blocked[c][n] {
                    let why = NodeErrorKind::Connect(io::ErrorKind::ConnectionRefused);
                    self.clients[c].subs[n].fail(now, why);
                    continue;
                }
                let rtt = self.setup_time();
                self.clients[c].subs[n].connect(now, rtt);
            }
            let mut bytes = Vec::new();
            expected += m.encode(t, Caps::default(), &mut bytes);
            if self.rng.chance(self.p.request_loss) {
                self.stats.lost_requests += 1;
                continue;
            }
            let d = self.delay();
            let sub = &mut self.clients[c].subs[n];
            let at = (now + d).max(sub.request_link).max(sub.ready_at);
            sub.request_link = at;
            let epoch = sub.epoch;
            self.schedule(
                at - now,
                Ev::SubDeliver {
                    node: n,
                    client: c,
                    sent: now,
                    epoch,
                    bytes,
                },
            );
        }
        if t.what != What::Subscribe {
            return;
        }
        let cl = &mut self.clients[c];
        if expected > 0 {
            (cl.confirmed, cl.expected, cl.subscribing) = (0, expected, true);
        } else {
            let now = self.instant(now);
            m.handle_subscribed(now, &mut self.rng.0);
        }
    }

    fn sub_deliver(&mut self, node: usize, client: usize, sent: u64, epoch: u64, bytes: &[u8]) {
        let n = &mut self.nodes[node];
        if !n.up || sent < n.crashed_at || self.blocked[client][node] {
            return;
        }
        if self.clients[client].subs[node].epoch != epoch {
            return; // That connection is gone, and its subscriptions with it.
        }
        let args = args(bytes);
        let Some((command, channels)) = args.split_first() else {
            return;
        };
        let entry = n.subs.entry(client).or_default();
        if entry.0 != epoch {
            *entry = (epoch, BTreeSet::new());
        }
        match command.as_slice() {
            b"SUBSCRIBE" => {
                entry.1.extend(channels.iter().cloned());
                if self.rng.chance(self.p.reply_loss) {
                    self.stats.lost_replies += 1;
                    return;
                }
                let d = self.delay();
                let sub = &mut self.clients[client].subs[node];
                let at = (self.now + d).max(sub.reply_link);
                sub.reply_link = at;
                self.schedule(
                    at - self.now,
                    Ev::Confirmed {
                        client,
                        node,
                        epoch,
                        count: channels.len(),
                    },
                );
            }
            b"UNSUBSCRIBE" => {
                for ch in channels {
                    entry.1.remove(ch);
                }
            }
            other => panic!("not a subscription: {other:?}"),
        }
    }

    /// Client `c`'s connection to node `n` is reset: every reply it owed the machine being
    /// driven is a failure. What was written to it may still reach the node.
    fn reset(&mut self, c: usize, n: usize) {
        if !self.clients[c].conns[n].up {
            return;
        }
        let owed = self.clients[c].conns[n].fail(self.now, reset_error());
        for (run, tag) in owed {
            // A failure may end the machine, and the next one starts with tags of its own.
            if run == self.clients[c].run {
                self.drive(c, Input::Failure(n, tag, reset_error()));
            }
        }
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
        let node = self.rng.below(self.p.nodes as u64) as usize;
        let client = self.rng.below(self.p.clients as u64) as usize;
        let kind = match self.scenario {
            // A crashed node cannot show that its setup would be refused: runs with
            // misconfigured nodes keep theirs up, so that the check on configuration
            // errors (see `acquired`) applies.
            Scenario::Model if self.p.refused > 0 => 1 + self.rng.below(4),
            Scenario::Model => self.rng.below(5),
            Scenario::InstantRestart | Scenario::ForgetfulRestart => 0,
            Scenario::ClockJump => 2,
            Scenario::UncheckedPause | Scenario::Calm => return,
        };
        match kind {
            0 => {
                if !self.nodes[node].up {
                    return;
                }
                self.stats.crashes += 1;
                // Within the model, fencing runs on nodes that persist every acknowledged write
                // (AOF, `appendfsync always`): a restart keeps the data, not the script cache.
                let mut persistent = self.p.locks.fenced() && self.scenario == Scenario::Model;
                // An upgrade to Redis 8 reloads the data the Redis 7 node persisted (AOF):
                // readers in sorted sets, while new ones become hash fields there.
                if !self.nodes[node].native
                    && self.p.upgrade > 0.0
                    && self.rng.chance(self.p.upgrade)
                {
                    self.log(format_args!("node {node} is upgraded to Redis 8"));
                    self.nodes[node].native = true;
                    self.stats.upgrades += 1;
                    persistent = true;
                }
                {
                    let n = &mut self.nodes[node];
                    if persistent {
                        n.mem.forget_scripts();
                    } else {
                        n.mem = node_memory();
                    }
                    n.subs.clear();
                    n.crashed_at = self.now;
                }
                // Every client sees its connections closed, a moment later.
                for c in 0..self.p.clients {
                    let (epoch, sub_epoch) = (
                        self.clients[c].conns[node].epoch,
                        self.clients[c].subs[node].epoch,
                    );
                    let d = self.rng.range(self.p.delay.0, self.p.delay.1);
                    self.schedule(
                        d,
                        Ev::Closed {
                            client: c,
                            node,
                            epoch,
                            sub_epoch,
                        },
                    );
                }
                if self.scenario == Scenario::InstantRestart {
                    self.log(format_args!("node {node} crashes and restarts at once"));
                } else {
                    self.nodes[node].up = false;
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
                let heal = self.rng.range(max_ttl / 8, max_ttl);
                self.log(format_args!("partition {:?}", self.blocked));
                self.schedule(heal, Ev::Heal);
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
            }
            3 => {
                // The connection breaks (a proxy, a NAT, a reset): what was written to it is
                // on its way and still runs on the node.
                if self.clients[client].conns[node].up {
                    self.stats.resets += 1;
                    self.log(format_args!(
                        "client {client}'s connection to {node} resets"
                    ));
                    self.reset(client, node);
                }
            }
            _ => {
                let sub = &mut self.clients[client].subs[node];
                if sub.up {
                    self.stats.subscriber_resets += 1;
                    sub.fail(self.now, reset_error());
                    self.nodes[node].subs.remove(&client);
                    self.log(format_args!(
                        "client {client}'s subscriber to {node} resets"
                    ));
                }
            }
        }
    }

    // --- the clients' programs -------------------------------------------------------------

    /// Starts the next lock cycle of client `c`.
    fn start_cycle(&mut self, c: usize) {
        if self.clients[c].cycles_left == 0 || self.now > self.p.horizon {
            return;
        }
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
                        capacity: self.p.permits,
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
                    client: c as u64,
                    kind,
                    key: key_name(k),
                    invoke,
                    ok: None,
                    fence: None,
                    valid_until: None,
                    release: None,
                })
            })
            .collect();
        let wait = !self.rng.chance(self.p.try_once);
        let ttl_ms = self.p.ttl_ms;
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
        let params = Params {
            ttl_ms,
            timing,
            wait,
            fair: cl.config.fair,
            ticket: (self.now + cl.clock) / 1000,
            spread: cl.spread,
        };
        if self.trace {
            eprintln!(
                "{:>10.3} ms  client {c} takes {side:?} on {keys:?} (ops {ops:?}), wait {wait}, fair {}, keep {}",
                self.now as f64 / MS as f64,
                cl.config.fair,
                keep.is_some()
            );
        }
        cl.cycle = Some(Cycle {
            spec,
            ops,
            keys,
            side,
            wait,
            keep,
            held: None,
        });
        let config = cl.config;
        let round = Round::new(self.p.nodes, now, None, None);
        let m = Acquisition::new(spec, config, params, now, round, &mut self.rng.0);
        let cl = &mut self.clients[c];
        cl.run += 1;
        cl.subscribing = false;
        cl.job = Job::Acquire(Box::new(m));
        self.drive(c, Input::Poll);
    }

    fn timing(&self, ttl_ms: u64) -> Timing {
        Timing {
            ttl: Duration::from_millis(ttl_ms),
            drift_factor: self.p.drift_factor,
        }
    }

    /// The acquisition of client `c`'s cycle is over.
    fn acquired(&mut self, c: usize, outcome: Result<Grant, Error>) {
        let refused_quorum = self.p.nodes - self.p.refused < self.p.quorum;
        let wait = self.clients[c].cycle.as_ref().is_some_and(|cy| cy.wait);
        let grant = match outcome {
            Ok(grant) => grant,
            Err(e) => {
                self.log(format_args!("client {c} gives up: {e}"));
                if e.is_config() {
                    self.stats.config_errors += 1;
                } else if refused_quorum && wait {
                    // One attempt (`try_*`) may be decided by a node's refusal before every
                    // refused setup is in; a wait must find out, and end at once.
                    self.failures.push(format!(
                        "too few nodes accept the setup for a quorum, yet the acquisition ended with: {e}"
                    ));
                }
                if self.scenario == Scenario::Calm {
                    self.failures
                        .push(format!("a wait in a calm run ended with: {e}"));
                }
                return self.end_cycle(c);
            }
        };
        if refused_quorum {
            self.failures
                .push("granted though too few nodes accept the setup".into());
        }
        let now = self.instant(self.now);
        let steps = self.rng.range(1, 3) as u32;
        let kept_steps = self.rng.range(3, 6) as u32;
        let fair = self.clients[c].config.fair;
        let cycle = self.clients[c].cycle.as_mut().expect("a cycle");
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
        let kept = cycle.keep.map(|plan| Kept {
            plan,
            until: grant.valid_until,
            lost: false,
        });
        let steps = if kept.is_some() { kept_steps } else { steps };
        cycle.held = Some(Held {
            token: grant.token,
            hold: Hold::new(grant.valid_until).written_with(Duration::from_millis(self.p.ttl_ms)),
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
            "client {c} holds {ops:?} until {:?}, fence {:?}",
            grant.valid_until, grant.fencing_token
        ));
        if let Some(due) = self.kept_due(c, now) {
            self.stats.kept += 1;
            self.set_keeper(c, due);
        }
        self.next_step(c);
    }

    /// When a kept lock's first extension is due.
    fn kept_due(&mut self, c: usize, now: Instant) -> Option<Instant> {
        let held = self.clients[c].cycle.as_mut()?.held.as_mut()?;
        let kept = held.kept.as_mut()?;
        let left = kept.left(now).unwrap_or_default();
        Some(kept.plan.next_due(now, left))
    }

    /// Schedules the keeper at `due`, or later when it runs slow.
    fn set_keeper(&mut self, c: usize, due: Instant) {
        let mut at = self.nanos(due).max(self.now);
        if self.rng.chance(self.p.slow_keeper) {
            self.stats.slow_keepers += 1;
            at += self.rng.below(self.p.ttl_ms * MS);
        }
        self.set_timer(c, KEEPER, at - self.now);
    }

    /// The validity the holder sees at `now`: its guard's, or its kept lock's.
    fn valid(&mut self, c: usize) -> bool {
        let now = self.instant(self.now);
        let Some(held) = self.clients[c]
            .cycle
            .as_mut()
            .and_then(|cy| cy.held.as_mut())
        else {
            return false;
        };
        match held.kept.as_mut() {
            Some(kept) => kept.left(now).is_some(),
            None => held.hold.validity(now) > Duration::ZERO,
        }
    }

    /// Schedules the holder's next work step.
    fn next_step(&mut self, c: usize) {
        let now = self.instant(self.now);
        let ttl = self.p.ttl_ms * MS;
        let Some(held) = self.clients[c]
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
        self.set_timer(c, HOLDER, work);
    }

    /// The holder's work: read the counters, then (after a while, maybe a pause) write them.
    fn holder(&mut self, c: usize) {
        let Some(cycle) = self.clients[c].cycle.as_ref() else {
            return self.start_cycle(c);
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
            if !self.valid(c) {
                self.log(format_args!("client {c} finds its validity gone"));
                return self.start_release(c);
            }
            let read = keys.iter().map(|&k| self.counters[k]).collect();
            let now = self.instant(self.now);
            let ttl = self.p.ttl_ms * MS;
            let held = self.held(c);
            held.read = read;
            held.reading = false;
            let left = if held.kept.is_some() {
                ttl
            } else {
                held.hold.validity(now).as_nanos() as u64
            };
            let mut work = self.rng.below(left / 2 + 1);
            if self.rng.chance(self.p.pause) {
                self.stats.pauses += 1;
                work += if self.scenario == Scenario::UncheckedPause {
                    self.rng.range(left, left + ttl)
                } else {
                    self.rng.range(0, 2 * ttl)
                };
                self.log(format_args!("client {c} pauses for {work} ns"));
            }
            return self.set_timer(c, HOLDER, work);
        }
        if checked && !self.valid(c) {
            self.log(format_args!("client {c} finds its validity gone"));
            return self.start_release(c);
        }
        if matches!(side, Side::Mutex | Side::Write) {
            let held = self.held(c);
            let read = held.read.clone();
            let after_lost = held.lost_extend;
            self.stats.writes_after_lost_extend += u64::from(after_lost);
            for ((k, op), r) in keys.into_iter().zip(ops).zip(read) {
                self.counters[k] = r + 1;
                self.history.increments.push(Increment {
                    client: c as u64,
                    key: key_name(k),
                    read: r,
                    at: Duration::from_nanos(self.now),
                    op,
                });
            }
        }
        let held = self.held(c);
        held.reading = true;
        held.steps = held.steps.saturating_sub(1);
        let (steps, kept) = (held.steps, held.kept.is_some());
        if steps == 0 || !self.valid(c) {
            return self.start_release(c);
        }
        if !kept && side == Side::Write && self.rng.chance(0.3) {
            // The writer goes on as a reader: any TTL, as for an extend. Its write window ends
            // as the round starts (it writes no more); its read window starts there.
            let ttl = self.p.ttl_ms;
            let ttl_ms = self.rng.range((ttl / 4).max(10), 2 * ttl);
            let ops = self.clients[c].cycle.as_ref().expect("a cycle").ops.clone();
            for op in ops {
                self.history.ops[op].release = Some(Duration::from_nanos(self.now));
            }
            self.log(format_args!("client {c} downgrades for {ttl_ms} ms"));
            let step = Step::Downgrade {
                ttl_ms,
                timing: self.timing(ttl_ms),
            };
            return self.start_round(c, step, Purpose::Downgrade { at: self.now });
        }
        if !kept && self.rng.chance(0.4) {
            // Any TTL, a shorter one than the lock's too.
            let ttl = self.p.ttl_ms;
            let ttl_ms = self.rng.range((ttl / 4).max(10), 2 * ttl);
            self.stats.extends += 1;
            self.stats.shorter_extends += u64::from(ttl_ms < ttl);
            let step = Step::Extend {
                ttl_ms,
                timing: self.timing(ttl_ms),
            };
            return self.start_round(c, step, Purpose::Extend { ttl_ms });
        }
        self.next_step(c);
    }

    fn held(&mut self, c: usize) -> &mut Held {
        self.clients[c]
            .cycle
            .as_mut()
            .and_then(|cy| cy.held.as_mut())
            .expect("held")
    }

    /// The keeper's turn for client `c`'s kept lock.
    fn keeper(&mut self, c: usize) {
        let now = self.instant(self.now);
        let Some(held) = self.clients[c]
            .cycle
            .as_mut()
            .and_then(|cy| cy.held.as_mut())
        else {
            return;
        };
        if held.releasing || held.release_wanted {
            return;
        }
        let Some(kept) = held.kept.as_mut() else {
            return;
        };
        if kept.left(now).is_none() {
            self.stats.kept_lost += 1;
            self.log(format_args!("client {c}'s kept lock is lost"));
            return;
        }
        // `validity()` and `is_lost()` do not wait for the round: what it may leave on the
        // nodes is what they say while it is in flight.
        if let Some(cap) = kept.plan.cap_from(now) {
            kept.until = kept.until.min(cap);
        }
        let ttl = kept.plan.ttl();
        let ttl_ms = ttl.as_millis() as u64;
        self.stats.keeper_rounds += 1;
        self.record_until(c);
        let step = Step::Extend {
            ttl_ms,
            timing: self.timing(ttl_ms),
        };
        self.start_round(c, step, Purpose::Keep);
    }

    /// Writes the holder's end of validity into the history.
    fn record_until(&mut self, c: usize) {
        let cycle = self.clients[c].cycle.as_ref().expect("a cycle");
        let held = cycle.held.as_ref().expect("held");
        let until = held
            .kept
            .as_ref()
            .map_or(held.hold.valid_until(), |k| k.until);
        for &op in &cycle.ops {
            self.history.ops[op].valid_until = Some(until - self.base);
        }
    }

    /// Starts a round of `step` on the held lock.
    fn start_round(&mut self, c: usize, step: Step, purpose: Purpose) {
        let now = self.instant(self.now);
        let Some(slot) = self.holds.next() else {
            // Out of storage: this client stops here (its lock expires on its own).
            self.clients[c].cycles_left = 0;
            return;
        };
        let cl = &mut self.clients[c];
        let cycle = cl.cycle.as_ref().expect("a cycle");
        let held = cycle.held.as_ref().expect("held");
        *slot = held.hold;
        let round = Round::new(self.p.nodes, now, None, None);
        let m = slot.round(cycle.spec, held.token, cl.config, step, now, round);
        cl.run += 1;
        cl.job = Job::Round(Box::new(m), purpose);
        self.drive(c, Input::Poll);
    }

    fn start_release(&mut self, c: usize) {
        let busy = matches!(self.clients[c].job, Job::Round(..));
        let held = self.held(c);
        if busy {
            held.release_wanted = true;
            return;
        }
        held.releasing = true;
        self.cancel_timer(c, KEEPER);
        self.cancel_timer(c, HOLDER);
        let ops = self.clients[c].cycle.as_ref().expect("a cycle").ops.clone();
        for op in ops {
            self.history.ops[op].release = Some(Duration::from_nanos(self.now));
        }
        self.log(format_args!("client {c} releases"));
        self.start_round(c, Step::Release, Purpose::Release);
    }

    /// A round of the held lock is over; `hold` is what it left.
    fn round_over(&mut self, c: usize, purpose: Purpose, result: Result<(), Error>, hold: Hold) {
        let now = self.instant(self.now);
        self.log(format_args!(
            "client {c}: {purpose:?} {result:?}, valid until {:?}",
            hold.valid_until()
        ));
        if purpose == Purpose::Release {
            return self.end_cycle(c);
        }
        if let Purpose::Downgrade { at } = purpose {
            return self.downgraded(c, at, result, hold);
        }
        if purpose == Purpose::Keep && result.is_err() {
            self.stats.lost_extends += 1;
        }
        let held = self.held(c);
        held.hold = hold;
        match purpose {
            Purpose::Extend { .. } => {
                if result.is_err() {
                    held.lost_extend = true;
                    self.stats.lost_extends += 1;
                }
                self.record_until(c);
                if self.held(c).release_wanted || !self.valid(c) {
                    return self.start_release(c);
                }
                // Won or not, the holder goes on while its guard's validity lasts.
                self.next_step(c);
            }
            Purpose::Keep => {
                let kept = held.kept.as_mut().expect("kept");
                if result.is_ok() {
                    kept.until = hold.valid_until();
                } else {
                    kept.until = kept.until.min(hold.valid_until());
                }
                let left = kept.left(now);
                let next = kept.plan.after_round(result, now, left);
                self.record_until(c);
                if self.held(c).release_wanted {
                    return self.start_release(c);
                }
                match next {
                    Ok(due) => self.set_keeper(c, due),
                    Err(e) => {
                        self.stats.kept_lost += 1;
                        self.held(c).kept.as_mut().expect("kept").lost = true;
                        self.log(format_args!("client {c}'s kept lock is lost: {e}"));
                    }
                }
            }
            Purpose::Release | Purpose::Downgrade { .. } => unreachable!(),
        }
    }

    /// Client `c`'s downgrade round, started at `at`, is over: won, the cycle goes on as a
    /// reader with the same token; lost, it was undone on every node and nothing is held.
    fn downgraded(&mut self, c: usize, at: u64, result: Result<(), Error>, hold: Hold) {
        if let Err(e) = result {
            self.stats.lost_downgrades += 1;
            self.log(format_args!("client {c}'s downgrade is lost: {e}"));
            if self.scenario == Scenario::Calm {
                self.failures
                    .push(format!("a downgrade in a calm run was lost: {e}"));
            }
            return self.end_cycle(c);
        }
        self.stats.downgrades += 1;
        let steps = self.rng.range(1, 3) as u32;
        let cycle = self.clients[c].cycle.as_mut().expect("a cycle");
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
        let op = self.history.push(history::Op {
            client: c as u64,
            kind: Kind::Read,
            key: key_name(key),
            invoke: Duration::from_nanos(at),
            ok: Some(Duration::from_nanos(at)),
            fence: None,
            valid_until: Some(hold.valid_until() - self.base),
            release: None,
        });
        let cycle = self.clients[c].cycle.as_mut().expect("a cycle");
        cycle.ops = vec![op];
        if self.held(c).release_wanted || !self.valid(c) {
            return self.start_release(c);
        }
        self.next_step(c);
    }

    fn end_cycle(&mut self, c: usize) {
        if self.scenario == Scenario::Calm {
            let kept_lost = self.clients[c]
                .cycle
                .as_ref()
                .and_then(|cy| cy.held.as_ref())
                .and_then(|h| h.kept.as_ref())
                .is_some_and(|k| k.lost);
            if kept_lost {
                self.failures
                    .push("a kept lock was lost in a calm run".into());
            }
        }
        self.cancel_timer(c, KEEPER);
        let cl = &mut self.clients[c];
        cl.cycle = None;
        cl.job = Job::None;
        cl.cycles_left = cl.cycles_left.saturating_sub(1);
        let think = self.rng.below(self.p.ttl_ms * MS / 2);
        self.set_timer(c, HOLDER, think);
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
