//! What a client's locks have been doing: counters kept with atomics as the engine runs
//! ([`Recorder`]), and the snapshot [`Client::stats`](crate::Client::stats) returns
//! ([`Stats`]).
//!
//! Recording costs a few relaxed atomic additions per round and per reply: no allocation, no
//! lock. The latencies are kept in a small ring per node (the last [`LATENCY_WINDOW`]
//! replies), read and sorted only when a snapshot is taken.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use crate::error::NodeErrorKind;

/// How many of a node's latest replies its latency percentiles are taken over.
pub const LATENCY_WINDOW: usize = 128;

/// The kinds of lock, in the order of [`Stats::kinds`].
const KINDS: usize = 7;
/// The kinds of node failure, in the order of [`NodeFailures`]' fields.
const FAILURE_KINDS: usize = 8;

/// A lock kind's index in the recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KindIndex {
    Mutex = 0,
    Read = 1,
    Write = 2,
    All = 3,
    FencedMutex = 4,
    FencedWrite = 5,
    Semaphore = 6,
}

/// How an acquisition round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundEnd {
    Won,
    Contended,
    Unreachable,
}

#[derive(Debug)]
struct NodeCell {
    failures: [AtomicU64; FAILURE_KINDS],
    /// Reply latencies in microseconds, the latest [`LATENCY_WINDOW`].
    ring: [AtomicU32; LATENCY_WINDOW],
    /// How many latencies were ever recorded (the next slot, modulo the window).
    recorded: AtomicUsize,
    /// Command connections that broke.
    disconnects: AtomicU64,
}

/// The counters of one client, shared by every thread that uses it.
#[derive(Debug)]
pub(crate) struct Recorder {
    rounds: [[AtomicU64; 3]; KINDS],
    nodes: Box<[NodeCell]>,
    wakeups: AtomicU64,
    retries: AtomicU64,
    cancellations: AtomicU64,
}

impl Recorder {
    /// Counters for a client of `nodes` nodes, all zero.
    pub fn new(nodes: usize) -> Recorder {
        Recorder {
            rounds: Default::default(),
            nodes: (0..nodes)
                .map(|_| NodeCell {
                    failures: Default::default(),
                    ring: std::array::from_fn(|_| AtomicU32::new(0)),
                    recorded: AtomicUsize::new(0),
                    disconnects: AtomicU64::new(0),
                })
                .collect(),
            wakeups: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            cancellations: AtomicU64::new(0),
        }
    }

    /// An acquisition round of lock kind `kind` ended as `end`.
    pub fn round(&self, kind: KindIndex, end: RoundEnd) {
        self.rounds[kind as usize][end as usize].fetch_add(1, Relaxed);
    }

    /// Node `node` answered `latency` after its command was queued.
    pub fn reply(&self, node: usize, latency: Duration) {
        if let Some(cell) = self.nodes.get(node) {
            let at = cell.recorded.fetch_add(1, Relaxed) % LATENCY_WINDOW;
            let micros = latency.as_micros().min(u32::MAX as u128) as u32;
            cell.ring[at].store(micros, Relaxed);
        }
    }

    /// Node `node` failed a round with `why`.
    pub fn failure(&self, node: usize, why: &NodeErrorKind) {
        let i = match why {
            NodeErrorKind::Timeout => 0,
            NodeErrorKind::Connect(_) => 1,
            NodeErrorKind::Backoff => 2,
            NodeErrorKind::Io(_) | NodeErrorKind::ServerChanged | NodeErrorKind::Tls(_) => 3,
            NodeErrorKind::Protocol(_) => 4,
            NodeErrorKind::Server { .. } => 5,
            NodeErrorKind::UnexpectedReply => 6,
            NodeErrorKind::Setup { .. } | NodeErrorKind::SameServer { .. } => 7,
        };
        if let Some(cell) = self.nodes.get(node) {
            cell.failures[i].fetch_add(1, Relaxed);
        }
    }

    /// A waiter was woken by a release announcement worth retrying for.
    pub fn wakeup(&self) {
        self.wakeups.fetch_add(1, Relaxed);
    }

    /// An acquisition started an attempt after its first.
    pub fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// Node `node`'s command connection broke.
    pub fn disconnect(&self, node: usize) {
        if let Some(cell) = self.nodes.get(node) {
            cell.disconnects.fetch_add(1, Relaxed);
        }
    }

    /// An acquisition was cancelled.
    pub fn cancellation(&self) {
        self.cancellations.fetch_add(1, Relaxed);
    }

    /// The counters now. Counters read one by one while other threads record: each is exact,
    /// the set is not one instant's.
    pub fn snapshot(&self) -> Stats {
        let rounds = |k: usize| RoundStats {
            won: self.rounds[k][RoundEnd::Won as usize].load(Relaxed),
            contended: self.rounds[k][RoundEnd::Contended as usize].load(Relaxed),
            unreachable: self.rounds[k][RoundEnd::Unreachable as usize].load(Relaxed),
        };
        Stats {
            kinds: KindStats {
                mutex: rounds(0),
                read: rounds(1),
                write: rounds(2),
                all: rounds(3),
                fenced_mutex: rounds(4),
                fenced_write: rounds(5),
                semaphore: rounds(6),
            },
            nodes: self.nodes.iter().map(NodeCell::snapshot).collect(),
            wakeups: self.wakeups.load(Relaxed),
            retries: self.retries.load(Relaxed),
            cancellations: self.cancellations.load(Relaxed),
        }
    }
}

