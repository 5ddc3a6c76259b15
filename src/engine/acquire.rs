//! The acquisition state machine: Redlock's retry loop and everything around it.
//!
//! This is where a retry happens. An [`Acquisition`] makes attempts, each with a fresh token,
//! on every node at once; a round won on a quorum within the validity is the lock. A lost
//! attempt is undone on every node (its cleanup is pipelined behind it, so late answers are
//! undone too, and ahead of the next attempt, which so never meets the lock of the one it
//! replaces), and the next attempt comes:
//!
//! - at once after the first refusal, once the waiter has subscribed to the lock's wake
//!   channels (a release may have come before the subscription did);
//! - when a release is announced by a node that refused or failed the last attempt (not one
//!   of the waiter's own cleanups), after a short random pause if waiters have been colliding;
//!   announced while that attempt was in flight, after it went out, it counts once the attempt
//!   is lost (the node may have refused it before it ran the release);
//!   in a fair queue, only once as many releases were announced as the last attempt's rank
//!   said were ahead of it (see [`Ranks`]): only the head retries at a release;
//! - after a jittered [retry delay](crate::ClientBuilder::retry_delay) (the backstop) when no
//!   release is announced, or when a fair waiter still counts releases; only the retries after
//!   a backstop with no release announced since the last attempt count against the retry
//!   count;
//! - soon, a few times in a row, after a split vote in a fair queue.
//!
//! No attempt starts at or after the wait timeout. A fair waiter keeps one id (its first
//! token) and one ticket across its attempts, and leaves every queue when it is done; a
//! write-preferring writer withdraws its intent when it is done. A fenced lock's token is
//! written back to a quorum when the counters read disagree. A configuration error ends the
//! acquisition at once.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::config::{Config, RwPolicy};
use crate::engine::fair::{AttemptIds, FairState, Ranks};
use crate::engine::fanout::Fanout;
use crate::engine::fencing::FenceRead;
use crate::engine::kind::{Cmd, Keys, Spec};
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::{Caps, ScriptForm};
use crate::engine::retry::Retry;
use crate::engine::round::{quorum, Decision, Round, Vote};
use crate::engine::timings::{self, WaitLimits};
use crate::engine::validity::Timing;
use crate::error::{Error, NodeErrorKind};
use crate::resp::{self, Reply};
use crate::rng::{Entropy, Token};
use crate::stats::{KindIndex, Recorder, RoundEnd};

/// How many times a waiting fenced acquisition tries again after a lost write-back.
const WRITE_BACK_ATTEMPTS: u32 = 3;

/// How many characters of a released token its announcement carries (see
/// [`WAKE_PREFIX`](crate::engine::keys::WAKE_PREFIX)).
const WAKE_ID_LEN: usize = 16;

/// With a fair queue, how many times in a row a waiter retries soon after a split vote before
/// it waits for an announcement again: enough for a release to reach every node.
const QUICK_SPLIT_RETRIES: u32 = 6;

/// A won acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    /// The token of the attempt that won: the lock's value on the nodes.
    pub token: Token,
    /// When the lock stops being valid.
    pub valid_until: Instant,
    /// The fencing token, for a fenced lock.
    pub fencing_token: Option<u64>,
}

/// How an acquisition is made, beside its lock and the client's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// The TTL in whole milliseconds, and the timing built on it.
    pub ttl_ms: u64,
    /// See `ttl_ms`.
    pub timing: Timing,
    /// Retry while the budget allows (`lock`), or make one attempt (`try_lock`).
    pub wait: bool,
    /// Join the fair queue (the client's setting, for the kinds that have one).
    pub fair: bool,
    /// The waiter's place in a fair queue: this machine's wall clock in microseconds when the
    /// acquisition began. Unused unless `fair`.
    pub ticket: u64,
    /// The spread of retries after split votes that the last acquisition on this driver ended
    /// with: contention lasts longer than one acquisition.
    pub spread: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// An attempt's round is out.
    Attempt,
    /// The fencing token is being written back to a quorum.
    WriteBack,
    /// Subscribing to the wake channels; the next attempt comes once they are confirmed, or
    /// at `until`.
    Subscribing { until: Instant },
    /// A short pause after a split vote; the next attempt comes at `until`.
    Pausing { until: Instant },
    /// Waiting for a release announcement, or for the backstop.
    Waiting { backstop: Instant },
    /// Over: the outcome is ready (or taken).
    Done,
}

