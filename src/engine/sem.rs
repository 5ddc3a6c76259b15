//! A counting semaphore over N independent masters: the quorum arithmetic, the scripts'
//! commands, and the count of free permits.
//!
//! `k` permits over `N` nodes. Each node admits at most `c` live holders (its slots), and a
//! client holds a permit when `q` nodes admitted its token within the validity, exactly as a
//! mutex holder holds its lock on a quorum.
//!
//! - **Safety.** `k + 1` simultaneous holders would need `(k + 1)·q` admissions, and the nodes
//!   have only `c·N` slots, so they are impossible iff `(k + 1)·q > c·N`.
//! - **Liveness.** All `k` permits fit when every node is up iff `k·q ≤ c·N` (each holder
//!   keeps `q` slots: the slots it was granted beyond its quorum are given back at once, when
//!   `c < k`).
//! - **The choice** ([`shape`]): the smallest `c`, then the smallest `q`, that satisfy both.
//!   Small `c` means a small quorum: `N = 5`, `k = 2` gives `c = 1`, `q = 2`, where `c = k`
//!   needed `q = 4`. `k = 1` gives `c = 1` and the Redlock majority `⌊N/2⌋ + 1`.
//! - **The trap.** The "majority" quorum with `c = k` admits too many holders for `k ≥ 2`: with `N = 5`,
//!   `k = 2`, `q = 3`, three holders take 9 of the 10 slots. [`check`] refuses it.
//!
//! With one slot per node (`c = 1`), a node's part of a permit is one string key, taken and
//! given back as a mutex takes its key ([`SemKeyAcquire`]: `SET key value NX PX ttl GET`,
//! [`SemKeyRelease`], [`SemKeyExtend`]), whose value is the holder's token followed by a
//! [`Mark`] (`:sem:` and `k`): a key admits one live holder, and it expires on the node's own
//! clock. With more, a node's holders are a sorted set of tokens scored by their expiry on that
//! node's own clock (as a read-write lock's readers are), with a marker member `=` scored by
//! minus the shape ([`shape_arg`]: `k` when `c = k`, as before there was a choice, and
//! `c + k·2²¹` otherwise). Either way a client asking with other permits or other slots (the
//! other representation answers `WRONGTYPE`) is refused instead of silently overfilling the
//! node.
#![forbid(unsafe_code)]

use std::time::Instant;

use crate::engine::fair::{write_eval_head, AttemptIds, FairState};
use crate::engine::keys::{self, SemKeys};
use crate::engine::machine::{Machine, Tag, To, Transmit, What};
use crate::engine::ops::{error_verdict, int_verdict, write_eval, Arg, Caps, Op, ScriptForm};
use crate::engine::ops::{server_error, Verdict};
pub use crate::engine::scripts::{
    FAIR_SEM_ACQUIRE, FAIR_SEM_KEY_ACQUIRE, SEM_ACQUIRE, SEM_COUNT, SEM_RELEASE,
};
use crate::engine::Vote;
use crate::error::{InvalidArgument, NodeErrorKind};
use crate::resp::{Reply, ServerErrorKind};
use crate::rng::Entropy;

/// The most permits a semaphore may have: far beyond any real use, and small enough that
/// every count stays exact in the scripts' Lua numbers.
pub const MAX_PERMITS: u32 = 1 << 20;

/// The smallest quorum that makes `permits + 1` holders impossible over `nodes` nodes with
/// `permits` slots each: `⌊permits·nodes / (permits + 1)⌋ + 1`.
pub const fn safe_quorum(permits: u32, nodes: usize) -> usize {
    let k = permits as usize;
    k * nodes / (k + 1) + 1
}

/// The slots per node `c` that make quorum `quorum` safe and usable for `permits` permits
/// over `nodes` nodes: the smallest `c ≤ permits` with `permits·quorum ≤ c·nodes`
/// (every permit fits) and `c·nodes < (permits + 1)·quorum` (one more holder does not);
/// `None` when there is none.
pub fn slots_for(permits: u32, nodes: usize, quorum: usize) -> Option<u32> {
    if permits == 0 || quorum == 0 || quorum > nodes {
        return None;
    }
    let (k, n, q) = (u128::from(permits), nodes as u128, quorum as u128);
    let c = (k * q).div_ceil(n).max(1);
    (c <= k && c * n < (k + 1) * q).then_some(c as u32)
}

