//! The FIFO-fair policy (seed 000, "Fairness"), over a quorum.
//!
//! Each resource `K` has a queue of waiters on every node: a sorted set `Q` of waiter ids scored
//! by a *ticket*, and a sorted set `QX` of the same ids scored by when each entry expires on
//! that node's own clock. A waiter chooses its ticket and its id once, when it starts waiting
//! (its wall clock in microseconds, and the token of its first attempt), and uses them on every
//! node and every attempt, so every node orders the same waiters the same way: by ticket, then
//! by id (Redis orders equal scores by member). Only the head of a node's queue may take the
//! lock on that node. Each attempt sets its own token as the lock's value; the id only names the
//! waiter in the queue, so a waiter keeps one entry, and its place, across attempts.
//!
//! Why no ordering across nodes can deadlock: take the live waiter `W` that is smallest by
//! (ticket, token). Wherever `W` is queued, it is the head. Every attempt re-joins every node it
//! reaches, so once `W` has reached a quorum it is the head on a quorum, and it wins as soon as
//! the lock is free there. A waiter that dies stops refreshing its entries, which expire on
//! each node's clock after the entry TTL; the next waiter then becomes the head.
//!
//! An acquirer joins the queue when it is non-empty, or once it has waited longer than the
//! client's `fair_after` interval; while the queue is empty and the lock free, a fair acquire
//! costs the same single round as an unfair one. Tickets come from client wall clocks, so
//! clients whose clocks disagree by `d` may be served out of order by up to `d`: that affects
//! only the order, never mutual exclusion.
//!
//! Key names (all from [`keys`]): for a mutex, `Q` and `QX` are derived from `K` so they share
//! its Redis Cluster hash slot; a read-write lock keeps its queue beside its other keys
//! ([`RwKeys`](keys::RwKeys)), and its entries say whether they are readers or writers, so that
//! readers at the head of the queue can share the lock. The gate every fair script starts with
//! is `scripts/fair_gate.lua`.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::time::Duration;

use crate::engine::keys::{self, Derived};
use crate::engine::ops::{int_verdict, Op, Script, ScriptForm, Verdict};
pub use crate::engine::scripts::{FAIR_ACQUIRE, LEAVE};
use crate::engine::Vote;
use crate::resp::{self, Reply};

/// A fair queue's keys as a script sees them: `KEYS[1]` the lock (whose existence says whether
/// a release is worth announcing), `KEYS[2]` the queue, `KEYS[3]` the entries' expiries.
#[derive(Debug, Clone, Copy)]
pub enum QueueKeys<'a> {
    /// The mutex on this key; queue names from [`keys`].
    Mutex(&'a [u8]),
    /// Keys named elsewhere (a read-write lock's writer key and queue).
    Named {
        /// The lock key.
        lock: &'a [u8],
        /// The queue.
        queue: &'a [u8],
        /// The expiries.
        expiries: &'a [u8],
    },
}

impl QueueKeys<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match *self {
            QueueKeys::Mutex(key) => {
                resp::write_bulk(out, key);
                Derived::MutexQueue.of(key).write_bulk(out);
                Derived::MutexQueueExpiries.of(key).write_bulk(out);
            }
            QueueKeys::Named {
                lock,
                queue,
                expiries,
            } => {
                resp::write_bulk(out, lock);
                resp::write_bulk(out, queue);
                resp::write_bulk(out, expiries);
            }
        }
    }
}

/// Writes `EVALSHA`/`EVAL` of `script` with `numkeys` keys and `args` arguments to follow: the
/// caller writes them.
pub(crate) fn write_eval_head(
    out: &mut Vec<u8>,
    script: &Script,
    form: ScriptForm,
    numkeys: usize,
    args: usize,
) {
    resp::write_array_len(out, 3 + numkeys + args);
    match form {
        ScriptForm::Sha => {
            resp::write_bulk(out, b"EVALSHA");
            resp::write_bulk(out, &script.sha);
        }
        ScriptForm::Body => {
            resp::write_bulk(out, b"EVAL");
            resp::write_bulk(out, script.body.as_bytes());
        }
    }
    resp::write_bulk_u64(out, numkeys as u64);
}

