//! Read-write locks over the Redlock quorum: the keys, the scripts, and what each reply means.
//!
//! The read-write lock design extends Redlock to many readers or one writer. Per resource `K` there are three keys
//! (see [`RwKeys`], named in [`keys`]): the writer key holds the writer's token with a `PX` expiry; the reader set
//! is a sorted set of reader tokens, each scored by the instant it expires; the intent set is a
//! sorted set of waiting writers' ids, scored the same way, used by the write-preferring
//! policy only.
//!
//! # Whose clock scores a reader
//!
//! The design scores readers by the client's wall clock. Then a client whose clock runs ahead
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
//! design: a writer waits until no reader holds the lock on a quorum, which a steady stream of
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
//!
//! # Native nodes (Redis 8)
//!
//! A node whose server has hash-field expiry (`HSETEX`, Redis 8.0; detected per node when its
//! connection is set up, with `COMMAND INFO DELEX HSETEX`) is *native*. There the
//! read-preferring lock, unfair and unfenced, sends no script:
//!
//! - **reader**: `HSETEX W PX ttl FIELDS 1 token 1`. Readers are fields of a hash at the
//!   writer key `W` itself, each with its own expiry on the node's clock. A writer's string at
//!   `W` makes it `WRONGTYPE`: a refusal.
//! - **writer**: `MULTI`, `HRANDFIELD W`, `SET W token NX PX ttl`, `EXISTS R`, `EXEC`. A grant
//!   only when the `SET` went through and the reader set `R` does not exist. `HRANDFIELD` deletes
//!   the expired fields of a reader hash (the server keeps a hash whose fields all expired until
//!   its expiry cycle or a field access removes it, and `SET NX` would fail on it meanwhile).
//! - **reader extend**: `MULTI`, `HPEXPIRE W ttl FIELDS 1 token`, [`READ_EXTEND`] on `R`,
//!   `EXEC`; **reader release**: `MULTI`, `HDEL W token`, `ZREM R token`, `PUBLISH`, `EXEC`,
//!   voted on by both deletes' replies (a lost attempt's cleanup announces nothing: without a
//!   script the announcement cannot depend on whether anything was removed). A reader's entry may be in either place on a native node (a hash
//!   field, or a member of `R` if it joined through a script or before the node was upgraded),
//!   so both are addressed and no guard has to remember which representation each node used.
//!   The scripted release ([`READ_RELEASE`]) addresses both too: a release may be written
//!   before its node's server is known (one kept for a cluster master whose link was never set
//!   up, such as the replica promoted in a failover, with the old master's readers) and still
//!   reach a native node. Neither brings back an entry that was deleted.
//! - **writer extend**: `MULTI`, [`EXTEND`](crate::engine::ops::EXTEND) on `W`, `EXISTS R`,
//!   `EXEC`: extended only where no reader set exists. Writer release and cleanup are the
//!   usual token-checked deletes; on a reader hash they meet `WRONGTYPE`: nothing of ours.
//!
//! Everything else keeps the scripts, on native nodes too: the fair queue, the write-preferring
//! policy (its readers must heed intents, which a native reader does not read), fencing, and
//! every node without `HSETEX`. `MULTI` is needed for the writer: in a plain pipeline another
//! client's commands may run between `SET` and `EXISTS`, and if `W` expired in between, the
//! `EXISTS` would vouch for a `W` that is someone else's by then.
//!
//! Why a writer and a reader (or two writers) never both hold, whatever mix of Redis 7 and 8
//! nodes and of native and scripted paths a resource sees, is argued in `DESIGN.md` ("The
//! read-write lock on Redis 8 nodes"), with what mixing costs.
#![forbid(unsafe_code)]

