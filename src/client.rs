//! [`Client`] and its [`ClientBuilder`]: the settings, the shared driver, and the keeper
//! thread's slot. The calls that take locks are with the guard they return (`guard`).
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::config::{Config, RwPolicy, MAX_NODES};
use crate::driver::{Session, Shared};
use crate::engine::{quorum, Retry, Timing};
use crate::error::{Error, InvalidArgument};
use crate::keeper::{Keeper, KeeperSlot};
use crate::names::BufPool;
use crate::resp::Limits;
use crate::stats::{Recorder, Stats};
use crate::tls::TlsOptions;
use crate::url::NodeAddr;

/// The longest timeout or delay a builder accepts: longer ones are surely mistakes, and would
/// overflow the clock arithmetic if near `Duration::MAX`.
const MAX_OPTION_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A Redlock client over N independent Redis masters.
///
/// Cheap to clone; clones share configuration and connections. A client keeps one pipelined
/// connection per node, shared by every thread that uses it (and one subscriber connection
/// per node for wake-ups): concurrent lock calls are written behind each other and their
/// replies matched to them in order, and a thread waiting for its replies polls for the others
/// too, so no thread of its own runs the I/O.
///
/// A release returns once a quorum of nodes answered; the other nodes may still be working
/// through their commands. Dropping the last handle to a client therefore waits until every
/// node has answered what it was sent, as [`close`](Client::close) does (10 s at most, and
/// 2 s without progress), so that a program that ends right after a release does not take it
/// away from a slow node.
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
    driver: Arc<Shared>,
    keeper: KeeperSlot,
    stats: Arc<Recorder>,
    /// Buffers for the names of the guards' keys, reused from guard to guard.
    bufs: BufPool,
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
    dead_peer_timeout: Duration,
    retry_count: u32,
    retry_delay: Duration,
    wait_timeout: Duration,
    drift_factor: f64,
    fair: bool,
    fair_after: Duration,
    rw_policy: RwPolicy,
    tls: TlsOptions,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            nodes: Vec::new(),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            dead_peer_timeout: Duration::from_secs(3),
            retry_count: Retry::UNLIMITED,
            retry_delay: Duration::from_millis(50),
            wait_timeout: Duration::from_secs(10),
            drift_factor: 0.01,
            fair: false,
            fair_after: Duration::ZERO,
            rw_policy: RwPolicy::ReadPreferring,
            tls: TlsOptions::default(),
        }
    }
}

impl ClientBuilder {
    /// Adds nodes, as URLs:
    ///
    /// - `redis://[user:password@]host[:port][/db]`, or bare `host:port`;
    /// - `rediss://[user:password@]host[:port][/db]`: TLS, verifying the server's certificate
    ///   and that it is for `host` (with the `tls` feature; see
    ///   [`tls_ca_file`](Self::tls_ca_file));
    /// - `unix:///path/to/redis.sock` or `redis+unix:///path/to/redis.sock`: a Unix domain
    ///   socket, with `?db=N`, and `&user=U&pass=P` for AUTH;
    ///
    /// where the database may also be given as `?db=N`, and the user and password take
    /// `%`-escapes. The port is 6379 unless given.
    ///
    /// The quorum is `N / 2 + 1`. An even `N` is allowed but buys nothing: 4 nodes need 3, so
    /// they survive one failure, like 3 nodes do.
    ///
    /// A host name is resolved once, when the client is built; a connect tries every address
    /// it resolved to, in the resolver's order, until one takes it (`localhost` is often
    /// `::1` first, then `127.0.0.1`). Two URLs that share an address, or name the same
    /// socket, are one node, and are refused as duplicates.
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
    /// to the TTL (the Redlock specification suggests 5–50 ms for a 10 s TTL). Default 50 ms; at most a day.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long a connect may take before it is abandoned (for each address of a host name
    /// that resolves to several, tried in turn), the TLS handshake of a `rediss://` node
    /// included: a handshake still unanswered then is a plaintext port
    /// ([`TlsFailure::NotTls`](crate::TlsFailure::NotTls)). Default 1 s; at most a day.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a node may stay silent at the TCP level before its connection is given up:
    /// data written to it unacknowledged for this long, or (while idle) no answer to the
    /// kernel's keepalive probes within about as long. A slow or paused server still
    /// acknowledges what it is sent, so it is never given up for slowness: its backlog is
    /// answered in order when it can, and nothing queued there can land after a later release.
    /// A dead peer (a host gone, a network that drops everything) is found within this bound,
    /// and what it was owed fails; releases are sent again once it is back. Default 3 s; at
    /// least 1 s (the kernel counts keepalive in seconds), at most a day.
    pub fn dead_peer_timeout(mut self, timeout: Duration) -> Self {
        self.dead_peer_timeout = timeout;
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

    /// Serves waiters in arrival order (the FIFO fairness of the read-write lock design): under contention, waiters
    /// queue on every node and only the head of the queue may take the lock, so nobody starves.
    /// Costs nothing while the lock is free and nobody waits. Default off.
    ///
    /// Waiters that die leave the queue when their entry expires: three retry delays plus one
    /// node timeout (at least 100 ms) after their last retry.
    ///
    /// Every kind of lock queues. For read-write locks (fenced writers included), readers at
    /// the head of the queue share the lock, and a writer waits for the readers ahead of it.
    /// The queue outranks [`RwPolicy::WritePreferring`]'s writer intents: a reader the queue
    /// lets through is not refused by the intent of a writer behind it; see [`RwPolicy`]. A
    /// fenced mutex waits in its key's mutex queue. An all-or-none set waits in the mutex queue
    /// of every key of it, beside the mutex waiters on those keys, and takes the set once it is
    /// the head of each; every node orders the waiters of every queue alike, so the first live
    /// waiter is the head wherever it stands, and no order of sets can deadlock.
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

    /// Trusts the CA certificates of the PEM file at `path` for `rediss://` nodes, besides the
    /// system's roots (which a device without a system store may not have). May be given more
    /// than once. The file is read by [`build`](Self::build); one that cannot be read or holds
    /// no certificate is [`InvalidArgument::BadTlsFile`].
    ///
    /// Needs the `tls` feature: without it, `build` refuses the option
    /// ([`InvalidArgument::BadOption`]).
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca_files.push(path.into());
        self
    }

