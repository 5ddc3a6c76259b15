//! Read-write locks: many readers or one writer, over the same Redlock quorum as the mutex.
//!
//! The keys and scripts are in `engine::rw`; this module is the API: [`RwPolicy`], the
//! [`ReadLock`] and [`WriteLock`] guards, and the `Client` methods that make them.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::client::Client;
use crate::config::check_key;
use crate::driver::Pending;
use crate::engine::hold::Hold;
use crate::engine::kind::{Keys, Spec};
use crate::engine::rw::RwKeys;
use crate::error::Error;
use crate::rng::Token;

/// Which side of the lock a guard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

/// What both guards hold.
#[derive(Debug)]
struct Held {
    client: Client,
    side: Side,
    key: Vec<u8>,
    keys: RwKeys,
    token: Token,
    hold: Hold,
    /// The acquisition's round, while votes of it may be in flight.
    pending: Pending,
    released: bool,
}

impl Held {
    fn validity(&self) -> Duration {
        self.hold.validity(Instant::now())
    }

    fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let spec = spec(self.side, &self.key, &self.keys);
        self.client
            .extend_round(spec, self.token, &mut self.hold, ttl, &self.pending)
    }

    fn release_now(&mut self) -> Result<(), Error> {
        self.released = true;
        let spec = spec(self.side, &self.key, &self.keys);
        self.client
            .release_round(spec, self.token, &mut self.hold, &self.pending)
    }
}

/// The lock of `side` on resource `key` with `keys`.
fn spec<'a>(side: Side, key: &'a [u8], keys: &'a RwKeys) -> Spec<'a> {
    Spec {
        keys: match side {
            Side::Read => Keys::Read {
                resource: key,
                keys,
            },
            Side::Write => Keys::Write {
                resource: key,
                keys,
            },
        },
        fence: None,
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release_now();
        }
    }
}

macro_rules! guard_methods {
    ($guard:ident, $what:literal) => {
        impl $guard {
            /// The resource key this lock is on.
            pub fn key(&self) -> &[u8] {
                &self.0.key
            }

            #[doc = concat!("This holder's token: 160 bits from the OS random source, as 40 hex characters. It is the ", $what, " on every node that granted the lock.")]
            pub fn token(&self) -> &[u8] {
                self.0.token.as_bytes()
            }

            /// The time left before the lock may be granted against this hold. Zero once it
            /// has run out.
            pub fn validity(&self) -> Duration {
                self.0.validity()
            }

            /// Resets this hold's TTL to `ttl` on every node that still has it.
            ///
            /// Succeeds only if a quorum agrees before the current validity ends; the validity
            /// is then `ttl` minus the time the round took minus the drift allowance. A failed
            /// extend never lengthens the validity but may shorten it, to at most `ttl` minus
            /// the drift allowance from the start of the round, since nodes may have applied it
            /// (or apply it later); see [`Lock::extend`](crate::Lock::extend).
            pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
                self.0.extend(ttl)
            }

            /// Releases this hold on every node, whether or not that node granted it, and
            /// announces it to waiters. Returns once a quorum of nodes has answered.
            pub fn release(mut self) -> Result<(), Error> {
                self.0.release_now()
            }

            /// The client this lock was taken with.
            pub(crate) fn client(&self) -> &Client {
                &self.0.client
            }

            /// The instant the lock may be granted against this hold.
            pub(crate) fn valid_until(&self) -> Instant {
                self.0.hold.valid_until()
            }
        }
    };
}

/// A held read lock: other readers may hold the same resource, writers may not. Dropping it
/// releases it, best effort; call [`release`](ReadLock::release) to see whether that worked.
///
/// Writers are only guaranteed out until [`validity`](ReadLock::validity) runs out. Work that
/// may take longer must [`extend`](ReadLock::extend) it first.
#[derive(Debug)]
pub struct ReadLock(Held);

/// A held write lock: no reader and no other writer holds the resource. Dropping it releases
/// it, best effort; call [`release`](WriteLock::release) to see whether that worked.
///
/// The lock is only guaranteed exclusive until [`validity`](WriteLock::validity) runs out.
/// Work that may take longer must [`extend`](WriteLock::extend) it first.
#[derive(Debug)]
pub struct WriteLock(Held);

guard_methods!(ReadLock, "member of the resource's reader set");
guard_methods!(WriteLock, "value of the resource's writer key");

/// Read-write locks. The keys each lock uses on the nodes are derived from the resource key
/// so that they share a Redis Cluster hash slot: `{rw:K}:w`, `{rw:K}:r` and `{rw:K}:wi` for a
/// key `K` without a hash tag, and `K:rw:w`, `K:rw:r` and `K:rw:wi` for one with a hash tag.
impl Client {
    /// One attempt to take a read lock on `key` for `ttl`, without retrying.
    ///
    /// Fails with [`Error::Contended`] while a writer holds the lock (or, with
    /// [`RwPolicy::WritePreferring`](crate::RwPolicy::WritePreferring), waits for it).
    pub fn try_read_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<ReadLock, Error> {
        self.read_lock_with(key.as_ref(), ttl, false)
    }

    /// Takes a read lock on `key` for `ttl`, retrying like [`Client::lock`]. Any number of
    /// readers may hold it at once.
    pub fn read_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<ReadLock, Error> {
        self.read_lock_with(key.as_ref(), ttl, true)
    }

    /// One attempt to take the write lock on `key` for `ttl`, without retrying.
    ///
    /// Fails with [`Error::Contended`] while readers or a writer hold the lock.
    pub fn try_write_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<WriteLock, Error> {
        self.write_lock_with(key.as_ref(), ttl, false)
    }

    /// Takes the write lock on `key` for `ttl`, retrying like [`Client::lock`]. It excludes
    /// every reader and every other writer.
    pub fn write_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<WriteLock, Error> {
        self.write_lock_with(key.as_ref(), ttl, true)
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

    fn read_lock_with(&self, key: &[u8], ttl: Duration, wait: bool) -> Result<ReadLock, Error> {
        self.rw_lock_with(Side::Read, key, ttl, wait).map(ReadLock)
    }

    fn write_lock_with(&self, key: &[u8], ttl: Duration, wait: bool) -> Result<WriteLock, Error> {
        self.rw_lock_with(Side::Write, key, ttl, wait)
            .map(WriteLock)
    }

    fn rw_lock_with(
        &self,
        side: Side,
        key: &[u8],
        ttl: Duration,
        wait: bool,
    ) -> Result<Held, Error> {
        check_key(key)?;
        let ttl = self.timing(ttl)?;
        let keys = RwKeys::new(key);
        let won = self.acquire(spec(side, key, &keys), ttl, wait)?;
        Ok(Held {
            client: self.clone(),
            side,
            key: key.to_vec(),
            keys,
            token: won.grant.token,
            hold: Hold::new(won.grant.valid_until),
            pending: won.pending,
            released: false,
        })
    }
}