use crate::engine::fair::{AttemptIds, FairState, QueueKeys};
use crate::engine::keys;
pub use crate::engine::keys::RwKeys;
use crate::engine::ops::{
    int_verdict, write_eval, Arg, Caps, Extend, Op, ScriptForm, Verdict, RELEASE,
};
pub use crate::engine::scripts::{
    DOWNGRADE, DOWNGRADE_UNDO, FAIR_READ_ACQUIRE, FAIR_WRITE_ACQUIRE, READ_ACQUIRE, READ_EXTEND,
    READ_RELEASE, SET_RELEASE, WRITE_ACQUIRE, WRITE_CLEANUP,
};
use crate::engine::Vote;
use crate::error::NodeErrorKind;
use crate::resp::{self, Reply, ServerErrorKind};

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

    /// On a native node (see the module's "Native nodes"), a read-preferring writer goes
    /// without Lua: `MULTI`, `HRANDFIELD W`, `SET W token NX PX ttl`, `EXISTS R`, `EXEC`, voted
    /// on by `EXEC`. `HRANDFIELD` deletes the expired fields of a reader hash at `W` first (a
    /// hash whose fields all expired would otherwise still exist, and refuse the `SET`, until
    /// the server's expiry cycle deletes it); on a writer's string it is a harmless
    /// `WRONGTYPE`.
    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.hsetex || self.intent_ms > 0 {
            self.encode(out, form);
            return 0;
        }
        let k = self.keys;
        resp::encode_command(out, &[b"MULTI"]);
        resp::encode_command(out, &[b"HRANDFIELD", k.writer()]);
        resp::write_array_len(out, 6);
        resp::write_bulk(out, b"SET");
        resp::write_bulk(out, k.writer());
        resp::write_bulk(out, self.ids.token);
        resp::write_bulk(out, b"NX");
        resp::write_bulk(out, b"PX");
        resp::write_bulk_u64(out, self.ttl_ms);
        resp::encode_command(out, &[b"EXISTS", k.readers()]);
        resp::encode_command(out, &[b"EXEC"]);
        4
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            // `HRANDFIELD`'s answer (a field, nil, or `WRONGTYPE`) says nothing about the vote.
            Reply::Array(Some(items)) if !items.is_empty() => native_write_verdict(&items[1..]),
            other => int_verdict(other),
        }
    }
}

/// The vote of a native writer's `EXEC`: `[SET's reply, EXISTS R's reply]`. A grant only when
/// the writer key was set and no reader set exists; a writer key set beside a reader set is a
/// refusal (see the module's "Native nodes" for why it may stay until the writer lets go).
fn native_write_verdict(items: &[Reply<'_>]) -> Verdict {
    match items {
        [Reply::Simple(b"OK"), Reply::Integer(0)] => Verdict::Vote(Vote::Yes),
        [Reply::Simple(b"OK") | Reply::Bulk(None), Reply::Integer(_)] => Verdict::Vote(Vote::No),
        [Reply::Error(m), _] | [_, Reply::Error(m)] => {
            Verdict::Vote(Vote::Failed(crate::engine::ops::server_error(m)))
        }
        _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
    }
}

/// Whether `reply` is a `WRONGTYPE` error: the key holds the other side's representation (a
/// reader hash where a writer string was looked for, or the other way round).
fn is_wrong_type(reply: &Reply<'_>) -> bool {
    matches!(reply, Reply::Error(m) if ServerErrorKind::of(m) == ServerErrorKind::WrongType)
}

/// Writer extend: the mutex's compare-and-`PEXPIRE` ([`EXTEND`]) on the writer key. On a native
/// node it is voted on together with `EXISTS R` in one transaction (`MULTI`, the script by its
/// body, `EXISTS R`, `EXEC`): extended, and no reader set there. A native writer's `SET` may
/// have gone through on a node that refused it because of a reader set (see the module's
/// "Native nodes"); such a node must not count for the writer later either.
#[derive(Debug, Clone, Copy)]
pub struct WriteExtend<'a> {
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The writer's token.
    pub token: &'a [u8],
    /// The new TTL in milliseconds.
    pub ttl_ms: u64,
}

impl WriteExtend<'_> {
    fn script(&self) -> Extend<'_> {
        Extend {
            key: self.keys.writer(),
            token: self.token,
            ttl_ms: self.ttl_ms,
        }
    }
}

