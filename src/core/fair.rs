//! The FIFO-fair policy (seed 000, "Fairness"), over a quorum.
//!
//! Each resource `K` has a queue of waiters on every node: a sorted set `Q` of tokens scored by
//! a *ticket*, and a sorted set `QX` of the same tokens scored by when each entry expires on
//! that node's own clock. A waiter chooses its ticket once, when it starts waiting (its wall
//! clock in microseconds), and uses it on every node and every attempt, so every node orders
//! the same waiters the same way: by ticket, then by token (Redis orders equal scores by
//! member). Only the head of a node's queue may take the lock on that node.
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
//! Key names: `Q` and `QX` are derived from `K` so they share its Redis Cluster hash slot; see
//! [`write_derived_key`].
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::time::Duration;

use crate::core::ops::{int_verdict, Op, Script, ScriptForm, Verdict, WAKE_PREFIX};
use crate::resp::{self, Reply};

/// Suffix of the queue of waiters' tickets.
pub const QUEUE_SUFFIX: &[u8] = b":q";
/// Suffix of the queue entries' expiry times.
pub const QUEUE_EXPIRY_SUFFIX: &[u8] = b":qx";

/// Writes, as one bulk string, the name derived from `key` by appending `suffix`, in the same
/// Redis Cluster hash slot as `key`.
///
/// If `key` has a hash tag (a `{...}` with something inside: the first `{` and the first `}`
/// after it), appending keeps that tag. Otherwise the key is wrapped as `{key}suffix`, whose tag
/// is the whole key, which hashes exactly as the bare key does.
pub fn write_derived_key(out: &mut Vec<u8>, key: &[u8], suffix: &[u8]) {
    if has_hash_tag(key) {
        resp::write_bulk_parts(out, &[key, suffix]);
    } else {
        resp::write_bulk_parts(out, &[b"{", key, b"}", suffix]);
    }
}

/// Whether Redis Cluster would hash `key` by a tag rather than whole.
pub fn has_hash_tag(key: &[u8]) -> bool {
    match key.iter().position(|&b| b == b'{') {
        Some(open) => key[open + 1..]
            .iter()
            .position(|&b| b == b'}')
            .is_some_and(|len| len > 0),
        None => false,
    }
}

/// Fair mutex acquire. KEYS: lock, queue, expiries. ARGV: token, ttl ms, ticket, entry TTL ms,
/// join ('1' to join even an empty queue). Returns 1 when the lock was taken, 0 when it was
/// refused without queueing, 2 when it was refused and the waiter is (still) queued.
pub static FAIR_ACQUIRE: Script = Script::new(
    r#"local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, #dead do
  redis.call('ZREM', KEYS[2], dead[i])
  redis.call('ZREM', KEYS[3], dead[i])
end
if redis.call('ZCARD', KEYS[2]) > 0 or ARGV[5] == '1' then
  local ttl = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
  for k = 2, 3 do
    if redis.call('PTTL', KEYS[k]) < ttl then redis.call('PEXPIRE', KEYS[k], ttl) end
  end
  if redis.call('ZRANGE', KEYS[2], 0, 0)[1] ~= ARGV[1] then return 2 end
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    return 1
  end
  return 2
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0"#,
);

/// A waiter leaves the queue. KEYS: lock, queue, expiries. ARGV: token, wake channel. If the
/// lock is free, the next waiter is told at once rather than at its next retry.
pub static LEAVE: Script = Script::new(
    r#"local gone = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if gone == 1 and redis.call('EXISTS', KEYS[1]) == 0 then redis.call('PUBLISH', ARGV[2], string.sub(ARGV[1], 1, 16)) end
return gone"#,
);

fn write_queue_eval(out: &mut Vec<u8>, script: &Script, form: ScriptForm, key: &[u8], args: usize) {
    resp::write_array_len(out, 6 + args);
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
    resp::write_bulk(out, b"3");
    resp::write_bulk(out, key);
    write_derived_key(out, key, QUEUE_SUFFIX);
    write_derived_key(out, key, QUEUE_EXPIRY_SUFFIX);
}

/// A fair mutex acquisition: the same vote as `SET NX PX`, but only the queue's head may win.
#[derive(Debug)]
pub struct FairAcquire<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// This acquirer's token (also its queue entry).
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// The waiter's place: chosen once, the same on every node.
    pub ticket: u64,
    /// How long a queue entry lives without being refreshed by a retry.
    pub entry_ttl_ms: u64,
    /// Join even an empty queue once the caller has waited this long.
    pub join_after: Duration,
    join: Cell<bool>,
    /// Some node has queued this waiter, so it must leave the queue when done.
    queued: Cell<bool>,
    leave: Leave<'a>,
}

