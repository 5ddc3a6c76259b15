//! The lock API: [`Client`], its [`ClientBuilder`], and the [`Lock`] guard.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{Config, RwPolicy};
use crate::driver::{Driver, Pending};
use crate::engine::fair::{AttemptIds, FairAcquire, FairState};
use crate::engine::ops::{Acquire, Extend, Op, Release};
use crate::engine::{quorum, Decision, Retry, Round, Timing};
use crate::error::{Error, InvalidArgument, NodeErrorKind, NodeFailure};
use crate::keepalive::KeeperSlot;
use crate::resp::Limits;
use crate::rng::Token;
use crate::url::NodeAddr;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 64 * 1024;
/// The most nodes one client may use.
pub const MAX_NODES: usize = 64;
/// The longest TTL accepted: 2^44 ms, a little over 557 years. Longer ones could overflow the
/// server's millisecond clock arithmetic.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 44);

/// The first window over which a waiter spreads its retry after a split vote: about one round
/// trip on a local network. It doubles with each split, up to `SPREAD_MAX`.
const SPREAD_MIN: Duration = Duration::from_micros(200);
const SPREAD_MAX: Duration = Duration::from_millis(4);
/// With a fair queue, how many times in a row a waiter retries at once after a split vote
/// before it waits for an announcement again: enough for a release to reach every node.
const QUICK_SPLIT_RETRIES: u32 = 6;

/// The longest timeout or delay a builder accepts: longer ones are surely mistakes, and would
/// overflow the clock arithmetic if near `Duration::MAX`.
const MAX_OPTION_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Most idle drivers kept for reuse; more threads than this still work, they just connect anew.
const MAX_IDLE_DRIVERS: usize = 64;

/// How often a release waiting for its acquisition's driver checks whether that round has
/// been settled by the thread using it.
const SETTLE_POLL: Duration = Duration::from_micros(200);

/// A Redlock client over N independent Redis masters.
///
/// Cheap to clone; clones share configuration and idle connections. Each thread that locks
/// concurrently gets its own connections to every node, so threads never wait on each other.
///
/// ```
/// use std::time::Duration;
/// use redlock_mux::Client;
///
/// // For example ["redis://127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"].
/// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
/// let client = Client::new(nodes.split(','))?;
/// let lock = client.lock("invoice:42", Duration::from_secs(10))?;
/// // ... work that must finish within lock.validity() ...
/// lock.release()?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<Config>,
    pool: Mutex<Vec<Driver>>,
    /// Signalled when a driver goes back to the pool while a release waits for it.
    returned: Condvar,
    /// How many threads wait on `returned`.
    waiting: AtomicUsize,
    keeper: KeeperSlot,
}

/// A won acquisition: the end of its validity, and its round while votes of it may still be
/// in flight (the guard's release and extensions must come after them).
pub(crate) struct Won {
    pub valid_until: Instant,
    pub pending: Pending,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field(
                "nodes",
                &self
                    .inner
                    .config
                    .nodes
                    .iter()
                    .map(|n| n.display.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Builds a [`Client`]; see each method for its default.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    nodes: Vec<String>,
    node_timeout: Duration,
    connect_timeout: Duration,
    retry_count: u32,
    retry_delay: Duration,
    wait_timeout: Duration,
    drift_factor: f64,
    fair: bool,
    fair_after: Duration,
    rw_policy: RwPolicy,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            nodes: Vec::new(),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            retry_count: Retry::UNLIMITED,
            retry_delay: Duration::from_millis(50),
            wait_timeout: Duration::from_secs(10),
            drift_factor: 0.01,
            fair: false,
            fair_after: Duration::ZERO,
            rw_policy: RwPolicy::ReadPreferring,
        }
    }
}