impl Op for WriteExtend<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.script().encode(out, form);
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.hsetex {
            self.encode(out, form);
            return 0;
        }
        resp::encode_command(out, &[b"MULTI"]);
        self.script().encode(out, ScriptForm::Body);
        resp::encode_command(out, &[b"EXISTS", self.keys.readers()]);
        resp::encode_command(out, &[b"EXEC"]);
        3
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        let Reply::Array(Some(items)) = reply else {
            return self.script().classify(reply);
        };
        match items.as_slice() {
            [Reply::Integer(1), Reply::Integer(0)] => Verdict::Vote(Vote::Yes),
            [Reply::Integer(_), Reply::Integer(_)] => Verdict::Vote(Vote::No),
            // The script's `GET` on a reader hash: nothing of ours there.
            [e, Reply::Integer(_)] if is_wrong_type(e) => Verdict::Vote(Vote::No),
            [Reply::Error(m), _] | [_, Reply::Error(m)] => {
                Verdict::Vote(Vote::Failed(crate::engine::ops::server_error(m)))
            }
            _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
        }
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
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        write_eval(
            out,
            WRITE_CLEANUP.announcing(caps.sharded),
            form,
            &[self.keys.writer(), self.keys.intents()],
            &[
                Arg::Bytes(self.ids.token),
                wake(self.resource, caps),
                Arg::Num(self.intent_ms),
                Arg::Bytes(self.ids.waiter),
            ],
        );
        0
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// Writer release: compare-and-delete of the writer key. `DELEX key IFEQ token` on a node that
/// has it (Redis 8.4), the mutex's `RELEASE` script elsewhere. Every integer is an
/// acknowledgement.
///
/// `DELEX` cannot announce the release itself, so a `PUBLISH` on the wake channel goes right
/// behind it in one transaction, whose `EXEC` carries `DELEX`'s reply: that is the vote.
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
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.delex {
            write_eval(
                out,
                RELEASE.announcing(caps.sharded),
                form,
                &[self.keys.writer()],
                &[Arg::Bytes(self.token), wake(self.resource, caps)],
            );
            return 0;
        }
        // `DELEX` is no script, so the announcement follows it in the same transaction. It is
        // made even when nothing was deleted; a waiter woken for nothing only retries once.
        // The vote is `DELEX`'s own reply, read from the `EXEC`: a node that refused the
        // delete (`READONLY`, `MISCONF`) aborts the transaction, and never acknowledges it.
        resp::encode_command(out, &[b"MULTI"]);
        resp::encode_command(out, &[b"DELEX", self.keys.writer(), b"IFEQ", self.token]);
        write_publish(out, self.resource, self.token, caps);
        resp::encode_command(out, &[b"EXEC"]);
        3
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            // `[DELEX's reply, PUBLISH's reply]`: the release is `DELEX`'s.
            Reply::Array(Some(items)) => match items.as_slice() {
                [delex, Reply::Integer(_)] => ack_verdict(delex),
                [_, Reply::Error(m)] => crate::engine::ops::error_verdict(m),
                _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
            },
            other => ack_verdict(other),
        }
    }
}

/// `PUBLISH` of a release of `token` on `resource`'s wake channel, for a release made without
/// a script; sent even when nothing was released (a waiter woken for nothing only retries once).
/// On a Redis Cluster member's master, `SPUBLISH` on the channel in the lock's slot: a
/// transaction's commands must all be in one slot there.
fn write_publish(out: &mut Vec<u8>, resource: &[u8], token: &[u8], caps: Caps) {
    resp::write_array_len(out, 3);
    resp::write_bulk(
        out,
        if caps.sharded {
            b"SPUBLISH"
        } else {
            b"PUBLISH"
        },
    );
    keys::wake_channel_for(resource, keys::Family::Rw, caps.sharded).write_bulk(out);
    resp::write_bulk(out, &token[..token.len().min(16)]);
}

/// The wake channel of the read-write lock on `resource`, for a node that offers `caps`.
fn wake(resource: &[u8], caps: Caps) -> Arg<'_> {
    Arg::Wake(keys::wake_channel_for(
        resource,
        keys::Family::Rw,
        caps.sharded,
    ))
}

/// Every integer a delete answers acknowledges a release: 0 only means there was nothing of
/// ours on that node. `WRONGTYPE` too: the key holds the other side's representation, so
/// nothing of ours is there. An error (`READONLY`, `MISCONF`, ...) is a failure, never an
/// acknowledgement.
fn ack_verdict(reply: &Reply<'_>) -> Verdict {
    match reply {
        Reply::Integer(n) if *n >= 0 => Verdict::Vote(Vote::Yes),
        r if is_wrong_type(r) => Verdict::Vote(Vote::Yes),
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
    /// The policy lets this reader ignore writers' intents, so on a native node it goes
    /// without Lua.
    pub native: bool,
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

    /// On a native node: `HSETEX W PX ttl FIELDS 1 token 1`, the reader as a field of a hash
    /// at the writer key, with its own expiry.
    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.hsetex || !self.native {
            self.encode(out, form);
            return 0;
        }
        resp::write_array_len(out, 8);
        resp::write_bulk(out, b"HSETEX");
        resp::write_bulk(out, self.keys.writer());
        resp::write_bulk(out, b"PX");
        resp::write_bulk_u64(out, self.ttl_ms);
        resp::write_bulk(out, b"FIELDS");
        resp::write_bulk(out, b"1");
        resp::write_bulk(out, self.token);
        resp::write_bulk(out, b"1");
        0
    }

    /// `WRONGTYPE` (the writer key holds a writer's token) refuses a native reader.
    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        if is_wrong_type(reply) {
            return Verdict::Vote(Vote::No);
        }
        int_verdict(reply)
    }
}

