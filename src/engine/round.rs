//! One command fanned out to N nodes, and the quorum decision over their replies.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::engine::timing::Timing;
use crate::engine::timings;
use crate::error::NodeErrorKind;

/// Nodes needed for a quorum of `n`: a strict majority, `n / 2 + 1`. With an even `n` this is
/// one more than half, so 4 nodes need 3 and tolerate only 1 failure, like 3 nodes do.
pub const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// What one node said, as the lock algorithm reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vote {
    /// The node did what was asked (set the key, extended it, acknowledged the release).
    Yes,
    /// The node refused: another token holds the key.
    No,
    /// The node failed to answer usefully.
    Failed(NodeErrorKind),
}

/// How a round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A quorum said yes within the validity.
    Won {
        /// When the lock stops being valid (`None` for rounds with no TTL, such as a release).
        valid_until: Option<Instant>,
        /// When the deciding vote arrived.
        at: Instant,
    },
    /// Enough nodes refused that a quorum cannot be reached.
    Contended,
    /// Enough nodes failed that a quorum cannot be reached.
    Unreachable,
    /// The quorum did not arrive before the validity ran out.
    Expired {
        /// From the start of the round to the decision.
        elapsed: Duration,
    },
}

/// One fan-out of a command to N nodes, and the quorum decision over their votes.
#[derive(Debug)]
pub struct Round {
    start: Instant,
    node_timeout: Duration,
    /// The latest of the per-node deadlines.
    node_deadline: Instant,
    /// Per node, when it counts as failed if it has not answered: the per-node timeout from
    /// the start, or from when its command was written (see [`handle_written`](Self::handle_written)).
    deadlines: Vec<Instant>,
    /// When the lock this round creates would stop being valid.
    valid_until: Option<Instant>,
    /// The round must be won strictly before this: the new validity, and for an extend also the
    /// validity the lock has now.
    finish_by: Option<Instant>,
    quorum: usize,
    votes: Vec<Option<Vote>>,
    yes: usize,
    no: usize,
    failed: usize,
    decision: Option<Decision>,
}

impl Round {
    /// Starts a round over `nodes` nodes at `start`, which must be taken before the first send.
    ///
    /// `timing` is `None` for rounds that only need acknowledgements (a release). `hold_until`
    /// is the current validity of a lock being extended: the quorum must answer before it.
    /// A per-node timeout of `node_timeout` applies from `start`.
    pub fn new(
        nodes: usize,
        start: Instant,
        node_timeout: Duration,
        timing: Option<Timing>,
        hold_until: Option<Instant>,
    ) -> Round {
        let mut round = Round {
            start,
            node_timeout,
            node_deadline: timings::node_deadline(start, node_timeout),
            deadlines: Vec::with_capacity(nodes),
            valid_until: None,
            finish_by: hold_until,
            quorum: quorum(nodes),
            votes: Vec::with_capacity(nodes),
            yes: 0,
            no: 0,
            failed: 0,
            decision: None,
        };
        round.votes.resize(nodes, None);
        round.deadlines.resize(nodes, round.node_deadline);
        round.reset(start, node_timeout, timing, hold_until);
        round
    }

    /// Reuses this round's storage for a new round over the same nodes.
    pub fn reset(
        &mut self,
        start: Instant,
        node_timeout: Duration,
        timing: Option<Timing>,
        hold_until: Option<Instant>,
    ) {
        self.start = start;
        self.node_timeout = node_timeout;
        self.node_deadline = timings::node_deadline(start, node_timeout);
        let deadline = self.node_deadline;
        self.deadlines.iter_mut().for_each(|d| *d = deadline);
        (self.valid_until, self.finish_by) = timings::round_validity(start, timing, hold_until);
        self.votes.iter_mut().for_each(|v| *v = None);
        self.yes = 0;
        self.no = 0;
        self.failed = 0;
        self.decision = None;
        self.evaluate(start);
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.votes.len()
    }

    /// Votes needed to win.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Sets the votes needed to win from the next [`reset`](Self::reset) on (clamped to
    /// `1..=nodes`): the majority for every kind of lock but a semaphore, whose quorum
    /// depends on its permits.
    pub fn set_quorum(&mut self, quorum: usize) {
        self.quorum = quorum.clamp(1, self.votes.len().max(1));
    }

    /// When the round started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// When the last node that has not answered counts as failed.
    pub fn node_deadline(&self) -> Instant {
        self.node_deadline
    }

