//! A counting semaphore over N independent masters: the quorum arithmetic, the scripts'
//! commands, and the count of free permits.
//!
//! `k` permits over `N` nodes. Each node admits at most `c` live holders (its capacity, here
//! always `c = k`), and a client holds a permit when `q` nodes admitted its token within the
//! validity, exactly as a mutex holder holds its lock on a quorum.
//!
//! - **Safety.** `k + 1` simultaneous holders would need `(k + 1)·q` admissions, and the nodes
//!   have only `c·N` slots, so they are impossible iff `(k + 1)·q > c·N`. With `c = k` the
//!   smallest safe quorum is `q = ⌊k·N / (k + 1)⌋ + 1` ([`safe_quorum`]); `k = 1` gives the
//!   Redlock majority `⌊N/2⌋ + 1`.
//! - **Liveness.** `k` holders fit when every node is up: `k·q ≤ c·N` holds for any `q ≤ N`.
//! - **The trap.** The "majority" quorum with `c = k` admits too many holders for `k ≥ 2`: with `N = 5`,
//!   `k = 2`, `q = 3`, three holders take 9 of the 10 slots. [`check`] refuses it.
//!
//! A node's holders are a sorted set of tokens scored by their expiry on that node's own clock
//! (as a read-write lock's readers are), with a marker member `=` scored by `−c`, so that a
//! client asking with another capacity is refused instead of silently overfilling the node.
#![forbid(unsafe_code)]

use std::time::Instant;

use crate::engine::fair::{write_eval_head, AttemptIds, FairState};
use crate::engine::keys::{self, SemKeys};
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::{error_verdict, int_verdict, write_eval, Arg, Caps, Op, ScriptForm};
use crate::engine::ops::{server_error, Verdict};
pub use crate::engine::scripts::{FAIR_SEM_ACQUIRE, SEM_ACQUIRE, SEM_COUNT, SEM_RELEASE};
use crate::engine::Vote;
use crate::error::{InvalidArgument, NodeErrorKind};
use crate::resp::Reply;
use crate::rng::Entropy;

/// The most permits a semaphore may have: far beyond any real use, and small enough that
/// every count stays exact in the scripts' Lua numbers.
pub const MAX_PERMITS: u32 = 1 << 20;

/// The smallest quorum that makes `permits + 1` holders impossible over `nodes` nodes whose
/// capacity is `permits` each: `⌊permits·nodes / (permits + 1)⌋ + 1`.
pub const fn safe_quorum(permits: u32, nodes: usize) -> usize {
    let k = permits as usize;
    k * nodes / (k + 1) + 1
}

/// Whether quorum `quorum` keeps a semaphore of `permits` (capacity `permits` per node) over
/// `nodes` nodes safe and usable; the refusal says why not.
pub fn check(permits: u32, nodes: usize, quorum: usize) -> Result<(), InvalidArgument> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(InvalidArgument::BadPermits {
            permits,
            max: MAX_PERMITS,
        });
    }
    let k = permits as u128;
    let (n, q) = (nodes as u128, quorum as u128);
    if quorum == 0 || quorum > nodes || (k + 1) * q <= k * n {
        return Err(InvalidArgument::UnsafeQuorum {
            permits,
            nodes,
            quorum,
            min: safe_quorum(permits, nodes),
        });
    }
    Ok(())
}

/// How many permits can be held at once while `down` of `nodes` nodes are down, with quorum
/// `quorum` and capacity `permits` per node: `min(k, ⌊k·(N − d) / q⌋)`, and 0 once fewer than
/// `q` nodes are up.
pub fn usable_permits(permits: u32, nodes: usize, quorum: usize, down: usize) -> u32 {
    if quorum == 0 || down > nodes || nodes - down < quorum {
        return 0;
    }
    let up = (nodes - down) as u64;
    let k = u64::from(permits);
    (k * up / quorum as u64).min(k) as u32
}

/// Semaphore acquire; see [`SEM_ACQUIRE`].
#[derive(Debug, Clone, Copy)]
pub struct SemAcquire<'a> {
    /// The semaphore's keys.
    pub keys: &'a SemKeys,
    /// This attempt's token.
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// The capacity of each node.
    pub capacity: u32,
}

