//! The counting semaphore over N independent masters: [`Client::semaphore`] and its handle.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::client::Client;
use crate::config::check_key;
use crate::engine::keys::SemKeys;
use crate::engine::sem::{self, Census};
use crate::error::Error;
use crate::guard::{kind, Attempts, Guard, Held, Owned, Permit, NO_OPTIONS};
use crate::options::Acquire;

pub use crate::engine::sem::MAX_PERMITS;

/// A counting semaphore on one resource key: at most [`permits`](Semaphore::permits) holders
/// of a [`Permit`] at any instant, over the client's N independent Redis masters
/// ([`Client::semaphore`]).
///
/// # Why it is safe, and what that costs
///
/// Each node admits at most `c` live holders of the resource (its
/// [slots](Semaphore::slots_per_node)), and a client holds a permit when `q` nodes (the
/// [quorum](Semaphore::quorum)) admitted its token within the validity, exactly as a mutex
/// holder holds its lock on a majority: the same TTL, drift allowance and validity, the same
/// cleanup of a lost attempt on every node, entries expiring on each node's own clock. When
/// `c < k`, the slots an acquire was granted beyond its quorum are given back at once, so that
/// a holder keeps `q` slots and blocks nobody with the others.
///
/// `k + 1` simultaneous holders would need `(k + 1)·q` admissions, and the nodes have only
/// `c·N` slots. So **`k + 1` holders are impossible iff `(k + 1)·q > c·N`**, under Redlock's
/// timing assumptions (bounded clock drift, and a node that restarts without its data stays
/// out for a TTL). And **all `k` permits fit while every node is up iff `k·q ≤ c·N`**.
/// [`Client::semaphore`] takes the smallest `c`, then the smallest `q`, that satisfy both: the
/// fewer slots per node, the smaller the quorum, and the more nodes may fail. For `k = 1` it is
/// `c = 1` and the Redlock majority `⌊N/2⌋ + 1`: the mutex is the special case.
///
/// The obvious design, the majority quorum with `c = k`, **admits too many holders for `k ≥ 2`**: with
/// `N = 5`, `k = 2` and `q = 3`, three clients can each be admitted by 3 nodes, since
/// 9 admissions fit in 5 × 2 = 10 slots. [`with_quorum`](Semaphore::with_quorum) refuses
/// such a quorum with [`InvalidArgument::UnsafeQuorum`](crate::InvalidArgument::UnsafeQuorum).
///
/// Acquires (and extends) need `q` nodes, so they stop once more than `N − q` nodes are down
/// ([`tolerated_failures`](Semaphore::tolerated_failures)). While `d` nodes are down, at most
/// `min(k, ⌊c·(N − d) / q⌋)` permits can be held at once
/// ([`usable_permits`](Semaphore::usable_permits)):
///
/// | N | k | c | q | nodes that may fail | usable permits with d nodes down (d = 0, 1, 2, …) |
/// |---|---|---|---|---|---|
/// | 3 | 1 | 1 | 2 | 1 | 1, 1, 0 |
/// | 3 | 2 | 2 | 3 | 0 | 2, 0 |
/// | 5 | 1 | 1 | 3 | 2 | 1, 1, 1, 0 |
/// | 5 | 2 | 1 | 2 | 3 | 2, 2, 1, 1, 0 |
/// | 5 | 3 | 2 | 3 | 2 | 3, 2, 2, 0 |
/// | 7 | 2 | 1 | 3 | 4 | 2, 2, 1, 1, 1, 0 |
/// | 7 | 3 | 1 | 2 | 5 | 3, 3, 2, 2, 1, 1, 0 |
/// | 9 | 4 | 1 | 2 | 7 | 4, 4, 3, 3, 2, 2, 1, 1, 0 |
///
/// Before the slots were chosen, every node had `c = k` slots, which needs
/// `q = ⌊k·N / (k + 1)⌋ + 1`: 4 of 5 nodes for `k = 2` or `3` (1 may fail), 5 of 7 for
/// `k = 2`, 8 of 9 for `k = 4`. Any other quorum is also accepted by
/// [`with_quorum`](Semaphore::with_quorum) when some `c ≤ k` makes it safe and usable (it
/// takes the smallest); others are refused.
/// An [extend](Guard::extend) needs the quorum too; a [release](Guard::release) returns once
/// `N − q + 1` nodes acknowledged it, so that fewer than a quorum can still hold the permit
/// (one node when the quorum is every node), and the other nodes still get it. That is the
/// other side of the trade: the smallest quorum lets acquires survive the most failures, and
/// makes releases need the most nodes (4 of 5 for `N = 5`, `k = 2`, `q = 2`);
/// [`with_quorum`](Semaphore::with_quorum) picks another point (`with_quorum(4)` there: 4
/// nodes to acquire, 2 to release).
///
/// # On the nodes
///
/// With one slot per node (`c = 1`), a node's part of a permit is one string key (`{sem:K}:s`
/// for a key `K` without a hash tag, `K:sem` with one; see [`KeyNames`](crate::KeyNames)),
/// taken with the mutex's own command, `SET key value NX PX ttl GET`, sent to every node at
/// once: nil is a grant, a value another holder. The value is the holder's token followed by
/// `:sem:` and the permits. A release is the mutex's compare-and-delete of that value (`DELEX`
/// where the node has it), an extend its compare-and-`PEXPIRE`.
///
/// With more slots, each node keeps one sorted set under the same name: holder tokens scored
/// by their expiry in ms on that node's clock, and a marker member `=` scored by minus the
/// shape (`k` when `c = k`, as every semaphore was before the slots were chosen; `c + k·2²¹`
/// otherwise). An acquire prunes the expired holders and admits when fewer than `c` are left;
/// the set lives as long as its longest-lived holder, and the release of its last live holder
/// deletes it.
///
/// A client that asks with another number of permits or slots (another `k`, or a version that
/// chose other slots: a sorted set where a key is expected, or the reverse), or finds another
/// lock's value there, is refused by that node with a
/// [`NodeErrorKind::Setup`](crate::NodeErrorKind::Setup) failure (`command` `semaphore`),
/// never with contention; that ends the acquisition with [`Error::Config`] when too few nodes
/// are left for a quorum: clients that disagreed on `k` would together admit more holders
/// than either allows, and a node counted with `c` slots by one and `c'` by another breaks
/// both counts. Releases are announced on the key's wake channel, so waiters retry at once.
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::Client;
///
/// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
/// let client = Client::new(nodes.split(','))?;
/// // At most 2 backups at once across the fleet.
/// let backups = client.semaphore("backups", 2)?;
/// println!("quorum {} of {} nodes", backups.quorum(), client.nodes());
/// let permit = backups.acquire(Duration::from_secs(30))?;
/// // ... run one backup within permit.validity() ...
/// permit.release()?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    key: Vec<u8>,
    permits: u32,
    slots: u32,
    quorum: usize,
}

