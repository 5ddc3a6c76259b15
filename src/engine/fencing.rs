//! Fencing tokens over a quorum: a number that strictly increases with each grant of a lock.
//!
//! A lock alone cannot protect a resource from a holder that paused (a GC, a page fault, a
//! stopped VM) past its validity and then carries on as if it still held the lock. A fencing
//! token can: each grant carries a number larger than every earlier grant's, the holder sends
//! it with every write, and the resource refuses a write whose token is smaller than the
//! largest it has already seen.
//!
//! # The counters
//!
//! Every node keeps a counter per lock key at [`fence_key`](crate::engine::keys::fence_key), with no expiry. It is only ever
//! raised. The counters of different nodes diverge: a grant reaches a quorum, not every node,
//! so the largest value read in one attempt may sit on nodes that the next grant's quorum
//! never asks. Reading alone is therefore not enough; as in quorum registers (ABD), the value
//! used must be on a quorum before it is returned:
//!
//! 1. **Read**, in the acquire round itself (no extra round trip): on each node one script
//!    sets the lock key with `NX` and, if it did, raises that node's counter by one and
//!    returns it, in the same atomic step.
//! 2. Once a quorum granted the lock, the token is `f = max(counters returned)`.
//! 3. If a quorum of the granting nodes returned `f` itself, a quorum already holds it and the
//!    token is returned at once: the common case, when no node missed earlier grants.
//! 4. Otherwise, **write back** (one extra round trip): on each node, if the lock key still
//!    holds our token, raise the counter to `f` (compare-and-set-if-greater) and acknowledge.
//!    The token is returned only when a quorum acknowledged before the lock's validity ended;
//!    otherwise the attempt fails and the lock is released on every node.
//!
//! Why this gives tokens that strictly increase in the order grants hold the lock, and what
//! breaks that, is argued on [`FencedLock`](crate::FencedLock).
//!
//! # Using it for another kind of lock
//!
//! Any lock whose key holds the holder's token as a string (the mutex, a writer key) can be
//! fenced, and is: the mutex ([`FencedAcquire`], [`FairFencedAcquire`]) and the write side of a
//! read-write lock ([`FencedWriteAcquire`], on the writer key). Its acquire script is its plain
//! one made a function `attempt()` between `fence_check.lua` and `fence_grant.lua` (see
//! `scripts.rs`), which raise and return [`fence_key`](crate::engine::keys::fence_key)'s counter on success and return `-1` on
//! refusal (`-1 - rank` for a fair waiter queued behind others); its op classifies replies with [`classify_fenced`]; and after a won round the
//! acquisition runs [`FenceWrite`] for [`FenceRead::token`] before the validity ends, unless
//! [`FenceRead::holders`] is already a quorum.
#![forbid(unsafe_code)]

use std::cell::Cell;

use crate::engine::fair::{fenced_queued_rank, write_eval_head, AttemptIds, FairState};
use crate::engine::keys::{Derived, RwKeys};
use crate::engine::ops::{error_verdict, int_verdict, write_eval, Arg, Op, ScriptForm, Verdict};
use crate::engine::rw::write_fair_keys;
pub use crate::engine::scripts::{
    FAIR_FENCED_ACQUIRE, FAIR_FENCED_WRITE_ACQUIRE, FENCED_ACQUIRE, FENCED_WRITE_ACQUIRE,
    FENCE_WRITE,
};
use crate::engine::Vote;
use crate::error::NodeErrorKind;
use crate::resp::{self, Reply};

/// The largest counter: Lua (which reads and compares the counters) represents integers
/// exactly only up to 2^53. A node whose counter reached it refuses to raise it further.
pub const MAX_FENCE: u64 = (1 << 53) - 1;

/// The read phase's result: the largest counter that granting nodes returned, and how many
/// returned it.
///
/// Votes are classified through `&self`, so this collects them in [`Cell`]s. Use a new (or
/// [cleared](Self::clear)) one for each attempt: every attempt has its own token, and a counter
/// counts only with the token it was granted with.
#[derive(Debug, Default)]
pub struct FenceRead {
    max: Cell<Option<u64>>,
    at_max: Cell<usize>,
}

impl FenceRead {
    /// Nothing read yet.
    pub fn new() -> FenceRead {
        FenceRead::default()
    }

    /// Forgets everything recorded, for a new attempt.
    pub fn clear(&self) {
        self.max.set(None);
        self.at_max.set(0);
    }