impl Op for SemAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &SEM_ACQUIRE,
            form,
            &[self.keys.holders()],
            &[
                Arg::Bytes(self.token),
                Arg::Num(self.ttl_ms),
                Arg::Num(u64::from(self.capacity)),
            ],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        classify_acquire(reply, int_verdict)
    }
}

/// A fair semaphore acquire: [`SemAcquire`] behind the fair queue, where only the head goes.
#[derive(Debug)]
pub struct FairSemAcquire<'a> {
    /// The semaphore's keys.
    pub keys: &'a SemKeys,
    /// This attempt's token, and the waiter's queue entry.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// The capacity of each node.
    pub capacity: u32,
    /// Place in the queue, kept across attempts.
    pub fair: &'a FairState,
}

impl Op for FairSemAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval_head(out, &FAIR_SEM_ACQUIRE, form, 3, 7);
        for key in [
            self.keys.holders(),
            self.keys.queue(),
            self.keys.queue_expiries(),
        ] {
            crate::resp::write_bulk(out, key);
        }
        self.fair
            .write_args(out, self.ids, self.ttl_ms, Some(u64::from(self.capacity)));
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        classify_acquire(reply, |r| self.fair.classify(r))
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        crate::engine::fair::queued_rank(reply)
    }
}

/// The error a node answers when its semaphore was created with another capacity.
pub(crate) const MISMATCH: &[u8] = b"ERR redlock-mux semaphore has ";

/// A capacity mismatch is a configuration error (clients disagree on the permits), reported
/// as a setup failure of that node, so that it ends the acquisition instead of being retried.
fn classify_acquire(reply: &Reply<'_>, other: impl Fn(&Reply<'_>) -> Verdict) -> Verdict {
    match reply {
        Reply::Error(m) if m.starts_with(MISMATCH) => {
            Verdict::Vote(Vote::Failed(NodeErrorKind::Setup {
                command: "semaphore",
                cause: Box::new(server_error(m)),
            }))
        }
        other_reply => other(other_reply),
    }
}

/// Semaphore release, and cleanup of a lost attempt; see [`SEM_RELEASE`]. Every integer is an
/// acknowledgement: 0 only means the token was not there.
#[derive(Debug, Clone, Copy)]
pub struct SemRelease<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The holders key.
    pub holders: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
}

impl Op for SemRelease<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        write_eval(
            out,
            SEM_RELEASE.announcing(caps.sharded),
            form,
            &[self.holders],
            &[
                Arg::Bytes(self.token),
                Arg::Wake(keys::wake_channel_for(
                    self.resource,
                    keys::Family::Semaphore,
                    caps.sharded,
                )),
            ],
        );
        0
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Integer(0 | 1) => Verdict::Vote(Vote::Yes),
            other => int_verdict(other),
        }
    }
}

/// Semaphore extend: [`READ_EXTEND`](crate::engine::scripts::READ_EXTEND) on the holders.
#[derive(Debug, Clone, Copy)]
pub struct SemExtend<'a> {
    /// The holders key.
    pub holders: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
    /// The new TTL in milliseconds.
    pub ttl_ms: u64,
}

impl Op for SemExtend<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        write_eval(
            out,
            &crate::engine::scripts::READ_EXTEND,
            form,
            &[self.holders],
            &[Arg::Bytes(self.token), Arg::Num(self.ttl_ms)],
        );
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        int_verdict(reply)
    }
}

/// Counts a semaphore's live holders on every node, and estimates from the counts how many
/// more permits could be taken now (see [`Census::estimate`]).
#[derive(Debug)]
pub(crate) struct Census<'a> {
    holders: &'a [u8],
    permits: u32,
    quorum: usize,
    counts: Vec<Option<Option<u64>>>,
    unsent: bool,
    /// Nodes (bit `i` for node `i`) owed the script with its body, and those sent it.
    resend: u64,
    resent: u64,
    done: bool,
}