/// Which announcements wake a waiter: see [`Acquisition::handle_wake`].
#[derive(Debug)]
struct WakeFilter {
    /// The nodes (bit `i` for node `i`) that refused or failed the last attempt decided.
    nodes: u64,
    /// What the cleanups of this waiter's last two attempts announce.
    own: [[u8; WAKE_ID_LEN]; 2],
    /// The current attempt went out: what is announced from now on may postdate its answers.
    out: bool,
    /// The nodes that announced a release (not this waiter's own) since the current attempt
    /// went out.
    heard: u64,
}

/// One acquisition of one lock (see the module docs).
#[derive(Debug)]
pub(crate) struct Acquisition<'a> {
    spec: Spec<'a>,
    config: &'a Config,
    params: Params,
    started: Instant,
    retry: Retry,
    /// The waiter's id: its first attempt's token.
    waiter: Token,
    /// The current attempt's token.
    token: Token,
    attempts: u32,
    fair: Option<FairState>,
    /// A fair waiter's place in line, as its last attempt learnt it.
    ranks: Ranks,
    intent_ms: u64,
    read: FenceRead,
    fanout: Fanout<'a>,
    /// Where rounds, retries, wake-ups and cancellations are counted, if anywhere.
    stats: Option<&'a Recorder>,
    next_tag: Tag,
    state: State,
    /// Undo of the attempt with this token, to send.
    cleanup: Option<Token>,
    /// The nodes (bit `i` for node `i`) owed the undo of the won attempt: a semaphore with
    /// fewer slots per node than permits keeps a quorum of the slots it was granted and gives
    /// the others back, so that it blocks nobody with them.
    surplus: u64,
    /// Queues still to leave (the next one, and the end).
    leave: (usize, usize),
    withdraw: bool,
    subscribe: bool,
    unsubscribe: bool,
    subscribed: bool,
    /// A release was announced since the current attempt started.
    woken: bool,
    wake: WakeFilter,
    /// The window over which retries after split votes spread; doubled at each.
    spread: Duration,
    split_seen: bool,
    /// Quick retries after split votes in a row (fair queue only).
    quick: u32,
    write_backs_lost: u32,
    valid_until: Instant,
    outcome: Option<Result<Grant, Error>>,
}