impl Client {
    /// The counting semaphore of `permits` permits on `key`, with the fewest slots per node
    /// and then the smallest quorum that keep it safe and let every permit in (see
    /// [`Semaphore`]). Nothing is sent.
    ///
    /// Refused with [`InvalidArgument::BadPermits`](crate::InvalidArgument::BadPermits) when
    /// `permits` is 0 or more than [`MAX_PERMITS`], and as every lock call refuses a bad
    /// key.
    pub fn semaphore(&self, key: impl AsRef<[u8]>, permits: u32) -> Result<Semaphore, Error> {
        let key = key.as_ref();
        check_key(key)?;
        let (_, quorum) = sem::shape(permits.min(MAX_PERMITS), self.nodes());
        let slots = sem::check(permits, self.nodes(), quorum)?;
        Ok(Semaphore {
            client: self.clone(),
            key: key.to_vec(),
            permits,
            slots,
            quorum,
        })
    }
}

impl Semaphore {
    /// This semaphore with quorum `quorum` instead of the chosen one, and the fewest slots per
    /// node `c` that make it safe and usable: `permits·quorum ≤ c·N < (permits + 1)·quorum`
    /// with `c ≤ permits`. A larger quorum tolerates fewer node failures. Refused with
    /// [`InvalidArgument::UnsafeQuorum`](crate::InvalidArgument::UnsafeQuorum) when there is no
    /// such `c` (with `N = 5` and 2 permits, quorums 2, 4 and 5 are accepted, 1 and 3 are not)
    /// or `quorum` is more than the nodes.
    pub fn with_quorum(mut self, quorum: usize) -> Result<Semaphore, Error> {
        self.slots = sem::check(self.permits, self.client.nodes(), quorum)?;
        self.quorum = quorum;
        Ok(self)
    }