impl<'a> FairAcquire<'a> {
    /// A fair acquisition of `key` with `token`.
    pub fn new(
        key: &'a [u8],
        token: &'a [u8],
        ttl_ms: u64,
        ticket: u64,
        entry_ttl_ms: u64,
        join_after: Duration,
    ) -> Self {
        FairAcquire {
            key,
            token,
            ttl_ms,
            ticket,
            entry_ttl_ms,
            join_after,
            join: Cell::new(false),
            queued: Cell::new(false),
            leave: Leave { key, token },
        }
    }
}

impl Op for FairAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_queue_eval(out, &FAIR_ACQUIRE, form, self.key, 5);
        resp::write_bulk(out, self.token);
        resp::write_bulk_u64(out, self.ttl_ms);
        resp::write_bulk_u64(out, self.ticket);
        resp::write_bulk_u64(out, self.entry_ttl_ms);
        resp::write_bulk(out, if self.join.get() { b"1" } else { b"0" });
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(2) => {
                self.queued.set(true);
                Verdict::Vote(crate::core::Vote::No)
            }
            other => int_verdict(other),
        }
    }

    fn on_retry(&self, waited: Duration) {
        if waited >= self.join_after {
            self.join.set(true);
        }
    }

    fn on_finish(&self) -> Option<&dyn Op> {
        // Entries left on nodes that refused (even if the quorum was won elsewhere) would make
        // this waiter the head there until they expire; take them out now.
        self.queued.get().then_some(&self.leave as &dyn Op)
    }
}

/// Leaves the fair queue of `key`.
#[derive(Debug, Clone, Copy)]
pub struct Leave<'a> {
    /// The lock's key.
    pub key: &'a [u8],
    /// The waiter's token.
    pub token: &'a [u8],
}

impl Op for Leave<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_queue_eval(out, &LEAVE, form, self.key, 2);
        resp::write_bulk(out, self.token);
        resp::write_bulk_parts(out, &[WAKE_PREFIX, self.key]);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(_) => Verdict::Vote(crate::core::Vote::Yes),
            other => int_verdict(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derived(key: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_derived_key(&mut out, key, QUEUE_SUFFIX);
        out
    }

    #[test]
    fn derived_keys_share_the_hash_slot() {
        assert_eq!(derived(b"job"), b"$7\r\n{job}:q\r\n");
        assert_eq!(derived(b"{user1}.job"), b"$13\r\n{user1}.job:q\r\n");
        // An empty tag is no tag: Redis hashes the whole key, so we wrap it.
        assert_eq!(derived(b"a{}b"), b"$8\r\n{a{}b}:q\r\n");
        assert!(!has_hash_tag(b"a}b{"));
        assert!(has_hash_tag(b"x{y}"));
    }

    #[test]
    fn joins_only_after_the_interval() {
        let op = FairAcquire::new(b"k", b"t", 1000, 7, 500, Duration::from_millis(100));
        let body = |op: &FairAcquire<'_>| {
            let mut out = Vec::new();
            op.encode(&mut out, ScriptForm::Sha);
            out
        };
        assert!(body(&op).ends_with(b"$1\r\n0\r\n"));
        op.on_retry(Duration::from_millis(50));
        assert!(body(&op).ends_with(b"$1\r\n0\r\n"));
        op.on_retry(Duration::from_millis(100));
        assert!(body(&op).ends_with(b"$1\r\n1\r\n"));
    }

    #[test]
    fn leaves_only_if_some_node_queued_it() {
        let op = FairAcquire::new(b"k", b"t", 1000, 7, 500, Duration::ZERO);
        assert_eq!(
            op.classify(&Reply::Integer(0)),
            Verdict::Vote(crate::core::Vote::No)
        );
        assert!(op.on_finish().is_none());
        assert_eq!(
            op.classify(&Reply::Integer(1)),
            Verdict::Vote(crate::core::Vote::Yes)
        );
        assert!(op.on_finish().is_none());
        assert_eq!(
            op.classify(&Reply::Integer(2)),
            Verdict::Vote(crate::core::Vote::No)
        );
        assert!(op.on_finish().is_some());
    }
}
