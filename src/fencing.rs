//! Fenced mutexes: [`Client::lock_fenced`], [`Client::try_lock_fenced`] and the
//! [`FencedLock`] guard.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::client::{Client, KeyBuf, Lock};
use crate::config::check_key;
use crate::engine::fencing::fence_key;
use crate::engine::kind::{Keys, Spec};
use crate::error::Error;

impl Client {
    /// Like [`try_lock`](Client::try_lock), and the guard carries a fencing token: see
    /// [`FencedLock`]. One attempt, without retrying.
    pub fn try_lock_fenced(
        &self,
        key: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<FencedLock, Error> {
        self.lock_fenced_with(key.as_ref(), ttl, false)
    }

    /// Like [`lock`](Client::lock), and the guard carries a fencing token: see [`FencedLock`].
    ///
    /// The acquire is a script instead of a plain `SET`, and it costs one more round trip than
    /// [`lock`](Client::lock) (the write-back) when the nodes' counters disagree, which happens
    /// after some node missed a grant: while it was down, slow, or not in a quorum. Locks taken with [`lock`](Client::lock)
    /// pay nothing for fencing, and exclude fenced locks on the same key as usual.
    ///
    /// If the write-back does not reach a quorum within the validity (a node that granted the
    /// lock went down in between), the lock is released on every node and the attempt is made
    /// again, at most three times in all and within the wait timeout; then the write-back's
    /// error is returned. [`try_lock_fenced`](Client::try_lock_fenced) makes one attempt.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
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
        self.lock_fenced_with(key.as_ref(), ttl, true)
    }

    fn lock_fenced_with(&self, key: &[u8], ttl: Duration, wait: bool) -> Result<FencedLock, Error> {
        check_key(key)?;
        let ttl = self.timing(ttl)?;
        let fence = fence_key(key);
        let spec = Spec {
            keys: Keys::Mutex(key),
            fence: Some(&fence),
        };
        let won = self.acquire(spec, ttl, wait)?;
        let fencing_token = won.grant.fencing_token.unwrap_or_default();
        Ok(FencedLock {
            lock: Lock::from_parts(self.clone(), KeyBuf::new(key), won),
            fencing_token,
        })
    }
}

/// A held Redlock mutex with a fencing token. Dropping it releases it, best effort.
///
/// The [`fencing_token`](FencedLock::fencing_token) strictly increases with each fenced grant
/// of the same key, across all clients, in the order in which the grants hold the lock. A
/// holder that paused past its validity (a GC, a stopped VM) and carries on regardless still
/// has its old, smaller token, so a store that refuses tokens smaller than the largest it has
/// seen is protected from it. A lock alone cannot give that.
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
/// Redlock's timing assumption (seed 004): a key a node set for an attempt started at `s` lives
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
#[derive(Debug)]
pub struct FencedLock {
    lock: Lock,
    fencing_token: u64,
}

impl FencedLock {
    /// The fencing token of this grant: larger than that of every fenced grant of the same key
    /// that held it before, smaller than that of every one after.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The key this lock is on.
    pub fn key(&self) -> &[u8] {
        self.lock.key()
    }

    /// This holder's random token, stored at the key (not the fencing token).
    pub fn token(&self) -> &[u8] {
        self.lock.token()
    }

    /// The time left before the lock may be granted to someone else. Zero once it has run out.
    pub fn validity(&self) -> Duration {
        self.lock.validity()
    }

    /// Resets the lock's TTL, as [`Lock::extend`] does (a failed extend may shorten the
    /// validity, never lengthen it). The fencing token stays the same.
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        self.lock.extend(ttl)
    }

    /// Releases the lock on every node, as [`Lock::release`] does. The counter stays.
    pub fn release(self) -> Result<(), Error> {
        self.lock.release()
    }
}
