//! The one guard lifecycle, shared by every kind of lock, and the [`Client`] calls that take
//! locks.
//!
//! A [`Guard`] holds a lock of some [`kind`]: it knows the lock's keys and token, runs the
//! engine's extend and release rounds for it (behind its acquisition's late replies), and
//! releases it when dropped. [`Lock`], [`ReadLock`], [`WriteLock`], [`MultiLock`],
//! [`FencedLock`] and [`FencedWriteLock`] are its names for each kind; what is particular to a
//! kind (a set's keys, a fencing token) is a method of that kind's guard only.
#![forbid(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::client::Client;
use crate::config::check_key;
use crate::engine::acquire::{Acquisition, Grant, Params};
use crate::engine::fair::Tickets;
use crate::engine::hold::{Hold, Step};
use crate::engine::keys::{Derived, RwKeys, SemKeys};
use crate::engine::kind::{Keys, Spec};
use crate::engine::timings::WaitLimits;
use crate::error::{Error, InvalidArgument};
use crate::names::{BufPool, KeySet, SetKeys};
use crate::options::Acquire;
use crate::rng::Token;

/// The kinds of lock a [`Guard`] can hold. They are types only, with no values: a guard's
/// kind says which methods it has.
pub mod kind {
    mod sealed {
        pub trait Sealed {}
    }

    /// A kind of lock. Implemented by the types of this module only.
    pub trait Kind: sealed::Sealed + Send + Sync + 'static {}

    /// A kind of lock on one resource key: its guard has [`key`](crate::Guard::key).
    pub trait OneKey: Kind {}

    /// A kind of lock that hands out fencing tokens: its guard has
    /// [`fencing_token`](crate::Guard::fencing_token).
    pub trait Fenced: OneKey {}

    /// The write side of a read-write lock, fenced or not: its guard has
    /// [`downgrade`](crate::Guard::downgrade).
    pub trait Writer: OneKey {}