impl<'a> Acquisition<'a> {
    /// Starts acquiring the lock `spec` at `now` with `config`'s settings: the first attempt
    /// is the first transmit. `round` is storage for the rounds (see [`into_round`]); `rng`
    /// gives the first attempt's token.
    ///
    /// [`into_round`]: Self::into_round
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(
        spec: Spec<'a>,
        config: &'a Config,
        params: Params,
        now: Instant,
        round: Round,
        rng: &mut dyn Entropy,
    ) -> Acquisition<'a> {
        let limits = WaitLimits::of(config);
        Acquisition::with_limits(spec, config, params, &limits, now, round, rng)
    }

    /// Like [`new`](Self::new), waiting within `limits` (one call's own) instead of the
    /// client's wait timeout and retry count.
    pub fn with_limits(
        spec: Spec<'a>,
        config: &'a Config,
        params: Params,
        limits: &WaitLimits,
        now: Instant,
        mut round: Round,
        rng: &mut dyn Entropy,
    ) -> Acquisition<'a> {
        round.set_quorum(spec.quorum(round.nodes()));
        let token = rng.token();
        let fair = params.fair.then(|| {
            FairState::new(
                params.ticket,
                timings::queue_entry_ttl_ms(config),
                config.fair_after,
            )
        });
        let intent_ms = match config.rw_policy {
            RwPolicy::WritePreferring if spec.is_writer() => timings::intent_ttl_ms(config),
            _ => 0,
        };
        let mut a = Acquisition {
            spec,
            config,
            params,
            started: now,
            retry: Retry::until(
                timings::wait_end(now, limits),
                limits.retry_count,
                params.wait,
            ),
            waiter: token,
            token,
            attempts: 0,
            fair,
            ranks: Ranks::new(),
            intent_ms,
            read: FenceRead::new(),
            fanout: Fanout::new(round),
            stats: None,
            next_tag: 0,
            state: State::Attempt,
            cleanup: None,
            surplus: 0,
            leave: (0, 0),
            withdraw: false,
            subscribe: false,
            unsubscribe: false,
            subscribed: false,
            woken: false,
            wake: WakeFilter {
                nodes: u64::MAX,
                own: [[0; WAKE_ID_LEN]; 2],
                out: false,
                heard: 0,
            },
            spread: params.spread,
            split_seen: false,
            quick: 0,
            write_backs_lost: 0,
            valid_until: now,
            outcome: None,
        };
        a.start_attempt(now, rng);
        a
    }

    /// The spread of retries after split votes that this acquisition ends with, for the next
    /// one on the same driver: what was learnt of the contention, halved when this one saw no
    /// collision, so it fades once the contention does.
    pub fn learnt_spread(&self) -> Duration {
        timings::learnt_spread(self.spread, self.split_seen)
    }

    /// The waiter's id, which names it in a fair queue (after its kind, for a read-write lock).
    #[cfg(test)]
    pub fn waiter(&self) -> &[u8] {
        self.waiter.as_bytes()
    }

    /// Gives the round storage back.
    pub fn into_round(self) -> Round {
        self.fanout.into_round()
    }

    /// Counts this acquisition's rounds, retries, wake-ups and cancellation, and its nodes'
    /// reply latencies and failures, in `stats` from now on.
    pub fn record_to(&mut self, stats: &'a Recorder) {
        self.stats = Some(stats);
        self.fanout.record_to(stats);
    }

    /// The kind of lock, as the statistics count it.
    fn kind_index(&self) -> KindIndex {
        match (self.spec.keys, self.spec.fence.is_some()) {
            (Keys::Mutex(_), false) => KindIndex::Mutex,
            (Keys::Mutex(_), true) => KindIndex::FencedMutex,
            (Keys::Read { .. } | Keys::Downgraded { .. }, _) => KindIndex::Read,
            (Keys::Write { .. }, false) => KindIndex::Write,
            (Keys::Write { .. }, true) => KindIndex::FencedWrite,
            (Keys::All(_), _) => KindIndex::All,
            (Keys::Semaphore { .. }, _) => KindIndex::Semaphore,
        }
    }

    fn tag(&mut self) -> Tag {
        self.next_tag = self.next_tag.wrapping_add(1);
        self.next_tag
    }

    fn start_attempt(&mut self, now: Instant, rng: &mut dyn Entropy) {
        if self.attempts > 0 {
            if let Some(stats) = self.stats {
                stats.retry();
            }
            // One `getrandom` per retry; the first attempt uses the waiter's id.
            self.token = rng.token();
            if let Some(fair) = &self.fair {
                fair.on_retry(now.saturating_duration_since(self.started));
            }
        }
        self.attempts += 1;
        self.woken = false;
        (self.wake.out, self.wake.heard) = (false, 0);
        self.ranks.clear();
        // The counters read count only for the token they were read with.
        self.read.clear();
        let tag = self.tag();
        let timing = self.params.timing;
        self.fanout.start(tag, now, Some(timing), None);
        self.state = State::Attempt;
        self.advance(now, rng);
    }

    /// Moves on from a decided round.
    fn advance(&mut self, now: Instant, rng: &mut dyn Entropy) {
        let Some(decision) = (match self.state {
            State::Attempt | State::WriteBack => self.fanout.decision(now),
            _ => None,
        }) else {
            return;
        };
        if let Some(stats) = self.stats.filter(|_| self.state == State::Attempt) {
            let end = match decision {
                Decision::Won { .. } => RoundEnd::Won,
                Decision::Contended => RoundEnd::Contended,
                _ => RoundEnd::Unreachable,
            };
            stats.round(self.kind_index(), end);
        }
        if self.state == State::WriteBack {
            if matches!(decision, Decision::Won { .. }) {
                let grant = self.grant(self.read.token());
                return self.finish(Ok(grant));
            }
            // Won, but the token is not on a quorum: undo the lock like a lost attempt, and
            // try again while the budget and the write-back attempts allow.
            let error = self.fanout.loss(self.config);
            self.cleanup = Some(self.token);
            self.write_backs_lost += 1;
            let again = self.params.wait
                && self.write_backs_lost < WRITE_BACK_ATTEMPTS
                && self.retry.remaining(now) > Duration::ZERO;
            return if again {
                self.start_attempt(now, rng)
            } else {
                self.finish(Err(error))
            };
        }
        match decision {
            Decision::Won {
                valid_until: Some(until),
                ..
            } => {
                self.valid_until = until;
                if self.spec.fence.is_none() {
                    self.surplus = self.surplus_nodes();
                    let grant = self.grant(None);
                    return self.finish(Ok(grant));
                }
                match self.read.token() {
                    // Every reply was read before now, so if now is within the validity, each
                    // node that returned the token held our lock key and the token at some
                    // instant before its end: on a quorum of them, the token is already where a
                    // write-back would put it.
                    Some(f)
                        if self.read.holders() >= quorum(self.config.nodes.len())
                            && now < until =>
                    {
                        let grant = self.grant(Some(f));
                        self.finish(Ok(grant))
                    }
                    Some(_) => {
                        let tag = self.tag();
                        // Must be won before the lock's validity ends; it sets no TTL.
                        self.fanout.start(tag, now, None, Some(until));
                        self.state = State::WriteBack;
                        self.advance(now, rng);
                    }
                    // Not reached: a won round had a quorum of granting nodes, each with a
                    // counter.
                    None => self.lost(
                        Error::QuorumUnreachable {
                            quorum: quorum(self.config.nodes.len()),
                            nodes: self.config.nodes.len(),
                            failures: Vec::new(),
                        },
                        now,
                        rng,
                    ),
                }
            }
            _ => {
                let error = self.fanout.loss(self.config);
                self.lost(error, now, rng)
            }
        }
    }

    /// The nodes that a won semaphore attempt gives its slot back on: every node but the first
    /// `q` that granted it (by index), when the semaphore has fewer slots per node than
    /// permits. Those that refused or have not answered yet are sent the undo too, so that a
    /// grant that comes late (the undo is pipelined behind the acquire on each connection)
    /// is given back as well; where the token is not, the undo does nothing.
    fn surplus_nodes(&self) -> u64 {
        let Keys::Semaphore {
            permits,
            capacity,
            quorum,
            ..
        } = self.spec.keys
        else {
            return 0;
        };
        if capacity >= permits {
            return 0;
        }
        let mut kept = 0;
        let mut surplus = 0u64;
        for (node, vote) in self.fanout.round().votes().iter().enumerate().take(64) {
            if kept < quorum && matches!(vote, Some(Vote::Yes)) {
                kept += 1;
            } else {
                surplus |= 1 << node;
            }
        }
        surplus
    }

    fn grant(&self, fencing_token: Option<u64>) -> Grant {
        Grant {
            token: self.token,
            valid_until: self.valid_until,
            fencing_token,
        }
    }

    /// The current attempt was lost with `error` at `now`.
    fn lost(&mut self, error: Error, now: Instant, rng: &mut dyn Entropy) {
        let round = self.fanout.round();
        let split = round.granted() > 0;
        if self.wake.after(round.votes(), self.token.as_bytes()) {
            self.woken = true;
        }
        // Redlock's step 5: unlock every node, even those that said no or did not answer.
        self.cleanup = Some(self.token);
        // Misconfigured nodes stay so: waiting cannot make a quorum.
        if error.is_config() {
            return self.finish(Err(error));
        }
        let delay =
            timings::backstop_delay(rng, self.config.retry_delay, self.retry.remaining(now));
        let Some(backstop) = self.retry.next_attempt(now, delay) else {
            let error = match self.retry.ended_by() {
                Some(deadline) => Error::WaitEnded {
                    deadline,
                    last: Box::new(error),
                },
                None => error,
            };
            return self.finish(Err(error));
        };
        if !self.subscribed && error.is_contended() {
            // From now on every release is announced to us; try again at once once the
            // subscription is confirmed, since a release may have come before it did. This
            // retry stands for such a release: it is not counted.
            self.subscribed = true;
            self.subscribe = true;
            self.state = State::Subscribing {
                until: timings::subscribed_by(now, self.config.node_timeout),
            };
            return;
        }
        if !split {
            self.quick = 0;
        } else {
            self.split_seen = true;
            // Some nodes granted, too few. Without a fair queue, waiters collided: spread the
            // next retries over a window that doubles with each split, so they drift apart.
            // With one, only the head can win anywhere, so the vote split because a release
            // had not reached every node yet, and its announcement may already be spent:
            // retry soon without waiting for one, a few times in a row, then wait as after any
            // other refusal (a lock held on a minority of nodes keeps splitting the vote).
            self.spread = timings::spread_after_split(self.spread, self.config.retry_delay);
            if self.fair.is_some() && self.quick < QUICK_SPLIT_RETRIES {
                self.quick += 1;
                self.state = State::Pausing {
                    until: timings::pause_until(rng, self.spread, now, backstop),
                };
                return;
            }
        }
        self.state = State::Waiting { backstop };
        if self.woken && self.is_next() {
            self.count_wakeup();
            self.on_wake(now, rng);
        }
    }

    /// Whether a release may let this waiter in: always, but for a fair waiter that still
    /// expects releases ahead of it.
    fn is_next(&self) -> bool {
        self.fair.is_none() || self.ranks.ahead(quorum(self.config.nodes.len())) == 0
    }

    /// Records the rank that `node`'s `reply` to the current attempt gives, even one that comes
    /// after the round was decided: if it shows that a release already announced may let this
    /// waiter in, it retries now.
    fn record_rank(
        &mut self,
        node: usize,
        what: &What,
        reply: &Reply<'_>,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        let Some(cmd) = self.cmd(what) else {
            return;
        };
        let Some(rank) = self.spec.with_op(cmd, |op| op.queue_rank(reply)) else {
            return;
        };
        let was_next = self.is_next();
        self.ranks.record(node, rank);
        if matches!(self.state, State::Waiting { .. }) && self.woken && !was_next && self.is_next()
        {
            self.count_wakeup();
            self.on_wake(now, rng);
        }
    }

    fn count_wakeup(&self) {
        if let Some(stats) = self.stats {
            stats.wakeup();
        }
    }

    /// A release that may help was announced while waiting.
    fn on_wake(&mut self, now: Instant, rng: &mut dyn Entropy) {
        let State::Waiting { backstop } = self.state else {
            return;
        };
        if self.spread.is_zero() {
            self.start_attempt(now, rng);
        } else {
            self.state = State::Pausing {
                until: timings::pause_until(rng, self.spread, now, backstop),
            };
        }
    }

    fn finish(&mut self, result: Result<Grant, Error>) {
        if self.fair.is_some() {
            // Entries left behind, on nodes that refused or answered after the decision, would
            // keep this waiter the head there until they expire.
            self.leave = (0, self.spec.queues());
        }
        // Won: nodes that refused still hold the intent. Lost: every node may. Either way it
        // must not keep readers out any longer.
        self.withdraw = self.intent_ms > 0;
        self.unsubscribe = self.subscribed;
        self.outcome = Some(result);
        self.state = State::Done;
    }

    fn cmd<'s>(&'s self, what: &'s What) -> Option<Cmd<'s>> {
        let waiter = self.waiter.as_bytes();
        Some(match what {
            What::Acquire { token } => Cmd::Acquire {
                ids: AttemptIds {
                    waiter,
                    token: token.as_bytes(),
                },
                ttl_ms: self.params.ttl_ms,
                fair: self.fair.as_ref(),
                intent_ms: self.intent_ms,
                native: matches!(self.config.rw_policy, RwPolicy::ReadPreferring),
                read: &self.read,
            },
            What::Cleanup { token } | What::GiveBack { token } => Cmd::Cleanup {
                ids: AttemptIds {
                    waiter,
                    token: token.as_bytes(),
                },
                // Still waiting: the intent stays. Given up: it is withdrawn after this.
                intent_ms: self.intent_ms,
            },
            What::Leave { key } => Cmd::Leave { waiter, key: *key },
            What::Withdraw => Cmd::Withdraw { waiter },
            What::FenceWrite { token, value } => Cmd::FenceWrite {
                token: token.as_bytes(),
                value: *value,
            },
            _ => return None,
        })
    }

    /// What the current fan-out sends.
    fn fanout_what(&self) -> What {
        match self.state {
            State::WriteBack => What::FenceWrite {
                token: self.token,
                value: self.read.token().unwrap_or_default(),
            },
            _ => What::Acquire { token: self.token },
        }
    }
}

