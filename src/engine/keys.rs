//! Every Redis key name, and the wake channel, derived from a resource key `K`.
//!
//! The names are listed on [`KeyNames`].
//!
//! # The hash-tag rule
//!
//! Redis Cluster hashes only a key's hash tag: the bytes between its first `{` and the first `}`
//! after it, when there is at least one ([`has_hash_tag`]). Every derived name is
//! `head ++ K ++ tail` (a [`Name`]), and one rule picks head and tail:
//!
//! - `K` has a hash tag: the name keeps `K` at its start, or after a prefix without braces, so
//!   its tag is `K`'s and it sits in the slot of the data the lock guards;
//! - `K` has none: the name wraps `K` in braces, so that it has a tag. For the mutex queue and
//!   the fence counter the tag is `K` itself, which hashes exactly as the bare `K` does (when
//!   `K` has no `}`: a `}` inside `K` would end the tag early; the fence counter then does not
//!   wrap, as a tag other than `K` would not put it beside `K` anyway). The read-write keys'
//!   tag starts with `rw:`, so it is never empty even when `K` starts with `}`, and the five
//!   keys of one read-write lock always share a slot.
//!
//! The two forms end differently (`:fq` against `}:q`, `w:w` against `}:w`…), so two resource
//! keys never share a name of the same kind: `abc` and `{abc}` are different locks with
//! different queues. The names are part of the stored data's format (other clients and existing
//! locks use them): they never change, and that keeps two overlaps they were given:
//!
//! - the fence counter of `abc` and of `{abc}` is one key. That is harmless: a counter that two
//!   locks raise still only grows, so each lock's tokens still strictly increase;
//! - without a hash tag, the mutex queue of `rw:K` is the read-write queue of `K` (`{rw:K}:q`).
//!   Fair waiters of those two locks then wait in one line, each possibly behind the other:
//!   that delays them, but the lock keys differ, so it never breaks exclusion.
#![forbid(unsafe_code)]

use crate::resp;

/// Releases of resource `K` are announced on channel `WAKE_PREFIX ++ K`, so that waiters can
/// retry at once instead of sleeping out their retry delay.
///
/// The message is the first 16 characters of the released token: 64 bits that name the release
/// (every node announces it) without giving away the token. A waiter retries when a node that
/// refused its last attempt announces a release after refusing.
pub const WAKE_PREFIX: &[u8] = b"redlock-mux:wake:";

/// Fence counters of lock key `K` are kept at `FENCE_PREFIX ++ ...` (see [`Derived::Fence`]).
pub const FENCE_PREFIX: &[u8] = b"redlock-mux:fence:";

/// [`FENCE_PREFIX`] followed by the `{` that wraps a key without a hash tag.
const FENCE_WRAPPED: &[u8] = b"redlock-mux:fence:{";

/// Whether Redis Cluster would hash `key` by a hash tag (the bytes between its first `{` and the
/// first `}` after it, when there are any) rather than whole.
pub fn has_hash_tag(key: &[u8]) -> bool {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return false;
    };
    key[open + 1..]
        .iter()
        .position(|&b| b == b'}')
        .is_some_and(|len| len > 0)
}

/// A name derived from a resource key, as its three parts: `head ++ key ++ tail`. Writing it
/// needs no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name<'a> {
    /// What comes before the resource key.
    pub head: &'static [u8],
    /// The resource key.
    pub key: &'a [u8],
    /// What comes after it.
    pub tail: &'static [u8],
}

impl<'a> Name<'a> {
    /// The parts, in order.
    pub fn parts(self) -> [&'a [u8]; 3] {
        [self.head, self.key, self.tail]
    }

    /// Writes the name as one RESP bulk string.
    pub fn write_bulk(self, out: &mut Vec<u8>) {
        resp::write_bulk_parts(out, &self.parts());
    }

    /// Appends the name's bytes to `out`.
    pub fn extend_into(self, out: &mut Vec<u8>) {
        self.parts().iter().for_each(|p| out.extend_from_slice(p));
    }

    /// The name's length in bytes.
    pub fn len(self) -> usize {
        self.head.len() + self.key.len() + self.tail.len()
    }

    /// The name as bytes.
    pub fn to_vec(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_into(&mut out);
        out
    }
}