impl ClientBuilder {
    /// Adds nodes, as `redis://[user:password@]host:port[/db]` or bare `host:port` URLs.
    ///
    /// The quorum is `N / 2 + 1`. An even `N` is allowed but buys nothing: 4 nodes need 3, so
    /// they survive one failure, like 3 nodes do.
    pub fn nodes<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.nodes
            .extend(nodes.into_iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// How long to wait for one node's reply before counting it as failed. Keep it small next
    /// to the TTL (seed 004 suggests 5–50 ms for a 10 s TTL). Default 50 ms; at most a day.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long a TCP connect may take before it is abandoned. Default 1 s; at most a day.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many times [`Client::lock`] (and every other waiting acquisition) may retry on its
    /// own: after a [retry delay](Self::retry_delay) in which no release was announced.
    ///
    /// Retries that a release announcement prompts are not counted: a waiter is woken each time
    /// the lock changes hands, and must not be sent away by the number of other waiters served
    /// before it. The [wait timeout](Self::wait_timeout) bounds those. With 0, `lock` makes a
    /// single attempt, as [`Client::try_lock`] does.
    ///
    /// Default `u32::MAX`, which means no limit: the wait timeout alone bounds a waiting `lock`.
    pub fn retry_count(mut self, count: u32) -> Self {
        self.retry_count = count;
        self
    }

    /// The base delay between attempts when no release is announced: a waiter retries at once
    /// when one is, and after this delay otherwise (the backstop for lost announcements). Each
    /// delay is drawn from `[d/2, 3d/2)`. Default 50 ms; at most a day.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// The longest [`Client::lock`] (and every other waiting acquisition) waits in all: no
    /// attempt starts after it, whatever the retry count. With the default (unlimited)
    /// [retry count](Self::retry_count), this is what bounds a waiting `lock`: it retries at
    /// every announced release, and at least every retry delay, until it has the lock or this
    /// timeout has passed. Default 10 s; at most a day.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }

    /// Clock drift between processes allowed for, as a fraction of the TTL; 2 ms are always
    /// added. Must be in `[0, 0.5)`. Default 0.01.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Serves waiters in arrival order (seed 000's FIFO fairness): under contention, waiters
    /// queue on every node and only the head of the queue may take the lock, so nobody starves.
    /// Costs nothing while the lock is free and nobody waits. Default off.
    ///
    /// Waiters that die leave the queue when their entry expires: three retry delays plus one
    /// node timeout (at least 100 ms) after their last retry.
    ///
    /// For read-write locks, readers at the head of the queue share the lock, and a writer
    /// waits for the readers ahead of it. The queue outranks
    /// [`RwPolicy::WritePreferring`]'s writer intents: a reader the queue lets through is not
    /// refused by the intent of a writer behind it; see [`RwPolicy`].
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// With [`fair`](Self::fair): an acquirer joins an empty queue once it has waited this
    /// long (it always joins a non-empty one). Default zero: join at the first retry.
    pub fn fair_after(mut self, interval: Duration) -> Self {
        self.fair_after = interval;
        self
    }

    /// Whom read-write locks favour when readers and a writer wait; see [`RwPolicy`]. Default
    /// [`RwPolicy::ReadPreferring`].
    pub fn rw_policy(mut self, policy: RwPolicy) -> Self {
        self.rw_policy = policy;
        self
    }

    /// Checks every setting, resolves every node, and connects to every node (AUTH, SELECT),
    /// waiting at most the connect timeout. A node that is down does not make this fail: it
    /// only counts against the quorum until it comes back, and is reconnected with backoff.
    ///
    /// A node that refuses the setup (a wrong password or user, a database it does not have,
    /// missing permissions) or that is not a Redis server makes this fail at once with
    /// [`Error::Config`], listing every such node: its URL or its configuration needs fixing.
    pub fn build(self) -> Result<Client, Error> {
        if self.nodes.is_empty() {
            return Err(InvalidArgument::NoNodes.into());
        }
        if self.nodes.len() > MAX_NODES {
            return Err(InvalidArgument::TooManyNodes {
                count: self.nodes.len(),
                max: MAX_NODES,
            }
            .into());
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(InvalidArgument::BadOption {
                name: "drift_factor",
                reason: "must be at least 0 and less than 0.5",
            }
            .into());
        }
        for (name, value) in [
            ("node_timeout", self.node_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(InvalidArgument::BadOption {
                    name,
                    reason: "must be more than zero",
                }
                .into());
            }
        }
        for (name, value) in [
            ("node_timeout", self.node_timeout),
            ("connect_timeout", self.connect_timeout),
            ("retry_delay", self.retry_delay),
            ("wait_timeout", self.wait_timeout),
        ] {
            if value > MAX_OPTION_DURATION {
                return Err(InvalidArgument::BadOption {
                    name,
                    reason: "must be at most a day",
                }
                .into());
            }
        }
        let mut nodes: Vec<NodeAddr> = Vec::with_capacity(self.nodes.len());
        for url in &self.nodes {
            let node = NodeAddr::parse(url)?;
            // Two databases of one server fail together: counting them as two nodes would
            // fake a quorum.
            if nodes.iter().any(|n| n.addr == node.addr) {
                return Err(InvalidArgument::DuplicateNode {
                    url: crate::url::redact(url),
                }
                .into());
            }
            nodes.push(node);
        }
        let config = Arc::new(Config {
            nodes,
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            retry_count: self.retry_count,
            retry_delay: self.retry_delay,
            wait_timeout: self.wait_timeout,
            drift_factor: self.drift_factor,
            fair: self.fair,
            fair_after: self.fair_after,
            limits: Limits::default(),
            rw_policy: self.rw_policy,
        });
        let client = Client {
            inner: Arc::new(Inner {
                config,
                pool: Mutex::new(Vec::new()),
                returned: Condvar::new(),
                waiting: AtomicUsize::new(0),
                keeper: KeeperSlot::new(),
            }),
        };
        let first = client.new_driver()?;
        let refused = first.setup_failures();
        if !refused.is_empty() {
            return Err(Error::Config {
                failures: refused
                    .into_iter()
                    .map(|(node, kind)| client.failure(node, kind))
                    .collect(),
            });
        }
        client
            .inner
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(first);
        Ok(client)
    }
}

impl Client {
    /// A client over `nodes` with default settings; see [`ClientBuilder::nodes`] for the URL
    /// forms.
    pub fn new<I, S>(nodes: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::builder().nodes(nodes).build()
    }

