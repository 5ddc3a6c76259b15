//! A held lock: its validity, and the extend and release rounds that change it.
//!
//! A [`Hold`] is the engine's side of a guard. [`Hold::round`] gives a [`HoldRound`] for a
//! [`Step`] (an extend or a release), a state machine for one round over every node, which
//! updates the hold when it is decided.
//!
//! A won extend gives the lock a new validity, `ttl` less the time the round took and the drift
//! allowance. A lost one never lengthens the validity, but it may shorten it: the nodes that
//! said yes applied the new TTL, and those that did not answer may still apply it (when its
//! bytes reach them), so the lock may now lapse on every node `ttl` after the round began,
//! however long it was before. The validity becomes the earlier of its old end and
//! `start + ttl − drift`. When nothing was sent (the validity had already ended), it is
//! unchanged.
//!
//! A downgrade turns a write lock into a read lock with the same token: one round, one atomic
//! script per node (add the reader entry, then delete the writer key, where the writer key
//! still holds the token). It is bounded as an extend is: it must be won before the write
//! lock's validity ends, and a won one gives the read lock `ttl` less the time the round took
//! and the drift allowance, from the round's start. A lost one (or one asked for once the
//! validity has ended, which sends no downgrade) is undone on every node, as a lost acquire
//! is: the undo goes out to every node behind the round, removes the reader entry and the
//! writer key holding the token, and the holder holds nothing afterwards.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::fanout::Fanout;
use crate::engine::kind::{Cmd, Spec};
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::{Caps, ScriptForm};
use crate::engine::round::{Decision, Round};
use crate::engine::validity;
use crate::engine::validity::Timing;
use crate::error::{Error, NodeErrorKind};
use crate::resp::Reply;
use crate::rng::{Entropy, Token};
use crate::stats::Recorder;

/// A held lock's validity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hold {
    valid_until: Instant,
    /// The longest TTL any command written for the lock set on a node: after it, nothing of
    /// the lock is left on a node that ran its last write.
    ttl: Duration,
}

/// What a [`HoldRound`] does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    /// Resets the lock's TTL to `ttl_ms` (`timing` built on it); the round must be won before
    /// the current validity ends.
    Extend {
        /// The new TTL in milliseconds.
        ttl_ms: u64,
        /// See `ttl_ms`.
        timing: Timing,
    },
    /// Releases the lock on every node, whether or not that node granted it; the round is won
    /// when a quorum has acknowledged.
    Release,
    /// Turns a write lock into a read lock with the same token and a TTL of `ttl_ms`
    /// (`timing` built on it); the round must be won before the write lock's validity ends.
    /// A lost one is undone on every node.
    Downgrade {
        /// The read lock's TTL in milliseconds.
        ttl_ms: u64,
        /// See `ttl_ms`.
        timing: Timing,
    },
}

impl Hold {
    /// A lock valid until `valid_until`.
    pub fn new(valid_until: Instant) -> Hold {
        Hold {
            valid_until,
            ttl: Duration::ZERO,
        }
    }

    /// The same hold, for a lock that was written with a TTL of `ttl`.
    pub fn written_with(mut self, ttl: Duration) -> Hold {
        self.ttl = self.ttl.max(ttl);
        self
    }

    /// Until when a compare-and-delete sent at `now` is worth sending again on a new
    /// connection: the lock's entries cannot outlive its longest TTL after its last write.
    fn redo_until(&self, now: Instant) -> Instant {
        now + self
            .ttl
            .max(self.valid_until.saturating_duration_since(now))
    }

    /// When the lock may be granted to someone else.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The time left at `now`; zero once it has run out.
    pub fn validity(&self, now: Instant) -> Duration {
        self.valid_until.saturating_duration_since(now)
    }

    /// Lowers the end of validity to `at`, if that is earlier.
    pub fn cap(&mut self, at: Instant) {
        self.valid_until = self.valid_until.min(at);
    }

    /// A round of `step` for the lock `spec` held with `token`, started at `now`, on `round`'s
    /// storage. An extend asked for once the validity has ended sends nothing, and fails with
    /// [`Error::ValidityExpired`].
    pub fn round<'a>(
        &'a mut self,
        spec: Spec<'a>,
        token: Token,
        config: &'a Config,
        step: Step,
        now: Instant,
        mut round: Round,
    ) -> HoldRound<'a> {
        round.set_quorum(match step {
            Step::Extend { .. } | Step::Downgrade { .. } => spec.quorum(round.nodes()),
            Step::Release => spec.release_quorum(round.nodes()),
        });
        let valid_until = self.valid_until;
        if let Step::Extend { ttl_ms, .. } | Step::Downgrade { ttl_ms, .. } = step {
            self.ttl = self.ttl.max(Duration::from_millis(ttl_ms));
        }
        let mut r = HoldRound {
            hold: self,
            spec,
            token,
            config,
            step,
            fanout: Fanout::new(round),
            undo: false,
            outcome: None,
        };
        match step {
            Step::Extend { .. } | Step::Downgrade { .. } if now >= valid_until => {
                // A write lock past its validity may still be on some nodes: a downgrade
                // that cannot be made still releases it.
                r.undo = matches!(step, Step::Downgrade { .. });
                r.outcome = Some(Err(Error::ValidityExpired {
                    elapsed: Duration::ZERO,
                }));
            }
            Step::Extend { timing, .. } | Step::Downgrade { timing, .. } => {
                r.fanout.start(1, now, Some(timing), Some(valid_until))
            }
            Step::Release => r.fanout.start(1, now, None, None),
        }
        r.advance(now);
        r
    }
}