/// Each name derived from a resource key, besides the mutex key (the resource key itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derived {
    /// The mutex's fair queue: waiters' ids scored by ticket.
    MutexQueue,
    /// The mutex's fair queue entries scored by their expiry, in ms on the node's clock.
    MutexQueueExpiries,
    /// The read-write lock's writer key.
    Writer,
    /// The read-write lock's readers, scored by their expiry.
    Readers,
    /// The read-write lock's waiting writers' intents, scored by their expiry.
    Intents,
    /// The read-write lock's fair queue: `r` or `w` followed by the waiter id, scored by ticket.
    RwQueue,
    /// The read-write lock's fair queue entries scored by their expiry.
    RwQueueExpiries,
    /// The fence counter (no expiry; only ever raised).
    Fence,
    /// The fence counter of the read-write lock's writer key (a fenced write lock's), which
    /// is [`Derived::Fence`] of [`Derived::Writer`]: the writer key always has a hash tag, so
    /// the counter is `FENCE_PREFIX ++` the writer key, in its slot.
    WriterFence,
    /// The semaphore: with one slot per node, the holder's token and the permits as a string
    /// that expires with it; with more, holder tokens scored by their expiry, in ms on the
    /// node's clock, and the marker member `=` scored by minus the shape.
    Semaphore,
    /// The semaphore's fair queue: waiters' ids scored by ticket.
    SemQueue,
    /// The semaphore's fair queue entries scored by their expiry.
    SemQueueExpiries,
    /// The pub/sub channel on which releases are announced (a channel, not a key).
    Wake,
}

impl Derived {
    /// Every derived name.
    #[cfg(test)]
    pub const ALL: [Derived; 13] = [
        Derived::MutexQueue,
        Derived::MutexQueueExpiries,
        Derived::Writer,
        Derived::Readers,
        Derived::Intents,
        Derived::RwQueue,
        Derived::RwQueueExpiries,
        Derived::Fence,
        Derived::WriterFence,
        Derived::Semaphore,
        Derived::SemQueue,
        Derived::SemQueueExpiries,
        Derived::Wake,
    ];

    /// The name of this kind for resource `key`.
    pub fn of(self, key: &[u8]) -> Name<'_> {
        let tagged = has_hash_tag(key);
        let (head, tail): (&'static [u8], &'static [u8]) = match (self, tagged) {
            (Derived::MutexQueue, true) => (b"", b":fq"),
            (Derived::MutexQueue, false) => (b"{", b"}:q"),
            (Derived::MutexQueueExpiries, true) => (b"", b":fqx"),
            (Derived::MutexQueueExpiries, false) => (b"{", b"}:qx"),
            (Derived::Writer, true) => (b"", b":rw:w"),
            (Derived::Writer, false) => (b"{rw:", b"}:w"),
            (Derived::Readers, true) => (b"", b":rw:r"),
            (Derived::Readers, false) => (b"{rw:", b"}:r"),
            (Derived::Intents, true) => (b"", b":rw:wi"),
            (Derived::Intents, false) => (b"{rw:", b"}:wi"),
            (Derived::RwQueue, true) => (b"", b":rw:q"),
            (Derived::RwQueue, false) => (b"{rw:", b"}:q"),
            (Derived::RwQueueExpiries, true) => (b"", b":rw:qx"),
            (Derived::RwQueueExpiries, false) => (b"{rw:", b"}:qx"),
            (Derived::Fence, false) if !key.contains(&b'}') => (FENCE_WRAPPED, b"}"),
            (Derived::Fence, _) => (FENCE_PREFIX, b""),
            (Derived::WriterFence, true) => (FENCE_PREFIX, b":rw:w"),
            (Derived::WriterFence, false) => (b"redlock-mux:fence:{rw:", b"}:w"),
            (Derived::Semaphore, true) => (b"", b":sem"),
            (Derived::Semaphore, false) => (b"{sem:", b"}:s"),
            (Derived::SemQueue, true) => (b"", b":sem:q"),
            (Derived::SemQueue, false) => (b"{sem:", b"}:sq"),
            (Derived::SemQueueExpiries, true) => (b"", b":sem:qx"),
            (Derived::SemQueueExpiries, false) => (b"{sem:", b"}:sqx"),
            (Derived::Wake, _) => (WAKE_PREFIX, b""),
        };
        Name { head, key, tail }
    }
}

/// The wake channel of resource `key`: `WAKE_PREFIX ++ key`.
pub fn wake_channel(key: &[u8]) -> Name<'_> {
    Derived::Wake.of(key)
}

