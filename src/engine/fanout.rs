//! One command fanned out to every node, as a state machine sends it: its [`Round`], its tag,
//! and the resends that `NOSCRIPT` replies call for.
#![forbid(unsafe_code)]

use std::time::Instant;

use crate::config::Config;
use crate::engine::machine::{Tag, To};
use crate::engine::ops::{ScriptForm, Verdict};
use crate::engine::round::{Decision, Round, Vote};
use crate::engine::validity::Timing;
use crate::error::{Error, NodeErrorKind, NodeFailure};
use crate::stats::Recorder;

/// A round in flight, with what its machine still owes the nodes.
#[derive(Debug)]
pub(crate) struct Fanout<'a> {
    round: Round,
    /// Where reply latencies and node failures are counted, if anywhere.
    stats: Option<&'a Recorder>,
    tag: Tag,
    /// The command to every node has not been polled yet.
    unsent: bool,
    /// Nodes (bit `i` for node `i`) owed the script again with its body.
    resend: u64,
    /// Nodes already sent the body: a second `NOSCRIPT` from them is a failure.
    resent: u64,
}

impl<'a> Fanout<'a> {
    /// A fan-out that has sent nothing yet, on `round`'s storage.
    pub fn new(round: Round) -> Fanout<'a> {
        Fanout {
            round,
            stats: None,
            tag: 0,
            unsent: false,
            resend: 0,
            resent: 0,
        }
    }

    /// Counts reply latencies and node failures in `stats` from now on.
    pub fn record_to(&mut self, stats: &'a Recorder) {
        self.stats = Some(stats);
    }

    /// Starts a round tagged `tag` at `now` (see [`Round::reset`]): its command to every node
    /// is the next transmit.
    pub fn start(
        &mut self,
        tag: Tag,
        now: Instant,
        timing: Option<Timing>,
        hold_until: Option<Instant>,
    ) {
        self.round.reset(now, timing, hold_until);
        self.tag = tag;
        self.unsent = true;
        self.resend = 0;
        self.resent = 0;
    }

    /// The round.
    pub fn round(&self) -> &Round {
        &self.round
    }

    /// Gives the round's storage back.
    pub fn into_round(self) -> Round {
        self.round
    }

    /// This fan-out's tag.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// Where the next command goes, with its tag and form: first to every node, then the
    /// resends with the script's body.
    pub fn poll_transmit(&mut self) -> Option<(To, Tag, ScriptForm)> {
        if std::mem::take(&mut self.unsent) {
            return Some((To::All, self.tag, ScriptForm::Sha));
        }
        if self.resend == 0 {
            return None;
        }
        let node = self.resend.trailing_zeros() as usize;
        self.resend &= !(1 << node);
        self.resent |= 1 << node;
        Some((To::Node(node), self.tag, ScriptForm::Body))
    }

    /// Gives up on this fan-out: nothing more of it is sent. Returns whether its command had
    /// gone out (been polled) already.
    pub fn abandon(&mut self) -> bool {
        self.resend = 0;
        !std::mem::take(&mut self.unsent)
    }

    /// Feeds node `node`'s reply to this fan-out's command, as `verdict`. Replies with another
    /// tag (to an earlier fan-out) are ignored.
    pub fn handle_verdict(&mut self, node: usize, tag: Tag, verdict: Verdict, now: Instant) {
        if tag != self.tag {
            return;
        }
        match verdict {
            Verdict::Vote(v) => {
                // Latency is timed by the driver, which sees every reply, late ones too.
                if let Some(stats) = self.stats.filter(|_| self.round.is_pending(node)) {
                    if let Vote::Failed(why) = &v {
                        stats.failure(node, why);
                    }
                }
                self.round.handle_vote(node, v, now)
            }
            Verdict::NoScript if node < 64 && self.resent & (1 << node) == 0 => {
                // The script cache was flushed: the nodes outside the quorum will most likely
                // answer NOSCRIPT too, so this fan-out stays open (see `decision`) until they
                // got the body or the node timeout passed; their votes no longer change the
                // decision, but their commands must go out now, not with a later command.
                self.resend |= 1 << node;
            }
            Verdict::NoScript => {
                self.round
                    .handle_vote(node, Vote::Failed(NodeErrorKind::UnexpectedReply), now)
            }
        }
    }

    /// How many more replies can change what this fan-out does (see
    /// [`Machine::replies_wanted`](crate::engine::machine::Machine::replies_wanted)): each one
    /// while a command is unsent or a `NOSCRIPT` is being served, else the votes that can
    /// decide the round.
    pub fn replies_wanted(&self) -> usize {
        if self.unsent || (self.resend | self.resent) != 0 {
            return 1;
        }
        self.round.votes_to_decide()
    }

    /// Node `node` will not answer this fan-out's command.
    pub fn handle_failure(&mut self, node: usize, tag: Tag, why: NodeErrorKind, now: Instant) {
        if tag == self.tag {
            if let Some(stats) = self.stats.filter(|_| self.round.is_pending(node)) {
                stats.failure(node, &why);
            }
            self.round.handle_vote(node, Vote::Failed(why), now);
        }
    }

    /// Applies the round's validity at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.round.handle_timeout(now);
    }

    /// The round's decision, once it is decided and, after a `NOSCRIPT`, every node has been
    /// sent the body or the node timeout has passed.
    pub fn decision(&self, now: Instant) -> Option<Decision> {
        let decision = self.round.decision()?;
        (!self.serving_stragglers(now)).then_some(decision)
    }

    /// After a `NOSCRIPT`, a decided round still waits for the nodes that have not answered
    /// (until they answer or time out), so that the body goes out to them now; but never past
    /// the round's [`finish_by`](Round::finish_by): a slow node must not keep a holder
    /// counting a validity that the nodes which ran a shortening extend no longer hold.
    fn serving_stragglers(&self, now: Instant) -> bool {
        self.stragglers() && self.round.finish_by().is_none_or(|f| now < f)
    }

    /// When [`handle_timeout`](Self::handle_timeout) has work to do: the round's deadline,
    /// or, once it is decided while stragglers are served, its `finish_by`.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.round.decision().is_some() && self.stragglers() {
            return self.round.finish_by();
        }
        self.round.poll_timeout()
    }

    /// After a `NOSCRIPT`, nodes that have not answered yet.
    fn stragglers(&self) -> bool {
        (self.resend | self.resent) != 0
            && (0..self.round.nodes()).any(|i| self.round.is_pending(i))
    }

    /// The error for this round, lost; see [`loss`].
    pub fn loss(&self, config: &Config) -> Error {
        loss(&self.round, config)
    }
}

/// The error for a round that was not won. When too few nodes are left for a quorum once those
/// whose setup was refused are counted out, that is [`Error::Config`]: waiting cannot help.
pub(crate) fn loss(round: &Round, config: &Config) -> Error {
    let failures = || -> Vec<NodeFailure> {
        round
            .failures()
            .map(|(node, kind)| config.failure(node, kind.clone()))
            .collect()
    };
    let misconfigured = round
        .failures()
        .filter(|(_, kind)| matches!(kind, NodeErrorKind::Setup { .. }))
        .count();
    match round.decision() {
        Some(Decision::Expired { elapsed }) => Error::ValidityExpired { elapsed },
        _ if misconfigured > 0 && round.nodes() - misconfigured < round.quorum() => Error::Config {
            failures: round
                .failures()
                .filter(|(_, kind)| matches!(kind, NodeErrorKind::Setup { .. }))
                .map(|(node, kind)| config.failure(node, kind.clone()))
                .collect(),
        },
        Some(Decision::Contended) => Error::Contended {
            refused: round.refused(),
            nodes: round.nodes(),
            failures: failures(),
        },
        _ => Error::QuorumUnreachable {
            quorum: round.quorum(),
            nodes: round.nodes(),
            failures: failures(),
        },
    }
}