/// What every fair acquisition keeps across its attempts: its place, and whether it has to
/// join even an empty queue yet.
#[derive(Debug)]
pub struct FairState {
    /// The waiter's place: chosen once, the same on every node.
    pub ticket: u64,
    /// How long a queue entry lives without being refreshed by a retry.
    pub entry_ttl_ms: u64,
    /// Join even an empty queue once the caller has waited this long.
    pub join_after: Duration,
    join: Cell<bool>,
}

impl FairState {
    /// A waiter with `ticket`, whose entries live `entry_ttl_ms`, joining an empty queue after
    /// `join_after`.
    pub fn new(ticket: u64, entry_ttl_ms: u64, join_after: Duration) -> FairState {
        FairState {
            ticket,
            entry_ttl_ms,
            join_after,
            join: Cell::new(false),
        }
    }

    /// Writes the arguments of a fair acquire script: the attempt's token, the TTL, the intent
    /// TTL for a writer (`intent_ms`), the waiter id, then the three queue arguments the fair
    /// gate takes last: ticket, entry TTL, join.
    pub fn write_args(
        &self,
        out: &mut Vec<u8>,
        ids: AttemptIds<'_>,
        ttl_ms: u64,
        intent_ms: Option<u64>,
    ) {
        resp::write_bulk(out, ids.token);
        resp::write_bulk_u64(out, ttl_ms);
        if let Some(intent_ms) = intent_ms {
            resp::write_bulk_u64(out, intent_ms);
        }
        resp::write_bulk(out, ids.waiter);
        resp::write_bulk_u64(out, self.ticket);
        resp::write_bulk_u64(out, self.entry_ttl_ms);
        resp::write_bulk(out, if self.join.get() { b"1" } else { b"0" });
    }

    /// Reads a fair script's reply: `2 + rank` is a refusal that left this waiter queued
    /// behind `rank` others (see [`queued_rank`]). Whether it is queued is not tracked: a node
    /// that answers after the round was decided may have queued it unseen, so every fair
    /// acquisition leaves every queue when it is done.
    pub fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(n) if *n >= 2 => Verdict::Vote(Vote::No),
            other => int_verdict(other),
        }
    }

    /// Called before each retry with how long the waiter has waited so far: it joins even an
    /// empty queue once that is [`join_after`](Self::join_after).
    pub fn on_retry(&self, waited: Duration) {
        if waited >= self.join_after {
            self.join.set(true);
        }
    }
}

/// The rank a fair acquire script's reply gives: how many queue entries must leave before this
/// waiter may pass the gate on that node (see `scripts/fair_gate.lua`). The scripts answer 1
/// (taken: rank 0), 0 (refused, not queued: rank 0) or `2 + rank` (refused, queued behind
/// `rank` others; 2 is the head, refused by the lock). `None` for anything else. The replies
/// of the scripts before ranks (0, 1, 2) read the same, and no rank is read as a grant.
pub fn queued_rank(reply: &Reply<'_>) -> Option<u32> {
    match *reply {
        Reply::Integer(0 | 1) => Some(0),
        Reply::Integer(n) if n >= 2 => Some(u32::try_from(n - 2).unwrap_or(u32::MAX)),
        _ => None,
    }
}

/// The rank a fenced fair acquire script's reply gives: a counter (a grant) is rank 0, a
/// refusal is `-1 - rank` (`-1` for the head, or a waiter that is not queued). `None` for
/// anything else.
pub fn fenced_queued_rank(reply: &Reply<'_>) -> Option<u32> {
    match *reply {
        Reply::Integer(n) if n >= 1 => Some(0),
        Reply::Integer(n) if n <= -1 => Some(u32::try_from(-1 - n).unwrap_or(u32::MAX)),
        _ => None,
    }
}

/// The two names of one attempt of a waiter.
#[derive(Debug, Clone, Copy)]
pub struct AttemptIds<'a> {
    /// The waiter: the same on every attempt (its first attempt's token). It names the waiter's
    /// queue entry and, for a writer, its intent.
    pub waiter: &'a [u8],
    /// This attempt's token: the value the lock holds if the attempt wins. A new one for every
    /// attempt, so that nothing sent for an earlier attempt can touch what a later one holds.
    pub token: &'a [u8],
}