/// Which lock's keys a release announces the freeing of: the slot its wake channel must share
/// on a Redis Cluster member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A mutex (fenced or not, fair or not) and the all-or-none set: the key itself.
    Mutex,
    /// A read-write lock: its writer key, readers, intents and queue.
    Rw,
    /// A semaphore: its holders and queue.
    Semaphore,
}

/// The wake channel of resource `key` for a lock of `family`, on a member whose releases are
/// announced with `SPUBLISH` (`sharded`, a Redis Cluster) or `PUBLISH`.
///
/// `PUBLISH` reaches every node of a cluster, so its channel is simply [`wake_channel`].
/// `SPUBLISH` reaches the shard that owns the channel's slot, and from a script (or a
/// transaction) only that of the lock's own keys: the channel carries the hash tag of the
/// lock's keys. A key with a hash tag keeps the plain name, whose tag is the key's; a key
/// without one is wrapped as the lock's keys are: `redlock-mux:wake:{K}` for a mutex (the
/// slot of `K` itself), `redlock-mux:wake:{rw:K}` for a read-write lock and
/// `redlock-mux:wake:{sem:K}` for a semaphore. A mutex key without a hash tag that contains
/// `}` (or is empty) cannot be wrapped (its tag would end early, or be empty): its channel is
/// `K` itself, a channel in the slot of the key `K`.
pub fn wake_channel_for(key: &[u8], family: Family, sharded: bool) -> Name<'_> {
    if !sharded || has_hash_tag(key) {
        return wake_channel(key);
    }
    let (head, tail): (&'static [u8], &'static [u8]) = match family {
        Family::Mutex if key.is_empty() || key.contains(&b'}') => (b"", b""),
        Family::Mutex => (b"redlock-mux:wake:{", b"}"),
        Family::Rw => (b"redlock-mux:wake:{rw:", b"}"),
        Family::Semaphore => (b"redlock-mux:wake:{sem:", b"}"),
    };
    Name { head, key, tail }
}

/// The key of the fence counter of `lock_key` (see [`Derived::Fence`] and the module's table).
/// Wrapping needs a tag of the whole key; a key without a hash tag that contains `}` cannot be
/// made one, so its counter sits in another slot. That only matters to proxies that insist on
/// single-slot scripts; independent masters do not.
#[cfg(test)]
pub fn fence_key(lock_key: &[u8]) -> Vec<u8> {
    Derived::Fence.of(lock_key).to_vec()
}

/// The bytes of the names `derived` of resource `key`.
fn names_len<const N: usize>(derived: [Derived; N], key: &[u8]) -> usize {
    derived.iter().map(|d| d.of(key).len()).sum()
}

/// The names `derived` of resource `key`, one after the other in `buf` (emptied first), and
/// where each ends.
fn names_in<const N: usize>(
    derived: [Derived; N],
    key: &[u8],
    mut buf: Vec<u8>,
) -> (Vec<u8>, [usize; N]) {
    let names = derived.map(|d| d.of(key));
    buf.clear();
    buf.reserve(names_len(derived, key));
    let mut ends = [0; N];
    for (end, name) in ends.iter_mut().zip(names) {
        name.extend_into(&mut buf);
        *end = buf.len();
    }
    (buf, ends)
}

/// The keys of one read-write lock on resource `K`, built once per lock: writer, readers,
/// intents, fair queue and its expiries (see the module's table). A mutex on `K` itself uses
/// `K` and does not exclude the read-write lock on `K`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwKeys {
    buf: Vec<u8>,
    /// Where each name ends in `buf`: writer, readers, intents, queue, queue expiries.
    ends: [usize; 5],
}

impl RwKeys {
    /// The keys for resource `key`, in one allocation.
    #[cfg(test)]
    pub fn new(key: &[u8]) -> RwKeys {
        RwKeys::new_in(key, Vec::new())
    }

    /// The keys for resource `key`, in `buf` (emptied first), which grows only if it is too
    /// small.
    pub fn new_in(key: &[u8], buf: Vec<u8>) -> RwKeys {
        let (buf, ends) = names_in(RwKeys::DERIVED, key, buf);
        RwKeys { buf, ends }
    }

    /// The names, in order.
    const DERIVED: [Derived; 5] = [
        Derived::Writer,
        Derived::Readers,
        Derived::Intents,
        Derived::RwQueue,
        Derived::RwQueueExpiries,
    ];