    macro_rules! kinds {
        ($($(#[$doc:meta])* $name:ident: $($trait:ident),*;)*) => {$(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}
            impl sealed::Sealed for $name {}
            impl Kind for $name {}
            $(impl $trait for $name {})*
        )*};
    }

    kinds! {
        /// The Redlock mutex: [`Lock`](crate::Lock).
        Mutex: OneKey;
        /// The read side of a read-write lock: [`ReadLock`](crate::ReadLock).
        Read: OneKey;
        /// The write side of a read-write lock: [`WriteLock`](crate::WriteLock).
        Write: OneKey, Writer;
        /// Every key of a set, or none: [`MultiLock`](crate::MultiLock).
        All: ;
        /// The mutex with fencing tokens: [`FencedLock`](crate::FencedLock).
        FencedMutex: OneKey, Fenced;
        /// The write side of a read-write lock with fencing tokens:
        /// [`FencedWriteLock`](crate::FencedWriteLock).
        FencedWrite: OneKey, Fenced, Writer;
        /// One permit of a counting semaphore: [`Permit`](crate::Permit).
        Semaphore: OneKey;
    }
}

use kind::{Fenced, Kind, OneKey, Writer};

/// A held lock of kind `K`. Dropping it releases it, best effort; call
/// [`release`](Guard::release) to see whether that worked.
///
/// The lock is only guaranteed until [`validity`](Guard::validity) runs out. Work that may take
/// longer must [`extend`](Guard::extend) it first, or hand it to the client's keeper thread
/// with [`keep_alive`](Guard::keep_alive).
pub struct Guard<K: Kind> {
    held: Held,
    kind: PhantomData<fn() -> K>,
}

/// A held Redlock mutex ([`Client::lock`]).
///
/// The lock is only guaranteed exclusive until [`validity`](Guard::validity) runs out.
pub type Lock = Guard<kind::Mutex>;

/// A held read lock ([`Client::read_lock`]): other readers may hold the same resource, writers
/// may not until [`validity`](Guard::validity) runs out.
pub type ReadLock = Guard<kind::Read>;

/// A held write lock ([`Client::write_lock`]): no reader and no other writer holds the
/// resource until [`validity`](Guard::validity) runs out.
pub type WriteLock = Guard<kind::Write>;

/// A held all-or-none lock over a set of keys ([`Client::lock_all`]): every key of the set is
/// exclusive until [`validity`](Guard::validity) runs out.
pub type MultiLock = Guard<kind::All>;

/// A held Redlock mutex with a fencing token ([`Client::lock_fenced`]).
///
/// The [`fencing_token`](Guard::fencing_token) strictly increases with each fenced grant of the
/// same key, across all clients, in the order in which the grants hold the lock. A holder that
/// paused past its validity (a GC, a stopped VM) and carries on regardless still has its old,
/// smaller token, so a store that refuses tokens smaller than the largest it has seen is
/// protected from it. A lock alone cannot give that.
///
/// # How
///
/// Every node keeps a counter per lock key that never expires and only ever rises. The counters
/// of different nodes diverge (each grant reaches only a quorum), so the largest value read in
/// one attempt is not enough on its own; as in quorum registers (ABD), the token must be on a
/// quorum before it is returned:
///
/// 1. **Read**, in the acquire round (no extra round trip): one script per node does
///    `SET key token NX PX ttl` and, if it set the key, raises the node's counter by one and
///    returns it, in the same atomic step.
/// 2. Once a quorum granted the lock, the token is `f = max(counters returned)`.
/// 3. If at least a quorum of the granting nodes returned `f` itself, `f` is already on a
///    quorum, and it is returned at once. This is the usual case: the counters agree unless
///    some node missed a grant (it was down, slow, or left out of a quorum).
/// 4. Otherwise, **write back** (one extra round trip): on each node, if the lock key still
///    holds our random token, the counter is raised to `f` if it is lower, and the node
///    acknowledges. `f` is returned only when a quorum acknowledged before the lock's validity
///    ended. The write-back also brings lagging nodes level, so the next grant is back on the
///    fast path.
///
/// In both cases there is a quorum `W` of nodes each of which, at some instant `w` before the
/// end of validity and while holding our token in the lock key, had a counter of at least `f`:
/// the nodes that returned `f` (step 3, `w` the instant of their acquire script), or the nodes
/// that acknowledged the write-back (step 4).
///
/// # Why the tokens strictly increase
///
/// Redlock's timing assumption: a key a node set for an attempt started at `s` lives
/// on that node at least until `s + ttl − drift`, which is the holder's end of validity `V`.
/// Take grants G1 (token `f1`, validity end `V1`, quorum `W1` as above) and G2 (`f2`, `V2`),
/// where G1 held the lock first, so `V1 < V2`.
///
/// `W1` and the nodes that granted G2 are both majorities, so some node `x` is in both. On
/// `x`, at an instant `w < V1`, G1's token was in the lock key and the counter was at least
/// `f1`. G2's `SET NX` succeeded on `x` at an instant `a`, and G2's key then stays on `x` until
/// at least `V2`.
///
/// - If `a < w`, then `w` lies in `[a, V2]` (because `w < V1 < V2`), so `x` held G2's token at
///   `w` and could not have held G1's. Impossible.
/// - So `w < a`: when G2 took `x`, its counter was already at least `f1` (counters only
///   rise), and G2's script raised it by one and returned it in the same atomic step. G2's
///   token is the largest value returned, so `f2 ≥ f1 + 1`.
///
/// Tokens are not consecutive: lost attempts raise the counters of the nodes that granted
/// them. Extending the lock keeps its token. Tokens compare only between grants of the same
/// key. Plain [`Lock`]s on the key neither read nor raise the counter and get no token.
///
/// # What breaks it
///
/// - **A node that loses its counter.** A *delayed restart* protects the lock keys by
///   outwaiting their TTL, but the counter never expires, so it does not protect the counter:
///   a node that comes back empty may be the only one shared by `W1` and G2's quorum, and G2
///   can then get a token no larger than `f1`. Fencing needs persistence that keeps every
///   acknowledged write through a crash: AOF with `appendfsync always` (`everysec` may lose
///   the last second).
/// - **Clock jumps, or drift beyond the allowance, on the nodes** (a key that expires early)
///   break the timing assumption, and the lock along with it.
/// - **A write-back that misses its quorum within the validity**: then no token is given, the
///   attempt fails and the lock is released on every node.
/// - **Other writers of the counter keys** (`redlock-mux:fence:` followed by the key, with the
///   key in braces as a hash tag when it has none of its own). A value that is not a whole
///   number makes the node fail its vote (`ERR fence counter is not a whole number`) rather
///   than count from zero.
/// - **Counters at 2^53 − 1**, where Lua's numbers stop being exact: nodes then fail their
///   votes with `ERR fence counter exhausted`. At a million grants a second that takes 285
///   years.
pub type FencedLock = Guard<kind::FencedMutex>;

/// A held write lock with a fencing token ([`Client::write_lock_fenced`]): no reader and no
/// other writer holds the resource until [`validity`](Guard::validity) runs out, and the
/// [`fencing_token`](Guard::fencing_token) strictly increases with each fenced write grant of
/// the same resource, as a [`FencedLock`]'s does with each fenced mutex grant: the same read
/// phase and write-back, and the same argument, with the read-write lock's writer key as the
/// lock key.
///
/// The counter is the writer key's own (`redlock-mux:fence:{rw:K}:w` for a resource `K`
/// without a hash tag, see [`KeyNames::writer_fence`](crate::KeyNames::writer_fence)), in the
/// slot of the other keys of the read-write lock. A fenced mutex and a fenced write lock on one
/// resource therefore count apart, as the two locks do not exclude each other; a plain
/// [`WriteLock`] on the resource excludes a fenced one, and neither reads nor raises the
/// counter.
pub type FencedWriteLock = Guard<kind::FencedWrite>;

/// One permit of a [`Semaphore`](crate::Semaphore)
/// ([`Semaphore::acquire`](crate::Semaphore::acquire)): at most
/// [`permits`](Guard::permits) permits of the resource are held at once until
/// [`validity`](Guard::validity) runs out.
pub type Permit = Guard<kind::Semaphore>;

impl<K: Kind> fmt::Debug for Guard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.held.fmt(f)
    }
}

impl<K: Kind> Guard<K> {
    pub(crate) fn new(held: Held) -> Guard<K> {
        Guard {
            held,
            kind: PhantomData,
        }
    }

    /// The lock, for whatever runs its lifecycle instead of this guard (the keeper thread).
    pub(crate) fn into_held(self) -> Held {
        self.held
    }

    /// The client this lock was taken with.
    pub(crate) fn client(&self) -> &Client {
        &self.held.client
    }

    /// The lock.
    pub(crate) fn held(&self) -> &Held {
        &self.held
    }

    /// This holder's token: 160 bits from the OS random source, as 40 hex characters. It is
    /// what the lock's keys hold on every node that granted it (the value of a mutex key, of
    /// each key of a set, or of a writer key; a member of a reader set): the token of the
    /// attempt that won the lock (every attempt draws its own).
    pub fn token(&self) -> &[u8] {
        self.held.token.as_bytes()
    }

    /// The time left before the lock may be granted to someone else. Zero once it has run out.
    pub fn validity(&self) -> Duration {
        self.held.hold.validity(Instant::now())
    }