    /// Records a counter that a granting node returned.
    pub fn observe(&self, counter: u64) {
        match self.max.get() {
            Some(m) if m > counter => {}
            Some(m) if m == counter => self.at_max.set(self.at_max.get() + 1),
            _ => {
                self.max.set(Some(counter));
                self.at_max.set(1);
            }
        }
    }

    /// How many granting nodes returned the largest counter: when that is a quorum, the
    /// token is already on a quorum and needs no write-back.
    pub fn holders(&self) -> usize {
        self.at_max.get()
    }

    /// The largest counter recorded, if any.
    pub fn max(&self) -> Option<u64> {
        self.max.get()
    }

    /// The token: the largest counter returned (each already raised by one on its node).
    /// `None` when no counter was recorded, or one is past [`MAX_FENCE`] (no node of ours
    /// returns one).
    pub fn token(&self) -> Option<u64> {
        self.max().filter(|&t| t > 0 && t <= MAX_FENCE)
    }
}

/// Reads the reply of a fenced acquire script: a counter (`≥ 1`) is a grant, recorded in
/// `read`; `-1` is a refusal.
pub fn classify_fenced(reply: &Reply<'_>, read: &FenceRead) -> Verdict {
    match reply {
        Reply::Integer(n) if *n >= 1 && *n as u64 <= MAX_FENCE => {
            read.observe(*n as u64);
            Verdict::Vote(Vote::Yes)
        }
        Reply::Integer(-1) => Verdict::Vote(Vote::No),
        Reply::Error(m) => error_verdict(m),
        _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
    }
}

/// Reads the reply of a fenced acquire script behind a fair queue: as [`classify_fenced`], and
/// `-1 - rank`, the refusal of a waiter queued behind `rank` others, is a refusal too.
pub fn classify_fair_fenced(reply: &Reply<'_>, read: &FenceRead) -> Verdict {
    match reply {
        Reply::Integer(n) if *n < -1 => Verdict::Vote(Vote::No),
        other => classify_fenced(other, read),
    }
}

/// Mutex acquire that also raises and reads the fence counter: [`FENCED_ACQUIRE`].
#[derive(Debug, Clone, Copy)]
pub struct FencedAcquire<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// Its fence counter's key, [`fence_key`](crate::engine::keys::fence_key)`(key)`.
    pub fence: &'a [u8],
    /// This attempt's token.
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// Where the counters read are collected.
    pub read: &'a FenceRead,
}

impl Op for FencedAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &FENCED_ACQUIRE,
            form,
            &[self.key, self.fence],
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        classify_fenced(reply, self.read)
    }
}

/// A fair mutex acquire that also raises and reads the fence counter:
/// [`FAIR_FENCED_ACQUIRE`]. Only the head of the mutex's fair queue may win; a refusal is `-1`,
/// or `-1 - rank` for a waiter queued behind `rank` others.
#[derive(Debug, Clone, Copy)]
pub struct FairFencedAcquire<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// Its fence counter's key, [`fence_key`](crate::engine::keys::fence_key)`(key)`.
    pub fence: &'a [u8],
    /// This attempt's token, and the waiter's queue entry.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// Place in the queue and what goes with it, kept across attempts.
    pub fair: &'a FairState,
    /// Where the counters read are collected.
    pub read: &'a FenceRead,
}

impl Op for FairFencedAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval_head(out, &FAIR_FENCED_ACQUIRE, form, 4, 6);
        resp::write_bulk(out, self.key);
        resp::write_bulk(out, self.fence);
        Derived::MutexQueue.of(self.key).write_bulk(out);
        Derived::MutexQueueExpiries.of(self.key).write_bulk(out);
        self.fair.write_args(out, self.ids, self.ttl_ms, None);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        classify_fair_fenced(reply, self.read)
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        fenced_queued_rank(reply)
    }
}

/// A write acquire that also raises and reads the fence counter of the writer key:
/// [`FENCED_WRITE_ACQUIRE`], or [`FAIR_FENCED_WRITE_ACQUIRE`] behind the read-write lock's
/// fair queue. A refusal is `-1`, or behind the fair queue `-1 - rank` for a writer queued
/// behind `rank` others.
#[derive(Debug, Clone, Copy)]
pub struct FencedWriteAcquire<'a> {
    /// The lock's keys.
    pub keys: &'a RwKeys,
    /// The writer key's fence counter, [`fence_key`](crate::engine::keys::fence_key)`(keys.writer())`.
    pub fence: &'a [u8],
    /// This attempt's token, and the waiter's id, which names its intent and queue entry.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// How long a refused attempt's intent lives, in ms; zero for the read-preferring policy.
    pub intent_ms: u64,
    /// The waiter's place in the fair queue, when it waits in one.
    pub fair: Option<&'a FairState>,
    /// Where the counters read are collected.
    pub read: &'a FenceRead,
}