/// Reader release, and the cleanup of a lost read attempt: the reader's token leaves both
/// places a reader can be, the reader set and the hash at the writer key (a reader that joined
/// a native node without a script), whatever the node is taken for: [`READ_RELEASE`] where it
/// is not known to have hash-field expiry (a release kept for a cluster master whose link was
/// never set up is written so, and may reach a native node); on a native node, `HDEL W token`,
/// `ZREM R token`, then, for a release, the announcement.
///
/// Without a script the announcement cannot depend on whether anything was removed, so a
/// cleanup makes none: waiters that lose wake each other with their cleanups otherwise, and
/// retry and lose again, without end.
#[derive(Debug, Clone, Copy)]
pub struct ReadRelease<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The reader's token.
    pub token: &'a [u8],
    /// A release (announced on a native node), not the cleanup of a lost attempt.
    pub announce: bool,
}

impl Op for ReadRelease<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.hsetex {
            // The script addresses the hash too: a release written before its node's server
            // is known (kept for a cluster master whose link was never set up, the replica
            // promoted in a failover) may reach a native node.
            write_eval(
                out,
                READ_RELEASE.announcing(caps.sharded),
                form,
                &[self.keys.readers(), self.keys.writer()],
                &[Arg::Bytes(self.token), wake(self.resource, caps)],
            );
            return 0;
        }
        // One transaction, voted on by the replies of both deletes (read from the `EXEC`), not
        // by the announcement's: a node that refused them (`READONLY`, `MISCONF`) aborts the
        // transaction and never acknowledges the release.
        resp::encode_command(out, &[b"MULTI"]);
        resp::encode_command(out, &[b"HDEL", self.keys.writer(), self.token]);
        resp::encode_command(out, &[b"ZREM", self.keys.readers(), self.token]);
        if self.announce {
            write_publish(out, self.resource, self.token, caps);
        }
        resp::encode_command(out, &[b"EXEC"]);
        3 + usize::from(self.announce)
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        let Reply::Array(Some(items)) = reply else {
            return ack_verdict(reply);
        };
        // `[HDEL's reply, ZREM's reply]`, then `PUBLISH`'s for a release. `HDEL` on a writer's
        // string is `WRONGTYPE`: nothing of ours there. Both deletes must be acknowledged.
        match items.as_slice() {
            [hdel, zrem] | [hdel, zrem, Reply::Integer(_)] => match ack_verdict(hdel) {
                Verdict::Vote(Vote::Yes) => ack_verdict(zrem),
                refused => refused,
            },
            [_, _, Reply::Error(m)] => crate::engine::ops::error_verdict(m),
            _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
        }
    }
}

/// Removes a member from one of the lock's sorted sets; see [`SET_RELEASE`]. Intent withdrawal
/// (a waiter id, from the intent set), and the undo of a lost downgrade's reader (a token, from
/// the reader set, where a downgrade puts its reader).
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
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        write_eval(
            out,
            SET_RELEASE.announcing(caps.sharded),
            form,
            &[self.set],
            &[Arg::Bytes(self.token), wake(self.resource, caps)],
        );
        0
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

    /// On a native node the reader may be in either place (see [`ReadRelease`]), so both are
    /// extended in one transaction: `MULTI`, `HPEXPIRE W ttl FIELDS 1 token`, the script on the
    /// reader set (by its body, so that no `NOSCRIPT` can hide inside the `EXEC`), `EXEC`.
    /// Neither brings back a reader that is gone.
    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        if !caps.hsetex {
            self.encode(out, form);
            return 0;
        }
        resp::encode_command(out, &[b"MULTI"]);
        resp::write_array_len(out, 6);
        resp::write_bulk(out, b"HPEXPIRE");
        resp::write_bulk(out, self.keys.writer());
        resp::write_bulk_u64(out, self.ttl_ms);
        resp::write_bulk(out, b"FIELDS");
        resp::write_bulk(out, b"1");
        resp::write_bulk(out, self.token);
        self.encode(out, ScriptForm::Body);
        resp::encode_command(out, &[b"EXEC"]);
        3
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        let Reply::Array(Some(items)) = reply else {
            return int_verdict(reply);
        };
        // `[HPEXPIRE's [1] when the field was there and got the TTL, the script's 1 when the
        // set member was]`: extended when either was.
        match items.as_slice() {
            [hash, set] => {
                let in_hash = matches!(hash, Reply::Array(Some(c)) if matches!(c.as_slice(), [Reply::Integer(1)]));
                if in_hash || matches!(set, Reply::Integer(1)) {
                    return Verdict::Vote(Vote::Yes);
                }
                match (hash, set) {
                    (Reply::Error(m), _) if !is_wrong_type(hash) => {
                        Verdict::Vote(Vote::Failed(crate::engine::ops::server_error(m)))
                    }
                    (_, Reply::Error(m)) => {
                        Verdict::Vote(Vote::Failed(crate::engine::ops::server_error(m)))
                    }
                    _ => Verdict::Vote(Vote::No),
                }
            }
            _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
        }
    }
}

