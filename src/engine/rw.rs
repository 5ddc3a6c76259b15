//! Read-write locks over the Redlock quorum: the keys, the scripts, and what each reply means.
//!
//! Seed 000 extends Redlock to many readers or one writer. Per resource `K` there are three keys
//! (see [`RwKeys`], named in [`keys`]): the writer key holds the writer's token with a `PX` expiry; the reader set
//! is a sorted set of reader tokens, each scored by the instant it expires; the intent set is a
//! sorted set of waiting writers' ids, scored the same way, used by the write-preferring
//! policy only.
//!
//! # Whose clock scores a reader
//!
//! The seed scores readers by the client's wall clock. Then a client whose clock runs ahead
//! writes expiries far in the future, and a client whose clock runs behind prunes live readers
//! as expired when it tries to write: one skewed client extends or shortens every other
//! reader's hold, and a writer may enter while readers still work. Every script here reads the
//! node's own clock (`TIME`) instead, and the client sends only durations. A score is then
//! compared only with the clock of the node that wrote it, exactly as a `PX` expiry is, and no
//! client clock is trusted at all. (Scripts that read `TIME` and then write are fine since Redis
//! 5: effects, not scripts, are replicated, and 7.0 has no other mode.)
//!
//! # Writer starvation
//!
//! With [`intent_ms`](WriteAcquire::intent_ms) at zero the lock is read-preferring, as in the
//! seed: a writer waits until no reader holds the lock on a quorum, which a steady stream of
//! overlapping readers can postpone forever. With it above zero, a writer that fails on a node
//! leaves its waiter id (the token of its first attempt, the same on every attempt, while each
//! attempt sets a token of its own as the lock's value) in the intent set there, with an
//! expiry `intent_ms` ahead; new readers are
//! refused on that node while a live intent is there, so the readers in place drain and the
//! writer gets in. The writer refreshes its intent on every attempt and withdraws it when it
//! succeeds or gives up; if it dies, the intent expires on its own.
//!
//! Behind a fair queue (`engine::fair`), the queue outranks intents. The queue already serves
//! readers and writers in arrival order, and a writer that waits behind a reader refreshes its
//! intent at every lost attempt; if that intent refused the reader at the head, the reader
//! would wait for the writer while the queue makes the writer wait for the reader. So
//! [`FAIR_READ_ACQUIRE`] ignores intents for a reader the queue lets through, and only a reader
//! outside the queue (one that did not join an empty queue) heeds them.
#![forbid(unsafe_code)]

use crate::engine::fair::{AttemptIds, FairState, QueueKeys};
use crate::engine::keys;
pub use crate::engine::keys::RwKeys;
use crate::engine::ops::{int_verdict, write_eval, Arg, Caps, Op, ScriptForm, Verdict, RELEASE};
pub use crate::engine::scripts::{
    FAIR_READ_ACQUIRE, FAIR_WRITE_ACQUIRE, READ_ACQUIRE, READ_EXTEND, SET_RELEASE, WRITE_ACQUIRE,
    WRITE_CLEANUP,
};
use crate::engine::Vote;
use crate::resp::{self, Reply};

/// Write acquire; see [`WRITE_ACQUIRE`].
#[derive(Debug, Clone, Copy)]
pub struct WriteAcquire<'a> {
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// This attempt's token, and the waiter's id, which names its intent.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// How long a failed attempt's intent lives, in ms; zero for the read-preferring policy.
    pub intent_ms: u64,
}

impl Op for WriteAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let k = self.keys;
        write_eval(
            out,
            &WRITE_ACQUIRE,
            form,
            &[k.writer(), k.readers(), k.intents()],
            &[
                Arg::Bytes(self.ids.token),
                Arg::Num(self.ttl_ms),
                Arg::Num(self.intent_ms),
                Arg::Bytes(self.ids.waiter),
            ],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// Cleanup after a lost write attempt; see [`WRITE_CLEANUP`].
#[derive(Debug, Clone, Copy)]
pub struct WriteCleanup<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The attempt's token, and the waiter's id, which names its intent.
    pub ids: AttemptIds<'a>,
    /// As in [`WriteAcquire::intent_ms`].
    pub intent_ms: u64,
}