impl WakeFilter {
    /// Narrows what wakes this waiter to what can help its next attempt, after an attempt with
    /// `token` that was decided with `votes`: announcements from the nodes that refused it or
    /// failed, and not those of its own cleanups. A node that granted the attempt, or had not
    /// answered yet, is not waited for; the other waiters' lost attempts announce their
    /// cleanups there, and waking for those would make the losers of a split vote (or of a
    /// round that too few nodes could answer) wake each other for as long as the winner holds
    /// the lock (or the nodes stay down).
    ///
    /// Returns whether one of those nodes announced a release after the attempt went out.
    /// That announcement is news for the next attempt, even if the same release was
    /// announced by another node before: the nodes run a release one after another, and a
    /// node that had not run it yet refuses an attempt that another node's announcement set
    /// off, then runs it and announces it.
    fn after(&mut self, votes: &[Option<Vote>], token: &[u8]) -> bool {
        self.nodes = votes
            .iter()
            .enumerate()
            .filter(|(i, v)| *i < 64 && matches!(v, Some(Vote::No | Vote::Failed(_))))
            .fold(0, |mask, (i, _)| mask | 1 << i);
        let mut id = [0; WAKE_ID_LEN];
        let n = token.len().min(WAKE_ID_LEN);
        id[..n].copy_from_slice(&token[..n]);
        if self.own[0] != id {
            self.own = [id, self.own[0]];
        }
        self.heard & self.nodes != 0
    }