    /// Resets the lock's TTL to `ttl` on every node that still holds it with our token (for a
    /// set: every node that still holds the whole set; a node that lost any key extends none
    /// and counts as refusing).
    ///
    /// Succeeds only if a quorum agrees before the current validity ends; the validity is then
    /// `ttl` minus the time the round took minus the drift allowance.
    ///
    /// A failed extend never lengthens the validity, but it may shorten it. The nodes that
    /// accepted it, and those that did not answer in time (they may run it later), now expire
    /// the lock `ttl` after the round began; so the validity becomes the earlier of its current
    /// end and `ttl` minus the drift allowance from the start of the round. A failed extend to
    /// a `ttl` longer than the validity left thus leaves the lock as it was (held until its
    /// current validity ends, if it was held); a failed extend to a shorter one leaves at most
    /// that shorter validity. An invalid `ttl` is refused before anything is sent. A fencing
    /// token stays the same.
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        self.held.extend(ttl)
    }

    /// Releases the lock on every node, whether or not that node granted it, and announces it
    /// to waiters. Keys that have expired, or that hold something else (another token, a value
    /// of another type), are left alone, and do not stop the release of the others. A fence
    /// counter stays.
    ///
    /// Returns once a quorum of nodes has answered (for a [`Permit`], see
    /// [`Semaphore`](crate::Semaphore)); the other nodes still get the release.
    pub fn release(mut self) -> Result<(), Error> {
        self.held.release()
    }
}

impl<K: OneKey> Guard<K> {
    /// The resource key this lock is on.
    pub fn key(&self) -> &[u8] {
        self.held.key()
    }
}

impl Guard<kind::All> {
    /// The keys of the set, sorted.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.held.set_keys()
    }
}

impl<K: Fenced> Guard<K> {
    /// The fencing token of this grant: larger than that of every fenced grant of the same lock
    /// that held it before, smaller than that of every one after.
    pub fn fencing_token(&self) -> u64 {
        self.held.fencing_token.unwrap_or_default()
    }
}

impl<K: Writer> Guard<K> {
    /// Turns this write lock into a read lock on the same resource, for the TTL the lock was
    /// taken (or last extended) with, without ever leaving the resource unlocked: other readers
    /// may join at once, and no writer gets in between. See
    /// [`downgrade_for`](Guard::downgrade_for) to give the read lock another TTL.
    ///
    /// # How
    ///
    /// One round, one atomic script per node: where the writer key still holds our token, the
    /// reader entry goes into the lock's reader set (with the same token, scored by its expiry
    /// on the node's own clock, as every reader's is), and then the writer key is deleted. A
    /// node where the writer key does not hold the token (it expired, or never got it) changes
    /// nothing and counts as refusing. Readers waiting for the write lock are woken, and join.
    ///
    /// The round is bounded as [`extend`](Guard::extend) is: it must be won on a quorum before
    /// the write lock's validity ends, and the read lock is then valid for the TTL less the
    /// time the round took and the drift allowance, from the round's start. In between, every
    /// node of the quorum held either our writer key or our reader, so no writer could be
    /// granted anywhere in a quorum. The token stays the same; a fencing token does not carry
    /// over (read locks have none).
    ///
    /// # When it fails
    ///
    /// A lost round is undone on every node, as a lost acquisition is: the reader entry and
    /// the writer key holding our token are removed. The caller then holds **nothing**: the
    /// write lock is gone too. The error is the one an extend would give:
    /// [`Error::Contended`] when too many nodes no longer held the write lock (it expired or
    /// was lost), [`Error::QuorumUnreachable`] when too many nodes failed or did not answer in
    /// time, [`Error::ValidityExpired`] when the write lock's validity had already ended (the
    /// lock is released then), and an invalid TTL is refused (and the write lock released).
    ///
    /// # Keep-alive
    ///
    /// A [`KeptLock`](crate::KeptLock) does not know its kind, and offers no downgrade:
    /// downgrade the guard first, then hand the read lock to the keeper with
    /// [`keep_alive`](Guard::keep_alive).
    ///
    /// # Why there is no upgrade
    ///
    /// The other way round (read to write) is not offered. Two readers that both ask to
    /// upgrade each wait for the other's read lock to go, and neither lets go of its own: a
    /// deadlock, which only the TTLs would end. Release the read lock and take the write lock
    /// instead, and read the resource again under it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let writer = client.write_lock("catalog", Duration::from_secs(10))?;
    /// // ... rebuild the catalog ...
    /// let reader = writer.downgrade()?;
    /// // ... publish it, while other readers may read it too and no writer can change it ...
    /// reader.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn downgrade(self) -> Result<ReadLock, Error> {
        self.downgrade_ttl(None)
    }

    /// [`downgrade`](Guard::downgrade), with a TTL of `ttl` for the read lock.
    pub fn downgrade_for(self, ttl: Duration) -> Result<ReadLock, Error> {
        self.downgrade_ttl(Some(ttl))
    }

    fn downgrade_ttl(self, ttl: Option<Duration>) -> Result<ReadLock, Error> {
        let mut held = self.held;
        held.downgrade(ttl)?;
        Ok(Guard::new(held))
    }
}

/// Which side of a read-write lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Read,
    Write,
    /// The read side, held by a downgraded write lock (see [`Keys::Downgraded`]).
    Downgraded,
}

/// A lock's keys, owned by its guard, in buffers of its client's [`BufPool`] (given back when
/// the guard goes, see [`Owned::give_back`]).
pub(crate) enum Owned {
    /// A mutex's key.
    Mutex(Vec<u8>),
    /// One side of the read-write lock on `resource`.
    Rw {
        side: Side,
        resource: Vec<u8>,
        keys: RwKeys,
    },
    /// Every key of an all-or-none set, sorted.
    All(KeySet),
    /// A permit of the semaphore on `resource`.
    Sem {
        resource: Vec<u8>,
        keys: SemKeys,
        permits: u32,
        slots: u32,
        quorum: usize,
    },
}

impl fmt::Debug for Owned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = String::from_utf8_lossy;
        match self {
            Owned::Mutex(key) => f.debug_tuple("Mutex").field(&text(key)).finish(),
            Owned::Rw { side, resource, .. } => f
                .debug_struct("Rw")
                .field("side", side)
                .field("resource", &text(resource))
                .finish_non_exhaustive(),
            Owned::All(keys) => f.debug_tuple("All").field(keys).finish(),
            Owned::Sem {
                resource,
                permits,
                slots,
                quorum,
                ..
            } => f
                .debug_struct("Sem")
                .field("resource", &text(resource))
                .field("permits", permits)
                .field("slots", slots)
                .field("quorum", quorum)
                .finish_non_exhaustive(),
        }
    }
}