    /// Shows the certificate chain of the PEM file `cert_path`, with the private key of the
    /// PEM file `key_path`, to `rediss://` nodes that ask for one (mutual TLS; Redis's
    /// `tls-auth-clients`). Read by [`build`](Self::build), as for
    /// [`tls_ca_file`](Self::tls_ca_file); needs the `tls` feature too.
    pub fn tls_client_cert(
        mut self,
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
    ) -> Self {
        self.tls.client_cert = Some((cert_path.into(), key_path.into()));
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
        if self.dead_peer_timeout < Duration::from_secs(1) {
            return Err(InvalidArgument::BadOption {
                name: "dead_peer_timeout",
                reason: "must be at least 1 s",
            }
            .into());
        }
        for (name, value) in [
            ("node_timeout", self.node_timeout),
            ("connect_timeout", self.connect_timeout),
            ("dead_peer_timeout", self.dead_peer_timeout),
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
            // fake a quorum. A host name is all its addresses: `localhost:P` may be the server
            // at `127.0.0.1:P`.
            if nodes.iter().any(|n| n.shares_address(&node)) {
                return Err(InvalidArgument::DuplicateNode {
                    url: crate::url::redact(url),
                }
                .into());
            }
            nodes.push(node);
        }
        #[cfg(not(feature = "tls"))]
        let tls = crate::tls::unavailable(&self.tls)?;
        #[cfg(feature = "tls")]
        let tls = if self.tls.is_set() || nodes.iter().any(|n| n.tls) {
            Some(crate::tls::TlsContext::new(&self.tls)?)
        } else {
            None
        };
        let config = Arc::new(Config {
            nodes,
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            dead_peer_timeout: self.dead_peer_timeout,
            retry_count: self.retry_count,
            retry_delay: self.retry_delay,
            wait_timeout: self.wait_timeout,
            drift_factor: self.drift_factor,
            fair: self.fair,
            fair_after: self.fair_after,
            limits: Limits::default(),
            rw_policy: self.rw_policy,
            masters: Default::default(),
        });
        let stats = Arc::new(Recorder::new(self.nodes.len()));
        let driver = Arc::new(
            Shared::new(config.clone(), stats.clone(), tls).map_err(|e| Error::Io(e.kind()))?,
        );
        driver.warm_up(config.connect_timeout);
        let client = Client {
            inner: Arc::new(Inner {
                config,
                driver,
                keeper: KeeperSlot::new(OnceLock::new()),
                stats,
                bufs: BufPool::default(),
            }),
        };
        let refused = client.inner.driver.setup_failures();
        if !refused.is_empty() {
            return Err(Error::Config {
                failures: refused
                    .into_iter()
                    .map(|(node, kind)| client.inner.config.failure(node, kind))
                    .collect(),
            });
        }
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

    /// The slot of this process's keeper thread for this client (see [`crate::keepalive`]).
    pub(crate) fn keeper(&self) -> &OnceLock<Keeper> {
        match self
            .inner
            .keeper
            .here(|_| Ok::<_, Infallible>(OnceLock::new()))
        {
            Ok(slot) => slot,
            Err(never) => match never {},
        }
    }

    /// What this client's locks have been doing since it was built (shared by its clones):
    /// acquisition rounds won, contended and unreachable per lock kind; per node, failures by
    /// kind and the reply latency's median and 99th percentile over its latest
    /// [`LATENCY_WINDOW`](crate::LATENCY_WINDOW) replies; wake-ups, retries and
    /// cancellations. Keeping them costs a few atomic additions per round and per reply.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlock_mux::Client;
    ///
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// client.lock("stats:doc", Duration::from_secs(5))?.release()?;
    /// let stats = client.stats();
    /// assert!(stats.kinds.mutex.won >= 1);
    /// for (i, node) in stats.nodes.iter().enumerate() {
    ///     println!("node {i}: p50 {:?}, p99 {:?}, {} failures",
    ///         node.latency_p50, node.latency_p99, node.failures.total());
    /// }
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats.snapshot()
    }

