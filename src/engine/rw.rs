//! Read-write locks over the Redlock quorum: the keys, the scripts, and what each reply means.
//!
//! Seed 000 extends Redlock to many readers or one writer. Per resource `K` there are three keys
//! (see [`RwKeys`]): the writer key holds the writer's token with a `PX` expiry; the reader set
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

use crate::engine::fair::{AttemptIds, FairState, Leave, QueueKeys};
use crate::engine::ops::{
    has_hash_tag, int_verdict, write_eval, Arg, Caps, Op, ScriptForm, Verdict, RELEASE, WAKE_PREFIX,
};
pub use crate::engine::scripts::{
    FAIR_READ_ACQUIRE, FAIR_WRITE_ACQUIRE, READ_ACQUIRE, READ_EXTEND, SET_RELEASE, WRITE_ACQUIRE,
    WRITE_CLEANUP,
};
use crate::engine::Vote;
use crate::resp::{self, Reply};

/// The keys of one read-write lock, derived from its resource key `K`.
///
/// | `K` | writer | readers | intents |
/// |---|---|---|---|
/// | has a hash tag, e.g. `user:{42}` | `K:rw:w` | `K:rw:r` | `K:rw:wi` |
/// | has none, e.g. `invoice:42` | `{rw:K}:w` | `{rw:K}:r` | `{rw:K}:wi` |
///
/// Redis Cluster hashes only a key's hash tag: the bytes between its first `{` and the first
/// `}` after it, when there are any. The three keys of one lock always hash alike, because
/// their hash tag lies in the part they share: `K`'s own tag if it has one (so the lock sits in
/// the slot of the data it guards), or one that starts with `rw:` (so it is never empty, even
/// when `K` starts with `}`). The two forms end differently (`w:w`, `w:r`, `w:wi` against
/// `}:w`, `}:r`, `}:wi`), so two different resource keys never share a key. A mutex on `K`
/// itself uses `K` and does not exclude the read-write lock on `K`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwKeys {
    buf: Vec<u8>,
    /// Where each name ends in `buf`: writer, readers, intents, queue, queue expiries.
    ends: [usize; 5],
}

impl RwKeys {
    /// The keys for resource `key`, in one allocation.
    pub fn new(key: &[u8]) -> RwKeys {
        let (head, tail): (&[u8], &[u8]) = if has_hash_tag(key) {
            (b"", b":rw:")
        } else {
            (b"{rw:", b"}:")
        };
        let mut buf = Vec::with_capacity(5 * (head.len() + key.len() + tail.len()) + 8);
        let mut ends = [0; 5];
        for (end, suffix) in ends.iter_mut().zip([&b"w"[..], b"r", b"wi", b"q", b"qx"]) {
            buf.extend_from_slice(head);
            buf.extend_from_slice(key);
            buf.extend_from_slice(tail);
            buf.extend_from_slice(suffix);
            *end = buf.len();
        }
        RwKeys { buf, ends }
    }

    fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }

    /// The writer key: the writer's token, with a `PX` expiry.
    pub fn writer(&self) -> &[u8] {
        self.name(0)
    }

    /// The reader set: reader tokens scored by their expiry, in ms on the node's clock.
    pub fn readers(&self) -> &[u8] {
        self.name(1)
    }

    /// The intent set: waiting writers' ids scored by their expiry, in ms on the node's clock.
    pub fn intents(&self) -> &[u8] {
        self.name(2)
    }

    /// The fair queue: waiters (`r` or `w` followed by the waiter id) scored by ticket.
    pub fn queue(&self) -> &[u8] {
        self.name(3)
    }

    /// The fair queue's entries scored by their expiry, in ms on the node's clock.
    pub fn queue_expiries(&self) -> &[u8] {
        self.name(4)
    }

    /// The fair queue's keys as the queue scripts take them.
    pub fn queue_keys(&self) -> QueueKeys<'_> {
        QueueKeys::Named {
            lock: self.writer(),
            queue: self.queue(),
            expiries: self.queue_expiries(),
        }
    }
}

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
        resp::write_bulk_parts(out, &[WAKE_PREFIX, self.resource]);
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
    leave: Leave<'a>,
}