impl Default for Owned {
    /// No key, and no buffer.
    fn default() -> Owned {
        Owned::Mutex(Vec::new())
    }
}

impl Owned {
    /// The mutex on `key`.
    fn mutex(bufs: &BufPool, key: &[u8]) -> Owned {
        Owned::Mutex(bufs.copy(key))
    }

    /// One side of the read-write lock on `key`.
    fn rw(bufs: &BufPool, side: Side, key: &[u8]) -> Owned {
        Owned::Rw {
            side,
            resource: bufs.copy(key),
            keys: RwKeys::new_in(key, bufs.take(RwKeys::len_for(key))),
        }
    }

    /// A permit of the semaphore of `permits` permits, `slots` slots per node and quorum
    /// `quorum` on `key`.
    pub(crate) fn semaphore(
        bufs: &BufPool,
        key: &[u8],
        permits: u32,
        slots: u32,
        quorum: usize,
    ) -> Owned {
        Owned::Sem {
            resource: bufs.copy(key),
            keys: SemKeys::new_in(key, bufs.take(SemKeys::len_for(key))),
            permits,
            slots,
            quorum,
        }
    }

    /// Gives the buffers back to `bufs`.
    fn give_back(self, bufs: &BufPool) {
        match self {
            Owned::Mutex(key) => bufs.put(key),
            Owned::Rw { resource, keys, .. } => {
                bufs.put(resource);
                bufs.put(keys.into_buf());
            }
            Owned::All(keys) => bufs.put(keys.into_buf()),
            Owned::Sem { resource, keys, .. } => {
                bufs.put(resource);
                bufs.put(keys.into_buf());
            }
        }
    }

    /// Calls `f` with the keys as the engine takes them.
    fn with_keys<R>(&self, f: impl FnOnce(Keys<'_>) -> R) -> R {
        match self {
            Owned::Mutex(key) => f(Keys::Mutex(key)),
            Owned::Rw {
                side: Side::Read,
                resource,
                keys,
            } => f(Keys::Read { resource, keys }),
            Owned::Rw {
                side: Side::Write,
                resource,
                keys,
            } => f(Keys::Write { resource, keys }),
            Owned::Rw {
                side: Side::Downgraded,
                resource,
                keys,
            } => f(Keys::Downgraded { resource, keys }),
            Owned::All(keys) => keys.with_slice(|keys| f(Keys::All(keys))),
            Owned::Sem {
                resource,
                keys,
                permits,
                slots,
                quorum,
            } => f(Keys::Semaphore {
                resource,
                keys,
                permits: *permits,
                capacity: *slots,
                quorum: *quorum,
            }),
        }
    }
}

/// The key of the fence counter of `lock_key`, in a buffer of `bufs`.
fn fence_key(bufs: &BufPool, lock_key: &[u8]) -> Vec<u8> {
    let name = Derived::Fence.of(lock_key);
    let mut buf = bufs.take(name.len());
    name.extend_into(&mut buf);
    buf
}

/// A held lock of any kind: what every guard is, and what the keeper thread keeps alive.
#[derive(Debug)]
pub(crate) struct Held {
    client: Client,
    owned: Owned,
    /// The fence counter's key, for a fenced lock.
    fence: Option<Vec<u8>>,
    token: Token,
    fencing_token: Option<u64>,
    hold: Hold,
    /// The TTL last asked for (by the acquisition, or the last extend that won): what a
    /// downgrade gives the read lock unless told otherwise.
    ttl: Duration,
    released: bool,
    /// The process that took the lock: the only one that may release, extend or keep it
    /// alive. A child after `fork()` has a copy of the guard, not the lock.
    pid: u32,
}

impl Held {
    /// Acquires the lock with keys `owned` (and fence counter `fence`) for `ttl`: one attempt,
    /// or retrying while the client's budget allows, as `attempts` says.
    pub(crate) fn acquire(
        client: &Client,
        owned: Owned,
        fence: Option<Vec<u8>>,
        ttl: Duration,
        attempts: Attempts,
        opts: &Acquire,
    ) -> Result<Held, Error> {
        match Held::grant(client, &owned, fence.as_deref(), ttl, attempts, opts) {
            Ok(grant) => Ok(Held {
                client: client.clone(),
                owned,
                fence,
                token: grant.token,
                fencing_token: grant.fencing_token,
                hold: Hold::new(grant.valid_until).written_with(ttl),
                ttl,
                released: false,
                pid: std::process::id(),
            }),
            Err(e) => {
                owned.give_back(client.bufs());
                if let Some(fence) = fence {
                    client.bufs().put(fence);
                }
                Err(e)
            }
        }
    }

    /// Runs the acquisition of [`acquire`](Held::acquire).
    fn grant(
        client: &Client,
        owned: &Owned,
        fence: Option<&[u8]>,
        ttl: Duration,
        attempts: Attempts,
        opts: &Acquire,
    ) -> Result<Grant, Error> {
        let (ttl_ms, timing) = client.timing(ttl)?;
        opts.check()?;
        let config = client.config();
        let limits = WaitLimits {
            wait_timeout: opts.timeout.unwrap_or(config.wait_timeout),
            deadline: opts.deadline,
            retry_count: opts.retries.unwrap_or(config.retry_count),
        };
        owned.with_keys(|keys| {
            let spec = Spec { keys, fence };
            client.with_driver(|driver| {
                let params = Params {
                    ttl_ms,
                    timing,
                    wait: attempts == Attempts::UntilGranted,
                    fair: config.fair,
                    ticket: if config.fair {
                        TICKETS.next(wall_micros())
                    } else {
                        0
                    },
                    spread: driver.spread,
                };
                let round = driver.take_round();
                let mut m = Acquisition::with_limits(
                    spec,
                    config,
                    params,
                    &limits,
                    Instant::now(),
                    round,
                    driver.entropy(),
                );
                m.record_to(client.recorder());
                let result = driver.drive_cancellable(&mut m, opts.cancel.as_ref().map(|c| c as _));
                driver.spread = m.learnt_spread();
                driver.put_round(m.into_round());
                result.map(|grant: Grant| grant)
            })?
        })
    }