    /// Whether `message` from `node` is someone's release: not one of this waiter's own
    /// cleanups, from a node in range.
    fn admits(&self, node: usize, message: &[u8]) -> bool {
        node < 64 && !self.own.iter().any(|o| o[..] == *message)
    }

    /// While an attempt is in flight, `node` announced a release: news for that attempt only
    /// if it came after the attempt went out (before, the attempt sees its effect), and then
    /// only if `node` does not grant it, which [`after`](Self::after) tells. Returns whether
    /// it is news.
    fn heard_during_attempt(&mut self, node: usize) -> bool {
        if self.out {
            self.heard |= 1 << node;
        }
        self.out
    }

    /// Whether an announcement from `node`, between attempts, may help the next one: `node`
    /// refused or failed the last.
    fn refused_by(&self, node: usize) -> bool {
        self.nodes & 1 << node != 0
    }
}

impl Machine for Acquisition<'_> {
    type Output = Result<Grant, Error>;

    fn handle_reply(
        &mut self,
        node: usize,
        tag: Tag,
        reply: &Reply<'_>,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        if tag != self.fanout.tag() || matches!(self.state, State::Done) {
            return;
        }
        let what = self.fanout_what();
        if self.fair.is_some() && self.state != State::WriteBack {
            self.record_rank(node, &what, reply, now, rng);
        }
        if !matches!(self.state, State::Attempt | State::WriteBack) {
            return;
        }
        let Some(cmd) = self.cmd(&what) else {
            return;
        };
        let verdict = self.spec.with_op(cmd, |op| op.classify(reply));
        self.fanout.handle_verdict(node, tag, verdict, now);
        self.advance(now, rng);
    }

    fn replies_wanted(&self) -> usize {
        // A fair waiter reads its rank from every reply.
        match self.state {
            State::Attempt | State::WriteBack if self.fair.is_none() => {
                self.fanout.replies_wanted()
            }
            _ => 1,
        }
    }

    fn handle_failure(
        &mut self,
        node: usize,
        tag: Tag,
        why: NodeErrorKind,
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        if !matches!(self.state, State::Attempt | State::WriteBack) {
            return;
        }
        self.fanout.handle_failure(node, tag, why, now);
        self.advance(now, rng);
    }

    fn handle_timeout(&mut self, now: Instant, rng: &mut dyn Entropy) {
        match self.state {
            State::Attempt | State::WriteBack => {
                self.fanout.handle_timeout(now);
                self.advance(now, rng);
            }
            State::Subscribing { until } | State::Pausing { until } if now >= until => {
                self.start_attempt(now, rng)
            }
            State::Waiting { backstop } if now >= backstop => {
                // No release was announced within the retry delay: this retry counts against
                // the retry count. Or a fair waiter let the releases announced pass, still
                // behind others: the queue is moving, and it does not count.
                if !self.woken {
                    self.retry.count_retry();
                }
                self.start_attempt(now, rng);
            }
            _ => {}
        }
    }

    /// A release announced on `channel`: retried for when it is on one of this lock's wake
    /// channels, comes from a node that refused or failed the last attempt, and is not one of
    /// this waiter's own cleanups; and for a fair waiter, when it is the last of the releases
    /// its rank said were ahead of it. While an attempt is in flight, an announcement that
    /// came after it went out is kept for when the attempt is lost: from a node that refused
    /// it, it sets off the next attempt then. One release announced by every node sets off
    /// one retry when the announcements come together (the retry goes out after them), and
    /// more only when a node announces it after it refused the retry.
    fn handle_wake(
        &mut self,
        node: usize,
        channel: &[u8],
        message: &[u8],
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        if self.state == State::Done
            || !self.spec.is_wake_channel(channel)
            || !self.wake.admits(node, message)
        {
            return;
        }
        if matches!(self.state, State::Attempt | State::WriteBack) {
            // Counted towards a fair waiter's rank, which the attempt's answers may predate.
            if self.wake.heard_during_attempt(node) && self.fair.is_some() {
                self.ranks.release_seen(message);
            }
            return;
        }
        if !self.wake.refused_by(node) {
            return;
        }
        self.woken = true;
        if self.fair.is_some() {
            self.ranks.release_seen(message);
        }
        if matches!(self.state, State::Waiting { .. }) && self.is_next() {
            self.count_wakeup();
            self.on_wake(now, rng);
        }
    }

    /// Ends the acquisition with [`Error::Cancelled`] at once, wherever it is. An attempt in
    /// flight is undone on every node (its cleanup goes out behind it on each connection,
    /// so it lands after the attempt even where the attempt has not been answered yet), a
    /// fair waiter leaves its queues, a writer withdraws its intent. One whose first attempt
    /// has not gone out yet sends nothing at all.
    fn handle_cancel(&mut self, _now: Instant, _rng: &mut dyn Entropy) {
        if let Some(stats) = self.stats.filter(|_| self.state != State::Done) {
            stats.cancellation();
        }
        match self.state {
            State::Done => {}
            State::Attempt | State::WriteBack => {
                let sent = self.fanout.abandon();
                if !sent && self.attempts == 1 && self.state == State::Attempt {
                    // Nothing went out: nothing to undo.
                    self.outcome = Some(Err(Error::Cancelled));
                    self.state = State::Done;
                    return;
                }
                // A write-back follows a won attempt: that attempt is undone too. An attempt
                // not sent yet needs no undoing (the one before it was undone when lost).
                if sent || self.state == State::WriteBack {
                    self.cleanup = Some(self.token);
                }
                self.finish(Err(Error::Cancelled));
            }
            // The last attempt's cleanup went out when it was lost.
            State::Subscribing { .. } | State::Pausing { .. } | State::Waiting { .. } => {
                self.finish(Err(Error::Cancelled))
            }
        }
    }

    fn handle_subscribed(&mut self, now: Instant, rng: &mut dyn Entropy) {
        if let State::Subscribing { .. } = self.state {
            self.start_attempt(now, rng);
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        // Replies to these are dropped; scripts go with their body so none needs reading.
        let discard = |to, what| {
            Some(Transmit {
                to,
                tag: None,
                form: ScriptForm::Body,
                what,
                redo: None,
            })
        };
        // Every resend of an attempt comes before that attempt's own cleanup; the cleanup of
        // an attempt that a new one replaced comes before the new one. A node that granted
        // the lost attempt, too late to count, holds its value until the cleanup runs there:
        // a retry that got there first would be refused by the waiter's own lock, and the
        // release that follows is the waiter's own, which wakes nobody. And the new attempt
        // may be lost while it is being sent (a node that cannot take it fails it at once):
        // its own cleanup must not take the place of one that has not gone out yet.
        //
        // A cleanup is a compare-and-delete: sent again on a node's next connection if the one
        // it went on breaks first, until what the attempt may have set there has expired.
        let cleanup = |token, start: Instant, ttl_ms: u64| {
            Some(Transmit {
                to: To::All,
                tag: None,
                form: ScriptForm::Body,
                what: What::Cleanup { token },
                redo: Some(start + Duration::from_millis(ttl_ms)),
            })
        };
        let start = self.fanout.round().start();
        if let Some(token) = self.cleanup.take_if(|t| *t != self.token) {
            return cleanup(token, start, self.params.ttl_ms);
        }
        if let Some((to, tag, form)) = self.fanout.poll_transmit() {
            self.wake.out = true;
            return Some(Transmit {
                to,
                tag: Some(tag),
                form,
                what: self.fanout_what(),
                redo: None,
            });
        }
        if let Some(token) = self.cleanup.take() {
            return cleanup(token, start, self.params.ttl_ms);
        }
        if self.surplus != 0 {
            // After the attempt's resends, as an attempt's cleanup; owed as one is, on the
            // node's next connection if this one breaks first. By digest, as a release: one
            // goes out with every uncontended acquire, and the endpoint sends it again with
            // its body should the node answer `NOSCRIPT`, as for every compare-and-delete it
            // keeps.
            let node = self.surplus.trailing_zeros() as usize;
            self.surplus &= !(1 << node);
            return Some(Transmit {
                to: To::Node(node),
                tag: None,
                form: ScriptForm::Sha,
                what: What::GiveBack { token: self.token },
                redo: Some(start + Duration::from_millis(self.params.ttl_ms)),
            });
        }
        if self.subscribe {
            self.subscribe = false;
            return discard(To::Subscribers, What::Subscribe);
        }
        if self.leave.0 < self.leave.1 {
            self.leave.0 += 1;
            return discard(
                To::All,
                What::Leave {
                    key: self.leave.0 - 1,
                },
            );
        }
        if std::mem::take(&mut self.withdraw) {
            // Owed as a compare-and-delete is (it removes only this waiter's id): sent again on
            // a node's next connection if the one it went on breaks first, behind the cleanups
            // owed there, for as long as an intent they or the attempts left may live.
            return Some(Transmit {
                to: To::All,
                tag: None,
                form: ScriptForm::Body,
                what: What::Withdraw,
                redo: Some(start + Duration::from_millis(self.params.ttl_ms + self.intent_ms)),
            });
        }
        if std::mem::take(&mut self.unsubscribe) {
            return discard(To::Subscribers, What::Unsubscribe);
        }
        None
    }

    fn encode(&self, t: &Transmit, caps: Caps, out: &mut Vec<u8>) -> usize {
        match t.what {
            What::Subscribe => self.spec.write_channels(out, true, caps),
            What::Unsubscribe => {
                self.spec.write_channels(out, false, caps);
                0
            }
            what => match self.cmd(&what) {
                Some(cmd) => self
                    .spec
                    .with_op(cmd, |op| op.encode_for(out, t.form, caps)),
                None => {
                    // Not a command of an acquisition: a harmless one keeps the replies in
                    // step.
                    resp::encode_command(out, &[b"PING"]);
                    0
                }
            },
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Attempt | State::WriteBack => self.fanout.poll_timeout(),
            State::Subscribing { until } | State::Pausing { until } => Some(until),
            State::Waiting { backstop } => Some(backstop),
            State::Done => None,
        }
    }

    fn poll_outcome(&mut self) -> Option<Result<Grant, Error>> {
        self.outcome.take()
    }
}
