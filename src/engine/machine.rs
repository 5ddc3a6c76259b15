//! What a driver sees of an engine state machine: the inputs it feeds, the transmits and
//! deadlines it polls, and the outcome.
//!
//! A machine runs one lock operation end to end (an acquisition, an extend, a release). It
//! never touches a socket or reads the clock or a random source: every input brings `now`,
//! and those that may draw randomness bring the [`Entropy`] to draw from. A driver uses it in
//! this order, until [`poll_outcome`](Machine::poll_outcome) gives the outcome:
//!
//! 1. [`poll_transmit`](Machine::poll_transmit) until `None`, writing each transmit for its
//!    nodes with [`encode`](Machine::encode), and telling the machine at once (with
//!    [`handle_failure`](Machine::handle_failure)) of a node that cannot be sent a tagged one;
//! 2. [`poll_outcome`](Machine::poll_outcome): once it is `Some`, the operation is over;
//! 3. wait for input until [`poll_timeout`](Machine::poll_timeout), feeding each reply (matched
//!    to its transmit's tag, in order, per node), each failed node, each message on a wake
//!    channel, the confirmation of subscriptions, and [`handle_timeout`](Machine::handle_timeout)
//!    once that instant has passed; then back to 1.
//!
//! The driver never reads a reply's meaning; it only matches replies to tags. A node that
//! answers a script by digest with `NOSCRIPT` is sent the script again with its body: the
//! machine says so with a new transmit to that node, under the same tag.
#![forbid(unsafe_code)]

use std::time::Instant;

use crate::engine::ops::{Caps, ScriptForm};
use crate::error::NodeErrorKind;
use crate::resp::Reply;
use crate::rng::{Entropy, Token};

/// Which transmit a reply answers, as the machine numbered its transmits.
pub(crate) type Tag = u32;

/// Where a transmit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum To {
    /// Every node's command connection.
    All,
    /// One node's command connection.
    Node(usize),
    /// Every node's subscriber connection (wake channels).
    Subscribers,
}

/// One command for the driver to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transmit {
    /// Where it goes.
    pub to: To,
    /// The tag its replies are fed back with; `None` when nobody reads them (a cleanup, a
    /// queue leave, a subscription), so the driver reads and drops them.
    pub tag: Option<Tag>,
    /// How a script goes: by digest, or with its body.
    pub form: ScriptForm,
    /// What it is, for [`Machine::encode`]; the driver does not look inside.
    pub what: What,
    /// For a compare-and-delete (a release, the cleanup of a lost attempt, an undo): until
    /// when it is worth sending again on a node's next connection, if the connection it went
    /// on breaks before its reply comes (after that, what it deletes has expired anyway).
    /// Repeating it is safe: it deletes only what holds this lock's token. `None` for every
    /// other command.
    pub redo: Option<Instant>,
}

/// The commands of a lock's lifecycle, with the values that change from attempt to attempt
/// (the rest comes from the machine's lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    /// An acquisition attempt with this token.
    Acquire { token: Token },
    /// Undoes a lost attempt with this token (and refreshes a waiting writer's intent).
    Cleanup { token: Token },
    /// Gives back, on one node, the slot that the won semaphore attempt with this token was
    /// granted there beyond its quorum: the same compare-and-delete as the holder's release
    /// (and encoded as a [`Cleanup`](What::Cleanup)), so that once the node has answered it, a
    /// release of this token has nothing left to do there (see `Endpoint::step`).
    GiveBack { token: Token },
    /// A fair waiter leaves the queue of the lock's key number `key`.
    Leave { key: usize },
    /// A write-preferring writer withdraws its intent.
    Withdraw,
    /// Raises the fence counter to `value` where the lock still holds `token`.
    FenceWrite { token: Token, value: u64 },
    /// Resets the TTL of the lock held with `token`.
    Extend { token: Token, ttl_ms: u64 },
    /// Releases the lock held with `token`.
    Release { token: Token },
    /// Turns the write lock held with `token` into a read lock with the same token.
    Downgrade { token: Token, ttl_ms: u64 },
    /// Undoes a lost downgrade of the write lock held with `token`.
    DowngradeUndo { token: Token },
    /// Subscribes to the lock's wake channels.
    Subscribe,
    /// Leaves the lock's wake channels.
    Unsubscribe,
    /// Counts a semaphore's live holders.
    Count,
}

/// One lock operation as a state machine (see the module docs for the call order).
pub(crate) trait Machine {
    /// What the operation comes to.
    type Output;

    /// `reply` is node `node`'s answer to the transmit tagged `tag`.
    fn handle_reply(
        &mut self,
        node: usize,
        tag: Tag,
        reply: &Reply<'_>,
        now: Instant,
        rng: &mut dyn Entropy,
    );

    /// Node `node` will not answer the transmit tagged `tag`: it could not be sent, or the
    /// connection failed before the reply came.
    fn handle_failure(
        &mut self,
        node: usize,
        tag: Tag,
        why: NodeErrorKind,
        now: Instant,
        rng: &mut dyn Entropy,
    );

    /// The instant from [`poll_timeout`](Self::poll_timeout) has passed.
    fn handle_timeout(&mut self, now: Instant, rng: &mut dyn Entropy);

    /// How many more replies the machine needs before one of them can change what it does:
    /// a driver serving many callers may hold its replies back until that many have come.
    /// An error reply, a failure, a wake message, a cancel and every deadline still reach it
    /// at once. The default, 1, asks for each reply as it comes.
    #[must_use]
    fn replies_wanted(&self) -> usize {
        1
    }

    /// Node `node` published `message` on `channel`, a channel this machine subscribed to.
    fn handle_wake(
        &mut self,
        node: usize,
        channel: &[u8],
        message: &[u8],
        now: Instant,
        rng: &mut dyn Entropy,
    ) {
        let _ = (node, channel, message, now, rng);
    }

    /// Every subscription of the last [`To::Subscribers`] transmit that could be sent is
    /// confirmed (also when none could be sent).
    fn handle_subscribed(&mut self, now: Instant, rng: &mut dyn Entropy) {
        let _ = (now, rng);
    }

    /// The caller gave up on the operation (a cancel handle was cancelled): it ends as soon
    /// as it can, undoing what it has on the nodes. Machines that cannot be cancelled ignore
    /// it.
    fn handle_cancel(&mut self, now: Instant, rng: &mut dyn Entropy) {
        let _ = (now, rng);
    }

    /// The next command to send.
    #[must_use]
    fn poll_transmit(&mut self) -> Option<Transmit>;

    /// Writes `t` for a node whose server offers `caps`. For a command, returns how many
    /// commands it wrote before the last one, whose reply carries the tag (the replies to
    /// those before it are read and dropped); for a subscription, how many confirmations each
    /// node sends.
    fn encode(&self, t: &Transmit, caps: Caps, out: &mut Vec<u8>) -> usize;

    /// When [`handle_timeout`](Self::handle_timeout) has work to do; `None` once over.
    #[must_use]
    fn poll_timeout(&self) -> Option<Instant>;

    /// The outcome, once the operation is over (given once).
    #[must_use]
    fn poll_outcome(&mut self) -> Option<Self::Output>;
}
