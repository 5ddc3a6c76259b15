//! The FIFO-fair policy of the read-write lock design ("Fairness"), over a quorum.
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
//! A refused waiter is told its rank on each node: how many entries ahead of it must leave
//! first (for a reader, those up to the last writer ahead; the readers at the front share, and
//! all have rank 0). It then lets that many releases pass before it tries again, so that at a
//! release only the head (or the heads) retries, not every waiter ([`Ranks`]). Its backstop
//! retry remains, so a lost announcement or an entry that expired unannounced costs it one
//! retry delay, never its place.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::MAX_NODES;
use crate::engine::keys::{self, Derived};
use crate::engine::ops::{int_verdict, Caps, Op, Script, ScriptForm, Verdict};
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

/// The tickets one process hands its fair waiters: each is its wall clock in microseconds
/// when it starts waiting, but never at or before the last one handed out, so that the waiters
/// of one process are served in the order they arrived even when two arrive within the same
/// microsecond (an equal ticket would leave their order to their random ids) or the wall clock
/// steps back.
#[derive(Debug, Default)]
pub struct Tickets {
    last: AtomicU64,
}

impl Tickets {
    pub const fn new() -> Tickets {
        Tickets {
            last: AtomicU64::new(0),
        }
    }

    /// The ticket of a waiter that starts waiting at `wall_micros`.
    pub fn next(&self, wall_micros: u64) -> u64 {
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let t = wall_micros.max(last.saturating_add(1));
            match self
                .last
                .compare_exchange_weak(last, t, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return t,
                Err(now) => last = now,
            }
        }
    }
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
        self.write_queue_args(out, ids);
    }

    /// Writes the four arguments the fair gate takes last: the waiter id, ticket, entry TTL,
    /// join (for a script that writes its own before them).
    pub fn write_queue_args(&self, out: &mut Vec<u8>, ids: AttemptIds<'_>) {
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

/// How many announcements of recent releases a waiter remembers, so that one release, which
/// every node announces, lowers its rank once.
const RECENT_RELEASES: usize = 4;

/// What a fair waiter knows of its place in line: the rank each node gave its last attempt,
/// and the releases announced since that attempt started.
///
/// Every node orders the same waiters alike, and every entry ahead of a waiter leaves only by
/// taking the lock (then releasing it: one announcement), by leaving (announced when the lock
/// is free) or by expiring (not announced). So after `r` releases a waiter whose rank was `r`
/// on a quorum of nodes is probably the head there, and until then its attempts cannot win: it
/// waits for them rather than retry at each release, and only the head (or the heads: readers
/// at the front) retries. The estimate errs low: releases of holders that never queued, and the
/// cleanups of other waiters, count as well; a waiter that thinks itself the head too early
/// retries once more and learns its rank again. An entry that leaves unannounced makes the
/// estimate too high: then the waiter's backstop retry (see `acquire`), which it does not count
/// against the retry count, learns the true rank. A rank that is not known on a quorum counts
/// as 0: such a waiter behaves as every waiter did before ranks, and retries at each release.
#[derive(Debug)]
pub struct Ranks {
    /// Rank per node (bit `i` of `known` says whether node `i` gave one).
    ranks: [u16; MAX_NODES],
    known: u64,
    /// Releases announced since the attempt started.
    seen: u32,
    /// The last releases counted, each announced by every node: the first 16 characters of
    /// their tokens (and how many of them), most recent first.
    recent: [([u8; RECENT_ID_LEN], u8); RECENT_RELEASES],
}

/// How many characters of a token an announcement carries (see
/// [`WAKE_PREFIX`](crate::engine::keys::WAKE_PREFIX)).
const RECENT_ID_LEN: usize = 16;

impl Default for Ranks {
    fn default() -> Self {
        Ranks::new()
    }
}

impl Ranks {
    /// Nothing known.
    pub const fn new() -> Ranks {
        Ranks {
            ranks: [0; MAX_NODES],
            known: 0,
            seen: 0,
            recent: [([0; RECENT_ID_LEN], 0); RECENT_RELEASES],
        }
    }

    /// A new attempt starts: its replies will say the rank again.
    pub fn clear(&mut self) {
        self.known = 0;
        self.seen = 0;
    }

    /// Node `node` answered the current attempt with `rank`.
    pub fn record(&mut self, node: usize, rank: u32) {
        if node < MAX_NODES {
            self.ranks[node] = u16::try_from(rank).unwrap_or(u16::MAX);
            self.known |= 1 << node;
        }
    }

    /// A release was announced with `message` (the start of the released token): it lowers
    /// the rank by one, unless it is a release already counted (announced by another node).
    /// Returns whether it counted.
    pub fn release_seen(&mut self, message: &[u8]) -> bool {
        if !message.is_empty() && message.len() <= RECENT_ID_LEN {
            let same = |(id, len): &([u8; RECENT_ID_LEN], u8)| {
                usize::from(*len) == message.len() && id[..message.len()] == *message
            };
            if self.recent.iter().any(same) {
                return false;
            }
            self.recent.copy_within(..RECENT_RELEASES - 1, 1);
            let mut id = [0; RECENT_ID_LEN];
            id[..message.len()].copy_from_slice(message);
            self.recent[0] = (id, message.len() as u8);
        }
        self.seen = self.seen.saturating_add(1);
        true
    }

    /// How many more releases this waiter expects before its attempts can win: the rank it
    /// has on `quorum` nodes (the `quorum`-th smallest it was given) less the releases seen
    /// since. 0 (try at the next release) when fewer than `quorum` nodes gave one.
    pub fn ahead(&self, quorum: usize) -> u32 {
        if quorum == 0 || (self.known.count_ones() as usize) < quorum {
            return 0;
        }
        let mut known = [0u16; MAX_NODES];
        let mut n = 0;
        for (i, &rank) in self.ranks.iter().enumerate() {
            if self.known & 1 << i != 0 {
                known[n] = rank;
                n += 1;
            }
        }
        let (_, kth, _) = known[..n].select_nth_unstable(quorum - 1);
        u32::from(*kth).saturating_sub(self.seen)
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
    /// Which lock's queue it is: the slot of its wake channel on a Redis Cluster member.
    pub family: keys::Family,
    /// The waiter's id, the rest of its queue entry.
    pub waiter: &'a [u8],
}

impl Op for Leave<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        write_eval_head(out, LEAVE.announcing(caps.sharded), form, 3, 2);
        self.keys.write(out);
        resp::write_bulk_parts(out, &[self.kind, self.waiter]);
        keys::wake_channel_for(self.resource, self.family, caps.sharded).write_bulk(out);
        0
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
    fn a_process_hands_out_tickets_in_arrival_order() {
        let t = Tickets::new();
        assert_eq!(t.next(100), 100);
        // The same microsecond, then a clock that stepped back: still later than the last.
        assert_eq!(t.next(100), 101);
        assert_eq!(t.next(50), 102);
        assert_eq!(t.next(500), 500);
    }

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

    #[test]
    fn the_rank_is_the_quorum_th_smallest_less_the_releases_seen() {
        let mut r = Ranks::new();
        assert_eq!(r.ahead(3), 0, "nothing known");
        r.record(0, 4);
        r.record(1, 2);
        assert_eq!(r.ahead(3), 0, "known on too few nodes");
        r.record(3, 3);
        assert_eq!(r.ahead(3), 4);
        // A late reply from the last node lowers it.
        r.record(4, 1);
        assert_eq!(r.ahead(3), 3);
        // One release, announced by every node, counts once; another counts too.
        assert!(r.release_seen(b"aaaaaaaaaaaaaaaa"));
        assert!(!r.release_seen(b"aaaaaaaaaaaaaaaa"));
        assert_eq!(r.ahead(3), 2);
        assert!(r.release_seen(b"bbbbbbbbbbbbbbbb"));
        // An announcement with no name cannot be told apart: each counts.
        assert!(r.release_seen(b""));
        assert_eq!(r.ahead(3), 0);
        assert!(r.release_seen(b"cccccccccccccccc"));
        assert_eq!(r.ahead(3), 0, "never below 0");
        // A new attempt forgets the ranks and the count, not the releases already counted.
        r.clear();
        assert_eq!(r.ahead(1), 0);
        r.record(2, 1);
        assert_eq!(r.ahead(1), 1);
        assert!(!r.release_seen(b"bbbbbbbbbbbbbbbb"));
        assert_eq!(r.ahead(1), 1);
        // Ranks past what is kept saturate; nodes past the most a client has are ignored.
        r.record(5, u32::MAX);
        r.record(MAX_NODES, 0);
        assert_eq!(r.ahead(2), u32::from(u16::MAX));
    }
}