/// The semaphore's shape over `nodes` nodes: `(c, q)`, the smallest slots per node, then the
/// smallest quorum, that keep `permits + 1` holders out and let `permits` in (see
/// [`slots_for`]), with `q ≥ 2` when `nodes ≥ 2` (a release needs `N − q + 1` nodes, so that
/// it spares one failure too). `c = permits` with [`safe_quorum`] always qualifies, so there is one for
/// every `permits ≥ 1` and `nodes ≥ 1`.
pub fn shape(permits: u32, nodes: usize) -> (u32, usize) {
    let k = u128::from(permits.max(1));
    let n = nodes.max(1) as u128;
    // For each quorum, the smallest slots that fit every permit are ⌈k·q / N⌉; the pair with
    // the fewest slots (then the smallest quorum) among those that are also safe.
    // At least 2 nodes when there are 2: a release needs N − q + 1 acknowledgements, so a
    // quorum of 1 would leave releases no node to spare.
    let mut best: Option<(u32, usize)> = None;
    for q in nodes.clamp(1, 2)..=nodes.max(1) {
        let c = (k * q as u128).div_ceil(n).max(1);
        if c <= k && c * n < (k + 1) * q as u128 && best.is_none_or(|(b, _)| (c as u32) < b) {
            best = Some((c as u32, q));
        }
    }
    best.unwrap_or((permits, safe_quorum(permits, nodes)))
}

/// The number the scripts are given for a semaphore of `permits` permits and `slots` slots per
/// node, kept (negated) as the marker's score on each node: `permits` when they are the same
/// (the one shape there was before the slots were chosen), and `slots + permits·2²¹`
/// otherwise, which no older marker has ([`MAX_PERMITS`] is 2²⁰). The scripts read the slots
/// back as the number modulo 2²¹.
pub fn shape_arg(permits: u32, slots: u32) -> u64 {
    if slots == permits {
        u64::from(permits)
    } else {
        u64::from(slots) + (u64::from(permits) << 21)
    }
}

/// Whether quorum `quorum` keeps a semaphore of `permits` over `nodes` nodes safe and usable
/// with some number of slots per node ([`slots_for`]); the refusal says why not.
pub fn check(permits: u32, nodes: usize, quorum: usize) -> Result<u32, InvalidArgument> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(InvalidArgument::BadPermits {
            permits,
            max: MAX_PERMITS,
        });
    }
    slots_for(permits, nodes, quorum).ok_or(InvalidArgument::UnsafeQuorum {
        permits,
        nodes,
        quorum,
        min: shape(permits, nodes).1,
    })
}

/// How many permits can be held at once while `down` of `nodes` nodes are down, with quorum
/// `quorum` and `slots` slots per node: `min(k, ⌊c·(N − d) / q⌋)`, and 0 once fewer than `q`
/// nodes are up.
pub fn usable_permits(permits: u32, slots: u32, nodes: usize, quorum: usize, down: usize) -> u32 {
    if quorum == 0 || down > nodes || nodes - down < quorum {
        return 0;
    }
    let up = (nodes - down) as u64;
    let c = u64::from(slots);
    (c * up / quorum as u64).min(u64::from(permits)) as u32
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
    /// The permits and slots per node, as [`shape_arg`] gives them.
    pub shape: u64,
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
                Arg::Num(self.shape),
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
    /// The permits and slots per node, as [`shape_arg`] gives them.
    pub shape: u64,
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
            .write_args(out, self.ids, self.ttl_ms, Some(self.shape));
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        classify_acquire(reply, |r| self.fair.classify(r))
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        crate::engine::fair::queued_rank(reply)
    }
}

/// The error a node answers when its semaphore was created with other permits or slots.
pub(crate) const MISMATCH: &[u8] = b"ERR redlock-mux semaphore has ";

/// A shape mismatch is a configuration error (clients disagree on the permits or the slots per
/// node, or an older version wrote the semaphore with other slots), reported
/// as a setup failure of that node, so that it ends the acquisition instead of being retried.
fn classify_acquire(reply: &Reply<'_>, other: impl Fn(&Reply<'_>) -> Verdict) -> Verdict {
    match reply {
        Reply::Error(m)
            if m.starts_with(MISMATCH) || ServerErrorKind::of(m) == ServerErrorKind::WrongType =>
        {
            Verdict::Vote(Vote::Failed(NodeErrorKind::Setup {
                command: "semaphore",
                cause: Box::new(server_error(m)),
            }))
        }
        other_reply => other(other_reply),
    }
}