/// Write-to-read downgrade; see [`DOWNGRADE`]. The reader's entry goes into the reader set,
/// scored on the node's clock, with the writer's token, and the writer key goes, in one atomic
/// step per node.
#[derive(Debug, Clone, Copy)]
pub struct Downgrade<'a> {
    /// The resource key, whose wake channel announces that readers may join.
    pub resource: &'a [u8],
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The writer's token, which becomes the reader's.
    pub token: &'a [u8],
    /// The reader's TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for Downgrade<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        write_eval(
            out,
            DOWNGRADE.announcing(caps.sharded),
            form,
            &[self.keys.writer(), self.keys.readers()],
            &[
                Arg::Bytes(self.token),
                Arg::Num(self.ttl_ms),
                wake(self.resource, caps),
            ],
        );
        0
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// Undo of a lost downgrade; see [`DOWNGRADE_UNDO`]. Every integer is an acknowledgement.
#[derive(Debug, Clone, Copy)]
pub struct DowngradeUndo<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The token of the writer, and of the reader it was to become.
    pub token: &'a [u8],
}

impl Op for DowngradeUndo<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        write_eval(
            out,
            DOWNGRADE_UNDO.announcing(caps.sharded),
            form,
            &[self.keys.writer(), self.keys.readers()],
            &[Arg::Bytes(self.token), wake(self.resource, caps)],
        );
        0
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        ack_verdict(reply)
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