/// One extend or release round of a held lock (see [`Hold::round`]).
#[derive(Debug)]
pub(crate) struct HoldRound<'a> {
    hold: &'a mut Hold,
    spec: Spec<'a>,
    token: Token,
    config: &'a Config,
    step: Step,
    fanout: Fanout<'a>,
    /// A lost downgrade's undo, to send to every node.
    undo: bool,
    outcome: Option<Result<(), Error>>,
}

impl<'a> HoldRound<'a> {
    /// Counts the nodes' reply latencies and failures in `stats` from now on.
    pub fn record_to(&mut self, stats: &'a Recorder) {
        self.fanout.record_to(stats);
    }

    /// The hold as this round has left it so far: its new validity once the round is decided.
    /// A driver that keeps the hold elsewhere reads it back here (the simulation does).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn hold(&self) -> Hold {
        *self.hold
    }

    /// Gives the round storage back.
    pub fn into_round(self) -> Round {
        self.fanout.into_round()
    }

    fn what(&self) -> What {
        match self.step {
            Step::Extend { ttl_ms, .. } => What::Extend {
                token: self.token,
                ttl_ms,
            },
            Step::Release => What::Release { token: self.token },
            Step::Downgrade { ttl_ms, .. } => What::Downgrade {
                token: self.token,
                ttl_ms,
            },
        }
    }

    fn cmd(&self) -> Cmd<'_> {
        let token = self.token.as_bytes();
        match self.step {
            Step::Extend { ttl_ms, .. } => Cmd::Extend { token, ttl_ms },
            Step::Release => Cmd::Release { token },
            Step::Downgrade { ttl_ms, .. } => Cmd::Downgrade { token, ttl_ms },
        }
    }

    fn advance(&mut self, now: Instant) {
        if self.outcome.is_some() {
            return;
        }
        let Some(decision) = self.fanout.decision(now) else {
            return;
        };
        let won = match (self.step, decision) {
            (
                Step::Extend { .. },
                Decision::Won {
                    valid_until: Some(until),
                    ..
                },
            ) => {
                self.hold.valid_until = until;
                true
            }
            (Step::Extend { timing, .. }, _) => {
                self.hold.cap(validity::failed_extend_cap(
                    self.fanout.round().start(),
                    timing,
                ));
                false
            }
            (Step::Release, Decision::Won { .. }) => true,
            (Step::Release, _) => false,
            (
                Step::Downgrade { .. },
                Decision::Won {
                    valid_until: Some(until),
                    ..
                },
            ) => {
                // The read lock's validity, from the round's start: the write lock's is over.
                self.hold.valid_until = until;
                true
            }
            (Step::Downgrade { .. }, _) => {
                // Undone everywhere: nothing is held any more.
                self.hold.cap(self.fanout.round().start());
                self.undo = true;
                false
            }
        };
        self.outcome = Some(if won {
            Ok(())
        } else {
            Err(self.fanout.loss(self.config))
        });
    }
}

impl Machine for HoldRound<'_> {
    type Output = Result<(), Error>;

    fn handle_reply(
        &mut self,
        node: usize,
        tag: Tag,
        reply: &Reply<'_>,
        now: Instant,
        _rng: &mut dyn Entropy,
    ) {
        if self.outcome.is_some() {
            return;
        }
        let verdict = self.spec.with_op(self.cmd(), |op| op.classify(reply));
        self.fanout.handle_verdict(node, tag, verdict, now);
        self.advance(now);
    }

    fn handle_failure(
        &mut self,
        node: usize,
        tag: Tag,
        why: NodeErrorKind,
        now: Instant,
        _rng: &mut dyn Entropy,
    ) {
        self.fanout.handle_failure(node, tag, why, now);
        self.advance(now);
    }

    fn handle_timeout(&mut self, now: Instant, _rng: &mut dyn Entropy) {
        self.fanout.handle_timeout(now);
        self.advance(now);
    }

    fn replies_wanted(&self) -> usize {
        match self.outcome {
            Some(_) => 1,
            None => self.fanout.replies_wanted(),
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        // A release and an undo are compare-and-deletes: sent again on a node's next
        // connection if the one they went on breaks before they are answered.
        let start = self.fanout.round().start();
        if let Some((to, tag, form)) = self.fanout.poll_transmit() {
            return Some(Transmit {
                to,
                tag: Some(tag),
                form,
                what: self.what(),
                redo: matches!(self.step, Step::Release).then(|| self.hold.redo_until(start)),
            });
        }
        // Behind the round on every connection, so it lands after the downgrade even where
        // that has not been answered yet. Its replies are dropped; it goes with its body so
        // none needs reading.
        std::mem::take(&mut self.undo).then(|| Transmit {
            to: To::All,
            tag: None,
            form: ScriptForm::Body,
            what: What::DowngradeUndo { token: self.token },
            redo: Some(self.hold.redo_until(start)),
        })
    }

    fn encode(&self, t: &Transmit, caps: Caps, out: &mut Vec<u8>) -> usize {
        let cmd = match t.what {
            What::DowngradeUndo { .. } => Cmd::DowngradeUndo {
                token: self.token.as_bytes(),
            },
            _ => self.cmd(),
        };
        self.spec
            .with_op(cmd, |op| op.encode_for(out, t.form, caps))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self.outcome {
            Some(_) => None,
            None => self.fanout.poll_timeout(),
        }
    }

    fn poll_outcome(&mut self) -> Option<Result<(), Error>> {
        self.outcome.take()
    }
}