/// A fair mutex acquisition: the same vote as `SET NX PX`, but only the queue's head may win.
#[derive(Debug)]
pub struct FairAcquire<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// This attempt's token, and the waiter's queue entry.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// Place in the queue and what goes with it, kept across attempts.
    pub fair: &'a FairState,
}

impl<'a> FairAcquire<'a> {
    /// An attempt with `ids` at a fair acquisition of `key`.
    pub fn new(key: &'a [u8], ids: AttemptIds<'a>, ttl_ms: u64, fair: &'a FairState) -> Self {
        FairAcquire {
            key,
            ids,
            ttl_ms,
            fair,
        }
    }
}

impl Op for FairAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval_head(out, &FAIR_ACQUIRE, form, 3, 6);
        QueueKeys::Mutex(self.key).write(out);
        self.fair.write_args(out, self.ids, self.ttl_ms, None);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        self.fair.classify(reply)
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        queued_rank(reply)
    }
}

/// Leaves a fair queue.
#[derive(Debug, Clone, Copy)]
pub struct Leave<'a> {
    /// The resource, whose wake channel is told when the lock is free.
    pub resource: &'a [u8],
    /// The queue's keys.
    pub keys: QueueKeys<'a>,
    /// What kind of waiter this is, the start of its queue entry (empty for a mutex).
    pub kind: &'a [u8],
    /// The waiter's id, the rest of its queue entry.
    pub waiter: &'a [u8],
}

impl Op for Leave<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval_head(out, &LEAVE, form, 3, 2);
        self.keys.write(out);
        resp::write_bulk_parts(out, &[self.kind, self.waiter]);
        keys::wake_channel(self.resource).write_bulk(out);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(_) => Verdict::Vote(Vote::Yes),
            other => int_verdict(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: AttemptIds<'static> = AttemptIds {
        waiter: b"w",
        token: b"t",
    };

    #[test]
    fn joins_only_after_the_interval() {
        let fair = FairState::new(7, 500, Duration::from_millis(100));
        let op = FairAcquire::new(b"k", IDS, 1000, &fair);
        let body = |op: &FairAcquire<'_>| {
            let mut out = Vec::new();
            op.encode(&mut out, ScriptForm::Sha);
            out
        };
        assert!(body(&op).ends_with(b"$1\r\n0\r\n"));
        fair.on_retry(Duration::from_millis(50));
        assert!(body(&op).ends_with(b"$1\r\n0\r\n"));
        fair.on_retry(Duration::from_millis(100));
        assert!(body(&op).ends_with(b"$1\r\n1\r\n"));
    }

    #[test]
    fn a_refusal_that_queued_is_a_no() {
        let fair = FairState::new(7, 500, Duration::ZERO);
        let op = FairAcquire::new(b"k", IDS, 1000, &fair);
        assert_eq!(op.classify(&Reply::Integer(0)), Verdict::Vote(Vote::No));
        assert_eq!(op.classify(&Reply::Integer(1)), Verdict::Vote(Vote::Yes));
        assert_eq!(op.classify(&Reply::Integer(2)), Verdict::Vote(Vote::No));
        assert_eq!(op.classify(&Reply::Integer(9)), Verdict::Vote(Vote::No));
        assert!(matches!(
            op.classify(&Reply::Integer(-1)),
            Verdict::Vote(Vote::Failed(_))
        ));
    }

    #[test]
    fn replies_give_ranks() {
        assert_eq!(queued_rank(&Reply::Integer(1)), Some(0));
        assert_eq!(queued_rank(&Reply::Integer(0)), Some(0));
        assert_eq!(queued_rank(&Reply::Integer(2)), Some(0));
        assert_eq!(queued_rank(&Reply::Integer(7)), Some(5));
        assert_eq!(queued_rank(&Reply::Integer(-1)), None);
        assert_eq!(queued_rank(&Reply::Error(b"ERR x")), None);
        assert_eq!(fenced_queued_rank(&Reply::Integer(12)), Some(0));
        assert_eq!(fenced_queued_rank(&Reply::Integer(-1)), Some(0));
        assert_eq!(fenced_queued_rank(&Reply::Integer(-4)), Some(3));
        assert_eq!(fenced_queued_rank(&Reply::Integer(0)), None);
        assert_eq!(
            queued_rank(&Reply::Integer(i64::MAX)),
            Some(u32::MAX),
            "a huge rank saturates"
        );
    }
}