/// What a `COMMAND INFO DELEX HSETEX` reply says the server has: Redis answers with one entry
/// per name asked, a nil one for an unknown command. An error (ACLs) means neither.
pub fn caps_of(reply: &Reply<'_>) -> Caps {
    let known = |i: usize| matches!(reply, Reply::Array(Some(items)) if matches!(items.get(i), Some(Reply::Array(Some(_)))));
    Caps {
        delex: known(0),
        hsetex: known(1),
        sharded: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unexpected() -> Verdict {
        Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply))
    }

    #[test]
    fn releases_on_cluster_members_announce_with_spublish_in_the_locks_slot() {
        use crate::engine::scripts::{READ_RELEASE_SHARDED, RELEASE_SHARDED};
        let keys = RwKeys::new(b"k");
        let sharded = Caps {
            sharded: true,
            ..Caps::default()
        };
        let mut out = Vec::new();
        let op = WriteRelease {
            resource: b"k",
            keys: &keys,
            token: b"t",
        };
        op.encode_for(&mut out, ScriptForm::Sha, sharded);
        let mut want = Vec::new();
        write_eval(
            &mut want,
            &RELEASE_SHARDED,
            ScriptForm::Sha,
            &[b"{rw:k}:w"],
            &[Arg::Bytes(b"t"), Arg::Bytes(b"redlock-mux:wake:{rw:k}")],
        );
        assert_eq!(
            out, want,
            "the SPUBLISH script, the channel in {{rw:k}}'s slot"
        );
        // Without Lua: SPUBLISH in the transaction, which must keep to one slot.
        out.clear();
        let delex = Caps {
            delex: true,
            ..sharded
        };
        op.encode_for(&mut out, ScriptForm::Sha, delex);
        let spublish = b"*3\r\n$8\r\nSPUBLISH\r\n$23\r\nredlock-mux:wake:{rw:k}\r\n";
        assert!(out.windows(spublish.len()).any(|w| w == spublish));
        assert!(!out.windows(9).any(|w| w == b"\nPUBLISH\r"));
        let read = ReadRelease {
            resource: b"k",
            keys: &keys,
            token: b"t",
            announce: true,
        };
        out.clear();
        read.encode_for(&mut out, ScriptForm::Sha, sharded);
        assert!(out.windows(40).any(|w| w == READ_RELEASE_SHARDED.sha));
        out.clear();
        read.encode_for(
            &mut out,
            ScriptForm::Sha,
            Caps {
                hsetex: true,
                ..sharded
            },
        );
        assert!(out.windows(8).any(|w| w == b"SPUBLISH"));
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
        // DELEX, then the announcement it cannot make itself, in one transaction whose EXEC
        // carries DELEX's reply: the vote.
        let caps = Caps {
            delex: true,
            ..Caps::default()
        };
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, caps), 3);
        assert_eq!(
            out,
            &b"*1\r\n$5\r\nMULTI\r\n\
               *4\r\n$5\r\nDELEX\r\n$8\r\n{rw:k}:w\r\n$4\r\nIFEQ\r\n$1\r\nt\r\n\
               *3\r\n$7\r\nPUBLISH\r\n$18\r\nredlock-mux:wake:k\r\n$1\r\nt\r\n\
               *1\r\n$4\r\nEXEC\r\n"[..]
        );
        out.clear();
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, Caps::default()), 0);
        assert!(out.starts_with(b"*6\r\n$7\r\nEVALSHA\r\n"));
        let exec = |a, b| Reply::Array(Some(vec![a, b]));
        let yes = Verdict::Vote(Vote::Yes);
        // The script's replies.
        assert_eq!(op.classify(&Reply::Integer(0)), yes);
        assert_eq!(op.classify(&Reply::Integer(1)), yes);
        assert_eq!(op.classify(&Reply::Simple(b"OK")), unexpected());
        // DELEX deleted, or found nothing of ours; the PUBLISH counts its listeners.
        assert_eq!(
            op.classify(&exec(Reply::Integer(1), Reply::Integer(3))),
            yes
        );
        assert_eq!(
            op.classify(&exec(Reply::Integer(0), Reply::Integer(0))),
            yes
        );
        // A refused delete is a failure, whatever the PUBLISH said: a transaction with a
        // refused command is aborted, and one that ran carries the refusal.
        for refused in [
            Reply::Error(b"EXECABORT Transaction discarded because of previous errors."),
            exec(
                Reply::Error(b"READONLY You can't write against a read only replica."),
                Reply::Integer(2),
            ),
        ] {
            assert!(
                matches!(op.classify(&refused), Verdict::Vote(Vote::Failed(_))),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn command_info_tells_whether_delex_and_hsetex_exist() {
        let entry = |name: &'static [u8]| Reply::Array(Some(vec![Reply::Bulk(Some(name))]));
        // Redis 7.0 answers `*2\r\n$-1\r\n$-1\r\n`.
        assert_eq!(
            caps_of(&Reply::Array(Some(vec![
                Reply::Bulk(None),
                Reply::Bulk(None)
            ]))),
            Caps::default()
        );
        // Redis 8.2 has HSETEX, not DELEX.
        assert_eq!(
            caps_of(&Reply::Array(Some(vec![
                Reply::Bulk(None),
                entry(b"hsetex")
            ]))),
            Caps {
                delex: false,
                hsetex: true,
                sharded: false,
            }
        );
        assert_eq!(
            caps_of(&Reply::Array(Some(vec![entry(b"delex"), entry(b"hsetex")]))),
            Caps {
                delex: true,
                hsetex: true,
                sharded: false,
            }
        );
        assert_eq!(
            caps_of(&Reply::Error(b"ERR unknown command")),
            Caps::default()
        );
    }

    fn native() -> Caps {
        Caps {
            delex: false,
            hsetex: true,
            sharded: false,
        }
    }

    #[test]
    fn a_native_writer_is_one_transaction_voted_on_by_exec() {
        let keys = RwKeys::new(b"k");
        let ids = AttemptIds {
            waiter: b"t",
            token: b"t",
        };
        let op = WriteAcquire {
            keys: &keys,
            ids,
            ttl_ms: 500,
            intent_ms: 0,
        };
        let mut out = Vec::new();
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, native()), 4);
        assert_eq!(
            out,
            &b"*1\r\n$5\r\nMULTI\r\n*2\r\n$10\r\nHRANDFIELD\r\n$8\r\n{rw:k}:w\r\n\
               *6\r\n$3\r\nSET\r\n$8\r\n{rw:k}:w\r\n$1\r\nt\r\n$2\r\nNX\r\n$2\r\nPX\r\n$3\r\n500\r\n\
               *2\r\n$6\r\nEXISTS\r\n$8\r\n{rw:k}:r\r\n*1\r\n$4\r\nEXEC\r\n"[..]
        );
        let exec = |a, b| Reply::Array(Some(vec![Reply::Bulk(None), a, b]));
        let yes = Verdict::Vote(Vote::Yes);
        let no = Verdict::Vote(Vote::No);
        assert_eq!(
            op.classify(&exec(Reply::Simple(b"OK"), Reply::Integer(0))),
            yes
        );
        // Set beside a reader set: refused.
        assert_eq!(
            op.classify(&exec(Reply::Simple(b"OK"), Reply::Integer(1))),
            no
        );
        assert_eq!(op.classify(&exec(Reply::Bulk(None), Reply::Integer(0))), no);
        assert_eq!(op.classify(&exec(Reply::Bulk(None), Reply::Integer(1))), no);
        assert_eq!(op.classify(&Reply::Array(Some(vec![]))), unexpected());
        // The Lua form's replies mean what they did.
        assert_eq!(op.classify(&Reply::Integer(1)), yes);
        // A write-preferring writer leaves intents: always the script.
        let wp = WriteAcquire {
            intent_ms: 100,
            ..op
        };
        out.clear();
        assert_eq!(wp.encode_for(&mut out, ScriptForm::Sha, native()), 0);
        assert!(out.starts_with(b"*10\r\n$7\r\nEVALSHA\r\n"));
    }

    #[test]
    fn a_native_writer_extends_only_where_no_reader_set_is() {
        let keys = RwKeys::new(b"k");
        let op = WriteExtend {
            keys: &keys,
            token: b"t",
            ttl_ms: 500,
        };
        let mut out = Vec::new();
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, native()), 3);
        assert!(out.starts_with(b"*1\r\n$5\r\nMULTI\r\n*6\r\n$4\r\nEVAL\r\n"));
        assert!(out.ends_with(b"*2\r\n$6\r\nEXISTS\r\n$8\r\n{rw:k}:r\r\n*1\r\n$4\r\nEXEC\r\n"));
        let exec = |a, b| Reply::Array(Some(vec![a, b]));
        let wrong = Reply::Error(b"WRONGTYPE Operation against a key");
        let (yes, no) = (Verdict::Vote(Vote::Yes), Verdict::Vote(Vote::No));
        assert_eq!(
            op.classify(&exec(Reply::Integer(1), Reply::Integer(0))),
            yes
        );
        assert_eq!(op.classify(&exec(Reply::Integer(1), Reply::Integer(1))), no);
        assert_eq!(op.classify(&exec(Reply::Integer(0), Reply::Integer(0))), no);
        assert_eq!(op.classify(&exec(wrong.clone(), Reply::Integer(0))), no);
        // The script alone elsewhere.
        assert_eq!(op.classify(&Reply::Integer(1)), yes);
        assert_eq!(op.classify(&wrong), no);
        out.clear();
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, Caps::default()), 0);
        assert!(out.starts_with(b"*6\r\n$7\r\nEVALSHA\r\n"));
    }

    #[test]
    fn a_native_reader_is_a_hash_field_and_wrongtype_refuses_it() {
        let keys = RwKeys::new(b"k");
        let op = ReadAcquire {
            keys: &keys,
            token: b"t",
            ttl_ms: 500,
            native: true,
        };
        let mut out = Vec::new();
        assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, native()), 0);
        assert_eq!(
            out,
            &b"*8\r\n$6\r\nHSETEX\r\n$8\r\n{rw:k}:w\r\n$2\r\nPX\r\n$3\r\n500\r\n\
               $6\r\nFIELDS\r\n$1\r\n1\r\n$1\r\nt\r\n$1\r\n1\r\n"[..]
        );
        assert_eq!(op.classify(&Reply::Integer(1)), Verdict::Vote(Vote::Yes));
        assert_eq!(
            op.classify(&Reply::Error(b"WRONGTYPE Operation against a key")),
            Verdict::Vote(Vote::No)
        );
        // Not native by policy, or on 7.x: the script.
        for (op, caps) in [
            (
                ReadAcquire {
                    native: false,
                    ..op
                },
                native(),
            ),
            (op, Caps::default()),
        ] {
            out.clear();
            assert_eq!(op.encode_for(&mut out, ScriptForm::Sha, caps), 0);
            assert!(out.starts_with(b"*8\r\n$7\r\nEVALSHA\r\n"));
        }
    }

    #[test]
    fn a_reader_on_a_native_node_is_extended_and_released_in_both_places() {
        let keys = RwKeys::new(b"k");
        let ext = ReadExtend {
            keys: &keys,
            token: b"t",
            ttl_ms: 500,
        };
        let mut out = Vec::new();
        assert_eq!(ext.encode_for(&mut out, ScriptForm::Sha, native()), 3);
        assert!(out.starts_with(b"*1\r\n$5\r\nMULTI\r\n*6\r\n$8\r\nHPEXPIRE\r\n"));
        assert!(out.ends_with(b"*1\r\n$4\r\nEXEC\r\n"));
        let exec = |a, b| Reply::Array(Some(vec![a, b]));
        let field = |n| Reply::Array(Some(vec![Reply::Integer(n)]));
        let wrong = Reply::Error(b"WRONGTYPE Operation against a key");
        let yes = Verdict::Vote(Vote::Yes);
        let no = Verdict::Vote(Vote::No);
        assert_eq!(ext.classify(&exec(field(1), Reply::Integer(0))), yes);
        assert_eq!(ext.classify(&exec(field(-2), Reply::Integer(1))), yes);
        assert_eq!(ext.classify(&exec(field(-2), Reply::Integer(0))), no);
        assert_eq!(ext.classify(&exec(wrong.clone(), Reply::Integer(0))), no);
        assert_eq!(ext.classify(&Reply::Integer(1)), yes);

        let rel = ReadRelease {
            resource: b"k",
            keys: &keys,
            token: b"t",
            announce: true,
        };
        out.clear();
        assert_eq!(rel.encode_for(&mut out, ScriptForm::Sha, native()), 4);
        assert!(out.starts_with(
            b"*1\r\n$5\r\nMULTI\r\n*3\r\n$4\r\nHDEL\r\n$8\r\n{rw:k}:w\r\n$1\r\nt\r\n\
              *3\r\n$4\r\nZREM\r\n"
        ));
        assert!(out.ends_with(b"*1\r\n$4\r\nEXEC\r\n"));
        // Voted on by both deletes, never by the announcement.
        let deletes = |a, b| Reply::Array(Some(vec![a, b, Reply::Integer(1)]));
        assert_eq!(
            rel.classify(&deletes(Reply::Integer(1), Reply::Integer(0))),
            yes
        );
        assert_eq!(
            rel.classify(&deletes(wrong.clone(), Reply::Integer(1))),
            yes
        );
        let readonly = Reply::Error(b"READONLY You can't write against a read only replica.");
        for refused in [
            deletes(readonly.clone(), Reply::Integer(0)),
            deletes(Reply::Integer(1), readonly.clone()),
            Reply::Error(b"EXECABORT Transaction discarded because of previous errors."),
        ] {
            assert!(
                matches!(rel.classify(&refused), Verdict::Vote(Vote::Failed(_))),
                "{refused:?}"
            );
        }
        // The script's replies elsewhere.
        assert_eq!(rel.classify(&Reply::Integer(0)), yes);
        // A cleanup announces nothing.
        out.clear();
        let cleanup = ReadRelease {
            announce: false,
            ..rel
        };
        assert_eq!(cleanup.encode_for(&mut out, ScriptForm::Sha, native()), 3);
        assert!(!out.windows(7).any(|w| w == b"PUBLISH"));
        assert_eq!(
            cleanup.classify(&Reply::Array(Some(vec![
                Reply::Integer(0),
                Reply::Integer(1)
            ]))),
            yes
        );
        out.clear();
        assert_eq!(
            rel.encode_for(&mut out, ScriptForm::Sha, Caps::default()),
            0
        );
        // The script, on both keys: the node may be native all the same.
        assert!(out.starts_with(b"*7\r\n$7\r\nEVALSHA\r\n"));
        assert!(out.windows(40).any(|w| w == READ_RELEASE.sha));
    }
}