/// What a one-slot semaphore's key holds after the holder's token: `:sem:` and the permits,
/// so that a client that asks with other permits, or another lock on the same key name, is
/// told apart from a holder of the same semaphore (a sorted set there, the shape with more
/// slots per node or an older version, answers `WRONGTYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    buf: [u8; 16],
    len: u8,
}

impl Mark {
    const HEAD: &'static [u8] = b":sem:";

    /// The mark of a semaphore of `permits` permits.
    pub fn new(permits: u32) -> Mark {
        let mut buf = [0u8; 16];
        let head = Self::HEAD.len();
        buf[..head].copy_from_slice(Self::HEAD);
        // At most 10 digits after the 5 bytes of the head.
        let mut digits = [0u8; 10];
        let (mut n, mut i) = (permits, digits.len());
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let len = head + digits.len() - i;
        buf[head..len].copy_from_slice(&digits[i..]);
        Mark {
            buf,
            len: len as u8,
        }
    }

    /// The mark's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The permits a key's value says, when it is a one-slot semaphore's (a token, then a mark).
    pub fn permits_of(value: &[u8]) -> Option<u32> {
        let at = value
            .windows(Self::HEAD.len())
            .rposition(|w| w == Self::HEAD)?;
        let digits = &value[at + Self::HEAD.len()..];
        if at == 0 || digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
}

/// Writes `token ++ mark` as one bulk string: the value a one-slot semaphore's key holds.
fn write_value(out: &mut Vec<u8>, token: &[u8], mark: &Mark) {
    crate::resp::write_bulk_parts(out, &[token, mark.as_bytes()]);
}

/// Whether `value` is `token ++ mark`.
fn is_value(value: &[u8], token: &[u8], mark: &Mark) -> bool {
    value.len() == token.len() + mark.as_bytes().len()
        && value.starts_with(token)
        && value.ends_with(mark.as_bytes())
}

/// A setup failure of the node for a semaphore key that holds something else than a holder of
/// this semaphore, with what it holds (`has`).
fn mismatch(has: &str, permits: u32) -> Verdict {
    let message = format!(
        "{}{has}, not {permits} permits, 1 per node",
        String::from_utf8_lossy(MISMATCH)
    );
    Verdict::Vote(Vote::Failed(NodeErrorKind::Setup {
        command: "semaphore",
        cause: Box::new(server_error(message.as_bytes())),
    }))
}

/// A one-slot semaphore's acquire on one node: `SET key token++mark NX PX ttl GET`, the
/// mutex's command with the old value back. Nil is a grant; a holder of the same semaphore is a
/// refusal; a sorted set (`WRONGTYPE`: more slots per node, or an older version), other
/// permits, or a value no semaphore wrote is a configuration error, never contention.
#[derive(Debug, Clone, Copy)]
pub struct SemKeyAcquire<'a> {
    /// The semaphore's key on each node.
    pub key: &'a [u8],
    /// This attempt's token.
    pub token: &'a [u8],
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// The semaphore's permits.
    pub permits: u32,
}

impl Op for SemKeyAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, _form: ScriptForm) {
        let mark = Mark::new(self.permits);
        crate::resp::write_array_len(out, 7);
        crate::resp::write_bulk(out, b"SET");
        crate::resp::write_bulk(out, self.key);
        write_value(out, self.token, &mark);
        crate::resp::write_bulk(out, b"NX");
        crate::resp::write_bulk(out, b"PX");
        crate::resp::write_bulk_u64(out, self.ttl_ms);
        crate::resp::write_bulk(out, b"GET");
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        let mark = Mark::new(self.permits);
        match reply {
            Reply::Bulk(None) => Verdict::Vote(Vote::Yes),
            // Our own value: this attempt's command went through before (its reply was lost).
            Reply::Bulk(Some(v)) if is_value(v, self.token, &mark) => Verdict::Vote(Vote::Yes),
            Reply::Bulk(Some(v)) => match Mark::permits_of(v) {
                Some(k) if k == self.permits => Verdict::Vote(Vote::No),
                Some(k) => mismatch(&format!("{k} permits, 1 per node"), self.permits),
                None => mismatch("another lock there", self.permits),
            },
            Reply::Error(m) if ServerErrorKind::of(m) == ServerErrorKind::WrongType => {
                mismatch("more than 1 per node", self.permits)
            }
            Reply::Error(m) => error_verdict(m),
            _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
        }
    }
}