    /// A builder with default settings.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The slot of this client's keeper thread (see [`crate::keepalive`]).
    pub(crate) fn keeper(&self) -> &KeeperSlot {
        &self.inner.keeper
    }

    /// How many nodes this client uses.
    pub fn nodes(&self) -> usize {
        self.inner.config.nodes.len()
    }

    /// How many nodes must agree: `nodes() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.nodes())
    }

    /// One attempt to take the lock on `key` for `ttl`, without retrying.
    ///
    /// Fails with [`Error::Contended`] when someone else holds it.
    pub fn try_lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.lock_with(key.as_ref(), ttl, false)
    }

    /// Takes the lock on `key` for `ttl`, blocking until it is ours or the
    /// [wait timeout](ClientBuilder::wait_timeout) has passed (10 s by default).
    ///
    /// A waiter retries as soon as a release of `key` is announced, and after a jittered
    /// [retry delay](ClientBuilder::retry_delay) when none is; only those unprompted retries
    /// count against the [retry count](ClientBuilder::retry_count), which is unlimited by
    /// default. Fails with [`Error::Contended`] (or the error of the last attempt) when the
    /// wait ends without the lock.
    ///
    /// The returned guard is valid for [`Lock::validity`], which is less than `ttl` by the time
    /// the quorum took and the drift allowance.
    pub fn lock(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.lock_with(key.as_ref(), ttl, true)
    }

    fn lock_with(&self, key: &[u8], ttl: Duration, wait: bool) -> Result<Lock, Error> {
        check_key(key)?;
        let (ttl_ms, timing) = self.timing(ttl)?;
        let first = Token::generate();
        let fair = self.inner.config.fair.then(|| self.fair_state());
        let (won, token) = self.acquire(
            &[key],
            first,
            &|token, run| {
                let release = Release { key, token };
                match &fair {
                    Some(fair) => {
                        let ids = AttemptIds {
                            waiter: first.as_bytes(),
                            token,
                        };
                        run(&FairAcquire::new(key, ids, ttl_ms, fair), &release)
                    }
                    None => run(&Acquire { key, token, ttl_ms }, &release),
                }
            },
            timing,
            wait,
        )?;
        Ok(Lock::from_parts(self.clone(), KeyBuf::new(key), token, won))
    }

    /// A fair waiter arriving now. Its place in the queue is this machine's wall clock in
    /// microseconds. Its entries live three retry delays (the longest backstop wait is 1.5 of
    /// them) plus a node timeout, and at least 100 ms, without a retry refreshing them.
    pub(crate) fn fair_state(&self) -> FairState {
        let c = &self.inner.config;
        let ticket = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let entry_ttl = (c.retry_delay * 3 + c.node_timeout).max(Duration::from_millis(100));
        FairState::new(
            ticket,
            entry_ttl.as_millis().min(MAX_TTL.as_millis()) as u64,
            c.fair_after,
        )
    }

    /// This client's settings.
    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The longest a waiting acquisition may take in all ([`ClientBuilder::wait_timeout`]).
    pub(crate) fn wait_timeout(&self) -> Duration {
        self.inner.config.wait_timeout
    }

    /// The TTL in whole milliseconds (what the server is told) and the timing built on it.
    pub(crate) fn timing(&self, ttl: Duration) -> Result<(u64, Timing), InvalidArgument> {
        if ttl.is_zero() {
            return Err(InvalidArgument::ZeroTtl);
        }
        if ttl > MAX_TTL || Instant::now().checked_add(ttl).is_none() {
            return Err(InvalidArgument::TtlOutOfRange { ttl });
        }
        let ttl_ms = ttl.as_millis() as u64;
        let timing = Timing {
            ttl: Duration::from_millis(ttl_ms),
            drift_factor: self.inner.config.drift_factor,
        };
        if timing.validity(Duration::ZERO).is_none() {
            return Err(InvalidArgument::TtlBelowDrift {
                ttl,
                drift: timing.drift(),
            });
        }
        Ok((ttl_ms, timing))
    }

    /// Runs `f` with a driver of this client's pool, made on demand.
    pub(crate) fn with_driver<R>(&self, f: impl FnOnce(&mut Driver) -> R) -> Result<R, Error> {
        self.with_driver_after(&Pending::NONE, f)
    }

    /// Runs `f` with a driver whose commands cannot overtake the votes of `after` still in
    /// flight (see [`take_driver`](Self::take_driver)).
    pub(crate) fn with_driver_after<R>(
        &self,
        after: &Pending,
        f: impl FnOnce(&mut Driver) -> R,
    ) -> Result<R, Error> {
        let mut driver = match self.take_driver(after) {
            Some(d) => d,
            None => self.new_driver()?,
        };
        let r = f(&mut driver);
        let mut pool = self
            .inner
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A driver that still owes votes is kept: a guard may need its connections.
        if pool.len() < MAX_IDLE_DRIVERS || driver.owes_votes() {
            pool.push(driver);
        }
        drop(pool);
        if self.inner.waiting.load(Ordering::SeqCst) > 0 {
            self.inner.returned.notify_all();
        }
        Ok(r)
    }

    /// A driver from the pool for commands that must come after the votes of round `after`
    /// (a guard's release or extension after its acquisition), or `None` if the pool is empty.
    ///
    /// Redis orders commands only within a connection. While some vote of `after` is still
    /// owed, the commands go on the driver that sent it, queued behind it on the same
    /// connections: that driver is taken from the pool if it is idle there. If another thread
    /// is using it (and reading the stragglers as it polls), this waits until the round is
    /// settled or the driver comes back, but no longer than the node timeout from the round's
    /// start: a vote that late was counted as failed, and its node as one outside the quorum.
    ///
    /// What is guaranteed: a release or extension never overtakes a vote of its acquisition
    /// that is still owed on a live connection, unless that vote is older than the node
    /// timeout and its driver busy elsewhere. A vote lost with its connection (a reset, an I/O
    /// error) counts as settled: if its command still reaches the server, it can land after
    /// the release on that one node, outside the quorum, and lapse with its TTL.
    fn take_driver(&self, after: &Pending) -> Option<Driver> {
        let mut pool = self
            .inner
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(start) = after.unsettled_since() {
            let deadline = start + self.inner.config.node_timeout;
            while !after.settled() {
                if let Some(i) = pool.iter().position(|d| d.ran(after)) {
                    return Some(pool.remove(i));
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                self.inner.waiting.fetch_add(1, Ordering::SeqCst);
                pool = self
                    .inner
                    .returned
                    .wait_timeout(pool, (deadline - now).min(SETTLE_POLL))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                self.inner.waiting.fetch_sub(1, Ordering::SeqCst);
            }
        }
        // The most recently used driver that owes nothing; one that owes is best left for the
        // guards of its rounds, and taken only when every driver owes.
        let i = pool
            .iter()
            .rposition(|d| !d.owes_votes())
            .or(pool.len().checked_sub(1))?;
        Some(pool.remove(i))
    }

    /// A driver with its connections opened and set up (bounded by the connect timeout).
    fn new_driver(&self) -> Result<Driver, Error> {
        let config = &self.inner.config;
        let mut driver = Driver::new(config.clone()).map_err(|e| Error::Io(e.kind()))?;
        driver.warm_up(Instant::now() + config.connect_timeout);
        Ok(driver)
    }

    /// Redlock acquisition (seed 004): an attempt on every node at once; won on a quorum within
    /// the validity; otherwise its cleanup on every node straight away, and another attempt
    /// after a jittered delay (or a release announcement) while `wait` allows. Returns when the
    /// lock stops being valid, and the token of the attempt that won it.
    ///
    /// Every attempt has its own token: `first` for the first one, a fresh one from the OS
    /// random source for each retry. Nothing sent for a lost attempt (its cleanup above all,
    /// which may still be on its way to a node over a connection given up since) can then touch
    /// what a later attempt sets. `attempt` calls its second argument with the acquire op of an
    /// attempt with the token it is given, and the cleanup that undoes that attempt.
    ///
    /// `resources` are the keys whose wake channels ([`WAKE_PREFIX`](crate::engine::ops::WAKE_PREFIX))
    /// announce releases that make a retry worth trying. Only retries that start because no
    /// release was announced within the retry delay count against the retry count; the wait
    /// timeout bounds the others.
    pub(crate) fn acquire(
        &self,
        resources: &[&[u8]],
        first: Token,
        attempt: &Attempts<'_>,
        timing: Timing,
        wait: bool,
    ) -> Result<(Won, Token), Error> {
        let config = &self.inner.config;
        self.with_driver(|driver| {
            let started = Instant::now();
            let mut retry = Retry::new(started, config.wait_timeout, config.retry_count, wait);
            let mut token = first;
            let mut subscribed = false;
            // The retry window after split votes, doubled at each.
            let mut spread = driver.spread;
            let mut split_seen = false;
            // Quick re-tries after split votes in a row (fair queue only).
            let mut quick = 0;
            let result = loop {
                if retry.lost() > 0 {
                    // One `getrandom` per retry; the first attempt uses `first`.
                    token = Token::generate();
                }
                // What the attempt came to. Only a broken `attempt` leaves it as it is.
                let mut step = Step::GiveUp(Error::QuorumUnreachable {
                    quorum: quorum(config.nodes.len()),
                    nodes: config.nodes.len(),
                    failures: Vec::new(),
                });
                attempt(token.as_bytes(), &mut |acquire, cleanup| {
                    if retry.lost() > 0 {
                        acquire.on_retry(started.elapsed());
                    }
                    driver.clear_wake();
                    let start = Instant::now();
                    let mut round = driver.take_round(start, Some(timing), None);
                    driver.run(acquire, &mut round);
                    let outcome = match round.decision() {
                        Some(Decision::Won {
                            valid_until: Some(until),
                            ..
                        }) => Ok(until),
                        _ => Err(self.loss(&round)),
                    };
                    let split = round.granted() > 0;
                    driver.wake_after(round.votes(), token.as_bytes());
                    driver.put_round(round);
                    step = match outcome {
                        Ok(until) => Step::Won(until),
                        Err(error) => {
                            // Seed 004 step 5: unlock every node, even those that said no or
                            // did not answer.
                            driver.broadcast(cleanup);
                            let now = Instant::now();
                            // The backstop: the latest the next attempt starts if no release
                            // is announced. It is kept short of the wait timeout, so a waiter
                            // still gets a last try.
                            let delay = driver
                                .jitter
                                .around(config.retry_delay)
                                .min(retry.remaining(now).saturating_sub(SPREAD_MIN));
                            match retry.next_attempt(now, delay) {
                                // Misconfigured nodes stay so: waiting cannot make a quorum.
                                _ if error.is_config() => Step::GiveUp(error),
                                Some(backstop) => Step::Retry {
                                    error,
                                    now,
                                    backstop,
                                    split,
                                },
                                None => Step::GiveUp(error),
                            }
                        }
                    };
                    if !matches!(step, Step::Retry { .. }) {
                        if let Some(finish) = acquire.on_finish() {
                            driver.broadcast(finish);
                        }
                    }
                    if matches!(step, Step::GiveUp(_)) {
                        driver.flush_until(Instant::now() + config.node_timeout);
                    }
                });
                let (error, now, backstop, split) = match step {
                    Step::Won(until) => break Ok((until, token)),
                    Step::GiveUp(error) => break Err(error),
                    Step::Retry {
                        error,
                        now,
                        backstop,
                        split,
                    } => (error, now, backstop, split),
                };
                if !subscribed && error.is_contended() {
                    // From now on every release of `resource` is announced to us; try again
                    // at once, since a release may have come before the subscription did.
                    // This retry stands for such a release: it is not counted.
                    driver.subscribe(resources);
                    subscribed = true;
                    continue;
                }
                if !split {
                    quick = 0;
                } else {
                    split_seen = true;
                    // Some nodes granted, too few. Without a fair queue, waiters collided:
                    // spread the next retries over a window that doubles with each split, so
                    // they drift apart. With one, only the head can win anywhere, so the vote
                    // split because a release had not reached every node yet, and its
                    // announcement may already be spent: retry soon without waiting for one,
                    // a few times in a row, then wait as after any other refusal (a lock held
                    // on a minority of nodes keeps splitting the vote).
                    spread = (spread * 2).clamp(SPREAD_MIN, SPREAD_MAX.min(config.retry_delay));
                    if config.fair && quick < QUICK_SPLIT_RETRIES {
                        quick += 1;
                        let pause = driver.jitter.below(spread);
                        driver.sleep_until((now + pause).min(backstop));
                        continue;
                    }
                }
                if driver.wait_wake(backstop) {
                    if !spread.is_zero() {
                        let pause = driver.jitter.below(spread);
                        driver.sleep_until((Instant::now() + pause).min(backstop));
                    }
                } else {
                    // No release was announced within the retry delay.
                    retry.count_retry();
                }
            };
            // Keep what was learnt of the contention for the next acquisition; halve it when
            // this one saw no collision, so it fades once the contention does.
            driver.spread = if split_seen { spread } else { spread / 2 };
            if driver.spread < SPREAD_MIN {
                driver.spread = Duration::ZERO;
            }
            if subscribed {
                driver.unsubscribe(resources);
            }
            result.map(|(valid_until, token)| {
                let pending = driver.pending();
                (
                    Won {
                        valid_until,
                        pending,
                    },
                    token,
                )
            })
        })?
    }

    /// Sends `op` to every node and waits for a quorum of acknowledgements (or failures). It
    /// goes out after the votes of round `after` still in flight.
    pub(crate) fn ack_round(&self, op: &dyn Op, after: &Pending) -> Result<(), Error> {
        self.with_driver_after(after, |driver| {
            let mut round = driver.take_round(Instant::now(), None, None);
            driver.run(op, &mut round);
            let r = match round.decision() {
                Some(Decision::Won { .. }) => Ok(()),
                _ => Err(self.loss(&round)),
            };
            driver.put_round(round);
            r
        })?
    }

    /// Runs an extend round for a lock valid until `*valid_until`: `op` must win a quorum before
    /// then. It goes out after the votes of round `after` still in flight.
    ///
    /// Won: `*valid_until` becomes the new end of validity, `start + ttl − drift`. Not won: the
    /// nodes that said yes applied `op`, and those that did not answer may still apply it (when
    /// its bytes reach them), so the lock may now lapse on every node at `start + ttl`, however
    /// long it was before: `*valid_until` becomes the earlier of its old value and
    /// `start + ttl − drift`. `start` is taken before the first byte is sent. When nothing was
    /// sent (the validity had already ended, or no connection could be made), it is unchanged.
    pub(crate) fn extend_round(
        &self,
        op: &dyn Op,
        timing: Timing,
        valid_until: &mut Instant,
        after: &Pending,
    ) -> Result<(), Error> {
        let hold_until = *valid_until;
        self.with_driver_after(after, |driver| {
            let start = Instant::now();
            if start >= hold_until {
                return Err(Error::ValidityExpired {
                    elapsed: Duration::ZERO,
                });
            }
            let mut round = driver.take_round(start, Some(timing), Some(hold_until));
            driver.run(op, &mut round);
            let r = match round.decision() {
                Some(Decision::Won {
                    valid_until: Some(until),
                    ..
                }) => {
                    *valid_until = until;
                    Ok(())
                }
                _ => {
                    // A TTL within the drift allowance gives no validity at all.
                    let cap = timing.valid_until(start).unwrap_or(start);
                    *valid_until = hold_until.min(cap);
                    Err(self.loss(&round))
                }
            };
            driver.put_round(round);
            r
        })?
    }

    /// A failure of node `node`.
    fn failure(&self, node: usize, kind: NodeErrorKind) -> NodeFailure {
        NodeFailure {
            node,
            addr: self.inner.config.nodes[node].display.clone(),
            kind,
        }
    }

    /// The error for a round that was not won. When too few nodes are left for a quorum once
    /// those whose setup was refused are counted out, that is [`Error::Config`]: waiting
    /// cannot help.
    fn loss(&self, round: &Round) -> Error {
        let failures = || -> Vec<NodeFailure> {
            round
                .failures()
                .map(|(node, kind)| self.failure(node, kind.clone()))
                .collect()
        };
        let misconfigured = round
            .failures()
            .filter(|(_, kind)| matches!(kind, NodeErrorKind::Setup { .. }))
            .count();
        match round.decision() {
            Some(Decision::Expired { elapsed }) => Error::ValidityExpired { elapsed },
            _ if misconfigured > 0 && round.nodes() - misconfigured < round.quorum() => {
                Error::Config {
                    failures: round
                        .failures()
                        .filter(|(_, kind)| matches!(kind, NodeErrorKind::Setup { .. }))
                        .map(|(node, kind)| self.failure(node, kind.clone()))
                        .collect(),
                }
            }
            Some(Decision::Contended) => Error::Contended {
                refused: round.refused(),
                nodes: round.nodes(),
                failures: failures(),
            },
            _ => Error::QuorumUnreachable {
                quorum: round.quorum(),
                nodes: round.nodes(),
                failures: failures(),
            },
        }
    }
}