impl NodeCell {
    fn snapshot(&self) -> NodeStats {
        let f = |i: usize| self.failures[i].load(Relaxed);
        let n = self.recorded.load(Relaxed).min(LATENCY_WINDOW);
        // Sorted as u64, the element type the rest of the library (and most programs) sort
        // already: a sort of u32 would be a copy of the standard library's for this alone.
        let mut window = [0u64; LATENCY_WINDOW];
        for (slot, cell) in window.iter_mut().zip(&self.ring).take(n) {
            *slot = u64::from(cell.load(Relaxed));
        }
        let window = &mut window[..n];
        window.sort_unstable();
        let pct = |p: usize| (n > 0).then(|| Duration::from_micros(window[(n - 1) * p / 100]));
        NodeStats {
            failures: NodeFailures {
                timeout: f(0),
                connect: f(1),
                backoff: f(2),
                io: f(3),
                protocol: f(4),
                server: f(5),
                unexpected_reply: f(6),
                setup: f(7),
            },
            latency_samples: n,
            latency_p50: pct(50),
            latency_p99: pct(99),
            disconnects: self.disconnects.load(Relaxed),
        }
    }
}

/// A snapshot of what a client's locks have been doing since it was built
/// ([`Client::stats`](crate::Client::stats)). Shared by every clone of the client.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Acquisition rounds (attempts) by lock kind, and how each ended.
    pub kinds: KindStats,
    /// Per node, in the order the nodes were given.
    pub nodes: Vec<NodeStats>,
    /// Release announcements that woke a waiter for a retry.
    pub wakeups: u64,
    /// Attempts after an acquisition's first: after a release announcement, a retry delay, a
    /// split vote, or a lost fencing write-back.
    pub retries: u64,
    /// Acquisitions that ended with [`Error::Cancelled`](crate::Error::Cancelled).
    pub cancellations: u64,
}

/// Acquisition rounds of each lock kind.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KindStats {
    /// [`Lock`](crate::Lock).
    pub mutex: RoundStats,
    /// [`ReadLock`](crate::ReadLock).
    pub read: RoundStats,
    /// [`WriteLock`](crate::WriteLock).
    pub write: RoundStats,
    /// [`MultiLock`](crate::MultiLock).
    pub all: RoundStats,
    /// [`FencedLock`](crate::FencedLock).
    pub fenced_mutex: RoundStats,
    /// [`FencedWriteLock`](crate::FencedWriteLock).
    pub fenced_write: RoundStats,
    /// [`Permit`](crate::Permit) of a [`Semaphore`](crate::Semaphore).
    pub semaphore: RoundStats,
}

/// How a lock kind's acquisition rounds ended.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoundStats {
    /// Won on a quorum within the validity.
    pub won: u64,
    /// Lost because the lock was held elsewhere ([`Error::Contended`](crate::Error::Contended)).
    pub contended: u64,
    /// Lost for any other reason: too many nodes failed, the validity ran out, misconfigured
    /// nodes.
    pub unreachable: u64,
}

/// One node's failures and reply latency.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeStats {
    /// Its failures in rounds (acquire, extend, release), by kind.
    pub failures: NodeFailures,
    /// How many replies the percentiles are taken over: its latest, at most
    /// [`LATENCY_WINDOW`](crate::LATENCY_WINDOW).
    pub latency_samples: usize,
    /// The median time from a round's start to this node's reply; `None` before any reply.
    pub latency_p50: Option<Duration>,
    /// The 99th percentile of the same.
    pub latency_p99: Option<Duration>,
    /// How many times its command connection broke once established: closed or reset by the
    /// node or the network, or given up as dead (see
    /// [`ClientBuilder::dead_peer_timeout`](crate::ClientBuilder::dead_peer_timeout)). Failed
    /// connects are not counted here ([`NodeFailures::connect`]).
    pub disconnects: u64,
}

/// A node's failures by [`NodeErrorKind`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeFailures {
    /// [`NodeErrorKind::Timeout`].
    pub timeout: u64,
    /// [`NodeErrorKind::Connect`].
    pub connect: u64,
    /// [`NodeErrorKind::Backoff`].
    pub backoff: u64,
    /// [`NodeErrorKind::Io`] and [`NodeErrorKind::ServerChanged`]: the connection was closed.
    pub io: u64,
    /// [`NodeErrorKind::Protocol`].
    pub protocol: u64,
    /// [`NodeErrorKind::Server`].
    pub server: u64,
    /// [`NodeErrorKind::UnexpectedReply`].
    pub unexpected_reply: u64,
    /// [`NodeErrorKind::Setup`].
    pub setup: u64,
}

impl NodeFailures {
    /// Every failure, whatever its kind.
    pub fn total(&self) -> u64 {
        self.timeout
            + self.connect
            + self.backoff
            + self.io
            + self.protocol
            + self.server
            + self.unexpected_reply
            + self.setup
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_latest_window() {
        let r = Recorder::new(2);
        assert_eq!(r.snapshot().nodes[0].latency_p50, None);
        for i in 0..1000u64 {
            r.reply(0, Duration::from_micros(i));
        }
        let s = r.snapshot();
        assert_eq!(s.nodes[0].latency_samples, LATENCY_WINDOW);
        // The last 128: 872..=999.
        assert_eq!(
            s.nodes[0].latency_p50,
            Some(Duration::from_micros(872 + 63))
        );
        assert_eq!(
            s.nodes[0].latency_p99,
            Some(Duration::from_micros(872 + 125))
        );
        assert_eq!(s.nodes[1].latency_samples, 0);
        r.failure(1, &NodeErrorKind::Timeout);
        r.failure(5, &NodeErrorKind::Timeout);
        assert_eq!(r.snapshot().nodes[1].failures.timeout, 1);
        r.round(KindIndex::Read, RoundEnd::Contended);
        assert_eq!(r.snapshot().kinds.read.contended, 1);
    }
}