impl Op for WriteCleanup<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &WRITE_CLEANUP,
            form,
            &[self.keys.writer(), self.keys.intents()],
            &[
                Arg::Bytes(self.ids.token),
                Arg::Wake(self.resource),
                Arg::Num(self.intent_ms),
                Arg::Bytes(self.ids.waiter),
            ],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// Writer release: compare-and-delete of the writer key. `DELEX key IFEQ token` on a node that
/// has it (Redis 8.4), the mutex's `RELEASE` script elsewhere. Every integer is an
/// acknowledgement.
///
/// `DELEX` cannot announce the release itself, so a `PUBLISH` on the wake channel is pipelined
/// right behind it.
#[derive(Debug, Clone, Copy)]
pub struct WriteRelease<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The writer's token.
    pub token: &'a [u8],
}

impl Op for WriteRelease<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &RELEASE,
            form,
            &[self.keys.writer()],
            &[Arg::Bytes(self.token), Arg::Wake(self.resource)],
        );
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.delex {
            self.encode(out, form);
            return 0;
        }
        resp::encode_command(out, &[b"DELEX", self.keys.writer(), b"IFEQ", self.token]);
        // `DELEX` is no script, so the announcement follows it in the same write. It is made
        // even when nothing was deleted; a waiter woken for nothing only retries once.
        resp::write_array_len(out, 3);
        resp::write_bulk(out, b"PUBLISH");
        keys::wake_channel(self.resource).write_bulk(out);
        resp::write_bulk(out, &self.token[..self.token.len().min(16)]);
        1
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        ack_verdict(reply)
    }
}

/// Every integer acknowledges a release: 0 only means there was nothing of ours on that node.
fn ack_verdict(reply: &Reply<'_>) -> Verdict {
    match reply {
        Reply::Integer(0 | 1) => Verdict::Vote(Vote::Yes),
        other => int_verdict(other),
    }
}

/// Read acquire; see [`READ_ACQUIRE`].
#[derive(Debug, Clone, Copy)]
pub struct ReadAcquire<'a> {
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// This attempt's token.
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for ReadAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let k = self.keys;
        write_eval(
            out,
            &READ_ACQUIRE,
            form,
            &[k.writer(), k.readers(), k.intents()],
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// Removes a member from one of the lock's sorted sets; see [`SET_RELEASE`]. Reader release
/// (a token, from the reader set) and intent withdrawal (a waiter id, from the intent set).
#[derive(Debug, Clone, Copy)]
pub struct SetRelease<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The sorted set: [`RwKeys::readers`] or [`RwKeys::intents`].
    pub set: &'a [u8],
    /// The member to remove: a reader's token, or a writer's waiter id.
    pub token: &'a [u8],
}

impl Op for SetRelease<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &SET_RELEASE,
            form,
            &[self.set],
            &[Arg::Bytes(self.token), Arg::Wake(self.resource)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        ack_verdict(reply)
    }
}

/// Reader extend; see [`READ_EXTEND`]. (The writer extends with the mutex's `Extend` on
/// [`RwKeys::writer`].)
#[derive(Debug, Clone, Copy)]
pub struct ReadExtend<'a> {
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The reader's token.
    pub token: &'a [u8],
    /// The new TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for ReadExtend<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &READ_EXTEND,
            form,
            &[self.keys.readers()],
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// A fair read or write acquisition: the plain one's vote, behind the fair queue.
#[derive(Debug)]
pub struct FairRwAcquire<'a> {
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// This attempt's token, and the waiter's id (its queue entry and, for a writer, intent).
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// For a writer, as in [`WriteAcquire::intent_ms`]; unused for a reader.
    pub intent_ms: u64,
    /// Place in the queue and what goes with it, kept across attempts.
    pub fair: &'a FairState,
    /// The queue entry's kind: `r` or `w`.
    kind: &'static [u8],
}

impl<'a> FairRwAcquire<'a> {
    /// An attempt with `ids` at a fair write acquisition of the lock with `keys`.
    pub fn write(
        keys: &'a RwKeys,
        ids: AttemptIds<'a>,
        ttl_ms: u64,
        intent_ms: u64,
        fair: &'a FairState,
    ) -> Self {
        Self::new(b"w", keys, ids, ttl_ms, intent_ms, fair)
    }