/// [`SemKeyAcquire`] behind the fair queue, where only the head goes: [`FAIR_SEM_KEY_ACQUIRE`].
#[derive(Debug)]
pub struct FairSemKeyAcquire<'a> {
    /// The semaphore's keys.
    pub keys: &'a SemKeys,
    /// This attempt's token, and the waiter's queue entry.
    pub ids: AttemptIds<'a>,
    /// TTL in milliseconds.
    pub ttl_ms: u64,
    /// The semaphore's permits.
    pub permits: u32,
    /// Place in the queue, kept across attempts.
    pub fair: &'a FairState,
}

impl Op for FairSemKeyAcquire<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let mark = Mark::new(self.permits);
        write_eval_head(out, &FAIR_SEM_KEY_ACQUIRE, form, 3, 7);
        for key in [
            self.keys.holders(),
            self.keys.queue(),
            self.keys.queue_expiries(),
        ] {
            crate::resp::write_bulk(out, key);
        }
        write_value(out, self.ids.token, &mark);
        crate::resp::write_bulk_u64(out, self.ttl_ms);
        crate::resp::write_bulk(out, mark.as_bytes());
        self.fair.write_queue_args(out, self.ids);
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        classify_acquire(reply, |r| self.fair.classify(r))
    }

    fn queue_rank(&self, reply: &Reply<'_>) -> Option<u32> {
        crate::engine::fair::queued_rank(reply)
    }
}

/// A one-slot semaphore's release, and the cleanup of a lost attempt or of a grant beyond the
/// quorum: the mutex's compare-and-delete of `token ++ mark`, announced on the semaphore's wake
/// channel. `DELEX key IFEQ value` in a transaction with the announcement where the node has
/// it (Redis 8.4), the `RELEASE` script elsewhere. Every integer is an acknowledgement (0: the
/// value was not there), and so is `WRONGTYPE` (a sorted set there holds nothing of ours).
#[derive(Debug, Clone, Copy)]
pub struct SemKeyRelease<'a> {
    /// The resource key, whose wake channel announces the release.
    pub resource: &'a [u8],
    /// The semaphore's key on each node.
    pub key: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
    /// The semaphore's permits.
    pub permits: u32,
}

impl Op for SemKeyRelease<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        self.encode_for(out, form, Caps::default());
    }

    fn encode_for(&self, out: &mut Vec<u8>, form: ScriptForm, caps: Caps) -> usize {
        let mark = Mark::new(self.permits);
        let channel = keys::wake_channel_for(self.resource, keys::Family::Semaphore, caps.sharded);
        if !caps.delex {
            let script = crate::engine::scripts::RELEASE.announcing(caps.sharded);
            crate::engine::fair::write_eval_head(out, script, form, 1, 2);
            crate::resp::write_bulk(out, self.key);
            write_value(out, self.token, &mark);
            channel.write_bulk(out);
            return 0;
        }
        crate::resp::encode_command(out, &[b"MULTI"]);
        crate::resp::write_array_len(out, 4);
        crate::resp::write_bulk(out, b"DELEX");
        crate::resp::write_bulk(out, self.key);
        crate::resp::write_bulk(out, b"IFEQ");
        write_value(out, self.token, &mark);
        crate::resp::write_array_len(out, 3);
        crate::resp::write_bulk(
            out,
            if caps.sharded {
                b"SPUBLISH"
            } else {
                b"PUBLISH"
            },
        );
        channel.write_bulk(out);
        crate::resp::write_bulk(out, &self.token[..self.token.len().min(16)]);
        crate::resp::encode_command(out, &[b"EXEC"]);
        3
    }

    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            // `[DELEX's reply, PUBLISH's reply]`: the release is `DELEX`'s.
            Reply::Array(Some(items)) => match items.as_slice() {
                [delex, Reply::Integer(_)] => ack_verdict(delex),
                [_, Reply::Error(m)] => error_verdict(m),
                _ => Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply)),
            },
            other => ack_verdict(other),
        }
    }
}

/// Every integer a delete answers acknowledges a release (0: nothing of ours there), and so
/// does `WRONGTYPE`; any other error is a failure, never an acknowledgement.
fn ack_verdict(reply: &Reply<'_>) -> Verdict {
    match reply {
        Reply::Integer(n) if *n >= 0 => Verdict::Vote(Vote::Yes),
        Reply::Error(m) if ServerErrorKind::of(m) == ServerErrorKind::WrongType => {
            Verdict::Vote(Vote::Yes)
        }
        other => int_verdict(other),
    }
}