/// The commands of an acquisition, attempt by attempt: called with an attempt's token, it calls
/// its second argument with that attempt's acquire op and the cleanup that undoes it.
pub(crate) type Attempts<'a> = dyn Fn(&[u8], &mut dyn FnMut(&dyn Op, &dyn Op)) + 'a;

/// What one attempt of an acquisition came to.
enum Step {
    /// The lock, valid until then.
    Won(Instant),
    /// Lost, with no retry left.
    GiveUp(Error),
    /// Lost at `now`; the next attempt starts at `backstop` at the latest.
    Retry {
        error: Error,
        now: Instant,
        backstop: Instant,
        /// Some nodes granted the attempt, too few.
        split: bool,
    },
}

/// Keys up to this length live inside the guard, so taking a lock allocates nothing.
const INLINE_KEY: usize = 64;

/// A lock's key: inline when short, on the heap otherwise.
#[derive(Clone)]
pub(crate) enum KeyBuf {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl KeyBuf {
    pub(crate) fn new(key: &[u8]) -> KeyBuf {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            KeyBuf::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            KeyBuf::Heap(key.into())
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, bytes } => &bytes[..*len as usize],
            KeyBuf::Heap(b) => b,
        }
    }
}

impl std::fmt::Debug for KeyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_slice()))
    }
}