    /// The decision, once there is one. It never changes afterwards.
    pub fn decision(&self) -> Option<Decision> {
        self.decision
    }

    /// Whether `node` has not voted yet.
    pub fn is_pending(&self, node: usize) -> bool {
        self.votes.get(node).is_some_and(Option::is_none)
    }

    /// Each node's vote so far (`None`: no answer yet).
    pub fn votes(&self) -> &[Option<Vote>] {
        &self.votes
    }

    /// How many nodes said yes.
    pub fn granted(&self) -> usize {
        self.yes
    }

    /// How many nodes said no.
    pub fn refused(&self) -> usize {
        self.no
    }

    /// The nodes that failed, with what happened.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &NodeErrorKind)> {
        self.votes.iter().enumerate().filter_map(|(i, v)| match v {
            Some(Vote::Failed(k)) => Some((i, k)),
            _ => None,
        })
    }

    /// How many more votes can decide the round at the earliest (1 once it is decided): the
    /// fewer of the grants still missing for the quorum and the refusals or failures still
    /// missing for a loss.
    pub fn votes_to_decide(&self) -> usize {
        if self.decision.is_some() {
            return 1;
        }
        let n = self.votes.len();
        let to_win = self.quorum.saturating_sub(self.yes);
        let to_lose = (n - self.quorum + 1).saturating_sub(self.no + self.failed);
        to_win.min(to_lose).max(1)
    }

    /// Records what `node` said. A second vote from the same node, or a node out of range, is
    /// ignored. Votes after the decision are recorded (so cleanup knows who answered) but do not
    /// change it.
    pub fn handle_vote(&mut self, node: usize, vote: Vote, now: Instant) {
        let Some(slot) = self.votes.get_mut(node) else {
            return;
        };
        if slot.is_some() {
            return;
        }
        match vote {
            Vote::Yes => self.yes += 1,
            Vote::No => self.no += 1,
            Vote::Failed(_) => self.failed += 1,
        }
        *slot = Some(vote);
        self.evaluate(now);
    }

    /// Node `node`'s command left for the node at `at` (it may have waited behind other
    /// callers' commands): its per-node timeout counts from then, so that time spent queued in
    /// the client is never taken for the node's slowness. The validity still counts from the
    /// round's start.
    pub fn handle_written(&mut self, node: usize, at: Instant) {
        let Some(d) = self.deadlines.get_mut(node) else {
            return;
        };
        let from_write = timings::node_deadline(at, self.node_timeout);
        if from_write > *d {
            *d = from_write;
            self.node_deadline = self.node_deadline.max(from_write);
        }
    }

    /// Applies the deadlines that have passed by `now`: nodes silent past their per-node
    /// timeout fail with [`NodeErrorKind::Timeout`], and the round expires once the validity is
    /// gone.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.decision.is_some() {
            return;
        }
        for (v, d) in self.votes.iter_mut().zip(&self.deadlines) {
            if v.is_none() && now >= *d {
                *v = Some(Vote::Failed(NodeErrorKind::Timeout));
                self.failed += 1;
            }
        }
        self.evaluate(now);
    }

    /// The earliest per-node deadline of a node that has not answered.
    fn next_node_deadline(&self) -> Instant {
        self.votes
            .iter()
            .zip(&self.deadlines)
            .filter(|(v, _)| v.is_none())
            .map(|(_, d)| *d)
            .min()
            .unwrap_or(self.node_deadline)
    }

    /// The next instant at which [`handle_timeout`](Self::handle_timeout) has work to do, or
    /// `None` once the round is decided.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.decision.is_some() {
            return None;
        }
        Some(timings::earliest(self.finish_by, self.next_node_deadline()))
    }

    fn evaluate(&mut self, now: Instant) {
        if self.decision.is_some() {
            return;
        }
        let n = self.votes.len();
        let expired = self.finish_by.is_some_and(|f| now >= f);
        self.decision = if expired {
            Some(Decision::Expired {
                elapsed: now.saturating_duration_since(self.start),
            })
        } else if self.yes >= self.quorum {
            Some(Decision::Won {
                valid_until: self.valid_until,
                at: now,
            })
        } else if self.failed > n - self.quorum {
            Some(Decision::Unreachable)
        } else if self.no + self.failed > n - self.quorum {
            Some(Decision::Contended)
        } else {
            None
        };
    }
}