    /// How many bytes the keys for resource `key` take.
    pub fn len_for(key: &[u8]) -> usize {
        names_len(RwKeys::DERIVED, key)
    }

    /// The buffer the names are in, for reuse.
    pub fn into_buf(self) -> Vec<u8> {
        self.buf
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
}

/// The keys of one semaphore on resource `K`, built once per semaphore: its holders, its fair
/// queue and the queue's expiries (see the module's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemKeys {
    buf: Vec<u8>,
    /// Where each name ends in `buf`: holders, queue, queue expiries.
    ends: [usize; 3],
}

impl SemKeys {
    /// The keys for resource `key`, in one allocation.
    #[cfg(test)]
    pub fn new(key: &[u8]) -> SemKeys {
        SemKeys::new_in(key, Vec::new())
    }

    /// The keys for resource `key`, in `buf` (emptied first), which grows only if it is too
    /// small.
    pub fn new_in(key: &[u8], buf: Vec<u8>) -> SemKeys {
        let (buf, ends) = names_in(SemKeys::DERIVED, key, buf);
        SemKeys { buf, ends }
    }

    /// The names, in order.
    const DERIVED: [Derived; 3] = [
        Derived::Semaphore,
        Derived::SemQueue,
        Derived::SemQueueExpiries,
    ];

    /// How many bytes the keys for resource `key` take.
    pub fn len_for(key: &[u8]) -> usize {
        names_len(SemKeys::DERIVED, key)
    }

    /// The buffer the names are in, for reuse.
    pub fn into_buf(self) -> Vec<u8> {
        self.buf
    }

    fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }

    /// The holders: tokens scored by their expiry, in ms on the node's clock.
    pub fn holders(&self) -> &[u8] {
        self.name(0)
    }

    /// The fair queue: waiters' ids scored by ticket.
    pub fn queue(&self) -> &[u8] {
        self.name(1)
    }

    /// The fair queue's entries scored by their expiry, in ms on the node's clock.
    pub fn queue_expiries(&self) -> &[u8] {
        self.name(2)
    }
}

/// The Redis keys this library keeps for one resource key `K`, and the channel it announces
/// releases on, for tools that look at them (such as `redlock-mux inspect`).
///
/// | name | `K` has a hash tag, e.g. `user:{42}` | `K` has none, e.g. `invoice:42` |
/// |---|---|---|
/// | mutex (and all-or-none) key | `K` | `K` |
/// | mutex fair queue, its expiries | `K:fq`, `K:fqx` | `{K}:q`, `{K}:qx` |
/// | read-write writer, readers, intents | `K:rw:w`, `K:rw:r`, `K:rw:wi` | `{rw:K}:w`, `{rw:K}:r`, `{rw:K}:wi` |
/// | read-write fair queue, its expiries | `K:rw:q`, `K:rw:qx` | `{rw:K}:q`, `{rw:K}:qx` |
/// | fence counter | `redlock-mux:fence:K` | `redlock-mux:fence:{K}` (`redlock-mux:fence:K` if `K` contains `}`) |
/// | writer's fence counter (fenced write lock) | `redlock-mux:fence:K:rw:w` | `redlock-mux:fence:{rw:K}:w` |
/// | semaphore holders | `K:sem` | `{sem:K}:s` |
/// | semaphore fair queue, its expiries | `K:sem:q`, `K:sem:qx` | `{sem:K}:sq`, `{sem:K}:sqx` |
/// | wake channel (pub/sub) | `redlock-mux:wake:K` | `redlock-mux:wake:K` |
/// | wake channel on a Redis Cluster member (sharded pub/sub) | `redlock-mux:wake:K` | mutex `redlock-mux:wake:{K}` (`K` if `K` contains `}`), read-write `redlock-mux:wake:{rw:K}`, semaphore `redlock-mux:wake:{sem:K}` |
///
///
/// A name derived from a key with a hash tag keeps that tag, so it sits in the Redis Cluster
/// hash slot of the data the lock guards; a key without one is wrapped in braces, so that the
/// names of one lock share a slot. The names never change: other clients and existing locks
/// use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNames {
    /// The mutex (and all-or-none, and fenced mutex) key: the resource key itself, holding the
    /// holder's token.
    pub mutex: Vec<u8>,
    /// The mutex's fair queue: waiters' ids (each waiter's first token) scored by ticket.
    pub mutex_queue: Vec<u8>,
    /// The mutex's fair queue entries scored by their expiry, in ms on the node's clock.
    pub mutex_queue_expiries: Vec<u8>,
    /// The read-write lock's writer key.
    pub writer: Vec<u8>,
    /// The read-write lock's readers, scored by their expiry in ms on the node's clock.
    pub readers: Vec<u8>,
    /// Waiting writers' intents (write-preferring policy): their ids, scored like readers.
    pub intents: Vec<u8>,
    /// The read-write lock's fair queue: `r` or `w` followed by the waiter's id, scored by
    /// ticket.
    pub rw_queue: Vec<u8>,
    /// The read-write lock's fair queue entries scored by their expiry.
    pub rw_queue_expiries: Vec<u8>,
    /// The fenced mutex's counter: the last fencing token this node granted, with no expiry.
    pub fence: Vec<u8>,
    /// The fenced write lock's counter (the writer key's), kept like `fence`.
    pub writer_fence: Vec<u8>,
    /// The semaphore's holders: with one slot per node, a string (the holder's token
    /// followed by `:sem:` and the permits) that expires with its holder; with more, their
    /// tokens scored by their expiry in ms on the node's clock, and the member `=` scored by
    /// minus the shape.
    pub semaphore: Vec<u8>,
    /// The semaphore's fair queue: waiters' ids scored by ticket.
    pub semaphore_queue: Vec<u8>,
    /// The semaphore's fair queue entries scored by their expiry.
    pub semaphore_queue_expiries: Vec<u8>,
    /// The pub/sub channel on which releases of the resource are announced (not a key).
    pub wake_channel: Vec<u8>,
}