/// Rejects keys that are empty or longer than [`MAX_KEY_LEN`].
pub(crate) fn check_key(key: &[u8]) -> Result<(), InvalidArgument> {
    if key.is_empty() {
        return Err(InvalidArgument::EmptyKey);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(InvalidArgument::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// A held Redlock mutex. Dropping it releases it, best effort; call [`release`](Lock::release)
/// to see whether that worked.
///
/// The lock is only guaranteed exclusive until [`validity`](Lock::validity) runs out. Work that
/// may take longer must [`extend`](Lock::extend) it first.
#[derive(Debug)]
pub struct Lock {
    client: Client,
    key: KeyBuf,
    token: Token,
    valid_until: Instant,
    /// The acquisition's round, while votes of it may be in flight.
    pending: Pending,
    released: bool,
}

impl Lock {
    /// A guard for a lock just won: `token` is at `key` on a quorum until `won.valid_until`.
    pub(crate) fn from_parts(client: Client, key: KeyBuf, token: Token, won: Won) -> Lock {
        Lock {
            client,
            key,
            token,
            valid_until: won.valid_until,
            pending: won.pending,
            released: false,
        }
    }

    /// The client this lock was taken with.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The key this lock is on.
    pub fn key(&self) -> &[u8] {
        self.key.as_slice()
    }

    /// This holder's token: 160 bits from the OS random source, as 40 hex characters. It is
    /// the value stored at the key on every node that granted the lock: the token of the
    /// attempt that won it (every attempt draws its own).
    pub fn token(&self) -> &[u8] {
        self.token.as_bytes()
    }

    /// The time left before the lock may be granted to someone else. Zero once it has run out.
    pub fn validity(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// The instant the lock may be granted to someone else.
    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Resets the lock's TTL to `ttl` on every node that still holds our token.
    ///
    /// Succeeds only if a quorum agrees before the current validity ends; the validity is then
    /// `ttl` minus the time the round took minus the drift allowance.
    ///
    /// A failed extend never lengthens the validity, but it may shorten it. The nodes that
    /// accepted it, and those that did not answer in time (they may run it later), now expire
    /// the key `ttl` after the round began; so the validity becomes the earlier of its current
    /// end and `ttl` minus the drift allowance from the start of the round. A failed extend to
    /// a `ttl` longer than the validity left thus leaves the lock as it was (held until its
    /// current validity ends, if it was held); a failed extend to a shorter one leaves at most
    /// that shorter validity. An invalid `ttl` is refused before anything is sent.
    pub fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let (ttl_ms, timing) = self.client.timing(ttl)?;
        let op = Extend {
            key: self.key.as_slice(),
            token: self.token.as_bytes(),
            ttl_ms,
        };
        self.client
            .extend_round(&op, timing, &mut self.valid_until, &self.pending)
    }

    /// Releases the lock on every node, whether or not that node granted it. Keys that have
    /// expired, or that hold someone else's token, are left alone.
    ///
    /// Returns once a quorum of nodes has answered; the other nodes still get the release.
    pub fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.release_now()
    }

    fn release_now(&self) -> Result<(), Error> {
        self.client.ack_round(
            &Release {
                key: self.key.as_slice(),
                token: self.token.as_bytes(),
            },
            &self.pending,
        )
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release_now();
        }
    }
}
