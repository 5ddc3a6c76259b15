//! One command fanned out to N nodes, and the quorum decision over their replies.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::engine::validity;
use crate::engine::validity::Timing;
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
///
/// A node that does not answer in time is told to the round as a failure
/// ([`NodeErrorKind::Timeout`]) by whoever runs the connections (the endpoint decides when a node
/// counts as timed out); the round itself only keeps the validity it must be won within.
pub struct Round {
    start: Instant,
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
    pub fn new(
        nodes: usize,
        start: Instant,
        timing: Option<Timing>,
        hold_until: Option<Instant>,
    ) -> Round {
        let mut round = Round {
            start,
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
        round.reset(start, timing, hold_until);
        round
    }

    /// Reuses this round's storage for a new round over the same nodes.
    pub fn reset(&mut self, start: Instant, timing: Option<Timing>, hold_until: Option<Instant>) {
        self.start = start;
        (self.valid_until, self.finish_by) = validity::round_validity(start, timing, hold_until);
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

    /// Applies the validity at `now`: a round not won by its finish-by instant is lost.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.evaluate(now);
    }

    /// When the round must be decided by: its validity's end, or the hold's; `None` for a
    /// round that only needs acknowledgements (a release).
    pub fn finish_by(&self) -> Option<Instant> {
        self.finish_by
    }

    /// The next instant at which [`handle_timeout`](Self::handle_timeout) has work to do (the
    /// instant the round must be won before), or `None` once it is decided or when it has no
    /// such instant (a release waits for the nodes' answers, or their failures).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.decision.is_some() {
            return None;
        }
        self.finish_by
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