impl<'a> Census<'a> {
    /// A count of `holders` on `nodes` nodes; nodes that fail (a node silent past the node
    /// timeout is failed by the driver) count as full.
    pub fn new(holders: &'a [u8], permits: u32, quorum: usize, nodes: usize) -> Census<'a> {
        Census {
            holders,
            permits,
            quorum,
            counts: vec![None; nodes],
            unsent: true,
            resend: 0,
            resent: 0,
            done: false,
        }
    }

    /// The number of further acquisitions that would win one after the other if nothing else
    /// changed: each needs `q` nodes with a free slot, so that is the `q`-th largest number of
    /// free slots over the nodes, a node that failed to answer counting as full.
    pub fn estimate(&self) -> u32 {
        estimate(
            self.permits,
            self.quorum,
            self.counts.iter().map(|c| c.flatten()),
        )
    }

    fn settle(&mut self) {
        if self.counts.iter().all(Option::is_some) {
            self.done = true;
        }
    }
}

/// See [`Census::estimate`]: `counts` are each node's live holders (`None`: no answer).
pub fn estimate(permits: u32, quorum: usize, counts: impl Iterator<Item = Option<u64>>) -> u32 {
    let k = u64::from(permits);
    let mut free: Vec<u64> = counts
        .map(|c| c.map_or(0, |c| k.saturating_sub(c)))
        .collect();
    free.sort_unstable_by(|a, b| b.cmp(a));
    match quorum.checked_sub(1).and_then(|i| free.get(i)) {
        Some(&f) => f.min(k) as u32,
        None => 0,
    }
}

impl Machine for Census<'_> {
    type Output = u32;

    fn handle_reply(
        &mut self,
        node: usize,
        _tag: Tag,
        reply: &Reply<'_>,
        _now: Instant,
        _rng: &mut dyn Entropy,
    ) {
        let Some(slot) = self.counts.get_mut(node) else {
            return;
        };
        if slot.is_some() {
            return;
        }
        match reply {
            Reply::Integer(n) => *slot = Some(u64::try_from(*n).ok()),
            Reply::Error(m)
                if matches!(error_verdict(m), Verdict::NoScript)
                    && node < 64
                    && self.resent & (1 << node) == 0 =>
            {
                self.resend |= 1 << node;
                return;
            }
            _ => *slot = Some(None),
        }
        self.settle();
    }

    fn handle_failure(
        &mut self,
        node: usize,
        _tag: Tag,
        _why: NodeErrorKind,
        _now: Instant,
        _rng: &mut dyn Entropy,
    ) {
        if let Some(slot) = self.counts.get_mut(node) {
            slot.get_or_insert(None);
        }
        self.settle();
    }