impl Op for FencedWriteAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let k = self.keys;
        let Some(fair) = self.fair else {
            return write_eval(
                out,
                &FENCED_WRITE_ACQUIRE,
                form,
                &[k.writer(), k.readers(), k.intents(), self.fence],
                &[
                    Arg::Bytes(self.ids.token),
                    Arg::Num(self.ttl_ms),
                    Arg::Num(self.intent_ms),
                    Arg::Bytes(self.ids.waiter),
                ],
            );
        };
        write_eval_head(out, &FAIR_FENCED_WRITE_ACQUIRE, form, 6, 7);
        write_fair_keys(out, k, Some(self.fence));
        fair.write_args(out, self.ids, self.ttl_ms, Some(self.intent_ms));
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match self.fair {
            Some(_) => classify_fair_fenced(reply, self.read),
            None => classify_fenced(reply, self.read),
        }
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        self.fair.and_then(|_| fenced_queued_rank(reply))
    }
}

/// The write-back phase: [`FENCE_WRITE`]. A yes means the node still held our lock and its
/// counter is now at least `value`.
#[derive(Debug, Clone, Copy)]
pub struct FenceWrite<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// Its fence counter's key.
    pub fence: &'a [u8],
    /// The holder's token (the random one stored at the lock key).
    pub token: &'a [u8],
    /// The fencing token to write back.
    pub value: u64,
}

impl Op for FenceWrite<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &FENCE_WRITE,
            form,
            &[self.key, self.fence],
            &[Arg::Bytes(self.token), Arg::Num(self.value)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_the_largest_counter_granted_and_counts_its_holders() {
        let read = FenceRead::new();
        assert_eq!(read.token(), None);
        let op = FencedAcquire {
            key: b"k",
            fence: b"f",
            token: b"t",
            ttl_ms: 10,
            read: &read,
        };
        assert_eq!(op.classify(&Reply::Integer(7)), Verdict::Vote(Vote::Yes));
        assert_eq!(op.classify(&Reply::Integer(-1)), Verdict::Vote(Vote::No));
        assert_eq!(op.classify(&Reply::Integer(3)), Verdict::Vote(Vote::Yes));
        assert_eq!((read.token(), read.holders()), (Some(7), 1));
        assert_eq!(op.classify(&Reply::Integer(7)), Verdict::Vote(Vote::Yes));
        assert_eq!((read.token(), read.holders()), (Some(7), 2));
        assert_eq!(op.classify(&Reply::Integer(9)), Verdict::Vote(Vote::Yes));
        assert_eq!((read.token(), read.holders()), (Some(9), 1));
        for bad in [-2, 0] {
            assert!(matches!(
                op.classify(&Reply::Integer(bad)),
                Verdict::Vote(Vote::Failed(_))
            ));
        }
        // Behind a fair queue, -1 - rank is a refusal; a counter is still a grant.
        let fair = FairState::new(1, 100, std::time::Duration::ZERO);
        let queued = FairFencedAcquire {
            key: b"k",
            fence: b"f",
            ids: AttemptIds {
                waiter: b"w",
                token: b"t",
            },
            ttl_ms: 10,
            fair: &fair,
            read: &read,
        };
        assert_eq!(
            queued.classify(&Reply::Integer(-3)),
            Verdict::Vote(Vote::No)
        );
        assert_eq!(
            queued.classify(&Reply::Integer(-1)),
            Verdict::Vote(Vote::No)
        );
        assert_eq!(
            queued.classify(&Reply::Integer(9)),
            Verdict::Vote(Vote::Yes)
        );
        assert!(matches!(
            queued.classify(&Reply::Integer(0)),
            Verdict::Vote(Vote::Failed(_))
        ));
        assert!(matches!(
            op.classify(&Reply::Error(b"NOSCRIPT No matching script")),
            Verdict::NoScript
        ));
    }

    #[test]
    fn no_token_past_what_lua_counts_exactly() {
        let read = FenceRead::new();
        read.observe(MAX_FENCE);
        assert_eq!(read.token(), Some(MAX_FENCE));
        read.observe(MAX_FENCE + 1);
        assert_eq!(read.token(), None);
    }
}