impl KeyNames {
    /// The names for resource `key`.
    pub fn new(key: &[u8]) -> KeyNames {
        let name = |d: Derived| d.of(key).to_vec();
        KeyNames {
            mutex: key.to_vec(),
            mutex_queue: name(Derived::MutexQueue),
            mutex_queue_expiries: name(Derived::MutexQueueExpiries),
            writer: name(Derived::Writer),
            readers: name(Derived::Readers),
            intents: name(Derived::Intents),
            rw_queue: name(Derived::RwQueue),
            rw_queue_expiries: name(Derived::RwQueueExpiries),
            fence: name(Derived::Fence),
            writer_fence: name(Derived::WriterFence),
            semaphore: name(Derived::Semaphore),
            semaphore_queue: name(Derived::SemQueue),
            semaphore_queue_expiries: name(Derived::SemQueueExpiries),
            wake_channel: name(Derived::Wake),
        }
    }

    /// Every key, without the wake channel (which is not a key).
    pub fn keys(&self) -> [&[u8]; 13] {
        [
            &self.mutex,
            &self.mutex_queue,
            &self.mutex_queue_expiries,
            &self.writer,
            &self.readers,
            &self.intents,
            &self.rw_queue,
            &self.rw_queue_expiries,
            &self.fence,
            &self.writer_fence,
            &self.semaphore,
            &self.semaphore_queue,
            &self.semaphore_queue_expiries,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Moved from fair.rs, rw.rs and fencing.rs with the derivations they test.

    #[test]
    fn the_sharded_wake_channel_is_in_the_slot_of_the_locks_keys() {
        use crate::engine::endpoint::cluster::key_slot;
        let families = [
            (Family::Mutex, None),
            (Family::Rw, Some(Derived::Writer)),
            (Family::Semaphore, Some(Derived::Semaphore)),
        ];
        for key in [
            &b"invoice:42"[..],
            b"user:{42}",
            b"{a}b",
            b"a}b",
            b"}",
            b"a{}b",
            b"",
            b"rw:x",
        ] {
            for (family, lock) in families {
                // Standalone members keep the one channel name they always had.
                assert_eq!(wake_channel_for(key, family, false), wake_channel(key));
                let lock_key = match lock {
                    None => key.to_vec(),
                    Some(d) => d.of(key).to_vec(),
                };
                let channel = wake_channel_for(key, family, true).to_vec();
                assert_eq!(
                    key_slot(&channel),
                    key_slot(&lock_key),
                    "{family:?} {:?}: {:?}",
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(&channel)
                );
            }
        }
        assert_eq!(
            wake_channel_for(b"invoice:42", Family::Mutex, true).to_vec(),
            b"redlock-mux:wake:{invoice:42}"
        );
        assert_eq!(
            wake_channel_for(b"invoice:42", Family::Rw, true).to_vec(),
            b"redlock-mux:wake:{rw:invoice:42}"
        );
        assert_eq!(
            wake_channel_for(b"user:{42}", Family::Semaphore, true).to_vec(),
            b"redlock-mux:wake:user:{42}"
        );
    }

    fn derived(key: &[u8], which: usize) -> Vec<u8> {
        let mut out = Vec::new();
        [Derived::MutexQueue, Derived::MutexQueueExpiries][which]
            .of(key)
            .write_bulk(&mut out);
        out
    }

    #[test]
    fn queue_keys_share_the_hash_slot_and_never_collide() {
        assert_eq!(derived(b"job", 0), b"$7\r\n{job}:q\r\n");
        assert_eq!(derived(b"job", 1), b"$8\r\n{job}:qx\r\n");
        assert_eq!(derived(b"{user1}.job", 0), b"$14\r\n{user1}.job:fq\r\n");
        // An empty tag is no tag: Redis hashes the whole key, so we wrap it.
        assert_eq!(derived(b"a{}b", 0), b"$8\r\n{a{}b}:q\r\n");
        // `abc` and `{abc}` are different locks, with different queues.
        assert_ne!(derived(b"abc", 0), derived(b"{abc}", 0));
        assert_ne!(derived(b"abc", 1), derived(b"{abc}", 1));
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
    fn fence_key_shares_the_hash_tag_of_its_lock_key() {
        assert_eq!(fence_key(b"invoice:42"), b"redlock-mux:fence:{invoice:42}");
        assert_eq!(fence_key(b"user:{42}:x"), b"redlock-mux:fence:user:{42}:x");
        // No tag possible: `}` without a `{` before it, or an empty tag.
        assert_eq!(fence_key(b"a}b"), b"redlock-mux:fence:a}b");
        assert_eq!(fence_key(b"{}x"), b"redlock-mux:fence:{}x");
        // An unclosed `{` is no tag, and the whole key can be one.
        assert_eq!(fence_key(b"a{b"), b"redlock-mux:fence:{a{b}");
    }

    #[test]
    fn the_writer_fence_is_the_fence_key_of_the_writer_key_in_its_slot() {
        for key in AWKWARD {
            let writer = Derived::Writer.of(key).to_vec();
            let fence = Derived::WriterFence.of(key).to_vec();
            assert_eq!(
                fence,
                fence_key(&writer),
                "{:?}",
                String::from_utf8_lossy(key)
            );
            assert_eq!(slot(&fence), slot(&writer));
        }
    }

    #[test]
    fn prefixes_agree() {
        assert!(FENCE_WRAPPED.starts_with(FENCE_PREFIX));
        assert_eq!(FENCE_WRAPPED.len(), FENCE_PREFIX.len() + 1);
    }

    #[test]
    fn names_are_written_as_bulk_strings_of_their_bytes() {
        for key in [&b"job"[..], b"{user1}.job", b"a}b", b""] {
            for d in Derived::ALL {
                let name = d.of(key);
                let mut bulk = Vec::new();
                name.write_bulk(&mut bulk);
                let mut expected = Vec::new();
                resp::write_bulk(&mut expected, &name.to_vec());
                assert_eq!(bulk, expected);
                assert_eq!(name.len(), name.to_vec().len());
            }
        }
    }

    #[test]
    fn different_resources_never_share_a_name_of_one_kind() {
        let keys: [&[u8]; 9] = [
            b"abc", b"{abc}", b"x", b"{x}", b"rw:x", b"{rw:x}", b"}", b"a}b", b"a{}b",
        ];
        for d in Derived::ALL {
            let mut all: Vec<Vec<u8>> = keys.iter().map(|k| d.of(k).to_vec()).collect();
            all.sort();
            all.dedup();
            // The fence counters of `abc` and `{abc}` (and of `x` and `{x}`…) are one key.
            let shared = if d == Derived::Fence { 3 } else { 0 };
            assert_eq!(all.len(), keys.len() - shared, "{d:?}");
        }
    }

    #[test]
    fn the_two_overlaps_the_names_keep() {
        assert_eq!(fence_key(b"abc"), fence_key(b"{abc}"));
        assert_eq!(
            Derived::MutexQueue.of(b"rw:x").to_vec(),
            Derived::RwQueue.of(b"x").to_vec()
        );
    }
}