    fn handle_timeout(&mut self, _now: Instant, _rng: &mut dyn Entropy) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        if std::mem::take(&mut self.unsent) {
            return Some(Transmit {
                to: To::All,
                tag: Some(1),
                form: ScriptForm::Sha,
                what: What::Count,
                redo: None,
            });
        }
        // A node that answered NOSCRIPT is sent the body, once; its reply keeps the tag.
        if self.resend == 0 {
            return None;
        }
        let node = self.resend.trailing_zeros() as usize;
        self.resend &= !(1 << node);
        self.resent |= 1 << node;
        Some(Transmit {
            to: To::Node(node),
            tag: Some(1),
            form: ScriptForm::Body,
            what: What::Count,
            redo: None,
        })
    }

    fn encode(&self, t: &Transmit, _caps: Caps, out: &mut Vec<u8>) -> usize {
        write_eval(out, &SEM_COUNT, t.form, &[self.holders], &[]);
        0
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_outcome(&mut self) -> Option<u32> {
        // Given once: a second poll finds nothing.
        std::mem::take(&mut self.done).then(|| self.estimate())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_safe_quorum() {
        // k = 1 is the Redlock majority.
        for n in 1..=9 {
            assert_eq!(safe_quorum(1, n), n / 2 + 1);
        }
        assert_eq!(safe_quorum(2, 3), 3);
        assert_eq!(safe_quorum(3, 3), 3);
        assert_eq!(safe_quorum(2, 5), 4);
        assert_eq!(safe_quorum(3, 5), 4);
        assert_eq!(safe_quorum(4, 5), 5);
        assert_eq!(safe_quorum(100, 5), 5);
        // Exhaustively: the smallest q with (k + 1)·q > k·N, and it is never above N.
        for k in 1..=20u32 {
            for n in 1..=15usize {
                let q = safe_quorum(k, n);
                assert!(q <= n);
                assert!(check(k, n, q).is_ok());
                assert!(check(k, n, q - 1).is_err(), "k={k} n={n}");
            }
        }
    }

    #[test]
    fn unsound_or_unusable_configurations_are_refused() {
        // The naive majority: N = 5, k = 2, q = 3 admits 3 holders.
        assert!(matches!(
            check(2, 5, 3),
            Err(InvalidArgument::UnsafeQuorum { min: 4, .. })
        ));
        assert!(matches!(
            check(0, 5, 5),
            Err(InvalidArgument::BadPermits { .. })
        ));
        assert!(check(MAX_PERMITS + 1, 5, 5).is_err());
        assert!(check(2, 5, 6).is_err());
        assert!(check(2, 5, 0).is_err());
        assert!(check(2, 5, 5).is_ok());
    }

    #[test]
    fn rounds_take_the_semaphores_quorum_and_releases_need_only_break_it() {
        use crate::engine::kind::{Keys, Spec};
        let keys = SemKeys::new(b"k");
        let spec = |quorum| Spec {
            keys: Keys::Semaphore {
                resource: b"k",
                keys: &keys,
                capacity: 2,
                quorum,
            },
            fence: None,
        };
        assert_eq!(spec(4).quorum(5), 4);
        assert_eq!(spec(4).release_quorum(5), 2);
        assert_eq!(spec(3).release_quorum(3), 1);
        let mutex = Spec {
            keys: Keys::Mutex(b"k"),
            fence: None,
        };
        assert_eq!((mutex.quorum(5), mutex.release_quorum(5)), (3, 3));
    }

    #[test]
    fn usable_permits_degrade_with_nodes_down() {
        // N = 5, k = 2, q = 4: one node down keeps both permits, two stop acquires.
        assert_eq!(usable_permits(2, 5, 4, 0), 2);
        assert_eq!(usable_permits(2, 5, 4, 1), 2);
        assert_eq!(usable_permits(2, 5, 4, 2), 0);
        // N = 5, k = 3, q = 4: ⌊3·4/4⌋ = 3 with one down.
        assert_eq!(usable_permits(3, 5, 4, 1), 3);
        assert_eq!(usable_permits(3, 5, 4, 2), 0);
        // N = 7, k = 2, q = 5: ⌊2·6/5⌋ = 2 with one down, 2 with two (⌊10/5⌋), 0 with three.
        assert_eq!(usable_permits(2, 7, 5, 1), 2);
        assert_eq!(usable_permits(2, 7, 5, 2), 2);
        assert_eq!(usable_permits(2, 7, 5, 3), 0);
        // A quorum above the minimum degrades sooner: N = 7, k = 3, q = 6, one down: ⌊18/6⌋.
        assert_eq!(usable_permits(3, 7, 6, 1), 3);
        assert_eq!(usable_permits(3, 9, 7, 2), 3);
    }

    #[test]
    fn the_estimate_is_the_quorum_th_largest_free_count() {
        // Every holder on every node: free = k − holders.
        assert_eq!(estimate(3, 2, [Some(1), Some(1), Some(1)].into_iter()), 2);
        // A node that did not answer counts as full.
        assert_eq!(estimate(3, 3, [Some(0), Some(0), None].into_iter()), 0);
        assert_eq!(
            estimate(
                2,
                4,
                [Some(0), Some(2), Some(1), Some(1), Some(0)].into_iter()
            ),
            1
        );
        // More live entries than permits (late cleanups) is still 0, not an underflow.
        assert_eq!(estimate(2, 1, [Some(5)].into_iter()), 0);
    }
}