    /// Where this client's statistics are counted.
    pub(crate) fn recorder(&self) -> &Recorder {
        &self.inner.stats
    }

    /// How many nodes this client uses.
    pub fn nodes(&self) -> usize {
        self.inner.config.nodes.len()
    }

    /// How many nodes must agree: `nodes() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.nodes())
    }

    /// The buffers this client's guards keep the names of their keys in.
    /// An all-or-none set on a client with a Redis Cluster member must be of keys of one hash
    /// slot: each node runs one script over the whole set, and a cluster runs a script only
    /// on keys of one slot. Refused before anything is sent, rather than failing on every
    /// cluster member.
    pub(crate) fn check_one_slot(
        &self,
        keys: &crate::names::KeySet,
    ) -> Result<(), InvalidArgument> {
        if !self.inner.config.nodes.iter().any(|n| n.cluster) {
            return Ok(());
        }
        let slot = crate::engine::endpoint::cluster::key_slot;
        let mut keys = keys.iter();
        let Some(first) = keys.next() else {
            return Ok(());
        };
        match keys.find(|k| slot(k) != slot(first)) {
            None => Ok(()),
            Some(other) => Err(InvalidArgument::KeysInSeveralSlots {
                first: first.to_vec(),
                other: other.to_vec(),
            }),
        }
    }

    pub(crate) fn bufs(&self) -> &BufPool {
        &self.inner.bufs
    }

    /// This client's settings.
    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The TTL in whole milliseconds (what the server is told) and the timing built on it.
    pub(crate) fn timing(&self, ttl: Duration) -> Result<(u64, Timing), InvalidArgument> {
        Timing::for_ttl(ttl, self.inner.config.drift_factor)
    }

    /// Waits until every node has answered what this client sent it (releases above all,
    /// including those sent again after a connection broke), and says whether they all
    /// arrived. A release returns once a quorum acknowledged it; the other nodes may still be
    /// working through their backlog, or be unreachable for a moment. Dropping the last handle
    /// to a client waits the same way, but cannot tell you the outcome: call `close` where you
    /// want to know.
    ///
    /// It waits at most 10 s, and gives up sooner on nodes that make no progress for 2 s (a
    /// node that is down, or paused). Those nodes are returned in
    /// [`Error::Undelivered`]: what the releases were to delete stays there until its TTL
    /// runs out. It waits the same while other threads use the client (one of them may be
    /// polling its connections, waiting for a lock); threads that call `close` at once wait
    /// for the same closing. The client can still be used afterwards (other handles to it
    /// too). [`Error::Io`] if the system refuses a poller (in a child after `fork()`, which
    /// needs one of its own).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redlock_mux::Client;
    /// # let Ok(nodes) = std::env::var("REDLOCK_NODES") else { return Ok(()) };
    /// let client = Client::new(nodes.split(','))?;
    /// client.lock("job:7", Duration::from_secs(10))?.release()?;
    /// client.close()?; // every node has run the release
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn close(self) -> Result<(), Error> {
        let left = Shared::close(&self.inner.driver).map_err(|e| Error::Io(e.kind()))?;
        if left.is_empty() {
            return Ok(());
        }
        Err(Error::Undelivered {
            failures: left
                .into_iter()
                .map(|node| {
                    self.inner
                        .config
                        .failure(node, crate::error::NodeErrorKind::Timeout)
                })
                .collect(),
        })
    }

    /// Runs `f` with a session of this client's shared driver.
    pub(crate) fn with_driver<R>(&self, f: impl FnOnce(&mut Session<'_>) -> R) -> Result<R, Error> {
        let mut session = Shared::session(&self.inner.driver).map_err(|e| Error::Io(e.kind()))?;
        Ok(f(&mut session))
    }
}