impl<'a> FairRwAcquire<'a> {
    /// An attempt with `ids` at a fair write acquisition of the lock with `keys` on `resource`.
    pub fn write(
        resource: &'a [u8],
        keys: &'a RwKeys,
        ids: AttemptIds<'a>,
        ttl_ms: u64,
        intent_ms: u64,
        fair: &'a FairState,
    ) -> Self {
        Self::new(b"w", resource, keys, ids, ttl_ms, intent_ms, fair)
    }

    /// An attempt with `ids` at a fair read acquisition of the lock with `keys` on `resource`.
    pub fn read(
        resource: &'a [u8],
        keys: &'a RwKeys,
        ids: AttemptIds<'a>,
        ttl_ms: u64,
        fair: &'a FairState,
    ) -> Self {
        Self::new(b"r", resource, keys, ids, ttl_ms, 0, fair)
    }

    fn new(
        kind: &'static [u8],
        resource: &'a [u8],
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
            leave: Leave {
                resource,
                keys: keys.queue_keys(),
                kind,
                waiter: ids.waiter,
            },
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
        for name in [
            k.writer(),
            k.readers(),
            k.intents(),
            k.queue(),
            k.queue_expiries(),
        ] {
            resp::write_bulk(out, name);
        }
        resp::write_bulk(out, self.ids.token);
        resp::write_bulk_u64(out, self.ttl_ms);
        resp::write_bulk_u64(out, self.intent_ms);
        resp::write_bulk(out, self.ids.waiter);
        self.fair.write_args(out);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        self.fair.classify(reply)
    }

    fn on_retry(&self, waited: std::time::Duration) {
        self.fair.on_retry(waited);
    }

    fn on_finish(&self) -> Option<&dyn Op> {
        // As for the fair mutex: nodes may hold this waiter's entry unseen.
        Some(&self.leave)
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

    /// Redis Cluster's hash slot: CRC16 (XMODEM) of the hash tag, or of the whole key.
    fn slot(key: &[u8]) -> u16 {
        let mut hashed = key;
        if let Some(open) = key.iter().position(|&b| b == b'{') {
            if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
                if len > 0 {
                    hashed = &key[open + 1..open + 1 + len];
                }
            }
        }
        let mut crc: u16 = 0;
        for &b in hashed {
            crc ^= (b as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16384
    }

    const AWKWARD: &[&[u8]] = &[
        b"invoice:42",
        b"user:{42}:profile",
        b"{}x",
        b"}x",
        b"}",
        b"{",
        b"a{}b{c}",
        b"a}b",
        b"{rw:x}",
        b"x",
        b"{x}",
        b"{rw:{x}",
        b"w",
        b"a:rw:w",
    ];

    #[test]
    fn crc16_matches_the_cluster_spec_example() {
        // The Redis Cluster specification gives CRC16("123456789") = 0x31C3.
        assert_eq!(slot(b"123456789"), 0x31C3);
    }

    #[test]
    fn the_three_keys_share_a_slot_whatever_the_braces() {
        for key in AWKWARD {
            let k = RwKeys::new(key);
            let s = slot(k.writer());
            assert_eq!(s, slot(k.readers()), "{:?}", String::from_utf8_lossy(key));
            assert_eq!(s, slot(k.intents()), "{:?}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn a_key_with_a_hash_tag_keeps_its_slot() {
        let k = RwKeys::new(b"user:{42}:profile");
        assert_eq!(k.writer(), b"user:{42}:profile:rw:w");
        assert_eq!(k.readers(), b"user:{42}:profile:rw:r");
        assert_eq!(k.intents(), b"user:{42}:profile:rw:wi");
        assert_eq!(slot(k.writer()), slot(b"user:{42}:profile"));
        let k = RwKeys::new(b"invoice:42");
        assert_eq!(k.writer(), b"{rw:invoice:42}:w");
        assert_eq!(k.readers(), b"{rw:invoice:42}:r");
        assert_eq!(k.intents(), b"{rw:invoice:42}:wi");
    }

    #[test]
    fn different_resources_never_share_a_key() {
        let mut all: Vec<Vec<u8>> = Vec::new();
        for key in AWKWARD {
            let k = RwKeys::new(key);
            all.extend([
                k.writer().to_vec(),
                k.readers().to_vec(),
                k.intents().to_vec(),
            ]);
        }
        let before = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), before);
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