    /// The resource key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// How many holders may hold a permit at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// How many nodes must admit a holder: the smallest that fits with the fewest slots per
    /// node (see [`Semaphore`]) unless set with [`with_quorum`](Semaphore::with_quorum).
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// How many holders each node admits: the smallest `c` with
    /// `permits·quorum ≤ c·N < (permits + 1)·quorum`.
    pub fn slots_per_node(&self) -> u32 {
        self.slots
    }

    /// How many nodes may be down while permits can still be acquired: `N − quorum`.
    pub fn tolerated_failures(&self) -> usize {
        self.client.nodes() - self.quorum
    }

    /// How many permits can be held at once while `down` nodes are down:
    /// `min(permits, ⌊slots·(N − down) / quorum⌋)`.
    pub fn usable_permits(&self, down: usize) -> u32 {
        sem::usable_permits(
            self.permits,
            self.slots,
            self.client.nodes(),
            self.quorum,
            down,
        )
    }

    /// One attempt to take a permit for `ttl`, without retrying. Fails with
    /// [`Error::Contended`] when too few nodes have a free slot.
    pub fn try_acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.take(ttl, Attempts::Once, &NO_OPTIONS)
    }

    /// Takes a permit for `ttl`, retrying as [`Client::lock`] does: at once when a release
    /// of the key is announced, after a jittered retry delay otherwise, until the client's
    /// wait timeout. With [`fair`](crate::ClientBuilder::fair) set, waiters queue in arrival
    /// order.
    pub fn acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.take(ttl, Attempts::UntilGranted, &NO_OPTIONS)
    }

    /// [`acquire`](Semaphore::acquire), waiting as `opts` says (see
    /// [`Client::lock_with`]).
    pub fn acquire_with(&self, ttl: Duration, opts: &Acquire) -> Result<Permit, Error> {
        self.take(ttl, Attempts::UntilGranted, opts)
    }

    /// Rebuilds the guard of a permit held with `token` elsewhere, and extends it to `ttl`;
    /// see [`Client::resume_lock`] for the check and its safety caveat.
    pub fn resume(&self, token: impl AsRef<[u8]>, ttl: Duration) -> Result<Permit, Error> {
        Held::resume(&self.client, self.owned(), token.as_ref(), ttl).map(Guard::new)
    }

    /// An estimate of the free permits, for monitoring: how many acquisitions would win one
    /// after the other if nothing else changed. Each needs a quorum of nodes with a free slot,
    /// so that is the `quorum`-th largest number of free slots over the nodes, a node that is
    /// down or does not answer within the node timeout counting as full. Holders that expired
    /// count as gone; the cleanups of lost attempts in flight may still count.
    pub fn available(&self) -> Result<u32, Error> {
        let bufs = self.client.bufs();
        let keys = SemKeys::new_in(&self.key, bufs.take(SemKeys::len_for(&self.key)));
        let config = self.client.config();
        let available = self.client.with_driver(|driver| {
            let mut census = Census::new(
                keys.holders(),
                self.permits,
                self.slots,
                self.quorum,
                config.nodes.len(),
            );
            driver.drive(&mut census)
        });
        bufs.put(keys.into_buf());
        available
    }

    fn owned(&self) -> Owned {
        Owned::semaphore(
            self.client.bufs(),
            &self.key,
            self.permits,
            self.slots,
            self.quorum,
        )
    }

    fn take(&self, ttl: Duration, attempts: Attempts, opts: &Acquire) -> Result<Permit, Error> {
        Held::acquire(&self.client, self.owned(), None, ttl, attempts, opts).map(Guard::new)
    }
}

impl Guard<kind::Semaphore> {
    /// How many holders the semaphore admits at once.
    pub fn permits(&self) -> u32 {
        self.held().semaphore().map_or(0, |(k, _)| k)
    }

    /// How many nodes admitted this holder, at least (the semaphore's quorum).
    pub fn quorum(&self) -> usize {
        self.held().semaphore().map_or(0, |(_, q)| q)
    }
}