/// A one-slot semaphore's extend: the mutex's compare-and-`PEXPIRE` ([`EXTEND`]) of
/// `token ++ mark`.
///
/// [`EXTEND`]: crate::engine::scripts::EXTEND
#[derive(Debug, Clone, Copy)]
pub struct SemKeyExtend<'a> {
    /// The semaphore's key on each node.
    pub key: &'a [u8],
    /// The holder's token.
    pub token: &'a [u8],
    /// The new TTL in milliseconds.
    pub ttl_ms: u64,
    /// The semaphore's permits.
    pub permits: u32,
}

impl Op for SemKeyExtend<'_> {
    fn encode(&self, out: &mut Vec<u8>, form: ScriptForm) {
        let mark = Mark::new(self.permits);
        let script = &crate::engine::scripts::EXTEND;
        crate::engine::fair::write_eval_head(out, script, form, 1, 2);
        crate::resp::write_bulk(out, self.key);
        write_value(out, self.token, &mark);
        crate::resp::write_bulk_u64(out, self.ttl_ms);
    }

    /// `WRONGTYPE`: the key holds a sorted set, so not our token.
    fn classify(&self, reply: &Reply<'_>) -> Verdict {
        match reply {
            Reply::Error(m) if ServerErrorKind::of(m) == ServerErrorKind::WrongType => {
                Verdict::Vote(Vote::No)
            }
            other => int_verdict(other),
        }
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
    slots: u32,
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
    pub fn new(
        holders: &'a [u8],
        permits: u32,
        slots: u32,
        quorum: usize,
        nodes: usize,
    ) -> Census<'a> {
        Census {
            holders,
            permits,
            slots,
            quorum,
            counts: vec![None; nodes],
            unsent: true,
            resend: 0,
            resent: 0,
            done: false,
        }
    }

    /// The number of further acquisitions that would win one after the other if nothing else
    /// changed (see [`estimate`]), a node that failed to answer counting as full.
    pub fn estimate(&self) -> u32 {
        estimate(
            self.permits,
            self.slots,
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

/// How many further acquisitions would win one after the other if nothing else changed, at
/// most `permits`: `counts` are each node's live holders (`None`: no answer, counted as full),
/// of `slots` each. Each acquisition needs `q` nodes with a free slot.
///
/// With `slots = permits`, an acquisition keeps a slot on every node that grants it, so that
/// is the `q`-th largest number of free slots. With fewer slots, it gives back all but `q`,
/// and `m` acquisitions fit iff the nodes' free slots, each node counted at most `m` times
/// (one slot per holder on a node), add up to `m·q`: the largest such `m`.
pub fn estimate(
    permits: u32,
    slots: u32,
    quorum: usize,
    counts: impl Iterator<Item = Option<u64>>,
) -> u32 {
    let k = u64::from(permits);
    let c = u64::from(slots);
    let mut free: Vec<u64> = counts
        .map(|n| n.map_or(0, |n| c.saturating_sub(n)))
        .collect();
    if quorum == 0 {
        return 0;
    }
    if slots >= permits {
        free.sort_unstable_by(|a, b| b.cmp(a));
        return match free.get(quorum - 1) {
            Some(&f) => f.min(k) as u32,
            None => 0,
        };
    }
    let q = quorum as u64;
    let fits = |m: u64| free.iter().map(|&f| f.min(m)).sum::<u64>() >= m * q;
    // What fits is 0 up to some m (each step adds a slot from every node with more than m
    // free, fewer and fewer of them, and takes q): the last m that fits, by bisection.
    let (mut lo, mut hi) = (0, k.min(free.iter().sum::<u64>() / q));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo as u32
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
        if self.slots == 1 {
            // One slot per node is one key, whose TTL is its holder's.
            crate::resp::encode_command(out, &[b"EXISTS", self.holders]);
        } else {
            write_eval(out, &SEM_COUNT, t.form, &[self.holders], &[]);
        }
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
    fn the_smallest_safe_quorum_with_as_many_slots_as_permits() {
        // k = 1 is the Redlock majority.
        for n in 1..=9 {
            assert_eq!(safe_quorum(1, n), n / 2 + 1);
            assert_eq!(shape(1, n), (1, n / 2 + 1));
        }
        assert_eq!(safe_quorum(2, 3), 3);
        assert_eq!(safe_quorum(3, 3), 3);
        assert_eq!(safe_quorum(2, 5), 4);
        assert_eq!(safe_quorum(3, 5), 4);
        assert_eq!(safe_quorum(4, 5), 5);
        assert_eq!(safe_quorum(100, 5), 5);
        // With c = k, the smallest q with (k + 1)·q > k·N is safe and usable, and never above N.
        for k in 1..=20u32 {
            for n in 1..=15usize {
                let q = safe_quorum(k, n);
                assert!(q <= n);
                let c = slots_for(k, n, q).expect("c = k qualifies");
                assert!(c <= k, "k={k} n={n}");
            }
        }
    }

    /// The table (N, k: with c = k, then with the smallest c), derived from the two
    /// inequalities alone, and the shape chosen against an exhaustive search.
    #[test]
    fn the_shape_is_the_fewest_slots_then_the_smallest_quorum() {
        // (k + 1)·q > c·N (no k + 1 holders) and k·q ≤ c·N (k holders fit), q ≤ N.
        let sound =
            |k: u64, c: u64, n: u64, q: u64| q <= n && (k + 1) * q > c * n && k * q <= c * n;
        for k in 1..=12u32 {
            for n in 1..=15usize {
                let (c, q) = shape(k, n);
                let least_q = (n as u64).min(2);
                let best = (1..=u64::from(k))
                    .flat_map(|c| (least_q..=n as u64).map(move |q| (c, q)))
                    .find(|&(c, q)| sound(u64::from(k), c, n as u64, q))
                    .expect("c = k, q = safe_quorum is sound");
                assert_eq!((u64::from(c), q as u64), best, "k={k} n={n}");
                assert_eq!(slots_for(k, n, q), Some(c));
                // Every quorum with_quorum accepts is sound with the slots it picks, and
                // every sound pair's quorum is accepted.
                for q in 0..=n + 1 {
                    match slots_for(k, n, q) {
                        Some(c) => assert!(sound(u64::from(k), u64::from(c), n as u64, q as u64)),
                        None => assert!((1..=u64::from(k)).all(|c| !sound(
                            u64::from(k),
                            c,
                            n as u64,
                            q as u64
                        ))),
                    }
                }
            }
        }
        // The rows: N, k, then (c, q, failures tolerated) with c = k and with the
        // smallest c. Every row checks out.
        let rows = [
            (5, 2, (2, 4, 1), (1, 2, 3)),
            (5, 3, (3, 4, 1), (2, 3, 2)),
            (7, 2, (2, 5, 2), (1, 3, 4)),
            (7, 3, (3, 6, 1), (1, 2, 5)),
            (9, 4, (4, 8, 1), (1, 2, 7)),
        ];
        println!("| N | k | c = k: c, q, failures | smallest c: c, q, failures | usable permits, d = 0.. |");
        for (n, k, old, new) in rows {
            let old_q = safe_quorum(k, n);
            let (c, q) = shape(k, n);
            let usable: Vec<u32> = (0..=n).map(|d| usable_permits(k, c, n, q, d)).collect();
            println!(
                "| {n} | {k} | {k}, {old_q}, {} | {c}, {q}, {} | {usable:?} |",
                n - old_q,
                n - q
            );
            assert_eq!((k, old_q, n - old_q), old, "N={n} k={k}");
            assert_eq!((c, q, n - q), new, "N={n} k={k}");
        }
    }

    #[test]
    fn unsound_or_unusable_configurations_are_refused() {
        // The naive majority: N = 5, k = 2, q = 3 admits 3 holders with 2 slots per node, and
        // not both permits with 1.
        assert!(matches!(
            check(2, 5, 3),
            Err(InvalidArgument::UnsafeQuorum { min: 2, .. })
        ));
        assert!(matches!(
            check(0, 5, 5),
            Err(InvalidArgument::BadPermits { .. })
        ));
        assert!(check(MAX_PERMITS + 1, 5, 5).is_err());
        assert!(check(2, 5, 6).is_err());
        assert!(check(2, 5, 0).is_err());
        // One node admitting one holder each, over 5 nodes: 3 holders would need 6 of 5 slots.
        assert!(matches!(
            check(2, 5, 1),
            Err(InvalidArgument::UnsafeQuorum { .. })
        ));
        assert_eq!(check(2, 5, 2), Ok(1));
        assert_eq!(check(2, 5, 4), Ok(2));
        assert_eq!(check(2, 5, 5), Ok(2));
        assert_eq!(check(3, 5, 3), Ok(2));
        assert_eq!(check(3, 5, 4), Ok(3));
        // The shape argument: the permits alone when the slots are the permits (the older
        // markers), never one of those otherwise.
        assert_eq!(shape_arg(2, 2), 2);
        assert_eq!(shape_arg(2, 1), 1 + (2 << 21));
        assert!(shape_arg(3, 2) > u64::from(MAX_PERMITS));
    }

    #[test]
    fn rounds_take_the_semaphores_quorum_and_releases_need_only_break_it() {
        use crate::engine::kind::{Keys, Spec};
        let keys = SemKeys::new(b"k");
        let spec = |quorum| Spec {
            keys: Keys::Semaphore {
                resource: b"k",
                keys: &keys,
                permits: 2,
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
    fn a_one_slot_key_holds_the_token_then_the_permits() {
        assert_eq!(Mark::new(2).as_bytes(), b":sem:2");
        assert_eq!(Mark::new(MAX_PERMITS).as_bytes(), b":sem:1048576");
        assert_eq!(Mark::new(u32::MAX).as_bytes(), b":sem:4294967295");
        assert_eq!(Mark::permits_of(b"abc:sem:2"), Some(2));
        assert_eq!(Mark::permits_of(b"a:sem:x:sem:17"), Some(17));
        for not in [&b":sem:2"[..], b"abc", b"abc:sem:", b"abc:sem:2x", b""] {
            assert_eq!(Mark::permits_of(not), None, "{not:?}");
        }
        let op = SemKeyAcquire {
            key: b"{sem:k}:s",
            token: b"tok",
            ttl_ms: 1000,
            permits: 2,
        };
        let mut out = Vec::new();
        op.encode(&mut out, ScriptForm::Sha);
        assert_eq!(
            out,
            b"*7\r\n$3\r\nSET\r\n$9\r\n{sem:k}:s\r\n$9\r\ntok:sem:2\r\n$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n1000\r\n$3\r\nGET\r\n"
        );
        let setup = |v: &Verdict| {
            matches!(
                v,
                Verdict::Vote(Vote::Failed(NodeErrorKind::Setup {
                    command: "semaphore",
                    ..
                }))
            )
        };
        assert_eq!(op.classify(&Reply::Bulk(None)), Verdict::Vote(Vote::Yes));
        // Its own value: the command went through before.
        assert_eq!(
            op.classify(&Reply::Bulk(Some(b"tok:sem:2"))),
            Verdict::Vote(Vote::Yes)
        );
        assert_eq!(
            op.classify(&Reply::Bulk(Some(b"other:sem:2"))),
            Verdict::Vote(Vote::No)
        );
        let k3 = op.classify(&Reply::Bulk(Some(b"other:sem:3")));
        assert!(setup(&k3), "{k3:?}");
        assert!(format!("{k3:?}").contains("has 3 permits, 1 per node, not 2 permits"));
        assert!(setup(&op.classify(&Reply::Bulk(Some(b"a-mutex-token")))));
        let wrong = b"WRONGTYPE Operation against a key holding the wrong kind of value";
        assert!(setup(&op.classify(&Reply::Error(wrong))));
        // Any other error is the node's failure, not a configuration error.
        let readonly = op.classify(&Reply::Error(b"READONLY You can't write"));
        assert!(
            matches!(readonly, Verdict::Vote(Vote::Failed(_))) && !setup(&readonly),
            "{readonly:?}"
        );
        assert!(matches!(
            op.classify(&Reply::Simple(b"OK")),
            Verdict::Vote(Vote::Failed(NodeErrorKind::UnexpectedReply))
        ));
        // The release: every integer and WRONGTYPE acknowledge it, an error does not.
        let release = SemKeyRelease {
            resource: b"k",
            key: b"{sem:k}:s",
            token: b"tok",
            permits: 2,
        };
        for ack in [Reply::Integer(0), Reply::Integer(1), Reply::Error(wrong)] {
            assert_eq!(release.classify(&ack), Verdict::Vote(Vote::Yes));
        }
        assert!(matches!(
            release.classify(&Reply::Error(b"READONLY You can't write")),
            Verdict::Vote(Vote::Failed(_))
        ));
        let mut out = Vec::new();
        assert_eq!(
            release.encode_for(&mut out, ScriptForm::Sha, Caps::default()),
            0
        );
        assert!(out.starts_with(b"*6\r\n$7\r\nEVALSHA\r\n"));
        assert!(out.windows(9).any(|w| w == b"tok:sem:2"));
        let delex = Caps {
            delex: true,
            ..Caps::default()
        };
        let mut out = Vec::new();
        assert_eq!(release.encode_for(&mut out, ScriptForm::Sha, delex), 3);
        assert!(out
            .windows(36)
            .any(|w| w == b"$5\r\nDELEX\r\n$9\r\n{sem:k}:s\r\n$4\r\nIFEQ\r\n"));
        assert!(out.ends_with(b"*1\r\n$4\r\nEXEC\r\n"));
        assert_eq!(
            release.classify(&Reply::Array(Some(vec![
                Reply::Integer(1),
                Reply::Integer(0)
            ]))),
            Verdict::Vote(Vote::Yes)
        );
    }

    #[test]
    fn usable_permits_degrade_with_nodes_down() {
        // N = 5, k = 2, q = 4: one node down keeps both permits, two stop acquires.
        assert_eq!(usable_permits(2, 2, 5, 4, 0), 2);
        assert_eq!(usable_permits(2, 2, 5, 4, 1), 2);
        assert_eq!(usable_permits(2, 2, 5, 4, 2), 0);
        // N = 5, k = 3, q = 4: ⌊3·4/4⌋ = 3 with one down.
        assert_eq!(usable_permits(3, 3, 5, 4, 1), 3);
        assert_eq!(usable_permits(3, 3, 5, 4, 2), 0);
        // N = 7, k = 2, q = 5: ⌊2·6/5⌋ = 2 with one down, 2 with two (⌊10/5⌋), 0 with three.
        assert_eq!(usable_permits(2, 2, 7, 5, 1), 2);
        assert_eq!(usable_permits(2, 2, 7, 5, 2), 2);
        assert_eq!(usable_permits(2, 2, 7, 5, 3), 0);
        // A quorum above the minimum degrades sooner: N = 7, k = 3, q = 6, one down: ⌊18/6⌋.
        assert_eq!(usable_permits(3, 3, 7, 6, 1), 3);
        assert_eq!(usable_permits(3, 3, 9, 7, 2), 3);
        // One slot per node: N = 5, k = 2, q = 2 keeps both permits with one node down, one
        // with two or three, none with four.
        let c1: Vec<u32> = (0..=5).map(|d| usable_permits(2, 1, 5, 2, d)).collect();
        assert_eq!(c1, [2, 2, 1, 1, 0, 0]);
        // N = 5, k = 3, c = 2, q = 3: 3, then 2 with one or two down.
        let c2: Vec<u32> = (0..=4).map(|d| usable_permits(3, 2, 5, 3, d)).collect();
        assert_eq!(c2, [3, 2, 2, 0, 0]);
    }

    #[test]
    fn the_estimate_is_the_quorum_th_largest_free_count() {
        // Every holder on every node: free = k − holders.
        assert_eq!(
            estimate(3, 3, 2, [Some(1), Some(1), Some(1)].into_iter()),
            2
        );
        // A node that did not answer counts as full.
        assert_eq!(estimate(3, 3, 3, [Some(0), Some(0), None].into_iter()), 0);
        assert_eq!(
            estimate(
                2,
                2,
                4,
                [Some(0), Some(2), Some(1), Some(1), Some(0)].into_iter()
            ),
            1
        );
        // More live entries than permits (late cleanups) is still 0, not an underflow.
        assert_eq!(estimate(2, 2, 1, [Some(5)].into_iter()), 0);
        // One slot per node, k = 2, q = 2: all free fits both; a holder on two nodes leaves
        // three free slots, room for one more (a second needs two more nodes).
        let free5 = [Some(0); 5];
        assert_eq!(estimate(2, 1, 2, free5.into_iter()), 2);
        let one = [Some(1), Some(1), Some(0), Some(0), Some(0)];
        assert_eq!(estimate(2, 1, 2, one.into_iter()), 1);
        // Two free nodes fit one holder, one free node none.
        let two = [Some(1), Some(1), Some(1), Some(0), Some(0)];
        assert_eq!(estimate(2, 1, 2, two.into_iter()), 1);
        let full = [Some(1), Some(1), Some(1), Some(1), Some(0)];
        assert_eq!(estimate(2, 1, 2, full.into_iter()), 0);
        // k = 3, c = 2, q = 3 over 5 nodes, all free: 10 slots, 3 holders of 3.
        assert_eq!(estimate(3, 2, 3, [Some(0); 5].into_iter()), 3);
    }
}
