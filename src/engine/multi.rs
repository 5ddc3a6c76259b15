//! All-or-none locks over a set of keys: the commands each node is sent, and what its replies
//! mean.
//!
//! Each node runs one script that takes every key of the set or none of them, atomically on
//! that node. The quorum, validity, cleanup and retry around it are the mutex's (Redlock's): a
//! set is held when a quorum of nodes granted the *whole* set. A node that holds any key of the
//! set for someone else grants none of it, so there is never a partial hold on a node, and a
//! lost attempt is released on every node like a lost mutex attempt.
//!
//! Each key holds the set's token as a plain string, as a mutex key holds its token. A set and
//! a mutex therefore exclude each other on every key they share.
//!
//! The keys are sorted before they are sent. Atomic all-or-none scripts cannot deadlock
//! whatever the order (nothing is held while waiting for the rest), so sorting is not for
//! safety: it makes the same set always send the same command, and the guard list its keys in
//! one order.
#![forbid(unsafe_code)]

use crate::engine::fair::{write_eval_head, AttemptIds, FairState};
use crate::engine::keys::{self, Derived};
use crate::engine::ops::{int_verdict, write_eval, Arg, Caps, Op, ScriptForm, Verdict};
pub use crate::engine::scripts::{ACQUIRE_ALL, EXTEND_ALL, FAIR_ACQUIRE_ALL, RELEASE_ALL};
use crate::engine::Vote;
use crate::resp::{self, Reply};

/// All-or-none acquire of a set.
#[derive(Debug, Clone, Copy)]
pub struct AcquireAll<'a> {
    /// The set's keys, sorted, without duplicates.
    pub keys: &'a [&'a [u8]],
    /// This attempt's token.
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for AcquireAll<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &ACQUIRE_ALL,
            form,
            self.keys,
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// All-or-none acquire of a set behind the fair queue of every key of it:
/// [`FAIR_ACQUIRE_ALL`]. The queues are the mutex queues of the keys, so a fair set waiter and a
/// fair mutex waiter on a key it shares wait in one line.
#[derive(Debug, Clone, Copy)]
pub struct FairAcquireAll<'a> {
    /// The set's keys, sorted, without duplicates.
    pub keys: &'a [&'a [u8]],
    /// This attempt's token, and the waiter's queue entries.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// Place in the queues and what goes with it, kept across attempts.
    pub fair: &'a FairState,
}

impl Op for FairAcquireAll<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let n = self.keys.len();
        write_eval_head(out, &FAIR_ACQUIRE_ALL, form, 3 * n, 6);
        for key in self.keys {
            resp::write_bulk(out, key);
        }
        for key in self.keys {
            Derived::MutexQueue.of(key).write_bulk(out);
            Derived::MutexQueueExpiries.of(key).write_bulk(out);
        }
        self.fair.write_args(out, self.ids, self.ttl_ms, None);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        self.fair.classify(reply)
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        crate::engine::fair::queued_rank(reply)
    }
}

/// Release of a set. Every integer is an acknowledgement: fewer keys than the set's only means
/// some had expired, were never set on that node, or now hold something else (another token,
/// or a value of another type that someone else wrote there). Every key that holds our token
/// is released whatever the others hold.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseAll<'a> {
    keys: &'a [&'a [u8]],
    token: &'a [u8],
}

impl<'a> ReleaseAll<'a> {
    /// The release of `keys` held with `token`.
    pub fn new(keys: &'a [&'a [u8]], token: &'a [u8]) -> ReleaseAll<'a> {
        ReleaseAll { keys, token }
    }
}

impl Op for ReleaseAll<'_> {
    /// The keys, then the token, then the wake channel of each key.
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    /// On a Redis Cluster member's master, announced with `SPUBLISH` on each key's channel in
    /// the set's slot.
    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        let n = self.keys.len();
        write_eval_head(out, RELEASE_ALL.announcing(caps.sharded), form, n, 1 + n);
        for key in self.keys {
            resp::write_bulk(out, key);
        }
        resp::write_bulk(out, self.token);
        for key in self.keys {
            keys::wake_channel_for(key, keys::Family::Mutex, caps.sharded).write_bulk(out);
        }
        0
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(n) if *n >= 0 => Verdict::Vote(Vote::Yes),
            other => int_verdict(other),
        }
    }
}

/// All-or-none extend of a set.
#[derive(Debug, Clone, Copy)]
pub struct ExtendAll<'a> {
    /// The set's keys.
    pub keys: &'a [&'a [u8]],
    /// The holder's token.
    pub token: &'a [u8],
    /// The new TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for ExtendAll<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &EXTEND_ALL,
            form,
            self.keys,
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::keys::WAKE_PREFIX;
    use crate::resp::{decode, Limits, Status, Value};

    fn args_of(op: &dyn Op) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        op.encode(&mut out, ScriptForm::Sha);
        let Ok(Status::Complete((reply, used))) = decode(&out, &Limits::default()) else {
            panic!("not one complete command");
        };
        assert_eq!(used, out.len());
        match reply.to_value() {
            Value::Array(Some(items)) => items
                .into_iter()
                .map(|v| match v {
                    Value::Bulk(Some(b)) => b,
                    other => panic!("not a bulk string: {other:?}"),
                })
                .collect(),
            other => panic!("not an array: {other:?}"),
        }
    }

    #[test]
    fn release_announces_every_key_on_its_own_channel() {
        let keys: [&[u8]; 2] = [b"a", b"b"];
        let args = args_of(&ReleaseAll::new(&keys, b"tok"));
        let mut wake_a = WAKE_PREFIX.to_vec();
        wake_a.push(b'a');
        let mut wake_b = WAKE_PREFIX.to_vec();
        wake_b.push(b'b');
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(args[1], RELEASE_ALL.sha);
        assert_eq!(args[2], b"2");
        assert_eq!(
            &args[3..],
            &[
                b"a".to_vec(),
                b"b".to_vec(),
                b"tok".to_vec(),
                wake_a,
                wake_b
            ]
        );
    }

    #[test]
    fn acquire_sends_keys_then_token_and_ttl() {
        let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
        let op = AcquireAll {
            keys: &keys,
            token: b"tok",
            ttl_ms: 1500,
        };
        let args = args_of(&op);
        assert_eq!(args[2], b"3");
        assert_eq!(&args[3..], &[&b"a"[..], b"b", b"c", b"tok", b"1500"]);
        assert_eq!(op.classify(&Reply::Integer(1)), Verdict::Vote(Vote::Yes));
        assert_eq!(op.classify(&Reply::Integer(0)), Verdict::Vote(Vote::No));
    }

    #[test]
    fn release_counts_any_number_of_deleted_keys_as_an_acknowledgement() {
        let keys: [&[u8]; 1] = [b"a"];
        let op = ReleaseAll::new(&keys, b"t");
        for n in [0, 1, 7] {
            assert_eq!(op.classify(&Reply::Integer(n)), Verdict::Vote(Vote::Yes));
        }
        assert!(matches!(
            op.classify(&Reply::Integer(-1)),
            Verdict::Vote(Vote::Failed(_))
        ));
    }
}