    /// Rebuilds the lock with keys `owned` held with `token` elsewhere (see
    /// [`Client::resume_lock`]): an extend round to `ttl` checks that a quorum still holds it.
    pub(crate) fn resume(
        client: &Client,
        owned: Owned,
        token: &[u8],
        ttl: Duration,
    ) -> Result<Held, Error> {
        let token = Token::parse(token).ok_or(InvalidArgument::BadToken)?;
        let (ttl_ms, timing) = client.timing(ttl)?;
        let mut held = Held {
            client: client.clone(),
            owned,
            fence: None,
            token,
            fencing_token: None,
            // Only bounds the check: the round's own validity is what the lock gets.
            hold: Hold::new(Instant::now() + ttl).written_with(ttl),
            ttl,
            released: false,
            pid: std::process::id(),
        };
        match held.round(Step::Extend { ttl_ms, timing }) {
            Ok(()) => Ok(held),
            Err(e) => {
                // Not ours to release: the caller still has the token, and may try again.
                held.released = true;
                Err(e)
            }
        }
    }

    /// The resource key (a set's first key).
    pub fn key(&self) -> &[u8] {
        match &self.owned {
            Owned::Mutex(key) => key,
            Owned::Rw { resource, .. } | Owned::Sem { resource, .. } => resource,
            Owned::All(keys) => keys.first(),
        }
    }

    /// A semaphore's permits and quorum (`None` for the other kinds).
    pub fn semaphore(&self) -> Option<(u32, usize)> {
        match &self.owned {
            Owned::Sem {
                permits, quorum, ..
            } => Some((*permits, *quorum)),
            _ => None,
        }
    }

    /// The keys of an all-or-none set (none for the other kinds).
    pub fn set_keys(&self) -> SetKeys<'_> {
        match &self.owned {
            Owned::All(keys) => keys.iter(),
            _ => Default::default(),
        }
    }

    /// The holder's token.
    pub fn token(&self) -> &[u8] {
        self.token.as_bytes()
    }

    /// The fencing token, for a fenced lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The client the lock was taken with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// When the lock may be granted to someone else.
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// The process that took the lock.
    pub fn holder(&self) -> u32 {
        self.pid
    }

    /// Fails with [`Error::OtherProcess`] unless the calling process took the lock: a child
    /// after `fork()` has a copy of its parent's guard, and must leave the lock alone.
    pub fn check_holder(&self) -> Result<(), Error> {
        if self.pid == std::process::id() {
            Ok(())
        } else {
            Err(Error::OtherProcess { holder: self.pid })
        }
    }

    /// Runs an extend round to `ttl` (see [`Guard::extend`]).
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let (ttl_ms, timing) = self.client.timing(ttl)?;
        self.round(Step::Extend { ttl_ms, timing })?;
        self.ttl = ttl;
        Ok(())
    }

    /// Runs the downgrade round of a write lock to a read lock for `ttl` (the lock's own TTL
    /// when `None`); see [`Guard::downgrade`]. Won: this is now the read lock. Otherwise
    /// nothing is held (the round's undo went to every node, or, when no round could be run,
    /// the undo goes out on drop).
    fn downgrade(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        // A child's copy of its parent's write lock stays as it is.
        self.check_holder()?;
        let ttl = ttl.unwrap_or(self.ttl);
        let checked = self.client.timing(ttl).map_err(Error::from);
        let mut ran = false;
        let result = checked.and_then(|(ttl_ms, timing)| {
            let step = Step::Downgrade { ttl_ms, timing };
            self.round_then(step, || ran = true)
        });
        if let Owned::Rw { side, .. } = &mut self.owned {
            // From here on, a release (on drop too) undoes both the reader entry and any writer
            // key left with the token.
            *side = Side::Downgraded;
        }
        match result {
            Ok(()) => {
                if let Some(fence) = self.fence.take() {
                    self.client.bufs().put(fence);
                }
                self.fencing_token = None;
                self.ttl = ttl;
                Ok(())
            }
            Err(e) => {
                // The machine sent its undo to every node; otherwise the drop does.
                self.released = ran;
                Err(e)
            }
        }
    }

    /// Runs the release round (see [`Guard::release`]); nothing is done on drop afterwards.
    pub fn release(&mut self) -> Result<(), Error> {
        self.released = true;
        self.round(Step::Release)
    }

    /// Runs a round of `step`. It goes out on the same connections as the acquisition, after
    /// it: it can never overtake the acquisition's command on any node.
    fn round(&mut self, step: Step) -> Result<(), Error> {
        self.round_then(step, || {})
    }

    /// [`round`](Self::round), calling `started` once the round's machine is made (something
    /// may be sent from then on).
    fn round_then(&mut self, step: Step, started: impl FnOnce()) -> Result<(), Error> {
        // Every round (release, extend, downgrade) is the holder's alone: nothing is sent for
        // a guard a child inherited.
        self.check_holder()?;
        let Held {
            client,
            owned,
            fence,
            token,
            hold,
            ..
        } = self;
        let config = client.config();
        owned.with_keys(|keys| {
            let spec = Spec {
                keys,
                fence: fence.as_deref(),
            };
            client.with_driver(|driver| {
                let round = driver.take_round();
                let mut m = hold.round(spec, *token, config, step, Instant::now(), round);
                started();
                m.record_to(client.recorder());
                let result = driver.drive(&mut m);
                driver.put_round(m.into_round());
                result
            })?
        })
    }
}