    /// An attempt with `ids` at a fair read acquisition of the lock with `keys`.
    pub fn read(keys: &'a RwKeys, ids: AttemptIds<'a>, ttl_ms: u64, fair: &'a FairState) -> Self {
        Self::new(b"r", keys, ids, ttl_ms, 0, fair)
    }

    fn new(
        kind: &'static [u8],
        keys: &'a RwKeys,
        ids: AttemptIds<'a>,
        ttl_ms: u64,
        intent_ms: u64,
        fair: &'a FairState,
    ) -> Self {
        FairRwAcquire {
            keys,
            ids,
            ttl_ms,
            intent_ms,
            fair,
            kind,
        }
    }
}

impl Op for FairRwAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let k = self.keys;
        let script = if self.kind == b"w" {
            &FAIR_WRITE_ACQUIRE
        } else {
            &FAIR_READ_ACQUIRE
        };
        crate::engine::fair::write_eval_head(out, script, form, 5, 7);
        write_fair_keys(out, k, None);
        self.fair
            .write_args(out, self.ids, self.ttl_ms, Some(self.intent_ms));
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        self.fair.classify(reply)
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        crate::engine::fair::queued_rank(reply)
    }
}

/// Writes the KEYS of a fair read-write acquire script: writer, readers, intents, the fence
/// counter of a fenced writer, then the queue and its expiries (last, for the fair gate).
pub fn write_fair_keys(out: &mut Vec<u8>, keys: &RwKeys, fence: Option<&[u8]>) {
    for name in [keys.writer(), keys.readers(), keys.intents()] {
        resp::write_bulk(out, name);
    }
    if let Some(fence) = fence {
        resp::write_bulk(out, fence);
    }
    resp::write_bulk(out, keys.queue());
    resp::write_bulk(out, keys.queue_expiries());
}

/// The read-write lock's fair queue keys as the queue scripts take them: its writer key (whose
/// existence says whether a release is worth announcing), its queue and the queue's expiries.
pub fn queue_keys(keys: &RwKeys) -> QueueKeys<'_> {
    QueueKeys::Named {
        lock: keys.writer(),
        queue: keys.queue(),
        expiries: keys.queue_expiries(),
    }
}

/// Whether a `COMMAND INFO DELEX` reply says the server has `DELEX`: Redis answers with one
/// entry per name asked, a nil one for an unknown command.
pub fn delex_supported(reply: &Reply<'_>) -> bool {
    matches!(reply, Reply::Array(Some(items)) if matches!(items.first(), Some(Reply::Array(Some(_)))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NodeErrorKind;

    fn unexpected() -> Verdict {
        Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply))
    }

    #[test]
    fn the_writer_release_uses_delex_only_where_the_node_has_it() {
        let keys = RwKeys::new(b"k");
        let op = WriteRelease {
            resource: b"k",
            keys: &keys,
            token: b"t",
        };
        let mut out = Vec::new();
        // DELEX, then the announcement it cannot make itself: one more reply to drop.
        assert_eq!(
            op.encode_for(&mut out, ScriptForm::Sha, Caps { delex: true }),
            1
        );
        assert_eq!(
            out,
            &b"*4\r\n$5\r\nDELEX\r\n$8\r\n{rw:k}:w\r\n$4\r\nIFEQ\r\n$1\r\nt\r\n\
               *3\r\n$7\r\nPUBLISH\r\n$18\r\nredlock-mux:wake:k\r\n$1\r\nt\r\n"[..]
        );
        out.clear();
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, Caps::default()), 0);
        assert!(out.starts_with(b"*6\r\n$7\r\nEVALSHA\r\n"));
        assert_eq!(op.classify(&Reply::Integer(0)), Verdict::Vote(Vote::Yes));
        assert_eq!(op.classify(&Reply::Integer(1)), Verdict::Vote(Vote::Yes));
        assert_eq!(op.classify(&Reply::Simple(b"OK")), unexpected());
    }

    #[test]
    fn command_info_tells_whether_delex_exists() {
        // Redis 7.0 answers `*1\r\n$-1\r\n`.
        assert!(!delex_supported(&Reply::Array(Some(vec![Reply::Bulk(
            None
        )]))));
        assert!(delex_supported(&Reply::Array(Some(vec![Reply::Array(
            Some(vec![Reply::Bulk(Some(b"delex"))])
        )]))));
        assert!(!delex_supported(&Reply::Error(b"ERR unknown command")));
    }
}