impl Drop for Held {
    /// Releases the lock, best effort; a guard that a child inherited through `fork()` is
    /// dropped without a word to any node (the lock is its parent's).
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release();
        }
        let bufs = self.client.bufs();
        std::mem::take(&mut self.owned).give_back(bufs);
        if let Some(fence) = self.fence.take() {
            bufs.put(fence);
        }
    }
}

/// The tickets of this process's fair waiters (see [`Tickets`]).
static TICKETS: Tickets = Tickets::new();

/// This machine's wall clock in microseconds since the Unix epoch: a fair waiter's place in the
/// queue.
fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The client's settings, for the calls without options.
pub(crate) const NO_OPTIONS: Acquire = Acquire::new();

/// Whether an acquisition makes one attempt (the `try_*` calls) or waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempts {
    /// One attempt, without retrying.
    Once,
    /// Retries, and waits for announced releases, until granted or the wait ends.
    UntilGranted,
}

/// Which lock a call takes on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Mutex,
    FencedMutex,
    Read,
    Write,
    FencedWrite,
}

impl On {
    /// The keys of this lock on `key`.
    fn owned(self, bufs: &BufPool, key: &[u8]) -> Owned {
        match self {
            On::Mutex | On::FencedMutex => Owned::mutex(bufs, key),
            On::Read => Owned::rw(bufs, Side::Read, key),
            On::Write | On::FencedWrite => Owned::rw(bufs, Side::Write, key),
        }
    }
}

/// Taking locks. Every call comes in two forms: `try_*` makes one attempt, without retrying;
/// the other waits, as [`lock`](Client::lock) says. Both fail with [`Error::Contended`] when
/// someone else holds the lock, and every bad argument is refused before anything is sent.
///
/// With [`fair`](crate::ClientBuilder::fair) set, every waiting kind queues in arrival order.
impl Client {
    /// One attempt to take the lock on `key` for `ttl`, without retrying.
    ///
    /// Fails with [`Error::Contended`] when someone else holds it.
    pub fn try_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.take(On::Mutex, key.as_ref(), ttl, Attempts::Once, &NO_OPTIONS)
            .map(Guard::new)
    }

    /// Takes the lock on `key` for `ttl`, blocking until it is ours or the
    /// [wait timeout](crate::ClientBuilder::wait_timeout) has passed (10 s by default).
    ///
    /// A waiter retries as soon as a release of `key` is announced, and after a jittered
    /// [retry delay](crate::ClientBuilder::retry_delay) when none is; only those unprompted
    /// retries count against the [retry count](crate::ClientBuilder::retry_count), which is
    /// unlimited by default. Fails with [`Error::Contended`] (or the error of the last attempt)
    /// when the wait ends without the lock.
    ///
    /// The returned guard is valid for [`Lock::validity`], which is less than `ttl` by the time
    /// the quorum took and the drift allowance.
    pub fn lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.take(
            On::Mutex,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// One attempt to take a read lock on `key` for `ttl`, without retrying.
    ///
    /// Fails with [`Error::Contended`] while a writer holds the lock (or, with
    /// [`RwPolicy::WritePreferring`](crate::RwPolicy::WritePreferring), waits for it).
    pub fn try_read_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<ReadLock, Error> {
        self.take(On::Read, key.as_ref(), ttl, Attempts::Once, &NO_OPTIONS)
            .map(Guard::new)
    }

    /// Takes a read lock on `key` for `ttl`, retrying like [`Client::lock`]. Any number of
    /// readers may hold it at once.
    ///
    /// The keys each read-write lock uses on the nodes are derived from the resource key so
    /// that they share a Redis Cluster hash slot: `{rw:K}:w`, `{rw:K}:r` and `{rw:K}:wi` for a
    /// key `K` without a hash tag, and `K:rw:w`, `K:rw:r` and `K:rw:wi` for one with a hash
    /// tag ([`KeyNames`](crate::KeyNames) lists them all).
    pub fn read_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<ReadLock, Error> {
        self.take(
            On::Read,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// One attempt to take the write lock on `key` for `ttl`, without retrying.
    ///
    /// Fails with [`Error::Contended`] while readers or a writer hold the lock.
    pub fn try_write_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<WriteLock, Error> {
        self.take(On::Write, key.as_ref(), ttl, Attempts::Once, &NO_OPTIONS)
            .map(Guard::new)
    }

    /// Takes the write lock on `key` for `ttl`, retrying like [`Client::lock`]. It excludes
    /// every reader and every other writer.
    pub fn write_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<WriteLock, Error> {
        self.take(
            On::Write,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// Runs `f` under a read lock on `key` taken for `ttl` (waiting as [`read_lock`] does),
    /// and releases it afterwards, also when `f` panics. The release is best effort, as on
    /// drop; `f` may check [`ReadLock::validity`] and [`extend`](ReadLock::extend) the lock.
    ///
    /// [`read_lock`]: Client::read_lock
    pub fn read<R>(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        f: impl FnOnce(&mut ReadLock) -> R,
    ) -> Result<R, Error> {
        let mut guard = self.read_lock(key, ttl)?;
        Ok(f(&mut guard))
    }

    /// Runs `f` under the write lock on `key` taken for `ttl` (waiting as [`write_lock`]
    /// does), and releases it afterwards, also when `f` panics. The release is best effort, as
    /// on drop; `f` may check [`WriteLock::validity`] and [`extend`](WriteLock::extend) the
    /// lock.
    ///
    /// [`write_lock`]: Client::write_lock
    pub fn write<R>(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        f: impl FnOnce(&mut WriteLock) -> R,
    ) -> Result<R, Error> {
        let mut guard = self.write_lock(key, ttl)?;
        Ok(f(&mut guard))
    }

    /// One attempt to lock every key of `keys` for `ttl`, or none of them, without retrying.
    ///
    /// See [`lock_all`](Client::lock_all) for what is checked. Fails with
    /// [`Error::Contended`] when a quorum could not be had because some key is held elsewhere.
    pub fn try_lock_all<I>(&self, keys: I, ttl: Duration) -> Result<MultiLock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let keys = KeySet::build(keys, self.bufs())?;
        self.check_one_slot(&keys)?;
        Held::acquire(
            self,
            Owned::All(keys),
            None,
            ttl,
            Attempts::Once,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// Locks every key of `keys` for `ttl`, or none of them, retrying as [`lock`](Client::lock)
    /// does.
    ///
    /// Each node runs one atomic script that takes every key of the set, or none when any of
    /// them is held there; the set is held when a quorum of nodes took all of it, within the
    /// validity, as for the mutex. A lost attempt is released on every node. Each key holds the
    /// guard's token as a mutex key does, so a set and a [`Lock`] on one of its keys exclude
    /// each other.
    ///
    /// The keys are sorted; the guard lists them in that order. Rejected before anything is
    /// sent: no keys, more than [`MAX_LOCK_ALL_KEYS`](crate::MAX_LOCK_ALL_KEYS), an empty or
    /// overlong key, and the same key twice
    /// ([`InvalidArgument::DuplicateKey`](crate::InvalidArgument::DuplicateKey)), which almost
    /// always means the caller computed its set wrongly. Deduplicate first if repeats are
    /// expected.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let set = client.lock_all(["account:1", "account:2"], Duration::from_secs(5))?;
    /// // ... move money between the two accounts within set.validity() ...
    /// set.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn lock_all<I>(&self, keys: I, ttl: Duration) -> Result<MultiLock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let keys = KeySet::build(keys, self.bufs())?;
        self.check_one_slot(&keys)?;
        Held::acquire(
            self,
            Owned::All(keys),
            None,
            ttl,
            Attempts::UntilGranted,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// Like [`try_lock`](Client::try_lock), and the guard carries a fencing token: see
    /// [`FencedLock`]. One attempt, without retrying.
    pub fn try_lock_fenced(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<FencedLock, Error> {
        self.take(
            On::FencedMutex,
            key.as_ref(),
            ttl,
            Attempts::Once,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// Like [`lock`](Client::lock), and the guard carries a fencing token: see [`FencedLock`].
    ///
    /// The acquire is a script instead of a plain `SET`, and it costs one more round trip than
    /// [`lock`](Client::lock) (the write-back) when the nodes' counters disagree, which happens
    /// after some node missed a grant: while it was down, slow, or not in a quorum. Locks taken
    /// with [`lock`](Client::lock) pay nothing for fencing, and exclude fenced locks on the
    /// same key as usual.
    ///
    /// If the write-back does not reach a quorum within the validity (a node that granted the
    /// lock went down in between), the lock is released on every node and the attempt is made
    /// again, at most three times in all and within the wait timeout; then the write-back's
    /// error is returned. [`try_lock_fenced`](Client::try_lock_fenced) makes one attempt.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let lock = client.lock_fenced("invoice:42", Duration::from_secs(10))?;
    /// // Send the token with every write; the store keeps the largest one it has seen and
    /// // refuses writes that carry a smaller one.
    /// let token: u64 = lock.fencing_token();
    /// # let _ = token;
    /// lock.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn lock_fenced(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<FencedLock, Error> {
        self.take(
            On::FencedMutex,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// Like [`try_write_lock`](Client::try_write_lock), and the guard carries a fencing token:
    /// see [`FencedWriteLock`]. One attempt, without retrying.
    pub fn try_write_lock_fenced(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<FencedWriteLock, Error> {
        self.take(
            On::FencedWrite,
            key.as_ref(),
            ttl,
            Attempts::Once,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// Like [`write_lock`](Client::write_lock), and the guard carries a fencing token, as
    /// [`lock_fenced`](Client::lock_fenced) does for the mutex: see [`FencedWriteLock`]. The
    /// token is read in the acquire round, and written back to a quorum (one more round trip)
    /// only when the nodes' counters disagree; a write-back that misses its quorum is handled
    /// as for [`lock_fenced`](Client::lock_fenced).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// // For example ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let writer = client.write_lock_fenced("catalog", Duration::from_secs(10))?;
    /// // Every write to the store carries the token; it refuses tokens smaller than the
    /// // largest it has seen, so a writer that paused past its validity is turned away.
    /// let token: u64 = writer.fencing_token();
    /// # let _ = token;
    /// writer.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn write_lock_fenced(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<FencedWriteLock, Error> {
        self.take(
            On::FencedWrite,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            &NO_OPTIONS,
        )
        .map(Guard::new)
    }

    /// [`lock`](Client::lock), waiting as `opts` says: its timeout or deadline, its retry
    /// count, and its [`Cancel`](crate::Cancel) handle, in place of the client's settings.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::{Acquire, Client};
    ///
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// let opts = Acquire::new().timeout(Duration::from_millis(200));
    /// let lock = client.lock_with("report:7", Duration::from_secs(5), &opts)?;
    /// lock.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn lock_with(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &Acquire,
    ) -> Result<Lock, Error> {
        self.take(On::Mutex, key.as_ref(), ttl, Attempts::UntilGranted, opts)
            .map(Guard::new)
    }

    /// [`read_lock`](Client::read_lock), waiting as `opts` says (see
    /// [`lock_with`](Client::lock_with)).
    pub fn read_lock_with(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &Acquire,
    ) -> Result<ReadLock, Error> {
        self.take(On::Read, key.as_ref(), ttl, Attempts::UntilGranted, opts)
            .map(Guard::new)
    }

    /// [`write_lock`](Client::write_lock), waiting as `opts` says (see
    /// [`lock_with`](Client::lock_with)).
    pub fn write_lock_with(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &Acquire,
    ) -> Result<WriteLock, Error> {
        self.take(On::Write, key.as_ref(), ttl, Attempts::UntilGranted, opts)
            .map(Guard::new)
    }

    /// [`lock_all`](Client::lock_all), waiting as `opts` says (see
    /// [`lock_with`](Client::lock_with)).
    pub fn lock_all_with<I>(
        &self,
        keys: I,
        ttl: Duration,
        opts: &Acquire,
    ) -> Result<MultiLock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let keys = KeySet::build(keys, self.bufs())?;
        self.check_one_slot(&keys)?;
        Held::acquire(
            self,
            Owned::All(keys),
            None,
            ttl,
            Attempts::UntilGranted,
            opts,
        )
        .map(Guard::new)
    }

    /// [`lock_fenced`](Client::lock_fenced), waiting as `opts` says (see
    /// [`lock_with`](Client::lock_with)).
    pub fn lock_fenced_with(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &Acquire,
    ) -> Result<FencedLock, Error> {
        self.take(
            On::FencedMutex,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            opts,
        )
        .map(Guard::new)
    }

    /// [`write_lock_fenced`](Client::write_lock_fenced), waiting as `opts` says (see
    /// [`lock_with`](Client::lock_with)).
    pub fn write_lock_fenced_with(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &Acquire,
    ) -> Result<FencedWriteLock, Error> {
        self.take(
            On::FencedWrite,
            key.as_ref(),
            ttl,
            Attempts::UntilGranted,
            opts,
        )
        .map(Guard::new)
    }

    /// Rebuilds the guard of a mutex on `key` that was taken with `token` by another process,
    /// or by an earlier run of this one (a restart), and extends it to `ttl`.
    ///
    /// The check is an extend round: it succeeds only if a quorum of nodes still holds `key`
    /// with `token`, before the lock's validity could have ended, and then the lock's validity
    /// is `ttl` less the time the round took and the drift allowance, **measured from the
    /// check**: nothing is known of the time before it. It fails as an extend does
    /// ([`Error::Contended`] when too few nodes hold the token: the lock has expired or
    /// passed to someone else); a failed check releases nothing, so the caller may try again.
    /// A token that is not 40 lowercase hex characters (the shape of [`Guard::token`]) is
    /// refused with [`InvalidArgument::BadToken`] before anything is sent.
    ///
    /// # Safety caveat
    ///
    /// A token is a capability: whoever has it holds the lock. Resume only a lock whose
    /// original holder has stopped using it (it exited, crashed, or handed the token over and
    /// will touch neither the resource nor the lock again); otherwise both believe they hold
    /// it. The `redlock-mux run` command exports `REDLOCK_MUX_KEY` and `REDLOCK_MUX_TOKEN` to
    /// its child, which may resume the lock with them (the command keeps it alive as well).
    ///
    /// A fenced lock is resumed as a plain one, with this call or
    /// [`resume_write_lock`](Client::resume_write_lock): the fencing token of the original
    /// grant is not recovered.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// # let first = client.lock("job:9", Duration::from_secs(30))?;
    /// # let token = first.token().to_vec();
    /// # std::mem::forget(first); // as if the process that took it had exited
    /// // `token` came from the process that took the lock (for example REDLOCK_MUX_TOKEN).
    /// let lock = client.resume_lock("job:9", &token, Duration::from_secs(30))?;
    /// // ... finish the job within lock.validity() ...
    /// lock.release()?;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn resume_lock(
        &self,
        key: impl AsRef<[u8]>,
        token: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.resume_on(On::Mutex, key.as_ref(), token.as_ref(), ttl)
            .map(Guard::new)
    }

    /// Rebuilds the guard of a read lock on `key` held with `token` (see
    /// [`resume_lock`](Client::resume_lock)).
    pub fn resume_read_lock(
        &self,
        key: impl AsRef<[u8]>,
        token: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<ReadLock, Error> {
        self.resume_on(On::Read, key.as_ref(), token.as_ref(), ttl)
            .map(Guard::new)
    }

    /// Rebuilds the guard of the write lock on `key` held with `token` (see
    /// [`resume_lock`](Client::resume_lock)).
    pub fn resume_write_lock(
        &self,
        key: impl AsRef<[u8]>,
        token: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<WriteLock, Error> {
        self.resume_on(On::Write, key.as_ref(), token.as_ref(), ttl)
            .map(Guard::new)
    }

    /// Rebuilds the guard of an all-or-none lock on `keys` held with `token` (see
    /// [`resume_lock`](Client::resume_lock)); the keys are checked as
    /// [`lock_all`](Client::lock_all) checks them.
    pub fn resume_lock_all<I>(
        &self,
        keys: I,
        token: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<MultiLock, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let keys = KeySet::build(keys, self.bufs())?;
        self.check_one_slot(&keys)?;
        Held::resume(self, Owned::All(keys), token.as_ref(), ttl).map(Guard::new)
    }

    /// Rebuilds the guard of the lock `on` the one key `key` held with `token` (see
    /// [`resume_lock`](Client::resume_lock)).
    fn resume_on(&self, on: On, key: &[u8], token: &[u8], ttl: Duration) -> Result<Held, Error> {
        check_key(key)?;
        Held::resume(self, on.owned(self.bufs(), key), token, ttl)
    }

    /// The lock `on` the one key `key`: one attempt, or waiting, as `attempts` says.
    fn take(
        &self,
        on: On,
        key: &[u8],
        ttl: Duration,
        attempts: Attempts,
        opts: &Acquire,
    ) -> Result<Held, Error> {
        check_key(key)?;
        let bufs = self.bufs();
        let owned = on.owned(bufs, key);
        let fence = match (&owned, on) {
            (Owned::Mutex(_), On::FencedMutex) => Some(fence_key(bufs, key)),
            (Owned::Rw { keys, .. }, On::FencedWrite) => Some(fence_key(bufs, keys.writer())),
            _ => None,
        };
        Held::acquire(self, owned, fence, ttl, attempts, opts)
    }
}
